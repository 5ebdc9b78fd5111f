// RmsNormHeads: argument checks and the one dynamic dispatch per call
// (kernel: norm-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <new>

#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/norm/norm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/norm/norm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// x [rows, n_heads * head_dim] (row stride `stride`), rows in parallel.
void RmsNormHeadsT(float* x, size_t stride, size_t rows, size_t n_heads,
                   size_t head_dim, const float* weight, float eps) {
  // About 16K elements per task (a few microseconds).
  const size_t grain = std::max<size_t>(1, 16384 / (n_heads * head_dim));
  tbb::parallel_for(tbb::blocked_range<size_t>(0, rows, grain),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t t = range.begin(); t < range.end(); ++t) {
                        for (size_t h = 0; h < n_heads; ++h) {
                          RmsNormHead(x + t * stride + h * head_dim, head_dim,
                                      weight, eps);
                        }
                      }
                    });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>

#include "headway/norm.h"
#include "lib/core/init.h"
#include "lib/core/message.h"
#include "lib/core/validate.h"
#include "lib/norm/norm_call.h"

namespace headway {
namespace internal {

Status CheckNormWeight(const char* fn, const char* name, const float* weight,
                       int64_t n) {
  if (weight == nullptr) {
    return Fail(StatusCode::kInvalidArgument, fn, name, " is null");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(weight[i])) {
      return Fail(StatusCode::kInvalidArgument, fn, name, "[", i, "] (",
                  weight[i], ") is not finite");
    }
  }
  return Status::Ok();
}

Status CheckNormEps(const char* fn, const char* name, float eps) {
  if (std::isfinite(eps) && eps >= 0.0f) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, name, " (", eps,
              ") must be finite and >= 0");
}

}  // namespace internal

HWY_EXPORT(RmsNormHeadsT);

Status RmsNormHeads(MatrixView<float> x, int64_t head_dim, const float* weight,
                    float eps) {
  constexpr const char* kFn = "RmsNormHeads";
  Status status = internal::CheckHeadRows(kFn, "x", x, head_dim);
  if (status.ok()) {
    status = internal::CheckNormWeight(kFn, "weight", weight, head_dim);
  }
  if (status.ok()) status = internal::CheckNormEps(kFn, "eps", eps);
  if (status.ok()) {
    status = internal::CheckDisjoint(
        kFn, internal::SpanOf(x), "x",
        internal::Span{weight, head_dim * static_cast<int64_t>(sizeof(float))},
        "weight");
  }
  if (!status.ok()) return status;
  internal::InitOnce();
  try {
    HWY_DYNAMIC_DISPATCH(RmsNormHeadsT)
    (x.data, static_cast<size_t>(x.stride), static_cast<size_t>(x.rows),
     static_cast<size_t>(x.cols / head_dim), static_cast<size_t>(head_dim),
     weight, eps);
  } catch (const std::bad_alloc&) {
    // TBB may allocate tasks; x is then partly normalised, which the caller
    // must discard.
    return internal::Fail(StatusCode::kResourceExhausted, kFn,
                          "out of memory in the thread pool");
  }
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

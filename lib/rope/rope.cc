// ApplyRope: argument checks, the frequencies, and the one dynamic dispatch
// per call (kernels: rope-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <new>
#include <vector>

#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/rope/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/rope/rope-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// x [rows, n_heads * head_dim] (row stride `stride`), rows in parallel; freq
// [half].
void ApplyRopeT(const double* freq, size_t half, RopeLayout layout,
                const int64_t* positions, float* x, size_t stride, size_t rows,
                size_t n_heads, size_t head_dim) {
  // About 16K elements per task (a few microseconds).
  const size_t grain = std::max<size_t>(1, 16384 / (n_heads * head_dim));
  tbb::parallel_for(tbb::blocked_range<size_t>(0, rows, grain),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      std::vector<float> cos_sin(2 * half);
                      for (size_t t = range.begin(); t < range.end(); ++t) {
                        RopeCosSin(freq, half, positions[t], cos_sin.data());
                        RopeRotate(layout, cos_sin.data(), half, x + t * stride,
                                   n_heads, head_dim);
                      }
                    });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>

#include "headway/rope.h"
#include "lib/core/init.h"
#include "lib/core/message.h"
#include "lib/core/validate.h"
#include "lib/rope/rope_call.h"

namespace headway {
namespace internal {
namespace {

// A finite value > lower (the message names the field).
Status CheckAbove(const char* fn, const char* name, const char* field,
                  double value, double lower) {
  if (std::isfinite(value) && value > lower) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, name, ".", field, " (", value,
              ") must be finite and > ", lower);
}

}  // namespace

Status CheckRope(const char* fn, const char* name, const RopeConfig& rope,
                 int64_t head_dim) {
  if (rope.rotary_dim < 2 || rope.rotary_dim > head_dim ||
      rope.rotary_dim % 2 != 0) {
    return Fail(StatusCode::kInvalidArgument, fn, name, ".rotary_dim (",
                rope.rotary_dim, ") must be even and in [2, head_dim (",
                head_dim, ")]");
  }
  if (rope.layout != RopeLayout::kHalves &&
      rope.layout != RopeLayout::kInterleaved) {
    return Fail(StatusCode::kInvalidArgument, fn, name, ".layout (",
                static_cast<int>(rope.layout), ") is not a RopeLayout");
  }
  Status status = CheckAbove(fn, name, "theta", rope.theta, 0.0);
  if (!status.ok()) return status;
  switch (rope.scaling) {
    case RopeScaling::kNone:
      return Status::Ok();
    case RopeScaling::kLinear:
      return CheckAbove(fn, name, "factor", rope.factor, 0.0);
    case RopeScaling::kLlama3:
      status = CheckAbove(fn, name, "factor", rope.factor, 0.0);
      if (status.ok()) {
        status =
            CheckAbove(fn, name, "low_freq_factor", rope.low_freq_factor, 0.0);
      }
      if (status.ok()) {
        status = CheckAbove(fn, name, "high_freq_factor", rope.high_freq_factor,
                            rope.low_freq_factor);
      }
      if (status.ok() && rope.original_max_position < 1) {
        status = Fail(StatusCode::kInvalidArgument, fn, name,
                      ".original_max_position (", rope.original_max_position,
                      ") must be >= 1");
      }
      return status;
  }
  return Fail(StatusCode::kInvalidArgument, fn, name, ".scaling (",
              static_cast<int>(rope.scaling), ") is not a RopeScaling");
}

void RopeFrequencies(const RopeConfig& rope, double* freq) {
  const int64_t half = rope.rotary_dim / 2;
  const double two_pi = 6.283185307179586476925;
  const double old_len = static_cast<double>(rope.original_max_position);
  for (int64_t i = 0; i < half; ++i) {
    double f = std::pow(rope.theta, -static_cast<double>(2 * i) /
                                        static_cast<double>(rope.rotary_dim));
    if (rope.scaling == RopeScaling::kLinear) {
      f /= rope.factor;
    } else if (rope.scaling == RopeScaling::kLlama3) {
      const double wavelength = two_pi / f;
      if (wavelength > old_len / rope.low_freq_factor) {
        f /= rope.factor;
      } else if (wavelength >= old_len / rope.high_freq_factor) {
        const double smooth = (old_len / wavelength - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0 - smooth) * f / rope.factor + smooth * f;
      }
    }
    freq[i] = f;
  }
}

}  // namespace internal

HWY_EXPORT(ApplyRopeT);

Status ApplyRope(const RopeConfig& rope, int64_t head_dim,
                 const int64_t* positions, MatrixView<float> x) {
  constexpr const char* kFn = "ApplyRope";
  Status status = internal::CheckPositive(kFn, "head_dim", head_dim);
  if (status.ok()) status = internal::CheckRope(kFn, "rope", rope, head_dim);
  if (status.ok()) status = internal::CheckHeadRows(kFn, "x", x, head_dim);
  if (status.ok() && positions == nullptr) {
    status =
        internal::Fail(StatusCode::kInvalidArgument, kFn, "positions is null");
  }
  for (int64_t t = 0; status.ok() && t < x.rows; ++t) {
    if (positions[t] < 0) {
      status = internal::Fail(StatusCode::kInvalidArgument, kFn, "positions[",
                              t, "] (", positions[t], ") is negative");
    }
  }
  if (!status.ok()) return status;
  internal::InitOnce();
  try {
    std::vector<double> freq(static_cast<size_t>(rope.rotary_dim / 2));
    internal::RopeFrequencies(rope, freq.data());
    HWY_DYNAMIC_DISPATCH(ApplyRopeT)
    (freq.data(), freq.size(), rope.layout, positions, x.data,
     static_cast<size_t>(x.stride), static_cast<size_t>(x.rows),
     static_cast<size_t>(x.cols / head_dim), static_cast<size_t>(head_dim));
  } catch (const std::bad_alloc&) {
    // x is then partly rotated, which the caller must discard.
    return internal::Fail(StatusCode::kResourceExhausted, kFn, "out of memory");
  }
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

// Softmax: argument checks and the one dynamic dispatch per call (kernels:
// softmax-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <new>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/softmax/softmax.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/softmax/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

void SoftmaxT(const float* x, size_t x_stride, float* y, size_t y_stride,
              size_t rows, size_t cols, float scale) {
  SoftmaxRows(x, x_stride, y, y_stride, rows, cols, scale);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "headway/softmax.h"
#include "lib/core/init.h"
#include "lib/core/message.h"
#include "lib/core/validate.h"

namespace headway {

HWY_EXPORT(SoftmaxT);

Status Softmax(MatrixView<const float> x, MatrixView<float> y, float scale) {
  constexpr const char* kFn = "Softmax";
  Status status = internal::CheckMatrix(kFn, "x", x);
  if (status.ok()) status = internal::CheckMatrix(kFn, "y", y);
  if (status.ok()) {
    status =
        internal::CheckSameShape(kFn, "x", x.rows, x.cols, "y", y.rows, y.cols);
  }
  if (status.ok())
    status = internal::CheckInPlaceOrDisjoint(kFn, "x", x, "y", y);
  if (status.ok()) status = internal::CheckFinite(kFn, "scale", scale);
  if (!status.ok()) return status;
  internal::InitOnce();
  try {
    HWY_DYNAMIC_DISPATCH(SoftmaxT)
    (x.data, static_cast<size_t>(x.stride), y.data,
     static_cast<size_t>(y.stride), static_cast<size_t>(x.rows),
     static_cast<size_t>(x.cols), scale);
  } catch (const std::bad_alloc&) {
    // TBB may allocate tasks; y is then partly written, which the caller must
    // discard.
    return internal::Fail(StatusCode::kResourceExhausted, kFn,
                          "out of memory in the thread pool");
  }
  return Status::Ok();
}

Status SoftmaxInPlace(MatrixView<float> x, float scale) {
  return Softmax(x, x, scale);
}

}  // namespace headway
#endif  // HWY_ONCE

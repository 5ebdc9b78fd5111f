// Argument checks shared by every public entry point. Each returns a Status
// whose message starts with the public function's name and names the argument,
// e.g.
//   "Softmax: x.stride (3) is shorter than x.cols (4)".
#ifndef HEADWAY_LIB_CORE_VALIDATE_H_
#define HEADWAY_LIB_CORE_VALIDATE_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "headway/kv_cache.h"
#include "headway/status.h"
#include "headway/view.h"
#include "lib/core/message.h"

namespace headway {
namespace internal {

// Checked int64_t arithmetic: the one home for every product or sum of sizes a
// caller supplies. Each returns false on overflow (*result is then
// unspecified), true with the exact result otherwise.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* result) {
  return !__builtin_mul_overflow(a, b, result);
}
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* result) {
  return !__builtin_add_overflow(a, b, result);
}
// The product of all factors (1 for none).
inline bool CheckedProduct(std::initializer_list<int64_t> factors,
                           int64_t* result) {
  int64_t product = 1;
  for (const int64_t factor : factors) {
    if (!CheckedMul(product, factor, &product)) return false;
  }
  *result = product;
  return true;
}

// Bytes spanned by a view: ((rows - 1) * stride + cols) * elem_size. False on
// overflow of int64_t (callers have checked rows, cols >= 1 and stride >=
// cols).
bool SpanBytes(int64_t rows, int64_t cols, int64_t stride, size_t elem_size,
               int64_t* bytes);

// The bytes a checked view spans, from its data pointer.
struct Span {
  const void* data;
  int64_t bytes;
};
template <typename T>
Span SpanOf(MatrixView<T> view) {
  Span span{view.data, 0};
  SpanBytes(view.rows, view.cols, view.stride, sizeof(T), &span.bytes);
  return span;
}

// The bytes of a checked KvView's elements: ((rows - 1) * stride + cols) *
// KvDtypeSize(dtype); 0 bytes for 0 rows.
Span SpanOf(const KvView& view);
Span SpanOf(const KvMutableView& view);
// The bytes of its int8 scales, rows * 4; 0 bytes (data null) for another
// dtype.
Span ScaleSpanOf(const KvView& view);

// data != null, rows >= 1, cols >= 1, stride >= cols, byte span representable.
Status CheckMatrix(const char* fn, const char* name, const void* data,
                   int64_t rows, int64_t cols, int64_t stride,
                   size_t elem_size);

template <typename T>
Status CheckMatrix(const char* fn, const char* name, MatrixView<T> view) {
  return CheckMatrix(fn, name, view.data, view.rows, view.cols, view.stride,
                     sizeof(T));
}

// `b` has the same rows and cols as `a`.
Status CheckSameShape(const char* fn, const char* a_name, int64_t a_rows,
                      int64_t a_cols, const char* b_name, int64_t b_rows,
                      int64_t b_cols);

// True if the byte ranges of two (already checked) views intersect.
bool Overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes);

// "fn: a_name overlaps b_name" when the spans intersect. Names: const char*
// or std::string (a template, so that literal names cost nothing on success).
template <typename AName, typename BName>
Status CheckDisjoint(const char* fn, const Span& a, const AName& a_name,
                     const Span& b, const BName& b_name) {
  if (!Overlaps(a.data, a.bytes, b.data, b.bytes)) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, a_name, " overlaps ", b_name);
}

// Written views must not overlap read views unless they are the identical view
// (in place).
template <typename T>
Status CheckInPlaceOrDisjoint(const char* fn, const char* in_name,
                              MatrixView<const T> in, const char* out_name,
                              MatrixView<T> out) {
  int64_t in_bytes = 0, out_bytes = 0;
  SpanBytes(in.rows, in.cols, in.stride, sizeof(T), &in_bytes);
  SpanBytes(out.rows, out.cols, out.stride, sizeof(T), &out_bytes);
  if (!Overlaps(in.data, in_bytes, out.data, out_bytes)) return Status::Ok();
  if (in.data == out.data && in.stride == out.stride) return Status::Ok();
  return Status::InvalidArgument(
      std::string(fn) + ": " + out_name + " overlaps " + in_name +
      " without being the same view (in place needs equal data and stride)");
}

// A finite float (not NaN, not +-inf).
Status CheckFinite(const char* fn, const char* name, float value);

// head_dim >= 1 and x a checked view of whole heads: cols a multiple of
// head_dim (RoPE's and RMSNorm's rows of heads).
Status CheckHeadRows(const char* fn, const char* name, MatrixView<float> x,
                     int64_t head_dim);

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_CORE_VALIDATE_H_

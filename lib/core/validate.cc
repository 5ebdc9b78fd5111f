#include "lib/core/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "lib/core/message.h"

namespace headway {
namespace internal {

bool SpanBytes(int64_t rows, int64_t cols, int64_t stride, size_t elem_size,
               int64_t* bytes) {
  int64_t elems = 0;
  return CheckedMul(rows - 1, stride, &elems) &&
         CheckedAdd(elems, cols, &elems) &&
         CheckedMul(elems, static_cast<int64_t>(elem_size), bytes);
}

Span SpanOf(const KvView& view) {
  Span span{view.data, 0};
  if (view.rows > 0) {
    SpanBytes(view.rows, view.cols, view.stride, KvDtypeSize(view.dtype),
              &span.bytes);
  }
  return span;
}

Span SpanOf(const KvMutableView& view) { return SpanOf(KvView(view)); }

Span ScaleSpanOf(const KvView& view) {
  if (view.scales == nullptr) return Span{nullptr, 0};
  return Span{view.scales, std::max<int64_t>(view.rows, 0) *
                               static_cast<int64_t>(sizeof(float))};
}

Status CheckMatrix(const char* fn, const char* name, const void* data,
                   int64_t rows, int64_t cols, int64_t stride,
                   size_t elem_size) {
  if (data == nullptr) {
    return Fail(StatusCode::kInvalidArgument, fn, name, ".data is null");
  }
  Status status = CheckPositive(fn, Cat(name, ".rows"), rows);
  if (status.ok()) status = CheckPositive(fn, Cat(name, ".cols"), cols);
  if (!status.ok()) return status;
  if (stride < cols) {
    return Fail(StatusCode::kInvalidArgument, fn, name, ".stride (", stride,
                ") is shorter than ", name, ".cols (", cols, ")");
  }
  int64_t bytes = 0;
  if (!SpanBytes(rows, cols, stride, elem_size, &bytes) ||
      static_cast<uint64_t>(bytes) > std::numeric_limits<uintptr_t>::max() -
                                         reinterpret_cast<uintptr_t>(data)) {
    return Fail(StatusCode::kResourceExhausted, fn, name, ": rows (", rows,
                ") x stride (", stride, ") overflows the address space");
  }
  return Status::Ok();
}

Status CheckSameShape(const char* fn, const char* a_name, int64_t a_rows,
                      int64_t a_cols, const char* b_name, int64_t b_rows,
                      int64_t b_cols) {
  if (a_rows == b_rows && a_cols == b_cols) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, b_name, " is ",
              Shape(b_rows, b_cols), " but ", a_name, " is ",
              Shape(a_rows, a_cols));
}

bool Overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  // Integer addresses: comparing pointers into different objects is
  // unspecified.
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a);
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_bytes) &&
         b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

Status CheckFinite(const char* fn, const char* name, float value) {
  if (std::isfinite(value)) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, name, " must be finite (got ",
              value, ")");
}

Status CheckHeadRows(const char* fn, const char* name, MatrixView<float> x,
                     int64_t head_dim) {
  Status status = CheckPositive(fn, "head_dim", head_dim);
  if (status.ok()) status = CheckMatrix(fn, name, x);
  if (status.ok() && x.cols % head_dim != 0) {
    status = Fail(StatusCode::kInvalidArgument, fn, name, ".cols (", x.cols,
                  ") is not a multiple of head_dim (", head_dim, ")");
  }
  return status;
}

}  // namespace internal
}  // namespace headway

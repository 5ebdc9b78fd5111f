#include "lib/core/validate.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace headway {
namespace internal {
namespace {

std::string Prefix(const char* fn, const char* name) {
  return std::string(fn) + ": " + name;
}

}  // namespace

bool SpanBytes(int64_t rows, int64_t cols, int64_t stride, size_t elem_size,
               int64_t* bytes) {
  int64_t elems = 0;
  return CheckedMul(rows - 1, stride, &elems) &&
         CheckedAdd(elems, cols, &elems) &&
         CheckedMul(elems, static_cast<int64_t>(elem_size), bytes);
}

Status CheckMatrix(const char* fn, const char* name, const void* data,
                   int64_t rows, int64_t cols, int64_t stride,
                   size_t elem_size) {
  if (data == nullptr) {
    return Status::InvalidArgument(Prefix(fn, name) + ".data is null");
  }
  if (rows < 1) {
    return Status::InvalidArgument(Prefix(fn, name) +
                                   ".rows must be >= 1 (got " +
                                   std::to_string(rows) + ")");
  }
  if (cols < 1) {
    return Status::InvalidArgument(Prefix(fn, name) +
                                   ".cols must be >= 1 (got " +
                                   std::to_string(cols) + ")");
  }
  if (stride < cols) {
    return Status::InvalidArgument(
        Prefix(fn, name) + ".stride (" + std::to_string(stride) +
        ") is shorter than " + name + ".cols (" + std::to_string(cols) + ")");
  }
  int64_t bytes = 0;
  if (!SpanBytes(rows, cols, stride, elem_size, &bytes) ||
      static_cast<uint64_t>(bytes) > std::numeric_limits<uintptr_t>::max() -
                                         reinterpret_cast<uintptr_t>(data)) {
    return Status::ResourceExhausted(
        Prefix(fn, name) + ": rows (" + std::to_string(rows) + ") x stride (" +
        std::to_string(stride) + ") overflows the address space");
  }
  return Status::Ok();
}

Status CheckSameShape(const char* fn, const char* a_name, int64_t a_rows,
                      int64_t a_cols, const char* b_name, int64_t b_rows,
                      int64_t b_cols) {
  if (a_rows == b_rows && a_cols == b_cols) return Status::Ok();
  return Status::InvalidArgument(
      std::string(fn) + ": " + b_name + " is [" + std::to_string(b_rows) +
      ", " + std::to_string(b_cols) + "] but " + a_name + " is [" +
      std::to_string(a_rows) + ", " + std::to_string(a_cols) + "]");
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
  return Status::InvalidArgument(Prefix(fn, name) + " must be finite (got " +
                                 std::to_string(value) + ")");
}

}  // namespace internal
}  // namespace headway

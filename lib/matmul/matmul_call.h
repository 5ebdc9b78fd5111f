// The structures a matmul call hands to the kernels (matmul-inl.h), filled by
// the entry points (matmul.cc, layer.cc): where the product goes and the parts
// of a B to pack.
#ifndef HEADWAY_LIB_MATMUL_MATMUL_CALL_H_
#define HEADWAY_LIB_MATMUL_MATMUL_CALL_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "headway/matmul.h"
#include "headway/targets.h"

namespace headway {

// Kinds of destination a segmented MatmulOut may have (Q, K, V).
inline constexpr size_t kMatmulMaxKinds = 4;

// Where the product C [m, n] goes. Plain (rows == nullptr): C(i, j) at
// c + i * ldc + j. Segmented, for the layer's fused QKV projection, which
// writes Q into a buffer and K and V straight into KV cache rows: the columns
// are cut into segments of seg_cols; segment s belongs to the last kind q with
// kind_first[q] <= s, and
//   C(i, j) is at rows[q * m + i] + (s - kind_first[q]) * kind_stride[q] +
//                 (j - s * seg_cols).
struct MatmulOut {
  float* c = nullptr;
  size_t ldc = 0;
  float* const* rows = nullptr;  // [n_kinds][m] row pointers
  size_t m = 0;
  size_t seg_cols = 1;
  size_t n_kinds = 0;
  size_t kind_first[kMatmulMaxKinds] = {};
  size_t kind_stride[kMatmulMaxKinds] = {};

  // Column j of every row: At(i, j) without finding j's segment for each i.
  struct Column {
    float* c;  // plain: C(0, j), rows ldc apart
    size_t ldc;
    float* const* rows;  // segmented: C(i, j) = rows[i] + offset
    size_t offset;
    float* At(size_t i) const {
      return rows == nullptr ? c + i * ldc : rows[i] + offset;
    }
  };
  Column ColumnAt(size_t j) const {
    if (rows == nullptr) return {c + j, ldc, nullptr, 0};
    const size_t s = j / seg_cols;
    size_t q = n_kinds - 1;
    while (kind_first[q] > s) --q;
    return {nullptr, 0, rows + q * m,
            (s - kind_first[q]) * kind_stride[q] + (j - s * seg_cols)};
  }
  float* At(size_t i, size_t j) const { return ColumnAt(j).At(i); }
  // Whether columns [j, j + cols) lie next to each other in every row.
  bool Contiguous(size_t j, size_t cols) const {
    return rows == nullptr || j / seg_cols == (j + cols - 1) / seg_cols;
  }
  // A tile's column: *column = ColumnAt(j) and column where columns [j, j +
  // cols) are Contiguous, else null (column untouched).
  const Column* ContiguousColumn(size_t j, size_t cols, Column* column) const {
    if (!Contiguous(j, cols)) return nullptr;
    *column = ColumnAt(j);
    return column;
  }
};

// Columns [begin, begin + cols) of a matrix given as parts side by side (the
// fused QKV weight from W_Q, W_K and W_V): op(part) [k, cols], op(part) = b
// [k, cols] (row stride ldb) or b^T with b [cols, k]; b of float, or of bf16
// (b16, the bits; b null).
struct MatmulBPart {
  const float* b;
  size_t ldb;
  bool trans;
  size_t begin;
  size_t cols;
  const uint16_t* b16 = nullptr;

  // Element (row, col) of b as stored, as a float.
  float At(size_t row, size_t col) const {
    if (b != nullptr) return b[row * ldb + col];
    const uint32_t bits = static_cast<uint32_t>(b16[row * ldb + col]) << 16;
    float x;
    memcpy(&x, &bits, sizeof(x));
    return x;
  }
};

// A B packed beforehand (PackedB, or a layer's weights) as the kernels read
// it: its panels of the stored type and how to multiply them.
struct MatmulPackedWeights {
  const void* data = nullptr;     // PackedB::data()
  const float* scales = nullptr;  // int8: PackedB::scales()
  int dtype = 0;                  // WeightDtype
  // MatmulCompute::kBFloat16 (dtype kBFloat16 or kInt8): op(A) rounded to
  // bf16, pairs of products summed; `native`: with vdpbf16ps
  // (NativeBFloat16Active at the call, AVX3 targets only); `amx`: more than 16
  // rows of A on AMX tiles (AmxBFloat16Active at the call, x86-64 AVX3 targets
  // only).
  bool bf16_compute = false;
  bool native = false;
  bool amx = false;
};

// How the kernels read b, multiplied in `compute` (checked by the caller: bf16
// compute needs bf16 or int8 weights).
inline MatmulPackedWeights PackedWeights(
    const PackedB& b, MatmulCompute compute = MatmulCompute::kFloat32) {
  MatmulPackedWeights w;
  w.data = b.data();
  w.scales = b.scales();
  w.dtype = static_cast<int>(b.dtype());
  w.bf16_compute = compute == MatmulCompute::kBFloat16;
  w.native = w.bf16_compute && NativeBFloat16Active();
  w.amx = w.bf16_compute && AmxBFloat16Active();
  return w;
}

}  // namespace headway

#endif  // HEADWAY_LIB_MATMUL_MATMUL_CALL_H_

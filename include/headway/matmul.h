// Matmul: float32 general matrix product, C = alpha * op(A) * op(B) + beta * C.
//
// Row-major strided views; op(X) is X or its transpose. The kernel packs B into
// column panels and A into row strips, runs a register-blocked micro-kernel
// sized for the instruction set in use, and splits the work over oneTBB threads
// by blocks of rows and columns of C only: K is cut into fixed blocks that
// depend on the shapes (never on threads) and accumulated in order, so the
// result is bit-identical for any number of threads.
//
// Weights that multiply many activations are packed once (PackedB) and reused
// by every call.
#ifndef HEADWAY_MATMUL_H_
#define HEADWAY_MATMUL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "headway/export.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

// op(X) = X (kNo) or X^T (kYes).
enum class Transpose : int { kNo = 0, kYes = 1 };

// B packed once into the panel layout of the micro-kernel, for reuse by many
// Matmul calls (a host packs its weights at load time). Owns its memory;
// move-only.
//
// The layout depends on the vector width of the instruction set that packed it
// (panels of 32 columns on AVX3/AVX3_DL, 16 on AVX2, 8 on SSE4/SSSE3, 4 on
// SCALAR). Matmul with a PackedB fails with kFailedPrecondition when dispatch
// now picks an instruction set with another panel width (after SetMaxTarget,
// say): pack again after changing the target. Targets with the same panel width
// (AVX3_DL and AVX3; SSE4 and SSSE3) share packed matrices.
class HEADWAY_API PackedB {
 public:
  PackedB();  // empty: rows() == cols() == 0; Matmul rejects it
  ~PackedB();
  PackedB(PackedB&& other) noexcept;
  PackedB& operator=(PackedB&& other) noexcept;
  PackedB(const PackedB&) = delete;
  PackedB& operator=(const PackedB&) = delete;

  // Packs op(b) [k, n] (b is [k, n] for kNo, [n, k] for kYes) for the current
  // target into *out (its previous contents are released), from 4 MiB up in
  // transparent huge pages where the kernel allows (as KvCache's buffers).
  // Cost: one read of b and one write of bytes().
  // Errors (kInvalidArgument, *out unchanged): null out, null data, rows or
  // cols < 1, a stride < cols, a bad Transpose value; kResourceExhausted: a
  // byte count that overflows, or no memory for the packed buffer.
  static Status Pack(MatrixView<const float> b, Transpose tb, PackedB* out);

  // Packs the matrix [parts[0] | parts[1] | ...] [k, sum of the parts'
  // columns], the parts side by side (each [k, cols_i], row-major with its own
  // stride), as Pack would pack it, without building it: a layer's fused QKV
  // weight from W_Q, W_K and W_V, say. Bit-identical to Pack of the
  // concatenation. Errors (kInvalidArgument, *out unchanged): null out or
  // parts, n_parts not in [1, kMaxColumnParts], a bad part (as for Pack), parts
  // with different row counts; kResourceExhausted: as for Pack.
  static constexpr int64_t kMaxColumnParts = 16;
  static Status PackColumns(const MatrixView<const float>* parts,
                            int64_t n_parts, PackedB* out);

  int64_t rows() const { return rows_; }  // K: rows of op(b)
  int64_t cols() const { return cols_; }  // N: columns of op(b)
  // Bytes of the packed buffer: K * ceil(N / panel) * panel * 4 (the edge
  // panel is zero-padded).
  size_t bytes() const { return floats_ * sizeof(float); }
  // Columns per panel of the layout (see above).
  int64_t panel_width() const { return panel_width_; }
  // Name of the instruction set it was packed for, e.g. "AVX3"; "" when empty.
  const char* target_name() const { return target_name_; }

  // The packed panels, [K blocks][ceil(N / panel)][block length][panel]: read
  // by the kernels.
  const float* data() const { return data_.get(); }

 private:
  // Takes data, an allocation of the library's, with its description.
  void Reset(float* data, size_t floats, int64_t rows, int64_t cols,
             int64_t panel_width, const char* target_name);

  std::unique_ptr<float, void (*)(float*)> data_{nullptr, nullptr};
  size_t floats_ = 0;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t panel_width_ = 0;
  const char* target_name_ = "";
};

// C = alpha * op(a) * op(b) + beta * C.
//   op(a): [M, K] (a is [M, K] for kNo, [K, M] for kYes); op(b): [K, N]
//   likewise; c: [M, N]. Any strides >= cols. beta == 0 writes C without
//   reading it (a NaN in C does not survive), alpha == 0 reads neither a nor b
//   (C = beta * C), as in BLAS.
// Error bound per element (float32 accumulation, one FMA per term, in K blocks
// of at most 512):
//   |c - exact| <= (K + K / 512 + 3) * 2^-24 * (|alpha| sum_k |a| |b| +
//                                               |beta| |c_old|).
// Cost: 2 M N K flops; B is packed once per call (use PackedB to pack it once
// for many calls).
// Errors (kInvalidArgument, nothing written): null data, rows or cols < 1, a
// stride < cols, a bad Transpose value, op(a) columns != op(b) rows, c not
// [M, N], c overlapping a or b, alpha or beta not finite; kResourceExhausted: a
// view whose byte size overflows, or no memory for packing.
HEADWAY_API Status Matmul(MatrixView<const float> a, Transpose ta,
                          MatrixView<const float> b, Transpose tb,
                          MatrixView<float> c, float alpha = 1.0f,
                          float beta = 0.0f);

// Same with B packed beforehand: C = alpha * op(a) * b + beta * C, b [K, N].
// Results are bit-identical to Matmul with the unpacked op(b) on the same
// target. Errors: as above, plus kInvalidArgument for an empty b;
// kFailedPrecondition when b was packed for an instruction set whose panel
// width differs from the one dispatch picks now.
HEADWAY_API Status Matmul(MatrixView<const float> a, Transpose ta,
                          const PackedB& b, MatrixView<float> c,
                          float alpha = 1.0f, float beta = 0.0f);

}  // namespace headway

#endif  // HEADWAY_MATMUL_H_

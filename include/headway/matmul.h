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

// How a PackedB stores its weights. Matmul reads them as floats and
// accumulates in float32 whatever the storage.
//   kFloat32   float, as is
//   kBFloat16  bfloat16, round to nearest even (as KvDtype::kBFloat16); NaN
//              stays NaN, +-inf stays +-inf, as in float32
//   kInt8      int8 q in [-127, 127] with one float scale per column j of
//              op(b): scale_j = max_k |b[k, j]| / 127 (0 when that is below
//              127 * FLT_MIN: the column reads as zeros), q = round to
//              nearest even (b / scale_j); the weight read is scale_j * q.
//              A column with a NaN or inf cannot be packed (kInvalidArgument).
enum class WeightDtype : int {
  kFloat32 = 0,   // 4 bytes
  kBFloat16 = 1,  // 2 bytes
  kInt8 = 2,      // 1 byte, plus 4 bytes per column
};

// What Matmul with a PackedB multiplies in.
//   kFloat32   op(a) as is, times the weights read as floats (any
//              WeightDtype).
//   kBFloat16  op(a) rounded to bf16 (nearest even) times the weights of a
//              PackedB stored as kBFloat16, or as kInt8 (its levels q, exact
//              in bf16, with the column scales applied to the sums), each
//              pair of products (k, k + 1) added to a float32 accumulator:
//              for more than 16 rows of a, AMX's tile multiply tdpbf16ps
//              where AmxBFloat16Active() (targets.h: Intel's cores from
//              Sapphire Rapids on), else AVX512_BF16's vdpbf16ps where
//              NativeBFloat16Active() (AMD's cores by default), else a
//              kernel with the same contract. AMX:
//              6x float32's GEMM speed at 2048^3 on one core of a Xeon with
//              AMX; native: 1.8x at 2048^3 on Zen 5 (AVX3_DL, one thread,
//              measured: docs/BENCHMARKS.md); the fallback runs at float32's
//              speed. int8 weights reach AMX and the native kernel as bf16,
//              converted slice by slice during the call (more than 16 rows
//              pay for it: the MHA layer's prefill of 512 tokens on int8
//              weights, AMX, 3.4x float32 compute's speed on one core and
//              0.93x bf16 weights'); 16 rows or fewer read the int8 bytes
//              in the fallback, at the GEMV's memory speed.
enum class MatmulCompute : int {
  kFloat32 = 0,
  kBFloat16 = 1,
};

// Bytes per stored weight of dtype: 4, 2, 1; 0 for an unknown dtype.
HEADWAY_API size_t WeightDtypeSize(WeightDtype dtype);

// A bfloat16 value (a checkpoint's weights): the top 16 bits of the float32
// whose low 16 bits are zero.
struct BFloat16 {
  uint16_t bits;
};

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
  // target into *out (its previous contents are released), stored as dtype,
  // from 4 MiB up in transparent huge pages where the kernel allows (as
  // KvCache's buffers).
  // Cost: one read of b and one write of bytes(); bf16 and int8 go through a
  // float copy of one panel (K * panel_width() floats) per thread.
  // Errors (kInvalidArgument, *out unchanged): null out, null data, rows or
  // cols < 1, a stride < cols, a bad Transpose or WeightDtype value, for
  // kInt8 a NaN or inf in b (the message names the column of op(b));
  // kResourceExhausted: a byte count that overflows, or no memory.
  static Status Pack(MatrixView<const float> b, Transpose tb, PackedB* out,
                     WeightDtype dtype = WeightDtype::kFloat32);
  // The same from bfloat16 weights: exactly Pack of the same values as floats
  // (every bfloat16 is a float).
  static Status Pack(MatrixView<const BFloat16> b, Transpose tb, PackedB* out,
                     WeightDtype dtype);
  // Packs the matrix [parts[0] | parts[1] | ...] [k, sum of the parts'
  // columns], the parts side by side (each [k, cols_i], row-major with its own
  // stride), as Pack would pack it, without building it: a layer's fused QKV
  // weight from W_Q, W_K and W_V, say. Bit-identical to Pack of the
  // concatenation (int8 scales included). Errors (kInvalidArgument, *out
  // unchanged): null out or parts, n_parts not in [1, kMaxColumnParts], a bad
  // part or dtype (as for Pack), parts with different row counts;
  // kResourceExhausted: as for Pack.
  static constexpr int64_t kMaxColumnParts = 16;
  static Status PackColumns(const MatrixView<const float>* parts,
                            int64_t n_parts, PackedB* out,
                            WeightDtype dtype = WeightDtype::kFloat32);
  // The same from bfloat16 parts: exactly PackColumns of the same values as
  // floats.
  static Status PackColumns(const MatrixView<const BFloat16>* parts,
                            int64_t n_parts, PackedB* out, WeightDtype dtype);

  int64_t rows() const { return rows_; }  // K: rows of op(b)
  int64_t cols() const { return cols_; }  // N: columns of op(b)
  // How the weights are stored.
  WeightDtype dtype() const { return dtype_; }
  // Bytes of the packed buffer: K * ceil(N / panel) * panel *
  // WeightDtypeSize(dtype()) (the edge panel is zero-padded), rounded up to
  // 64, plus for kInt8 ceil(N / panel) * panel * 4 for the scales.
  size_t bytes() const { return bytes_; }
  // Columns per panel of the layout (see above).
  int64_t panel_width() const { return panel_width_; }
  // Name of the instruction set it was packed for, e.g. "AVX3"; "" when empty.
  const char* target_name() const { return target_name_; }

  // The packed panels, [K blocks][ceil(N / panel)][block length][panel] of
  // the stored type: read by the kernels.
  const void* data() const { return data_.get(); }
  // kInt8: the scales of the columns, [ceil(N / panel) * panel] (0 past N);
  // null for other dtypes.
  const float* scales() const { return scales_; }

 private:
  // Takes data, an allocation of the library's, with its description.
  void Reset(void* data, size_t bytes, const float* scales, WeightDtype dtype,
             int64_t rows, int64_t cols, int64_t panel_width,
             const char* target_name);

  std::unique_ptr<void, void (*)(void*)> data_{nullptr, nullptr};
  size_t bytes_ = 0;
  const float* scales_ = nullptr;
  WeightDtype dtype_ = WeightDtype::kFloat32;
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
// float32 b: bit-identical to Matmul with the unpacked op(b) on the same
// target. bf16 and int8 b: the weights are read as the floats they stand for
// (WeightDtype) and accumulated in float32 as above; the bound above holds
// with b the dequantized weights (exact scale_j * q for int8), plus one more
// 2^-24 * |alpha| sum_k |a| |b| for int8 (the multiply by scale_j, once per
// K block). Bit-identical for any number of threads, for every dtype.
// compute kBFloat16: op(a) is rounded to bf16 (nearest even, as
// WeightDtype::kBFloat16 stores); the products of bf16 values (and of bf16
// and int8 levels) are exact in float32 and are accumulated in float32, so
// the bound above holds with op(a) replaced by its bf16 rounding (int8: plus
// the scale's rounding, as above). The native kernels (vdpbf16ps, AMX's
// tdpbf16ps) read denormal inputs as 0 and flush denormal results to 0,
// whatever MXCSR says: values of op(a) and b, and partial sums, below 2^-126
// in magnitude may read as 0 there, outside the bound; the fallback keeps
// them, as float32 compute does. AMX sums each element over all of K before
// it adds alpha times the sum to C (one rounding fewer per K block).
// Errors: as above, plus kInvalidArgument for an empty b, a compute value
// outside MatmulCompute, or compute kBFloat16 with b stored as
// WeightDtype::kFloat32; kFailedPrecondition when b was packed for an
// instruction set whose panel width differs from the one dispatch picks now.
HEADWAY_API Status Matmul(MatrixView<const float> a, Transpose ta,
                          const PackedB& b, MatrixView<float> c,
                          float alpha = 1.0f, float beta = 0.0f,
                          MatmulCompute compute = MatmulCompute::kFloat32);

// The same with bf16 activations (a model's own, or a checkpoint's): a holds
// bfloat16 values. Exactly Matmul with a float a holding the same values
// (every bfloat16 is a float): the same bound, errors and results, bit for
// bit on the same target and compute (a NaN in a gives NaNs where a float NaN
// does, their payloads aside). Where the call runs on AMX tiles
// (compute kBFloat16, more than 16 rows), the tiles take a's bf16 as they
// are, with no conversion: on one core of a Xeon with AMX, 512^3 1.17x the
// float a's speed, 512^3 and 2048^3 1.10x and 1.59x oneDNN's bf16 matmul on
// the same bf16 inputs (docs/BENCHMARKS.md). The other kernels of compute
// kBFloat16 take them as they are too, into their strips of A: copied (the
// native kernel) or widened (the fallback). Compute kFloat32 widens op(a) to a
// float copy first, in a buffer of the calling thread (M K floats, kept for its
// next call: ReleaseThreadScratch, threads.h, frees it).
HEADWAY_API Status Matmul(MatrixView<const BFloat16> a, Transpose ta,
                          const PackedB& b, MatrixView<float> c,
                          float alpha = 1.0f, float beta = 0.0f,
                          MatmulCompute compute = MatmulCompute::kFloat32);

}  // namespace headway

#endif  // HEADWAY_MATMUL_H_

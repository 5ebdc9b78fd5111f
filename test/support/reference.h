// Float64 reference implementations that every kernel test compares against.
//
// Inputs are float (what the kernels read) or double (intermediate results of
// other references); every product and sum is computed in double, in the plain
// textbook order, so a reference is slow but its own rounding error (about
// 1e-16 relative) is negligible next to float32's 6e-8. Strides are in
// elements; padding between a row's last element and the next row is never
// read.
#ifndef HEADWAY_TEST_SUPPORT_REFERENCE_H_
#define HEADWAY_TEST_SUPPORT_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "headway/matmul.h"
#include "headway/rope.h"

namespace headway {
namespace test {
namespace ref {

// C = alpha * op(A) op(B) + beta * C, the BLAS gemm contract in double.
//   op(A): [m, k]. A is [m, k] (row stride lda), or [k, m] when trans_a.
//   op(B): [k, n]. B is [k, n] (row stride ldb), or [n, k] when trans_b.
//   c: [m, n] dense (row stride n), read only when beta != 0: with beta == 0
//     its old contents, NaN included, are ignored. A and B are always read
//     (alpha == 0 does not hide a NaN in them, unlike BLAS).
//   abs_c: null, or [m, n] dense, set to
//     |alpha| * sum_p |op(A)[i, p]| |op(B)[p, j]| + |beta| |C_old[i, j]|
//     (the last term only when beta != 0): the magnitude that scales a float32
//     kernel's error, which is about k * 2^-24 * abs_c[i, j].
void Matmul(int64_t m, int64_t n, int64_t k, double alpha, const float* a,
            int64_t lda, bool trans_a, const float* b, int64_t ldb,
            bool trans_b, double beta, double* c, double* abs_c = nullptr);

// The same with double inputs, to chain references (an output projection).
void Matmul(int64_t m, int64_t n, int64_t k, double alpha, const double* a,
            int64_t lda, bool trans_a, const double* b, int64_t ldb,
            bool trans_b, double beta, double* c, double* abs_c = nullptr);

// Row-wise softmax(scale * x), returned dense [rows, cols].
//   x: [rows, cols] with row stride `stride`.
//   A row whose scaled values are all -inf gives zeros; -inf entries give 0; a
//   row with a NaN or a +inf scaled value gives all NaN (exp(inf - inf) is
//   undefined).
std::vector<double> Softmax(const float* x, int64_t stride, int64_t rows,
                            int64_t cols, double scale);

// Copies a strided float matrix into a dense double one.
//   x: [rows, cols] with row stride `stride`; returns [rows, cols] dense.
std::vector<double> ToDouble(const float* x, int64_t rows, int64_t cols,
                             int64_t stride);

// x rounded to bfloat16, to nearest even, as a float (finite x): what a bf16
// weight or a bf16 compute mode's input stands for.
float RoundToBFloat16(float x);

// The int8 scales of a PackedB's columns (WeightDtype::kInt8 in
// headway/matmul.h), from its rule, in float arithmetic as the rule says.
//   w: op(B) [rows, cols] with row stride `stride`, finite. Returns [cols]:
//   s_j = max_k |w[k, j]| / 127, 0 when that max is below 127 * FLT_MIN.
std::vector<float> Int8ColumnScales(const float* w, int64_t rows, int64_t cols,
                                    int64_t stride);

// The weights a PackedB stored as dtype stands for (WeightDtype in
// headway/matmul.h), from its rule.
//   w: op(B) [rows, cols] with row stride `stride`, finite; column j is
//     output feature j. Returns [rows, cols] dense.
// float32: w. bf16: RoundToBFloat16(w). int8: per column, in float
// arithmetic as the rule says, s_j = Int8ColumnScales(w)[j] and q = nearest
// even (w / s_j) in [-127, 127] (0 when s_j is 0); the weight is s_j * q,
// exact in double.
std::vector<double> StoredWeights(const float* w, int64_t rows, int64_t cols,
                                  int64_t stride, WeightDtype dtype);

// Scaled dot-product attention of every query head, with the GQA head mapping.
//   q: [n_q, n_heads * head_dim], row stride q_stride; head h is its columns
//     h * head_dim .. (h + 1) * head_dim - 1.
//   k, v: [n_kv, n_kv_heads * head_dim], row strides k_stride and v_stride.
//   mask: null, or [n_q, n_kv] additive (may hold -inf), row stride
//     mask_stride.
//   Returns [n_q, n_heads * head_dim] dense.
// Query row t is at absolute position q_pos0 + t, cached row s at position s.
// Query head h reads KV head g = h / (n_heads / n_kv_heads) (n_heads must be a
// multiple of n_kv_heads). score[t, s] = scale * q_h[t] . k_g[s] + mask[t, s];
// with `causal`, keys s > q_pos0 + t are excluded, whatever mask says there,
// and so are keys whose mask entry is -inf: an excluded key adds nothing to
// the row, not even a NaN of its K or V.
// Softmax over s as in Softmax() above, except that a row with no key left
// (all excluded or all -inf) gives zeros, never NaN.
// With variants (AttentionOptions, headway/attention.h), in this order: keys
// at positions <= q_pos0 + t - window are excluded too (but for the
// n_sink_tokens first: VisibleKeys); the score becomes
// softcap * tanh(score / softcap), then gains alibi_slopes[h] * (s - (q_pos0 +
// t)), before the mask; exp(sink_logits[h]) joins each row's denominator.
struct Variants {
  int64_t window = 0;
  // With a window, keys at positions < n_sink_tokens stay visible.
  int64_t n_sink_tokens = 0;
  double softcap = 0.0;
  const float* alibi_slopes = nullptr;  // [n_heads] or null
  const float* sink_logits = nullptr;   // [n_heads] or null
};
// The keys a query at position p sees among positions [0, end) (end: the
// causal limit, or all keys): [first, end) past the window, and with a window
// the sink tokens [0, sinks_end).
struct VisibleSpan {
  int64_t sinks_end;
  int64_t first;
  int64_t end;
  bool Contains(int64_t s) const {
    return s < sinks_end || (s >= first && s < end);
  }
  int64_t count() const { return sinks_end + (end - first); }
};
VisibleSpan VisibleKeys(const Variants& variants, int64_t p, int64_t end);

std::vector<double> AttentionCore(const double* q, int64_t q_stride,
                                  int64_t n_q, const double* k,
                                  int64_t k_stride, const double* v,
                                  int64_t v_stride, int64_t n_kv,
                                  int64_t n_heads, int64_t n_kv_heads,
                                  int64_t head_dim, int64_t q_pos0, bool causal,
                                  const float* mask, int64_t mask_stride,
                                  double scale, const Variants& variants = {});

// Shape of one attention layer. n_heads must be a multiple of n_kv_heads:
// 1 is MQA, n_heads is MHA, anything between is GQA. d_model need not equal
// n_heads * head_dim.
struct AttentionShape {
  int64_t d_model;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
};

// Weights of one layer, all dense row-major. Biases may be null (no bias).
struct LayerWeights {
  const float* w_q;            // [d_model, n_heads * head_dim]
  const float* w_k;            // [d_model, n_kv_heads * head_dim]
  const float* w_v;            // [d_model, n_kv_heads * head_dim]
  const float* w_o;            // [n_heads * head_dim, d_model]
  const float* b_q = nullptr;  // [n_heads * head_dim]
  const float* b_k = nullptr;  // [n_kv_heads * head_dim]
  const float* b_v = nullptr;  // [n_kv_heads * head_dim]
  const float* b_o = nullptr;  // [d_model]
};

// The whole layer: the seed's numpy MultiHeadAttention.forward, generalised
// to n_kv_heads.
//   x: [seq, d_model] dense.
//   mask: null, or [seq, seq] additive, row stride mask_stride.
//   Returns [seq, d_model] dense.
// Q = x W_Q + b_q, K = x W_K + b_k, V = x W_V + b_v; per head the
// AttentionCore above with positions 0 .. seq-1 (optionally causal) and
// `scale` (1 / sqrt(head_dim) in the seed); heads concatenated, then times W_O,
// plus b_o.
std::vector<double> MultiHeadAttention(const AttentionShape& shape,
                                       const LayerWeights& w, const float* x,
                                       int64_t seq, bool causal,
                                       const float* mask, int64_t mask_stride,
                                       double scale);

// RoPE's frequencies (headway/rope.h) in long double, from the formulas:
// theta^(-2i / rotary_dim), then scaled (Llama 3.1: Hugging Face's
// _compute_llama3_parameters).
std::vector<long double> RopeFrequencies(const RopeConfig& rope);

// Pair i of a head of rotary_dim / 2 pairs: the indices of its two elements.
void RopePair(RopeLayout layout, int64_t half, int64_t i, int64_t* a,
              int64_t* b);

}  // namespace ref
}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_REFERENCE_H_

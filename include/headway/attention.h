// Attention core: scaled dot-product attention of new queries against a
// KvCache, for MHA, GQA and MQA alike.
//
// Query head h reads KV head h / (n_heads / n_kv_heads): n_kv_heads == n_heads
// is MHA, 1 is MQA, anything in between that divides n_heads is GQA. For query
// row t (at absolute position q_pos0 + t) and head h with KV head g:
//   out[t, h*d : (h+1)*d] = sum_s softmax_s(scale * q[t, h*d : (h+1)*d] .
//   K_g[s] + M[t, s]) V_g[s]
// over the cached rows s < length(seq), where M is the causal mask (-inf for s
// > q_pos0 + t) plus the optional additive mask, added in natural units (every
// finite mask value, -FLT_MAX included, is a score offset: a row of -FLT_MAX
// is the uniform average of the keys it sees). AttentionOptions adds the
// variants models use (sliding window, soft-capping, ALiBi, sink logits): see
// there for where each enters. A key that a row does not see (causal, window,
// or a -inf mask entry) contributes nothing to it, not even a NaN or inf in
// its K or V row. A row whose every score is masked gives zeros; a row that
// sees a NaN, or a score of +inf (without softcap), is NaN.
//
// Error bound, per output element of query row t (u = 2^-24): rounding errors
// taken as a random walk (Higham, Accuracy and Stability of Numerical
// Algorithms, 2nd ed., sec. 2.8), which the tests assert on every target,
//   |out - exact| <= 4 u |V|max (sqrt(d) S_t + sqrt(L_t) + 8)
// with S_t = max_s (scale * sum_p |q_p K[s, p]| + softcap + |alibi bias| +
// |mask[t, s]|) over the L_t keys the row sees and |V|max the largest |V|
// among them. The sqrt(d) S_t
// term is the rounding of the scores, which dominates for large logits (an
// error e in a score moves that key's weight by e relative); sqrt(L_t) the
// weighted sum of V; 8 exp, the rescaling and the chunk merge. Measured on
// scores near 960, the error is 2-9% of the bound; worst-case inputs can reach
// sqrt(d) and sqrt(L_t) times more.
#ifndef HEADWAY_ATTENTION_H_
#define HEADWAY_ATTENTION_H_

#include <cstdint>

#include "headway/export.h"
#include "headway/kv_cache.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

// The same values as the C API's hw_attention_mask: 0, the default, is causal.
enum class AttentionMask : int {
  kCausal = 0,  // a query at position p sees cached positions <= p
  kNone = 1,    // every query sees every cached row (and the additive mask)
};

// What decode multiplies in. The same values as the C API's
// hw_attention_compute.
enum class AttentionCompute : int {
  // q, the softmax weights P and the stored K and V as float32 (the default).
  kFloat32 = 0,
  // A bfloat16 cache only. Where a sequence's query rows per KV head (its
  // tokens times the query heads per KV head) number 2 to the target's float
  // lanes - 1 (15 on AVX-512, 7 on AVX2: GQA decode, a few tokens at a time),
  // q times the scale and P are rounded to bf16 (nearest even) and their
  // products with the stored bf16 K and V are summed in float32: vdpbf16ps
  // where NativeBFloat16Active() (GQA-8 decode 1.15x faster on Zen 4,
  // measured), else float32 FMAs on the same rounded values. With more rows
  // (prefill), where head_dim is a multiple of 32 and a KV head has at most 32
  // query heads, the same on AMX tiles where AmxBFloat16Active() (targets.h;
  // causal prefill of 2048 tokens, MHA and GQA-8, 3.2-3.3x faster than
  // kFloat32 on one core of a Xeon with AMX, docs/BENCHMARKS.md), else by
  // vdpbf16ps where NativeBFloat16Active() (AMD's Zen 4 and 5: 1.59x MHA and
  // 1.64x GQA-8 on one Zen 5 core, measured); elsewhere those calls compute
  // as kFloat32. Other calls (MHA decode, bound by the bytes) and
  // AttentionWithWeights compute as kFloat32. Bound, beyond kFloat32's float32
  // error: a score moves by at most 2^-9 * scale * sum_p |q_p K_p|, and with d
  // the most any of a row's scores moves, an output by at most
  // (e^(2 d) (1 + 2^-9) - 1) * sum_s w_s |V_s|, w the row's weights
  // (test/attention_test.cc checks it).
  kBFloat16 = 1,
  // An int8 cache only. Where a sequence's query rows per KV head number 1
  // to the target's float lanes - 1 (MHA and GQA decode, a few tokens at a
  // time), both products take integers (llama.cpp scores a q8_0 cache so):
  // q times the scale is quantized to int8 per query row as the cache
  // quantizes its rows (scale max|q| / 127, round to nearest), and the scores
  // are exact integer dot products with the stored K times the two scales;
  // the softmax weights times V's row scales are quantized per row and block
  // of 128 keys to integers of at most 2^14 times a power-of-two step, and
  // summed with the stored V. On AVX3_DL by vpdpbusd and vpdpwssd (exact
  // int32 sums), elsewhere by float32 FMAs on the same integers (the scores
  // the same bits up to head_dim 1024). Other calls compute as kFloat32.
  // Bound, beyond kFloat32's float32 error: a score moves by at most
  // max_p |scale q_p| (1 / 254 + 2^-22) sum_p |K_p|; with d the most any of
  // a row's scores moves, an output by at most (e^(2 d) - 1) sum_s w_s |V_s|
  // + 2^-14 e^(2 d) max_s |V_s| sum_s b_s, w the row's weights and b_s the
  // largest of them in key s's block (test/attention_test.cc checks it).
  kInt8 = 2,
};

// The score of query head h at position p for the key at position k is, in
// this order (each step only where its option is set):
//   s = scale * q . k
//   s = softcap * tanh(s / softcap)          (Gemma 2's logit soft-capping)
//   s = s + alibi_slopes[h] * (k - p)        (ALiBi)
//   s = s + mask[t, k]                       (the query's additive mask)
// and the key takes part only if the rules of VisibleKeys let it: k <= p
// (kCausal) and k > p - window (a sliding window) or k < n_sink_tokens
// (StreamingLLM's attention sinks). With sink_logits, the
// softmax's denominator also holds exp(sink_logits[h]) (gpt-oss's learned
// attention sinks: a virtual key of that score whose value is zero), so a
// row's weights sum to less than 1.
struct AttentionOptions {
  AttentionMask mask = AttentionMask::kCausal;
  // Multiplies q . k; 0 means 1 / sqrt(head_dim).
  float scale = 0.0f;
  // A query at position p sees no key at position <= p - window (Mistral,
  // Gemma 2/3, gpt-oss); 0: no window. Time and work follow the keys a query
  // sees: decode reads window keys, prefill skips the blocks outside.
  int64_t window = 0;
  // With a window: keys at positions < n_sink_tokens stay visible to every
  // query that sees them causally (StreamingLLM: Xiao et al., 2024, keep 4);
  // 0: none; at most the window. A ring cache (KvCacheConfig::ring) pins the
  // same count and needs it here, with a window of at most capacity -
  // n_sink_tokens keys.
  int64_t n_sink_tokens = 0;
  // Logit soft-capping (Gemma 2: 50); 0: none. A +inf score becomes softcap.
  float softcap = 0.0f;
  // [n_heads] per-head ALiBi slopes (Press et al., 2022; AlibiSlopes gives
  // the paper's); null: none. Finite. Distances k - p are exact below 2^24.
  const float* alibi_slopes = nullptr;
  // [n_heads] per-head sink logits in natural units (gpt-oss); null: none.
  // Finite.
  const float* sink_logits = nullptr;
  // What decode multiplies in (see AttentionCompute).
  AttentionCompute compute = AttentionCompute::kFloat32;
};

// The ALiBi paper's slopes for n_heads heads into slopes [n_heads]: for n a
// power of two, 2^(-8 (h + 1) / n); otherwise those of the largest power of
// two n' < n, then every other slope of 2 n' (BLOOM's and the paper's code).
// Errors (kInvalidArgument): n_heads < 1, null slopes.
HEADWAY_API Status AlibiSlopes(int64_t n_heads, float* slopes);

// The new queries of one sequence.
struct AttentionQuery {
  int64_t seq = 0;     // sequence slot in the cache
  int64_t q_pos0 = 0;  // absolute position of q's first row
  // [n_tokens, n_heads * head_dim]: head h in columns [h * head_dim, (h + 1) *
  // head_dim).
  MatrixView<const float> q;
  // [n_tokens, n_heads * head_dim], written.
  MatrixView<float> out;
  // Optional additive mask [n_tokens, length(seq)] (-inf allowed); data ==
  // nullptr: none.
  MatrixView<const float> mask;
};

// Fused ("flash") attention for one or several sequences in one call. The
// n_tokens x length score matrix is never materialised: blocks of queries meet
// blocks of keys with an online softmax, causal blocks past the diagonal are
// skipped, and the query heads that share a KV head are processed together so
// each K/V row loaded serves all of them. A long cache with few queries
// (decode) is split into fixed-size chunks merged by log-sum-exp. The tiling
// depends on the shapes only: results are bit-identical for any number of
// threads. A ring cache (KvCacheConfig::ring) works alike over the positions
// it holds: each query must find its window there, so a call can attend at
// most capacity - n_sink_tokens - window + 1 new tokens of a sequence
// appended in one go (AttentionLayer handles longer prefills itself).
// Errors (kInvalidArgument, nothing written): an empty cache, n_heads
// < 1 or not a multiple of the cache's n_kv_heads, n_heads * head_dim
// overflowing int64_t, n_queries < 1 or a null queries, a bad seq, bad
// q/out/mask views, q or out not [n_tokens, n_heads * head_dim], a mask not
// [n_tokens, length(seq)], out overlapping q, the mask, the cache or another
// query's out, q_pos0 < 0, a scale that is not finite or < 0, a window or
// n_sink_tokens < 0, n_sink_tokens > window, a softcap that is not finite or
// < 0, a slope or sink
// logit that is not finite (the message names its index); with a ring cache,
// a window not in [1, capacity - n_sink_tokens], an n_sink_tokens other than
// the cache's, or a mask; kOutOfRange: q_pos0 + n_tokens > length(seq) (a
// query must come after its own key and value are cached), a ring that no
// longer holds the first query's window; kResourceExhausted: a view whose
// byte span overflows, or no memory for scratch.
HEADWAY_API Status Attention(const KvCache& cache, int64_t n_heads,
                             const AttentionQuery* queries, int64_t n_queries,
                             const AttentionOptions& options = {});

// The materialised path, for a caller who wants to see the attention weights
// (and the baseline the fused path is measured against): for one sequence,
//   weights[h * n_tokens + t, s] = softmax_s(scale * q_h[t] . K_g[s] + M[t, s])
//   out[t, h*d : (h+1)*d] = sum_s weights[h * n_tokens + t, s] V_g[s]
// with the options' variants as Attention applies them (with sink_logits a
// row's weights sum to less than 1). weights: [n_heads * n_tokens,
// length(seq)], written (hidden entries are 0; a row that sees a NaN or +inf
// score is NaN throughout, as softmax gives).
// Errors: as Attention, plus a ring cache, weights not [n_heads * n_tokens,
// length(seq)] or overlapping. Memory: the weights are n_heads * n_tokens *
// length floats.
HEADWAY_API Status AttentionWithWeights(const KvCache& cache, int64_t n_heads,
                                        const AttentionQuery& query,
                                        MatrixView<float> weights,
                                        const AttentionOptions& options = {});

}  // namespace headway

#endif  // HEADWAY_ATTENTION_H_

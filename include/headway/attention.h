// Attention core: scaled dot-product attention of new queries against a
// KvCache, for MHA, GQA and MQA alike.
//
// Query head h reads KV head h / (n_heads / n_kv_heads): n_kv_heads == n_heads
// is MHA, 1 is MQA, anything in between that divides n_heads is GQA. For query
// row t (at absolute position q_pos0 + t) and head h with KV head g:
//   out[t, h*d : (h+1)*d] = sum_s softmax_s(scale * q[t, h*d : (h+1)*d] .
//   K_g[s] + M[t, s]) V_g[s]
// over the cached rows s < length(seq), where M is the causal mask (-inf for s
// > q_pos0 + t) plus the optional additive mask. A row whose every score is
// masked gives zeros.
#ifndef HEADWAY_ATTENTION_H_
#define HEADWAY_ATTENTION_H_

#include <cstdint>

#include "headway/export.h"
#include "headway/kv_cache.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

enum class AttentionMask : int {
  kNone =
      0,  // every query sees every cached row (plus the additive mask, if any)
  kCausal = 1,  // a query at position p sees cached positions <= p
};

struct AttentionOptions {
  AttentionMask mask = AttentionMask::kCausal;
  // Multiplies q . k; 0 means 1 / sqrt(head_dim).
  float scale = 0.0f;
};

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
// threads. Errors (kInvalidArgument, nothing written): an empty cache, n_heads
// < 1 or not a multiple of the cache's n_kv_heads, n_heads * head_dim
// overflowing int64_t, n_queries < 1 or a null queries, a bad seq, bad
// q/out/mask views, q or out not [n_tokens, n_heads * head_dim], a mask not
// [n_tokens, length(seq)], out overlapping q, the mask, the cache or another
// query's out, q_pos0 < 0, a scale that is not finite or < 0; kOutOfRange:
// q_pos0 + n_tokens > length(seq) (a query must come after its own key and
// value are cached); kResourceExhausted: a view whose byte span overflows, or
// no memory for scratch.
HEADWAY_API Status Attention(const KvCache& cache, int64_t n_heads,
                             const AttentionQuery* queries, int64_t n_queries,
                             const AttentionOptions& options = {});

// The materialised path, for a caller who wants to see the attention weights
// (and the baseline the fused path is measured against): for one sequence,
//   weights[h * n_tokens + t, s] = softmax_s(scale * q_h[t] . K_g[s] + M[t, s])
//   out[t, h*d : (h+1)*d] = sum_s weights[h * n_tokens + t, s] V_g[s]
// weights: [n_heads * n_tokens, length(seq)], written (masked entries are 0).
// Errors: as Attention, plus weights not [n_heads * n_tokens, length(seq)] or
// overlapping. Memory: the weights are n_heads * n_tokens * length floats.
HEADWAY_API Status AttentionWithWeights(const KvCache& cache, int64_t n_heads,
                                        const AttentionQuery& query,
                                        MatrixView<float> weights,
                                        const AttentionOptions& options = {});

}  // namespace headway

#endif  // HEADWAY_ATTENTION_H_

// The one builder of the call-wide attention structures (attention_call.h):
// Attention, AttentionWithWeights and AttentionLayer::Forward fill
// AttentionDims and AttentionWork here, from the cache's own geometry, after
// their argument checks.
#ifndef HEADWAY_LIB_ATTENTION_ATTENTION_BUILD_H_
#define HEADWAY_LIB_ATTENTION_ATTENTION_BUILD_H_

#include <stdint.h>

#include "headway/attention.h"
#include "headway/kv_cache.h"
#include "headway/status.h"
#include "headway/view.h"
#include "lib/attention/attention_call.h"

namespace headway {

// A known mask, a finite scale >= 0, window >= 0, a finite softcap >= 0 and
// finite alibi_slopes and sink_logits [n_heads] (when not null); the messages
// name the fields "<name>.mask", "<name>.alibi_slopes[3]"... (name:
// "options", "config.attention").
Status CheckAttentionOptions(const char* fn, const char* name,
                             const AttentionOptions& options, int64_t n_heads);

// options.scale, or 1 / sqrt(head_dim) where it is 0.
float AttentionScale(const AttentionOptions& options, int64_t head_dim);

// The shape of a call of n_heads query heads (a multiple of the cache's
// n_kv_heads, checked) on cache, with checked options; the call's head h is
// head head0 + h of options' per-head arrays (a layer shard's offset).
AttentionDims MakeAttentionDims(const KvCache& cache, int64_t n_heads,
                                const AttentionOptions& options,
                                int64_t head0 = 0);

// One sequence's work: the n_tokens rows of q (and out) at positions q_pos0 ..
// q_pos0 + n_tokens - 1 attend to the first kv_len cached rows of seq (a
// checked seq); q and out are [n_tokens, n_heads * head_dim], mask
// [n_tokens, kv_len] or null data (none).
AttentionWork MakeAttentionWork(const KvCache& cache, int64_t seq,
                                int64_t q_pos0, int64_t kv_len,
                                MatrixView<const float> q,
                                MatrixView<float> out,
                                MatrixView<const float> mask);

}  // namespace headway

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_BUILD_H_

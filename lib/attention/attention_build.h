// The one builder of the call-wide attention structures (attention_call.h):
// Attention, AttentionWithWeights and AttentionLayer::Forward fill
// AttentionDims and AttentionWork here, from the cache's own geometry, after
// their argument checks.
#ifndef HEADWAY_LIB_ATTENTION_ATTENTION_BUILD_H_
#define HEADWAY_LIB_ATTENTION_ATTENTION_BUILD_H_

#include <stdint.h>

#include <vector>

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

// Errors for checked options on this cache (name as for
// CheckAttentionOptions): compute kBFloat16 needs a bfloat16 cache, kInt8
// an int8 one; a ring (KvCacheConfig::ring) needs a window of at most
// capacity - n_sink_tokens keys and the cache's n_sink_tokens.
Status CheckCacheOptions(const char* fn, const char* name, const KvCache& cache,
                         const AttentionOptions& options);

// Key positions [begin, end) stored contiguously: the K and V rows of the key
// at begin, KV head 0 (head g head_stride * g elements on), and for int8 their
// scales (head g scale_head_stride * g on); else null scales.
struct KeyRun {
  int64_t begin = 0;
  int64_t end = 0;
  const void* keys = nullptr;
  const void* values = nullptr;
  int64_t head_stride = 0;
  const float* key_scales = nullptr;
  const float* value_scales = nullptr;
  int64_t scale_head_stride = 0;
};

// The run of positions [begin, begin + rows) whose K and V rows of KV head 0
// are k and v (views of cache rows, int8 scales included), KV heads
// head_stride elements apart (scales scale_head_stride).
KeyRun RowsRun(int64_t begin, const KvView& k, const KvView& v,
               int64_t head_stride, int64_t scale_head_stride);

// The runs of cache rows that hold the positions of a checked seq, in position
// order, into runs[0, return value): a plain cache's [0, length) is one; a
// ring's are the sink tokens' and the ring's positions [ring_begin, length) in
// up to two (around the wrap).
int64_t CacheKeyRuns(const KvCache& cache, int64_t seq,
                     KeyRun runs[kMaxKeySegments]);

// The queries of one sequence as an AttentionWork's first fields: the
// n_tokens rows of q (and out) at positions q_pos0 .. q_pos0 + n_tokens - 1;
// q and out are [n_tokens, n_heads * head_dim], mask [n_tokens, the sequence's
// length] or null data (none).
AttentionWork SequenceQueries(int64_t q_pos0, MatrixView<const float> q,
                              MatrixView<float> out,
                              MatrixView<const float> mask);

// Appends to works the segments of one sequence: `queries` (SequenceQueries)
// against the keys of runs[0, n_runs) (non-empty, in position order), each
// run cut at dims.n_sink_tokens where a window applies, so that a segment is
// all sink tokens or all windowed; at most kMaxKeySegments in all.
void AddSequenceWorks(const AttentionDims& dims, const AttentionWork& queries,
                      const KeyRun* runs, int64_t n_runs,
                      std::vector<AttentionWork>* works);

}  // namespace headway

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_BUILD_H_

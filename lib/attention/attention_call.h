// The call-wide structures of an attention call, filled by the one builder
// (attention_build.cc) after the entry points' argument checks and read by the
// kernels (attention-inl.h), and the plan the kernels keep between calls.
#ifndef HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_
#define HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_

#include <stdint.h>

#include <vector>

#include "headway/kv_cache.h"
#include "lib/core/blocks.h"

namespace headway {

// Key segments: the keys of one sequence that its queries may see, as runs of
// consecutive positions each stored contiguously. A plain cache is one
// segment; a ring cache's held rows are up to three (the pinned sink tokens
// and the ring's two runs around its wrap), and a layer step attends to the
// new tokens' rows from its own scratch as further segments. A segment with
// windowed == false holds sink tokens (AttentionOptions::n_sink_tokens) that
// every query sees whatever the window.
inline constexpr int64_t kMaxKeySegments = 4;

// One key segment of one sequence's part of an Attention call, after argument
// checks: the sequence's queries (shared by its segments) against the keys at
// positions [key_begin, kv_len). A sequence's segments are consecutive works
// with the same q, out and mask; each is planned and run alone, and their
// results are merged by log-sum-exp like the chunks of one segment.
struct AttentionWork {
  const float* q;  // [n_tokens, n_heads * head_dim], row stride q_stride
  int64_t q_stride;
  float* out;  // [n_tokens, n_heads * head_dim], row stride out_stride
  int64_t out_stride;
  // [n_tokens, sequence length], row stride mask_stride, column k for the key
  // at position k; null: none.
  const float* mask;
  int64_t mask_stride;
  int64_t n_tokens;
  int64_t q_pos0;
  int64_t key_begin;   // the segment's first key position
  int64_t kv_len;      // one past its last
  bool windowed;       // false: sink tokens, seen whatever dims.window
  int64_t segment;     // its index in the sequence, [0, n_segments)
  int64_t n_segments;  // the sequence's segments, [1, kMaxKeySegments]
  // The rows of the key at position key_begin, KV head 0, in the stored type
  // (dims.dtype); the key at k is (k - key_begin) * dims.row_stride elements
  // on, head g head_stride * g elements on.
  const void* keys;
  const void* values;  // likewise V
  int64_t head_stride;
  // int8: the scales of K's and V's rows at key_begin, head 0 (the key at k
  // is k - key_begin on, head g scale_head_stride * g on); else null.
  const float* key_scales;
  const float* value_scales;
  int64_t scale_head_stride;
};

// Shape of the call, shared by all sequences.
struct AttentionDims {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t row_stride;  // cache row stride (multiple of 16, rows zero-padded)
  KvDtype dtype;       // the cache's stored type of K and V
  float scale;
  bool causal;
  // The variants (AttentionOptions): 0 or null where unused. alibi_slopes and
  // sink_logits are indexed by the call's query heads [0, n_heads).
  int64_t window;
  int64_t n_sink_tokens;
  float softcap;
  const float* alibi_slopes;
  const float* sink_logits;
  // AttentionCompute::kBFloat16 (a bf16 cache): narrow tiles round q and P to
  // bf16; native_bf16: and multiply with vdpbf16ps (NativeBFloat16Active,
  // asked once per call).
  bool bf16_products;
  bool native_bf16;
  // And prefill's tiles take AMX products (AmxBFloat16Active, asked once per
  // call; AmxProducts says where).
  bool amx_bf16;
  // AttentionCompute::kInt8 (an int8 cache): narrow tiles quantize q to int8
  // and score by ScoreRowsInt8.
  bool int8_products;
};

// How one sequence's work is cut.
struct AttentionSplit {
  bool wide;
  int64_t tile_tokens;  // tokens per query tile
  int64_t n_tiles;
  int64_t group_tiles;  // consecutive tiles of a KV head in one work item
  int64_t n_groups;     // per KV head
  int64_t head_pair;    // KV heads per work item: 2 for one-row narrow tiles
  int64_t key0;         // the first chunk's first key (on the block grid)
  int64_t chunk;        // keys per chunk (multiple of the key block)
  int64_t n_chunks;
  // Whether its tiles' results are partials to merge: the sequence has
  // several segments, or this one several chunks.
  bool merged;
};

// What FusedAttention plans per call, kept by the caller between calls so that
// a call of a size seen before allocates nothing (the vectors keep their
// capacity).
struct AttentionPlan {
  std::vector<AttentionSplit> splits;  // [n_works]
  std::vector<int64_t> first_item;     // [n_works + 1]
  std::vector<int64_t> first_partial;  // [n_works + 1]
  // [n_works + 1]: the merged tiles of a sequence count at its first segment.
  std::vector<int64_t> merge_first;
  // The chunks' partial results: [first_partial[n_works]] blocks of
  // partial_floats = partial_rows * (2 + head_dim) floats (m, l, out).
  ScratchBuffer partials;
  int64_t partial_rows = 0;
  size_t partial_floats = 0;

  // Bytes held.
  size_t Bytes() const {
    return splits.capacity() * sizeof(AttentionSplit) +
           (first_item.capacity() + first_partial.capacity() +
            merge_first.capacity()) *
               sizeof(int64_t) +
           partials.capacity * sizeof(float);
  }
};

}  // namespace headway

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_

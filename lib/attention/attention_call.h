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

// One sequence's part of an Attention call, after argument checks.
struct AttentionWork {
  const float* q;  // [n_tokens, n_heads * head_dim], row stride q_stride
  int64_t q_stride;
  float* out;  // [n_tokens, n_heads * head_dim], row stride out_stride
  int64_t out_stride;
  const float* mask;  // [n_tokens, kv_len], row stride mask_stride; null: none
  int64_t mask_stride;
  int64_t n_tokens;
  int64_t q_pos0;
  int64_t kv_len;  // cached rows to attend to
  // This sequence's K, head 0: [n_kv_heads][capacity][row_stride] elements of
  // the stored type (dims.dtype); head g is g * dims.head_stride elements on.
  const void* keys;
  const void* values;  // likewise V
  // int8: K's row scales, head 0: [n_kv_heads][scale_head_stride] floats
  // (scale of row s of head g at g * dims.scale_head_stride + s); else null.
  const float* key_scales;
  const float* value_scales;  // likewise V's
};

// Shape of the call, shared by all sequences.
struct AttentionDims {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t row_stride;   // cache row stride (multiple of 16, rows zero-padded)
  int64_t head_stride;  // capacity * row_stride: from one KV head's rows to the
                        // next
  KvDtype dtype;        // the cache's stored type of K and V
  int64_t scale_head_stride;  // int8: from one KV head's scales to the next
                              // (capacity); else 0
  float scale;
  bool causal;
  // The variants (AttentionOptions): 0 or null where unused. alibi_slopes and
  // sink_logits are indexed by the call's query heads [0, n_heads).
  int64_t window;
  float softcap;
  const float* alibi_slopes;
  const float* sink_logits;
};

// How one sequence's work is cut.
struct AttentionSplit {
  bool wide;
  int64_t tile_tokens;  // tokens per query tile
  int64_t n_tiles;
  int64_t group_tiles;  // consecutive tiles of a KV head in one work item
  int64_t n_groups;     // per KV head
  int64_t key0;         // the first chunk's first key (on the block grid)
  int64_t chunk;        // keys per chunk (multiple of the key block)
  int64_t n_chunks;
};

// What FusedAttention plans per call, kept by the caller between calls so that
// a call of a size seen before allocates nothing (the vectors keep their
// capacity).
struct AttentionPlan {
  std::vector<AttentionSplit> splits;  // [n_works]
  std::vector<int64_t> first_item;     // [n_works + 1]
  std::vector<int64_t> first_partial;  // [n_works + 1]
  std::vector<int64_t> merge_first;    // [n_works + 1]
  // The chunks' partial results: [first_partial[n_works]] blocks of
  // partial_floats = partial_rows * (2 + head_dim) floats (m, l, out).
  ScratchBuffer partials;
  int64_t partial_rows = 0;
  size_t partial_floats = 0;
};

}  // namespace headway

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_

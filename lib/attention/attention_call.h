// The call-wide structures of an attention call, filled by the entry points
// (attention.cc, layer.cc) after their argument checks and read by the
// kernels (attention-inl.h).
#ifndef HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_
#define HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_

#include <stdint.h>

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
  int64_t kv_len;       // cached rows to attend to
  const float* keys;    // this sequence's K: [n_kv_heads][capacity][row_stride]
  const float* values;  // likewise V
};

// Shape of the call, shared by all sequences.
struct AttentionDims {
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t row_stride;   // cache row stride (multiple of 16, rows zero-padded)
  int64_t head_stride;  // capacity * row_stride: from one KV head's rows to the
                        // next
  float scale;
  bool causal;
};

}  // namespace headway

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_CALL_H_

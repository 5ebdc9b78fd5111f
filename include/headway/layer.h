// AttentionLayer: one MHA / GQA / MQA attention layer, as a host calls it.
//
// Given its weights, a layer turns the hidden states of new tokens into
// outputs while keeping K and V of every token it has seen in a KvCache:
//   Q = x W_Q + b_q, K = x W_K + b_k, V = x W_V + b_v   (one fused GEMM)
//   Q_h, K_g = RoPE(RMSNorm(Q_h)), RoPE(RMSNorm(K_g))   (each optional)
//   o_h = Attention(Q_h, K_g, V_g), g = h / (n_heads / n_kv_heads)
//   y = concat_h(o_h) W_O + b_o
// Prefill (many tokens), chunked prefill and decode (one token per sequence,
// many sequences at once as a server batches them) are the same call:
// Forward. A layer with a sliding window may keep a ring cache of window +
// n_sink_tokens rows (RingCacheConfig): its new tokens' K and V wait in the
// layer's scratch until they have attended to the ring's old rows, so a
// prefill of any length fits the ring. K and V of the new tokens are written
// into the cache rows by the projection, then attention runs for the new tokens
// against everything cached for their sequence. A float32 cache gets them
// straight from the GEMM; a cache of another KvDtype (bf16, f16, int8) through
// a float scratch of a few hundred tokens' heads that stays in L2, bias added,
// then rounded with the cache's own rule (Append's: see kv_cache.h).
//
// Weights: float32 row-major, any strides; copied and packed once by Create
// (the host may free its copies afterwards): W_Q, W_K and W_V as one fused
// [d_model, (n_heads + 2 * n_kv_heads) * head_dim] matrix, W_O on its own,
// each a PackedB stored as config.weight_dtype (float32; bf16, half the bytes;
// int8 with one scale per output feature, a quarter: matmul.h's WeightDtype).
// Forward multiplies them in float32 with float32 accumulation, or with
// config.projection_compute kBFloat16 rounds the projections' inputs (x, and
// the attention output that W_O multiplies) to bf16 (matmul.h's
// MatmulCompute).
// The packing is for the instruction set dispatch picks at Create; Forward
// fails with kFailedPrecondition after SetMaxTarget changes it to one with
// another vector width (create the layer again).
//
// Tensor parallelism: a layer can own query heads [head_begin, head_end) of
// the model's n_heads (with the KV heads they read). Its Forward then returns
// that shard's part of the output projection (b_o is added by the shard with
// head_begin == 0 only): the sum of the shards' outputs is the whole layer's
// output, which a host that splits a model across processes combines with its
// own communication library (MPI all-reduce, say). Each shard keeps a cache
// of its own KV heads.
//
// Threads: Forward parallelises inside (TBB, in the caller's task arena). One
// layer object must not run two Forward calls at once (it reuses its scratch
// memory); separate layers may, also on one cache when their calls' sequences
// are disjoint (a Forward reads and writes only its own sequences' state).
#ifndef HEADWAY_LAYER_H_
#define HEADWAY_LAYER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "headway/attention.h"
#include "headway/export.h"
#include "headway/kv_cache.h"
#include "headway/matmul.h"
#include "headway/rope.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

struct AttentionLayerConfig {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  // KV heads: n_heads for MHA (the default, 0), 1 for MQA, a divisor of
  // n_heads for GQA.
  int64_t n_kv_heads = 0;
  // Elements per head; 0 means d_model / n_heads (which must then divide).
  int64_t head_dim = 0;
  // The mask (causal by default), scale (0: 1 / sqrt(head_dim)) and variants
  // (sliding window, soft-capping, ALiBi, sink logits) of the layer's
  // attention, as Attention takes them; alibi_slopes and sink_logits are the
  // whole model's [n_heads] (Create copies them; a shard reads its heads').
  AttentionOptions attention;
  // The query heads this layer owns, [head_begin, head_end); both 0 means all.
  // Must cover whole KV groups: multiples of n_heads / n_kv_heads.
  int64_t head_begin = 0;
  int64_t head_end = 0;
  // QK-norm (Qwen3, Gemma 3): RMSNorm of every Q and K head after the bias,
  // with the weights' q_norm and k_norm and this eps (norm.h's RmsNormHeads).
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  // RoPE of Q and K after QK-norm (rope.h; rope.rotary_dim == 0: none), at
  // each token's absolute position: its sequence's cache length before the
  // call plus its index among the call's tokens. K is cached rotated.
  RopeConfig rope;
  // How the packed W_QKV and W_O are stored (PackedB's dtype): a decode step
  // reads every weight once, so bf16 halves and int8 quarters its bytes.
  // int8 scales are per column of what a layer packs: a shard's W_O columns
  // are scaled by the max of its own rows, so int8 shards sum to the whole
  // int8 layer within int8's rounding, not bit for bit.
  WeightDtype weight_dtype = WeightDtype::kFloat32;
  // What both projections multiply in (Matmul's compute): kBFloat16 needs
  // weight_dtype kBFloat16 or kInt8.
  MatmulCompute projection_compute = MatmulCompute::kFloat32;
};

// The whole model layer's weights (also for a shard: the layer takes its own
// columns of W_Q, W_K, W_V, biases, and its own rows of W_O). Biases may be
// null (no bias); a non-null bias has the length given.
struct AttentionLayerWeights {
  MatrixView<const float> w_q;  // [d_model, n_heads * head_dim]
  MatrixView<const float> w_k;  // [d_model, n_kv_heads * head_dim]
  MatrixView<const float> w_v;  // [d_model, n_kv_heads * head_dim]
  MatrixView<const float> w_o;  // [n_heads * head_dim, d_model]
  const float* b_q = nullptr;   // [n_heads * head_dim]
  const float* b_k = nullptr;   // [n_kv_heads * head_dim]
  const float* b_v = nullptr;   // [n_kv_heads * head_dim]
  const float* b_o = nullptr;   // [d_model]
  // QK-norm's weights (config.qk_norm), each [head_dim]; ignored without it.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};

// The new tokens of one sequence in a Forward call: n_tokens consecutive rows
// of x (and y), at positions length(seq) .. length(seq) + n_tokens - 1.
struct LayerSequence {
  int64_t seq = 0;  // slot in the cache
  int64_t n_tokens = 0;
};

// ABI: AttentionLayer, like KvCache, keeps its state behind a pointer to an
// Impl, so that it can grow without changing its size or layout for a host
// compiled against an older header.
class HEADWAY_API AttentionLayer {
 public:
  // Validates config and weights, packs the weights into *out (replacing what
  // it held). Errors (*out unchanged): kInvalidArgument for a null out,
  // d_model or n_heads < 1, n_kv_heads < 0 or not dividing n_heads, head_dim
  // < 0 or 0 with d_model not a multiple of n_heads, a head range that is
  // empty, outside [0, n_heads] or not on KV-group boundaries, a scale that is
  // not finite or < 0, a bad mask value, a weight view that is null, has a bad
  // stride or the wrong shape (the message names it and both shapes), a bad
  // config.rope (rope.h's ApplyRope says which), with qk_norm a
  // qk_norm_eps < 0 or not finite, a null or non-finite q_norm or k_norm, a
  // weight_dtype or projection_compute that is not one of its enum's values,
  // projection_compute kBFloat16 with weight_dtype kFloat32, with
  // weight_dtype kInt8 a NaN or inf in the weights this layer packs (the
  // message names the weight and element: int8 cannot store it);
  // kResourceExhausted: sizes whose byte count overflows, or no memory.
  // Cost: PackedB's packing of this layer's part of the weights, plus for
  // int8 one read of it (the finite check).
  static Status Create(const AttentionLayerConfig& config,
                       const AttentionLayerWeights& weights,
                       AttentionLayer* out);

  AttentionLayer();  // empty: Forward fails
  ~AttentionLayer();
  AttentionLayer(AttentionLayer&& other) noexcept;
  AttentionLayer& operator=(AttentionLayer&& other) noexcept;
  AttentionLayer(const AttentionLayer&) = delete;
  AttentionLayer& operator=(const AttentionLayer&) = delete;

  // The config with its defaults resolved (n_kv_heads, head_dim,
  // attention.scale, head_end filled in); all zeros (and mask kNone) for an
  // empty layer.
  const AttentionLayerConfig& config() const;
  // QK-norm's weights, [head_dim] each: the layer's copies of
  // weights.q_norm and k_norm, valid while the layer lives; null without
  // config.qk_norm (and for an empty layer).
  const float* q_norm() const;
  const float* k_norm() const;
  // Query and KV heads this layer owns.
  int64_t local_heads() const;
  int64_t local_kv_heads() const;
  // Parameters of this layer (its shard): weights plus biases given (and
  // QK-norm's weights, and the sink logits of its heads); b_o and the QK-norm
  // weights count in the shard with head_begin == 0, so the shards' counts
  // sum to the whole layer's. For the
  // whole MHA layer without bias, 4 * d_model^2 when head_dim * n_heads ==
  // d_model (the seed's count); less for GQA and MQA.
  int64_t n_weights() const;
  // Bytes the packed weights (the fused QKV and W_O matrices) occupy as
  // stored: the sum of their PackedB::bytes(), panel padding and int8 scales
  // included (about 4, 2 or 1 bytes per weight of this shard).
  size_t packed_bytes() const;
  // Bytes of the scratch that this layer's Forward keeps for its next call
  // (grown to the largest call so far: Q, the attention output, stored K/V
  // rows, the attention plan, a ring cache's new rows); 0 for an empty layer.
  // The per-thread tiles that all layers share are the calling thread's
  // (ReleaseThreadScratch, threads.h).
  size_t scratch_bytes() const;
  // Frees that scratch (after a long prefill, say) and returns its bytes; the
  // next Forward allocates again. Not while a Forward of this layer runs.
  size_t ReleaseScratch();
  // A cache config for this layer: its local KV heads and head_dim, K and V
  // stored as dtype.
  KvCacheConfig CacheConfig(int64_t n_sequences, int64_t capacity,
                            KvDtype dtype = KvDtype::kFloat32) const;
  // A ring cache config for a layer with a sliding window W (kv_cache.h's
  // Ring mode): W + n_sink_tokens rows per sequence, whatever its length, with
  // config.attention's n_sink_tokens pinned. Without a window, capacity 0,
  // and past int64_t the largest int64_t (KvCache::Create rejects both).
  KvCacheConfig RingCacheConfig(int64_t n_sequences,
                                KvDtype dtype = KvDtype::kFloat32) const;
  // KV cache bytes per token of one sequence, stored as dtype (scales
  // included): KvCache::BytesPerToken of CacheConfig; 0 for an empty layer or
  // an unknown dtype.
  size_t cache_bytes_per_token(KvDtype dtype = KvDtype::kFloat32) const;

  // Runs the layer over new tokens of one or several sequences, with a cache
  // of any KvDtype (CacheConfig's dtype):
  //   x: [sum of n_tokens, d_model], the new tokens' hidden states, rows of
  //      sequences[0] first, then sequences[1], ...
  //   y: [sum of n_tokens, d_model], written (this shard's part, see above).
  // Appends the tokens' K and V to their sequences in *cache (lengths grow by
  // n_tokens), then each new token attends to its sequence's cached tokens up
  // to its own position (causal) or to all of them (kNone). Scratch memory is
  // kept and reused: after a first call of a given size, calls of that size or
  // smaller from the same thread allocate nothing, whichever of TBB's threads
  // run their parts (TBB itself allocates when it creates a worker thread, the
  // first time work needs it, and on every call where it runs without its
  // allocator, libtbbmalloc).
  // Errors (nothing written, *cache unchanged): kFailedPrecondition for an
  // empty layer or a dispatch target of another vector width than at Create;
  // kInvalidArgument for a null cache or sequences, n_sequences < 1, a cache
  // whose n_kv_heads or head_dim differ from CacheConfig's, a bad seq, a seq
  // listed twice, n_tokens < 1, x or y a bad view or not [sum of n_tokens,
  // d_model], y overlapping x, x or y overlapping the cache, a ring cache with
  // a layer whose window is 0 or more than its capacity - n_sink_tokens, or
  // whose n_sink_tokens differ, a cache not in bfloat16 with
  // config.attention.compute kBFloat16; kOutOfRange when a sequence's length +
  // n_tokens exceeds the capacity of a plain cache;
  // kResourceExhausted: x or y whose byte span overflows, or no memory for
  // scratch.
  Status Forward(KvCache* cache, const LayerSequence* sequences,
                 int64_t n_sequences, MatrixView<const float> x,
                 MatrixView<float> y);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace headway

#endif  // HEADWAY_LAYER_H_

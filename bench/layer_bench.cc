// headway::AttentionLayer per target and thread count: one decode step at a
// context of 4096 tokens and a causal prefill of 512 tokens, for a d_model 4096
// layer with 32 query heads of head_dim 128 as MHA, GQA-8 and MQA, its cache
// in float32 and, for MHA decode on the key targets, in bfloat16, float16 and
// int8 (argument dtype: the KvDtype value; the weights float32); with the
// weights stored as bf16 or int8 or multiplied in bf16 (layer_weights_decode,
// layer_weights_prefill, argument weights: LayerWeights); the
// same with QK-norm and Llama 3.1's RoPE fused (layer_*_qknorm_rope); and the
// "seed" peer, the same layer computed the way the seed's numpy code does it,
// composed from Headway's public kernels.
//
// Counted work (docs/BENCHMARKS.md), for n new tokens after L cached ones:
// - flops: the projections, 2 * n * d_model * (n_heads + 2 * n_kv_heads) *
//   head_dim (Q, K, V) + 2 * n * n_heads * head_dim * d_model (output), plus
//   the unmasked attention, 4 * head_dim * n_heads per visible (query, key)
//   pair: n * (L + 1) for a decode step, n * n / 2 for a prefill;
// - bytes: the packed weights (packed_bytes(): about 256 MiB for MHA, 160 MiB
//   for GQA-8, 132 MiB for MQA, all far larger than the 32 MiB L3, so every
//   call reads them from memory), the L cached tokens read and the n new ones
//   written as stored (KvCache::bytes_per_token() each: at L = 4096 and
//   float32, 128 MiB for MHA, 32 MiB for GQA-8, 4 MiB for MQA; MHA in
//   bfloat16 64 MiB), x read and y written.
// Each row reports the percentage of the ceiling that bounds it at that
// arithmetic intensity: decode the DRAM read bandwidth ("%read"), prefill the
// FMA peak ("%FMA"). The decode cache is filled once and truncated back to
// 4096 tokens after each step; the prefill cache is emptied before each
// iteration. Both also count "tokens" per second. The seed rows count the same
// work as the layer's, so their percentages compare directly.
//
// The seed peer (layer_seed_decode, layer_seed_prefill), step by step as the
// seed's numpy code: Q, K and V as three separate GEMMs on the unpacked
// weights (Matmul packs B in every call, as the BLAS behind numpy's matmul
// does), K and V copied into the cache (KvCache::Append: the seed's
// concatenate), per-head materialized scores, softmax and weighted sum
// (AttentionWithWeights: the seed's einsum steps on Headway's GEMM and
// softmax), then the output projection. It uses Headway's Matmul, not
// OpenBLAS, so the gap to the layer is what the layer's fusion, pre-packed
// weights and flash attention gain, not a difference of GEMM kernels. The
// seed peers of the BLAS libraries that bench/ has (bench/harness/peers.h:
// layer_seed_openblas_decode, layer_seed_onednn_prefill, ...) run the same
// composition with its four projections on that library's sgemm, as numpy's
// matmul would call it; their attention steps stay Headway's. Where
// bench/meson.build found ggml, layer_decode_ggml and layer_weights_decode_ggml
// run the decode step as llama.cpp's graph does (BM_LayerDecodeGgml).
//
// Memory: one set of MHA-sized host weights (256 MiB) for the whole run, whose
// first columns of W_K and W_V serve GQA-8 and MQA; the current target's
// packed layers, one per layout and variant (up to 1.1 GiB); the decode caches
// (164 MiB in all) and prefill caches.
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/harness/ggml_peers.h"
#include "bench/harness/harness.h"
#include "bench/harness/peers.h"
#include "benchmark/benchmark.h"
#include "headway/attention.h"
#include "headway/kv_cache.h"
#include "headway/layer.h"
#include "headway/matmul.h"
#include "headway/rope.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/view.h"

namespace headway {
namespace bench {
namespace {

constexpr int64_t kDModel = 4096, kHeads = 32, kHeadDim = 128;
constexpr int64_t kQCols = kHeads * kHeadDim;
constexpr int64_t kContext = 4096, kPrefillLen = 512;

// The host's weights, float32 row-major, sized for MHA: W_Q, W_K, W_V [d_model,
// n_heads * head_dim] and W_O [n_heads * head_dim, d_model]. A layout with
// fewer KV heads takes the first n_kv_heads * head_dim columns of W_K and W_V.
struct HostWeights {
  BufferPtr<float> w_q, w_k, w_v, w_o;

  MatrixView<const float> Q() const {
    return MatrixView<const float>(w_q.get(), kDModel, kQCols);
  }
  MatrixView<const float> K(int64_t n_kv) const {
    return MatrixView<const float>(w_k.get(), kDModel, n_kv * kHeadDim, kQCols);
  }
  MatrixView<const float> V(int64_t n_kv) const {
    return MatrixView<const float>(w_v.get(), kDModel, n_kv * kHeadDim, kQCols);
  }
  MatrixView<const float> O() const {
    return MatrixView<const float>(w_o.get(), kQCols, kDModel);
  }
};

const HostWeights& SharedHostWeights() {
  static const HostWeights weights = [] {
    HostWeights w;
    const size_t size = static_cast<size_t>(kDModel * kQCols);
    // Standard deviation 1 / sqrt(fan-in) (both fan-ins are 4096), about as
    // in a trained layer: uniform in +-sqrt(3) / 64.
    const float bound = 0.027f;
    w.w_q = AllocateBuffer<float>(size);
    w.w_k = AllocateBuffer<float>(size);
    w.w_v = AllocateBuffer<float>(size);
    w.w_o = AllocateBuffer<float>(size);
    FillUniform(w.w_q.get(), size, -bound, bound, 11);
    FillUniform(w.w_k.get(), size, -bound, bound, 12);
    FillUniform(w.w_v.get(), size, -bound, bound, 13);
    FillUniform(w.w_o.get(), size, -bound, bound, 14);
    return w;
  }();
  return weights;
}

// The layers of the current target, one per (n_kv, variants), kept while
// benchmarks run on that target (up to 1.1 GiB: MHA's packed weights are 256
// MiB), so that interleaved repetitions of the plain and the variant rows
// find their layers packed and their pages warm; a new target drops them.
struct LayerSlots {
  int64_t target_bits = 0;
  std::map<std::tuple<int64_t, bool, int64_t>, std::unique_ptr<AttentionLayer>>
      layers;
};
LayerSlots& SharedLayerSlots() {
  static LayerSlots slots;
  return slots;
}

// QK-norm's weights (Qwen3's are near 1): uniform in [0.5, 1.5].
const std::vector<float>& NormWeights() {
  static const std::vector<float> weights = [] {
    std::vector<float> w(kHeadDim);
    FillUniform(w.data(), w.size(), 0.5f, 1.5f, 15);
    return w;
  }();
  return weights;
}

// How a layer stores and multiplies its weights: the "weights" argument of the
// layer_weights_* rows.
enum LayerWeights : int64_t {
  kWeightsF32 = 0,             // float32 weights (every other row)
  kWeightsBF16 = 1,            // bf16 weights, float32 compute
  kWeightsInt8 = 2,            // int8 weights, float32 compute
  kWeightsBF16Compute = 3,     // bf16 weights in MatmulCompute::kBFloat16
  kWeightsInt8BF16Compute = 4  // int8 weights in MatmulCompute::kBFloat16
};

// The layer with n_kv KV heads, packed for `target` (the harness has capped
// dispatch at it); with `variants`, QK-norm and Llama 3.1's RoPE (theta
// 500000, factor 8, original context 8192) as a Qwen3- or Llama-3-shaped
// layer runs them; its weights as `weights` says. Null after skipping the
// benchmark if Create fails.
AttentionLayer* SharedLayer(benchmark::State& state, int64_t n_kv,
                            const Target& target, bool variants = false,
                            int64_t weights_kind = kWeightsF32) {
  LayerSlots& slots = SharedLayerSlots();
  if (slots.target_bits != target.bits) {
    slots.layers.clear();  // frees them before packing for another target
    slots.target_bits = target.bits;
  }
  std::unique_ptr<AttentionLayer>& slot =
      slots.layers[{n_kv, variants, weights_kind}];
  if (slot) return slot.get();
  const HostWeights& host = SharedHostWeights();
  AttentionLayerConfig config;
  config.d_model = kDModel;
  config.n_heads = kHeads;
  config.n_kv_heads = n_kv;
  config.head_dim = kHeadDim;
  if (weights_kind == kWeightsInt8 || weights_kind == kWeightsInt8BF16Compute) {
    config.weight_dtype = WeightDtype::kInt8;
  } else if (weights_kind != kWeightsF32) {
    config.weight_dtype = WeightDtype::kBFloat16;
  }
  if (weights_kind == kWeightsBF16Compute ||
      weights_kind == kWeightsInt8BF16Compute) {
    config.projection_compute = MatmulCompute::kBFloat16;
  }
  AttentionLayerWeights weights;
  weights.w_q = host.Q();
  weights.w_k = host.K(n_kv);
  weights.w_v = host.V(n_kv);
  weights.w_o = host.O();
  if (variants) {
    config.qk_norm = true;
    weights.q_norm = weights.k_norm = NormWeights().data();
    config.rope.rotary_dim = kHeadDim;
    config.rope.theta = 500000.0;
    config.rope.scaling = RopeScaling::kLlama3;
    config.rope.factor = 8.0;
  }
  auto layer = std::make_unique<AttentionLayer>();
  if (!Check(state, AttentionLayer::Create(config, weights, layer.get()))) {
    return nullptr;
  }
  slot = std::move(layer);
  return slot.get();
}

// Frees the shared layers (the seed benchmarks do not use them).
void DropSharedLayer() { SharedLayerSlots().layers.clear(); }

// One cache per (n_kv_heads, capacity, dtype) for the whole run, holding
// `filled` random tokens when handed out (decode: kContext of kContext + 1;
// prefill: none); null after skipping the benchmark if it cannot be made.
KvCache* SharedCache(benchmark::State& state, int64_t n_kv, int64_t capacity,
                     int64_t filled, KvDtype dtype) {
  static std::map<std::tuple<int64_t, int64_t, KvDtype>,
                  std::unique_ptr<KvCache>>
      caches;
  std::unique_ptr<KvCache>& cache = caches[{n_kv, capacity, dtype}];
  if (!cache) {
    auto made = std::make_unique<KvCache>();
    KvCacheConfig config{1, n_kv, kHeadDim, capacity};
    config.dtype = dtype;
    if (!Check(state, KvCache::Create(config, made.get()))) return nullptr;
    cache = std::move(made);
    const int64_t width = n_kv * kHeadDim, step = 256;
    auto k = AllocateBuffer<float>(static_cast<size_t>(step * width));
    auto v = AllocateBuffer<float>(static_cast<size_t>(step * width));
    for (int64_t t = 0; t < filled; t += step) {
      const int64_t rows = std::min(step, filled - t);
      FillUniform(k.get(), static_cast<size_t>(rows * width), -1.0f, 1.0f,
                  2 * t + 1);
      FillUniform(v.get(), static_cast<size_t>(rows * width), -1.0f, 1.0f,
                  2 * t + 2);
      if (!cache
               ->Append(0, MatrixView<const float>(k.get(), rows, width),
                        MatrixView<const float>(v.get(), rows, width))
               .ok()) {
        std::abort();
      }
    }
  }
  // A benchmark that stopped on an error may have left other lengths.
  if (!cache->Truncate(0, filled).ok()) std::abort();
  return cache.get();
}

KvCache* DecodeCache(benchmark::State& state, int64_t n_kv,
                     KvDtype dtype = KvDtype::kFloat32) {
  return SharedCache(state, n_kv, kContext + 1, kContext, dtype);
}
KvCache* PrefillCache(benchmark::State& state, int64_t n_kv,
                      KvDtype dtype = KvDtype::kFloat32) {
  return SharedCache(state, n_kv, kPrefillLen, 0, dtype);
}

// x and y [n_tokens, d_model], written once before timing (a first touch costs
// a page fault per 4 KiB).
struct Activations {
  BufferPtr<float> x, y;
  int64_t n_tokens = 0;

  explicit Activations(int64_t n) : n_tokens(n) {
    const size_t size = static_cast<size_t>(n * kDModel);
    x = AllocateBuffer<float>(size);
    y = AllocateBuffer<float>(size);
    FillUniform(x.get(), size, -1.0f, 1.0f, 7);
    FillUniform(y.get(), size, -1.0f, 1.0f, 8);
  }
  MatrixView<const float> X() const {
    return MatrixView<const float>(x.get(), n_tokens, kDModel);
  }
  MatrixView<float> Y() const {
    return MatrixView<float>(y.get(), n_tokens, kDModel);
  }
};

// Counter "tokens": tokens per second.
void ReportTokens(benchmark::State& state, int64_t tokens_per_iter) {
  state.counters["tokens"] =
      benchmark::Counter(static_cast<double>(tokens_per_iter) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

// The counters of n new tokens after `cached` ones, with `weight_bytes` of
// weights and `token_bytes` of KV cache per token.
void Report(benchmark::State& state, const RunConfig& run, int64_t n_kv,
            int64_t n, int64_t cached, double weight_bytes,
            double token_bytes) {
  const double tokens = static_cast<double>(n);
  const double projections =
      2.0 * tokens * kDModel * (kHeads + 2 * n_kv) * kHeadDim +
      2.0 * tokens * kHeads * kHeadDim * kDModel;
  // Visible (query, key) pairs: each new token sees the cached ones and the
  // new ones up to itself (n * n / 2 for a prefill, as counted elsewhere).
  const double pairs =
      cached > 0 ? tokens * static_cast<double>(cached + 1) : tokens * n / 2;
  const double flops = projections + 4.0 * kHeadDim * kHeads * pairs;
  const double bytes = weight_bytes +
                       token_bytes * static_cast<double>(cached + n) +
                       2.0 * sizeof(float) * tokens * kDModel;
  ReportRoofline(state, flops, bytes, MemoryCeiling::kRead, run.target,
                 run.threads);
  ReportTokens(state, n);
}

// The host's weights in bytes (unpacked: as many as the layer packs).
double HostWeightBytes(int64_t n_kv) {
  return 4.0 * (kDModel * (kHeads + 2 * n_kv) * kHeadDim + kQCols * kDModel);
}

// -----------------------------------------------------------------------------
// The layer.

// variants: QK-norm and RoPE fused (SharedLayer).
// weights_arg: the index of the "weights" argument (LayerWeights), or -1 for
// float32 weights.
void BM_LayerDecode(benchmark::State& state, const RunConfig& run,
                    bool variants, int weights_arg) {
  const int64_t n_kv = state.range(0);
  const KvDtype dtype = static_cast<KvDtype>(state.range(1));
  AttentionLayer* layer =
      SharedLayer(state, n_kv, run.target, variants,
                  weights_arg < 0 ? kWeightsF32 : state.range(weights_arg));
  if (layer == nullptr) return;
  KvCache* cache = DecodeCache(state, n_kv, dtype);
  if (cache == nullptr) return;
  const Activations io(1);
  const LayerSequence sequence{/*seq=*/0, /*n_tokens=*/1};
  const auto step = [&] {
    Status status = layer->Forward(cache, &sequence, 1, io.X(), io.Y());
    if (status.ok()) status = cache->Truncate(0, kContext);
    return status;
  };
  if (!TimeSteps(state, step)) return;
  // The cache's bytes as stored.
  Report(state, run, n_kv, 1, kContext,
         static_cast<double>(layer->packed_bytes()),
         static_cast<double>(cache->bytes_per_token()));
}

// dtype_arg: the index of the "dtype" argument (the cache's KvDtype), or -1
// for a float32 cache.
void LayerPrefill(benchmark::State& state, const RunConfig& run, bool variants,
                  int weights_arg, int dtype_arg) {
  const int64_t n_kv = state.range(0);
  AttentionLayer* layer =
      SharedLayer(state, n_kv, run.target, variants,
                  weights_arg < 0 ? kWeightsF32 : state.range(weights_arg));
  if (layer == nullptr) return;
  KvCache* cache = PrefillCache(
      state, n_kv,
      dtype_arg < 0 ? KvDtype::kFloat32
                    : static_cast<KvDtype>(state.range(dtype_arg)));
  if (cache == nullptr) return;
  const Activations io(kPrefillLen);
  const LayerSequence sequence{/*seq=*/0, /*n_tokens=*/kPrefillLen};
  const auto step = [&] {
    Status status = cache->Reset(0);
    if (status.ok()) {
      status = layer->Forward(cache, &sequence, 1, io.X(), io.Y());
    }
    return status;
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, n_kv, kPrefillLen, 0,
         static_cast<double>(layer->packed_bytes()),
         static_cast<double>(layer->cache_bytes_per_token()));
}

void BM_LayerPrefill(benchmark::State& state, const RunConfig& run,
                     bool variants, int weights_arg) {
  LayerPrefill(state, run, variants, weights_arg, /*dtype_arg=*/-1);
}

// -----------------------------------------------------------------------------
// The seed peer.

// The seed's intermediates for n_tokens new tokens attending to up to `length`
// cached ones.
struct SeedBuffers {
  BufferPtr<float> q, k, v, attn, weights;
  int64_t n_tokens, n_kv, length;

  SeedBuffers(int64_t n, int64_t kv, int64_t len)
      : n_tokens(n), n_kv(kv), length(len) {
    const size_t q_size = static_cast<size_t>(n * kQCols);
    const size_t kv_size = static_cast<size_t>(n * kv * kHeadDim);
    const size_t weights_size = static_cast<size_t>(kHeads * n * len);
    q = AllocateBuffer<float>(q_size);
    k = AllocateBuffer<float>(kv_size);
    v = AllocateBuffer<float>(kv_size);
    attn = AllocateBuffer<float>(q_size);
    weights = AllocateBuffer<float>(weights_size);
    FillUniform(q.get(), q_size, -1.0f, 1.0f, 21);
    FillUniform(k.get(), kv_size, -1.0f, 1.0f, 22);
    FillUniform(v.get(), kv_size, -1.0f, 1.0f, 23);
    FillUniform(attn.get(), q_size, -1.0f, 1.0f, 24);
    FillUniform(weights.get(), weights_size, 0.0f, 1.0f, 25);
  }
};

// c = a b with Headway's Matmul, or with the peer's sgemm on `threads`
// threads.
Status Project(const PeerGemm* peer, int threads, MatrixView<const float> a,
               MatrixView<const float> b, MatrixView<float> c) {
  if (peer == nullptr) return Matmul(a, Transpose::kNo, b, Transpose::kNo, c);
  peer->sgemm(threads, /*trans_b=*/false, c.rows, c.cols, a.cols, 1.0f, a.data,
              a.stride, b.data, b.stride, 0.0f, c.data, c.stride);
  return Status::Ok();
}

// The layer as the seed computes it, appending the tokens' K and V to
// sequence 0 of *cache; the projections on Headway's Matmul, or on the peer's
// sgemm.
Status SeedForward(const HostWeights& w, KvCache* cache, const Activations& io,
                   SeedBuffers& b, const PeerGemm* peer, int threads) {
  const int64_t n = b.n_tokens, kv_cols = b.n_kv * kHeadDim;
  const MatrixView<float> q(b.q.get(), n, kQCols);
  const MatrixView<float> k(b.k.get(), n, kv_cols);
  const MatrixView<float> v(b.v.get(), n, kv_cols);
  const MatrixView<float> attn(b.attn.get(), n, kQCols);
  Status status = Project(peer, threads, io.X(), w.Q(), q);
  if (!status.ok()) return status;
  status = Project(peer, threads, io.X(), w.K(b.n_kv), k);
  if (!status.ok()) return status;
  status = Project(peer, threads, io.X(), w.V(b.n_kv), v);
  if (!status.ok()) return status;
  status = cache->Append(0, k, v);
  if (!status.ok()) return status;
  const int64_t length = cache->length(0);
  AttentionQuery query;
  query.q_pos0 = length - n;
  query.q = q;
  query.out = attn;
  status = AttentionWithWeights(
      *cache, kHeads, query,
      MatrixView<float>(b.weights.get(), kHeads * n, length));
  if (!status.ok()) return status;
  return Project(peer, threads, attn, w.O(), io.Y());
}

void BM_SeedDecode(benchmark::State& state, const RunConfig& run,
                   const PeerGemm* peer) {
  const int64_t n_kv = state.range(0);
  DropSharedLayer();
  const HostWeights& host = SharedHostWeights();
  KvCache* cache = DecodeCache(state, n_kv);
  if (cache == nullptr) return;
  const Activations io(1);
  SeedBuffers buffers(1, n_kv, kContext + 1);
  const auto step = [&] {
    Status status = SeedForward(host, cache, io, buffers, peer, run.threads);
    if (status.ok()) status = cache->Truncate(0, kContext);
    return status;
  };
  if (!TimeSteps(state, step)) return;
  // The same work as the layer's.
  Report(state, run, n_kv, 1, kContext, HostWeightBytes(n_kv),
         static_cast<double>(cache->bytes_per_token()));
}

void BM_SeedPrefill(benchmark::State& state, const RunConfig& run,
                    const PeerGemm* peer) {
  const int64_t n_kv = state.range(0);
  DropSharedLayer();
  const HostWeights& host = SharedHostWeights();
  KvCache* cache = PrefillCache(state, n_kv);
  if (cache == nullptr) return;
  const Activations io(kPrefillLen);
  SeedBuffers buffers(kPrefillLen, n_kv, kPrefillLen);
  const auto step = [&] {
    Status status = cache->Reset(0);
    if (status.ok())
      status = SeedForward(host, cache, io, buffers, peer, run.threads);
    return status;
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, n_kv, kPrefillLen, 0, HostWeightBytes(n_kv),
         static_cast<double>(cache->bytes_per_token()));
}

#ifdef HEADWAY_BENCH_GGML
// -----------------------------------------------------------------------------
// llama.cpp's layer (ggml), the peer of layer_decode and layer_weights_decode.
//
// layer_decode_ggml/<fa or mul_mat>/kv_heads:G/dtype:N/threads:T and
// layer_weights_decode_ggml/.../weights:W/threads:T: one decode step of the
// same layer as llama.cpp's graph computes it: Q, K and V by ggml_mul_mat on
// the host's weights stored as f32, bf16 (W 1) or q8_0 (W 2: llama.cpp's
// int8 weights), K and V copied into a cache of 4097 rows in llama.cpp's
// layout (ggml_cpy: f32, bf16, f16 or q8_0 for dtype 3) at row 4096, the
// attention over the 4097 rows as attention_decode_ggml's rows do it (fa:
// ggml_flash_attn_ext; mul_mat: K Q^T, softmax and V stored transposed, not
// on q8_0), and the output projection. Every step writes the same row, as
// Headway's rows truncate the cache back to 4096. The weights' and the
// cache's bytes are counted as ggml stores them.
// The layer's weights in one type, or its cache of 4097 rows in one type
// (v: [G * d][kContext + 1] for mul_mat), in a context of their own.
struct GgmlTensors {
  ggml_context* ctx = nullptr;
  ggml_tensor *w_q = nullptr, *w_k = nullptr, *w_v = nullptr, *w_o = nullptr;
  ggml_tensor *k = nullptr, *v = nullptr;
  double bytes = 0.0;  // the weights' as stored
  ~GgmlTensors() {
    if (ctx != nullptr) ggml_free(ctx);
  }
};

// A weight [rows, cols] (row-major, stride ld) as ggml's [cols] rows of
// `rows` in `type`.
ggml_tensor* GgmlWeight(ggml_context* ctx, ggml_type type, const float* w,
                        int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> transposed(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) transposed[j * rows + i] = w[i * ld + j];
  }
  ggml_tensor* tensor = ggml_new_tensor_2d(ctx, type, rows, cols);
  ggml_quantize_chunk(type, transposed.data(), tensor->data, 0, cols, rows,
                      nullptr);
  return tensor;
}

// The host's weights for G KV heads stored as `type`, made once per run (all
// of them: 730 MiB).
const GgmlTensors& SharedGgmlWeights(int64_t n_kv, ggml_type type) {
  static std::map<std::pair<int64_t, ggml_type>, GgmlTensors> all;
  GgmlTensors& weights = all[{n_kv, type}];
  if (weights.ctx != nullptr) return weights;
  const int64_t kv_cols = n_kv * kHeadDim;
  weights.bytes = static_cast<double>(ggml_row_size(type, kDModel) *
                                          (kQCols + 2 * kv_cols) +
                                      ggml_row_size(type, kQCols) * kDModel);
  weights.ctx = ggml_init(
      {static_cast<size_t>(weights.bytes) + 8 * ggml_tensor_overhead() + 4096,
       nullptr, false});
  const HostWeights& host = SharedHostWeights();
  weights.w_q =
      GgmlWeight(weights.ctx, type, host.w_q.get(), kDModel, kQCols, kQCols);
  weights.w_k =
      GgmlWeight(weights.ctx, type, host.w_k.get(), kDModel, kv_cols, kQCols);
  weights.w_v =
      GgmlWeight(weights.ctx, type, host.w_v.get(), kDModel, kv_cols, kQCols);
  weights.w_o =
      GgmlWeight(weights.ctx, type, host.w_o.get(), kQCols, kDModel, kDModel);
  return weights;
}

// A cache of 4097 random rows for G KV heads stored as `type`, laid out for
// fa or mul_mat, made once per run.
const GgmlTensors& SharedGgmlCache(int64_t n_kv, ggml_type type, bool flash) {
  static std::map<std::tuple<int64_t, ggml_type, bool>, GgmlTensors> all;
  GgmlTensors& cache = all[{n_kv, type, flash}];
  if (cache.ctx != nullptr) return cache;
  const int64_t kv_cols = n_kv * kHeadDim, rows = kContext + 1;
  cache.ctx = ggml_init({2 * ggml_row_size(type, kv_cols) * rows +
                             4 * ggml_tensor_overhead() + 4096,
                         nullptr, false});
  cache.k = ggml_new_tensor_2d(cache.ctx, type, kv_cols, rows);
  cache.v = flash ? ggml_new_tensor_2d(cache.ctx, type, kv_cols, rows)
                  : ggml_new_tensor_2d(cache.ctx, type, rows, kv_cols);
  // Random rows, as DecodeCache's (the values do not change the work).
  std::vector<float> values(static_cast<size_t>(kv_cols * rows));
  FillUniform(values.data(), values.size(), -1.0f, 1.0f, 21);
  ggml_quantize_chunk(type, values.data(), cache.k->data, 0, rows, kv_cols,
                      nullptr);
  FillUniform(values.data(), values.size(), -1.0f, 1.0f, 22);
  ggml_quantize_chunk(type, values.data(), cache.v->data, 0,
                      flash ? rows : kv_cols, flash ? kv_cols : rows, nullptr);
  return cache;
}

// weights_arg: the index of the "weights" argument (LayerWeights: 1 bf16, 2
// int8), or -1 for float32 weights; the thread count is the last argument.
void BM_LayerDecodeGgml(benchmark::State& state, bool flash, int weights_arg) {
  const int64_t n_kv = state.range(0);
  const KvDtype dtype = static_cast<KvDtype>(state.range(1));
  const int64_t weights = weights_arg < 0 ? kWeightsF32 : state.range(2);
  const int threads = static_cast<int>(state.range(weights_arg < 0 ? 2 : 3));
  const ggml_type cache_type = GgmlCacheType(dtype);
  const ggml_type weight_type = weights == kWeightsBF16   ? GGML_TYPE_BF16
                                : weights == kWeightsInt8 ? GGML_TYPE_Q8_0
                                                          : GGML_TYPE_F32;
  const GgmlTensors& layer = SharedGgmlWeights(n_kv, weight_type);
  const GgmlTensors& cache = SharedGgmlCache(n_kv, cache_type, flash);
  const int64_t kv_cols = n_kv * kHeadDim, rows = kContext + 1;
  const size_t row_bytes = ggml_row_size(cache_type, kv_cols);
  const Activations io(1);
  ggml_context* ctx = ggml_init(
      {ggml_graph_overhead() + 64 * ggml_tensor_overhead() + (4u << 20),
       nullptr, false});
  ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kDModel, 1);
  std::copy(io.x.get(), io.x.get() + kDModel, static_cast<float*>(x->data));
  ggml_tensor* q =
      ggml_permute(ctx,
                   ggml_reshape_3d(ctx, ggml_mul_mat(ctx, layer.w_q, x),
                                   kHeadDim, kHeads, 1),
                   0, 2, 1, 3);  // [d, 1, H]
  // K and V into row kContext of the cache.
  ggml_tensor* store_k =
      ggml_cpy(ctx, ggml_mul_mat(ctx, layer.w_k, x),
               ggml_view_1d(ctx, cache.k, kv_cols, kContext * row_bytes));
  ggml_tensor* v_new = ggml_mul_mat(ctx, layer.w_v, x);
  ggml_tensor* store_v =
      flash
          ? ggml_cpy(ctx, v_new,
                     ggml_view_1d(ctx, cache.v, kv_cols, kContext * row_bytes))
          : ggml_cpy(ctx, ggml_reshape_2d(ctx, v_new, 1, kv_cols),
                     ggml_view_2d(ctx, cache.v, 1, kv_cols, cache.v->nb[1],
                                  ggml_row_size(cache_type, kContext)));
  // [d, rows, G] over the cache, as llama.cpp views it.
  ggml_tensor* k = ggml_permute(
      ctx,
      ggml_view_3d(ctx, cache.k, kHeadDim, n_kv, rows,
                   ggml_row_size(cache_type, kHeadDim), row_bytes, 0),
      0, 2, 1, 3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  ggml_tensor* attention;  // [d * H, 1]
  if (flash) {
    ggml_tensor* v = ggml_permute(
        ctx,
        ggml_view_3d(ctx, cache.v, kHeadDim, n_kv, rows,
                     ggml_row_size(cache_type, kHeadDim), row_bytes, 0),
        0, 2, 1, 3);
    ggml_tensor* out =
        ggml_flash_attn_ext(ctx, q, k, v, nullptr, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    attention = ggml_reshape_2d(ctx, out, kQCols, 1);
  } else {
    ggml_tensor* v_trans =
        ggml_view_3d(ctx, cache.v, rows, kHeadDim, n_kv, cache.v->nb[1],
                     cache.v->nb[1] * kHeadDim, 0);
    ggml_tensor* scores = ggml_mul_mat(ctx, k, q);  // [rows, 1, H]
    ggml_mul_mat_set_prec(scores, GGML_PREC_F32);
    ggml_tensor* out = ggml_mul_mat(
        ctx, v_trans, ggml_soft_max_ext(ctx, scores, nullptr, scale, 0.0f));
    attention = ggml_reshape_2d(
        ctx, ggml_cont(ctx, ggml_permute(ctx, out, 0, 2, 1, 3)), kQCols, 1);
  }
  ggml_tensor* y = ggml_mul_mat(ctx, layer.w_o, attention);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, store_k);
  ggml_build_forward_expand(graph, store_v);
  ggml_build_forward_expand(graph, y);
  const bool ok = TimeGgmlGraphs(state, {graph}, threads);
  ggml_free(ctx);
  if (!ok) return;
  Report(state, RunConfig{SupportedTargets().front(), threads}, n_kv, 1,
         kContext, layer.bytes, 2.0 * static_cast<double>(row_bytes));
}

// The peers of layer_decode's MHA and GQA-8 rows and of layer_weights_decode's
// bf16 and int8 weights (not bf16 compute: ggml's bf16 rows are that), on
// every thread count; mul_mat not on q8_0 caches.
void RegisterGgml() {
  const int64_t kI8 = static_cast<int64_t>(KvDtype::kInt8);
  for (const bool flash : {true, false}) {
    const std::string kernel = flash ? "/fa" : "/mul_mat";
    benchmark::internal::Benchmark* plain =
        benchmark::RegisterBenchmark(("layer_decode_ggml" + kernel).c_str(),
                                     [flash](benchmark::State& state) {
                                       BM_LayerDecodeGgml(state, flash, -1);
                                     });
    plain->ArgNames({"kv_heads", "dtype", "threads"})->UseRealTime();
    benchmark::internal::Benchmark* typed = benchmark::RegisterBenchmark(
        ("layer_weights_decode_ggml" + kernel).c_str(),
        [flash](benchmark::State& state) {
          BM_LayerDecodeGgml(state, flash, 2);
        });
    typed->ArgNames({"kv_heads", "dtype", "weights", "threads"})->UseRealTime();
    for (int threads : ThreadCounts()) {
      for (const std::vector<int64_t>& args : std::vector<std::vector<int64_t>>{
               {32, 0}, {8, 0}, {32, 1}, {32, 2}, {32, kI8}}) {
        if (flash || args[1] != kI8) plain->Args({args[0], args[1], threads});
      }
      for (const std::vector<int64_t>& args :
           std::vector<std::vector<int64_t>>{{32, 0, kWeightsBF16},
                                             {32, 0, kWeightsInt8},
                                             {8, 0, kWeightsBF16},
                                             {8, 0, kWeightsInt8},
                                             {32, 1, kWeightsBF16},
                                             {8, 1, kWeightsBF16},
                                             {32, kI8, kWeightsInt8},
                                             {8, kI8, kWeightsInt8}}) {
        if (flash || args[1] != kI8) {
          typed->Args({args[0], args[1], args[2], threads});
        }
      }
    }
  }
}
#endif  // HEADWAY_BENCH_GGML

void RegisterLayer() {
  // kv_heads: 32 (MHA), 8 (GQA-8), 1 (MQA). No MinTime: a prefill takes from
  // a few tenths of a second (AVX-512) to tens of seconds (SCALAR) per
  // iteration, and --benchmark_min_time keeps its say.
  const std::vector<std::vector<int64_t>> layouts = {{32}, {8}, {1}};
  // The seed peers of `kind` ("decode", "prefill"): on Headway's Matmul
  // (peer == nullptr), then on each BLAS.
  using SeedFn = void (*)(benchmark::State&, const RunConfig&, const PeerGemm*);
  const auto register_seeds = [&](const std::string& kind, SeedFn fn) {
    std::vector<std::pair<std::string, const PeerGemm*>> seeds = {
        {"seed", nullptr}};
    for (const PeerGemm& peer : PeerGemms()) {
      seeds.emplace_back("seed_" + peer.library, &peer);
    }
    for (const auto& [name, peer] : seeds) {
      RegisterPerTarget(
          "layer_" + name + "_" + kind,
          [fn, peer = peer](benchmark::State& state, const RunConfig& run) {
            fn(state, run, peer);
          },
          {"kv_heads"}, layouts);
    }
  };
  // The layer without (plain) and with QK-norm and RoPE fused; its weights
  // from argument weights_arg (-1: float32).
  const auto layer_fn = [](auto fn, bool variants, int weights_arg = -1) {
    return [fn, variants, weights_arg](benchmark::State& state,
                                       const RunConfig& run) {
      fn(state, run, variants, weights_arg);
    };
  };
  // Decode also with the MHA cache in the narrower dtypes (KvDtype values 1-3),
  // on the key targets, beside the float32-cache rows (dtype 0).
  RegisterPerTarget("layer_decode", layer_fn(BM_LayerDecode, false),
                    {"kv_heads", "dtype"},
                    {{32, 0}, {8, 0}, {1, 0}, {32, 1}, {32, 2}, {32, 3}});
  RegisterPerTarget("layer_decode_qknorm_rope", layer_fn(BM_LayerDecode, true),
                    {"kv_heads", "dtype"}, {{32, 0}, {8, 0}, {8, 1}},
                    /*every_target_sets=*/0);
  register_seeds("decode", BM_SeedDecode);
  RegisterPerTarget("layer_prefill", layer_fn(BM_LayerPrefill, false),
                    {"kv_heads"}, layouts);
  RegisterPerTarget("layer_prefill_qknorm_rope",
                    layer_fn(BM_LayerPrefill, true), {"kv_heads"}, {{32}, {8}},
                    /*every_target_sets=*/0);
  register_seeds("prefill", BM_SeedPrefill);
  // Weights stored as bf16 or int8, and bf16 compute (LayerWeights), on the
  // key targets: decode with a float32 cache, and bf16 weights with a bf16
  // cache, int8 with int8; prefill.
  RegisterPerTarget("layer_weights_decode", layer_fn(BM_LayerDecode, false, 2),
                    {"kv_heads", "dtype", "weights"},
                    {{32, 0, 1},
                     {32, 0, 2},
                     {32, 0, 3},
                     {8, 0, 1},
                     {8, 0, 2},
                     {32, 1, 1},
                     {8, 1, 1},
                     {32, 3, 2},
                     {8, 3, 2}},
                    /*every_target_sets=*/0);
  RegisterPerTarget("layer_weights_prefill",
                    layer_fn(BM_LayerPrefill, false, 1),
                    {"kv_heads", "weights"},
                    {{32, 1}, {32, 2}, {32, 3}, {32, 4}, {8, 1}, {8, 3}},
                    /*every_target_sets=*/0);
  // And bf16 weights in bf16 compute with a bf16 cache (K and V stored
  // through the chunked projection), what a host on an AMX Xeon would run.
  RegisterPerTarget(
      "layer_weights_prefill",
      [](benchmark::State& state, const RunConfig& run) {
        LayerPrefill(state, run, false, 1, 2);
      },
      {"kv_heads", "weights", "dtype"}, {{32, 3, 1}, {8, 3, 1}},
      /*every_target_sets=*/0);
#ifdef HEADWAY_BENCH_GGML
  RegisterGgml();
#endif
}

HEADWAY_REGISTER_BENCHMARKS(RegisterLayer);

}  // namespace
}  // namespace bench
}  // namespace headway

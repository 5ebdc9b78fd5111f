// headway::Attention per target and thread count: decode against a long cache
// and causal prefill, for MHA, GQA-8 and MQA with 32 query heads of head_dim
// 128, with the cache stored as float32 and, for decode MHA and GQA-8 and
// prefill MHA on the key targets, as bfloat16, float16 and int8 (argument
// dtype: the KvDtype value, 0 float32, 1 bfloat16, 2 float16, 3 int8); and
// the materialised path (AttentionWithWeights) on the float32 shapes, the
// seed-style peer that the fused path is measured against; and the variants
// of AttentionOptions on the float32 rows (attention_*_variant: argument
// variant 1 soft-capping at 50 as Gemma 2, 2 ALiBi with the paper's slopes,
// 3 sink logits as gpt-oss), decode and prefill in the AttentionCompute modes
// (argument compute: 1 kBFloat16 on the bf16 cache, 2 kInt8 on the int8
// cache), the
// sliding window (attention_*_window: decode at position 65535 with a
// 4096-key window beside plain decode at 4096 keys, prefill of 16384 tokens
// with a 4096-key window), and MHA decode at other head sizes in every type
// (attention_decode_head_dim, argument head_dim: 64 heads of 64, 16 of 256,
// the same query width and cache bytes as 32 x 128).
//
// Counted work (docs/BENCHMARKS.md), with H = 32 query heads, G KV heads, d =
// 128 (H * d = 4096 in every row), L cached rows, n query rows:
// - flops: the two products, 4 * H * d per (query, visible key) pair (QK^T
//   and PV, two flops per multiply-add): decode 4 * H * L * d, prefill
//   4 * H * d * n * n / 2 (the half of the square under the causal mask);
//   with a window W, the pairs each query sees, min(p + 1, W) for position p
//   (the variants' own work, a tanh or a bias per pair, is not counted);
//   plus, for a stored type other than float32, one per stored K and V
//   element converted, 2 * G * L * d (prefill converts each block once);
// - bytes: what must be read and written: the K and V rows as stored, L *
//   KvCache::bytes_per_token() (int8's scales included; a window's rows
//   only), plus
//   4 * 2 * n * H * d (q read, out written); the materialised path also writes
//   its weights, 4 * H * n * L more.
// Each row reports the percentage of the ceiling that bounds it at that
// arithmetic intensity: decode MHA (0.5 flops per byte for float32, 1.5 for
// bfloat16 and float16, 3 for int8) and float32 GQA-8 (2) the DRAM read
// bandwidth ("%read"; at L = 16384 the float32 MHA cache is 512 MiB, GQA-8's
// 128 MiB); GQA-8 in the narrower types (4.5 and 9 flops per byte) whichever
// bound is lower on that target and thread count; MQA decode (16 flops per
// byte; its 16 MiB cache fits in L3) and prefill the FMA peak ("%FMA") on the
// vector targets (SCALAR's ridge point is near 0.5 flop per byte, so there
// decode is compute-bound too).
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
#include "benchmark/benchmark.h"
#include "headway/attention.h"
#include "headway/kv_cache.h"

namespace headway {
namespace bench {
namespace {

constexpr int64_t kHeads = 32, kHeadDim = 128;
// The query width, kHeads * kHeadDim, which attention_decode_head_dim keeps
// (64 heads of 64, 16 of 256).
constexpr int64_t kWidth = kHeads * kHeadDim;
constexpr int64_t kDecodeLen = 16384, kPrefillLen = 2048;

// One cache per (n_kv_heads, length, dtype, ring, head_dim), filled once for
// the whole run with the same random floats for every dtype; null after
// skipping the benchmark if it cannot be made. Decode's at L = 16384 take
// 1.4 GiB in all at head_dim 128 (float32 MHA 512 MiB, GQA-8 128 MiB;
// bfloat16 and float16 half of that, int8 a quarter plus the scales), and
// 1.1 GiB (MHA) at each other head_dim. ring_rows > 0: a ring cache of that
// many rows with n_sink_tokens pinned, holding the last of `length` positions.
const KvCache* SharedCache(benchmark::State& state, int64_t n_kv_heads,
                           int64_t length, KvDtype dtype, int64_t ring_rows = 0,
                           int64_t n_sink_tokens = 0,
                           int64_t head_dim = kHeadDim) {
  static std::map<
      std::tuple<int64_t, int64_t, KvDtype, int64_t, int64_t, int64_t>,
      std::unique_ptr<KvCache>>
      caches;
  std::unique_ptr<KvCache>& cache =
      caches[{n_kv_heads, length, dtype, ring_rows, n_sink_tokens, head_dim}];
  if (!cache) {
    auto made = std::make_unique<KvCache>();
    KvCacheConfig config{1, n_kv_heads, head_dim, length};
    config.dtype = dtype;
    if (ring_rows > 0) {
      config.capacity = ring_rows;
      config.ring = true;
      config.n_sink_tokens = n_sink_tokens;
    }
    if (!Check(state, KvCache::Create(config, made.get()))) return nullptr;
    cache = std::move(made);
    const int64_t width = n_kv_heads * head_dim, step = 256;
    auto k = AllocateBuffer<float>(step * width);
    auto v = AllocateBuffer<float>(step * width);
    for (int64_t t = 0; t < length; t += step) {
      FillUniform(k.get(), step * width, -1.0f, 1.0f, 2 * t + 1);
      FillUniform(v.get(), step * width, -1.0f, 1.0f, 2 * t + 2);
      if (!cache
               ->Append(0, MatrixView<const float>(k.get(), step, width),
                        MatrixView<const float>(v.get(), step, width))
               .ok()) {
        std::abort();
      }
    }
  }
  return cache.get();
}

struct Buffers {
  BufferPtr<float> q, out, weights;
};

Buffers MakeBuffers(int64_t n_tokens, bool weights, int64_t kv_len) {
  Buffers buffers;
  const size_t size = static_cast<size_t>(n_tokens * kWidth);
  buffers.q = AllocateBuffer<float>(size);
  buffers.out = AllocateBuffer<float>(size);
  // Every buffer is written once before timing: a first touch costs a page
  // fault per 4 KiB, which would otherwise be timed in the first (at these
  // sizes often the only) iteration.
  FillUniform(buffers.q.get(), size, -1.0f, 1.0f, 7);
  FillUniform(buffers.out.get(), size, -1.0f, 1.0f, 8);
  if (weights) {
    const size_t weights_size = static_cast<size_t>(kHeads * n_tokens * kv_len);
    buffers.weights = AllocateBuffer<float>(weights_size);
    FillUniform(buffers.weights.get(), weights_size, 0.0f, 1.0f, 9);
  }
  return buffers;
}

AttentionQuery MakeQuery(const Buffers& buffers, int64_t n_tokens,
                         int64_t kv_len) {
  AttentionQuery query;
  query.q_pos0 = kv_len - n_tokens;
  query.q = MatrixView<const float>(buffers.q.get(), n_tokens, kWidth);
  query.out = MatrixView<float>(buffers.out.get(), n_tokens, kWidth);
  return query;
}

// Visible (query, key) pairs of n_tokens queries ending at the last of
// kv_len keys: all of them for one decode row, the lower half of the square
// for a prefill; with a window, each query's min(p + 1, window), plus the
// sink tokens before its window.
double VisiblePairs(int64_t n_tokens, int64_t kv_len, int64_t window,
                    int64_t n_sink_tokens) {
  if (window == 0) {
    return n_tokens == 1 ? static_cast<double>(kv_len)
                         : 0.5 * n_tokens * kv_len;
  }
  double pairs = 0.0;
  for (int64_t p = kv_len - n_tokens; p < kv_len; ++p) {
    const int64_t first = std::max<int64_t>(0, p - window + 1);
    pairs +=
        static_cast<double>(p + 1 - first + std::min(first, n_sink_tokens));
  }
  return pairs;
}

// A cache as the counters see it: its elements per token of K (n_kv_heads *
// head_dim), its stored bytes per token (K and V of every KV head, scales
// included) and whether its elements are converted to float32 (every type but
// float32).
struct StoredCache {
  int64_t kv_width;
  double bytes_per_token;
  bool converted;
};

// The counters of n_tokens query rows against the kv_len cached rows of
// `cache` (with a window: only those it sees, and the sink tokens), with or
// without the weights written, on `threads` threads of `target`.
void Report(benchmark::State& state, const Target& target, int threads,
            const StoredCache& cache, int64_t n_tokens, int64_t kv_len,
            bool weights, int64_t window = 0, int64_t n_sink_tokens = 0) {
  const double pairs = VisiblePairs(n_tokens, kv_len, window, n_sink_tokens);
  // The rows read: those some query sees.
  kv_len = window == 0
               ? kv_len
               : std::min(kv_len, window + n_tokens - 1 + n_sink_tokens);
  // One conversion per stored K and V element, unless stored as float32.
  const double conversions =
      cache.converted ? 2.0 * static_cast<double>(cache.kv_width * kv_len)
                      : 0.0;
  const double flops = 4.0 * kWidth * pairs + conversions;
  double bytes = cache.bytes_per_token * static_cast<double>(kv_len) +
                 sizeof(float) * 2.0 * n_tokens * kWidth;
  if (weights) bytes += sizeof(float) * 1.0 * kHeads * n_tokens * kv_len;
  ReportRoofline(state, flops, bytes, MemoryCeiling::kRead, target, threads);
}

// The same for a Headway cache: K and V as stored, the cache's own count
// (padding, int8's scales).
void Report(benchmark::State& state, const RunConfig& run, const KvCache& cache,
            int64_t n_tokens, int64_t kv_len, bool weights, int64_t window = 0,
            int64_t n_sink_tokens = 0) {
  const StoredCache stored{cache.n_kv_heads() * cache.head_dim(),
                           static_cast<double>(cache.bytes_per_token()),
                           cache.config().dtype != KvDtype::kFloat32};
  Report(state, run.target, run.threads, stored, n_tokens, kv_len, weights,
         window, n_sink_tokens);
}

// One query row against kDecodeLen keys of a cache in `dtype` with n_kv
// heads of head_dim (kWidth / head_dim query heads).
void Decode(benchmark::State& state, const RunConfig& run, int64_t n_kv,
            int64_t head_dim, KvDtype dtype) {
  const KvCache* cache =
      SharedCache(state, n_kv, kDecodeLen, dtype, 0, 0, head_dim);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(1, false, kDecodeLen);
  const AttentionQuery query = MakeQuery(buffers, 1, kDecodeLen);
  const auto step = [&] {
    return Attention(*cache, kWidth / head_dim, &query, 1);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, 1, kDecodeLen, /*weights=*/false);
}

void BM_Decode(benchmark::State& state, const RunConfig& run) {
  Decode(state, run, state.range(0), kHeadDim,
         static_cast<KvDtype>(state.range(1)));
}

// MHA decode at head_dim state.range(0) (64 heads of 64, 16 of 256).
void BM_DecodeHeadDim(benchmark::State& state, const RunConfig& run) {
  const int64_t head_dim = state.range(0);
  Decode(state, run, kWidth / head_dim, head_dim,
         static_cast<KvDtype>(state.range(1)));
}

// BM_Decode in an AttentionCompute mode (arguments dtype and compute, the
// enums' values): kBFloat16 on a bf16 cache (q and P rounded to bf16,
// vdpbf16ps where the CPU has it), kInt8 on an int8 cache (q quantized,
// vpdpbusd on AVX3_DL).
void BM_DecodeCompute(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvCache* cache = SharedCache(state, n_kv, kDecodeLen,
                                     static_cast<KvDtype>(state.range(1)));
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(1, false, kDecodeLen);
  const AttentionQuery query = MakeQuery(buffers, 1, kDecodeLen);
  AttentionOptions options;
  options.compute = static_cast<AttentionCompute>(state.range(2));
  const auto step = [&] {
    return Attention(*cache, kHeads, &query, 1, options);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, 1, kDecodeLen, /*weights=*/false);
}

void BM_DecodeMaterialized(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvDtype dtype = KvDtype::kFloat32;
  const KvCache* cache = SharedCache(state, n_kv, kDecodeLen, dtype);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(1, true, kDecodeLen);
  const AttentionQuery query = MakeQuery(buffers, 1, kDecodeLen);
  const MatrixView<float> weights(buffers.weights.get(), kHeads, kDecodeLen);
  const auto step = [&] {
    return AttentionWithWeights(*cache, kHeads, query, weights);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, 1, kDecodeLen, /*weights=*/true);
}

// Causal prefill in an AttentionCompute mode.
void Prefill(benchmark::State& state, const RunConfig& run, int64_t n_kv,
             KvDtype dtype, AttentionCompute compute) {
  const KvCache* cache = SharedCache(state, n_kv, kPrefillLen, dtype);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(kPrefillLen, false, kPrefillLen);
  const AttentionQuery query = MakeQuery(buffers, kPrefillLen, kPrefillLen);
  AttentionOptions options;
  options.compute = compute;
  const auto step = [&] {
    return Attention(*cache, kHeads, &query, 1, options);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, kPrefillLen, kPrefillLen, /*weights=*/false);
}

void BM_Prefill(benchmark::State& state, const RunConfig& run) {
  Prefill(state, run, state.range(0), static_cast<KvDtype>(state.range(1)),
          AttentionCompute::kFloat32);
}

// BM_Prefill in an AttentionCompute mode (arguments dtype and compute):
// kBFloat16 on a bf16 cache, on AMX tiles where AmxBFloat16Active().
void BM_PrefillCompute(benchmark::State& state, const RunConfig& run) {
  Prefill(state, run, state.range(0), static_cast<KvDtype>(state.range(1)),
          static_cast<AttentionCompute>(state.range(2)));
}

void BM_PrefillMaterialized(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvDtype dtype = KvDtype::kFloat32;
  const KvCache* cache = SharedCache(state, n_kv, kPrefillLen, dtype);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(kPrefillLen, true, kPrefillLen);
  const AttentionQuery query = MakeQuery(buffers, kPrefillLen, kPrefillLen);
  const MatrixView<float> weights(buffers.weights.get(), kHeads * kPrefillLen,
                                  kPrefillLen);
  const auto step = [&] {
    return AttentionWithWeights(*cache, kHeads, query, weights);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, kPrefillLen, kPrefillLen, /*weights=*/true);
}

// The options of a variant row (see the top).
AttentionOptions VariantOptions(int64_t variant) {
  static const std::vector<float> slopes = [] {
    std::vector<float> s(kHeads);
    if (!AlibiSlopes(kHeads, s.data()).ok()) std::abort();
    return s;
  }();
  static const std::vector<float> sinks = [] {
    std::vector<float> s(kHeads);
    FillUniform(s.data(), s.size(), -1.0f, 3.0f, 17);
    return s;
  }();
  AttentionOptions options;
  if (variant == 1) options.softcap = 50.0f;
  if (variant == 2) options.alibi_slopes = slopes.data();
  if (variant == 3) options.sink_logits = sinks.data();
  return options;
}

void BM_DecodeVariant(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const AttentionOptions options = VariantOptions(state.range(1));
  const KvCache* cache =
      SharedCache(state, n_kv, kDecodeLen, KvDtype::kFloat32);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(1, false, kDecodeLen);
  const AttentionQuery query = MakeQuery(buffers, 1, kDecodeLen);
  const auto step = [&] {
    return Attention(*cache, kHeads, &query, 1, options);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, 1, kDecodeLen, /*weights=*/false);
}

void BM_PrefillVariant(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const AttentionOptions options = VariantOptions(state.range(1));
  const KvCache* cache =
      SharedCache(state, n_kv, kPrefillLen, KvDtype::kFloat32);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(kPrefillLen, false, kPrefillLen);
  const AttentionQuery query = MakeQuery(buffers, kPrefillLen, kPrefillLen);
  const auto step = [&] {
    return Attention(*cache, kHeads, &query, 1, options);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, kPrefillLen, kPrefillLen, /*weights=*/false);
}

// n_tokens queries ending at the last of kv_len keys, with a window (0:
// none) and n_sink_tokens, in a plain cache of kv_len rows or (ring 1) a ring
// cache of window + n_sink_tokens rows.
void BM_Window(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0), window = state.range(1);
  const int64_t kv_len = state.range(2), n_tokens = state.range(3);
  const int64_t ring = state.range(4), n_sink_tokens = state.range(5);
  AttentionOptions options;
  options.window = window;
  options.n_sink_tokens = n_sink_tokens;
  const KvCache* cache =
      SharedCache(state, n_kv, kv_len, KvDtype::kFloat32,
                  ring != 0 ? window + n_sink_tokens : 0, n_sink_tokens);
  if (cache == nullptr) return;
  const Buffers buffers = MakeBuffers(n_tokens, false, kv_len);
  const AttentionQuery query = MakeQuery(buffers, n_tokens, kv_len);
  const auto step = [&] {
    return Attention(*cache, kHeads, &query, 1, options);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, *cache, n_tokens, kv_len, /*weights=*/false, window,
         n_sink_tokens);
}

#ifdef HEADWAY_BENCH_GGML
// attention_decode_ggml/<fa or mul_mat>/kv_heads:G/dtype:N/threads:T, the
// peers of attention_decode: ggml's CPU attention for one decode token as
// llama.cpp builds it, over a cache in llama.cpp's layout holding the same
// random floats as SharedCache's, stored as f32, bf16, f16 or, for dtype 3,
// q8_0 (blocks of 32 int8 with an f16 scale, llama.cpp's int8 cache):
// - fa (llama.cpp's -fa, its default where the backend has it):
//   ggml_flash_attn_ext at F32 precision, no mask; per token the rows of
//   every KV head, K and V alike. ggml converts q to the cache's type (bf16,
//   f16, q8_0) and multiplies in it, key by key, threads over the query
//   heads (over the keys for f32 and f16).
// - mul_mat (-fa off; not for q8_0, whose V llama.cpp stores only with fa):
//   K Q^T by ggml_mul_mat (F32 precision), ggml_soft_max_ext, and the weights
//   times V stored transposed (per KV head [d][L]), as llama.cpp stores V
//   without fa.
// Bytes are counted as ggml stores them (q8_0: 34 per 32 elements).
struct GgmlCache {
  int64_t head_dim;
  ggml_type type;
  size_t row_bytes;  // one KV head's row of one token
  // K and V as [L][G][d]; V as [G][d][L] (mul_mat; empty for q8_0).
  BufferPtr<uint8_t> k, v, v_trans;
};

const GgmlCache& SharedGgmlCache(int64_t n_kv_heads, int64_t head_dim,
                                 KvDtype dtype) {
  static std::map<std::tuple<int64_t, int64_t, KvDtype>,
                  std::unique_ptr<GgmlCache>>
      caches;
  std::unique_ptr<GgmlCache>& cache = caches[{n_kv_heads, head_dim, dtype}];
  if (cache) return *cache;
  cache = std::make_unique<GgmlCache>();
  cache->head_dim = head_dim;
  const ggml_type type = cache->type = GgmlCacheType(dtype);
  cache->row_bytes = ggml_row_size(type, head_dim);
  const int64_t width = n_kv_heads * head_dim, step = 256;
  const size_t bytes = cache->row_bytes * n_kv_heads * kDecodeLen;
  const bool trans = type != GGML_TYPE_Q8_0;
  cache->k = AllocateBuffer<uint8_t>(bytes);
  cache->v = AllocateBuffer<uint8_t>(bytes);
  if (trans) cache->v_trans = AllocateBuffer<uint8_t>(bytes);
  auto k = AllocateBuffer<float>(step * width);
  auto v = AllocateBuffer<float>(step * width);
  std::vector<float> column(step);
  const size_t step_bytes = cache->row_bytes * n_kv_heads * step;
  for (int64_t t = 0; t < kDecodeLen; t += step) {
    // SharedCache's seeds: the same floats, token by token.
    FillUniform(k.get(), step * width, -1.0f, 1.0f, 2 * t + 1);
    FillUniform(v.get(), step * width, -1.0f, 1.0f, 2 * t + 2);
    const size_t at = static_cast<size_t>(t / step) * step_bytes;
    ggml_quantize_chunk(type, k.get(), cache->k.get() + at, 0,
                        step * n_kv_heads, head_dim, nullptr);
    ggml_quantize_chunk(type, v.get(), cache->v.get() + at, 0,
                        step * n_kv_heads, head_dim, nullptr);
    for (int64_t c = 0; trans && c < width; ++c) {
      for (int64_t i = 0; i < step; ++i) column[i] = v.get()[i * width + c];
      ggml_quantize_chunk(
          type, column.data(),
          cache->v_trans.get() + ggml_row_size(type, c * kDecodeLen + t), 0, 1,
          step, nullptr);
    }
  }
  return *cache;
}

// The [d, L, G] K or V of a llama.cpp-layout cache ([L][G][d] at `data`),
// viewed and permuted as llama.cpp does.
ggml_tensor* GgmlRows(ggml_context* ctx, const GgmlCache& cache,
                      int64_t n_kv_heads, uint8_t* data) {
  const int64_t d = cache.head_dim;
  ggml_tensor* all =
      ggml_new_tensor_2d(ctx, cache.type, d * n_kv_heads, kDecodeLen);
  all->data = data;
  ggml_tensor* rows =
      ggml_view_3d(ctx, all, d, n_kv_heads, kDecodeLen, cache.row_bytes,
                   cache.row_bytes * n_kv_heads, 0);
  return ggml_permute(ctx, rows, 0, 2, 1, 3);
}

// by_head_dim: attention_decode_head_dim's peer (argument 0 head_dim, MHA),
// else attention_decode's (argument 0 kv_heads, head_dim 128).
void BM_DecodeGgml(benchmark::State& state, bool flash, bool by_head_dim) {
  const int64_t head_dim = by_head_dim ? state.range(0) : kHeadDim;
  const int64_t heads = kWidth / head_dim;
  const int64_t n_kv = by_head_dim ? heads : state.range(0);
  const KvDtype dtype = static_cast<KvDtype>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  const GgmlCache& cache = SharedGgmlCache(n_kv, head_dim, dtype);
  const Buffers buffers = MakeBuffers(1, false, kDecodeLen);
  // The cache's tensors in stored_ctx, which has no memory of its own (their
  // data is ours); q and what the graph makes (mul_mat's scores and weights,
  // L x H floats each: 2 MiB at H = 32) in ctx's.
  ggml_context* stored_ctx =
      ggml_init({ggml_tensor_overhead() * 16, nullptr, true});
  const size_t scores_bytes = sizeof(float) * kDecodeLen * heads;
  ggml_context* ctx =
      ggml_init({ggml_tensor_overhead() * 16 + ggml_graph_overhead() +
                     2 * scores_bytes + (4u << 20),
                 nullptr, false});
  ggml_tensor* q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, heads, 1);
  std::copy(buffers.q.get(), buffers.q.get() + kWidth,
            static_cast<float*>(q->data));
  q = ggml_permute(ctx, q, 0, 2, 1, 3);  // [d, 1, H]
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ggml_tensor* k = GgmlRows(stored_ctx, cache, n_kv, cache.k.get());
  ggml_tensor* out;
  if (flash) {
    out = ggml_flash_attn_ext(ctx, q, k,
                              GgmlRows(stored_ctx, cache, n_kv, cache.v.get()),
                              nullptr, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
  } else {
    ggml_tensor* v_trans =
        ggml_new_tensor_3d(stored_ctx, cache.type, kDecodeLen, head_dim, n_kv);
    v_trans->data = cache.v_trans.get();
    ggml_tensor* scores = ggml_mul_mat(ctx, k, q);  // [L, 1, H]
    ggml_mul_mat_set_prec(scores, GGML_PREC_F32);
    out = ggml_mul_mat(ctx, v_trans,
                       ggml_soft_max_ext(ctx, scores, nullptr, scale, 0.0f));
  }
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, out);
  const bool ok = TimeGgmlGraphs(state, {graph}, threads);
  ggml_free(ctx);
  ggml_free(stored_ctx);
  if (!ok) return;
  const StoredCache stored{n_kv * head_dim, 2.0 * cache.row_bytes * n_kv,
                           dtype != KvDtype::kFloat32};
  Report(state, SupportedTargets().front(), threads, stored, 1, kDecodeLen,
         /*weights=*/false);
}

// The peers' rows of `family` (attention_decode, argument kv_heads; or
// attention_decode_head_dim, by_head_dim): its shapes (arg_sets, less MQA) in
// every type, on every thread count; mul_mat not on q8_0.
void RegisterGgml(const std::string& family,
                  const std::vector<std::vector<int64_t>>& arg_sets,
                  bool by_head_dim) {
  for (const bool flash : {true, false}) {
    benchmark::internal::Benchmark* bench = benchmark::RegisterBenchmark(
        (family + (flash ? "_ggml/fa" : "_ggml/mul_mat")).c_str(),
        [flash, by_head_dim](benchmark::State& state) {
          BM_DecodeGgml(state, flash, by_head_dim);
        });
    bench->ArgNames({by_head_dim ? "head_dim" : "kv_heads", "dtype", "threads"})
        ->UseRealTime();
    for (const std::vector<int64_t>& args : arg_sets) {
      if (!by_head_dim && args[0] == 1) continue;
      if (!flash && args[1] == static_cast<int64_t>(KvDtype::kInt8)) continue;
      for (int threads : ThreadCounts()) {
        bench->Args({args[0], args[1], threads});
      }
    }
  }
}
#endif  // HEADWAY_BENCH_GGML

void RegisterAttention() {
  // kv_heads: 32 (MHA), 8 (GQA-8), 1 (MQA); dtype: the KvDtype. Decode, at
  // most tens of ms per call, runs the three float32 layouts on every target,
  // MHA and GQA-8 in the other dtypes on the key targets; prefill, about 0.1 s
  // per call on AVX-512 and 2-4 s on SCALAR, float32 MHA on every target, the
  // other layouts and MHA in the other dtypes on the key targets, as the
  // float32 materialised peers (harness.h).
  constexpr int64_t kF32 = static_cast<int64_t>(KvDtype::kFloat32);
  constexpr int64_t kBF16 = static_cast<int64_t>(KvDtype::kBFloat16);
  constexpr int64_t kF16 = static_cast<int64_t>(KvDtype::kFloat16);
  constexpr int64_t kI8 = static_cast<int64_t>(KvDtype::kInt8);
  const std::vector<std::vector<int64_t>> decode_sets = {
      {32, kF32}, {8, kF32},  {1, kF32}, {32, kBF16}, {32, kF16},
      {32, kI8},  {8, kBF16}, {8, kF16}, {8, kI8}};
  RegisterPerTarget("attention_decode", BM_Decode, {"kv_heads", "dtype"},
                    decode_sets, /*every_target_sets=*/3);
#ifdef HEADWAY_BENCH_GGML
  RegisterGgml("attention_decode", decode_sets, /*by_head_dim=*/false);
#endif
  // MHA decode at head_dim 64 and 256 in every type, on the key targets.
  const std::vector<std::vector<int64_t>> head_dim_sets = {
      {64, kF32},  {64, kBF16},  {64, kF16},  {64, kI8},
      {256, kF32}, {256, kBF16}, {256, kF16}, {256, kI8}};
  RegisterPerTarget("attention_decode_head_dim", BM_DecodeHeadDim,
                    {"head_dim", "dtype"}, head_dim_sets,
                    /*every_target_sets=*/0);
#ifdef HEADWAY_BENCH_GGML
  RegisterGgml("attention_decode_head_dim", head_dim_sets,
               /*by_head_dim=*/true);
#endif
  // GQA-8 and MQA (wide tiles: AMX where it runs) on the bf16 cache in
  // AttentionCompute::kBFloat16 (MHA decode computes as kFloat32 there), MHA
  // and GQA-8 on the int8 cache in kInt8, on the key targets.
  RegisterPerTarget("attention_decode", BM_DecodeCompute,
                    {"kv_heads", "dtype", "compute"},
                    {{8, kBF16, 1}, {1, kBF16, 1}, {32, kI8, 2}, {8, kI8, 2}},
                    /*every_target_sets=*/0);
  RegisterPerTarget(
      "attention_prefill", BM_Prefill, {"kv_heads", "dtype"},
      {{32, kF32}, {8, kF32}, {1, kF32}, {32, kBF16}, {32, kF16}, {32, kI8}});
  // MHA and GQA-8 on the bf16 cache in AttentionCompute::kBFloat16, on the
  // key targets.
  RegisterPerTarget("attention_prefill", BM_PrefillCompute,
                    {"kv_heads", "dtype", "compute"},
                    {{32, kBF16, 1}, {8, kBF16, 1}},
                    /*every_target_sets=*/0);
  const std::vector<std::vector<int64_t>> layouts = {{32}, {8}, {1}};
  RegisterPerTarget("attention_decode_materialized", BM_DecodeMaterialized,
                    {"kv_heads"}, layouts);
  RegisterPerTarget("attention_prefill_materialized", BM_PrefillMaterialized,
                    {"kv_heads"}, layouts);
  // The variants beside attention_decode/kv_heads:8/dtype:0 and
  // attention_prefill/kv_heads:32/dtype:0, on the key targets.
  RegisterPerTarget("attention_decode_variant", BM_DecodeVariant,
                    {"kv_heads", "variant"}, {{8, 1}, {8, 2}, {8, 3}},
                    /*every_target_sets=*/0);
  RegisterPerTarget("attention_prefill_variant", BM_PrefillVariant,
                    {"kv_heads", "variant"}, {{32, 1}, {32, 2}, {32, 3}},
                    /*every_target_sets=*/0);
  // Decode GQA-8 at position 65535 with a 4096-key window (in a plain cache
  // of 65536 rows; in a ring of 4096 rows; in a ring of 4100 with 4 sink
  // tokens) and without one at 4096 keys (the same keys read); prefill MHA
  // of 16384 tokens with a window of 4096 (about 2 s per call on AVX-512
  // with two threads).
  const std::vector<std::string> window_args = {"kv_heads", "window", "kv_len",
                                                "n_tokens", "ring",   "sinks"};
  RegisterPerTarget("attention_decode_window", BM_Window, window_args,
                    {{8, 0, 4096, 1, 0, 0},
                     {8, 4096, 65536, 1, 0, 0},
                     {8, 4096, 65536, 1, 1, 0},
                     {8, 4096, 65536, 1, 1, 4}},
                    /*every_target_sets=*/0);
  RegisterPerTarget("attention_prefill_window", BM_Window, window_args,
                    {{32, 4096, 16384, 16384, 0, 0}},
                    /*every_target_sets=*/0);
}

HEADWAY_REGISTER_BENCHMARKS(RegisterAttention);

}  // namespace
}  // namespace bench
}  // namespace headway

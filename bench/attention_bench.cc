// headway::Attention per target and thread count: decode against a long cache
// and causal prefill, for MHA, GQA-8 and MQA with 32 query heads of head_dim
// 128; and the materialised path (AttentionWithWeights) on the same shapes,
// the seed-style peer that the fused path is measured against.
//
// Counted work (docs/BENCHMARKS.md), with H = 32 query heads, G KV heads, d =
// 128, L cached rows, n query rows:
// - flops: the two products only, 4 * H * d per (query, visible key) pair
//   (QK^T and PV, two flops per multiply-add): decode 4 * H * L * d, prefill
//   4 * H * d * n * n / 2 (the half of the square under the causal mask);
// - bytes: what must be read and written, 4 * (2 * G * L * d + 2 * n * H * d)
//   (K and V read, q read, out written); the materialised path also writes its
//   weights, 4 * H * n * L more.
// Each row reports the percentage of the ceiling that bounds it at that
// arithmetic intensity: decode MHA and GQA-8 (0.5 and 2 flops per byte) the
// DRAM read bandwidth ("%read"; at L = 16384 the MHA cache is 512 MiB, GQA-8's
// 128 MiB), MQA decode (16 flops per byte; its 16 MiB cache fits in L3) and
// prefill the FMA peak ("%FMA") on the vector targets (SCALAR's ridge point is
// near 0.5 flop per byte, so there decode is compute-bound too).
#include <stddef.h>
#include <stdint.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"
#include "headway/attention.h"
#include "headway/kv_cache.h"
#include "hwy/aligned_allocator.h"

namespace headway {
namespace bench {
namespace {

constexpr int64_t kHeads = 32, kHeadDim = 128;
constexpr int64_t kDecodeLen = 16384, kPrefillLen = 2048;

// One cache per (n_kv_heads, length), filled once for the whole run.
const KvCache& SharedCache(int64_t n_kv_heads, int64_t length) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<KvCache>> caches;
  std::unique_ptr<KvCache>& cache = caches[{n_kv_heads, length}];
  if (!cache) {
    cache = std::make_unique<KvCache>();
    KvCacheConfig config{1, n_kv_heads, kHeadDim, length};
    if (!KvCache::Create(config, cache.get()).ok()) std::abort();
    const int64_t width = n_kv_heads * kHeadDim, step = 256;
    auto k = hwy::AllocateAligned<float>(step * width);
    auto v = hwy::AllocateAligned<float>(step * width);
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
  return *cache;
}

struct Buffers {
  hwy::AlignedFreeUniquePtr<float[]> q, out, weights;
};

Buffers MakeBuffers(int64_t n_tokens, bool weights, int64_t kv_len) {
  Buffers buffers;
  const size_t size = static_cast<size_t>(n_tokens * kHeads * kHeadDim);
  buffers.q = hwy::AllocateAligned<float>(size);
  buffers.out = hwy::AllocateAligned<float>(size);
  // Every buffer is written once before timing: a first touch costs a page
  // fault per 4 KiB, which would otherwise be timed in the first (at these
  // sizes often the only) iteration.
  FillUniform(buffers.q.get(), size, -1.0f, 1.0f, 7);
  FillUniform(buffers.out.get(), size, -1.0f, 1.0f, 8);
  if (weights) {
    const size_t weights_size = static_cast<size_t>(kHeads * n_tokens * kv_len);
    buffers.weights = hwy::AllocateAligned<float>(weights_size);
    FillUniform(buffers.weights.get(), weights_size, 0.0f, 1.0f, 9);
  }
  return buffers;
}

AttentionQuery MakeQuery(const Buffers& buffers, int64_t n_tokens,
                         int64_t kv_len) {
  AttentionQuery query;
  query.q_pos0 = kv_len - n_tokens;
  query.q =
      MatrixView<const float>(buffers.q.get(), n_tokens, kHeads * kHeadDim);
  query.out = MatrixView<float>(buffers.out.get(), n_tokens, kHeads * kHeadDim);
  return query;
}

// The counters of n_tokens query rows against kv_len cached rows, with or
// without the weights written.
void Report(benchmark::State& state, const RunConfig& run, int64_t n_kv,
            int64_t n_tokens, int64_t kv_len, bool weights) {
  // Visible (query, key) pairs: all of them for one decode row, the lower half
  // of the square for a prefill.
  const double pairs =
      n_tokens == 1 ? static_cast<double>(kv_len) : 0.5 * n_tokens * kv_len;
  const double flops = 4.0 * kHeads * kHeadDim * pairs;
  double bytes = sizeof(float) * (2.0 * n_kv * kv_len * kHeadDim +
                                  2.0 * n_tokens * kHeads * kHeadDim);
  if (weights) bytes += sizeof(float) * 1.0 * kHeads * n_tokens * kv_len;
  ReportRoofline(state, flops, bytes, MemoryCeiling::kRead, run.target,
                 run.threads);
}

void BM_Decode(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvCache& cache = SharedCache(n_kv, kDecodeLen);
  const Buffers buffers = MakeBuffers(1, false, kDecodeLen);
  const AttentionQuery query = MakeQuery(buffers, 1, kDecodeLen);
  const auto step = [&] { return Attention(cache, kHeads, &query, 1); };
  if (!TimeSteps(state, step)) return;
  Report(state, run, n_kv, 1, kDecodeLen, /*weights=*/false);
}

void BM_DecodeMaterialized(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvCache& cache = SharedCache(n_kv, kDecodeLen);
  const Buffers buffers = MakeBuffers(1, true, kDecodeLen);
  const AttentionQuery query = MakeQuery(buffers, 1, kDecodeLen);
  const MatrixView<float> weights(buffers.weights.get(), kHeads, kDecodeLen);
  const auto step = [&] {
    return AttentionWithWeights(cache, kHeads, query, weights);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, n_kv, 1, kDecodeLen, /*weights=*/true);
}

void BM_Prefill(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvCache& cache = SharedCache(n_kv, kPrefillLen);
  const Buffers buffers = MakeBuffers(kPrefillLen, false, kPrefillLen);
  const AttentionQuery query = MakeQuery(buffers, kPrefillLen, kPrefillLen);
  const auto step = [&] { return Attention(cache, kHeads, &query, 1); };
  if (!TimeSteps(state, step)) return;
  Report(state, run, n_kv, kPrefillLen, kPrefillLen, /*weights=*/false);
}

void BM_PrefillMaterialized(benchmark::State& state, const RunConfig& run) {
  const int64_t n_kv = state.range(0);
  const KvCache& cache = SharedCache(n_kv, kPrefillLen);
  const Buffers buffers = MakeBuffers(kPrefillLen, true, kPrefillLen);
  const AttentionQuery query = MakeQuery(buffers, kPrefillLen, kPrefillLen);
  const MatrixView<float> weights(buffers.weights.get(), kHeads * kPrefillLen,
                                  kPrefillLen);
  const auto step = [&] {
    return AttentionWithWeights(cache, kHeads, query, weights);
  };
  if (!TimeSteps(state, step)) return;
  Report(state, run, n_kv, kPrefillLen, kPrefillLen, /*weights=*/true);
}

void RegisterAttention() {
  // kv_heads: 32 (MHA), 8 (GQA-8), 1 (MQA). Decode, at most tens of ms per
  // call, runs all three on every target; prefill, about 0.1 s per call on
  // AVX-512 and 2-4 s on SCALAR, MHA on every target and all three on the key
  // targets, as the materialised peers (harness.h).
  const std::vector<std::vector<int64_t>> layouts = {{32}, {8}, {1}};
  RegisterPerTarget("attention_decode", BM_Decode, {"kv_heads"}, layouts,
                    /*every_target_sets=*/3);
  RegisterPerTarget("attention_decode_materialized", BM_DecodeMaterialized,
                    {"kv_heads"}, layouts);
  RegisterPerTarget("attention_prefill", BM_Prefill, {"kv_heads"}, layouts);
  RegisterPerTarget("attention_prefill_materialized", BM_PrefillMaterialized,
                    {"kv_heads"}, layouts);
}

HEADWAY_REGISTER_BENCHMARKS(RegisterAttention);

}  // namespace
}  // namespace bench
}  // namespace headway

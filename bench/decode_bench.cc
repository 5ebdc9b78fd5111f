// The decode tile kernels alone (lib/attention/decode.h): ScoreRows then
// AccumulateRows per 128-key block (ScoreRowPair and AccumulateRowPair on
// pairs of heads where NarrowTiles pairs them), as NarrowTiles calls them,
// streaming the stored K and V of 32 heads x 16384 keys x 128 (int8: 128 MiB,
// float32: 512 MiB, all far past the 32 MiB L3) once per iteration, per stored
// type, with `rows` query rows per head: 1 (MHA) or 4 (GQA-8's group); and
// the AttentionCompute modes' kernels (argument compute: 1 ScoreRowsBF16 and
// AccumulateRowsBF16 on bf16, native where NativeBFloat16Active; 2
// ScoreRowsInt8 and AccumulateRowsInt8 on int8, q of int8 levels).
//
// Bytes counted: the stored K and V elements and the int8 scales (what decode
// must read); flops: 4 per query row and key element (the score's and the
// weighted sum's multiply-adds; conversions uncounted). The softmax between
// the two calls is left out: the scores serve as weights (small q keeps them
// in [-0.2, 0.2]). Against the read ceiling, "%read" is how close a type
// comes to reading at bandwidth; rows:4 on narrow types may be FMA-bound.
#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "lib/core/storage.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/decode_bench.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/attention/decode.h"

// Non-SIMD part: normal include guard (foreach_target.h includes this file
// once per target).
#ifndef HEADWAY_BENCH_DECODE_BENCH_CC_
#define HEADWAY_BENCH_DECODE_BENCH_CC_
namespace headway {
namespace bench {

// [kHeads][kKeys][kDim] stored elements each for K and V.
inline constexpr size_t kDecodeHeads = 32, kDecodeKeys = 16384,
                        kDecodeDim = 128, kDecodeBlock = 128,
                        kDecodeMaxRows = 8;

// Stored K and V of every head, their scales ([kHeads][kKeys], int8), the
// query rows [kMaxRows][kDim] and the compute mode (AttentionCompute's value;
// with 2 (kInt8), q holds int8 levels).
struct DecodeOperands {
  const void* k;
  const void* v;
  const float* k_scales;
  const float* v_scales;
  const float* q;
  int compute;
  bool native_bf16;
};

}  // namespace bench
}  // namespace headway
#endif  // HEADWAY_BENCH_DECODE_BENCH_CC_

// Per-target part.
HWY_BEFORE_NAMESPACE();
namespace headway {
namespace bench {
namespace HWY_NAMESPACE {

using ::headway::HWY_NAMESPACE::AccumulateRowPair;
using ::headway::HWY_NAMESPACE::AccumulateRows;
using ::headway::HWY_NAMESPACE::AccumulateRowsBF16;
using ::headway::HWY_NAMESPACE::AccumulateRowsInt8;
using ::headway::HWY_NAMESPACE::DecodeInPairs;
using ::headway::HWY_NAMESPACE::DecodePrefetch;
using ::headway::HWY_NAMESPACE::DecodePrefetchFor;
using ::headway::HWY_NAMESPACE::ScoreRowPair;
using ::headway::HWY_NAMESPACE::ScoreRows;
using ::headway::HWY_NAMESPACE::ScoreRowsBF16;
using ::headway::HWY_NAMESPACE::ScoreRowsInt8;

// Heads [head_begin, head_end) of `ops`, key block by key block, one by one
// or, for one row where NarrowTiles would (DecodeInPairs), two at a time;
// returns a sum of the outputs (kept so that nothing is optimised away).
template <class T>
float StreamHeads(const DecodeOperands& ops, size_t rows, size_t head_begin,
                  size_t head_end) {
  HWY_ALIGN float sc[2][kDecodeMaxRows * kDecodeBlock];
  HWY_ALIGN float o[2][kDecodeMaxRows * kDecodeDim];
  const size_t head_elements = kDecodeKeys * kDecodeDim;
  const DecodePrefetch prefetch = DecodePrefetchFor<T>(rows);
  // NarrowTiles runs no pairs in a compute mode (its rows >= 2 for bf16).
  const bool pairs =
      ops.compute == 0 && DecodeInPairs(internal::kKvDtypeOf<T>, rows);
  float result = 0.0f;
  for (size_t h = head_begin; h < head_end; h += pairs ? 2 : 1) {
    const size_t n_heads = pairs ? HWY_MIN(2, head_end - h) : 1;
    const T* k[2];
    const T* v[2];
    const float* k_scales[2] = {nullptr, nullptr};
    const float* v_scales[2] = {nullptr, nullptr};
    for (size_t i = 0; i < 2; ++i) {
      const size_t head = h + HWY_MIN(i, n_heads - 1);
      k[i] = static_cast<const T*>(ops.k) + head * head_elements;
      v[i] = static_cast<const T*>(ops.v) + head * head_elements;
      if (ops.k_scales) {
        k_scales[i] = ops.k_scales + head * kDecodeKeys;
        v_scales[i] = ops.v_scales + head * kDecodeKeys;
      }
      for (size_t j = 0; j < rows * kDecodeDim; ++j) o[i][j] = 0.0f;
    }
    for (size_t k0 = 0; k0 < kDecodeKeys; k0 += kDecodeBlock) {
      const size_t at = k0 * kDecodeDim;
      const float* ks[2] = {k_scales[0], k_scales[1]};
      const float* vs[2] = {v_scales[0], v_scales[1]};
      for (size_t i = 0; i < 2 && ks[0] != nullptr; ++i) {
        ks[i] += k0;
        vs[i] += k0;
      }
      if constexpr (hwy::IsSame<T, float>()) {
        if (n_heads == 2) {
          const float* const q[2] = {ops.q, ops.q + kDecodeDim};
          const float* const kb[2] = {k[0] + at, k[1] + at};
          const float* const vb[2] = {v[0] + at, v[1] + at};
          float* const scs[2] = {sc[0], sc[1]};
          const float* const w[2] = {sc[0], sc[1]};
          float* const os[2] = {o[0], o[1]};
          ScoreRowPair(q, kb, kDecodeDim, kDecodeBlock, kDecodeDim, scs);
          AccumulateRowPair(w, vb, kDecodeDim, kDecodeBlock, kDecodeDim, os);
          continue;
        }
      }
      // NarrowTiles' prefetches and kernels.
      const T* vp = prefetch.values ? v[0] + at : nullptr;
      const bool next = prefetch.next_keys && k0 + kDecodeBlock < kDecodeKeys;
      const T* next_k = next ? k[0] + at + kDecodeBlock * kDecodeDim : nullptr;
      const size_t next_n = next ? kDecodeBlock : 0;
      if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
        if (ops.compute == 1) {
          ScoreRowsBF16(ops.q, kDecodeDim, rows, k[0] + at, kDecodeDim,
                        kDecodeBlock, kDecodeDim, vp, kDecodeDim, sc[0],
                        kDecodeBlock, ops.native_bf16);
          AccumulateRowsBF16(sc[0], kDecodeBlock, rows, v[0] + at, kDecodeDim,
                             kDecodeBlock, kDecodeDim, o[0], kDecodeDim, next_k,
                             kDecodeDim, next_n, ops.native_bf16);
          continue;
        }
      }
      if constexpr (hwy::IsSame<T, int8_t>()) {
        if (ops.compute == 2) {
          ScoreRowsInt8(ops.q, kDecodeDim, rows, k[0] + at, kDecodeDim, ks[0],
                        kDecodeBlock, kDecodeDim, vp, kDecodeDim, sc[0],
                        kDecodeBlock);
          AccumulateRowsInt8(sc[0], kDecodeBlock, rows, v[0] + at, kDecodeDim,
                             vs[0], kDecodeBlock, kDecodeDim, o[0], kDecodeDim,
                             next_k, kDecodeDim, next_n);
          continue;
        }
      }
      ScoreRows(ops.q, kDecodeDim, rows, k[0] + at, kDecodeDim, ks[0],
                kDecodeBlock, kDecodeDim, vp, kDecodeDim, sc[0], kDecodeBlock);
      AccumulateRows(sc[0], kDecodeBlock, rows, v[0] + at, kDecodeDim, vs[0],
                     kDecodeBlock, kDecodeDim, o[0], kDecodeDim, next_k,
                     kDecodeDim, next_n);
    }
    result += o[0][0] + o[1][0];
  }
  return result;
}

float StreamF32T(const DecodeOperands& ops, size_t rows, size_t begin,
                 size_t end) {
  return StreamHeads<float>(ops, rows, begin, end);
}
float StreamBF16T(const DecodeOperands& ops, size_t rows, size_t begin,
                  size_t end) {
  return StreamHeads<hwy::bfloat16_t>(ops, rows, begin, end);
}
float StreamF16T(const DecodeOperands& ops, size_t rows, size_t begin,
                 size_t end) {
  return StreamHeads<hwy::float16_t>(ops, rows, begin, end);
}
float StreamI8T(const DecodeOperands& ops, size_t rows, size_t begin,
                size_t end) {
  return StreamHeads<int8_t>(ops, rows, begin, end);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headway {
namespace bench {
HWY_EXPORT(StreamF32T);
HWY_EXPORT(StreamBF16T);
HWY_EXPORT(StreamF16T);
HWY_EXPORT(StreamI8T);
namespace {

// Stored K and V of one type, filled once per run: 4096 distinct random rows
// repeated (filling 2 x 64 Mi elements row by row would dominate the run).
struct StoredKv {
  BufferPtr<uint8_t> k, v;
  std::vector<float> k_scales, v_scales;
  BufferPtr<float> q;
  BufferPtr<float> q_levels;  // q's int8 levels (q * 127 / 0.05, rounded)
};

template <class T>
const StoredKv& SharedKv() {
  static const StoredKv kv = [] {
    StoredKv s;
    const size_t rows = kDecodeHeads * kDecodeKeys;
    const size_t bytes = rows * kDecodeDim * sizeof(T);
    s.k = AllocateBuffer<uint8_t>(bytes);
    s.v = AllocateBuffer<uint8_t>(bytes);
    const bool scaled = internal::kKvScaled<T>;
    if (scaled) {
      s.k_scales.resize(rows);
      s.v_scales.resize(rows);
    }
    constexpr size_t kPool = 4096;
    std::vector<float> pool(kPool * kDecodeDim);
    FillUniform(pool.data(), pool.size(), -1.0f, 1.0f, /*seed=*/11);
    T* k = reinterpret_cast<T*>(s.k.get());
    T* v = reinterpret_cast<T*>(s.v.get());
    for (size_t r = 0; r < rows; ++r) {
      const float* src = pool.data() + (r % kPool) * kDecodeDim;
      const float* src_v = pool.data() + ((r + 7) % kPool) * kDecodeDim;
      float scale = 1.0f;
      internal::StoreRow(src, kDecodeDim, k + r * kDecodeDim, &scale);
      if (scaled) s.k_scales[r] = scale;
      internal::StoreRow(src_v, kDecodeDim, v + r * kDecodeDim, &scale);
      if (scaled) s.v_scales[r] = scale;
    }
    s.q = AllocateBuffer<float>(kDecodeMaxRows * kDecodeDim);
    FillUniform(s.q.get(), kDecodeMaxRows * kDecodeDim, -0.05f, 0.05f,
                /*seed=*/12);
    s.q_levels = AllocateBuffer<float>(kDecodeMaxRows * kDecodeDim);
    for (size_t i = 0; i < kDecodeMaxRows * kDecodeDim; ++i) {
      s.q_levels.get()[i] = std::nearbyint(s.q.get()[i] * (127 / 0.05f));
    }
    return s;
  }();
  return kv;
}

template <class T>
void RunDecodeKernel(benchmark::State& state, const RunConfig& run,
                     int compute) {
  const size_t rows = static_cast<size_t>(state.range(0));
  const StoredKv& kv = SharedKv<T>();
  DecodeOperands ops;
  ops.k = kv.k.get();
  ops.v = kv.v.get();
  ops.k_scales = kv.k_scales.empty() ? nullptr : kv.k_scales.data();
  ops.v_scales = kv.v_scales.empty() ? nullptr : kv.v_scales.data();
  ops.compute = compute;
  ops.q = ops.compute == 2 ? kv.q_levels.get() : kv.q.get();
  ops.native_bf16 = NativeBFloat16Active();
  const auto step = [&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, kDecodeHeads, 1),
        [&](const tbb::blocked_range<size_t>& heads) {
          float out = 0.0f;
          if constexpr (sizeof(T) == 4) {
            out = HWY_DYNAMIC_DISPATCH(StreamF32T)(ops, rows, heads.begin(),
                                                   heads.end());
          } else if constexpr (sizeof(T) == 1) {
            out = HWY_DYNAMIC_DISPATCH(StreamI8T)(ops, rows, heads.begin(),
                                                  heads.end());
          } else if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
            out = HWY_DYNAMIC_DISPATCH(StreamBF16T)(ops, rows, heads.begin(),
                                                    heads.end());
          } else {
            out = HWY_DYNAMIC_DISPATCH(StreamF16T)(ops, rows, heads.begin(),
                                                   heads.end());
          }
          benchmark::DoNotOptimize(out);
        });
    return Status::Ok();
  };
  if (!TimeSteps(state, step)) return;
  const double elements =
      static_cast<double>(kDecodeHeads * kDecodeKeys * kDecodeDim);
  const double scale_bytes =
      internal::kKvScaled<T> ? 2.0 * kDecodeHeads * kDecodeKeys * 4 : 0.0;
  ReportRoofline(state, 4.0 * static_cast<double>(rows) * elements,
                 2.0 * elements * sizeof(T) + scale_bytes, MemoryCeiling::kRead,
                 run.target, run.threads);
}

// Argument rows.
template <class T>
void BM_DecodeKernel(benchmark::State& state, const RunConfig& run) {
  RunDecodeKernel<T>(state, run, 0);
}

// Arguments rows and compute.
template <class T>
void BM_DecodeKernelCompute(benchmark::State& state, const RunConfig& run) {
  RunDecodeKernel<T>(state, run, static_cast<int>(state.range(1)));
}

void RegisterDecodeKernel() {
  const std::vector<std::vector<int64_t>> rows = {{1}, {4}};
  RegisterPerTarget("decode_kernel_f32", BM_DecodeKernel<float>, {"rows"}, rows,
                    2);
  RegisterPerTarget("decode_kernel_bf16", BM_DecodeKernel<hwy::bfloat16_t>,
                    {"rows"}, rows, 2);
  RegisterPerTarget("decode_kernel_f16", BM_DecodeKernel<hwy::float16_t>,
                    {"rows"}, rows, 2);
  RegisterPerTarget("decode_kernel_int8", BM_DecodeKernel<int8_t>, {"rows"},
                    rows, 2);
  // The compute modes' kernels on the key targets.
  RegisterPerTarget("decode_kernel_bf16",
                    BM_DecodeKernelCompute<hwy::bfloat16_t>,
                    {"rows", "compute"}, {{4, 1}}, 0);
  RegisterPerTarget("decode_kernel_int8", BM_DecodeKernelCompute<int8_t>,
                    {"rows", "compute"}, {{1, 2}, {4, 2}}, 0);
}
HEADWAY_REGISTER_BENCHMARKS(RegisterDecodeKernel);

}  // namespace
}  // namespace bench
}  // namespace headway
#endif  // HWY_ONCE

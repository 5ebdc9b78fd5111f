// The decode kernels of the narrow attention tiles (fewer query rows than
// lanes: decode of MHA and small GQA groups) on K and V rows in their stored
// type: the scores of a key block and the weighted sum of its V rows. Decode
// is bound by reading K and V; these stream each stored row once for all query
// rows. Per target, for the four stored types (storage.h's KvStored), compiled
// once in decode.cc (tiles: decode-inl.h) and called by attention-inl.h's
// NarrowTiles, decode_test and decode_bench.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_ATTENTION_DECODE_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ATTENTION_DECODE_H_
#undef HEADWAY_LIB_ATTENTION_DECODE_H_
#else
#define HEADWAY_LIB_ATTENTION_DECODE_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include "headway/kv_cache.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// The head dims whose one-row scores (ScoreRows with rows = 1, ScoreRowPair)
// run their loop over dim unrolled in full; the others loop at run time, the
// same FMAs either way. MHA decode, dim 128, one thread: f16 1.07x, int8
// 1.03x, bf16 and float32 1.00-1.02x (bench, alternating processes); the
// tiles of several rows keep the loop (GQA-8 unrolled: 0.90-0.93x).
inline constexpr size_t kUnrolledDims[] = {64, 128};

// Scores of `rows` query rows against n stored key rows:
//   sc[r * sc_stride + s] = k_scale(s) * sum_{p < dim} q[r * q_stride + p] *
//                           K(s, p)
// for r < rows, s < n, with K(s, p) = LoadStored(k + s * k_stride + p) and
// k_scale(s) = k_scales[s] for int8 (not null), 1 for the other types (null).
// dim is a multiple of the vector length (rows zero-padded), q and k rows
// aligned; sc[.., n) only is written. Keys go 4 at a time (8 for one row, the
// last n % 4 one by one), each K vector converted once per 4 rows (ScoreKeys).
// One row reads K in T's pair order (LoadStoredPair, storage-inl.h) against q
// put in that order, where it permutes and dim <= kMaxPairOrderDim (q's
// stack copy), and at a dim of kUnrolledDims unrolls its loop over dim.
// Error: float32 sums in a target-dependent order, at most (dim + 1) u sum_p |q
// K k_scale| (u = 2^-24). v (may be null) are the same keys' V rows, stride
// v_stride: with v, K rows 16 keys ahead and the V rows are prefetched into L2
// as the keys go by (KeyPrefetch). Callers pass v as DecodePrefetch says.
inline constexpr size_t kMaxPairOrderDim = 512;
template <class T>
void ScoreRows(const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
               const T* HWY_RESTRICT k, size_t k_stride,
               const float* HWY_RESTRICT k_scales, size_t n, size_t dim,
               const T* HWY_RESTRICT v, size_t v_stride, float* HWY_RESTRICT sc,
               size_t sc_stride);

// The weighted sum of n stored V rows into `rows` output rows:
//   o[r * o_stride + p] += sum_{s < n} w[r * w_stride + s] * v_scale(s) *
//                          V(s, p)
// for r < rows, p < dim, with V(s, p) = LoadStored(v + s * v_stride + p) and
// v_scale(s) = v_scales[s] for int8 (not null), 1 for the other types (null).
// dim is a multiple of the vector length, o and v rows aligned; o[.., dim) only
// is written. Each element is one FMA chain in key order. Error: at most (n +
// 2) u (|o| + sum_s |w v_scale V|). next_k (may be null) are the next key
// block's next_n K rows, stride next_k_stride: prefetched one per key as the
// keys go by, so that memory streams while V is summed from cache (ScoreRows
// with v streams the other half). Callers pass next_k as DecodePrefetch says.
template <class T>
void AccumulateRows(const float* HWY_RESTRICT w, size_t w_stride, size_t rows,
                    const T* HWY_RESTRICT v, size_t v_stride,
                    const float* HWY_RESTRICT v_scales, size_t n, size_t dim,
                    float* HWY_RESTRICT o, size_t o_stride,
                    const T* HWY_RESTRICT next_k, size_t next_k_stride,
                    size_t next_n);

// ScoreRows and AccumulateRows for one query row of each of two KV heads of a
// float32 cache, side by side: index h < 2 is head h's query q[h], stored rows
// k[h] / v[h] (stride `stride`), scores sc[h] and output o[h]. The same
// operations per head as ScoreRows and AccumulateRows with rows = 1
// (bit-identical results), with the two heads' rows read alternately, key by
// key: two memory streams, where one head's rows are one: MHA decode at 16384
// keys 1.03-1.09x faster than one head at a time (AVX3_DL, Zen 5, 1 and 2
// threads, in-process interleaved calls).
void ScoreRowPair(const float* const q[2], const float* const k[2],
                  size_t stride, size_t n, size_t dim, float* const sc[2]);
void AccumulateRowPair(const float* const w[2], const float* const v[2],
                       size_t stride, size_t n, size_t dim, float* const o[2]);

// ScoreRows and AccumulateRows on a bf16 cache for AttentionCompute::kBFloat16:
// q and w hold bf16 values (the caller rounds them: RoundToBF16), so that each
// product is exact. With native (NativeBFloat16Active, asked once per call; a
// target without vdpbf16ps ignores it), pairs of products go through
// vdpbf16ps, up to 16 rows and dim <= kMaxBF16PairDim; otherwise (and beyond)
// ScoreRows and AccumulateRows run on the same values. The same arguments,
// results and error bounds: vdpbf16ps rounds once per addition, as an FMA
// chain does, in another order (and reads denormals as 0: at most 2^-126 per
// product). Native scores: 4 rows x 4 keys per tile (then 2 and 1 rows),
// 16 vdpbf16ps per key where ScoreRows has 32 FMAs and 8 conversions; native
// sums: pairs of keys, two V rows interleaved per 32 columns (the
// accumulators hold the columns block-permuted, restored at each store).
inline constexpr size_t kMaxBF16PairDim = 512;
void ScoreRowsBF16(const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
                   const hwy::bfloat16_t* HWY_RESTRICT k, size_t k_stride,
                   size_t n, size_t dim, const hwy::bfloat16_t* HWY_RESTRICT v,
                   size_t v_stride, float* HWY_RESTRICT sc, size_t sc_stride,
                   bool native);
void AccumulateRowsBF16(const float* HWY_RESTRICT w, size_t w_stride,
                        size_t rows, const hwy::bfloat16_t* HWY_RESTRICT v,
                        size_t v_stride, size_t n, size_t dim,
                        float* HWY_RESTRICT o, size_t o_stride,
                        const hwy::bfloat16_t* HWY_RESTRICT next_k,
                        size_t next_k_stride, size_t next_n, bool native);

// ScoreRows on an int8 cache for AttentionCompute::kInt8: q holds integers
// in [-127, 127] (the caller quantizes them: Int8Levels), so each product is
// an integer and, for dim <= kMaxInt8ProductDim, each sum too: sc[r, s] =
// k_scales[s] * the exact integer dot product, rounded once, the same bits
// on every target. On AVX3_DL (whose CPUs have AVX512_VNNI), up to 16 rows
// by vpdpbusd, 64 products per instruction: K xor 0x80 as unsigned bytes
// times q as signed ones, minus 128 sum_p q; elsewhere, and for more rows or
// a longer dim, ScoreRows on the same values (in float32, whose sums of
// integers are exact below 2^24: dim <= 1040). Tiles of 4 rows x 4 keys (8
// keys for one row), reduced as ScoreTile's; the prefetches as ScoreRows'.
inline constexpr size_t kMaxInt8ProductDim = 1024;
void ScoreRowsInt8(const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
                   const int8_t* HWY_RESTRICT k, size_t k_stride,
                   const float* HWY_RESTRICT k_scales, size_t n, size_t dim,
                   const int8_t* HWY_RESTRICT v, size_t v_stride,
                   float* HWY_RESTRICT sc, size_t sc_stride);

// AccumulateRows on an int8 cache for AttentionCompute::kInt8: per row and
// chunk of 128 keys, the weights times the V scales (rounded once) are
// quantized to integer levels in [-16384, 16384] with a power-of-two step
// sigma (QuantizeWeights, decode-inl.h: each moves by at most 2^-14 of the
// chunk's largest magnitude, or 2^-127), and o += sigma * sum_s level_s * V(s,
// p) over the stored int8 V. On AVX3_DL by vpdpwssd, pairs of keys per
// instruction (the levels and V as int16), the sums exact in int32 and rounded
// once to float; elsewhere AccumulateRows' float32 FMAs on sigma * level (exact
// values). The same arguments and prefetches as AccumulateRows; error beyond
// the quantization: at most (n + 2) u (|o| + sum_s |sigma level_s V(s, p)|).
void AccumulateRowsInt8(const float* HWY_RESTRICT w, size_t w_stride,
                        size_t rows, const int8_t* HWY_RESTRICT v,
                        size_t v_stride, const float* HWY_RESTRICT v_scales,
                        size_t n, size_t dim, float* HWY_RESTRICT o,
                        size_t o_stride, const int8_t* HWY_RESTRICT next_k,
                        size_t next_k_stride, size_t next_n);

// Whether narrow tiles of `rows` query rows over a cache of `dtype` run in
// pairs of KV heads (ScoreRowPair, AccumulateRowPair): one row (MHA decode)
// of float32. The other types run one head at a time: bf16 and f16 MHA decode
// at 16384 keys ran 1.10-1.15x (one thread) and 1.02-1.11x (two) faster so,
// with the next key block's K prefetched as V is summed, than in pairs with
// each stream's row prefetched 16 keys ahead, and 0.84-0.88x in pairs with
// both prefetches; int8 pairs ran 10-25% slower (AVX3_DL, Zen 5, in-process
// interleaved calls; docs/BENCHMARKS.md).
inline bool DecodeInPairs(KvDtype dtype, size_t rows) {
  return rows == 1 && dtype == KvDtype::kFloat32;
}

// Which prefetches a key block's ScoreRows and AccumulateRows issue for `rows`
// query rows over stored type T (NarrowTiles and decode_bench ask here):
// - values: ScoreRows gets the block's V rows where the arithmetic per byte
//   lets the hardware prefetchers fall behind: several rows, and one row of
//   int8 (a conversion and an FMA per byte). GQA-8 decode at 16384 keys ran
//   1.3x (float32) to 1.7x (bf16, f16) faster with these prefetches and
//   next_keys than without; int8 MHA decode at one thread read 77-93% of the
//   run's read ceiling against 55-84% without (6 alternating runs, Zen 4; two
//   threads within noise); one row of the other types does without, where
//   they cost 4-9% (bf16 and f16 MHA on Zen 5: 0.99-1.04x, not taken).
// - next_keys: AccumulateRows gets the next block's K rows, wherever values
//   are prefetched, and for one row of a 16-bit type: bf16 and f16 MHA
//   decode ran 1.22-1.29x faster with them (Zen 5; 1.25-1.35x on Zen 4),
//   float32 4-20% slower, int8 without values 0.8x. Pairs take neither.
// (AVX3_DL, in-process interleaved runs unless said.)
struct DecodePrefetch {
  bool values;
  bool next_keys;
};
template <class T>
HWY_INLINE constexpr DecodePrefetch DecodePrefetchFor(size_t rows) {
  const bool values = rows > 1 || sizeof(T) == 1;
  return {values, values || sizeof(T) == 2};
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_DECODE_H_

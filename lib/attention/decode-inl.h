// The tiles of the decode kernels ScoreRows and AccumulateRows (decode.h),
// on K and V rows in their stored type (LoadStored, storage-inl.h). Included
// by decode.cc alone, which compiles them once per target and stored type.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_ATTENTION_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ATTENTION_DECODE_INL_H_
#undef HEADWAY_LIB_ATTENTION_DECODE_INL_H_
#else
#define HEADWAY_LIB_ATTENTION_DECODE_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "lib/attention/decode.h"
#include "lib/core/blocks.h"
#include "lib/core/native_dot-inl.h"
#include "lib/core/storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Hints the 64-byte lines of `count` consecutive stored rows from row `first`
// of `base` on (rows `stride` elements apart, padding included: the cache pads
// rows by under 16 elements), one line per prefetch, into L2
// (prefetcht1 on x86): GQA-8 decode at 16384 keys read bf16 and f16 1.4x
// faster than with prefetcht0, whose lines hold L1's miss buffers (AVX3_DL,
// one thread, in-process interleaved runs). The rows may lie past the cache:
// prefetches never fault, and their addresses are computed as integers, so no
// pointer past the buffer is formed.
template <class T>
HWY_INLINE void PrefetchStoredRows(const T* base, size_t first, size_t count,
                                   size_t stride) {
  const uintptr_t start =
      reinterpret_cast<uintptr_t>(base) + first * stride * sizeof(T);
  const size_t size = count * stride * sizeof(T);
  // At most two lines (int8 up to head_dim 128, 16-bit up to 64): no loop
  // control, MHA decode at 16384 keys 1.07x (int8, dim 128) to 1.31x (dim 64).
  if (size <= 128) {
    __builtin_prefetch(reinterpret_cast<const void*>(start), /*rw=*/0,
                       /*locality=*/2);
    if (size > 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(start + 64), /*rw=*/0,
                         /*locality=*/2);
    }
    return;
  }
  HWY_UNROLL(4)
  for (size_t b = 0; b < size; b += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(start + b), /*rw=*/0,
                       /*locality=*/2);
  }
}

// The prefetch of one stored row per call: row first + j of `rows` at call j
// (`stride` elements apart), every line (float32 too: into L2, its whole rows
// ran as fast as first lines alone). Empty (rows null): none.
template <class T>
struct RowPrefetch {
  const T* rows = nullptr;
  size_t first = 0;
  size_t stride = 0;
  HWY_INLINE void operator()(size_t j) const {
    PrefetchStoredRows(rows, first + j, 1, stride);
  }
  RowPrefetch Skip(size_t j) const { return {rows, first + j, stride}; }
};

// The prefetches of a tile of keys, spread key by key: K rows 16 keys ahead of
// key j and V row j. Key by key rather than a burst per tile: a burst of 4 K
// and 4 V rows (64 lines) made GQA-8 float32 decode 1.2x slower (AVX-512, one
// thread). Empty (k.rows null): none.
template <class T>
struct KeyPrefetch {
  RowPrefetch<T> k;  // K row 16 keys past the tile's first
  RowPrefetch<T> v;  // the tile's first V row
  HWY_INLINE void operator()(size_t j) const {
    if (k.rows == nullptr) return;
    k(j);
    v(j);
  }
  // The prefetches of the keys from s on in ScoreRows' key loop: none without
  // v (the callers that leave the V rows to the hardware).
  static KeyPrefetch At(const T* k, size_t k_stride, const T* v,
                        size_t v_stride, size_t s) {
    if (v == nullptr) return KeyPrefetch();
    return {{k, s + 16, k_stride}, {v, s, v_stride}};
  }
  // The same prefetches for the keys from j on.
  KeyPrefetch Skip(size_t j) const {
    return k.rows == nullptr ? KeyPrefetch()
                             : KeyPrefetch{k.Skip(j), v.Skip(j)};
  }
};

#if HWY_TARGET != HWY_SCALAR
// The sum of v's 128-bit blocks.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<hn::TFromD<D>>> SumOfBlocks(D d, hn::Vec<D> v) {
  (void)d;
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return SumOfBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}

// {sum of a's lanes, b's, c's, e's} (float or int32 lanes): a transpose-add
// tree, 9 shuffles and adds for the 128-bit blocks plus an extract and an add
// per halving of a wider vector (13 on AVX-512), where four SumOfLanes take
// about 4 x 2 log2(lanes) (32 on AVX-512) and leave the sums in four vectors.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<hn::TFromD<D>>> SumsOf4(D d, hn::Vec<D> a,
                                                       hn::Vec<D> b,
                                                       hn::Vec<D> c,
                                                       hn::Vec<D> e) {
  const hn::RepartitionToWide<D> d64;
  // Per block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] and the same for c, e.
  const auto ab =
      hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const auto ce =
      hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  // Per block: [a, b, c, e] summed over the block.
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  const auto sums =
      hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab64, ce64)),
              hn::BitCast(d, hn::InterleaveUpper(d64, ab64, ce64)));
  return SumOfBlocks(d, sums);
}
#endif  // HWY_TARGET != HWY_SCALAR

// f(std::integral_constant<size_t, kDim>()): kDim = dim where dim is one of
// kUnrolledDims (decode.h), else 0.
template <size_t kIndex = 0, class F>
HWY_INLINE void WithUnrolledDim(size_t dim, const F& f) {
  constexpr size_t kCount = sizeof(kUnrolledDims) / sizeof(kUnrolledDims[0]);
  if constexpr (kIndex == kCount) {
    f(std::integral_constant<size_t, 0>());
  } else if (dim == kUnrolledDims[kIndex]) {
    f(std::integral_constant<size_t, kUnrolledDims[kIndex]>());
  } else {
    WithUnrolledDim<kIndex + 1>(dim, f);
  }
}

// Calls f(std::integral_constant<size_t, W>(), j) over the `count` columns
// (vectors, or chunks of them) of a row, each call a tile of W columns from
// column j that makes one pass over the keys: W = kW while kW columns are
// left, then the rest in at most one tile each of 8, 4, 2 and 1 (those below
// kW). A row of 4 vectors (head_dim 64 on AVX-512) under kW = 8 is one pass of
// 4, not 4 passes of 1: MHA decode at dim 64 1.40-1.49x (bf16, f16, int8) and
// 1.18x (float32), one thread, call by call.
template <size_t kW, class F>
HWY_INLINE void ForColumnTiles(size_t count, const F& f) {
  static_assert(kW == 1 || kW == 2 || kW == 4 || kW == 8 || kW == 16,
                "tile widths");
  size_t j = 0;
  for (; j + kW <= count; j += kW) f(std::integral_constant<size_t, kW>(), j);
  if constexpr (kW > 8) {
    if (j + 8 <= count) {
      f(std::integral_constant<size_t, 8>(), j);
      j += 8;
    }
  }
  if constexpr (kW > 4) {
    if (j + 4 <= count) {
      f(std::integral_constant<size_t, 4>(), j);
      j += 4;
    }
  }
  if constexpr (kW > 2) {
    if (j + 2 <= count) {
      f(std::integral_constant<size_t, 2>(), j);
      j += 2;
    }
  }
  if constexpr (kW > 1) {
    if (j < count) f(std::integral_constant<size_t, 1>(), j);
  }
}

// One query row's products with one stored key row, as every one-row tile
// takes them: two FMA chains along dim (even and odd vectors), added; the
// sum of the lanes is the score (dim a multiple of the vector length). kPairs:
// q holds each whole 2N-element chunk in T's pair order (StoreInPairOrder),
// and K is read by LoadStoredPair; else both in the natural order (the same
// FMAs where T's pair order is the natural one). kDim: 0, or dim, whose loop
// is then unrolled (WithUnrolledDim); the same FMAs either way.
template <bool kPairs, size_t kDim = 0, class D, class T>
HWY_INLINE hn::Vec<D> OneRowKeyDot(D d, const float* HWY_RESTRICT q,
                                   const T* HWY_RESTRICT k_row,
                                   size_t dim_arg) {
  const size_t N = hn::Lanes(d);
  const size_t dim = kDim != 0 ? kDim : dim_arg;
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  const auto products = [&](size_t p) HWY_ATTR {
    hn::Vec<D> k0, k1;
    if constexpr (kPairs) {
      LoadStoredPair(d, k_row + p, k0, k1);
    } else {
      k0 = LoadStored(d, k_row + p);
      k1 = LoadStored(d, k_row + p + N);
    }
    acc0 = hn::MulAdd(hn::Load(d, q + p), k0, acc0);
    acc1 = hn::MulAdd(hn::Load(d, q + p + N), k1, acc1);
  };
  size_t p = 0;
  if constexpr (kDim != 0) {
    HWY_UNROLL(16)
    for (; p + 2 * N <= dim; p += 2 * N) products(p);
  } else {
    for (; p + 2 * N <= dim; p += 2 * N) products(p);
  }
  if (p < dim) {
    acc0 = hn::MulAdd(hn::Load(d, q + p), LoadStored(d, k_row + p), acc0);
  }
  return hn::Add(acc0, acc1);
}

// One query row's score against one stored key row: OneRowKeyDot's lanes
// summed.
template <bool kPairs, size_t kDim = 0, class T>
HWY_INLINE float OneRowKeyScore(const float* HWY_RESTRICT q,
                                const T* HWY_RESTRICT k_row, size_t dim) {
  const hn::ScalableTag<float> d;
  return hn::GetLane(
      hn::SumOfLanes(d, OneRowKeyDot<kPairs, kDim>(d, q, k_row, dim)));
}

// Stores the scores of 4 consecutive keys from their lane vectors acc[0, 4)
// (times k_scales[0, 4) with kScaled) at sc[0, 4).
template <bool kScaled, class D>
HWY_INLINE void StoreKeyScores4(D d, const hn::Vec<D>* acc,
                                const float* HWY_RESTRICT k_scales,
                                float* HWY_RESTRICT sc) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  for (size_t j = 0; j < 4; ++j) {
    float score = hn::GetLane(acc[j]);
    if constexpr (kScaled) score *= k_scales[j];
    sc[j] = score;
  }
#else
  const hn::Full128<float> d4;
  auto scores = SumsOf4(d, acc[0], acc[1], acc[2], acc[3]);
  if constexpr (kScaled) scores = hn::Mul(scores, hn::LoadU(d4, k_scales));
  hn::StoreU(scores, d4, sc);
#endif
}

// v, opaque to the compiler, so that it stays in a register: GCC 12 would
// otherwise re-load a q vector at each of its FMAs (a memory operand).
template <class V>
HWY_INLINE V KeepInRegister(V v) {
#if HWY_TARGET <= HWY_AVX3
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// Whether ScoreTile runs dim outer, keys inner: 4 x 4 tiles on AVX-512 (16
// sums, 8 q and 2 K vectors of 32 registers), which load 8 q vectors per key,
// not 32: GQA-8 decode at 16384 keys 2-12% faster (AVX3_DL, one thread).
template <size_t kRows, size_t kKeys>
inline constexpr bool kDimOuter =
    (HWY_TARGET <= HWY_AVX3) && kRows == 4 && kKeys == 4;

// Scores of kRows query rows against kKeys (a multiple of 4) consecutive keys:
// kRows x kKeys accumulators along dim, each K vector converted once for all
// rows, then reduced 4 keys at a time (SumsOf4) and stored as one vector per
// row: sc[r * sc_stride + j] for r < kRows, j < kKeys. One row: kPairs and
// kDim as OneRowKeyDot's.
template <size_t kRows, size_t kKeys, bool kScaled, bool kPairs = false,
          size_t kDim = 0, class T>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT q, size_t q_stride,
                          const T* HWY_RESTRICT k, size_t k_stride,
                          const float* HWY_RESTRICT k_scales, size_t dim,
                          float* HWY_RESTRICT sc, size_t sc_stride,
                          const KeyPrefetch<T>& prefetch) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc[kRows][kKeys];
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) acc[r][j] = hn::Zero(d);
  }
  if constexpr (kRows == 1) {
    // Key by key, each row read front to back: one ascending stream for the
    // hardware prefetchers (reading the kKeys rows side by side ran a third
    // slower, float32 and bf16 on AVX-512, one thread).
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) {
      prefetch(j);
      acc[0][j] = OneRowKeyDot<kPairs, kDim>(d, q, k + j * k_stride, dim);
    }
  } else if constexpr (kDimOuter<kRows, kKeys>) {
    // Two vectors of dim at a time: each row's q vectors once for the kKeys
    // keys, the keys' prefetches one per step. The same FMAs, in the same
    // order per accumulator, as the key-outer loop below.
    size_t p = 0, fetched = 0;
    for (; p + 2 * N <= dim; p += 2 * N) {
      if (fetched < kKeys) prefetch(fetched++);
      hn::Vec<decltype(d)> q0[kRows], q1[kRows];
      HWY_UNROLL(8)
      for (size_t r = 0; r < kRows; ++r) {
        q0[r] = KeepInRegister(hn::Load(d, q + r * q_stride + p));
        q1[r] = KeepInRegister(hn::Load(d, q + r * q_stride + p + N));
      }
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; ++j) {
        const auto k0 = LoadStored(d, k + j * k_stride + p);
        const auto k1 = LoadStored(d, k + j * k_stride + p + N);
        HWY_UNROLL(8)
        for (size_t r = 0; r < kRows; ++r) {
          acc[r][j] = hn::MulAdd(q0[r], k0, acc[r][j]);
          acc[r][j] = hn::MulAdd(q1[r], k1, acc[r][j]);
        }
      }
    }
    for (; fetched < kKeys; ++fetched) prefetch(fetched);
    if (p < dim) {
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; ++j) {
        const auto k0 = LoadStored(d, k + j * k_stride + p);
        HWY_UNROLL(8)
        for (size_t r = 0; r < kRows; ++r) {
          acc[r][j] =
              hn::MulAdd(hn::Load(d, q + r * q_stride + p), k0, acc[r][j]);
        }
      }
    }
  } else {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) {
      prefetch(j);
      const T* k_row = k + j * k_stride;
      // Unrolled: 3% fewer instructions per key (AVX2, 4 rows, float32).
      HWY_UNROLL(2)
      for (size_t p = 0; p < dim; p += N) {
        const auto kv = LoadStored(d, k_row + p);
        HWY_UNROLL(8)
        for (size_t r = 0; r < kRows; ++r) {
          acc[r][j] =
              hn::MulAdd(hn::Load(d, q + r * q_stride + p), kv, acc[r][j]);
        }
      }
    }
  }
#if HWY_TARGET == HWY_SCALAR
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) {
      float score = hn::GetLane(acc[r][j]);
      if constexpr (kScaled) score *= k_scales[j];
      sc[r * sc_stride + j] = score;
    }
  }
#else
  if constexpr (kKeys % 4 == 0) {
    HWY_UNROLL(8)
    for (size_t r = 0; r < kRows; ++r) {
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; j += 4) {
        StoreKeyScores4<kScaled>(d, acc[r] + j, k_scales + (kScaled ? j : 0),
                                 sc + r * sc_stride + j);
      }
    }
  } else {
    // Two keys: rows in pairs, {r: 2 scores, r + 1: 2 scores} per SumsOf4.
    static_assert(kKeys == 2 && kRows % 2 == 0, "2 keys x pairs of rows");
    const hn::Full64<float> d2;
    HWY_UNROLL(8)
    for (size_t r = 0; r < kRows; r += 2) {
      const auto scores =
          SumsOf4(d, acc[r][0], acc[r][1], acc[r + 1][0], acc[r + 1][1]);
      auto lower = hn::LowerHalf(d2, scores);
      auto upper = hn::UpperHalf(d2, scores);
      if constexpr (kScaled) {
        const auto scales = hn::LoadU(d2, k_scales);
        lower = hn::Mul(lower, scales);
        upper = hn::Mul(upper, scales);
      }
      hn::StoreU(lower, d2, sc + r * sc_stride);
      hn::StoreU(upper, d2, sc + (r + 1) * sc_stride);
    }
  }
#endif
}

// Every row's scores against 4 keys. On AVX-512 (32 registers), tiles of 4
// rows x 4 keys (16 accumulators); elsewhere (16 registers) 4 rows x 2 keys
// twice, then 2 x 4 (8 accumulators): each K vector is converted once per 4
// rows. The first tile over each key issues its prefetches.
template <bool kScaled, class T>
HWY_INLINE void ScoreKeys(const float* HWY_RESTRICT q, size_t q_stride,
                          size_t rows, const T* HWY_RESTRICT k, size_t k_stride,
                          const float* HWY_RESTRICT k_scales, size_t dim,
                          float* HWY_RESTRICT sc, size_t sc_stride,
                          KeyPrefetch<T> prefetch) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* q_rows = q + r * q_stride;
    float* sc_rows = sc + r * sc_stride;
#if HWY_TARGET <= HWY_AVX3
    ScoreTile<4, 4, kScaled>(q_rows, q_stride, k, k_stride, k_scales, dim,
                             sc_rows, sc_stride, prefetch);
#else
    ScoreTile<4, 2, kScaled>(q_rows, q_stride, k, k_stride, k_scales, dim,
                             sc_rows, sc_stride, prefetch);
    ScoreTile<4, 2, kScaled>(q_rows, q_stride, k + 2 * k_stride, k_stride,
                             k_scales + (kScaled ? 2 : 0), dim, sc_rows + 2,
                             sc_stride, prefetch.Skip(2));
#endif
    prefetch = KeyPrefetch<T>();
  }
  switch (rows - r) {
    case 3:
      ScoreTile<2, 4, kScaled>(q + r * q_stride, q_stride, k, k_stride,
                               k_scales, dim, sc + r * sc_stride, sc_stride,
                               prefetch);
      prefetch = KeyPrefetch<T>();
      r += 2;
      [[fallthrough]];
    case 1:
      ScoreTile<1, 4, kScaled>(q + r * q_stride, q_stride, k, k_stride,
                               k_scales, dim, sc + r * sc_stride, sc_stride,
                               prefetch);
      break;
    case 2:
      ScoreTile<2, 4, kScaled>(q + r * q_stride, q_stride, k, k_stride,
                               k_scales, dim, sc + r * sc_stride, sc_stride,
                               prefetch);
      break;
    default:
      break;
  }
}

// ScoreRows for one query row: tiles of 8 keys (8 accumulators cover the FMA
// latency), then one of 4, then key by key, every key by OneRowKeyDot<kPairs,
// kDim> (q in T's pair order with kPairs).
template <bool kScaled, bool kPairs, size_t kDim, class T>
HWY_INLINE void ScoreOneRow(const float* HWY_RESTRICT q,
                            const T* HWY_RESTRICT k, size_t k_stride,
                            const float* HWY_RESTRICT k_scales, size_t n,
                            size_t dim, const T* HWY_RESTRICT v,
                            size_t v_stride, float* HWY_RESTRICT sc) {
  // The prefetches of keys [s, ...): none without v.
  const auto prefetch_at = [&](size_t s) {
    return KeyPrefetch<T>::At(k, k_stride, v, v_stride, s);
  };
  size_t s = 0;
  for (; s + 8 <= n; s += 8) {
    ScoreTile<1, 8, kScaled, kPairs, kDim>(q, 0, k + s * k_stride, k_stride,
                                           k_scales + (kScaled ? s : 0), dim,
                                           sc + s, 0, prefetch_at(s));
  }
  if (s + 4 <= n) {
    ScoreTile<1, 4, kScaled, kPairs, kDim>(q, 0, k + s * k_stride, k_stride,
                                           k_scales + (kScaled ? s : 0), dim,
                                           sc + s, 0, prefetch_at(s));
    s += 4;
  }
  for (; s < n; ++s) {
    prefetch_at(s)(0);
    float score = OneRowKeyScore<kPairs, kDim>(q, k + s * k_stride, dim);
    if constexpr (kScaled) score *= k_scales[s];
    sc[s] = score;
  }
}

template <bool kScaled, class T>
HWY_INLINE void ScoreBlocks(const float* HWY_RESTRICT q, size_t q_stride,
                            size_t rows, const T* HWY_RESTRICT k,
                            size_t k_stride, const float* HWY_RESTRICT k_scales,
                            size_t n, size_t dim, const T* HWY_RESTRICT v,
                            size_t v_stride, float* HWY_RESTRICT sc,
                            size_t sc_stride) {
  if (rows == 1) {
    // K in T's pair order against q put in that order once here, where that
    // order permutes (bf16 on AVX-512) and q fits q_pairs.
    WithUnrolledDim(dim, [&](auto dim_tag) HWY_ATTR {
      constexpr size_t kDim = decltype(dim_tag)::value;
      const hn::ScalableTag<float> d;
      if constexpr (kPairOrderPermutes<T, decltype(d)>) {
        if (dim <= kMaxPairOrderDim) {
          HWY_ALIGN float q_pairs[kMaxPairOrderDim];
          StoreRowInPairOrder<T>(d, q, dim, q_pairs);
          ScoreOneRow<kScaled, true, kDim>(q_pairs, k, k_stride, k_scales, n,
                                           dim, v, v_stride, sc);
          return;
        }
      }
      ScoreOneRow<kScaled, false, kDim>(q, k, k_stride, k_scales, n, dim, v,
                                        v_stride, sc);
    });
    return;
  }
  // The prefetches of keys [s, ...): none without v.
  const auto prefetch_at = [&](size_t s) {
    return KeyPrefetch<T>::At(k, k_stride, v, v_stride, s);
  };
  constexpr size_t kKeys = 4;
  size_t s = 0;
  for (; s + kKeys <= n; s += kKeys) {
    ScoreKeys<kScaled>(q, q_stride, rows, k + s * k_stride, k_stride,
                       k_scales + (kScaled ? s : 0), dim, sc + s, sc_stride,
                       prefetch_at(s));
  }
  for (; s < n; ++s) {
    prefetch_at(s)(0);
    for (size_t r = 0; r < rows; ++r) {
      float score =
          OneRowKeyScore<false>(q + r * q_stride, k + s * k_stride, dim);
      if constexpr (kScaled) score *= k_scales[s];
      sc[r * sc_stride + s] = score;
    }
  }
}

// ScoreRows (decode.h).
template <class T>
void ScoreRows(const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
               const T* HWY_RESTRICT k, size_t k_stride,
               const float* HWY_RESTRICT k_scales, size_t n, size_t dim,
               const T* HWY_RESTRICT v, size_t v_stride, float* HWY_RESTRICT sc,
               size_t sc_stride) {
  // One instantiation per type: int8 always has scales, the others never.
  ScoreBlocks<internal::kKvScaled<T>>(q, q_stride, rows, k, k_stride, k_scales,
                                      n, dim, v, v_stride, sc, sc_stride);
}

// Keys [s, s + kKeys) of ScoreRowPair: each head's one-row tile, the two
// heads' K rows alternating key by key.
template <size_t kKeys, size_t kDim>
HWY_INLINE void ScorePairTile(const float* const q[2], const float* const k[2],
                              size_t stride, size_t s, size_t dim,
                              float* const sc[2]) {
  const hn::ScalableTag<float> d;
  hn::Vec<decltype(d)> acc[2][kKeys];
  HWY_UNROLL(8)
  for (size_t j = 0; j < kKeys; ++j) {
    HWY_UNROLL(2)
    for (size_t h = 0; h < 2; ++h) {
      acc[h][j] =
          OneRowKeyDot<false, kDim>(d, q[h], k[h] + (s + j) * stride, dim);
    }
  }
  HWY_UNROLL(2)
  for (size_t h = 0; h < 2; ++h) {
    HWY_UNROLL(2)
    for (size_t j = 0; j < kKeys; j += 4) {
      StoreKeyScores4<false>(d, acc[h] + j, nullptr, sc[h] + s + j);
    }
  }
}

// ScoreRowPair (decode.h): tiles of 8 keys per head on AVX-512 (16 sums of
// 32 registers), 4 elsewhere; the keys past the last tile head by head, as
// ScoreBlocks' one-row path takes them.
void ScoreRowPair(const float* const q[2], const float* const k[2],
                  size_t stride, size_t n, size_t dim, float* const sc[2]) {
  constexpr size_t kKeys = HWY_TARGET <= HWY_AVX3 ? 8 : 4;
  size_t s = 0;
  WithUnrolledDim(dim, [&](auto dim_tag) HWY_ATTR {
    for (; s + kKeys <= n; s += kKeys) {
      ScorePairTile<kKeys, decltype(dim_tag)::value>(q, k, stride, s, dim, sc);
    }
  });
  if (s == n) return;
  for (size_t h = 0; h < 2; ++h) {
    ScoreBlocks<false>(q[h], dim, 1, k[h] + s * stride, stride, nullptr, n - s,
                       dim, static_cast<const float*>(nullptr), 0, sc[h] + s,
                       n - s);
  }
}

// o[i][j] += sum_{s < n} w[i * w_stride + s] * V[s][j] for kI rows i and kJ
// vectors j: V[s][j] = LoadStored(v + s * v_stride + j * N), o[i][j] = o +
// i * o_stride + j * N. kI * kJ accumulators stay in registers for the whole
// key loop (8 of them cover the FMA latency of two pipes x 4 cycles); each V
// vector is converted once for the kI rows. At key s < next_n, next(s).
template <size_t kI, size_t kJ, class T>
HWY_INLINE void AccumulateTile(const float* HWY_RESTRICT w, size_t w_stride,
                               const T* HWY_RESTRICT v, size_t v_stride,
                               size_t n, float* HWY_RESTRICT o, size_t o_stride,
                               RowPrefetch<T> next, size_t next_n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc[kI][kJ];
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      acc[i][j] = hn::Load(d, o + i * o_stride + j * N);
    }
  }
  // Unrolled: 5% fewer instructions (AVX2, 4 rows: 8 passes per key).
  HWY_UNROLL(2)
  for (size_t s = 0; s < n; ++s) {
    if (s < next_n) next(s);
    if constexpr (kI == 1) {
      // Each V vector converted just before its FMA: loading all kJ first
      // spills an accumulator on 16-register targets.
      const auto w0 = hn::Set(d, w[s]);
      HWY_UNROLL(8)
      for (size_t j = 0; j < kJ; ++j) {
        acc[0][j] =
            hn::MulAdd(w0, LoadStored(d, v + s * v_stride + j * N), acc[0][j]);
      }
      continue;
    }
    hn::Vec<decltype(d)> vs[kJ];
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      vs[j] = LoadStored(d, v + s * v_stride + j * N);
    }
    HWY_UNROLL(8)
    for (size_t i = 0; i < kI; ++i) {
      const auto wi = hn::Set(d, w[i * w_stride + s]);
      HWY_UNROLL(8)
      for (size_t j = 0; j < kJ; ++j) {
        acc[i][j] = hn::MulAdd(wi, vs[j], acc[i][j]);
      }
    }
  }
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      hn::Store(acc[i][j], d, o + i * o_stride + j * N);
    }
  }
}

// AccumulateTiles of kI rows across the n_vec vectors of a row, kJ at a time
// (ForColumnTiles). The first tile issues the prefetches.
template <size_t kI, size_t kJ, class T>
HWY_INLINE void AccumulateRowGroup(const float* HWY_RESTRICT w, size_t w_stride,
                                   const T* HWY_RESTRICT v, size_t v_stride,
                                   size_t n, size_t n_vec,
                                   float* HWY_RESTRICT o, size_t o_stride,
                                   RowPrefetch<T> next, size_t next_n) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  ForColumnTiles<kJ>(n_vec, [&](auto width, size_t j) HWY_ATTR {
    AccumulateTile<kI, decltype(width)::value>(
        w, w_stride, v + j * N, v_stride, n, o + j * N, o_stride, next, next_n);
    next_n = 0;
  });
}

// Tiles for stored types that convert (bf16, f16, int8): 4 rows x 4 vectors,
// 2 x 8 and 1 x 8 on AVX-512 (16 accumulators of 32 registers); 4 x 2, 2 x 4
// and 1 x 8 elsewhere (8 of 16): tall tiles convert each V vector once for 4
// rows. float32 loads fold into the FMAs, where fewer rows per tile mean
// fewer broadcasts: 2 x 8 on AVX-512, 1 x 8 elsewhere. Wide tiles walk V row
// by row in long runs (streamed from memory).
#if HWY_TARGET <= HWY_AVX3
inline constexpr size_t kAccumulateJ4 = 4, kAccumulateJ2 = 8;
inline constexpr bool kAccumulateFloatPairs = true;
#else
inline constexpr size_t kAccumulateJ4 = 2, kAccumulateJ2 = 4;
inline constexpr bool kAccumulateFloatPairs = false;
#endif

// Whether one row of a 16-bit type takes a row of exactly 16 vectors (head_dim
// 256 on AVX-512) in one pass of 16 sums, where other rows go 8 vectors at a
// time: MHA decode at dim 256 1.03-1.07x (bf16) and 1.18-1.25x (f16), one
// thread, old and new builds in alternating processes; int8 ran 0.94x, and
// dim 512 in two passes of 16 0.65-0.71x against four of 8 (call by call).
template <class T>
inline constexpr bool kOneRowWide = HWY_TARGET <= HWY_AVX3 && sizeof(T) == 2;

template <class T>
HWY_INLINE void AccumulateUnscaled(const float* HWY_RESTRICT w, size_t w_stride,
                                   size_t rows, const T* HWY_RESTRICT v,
                                   size_t v_stride, size_t n, size_t dim,
                                   float* HWY_RESTRICT o, size_t o_stride,
                                   RowPrefetch<T> next, size_t next_n) {
  const size_t n_vec = dim / hn::Lanes(hn::ScalableTag<float>());
  constexpr bool kConverts = !hwy::IsSame<T, float>();
  size_t r = 0;
  if constexpr (kConverts) {
    for (; r + 4 <= rows; r += 4) {
      AccumulateRowGroup<4, kAccumulateJ4>(w + r * w_stride, w_stride, v,
                                           v_stride, n, n_vec, o + r * o_stride,
                                           o_stride, next, next_n);
      next_n = 0;
    }
  }
  if constexpr (kConverts || kAccumulateFloatPairs) {
    for (; r + 2 <= rows; r += 2) {
      AccumulateRowGroup<2, kAccumulateJ2>(w + r * w_stride, w_stride, v,
                                           v_stride, n, n_vec, o + r * o_stride,
                                           o_stride, next, next_n);
      next_n = 0;
    }
  }
  for (; r < rows; ++r) {
    if constexpr (kOneRowWide<T>) {
      if (n_vec == 16) {
        AccumulateRowGroup<1, 16>(w + r * w_stride, w_stride, v, v_stride, n,
                                  n_vec, o + r * o_stride, o_stride, next,
                                  next_n);
        next_n = 0;
        continue;
      }
    }
    AccumulateRowGroup<1, 8>(w + r * w_stride, w_stride, v, v_stride, n, n_vec,
                             o + r * o_stride, o_stride, next, next_n);
    next_n = 0;
  }
}

// AttentionCompute::kInt8's weights (AccumulateRowsInt8): x[0, n) (n a
// multiple of the vector length) replaced by its levels round(x / sigma)
// (nearest even), integers in [-16384, 16384], for sigma = 2^(E - 13) where
// the largest |x| is m 2^E (1 <= m < 2), sigma at least 2^-126; returns
// sigma. Each x moves by at most sigma / 2 <= max(2^-14 max |x|, 2^-127);
// x / sigma and sigma * level are exact. A NaN or inf x: levels 0 and a NaN
// sigma, so NaN outputs, as float32 products give.
HWY_INLINE float QuantizeWeights(float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const size_t N = hn::Lanes(d);
  // The largest |x| by its bits, NaN and inf above every finite value.
  const auto magnitude = hn::Set(du, 0x7FFFFFFFu);
  auto max_bits = hn::Zero(du);
  for (size_t i = 0; i < n; i += N) {
    max_bits = hn::Max(max_bits,
                       hn::And(hn::BitCast(du, hn::Load(d, x + i)), magnitude));
  }
  const uint32_t exponent =
      HWY_MAX(hn::GetLane(hn::MaxOfLanes(du, max_bits)) >> 23, 14u);
  if (exponent >= 255) {
    std::fill(x, x + n, 0.0f);
    return std::numeric_limits<float>::quiet_NaN();
  }
  const uint32_t sigma_bits = (exponent - 13) << 23;
  const uint32_t inv_bits = (267 - exponent) << 23;
  float sigma, inv;
  hwy::CopySameSize(&sigma_bits, &sigma);
  hwy::CopySameSize(&inv_bits, &inv);
  for (size_t i = 0; i < n; i += N) {
    hn::Store(hn::Round(hn::Mul(hn::Load(d, x + i), hn::Set(d, inv))), d,
              x + i);
  }
  return sigma;
}

// AttentionCompute::kInt8's weights for one row and chunk of keys, as every
// path takes them: x[s] = w[s] * v_scales[s] (one rounding) for s < keys,
// zeros to `padded` (a multiple of the vector length), then quantized
// (QuantizeWeights); returns sigma.
HWY_INLINE float QuantizeScaledWeights(const float* HWY_RESTRICT w,
                                       const float* HWY_RESTRICT v_scales,
                                       size_t keys, size_t padded,
                                       float* HWY_RESTRICT x) {
  for (size_t s = 0; s < keys; ++s) x[s] = w[s] * v_scales[s];
  std::fill(x + keys, x + padded, 0.0f);
  return QuantizeWeights(x, padded);
}

// AccumulateRows (decode.h): with scales, the weights times the scales (one
// rounding) go through a buffer of up to 16 rows x 128 keys (8 KiB), so the
// tiles multiply once per row and key. kQuantize (AccumulateRowsInt8's
// fallback): those products then quantized (QuantizeWeights) per row and
// chunk of 128 keys, times their sigma.
template <bool kQuantize, class T>
HWY_INLINE void AccumulateScaled(const float* HWY_RESTRICT w, size_t w_stride,
                                 size_t rows, const T* HWY_RESTRICT v,
                                 size_t v_stride,
                                 const float* HWY_RESTRICT v_scales, size_t n,
                                 size_t dim, float* HWY_RESTRICT o,
                                 size_t o_stride, RowPrefetch<T> next,
                                 size_t next_n) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  constexpr size_t kRowChunk = 16, kKeyChunk = 128;
  HWY_ALIGN float scaled[kRowChunk * kKeyChunk];
  for (size_t s0 = 0; s0 < n; s0 += kKeyChunk) {
    const size_t keys = HWY_MIN(kKeyChunk, n - s0);
    for (size_t r0 = 0; r0 < rows; r0 += kRowChunk) {
      const size_t chunk_rows = HWY_MIN(kRowChunk, rows - r0);
      for (size_t r = 0; r < chunk_rows; ++r) {
        const float* w_row = w + (r0 + r) * w_stride + s0;
        float* row = scaled + r * kKeyChunk;
        if constexpr (kQuantize) {
          const float sigma = QuantizeScaledWeights(w_row, v_scales + s0, keys,
                                                    RoundUp(keys, N), row);
          for (size_t s = 0; s < keys; ++s) row[s] *= sigma;
        } else {
          for (size_t s = 0; s < keys; ++s) {
            row[s] = w_row[s] * v_scales[s0 + s];
          }
        }
      }
      const size_t chunk_next = r0 == 0 && next_n > s0 ? next_n - s0 : 0;
      AccumulateUnscaled(scaled, kKeyChunk, chunk_rows, v + s0 * v_stride,
                         v_stride, keys, dim, o + r0 * o_stride, o_stride,
                         next.Skip(chunk_next == 0 ? 0 : s0), chunk_next);
    }
  }
}

template <class T>
void AccumulateRows(const float* HWY_RESTRICT w, size_t w_stride, size_t rows,
                    const T* HWY_RESTRICT v, size_t v_stride,
                    const float* HWY_RESTRICT v_scales, size_t n, size_t dim,
                    float* HWY_RESTRICT o, size_t o_stride,
                    const T* HWY_RESTRICT next_k, size_t next_k_stride,
                    size_t next_n) {
  const RowPrefetch<T> next{next_k, 0, next_k_stride};
  if (next_k == nullptr) next_n = 0;
  if constexpr (!internal::kKvScaled<T>) {
    AccumulateUnscaled(w, w_stride, rows, v, v_stride, n, dim, o, o_stride,
                       next, next_n);
  } else {
    AccumulateScaled<false>(w, w_stride, rows, v, v_stride, v_scales, n, dim, o,
                            o_stride, next, next_n);
  }
}

// Vectors [0, kJ) of AccumulateRowPair's two heads: AccumulateTile<1, kJ> of
// each, the two heads' V rows alternating key by key.
template <size_t kJ>
HWY_INLINE void AccumulatePairTile(const float* const w[2],
                                   const float* const v[2], size_t stride,
                                   size_t n, float* const o[2]) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc[2][kJ];
  HWY_UNROLL(2)
  for (size_t h = 0; h < 2; ++h) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) acc[h][j] = hn::Load(d, o[h] + j * N);
  }
  for (size_t s = 0; s < n; ++s) {
    HWY_UNROLL(2)
    for (size_t h = 0; h < 2; ++h) {
      const auto wh = hn::Set(d, w[h][s]);
      const float* v_row = v[h] + s * stride;
      HWY_UNROLL(8)
      for (size_t j = 0; j < kJ; ++j) {
        acc[h][j] = hn::MulAdd(wh, LoadStored(d, v_row + j * N), acc[h][j]);
      }
    }
  }
  HWY_UNROLL(2)
  for (size_t h = 0; h < 2; ++h) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) hn::Store(acc[h][j], d, o[h] + j * N);
  }
}

// Keys per pass of AccumulateRowPair's tiles where a row needs more than one
// tile: each tile takes kPairKeyChunk keys before the next tile does, so that
// the later tiles read those keys' V rows (both heads': 32 KiB at dim 256)
// from L1: float32 MHA decode 1.03-1.07x at dim 256 and 512 (one thread).
inline constexpr size_t kPairKeyChunk = 16;

// AccumulateRowPair (decode.h): 8 vectors at a time per head on AVX-512 (16
// sums of 32 registers), 4 elsewhere (ForColumnTiles). Each element is one
// FMA chain in key order, as in AccumulateTile, whatever the tile width; a
// row wider than one tile goes kPairKeyChunk keys at a time.
void AccumulateRowPair(const float* const w[2], const float* const v[2],
                       size_t stride, size_t n, size_t dim, float* const o[2]) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  constexpr size_t kJ = HWY_TARGET <= HWY_AVX3 ? 8 : 4;
  const size_t n_vec = dim / N;
  const size_t chunk = n_vec > kJ ? kPairKeyChunk : n;
  for (size_t s0 = 0; s0 < n; s0 += chunk) {
    const float* const ws[2] = {w[0] + s0, w[1] + s0};
    ForColumnTiles<kJ>(n_vec, [&](auto width, size_t j) HWY_ATTR {
      const float* const vj[2] = {v[0] + s0 * stride + j * N,
                                  v[1] + s0 * stride + j * N};
      float* const oj[2] = {o[0] + j * N, o[1] + j * N};
      AccumulatePairTile<decltype(width)::value>(ws, vj, stride,
                                                 HWY_MIN(chunk, n - s0), oj);
    });
  }
}

// ---------------------------------------------------------------------------
// bf16 products (ScoreRowsBF16, AccumulateRowsBF16).

#if HEADWAY_NATIVE_BF16 || HEADWAY_NATIVE_INT8
// The native score tiles' row groups: tile(rows_tag, r, prefetch) for rows
// [r, r + rows_tag) in groups of 4, then 2, then 1 (rows_tag a
// std::integral_constant); the first group issues the prefetches.
template <class T, class Tile>
HWY_INLINE void ForRowGroups(size_t rows, KeyPrefetch<T> prefetch,
                             const Tile& tile) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    tile(std::integral_constant<size_t, 4>(), r, prefetch);
    prefetch = KeyPrefetch<T>();
  }
  if (r + 2 <= rows) {
    tile(std::integral_constant<size_t, 2>(), r, prefetch);
    prefetch = KeyPrefetch<T>();
    r += 2;
  }
  if (r < rows) tile(std::integral_constant<size_t, 1>(), r, prefetch);
}
#endif

#if HEADWAY_NATIVE_BF16
// The 16 pairs of elements [c, c + 32) of a bf16 row, or with half (the row's
// last 16 elements) its 8 pairs [c, c + 16) and zeros: nothing past the row
// is read.
HWY_INLINE hn::Vec<NativePairs> LoadBF16Pairs(const hwy::bfloat16_t* row,
                                              bool half) {
  const NativePairs du;
  const uint32_t* p = reinterpret_cast<const uint32_t*>(row);
  if (!half) return hn::LoadU(du, p);
  return hn::ZeroExtendVector(du, hn::LoadU(hn::Half<NativePairs>(), p));
}

// pairs[0, RoundUp(n, 32) / 2) = src[0, n) as pairs of bf16, zero-padded
// (n a multiple of 16).
HWY_INLINE void StoreBF16Pairs(const float* HWY_RESTRICT src, size_t n,
                               uint32_t* HWY_RESTRICT pairs) {
  const NativeF32 d;
  const NativePairs du;
  for (size_t c = 0; c < n; c += 32) {
    const auto hi = c + 32 <= n ? hn::LoadU(d, src + c + 16) : hn::Zero(d);
    hn::StoreU(BF16PairsFromFloats(hn::LoadU(d, src + c), hi), du,
               pairs + c / 2);
  }
}

// Scores of kRows rows (pairs qp, stride qp_stride) against kKeys keys from
// k: kRows x kKeys sums of vdpbf16ps over the 32-element chunks of dim, then
// reduced as ScoreTile's. The keys' prefetches one per chunk.
template <size_t kRows, size_t kKeys>
HWY_INLINE void ScoreTileNative(const uint32_t* HWY_RESTRICT qp,
                                size_t qp_stride,
                                const hwy::bfloat16_t* HWY_RESTRICT k,
                                size_t k_stride, size_t dim,
                                float* HWY_RESTRICT sc, size_t sc_stride,
                                const KeyPrefetch<hwy::bfloat16_t>& prefetch) {
  const NativeF32 d;
  const NativePairs du;
  hn::Vec<NativeF32> acc[kRows][kKeys];
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) acc[r][j] = hn::Zero(d);
  }
  size_t fetched = 0;
  for (size_t c = 0; c < dim; c += 32) {
    if (fetched < kKeys) prefetch(fetched++);
    const bool half = c + 32 > dim;
    hn::Vec<NativePairs> qv[kRows];
    HWY_UNROLL(8)
    for (size_t r = 0; r < kRows; ++r) {
      qv[r] = KeepInRegister(hn::LoadU(du, qp + r * qp_stride + c / 2));
    }
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) {
      const auto kv = LoadBF16Pairs(k + j * k_stride + c, half);
      HWY_UNROLL(8)
      for (size_t r = 0; r < kRows; ++r) {
        acc[r][j] = DotBF16Pairs(acc[r][j], qv[r], kv);
      }
    }
  }
  for (; fetched < kKeys; ++fetched) prefetch(fetched);
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    if constexpr (kKeys % 4 == 0) {
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; j += 4) {
        StoreKeyScores4<false>(d, acc[r] + j, nullptr, sc + r * sc_stride + j);
      }
    } else {
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; ++j) {
        sc[r * sc_stride + j] = hn::GetLane(hn::SumOfLanes(d, acc[r][j]));
      }
    }
  }
}

// Every row group's tile over keys [s, s + kKeys) (ForRowGroups).
template <size_t kKeys>
HWY_INLINE void ScoreKeysNative(const uint32_t* HWY_RESTRICT qp,
                                size_t qp_stride, size_t rows,
                                const hwy::bfloat16_t* HWY_RESTRICT k,
                                size_t k_stride, size_t dim,
                                float* HWY_RESTRICT sc, size_t sc_stride,
                                KeyPrefetch<hwy::bfloat16_t> prefetch) {
  ForRowGroups(rows, prefetch,
               [&](auto rows_tag, size_t r, const auto& fetch) HWY_ATTR {
                 ScoreTileNative<decltype(rows_tag)::value, kKeys>(
                     qp + r * qp_stride, qp_stride, k, k_stride, dim,
                     sc + r * sc_stride, sc_stride, fetch);
               });
}

// ScoreRowsBF16 with vdpbf16ps: rows <= 16, dim <= kMaxBF16PairDim.
HWY_INLINE void ScoreRowsNative(const float* HWY_RESTRICT q, size_t q_stride,
                                size_t rows,
                                const hwy::bfloat16_t* HWY_RESTRICT k,
                                size_t k_stride, size_t n, size_t dim,
                                const hwy::bfloat16_t* HWY_RESTRICT v,
                                size_t v_stride, float* HWY_RESTRICT sc,
                                size_t sc_stride) {
  constexpr size_t kPairStride = kMaxBF16PairDim / 2;
  HWY_ALIGN uint32_t qp[16 * kPairStride];
  for (size_t r = 0; r < rows; ++r) {
    StoreBF16Pairs(q + r * q_stride, dim, qp + r * kPairStride);
  }
  const auto prefetch_at = [&](size_t s) {
    return KeyPrefetch<hwy::bfloat16_t>::At(k, k_stride, v, v_stride, s);
  };
  size_t s = 0;
  for (; s + 4 <= n; s += 4) {
    ScoreKeysNative<4>(qp, kPairStride, rows, k + s * k_stride, k_stride, dim,
                       sc + s, sc_stride, prefetch_at(s));
  }
  for (; s < n; ++s) {
    ScoreKeysNative<1>(qp, kPairStride, rows, k + s * k_stride, k_stride, dim,
                       sc + s, sc_stride, prefetch_at(s));
  }
}

// vshuff32x4: the 128-bit blocks kImm selects, two of a then two of b
// (the zero-masked form: GCC 12 warns of the plain one's undefined source).
template <int kImm>
HWY_INLINE __m512 BlockShuffle(__m512 a, __m512 b) {
  return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, kImm);
}

// The native weighted sums over pairs of keys (AccumulateTileNative): bf16
// weights times bf16 V by vdpbf16ps, float accumulators that start from o
// (AccumulateRowsBF16); below, int16 weight levels times int8 V by vpdpwssd
// (AccumulateRowsInt8). Columns(row, half): 32 columns of a V row as 16-bit
// values (half: the row's last 16, then zeros; nothing past the row is read).
struct BF16PairSum {
  using T = hwy::bfloat16_t;
  using D = NativeF32;
  static constexpr bool kFromO = true;
  static HWY_INLINE hn::Vec<NativePairs> Columns(const T* row, bool half) {
    return LoadBF16Pairs(row, half);
  }
  static HWY_INLINE hn::Vec<D> Dot(hn::Vec<D> acc, hn::Vec<NativePairs> w,
                                   hn::Vec<NativePairs> x) {
    return DotBF16Pairs(acc, w, x);
  }
};

// o [kRows rows] columns [c0, c0 + 32 kC) += the weighted sum of n V rows,
// pairs of keys at a time: wp holds each row's weights as pairs of 16-bit
// values (key 2i in the low half of wp[i]), two V rows interleaved per 32
// columns (the low and high 4 pairs of each 128-bit block: columns {0-3,
// 8-11, 16-19, 24-27} and {4-7, ...}, so the accumulators hold o's columns in
// that order, restored at the store). Sum::kFromO: the accumulators start
// from o and are stored; else from 0, and o += row_scale[r] * their sums. The
// last chunk may be the row's last 16 columns (half). An odd last key pairs
// with zeros. next(s) for s < next_n.
template <class Sum, size_t kRows, size_t kC>
HWY_INLINE void AccumulateTileNative(
    const uint32_t* HWY_RESTRICT wp, size_t wp_stride,
    const float* HWY_RESTRICT row_scale, const typename Sum::T* HWY_RESTRICT v,
    size_t v_stride, size_t n, size_t c0, size_t dim, float* HWY_RESTRICT o,
    size_t o_stride, RowPrefetch<typename Sum::T> next, size_t next_n) {
  const NativeF32 d;
  const NativePairs du;
  const typename Sum::D dacc;
  const hn::Repartition<uint16_t, NativeF32> d16;
  bool half[kC];
  HWY_UNROLL(8)
  for (size_t c = 0; c < kC; ++c) half[c] = c0 + 32 * c + 32 > dim;
  hn::Vec<typename Sum::D> acc[kRows][kC][2];
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(8)
    for (size_t c = 0; c < kC; ++c) {
      if constexpr (Sum::kFromO) {
        const float* col = o + r * o_stride + c0 + 32 * c;
        const __m512 o0 = hn::Load(d, col).raw;
        const __m512 o1 =
            half[c] ? _mm512_setzero_ps() : hn::Load(d, col + 16).raw;
        acc[r][c][0].raw = BlockShuffle<0x88>(o0, o1);
        acc[r][c][1].raw = BlockShuffle<0xDD>(o0, o1);
      } else {
        acc[r][c][0] = hn::Zero(dacc);
        acc[r][c][1] = hn::Zero(dacc);
      }
    }
  }
  const auto pair_step = [&](size_t i, bool odd_last) HWY_ATTR {
    const size_t s = 2 * i;
    hn::Vec<NativePairs> lo[kC], hi[kC];
    HWY_UNROLL(8)
    for (size_t c = 0; c < kC; ++c) {
      const size_t col = c0 + 32 * c;
      const auto a =
          hn::BitCast(d16, Sum::Columns(v + s * v_stride + col, half[c]));
      const auto b =
          odd_last ? hn::Zero(d16)
                   : hn::BitCast(d16, Sum::Columns(v + (s + 1) * v_stride + col,
                                                   half[c]));
      lo[c] = hn::BitCast(du, hn::InterleaveLower(d16, a, b));
      hi[c] = hn::BitCast(du, hn::InterleaveUpper(d16, a, b));
    }
    HWY_UNROLL(8)
    for (size_t r = 0; r < kRows; ++r) {
      const auto wv = hn::Set(du, wp[r * wp_stride + i]);
      HWY_UNROLL(8)
      for (size_t c = 0; c < kC; ++c) {
        acc[r][c][0] = Sum::Dot(acc[r][c][0], wv, lo[c]);
        acc[r][c][1] = Sum::Dot(acc[r][c][1], wv, hi[c]);
      }
    }
  };
  const size_t full_pairs = n / 2;
  for (size_t i = 0; i < full_pairs; ++i) {
    if (2 * i < next_n) next(2 * i);
    if (2 * i + 1 < next_n) next(2 * i + 1);
    pair_step(i, false);
  }
  if (n % 2 != 0) {
    if (n - 1 < next_n) next(n - 1);
    pair_step(full_pairs, true);
  }
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(8)
    for (size_t c = 0; c < kC; ++c) {
      float* col = o + r * o_stride + c0 + 32 * c;
      __m512 sums[2];
      if constexpr (Sum::kFromO) {
        sums[0] = acc[r][c][0].raw;
        sums[1] = acc[r][c][1].raw;
      } else {
        const auto scale = hn::Set(d, row_scale[r]);
        sums[0] = hn::Mul(hn::ConvertTo(d, acc[r][c][0]), scale).raw;
        sums[1] = hn::Mul(hn::ConvertTo(d, acc[r][c][1]), scale).raw;
      }
      for (size_t h = 0; h < (half[c] ? 1 : 2); ++h) {
        const __m512 t = h == 0 ? BlockShuffle<0x44>(sums[0], sums[1])
                                : BlockShuffle<0xEE>(sums[0], sums[1]);
        hn::Vec<NativeF32> out;
        out.raw = BlockShuffle<0xD8>(t, t);
        if constexpr (!Sum::kFromO)
          out = hn::Add(hn::Load(d, col + 16 * h), out);
        hn::Store(out, d, col + 16 * h);
      }
    }
  }
}

// AccumulateTileNatives of kRows rows across dim, kC chunks of 32 columns at
// a time (ForColumnTiles; the last chunk may be half). The first tile issues
// the prefetches.
template <class Sum, size_t kRows, size_t kC>
HWY_INLINE void AccumulateRowGroupNative(
    const uint32_t* HWY_RESTRICT wp, size_t wp_stride,
    const float* HWY_RESTRICT row_scale, const typename Sum::T* HWY_RESTRICT v,
    size_t v_stride, size_t n, size_t dim, float* HWY_RESTRICT o,
    size_t o_stride, RowPrefetch<typename Sum::T> next, size_t next_n) {
  ForColumnTiles<kC>((dim + 31) / 32, [&](auto width, size_t c) HWY_ATTR {
    AccumulateTileNative<Sum, kRows, decltype(width)::value>(
        wp, wp_stride, row_scale, v, v_stride, n, 32 * c, dim, o, o_stride,
        next, next_n);
    next_n = 0;
  });
}

// The native weighted sums' driver: keys in chunks of 128, rows of 16, each
// chunk's weights as pairs in a buffer (8 KiB): pack(r, s0, keys, pairs)
// writes row r's weights of keys [s0, s0 + keys) as RoundUp(keys, 16) / 2
// pairs, zero-padded, and returns the row's scale (Sum::kFromO: unused).
template <class Sum, class Pack>
HWY_INLINE void AccumulatePairsNative(size_t rows,
                                      const typename Sum::T* HWY_RESTRICT v,
                                      size_t v_stride, size_t n, size_t dim,
                                      float* HWY_RESTRICT o, size_t o_stride,
                                      RowPrefetch<typename Sum::T> next,
                                      size_t next_n, const Pack& pack) {
  constexpr size_t kRowChunk = 16, kKeyChunk = 128;
  constexpr size_t kPairStride = kKeyChunk / 2;
  HWY_ALIGN uint32_t wp[kRowChunk * kPairStride];
  float row_scale[kRowChunk];
  for (size_t s0 = 0; s0 < n; s0 += kKeyChunk) {
    const size_t keys = HWY_MIN(kKeyChunk, n - s0);
    for (size_t r0 = 0; r0 < rows; r0 += kRowChunk) {
      const size_t chunk_rows = HWY_MIN(kRowChunk, rows - r0);
      for (size_t r = 0; r < chunk_rows; ++r) {
        row_scale[r] = pack(r0 + r, s0, keys, wp + r * kPairStride);
      }
      size_t chunk_next = r0 == 0 && next_n > s0 ? next_n - s0 : 0;
      const RowPrefetch<typename Sum::T> chunk_fetch =
          next.Skip(chunk_next == 0 ? 0 : s0);
      const typename Sum::T* vs = v + s0 * v_stride;
      float* out = o + r0 * o_stride;
      const auto group = [&](auto rows_tag, auto c_tag, size_t r) HWY_ATTR {
        AccumulateRowGroupNative<Sum, decltype(rows_tag)::value,
                                 decltype(c_tag)::value>(
            wp + r * kPairStride, kPairStride, row_scale + r, vs, v_stride,
            keys, dim, out + r * o_stride, o_stride, chunk_fetch, chunk_next);
        chunk_next = 0;
      };
      size_t r = 0;
      for (; r + 4 <= chunk_rows; r += 4) {
        group(std::integral_constant<size_t, 4>(),
              std::integral_constant<size_t, 2>(), r);
      }
      if (r + 2 <= chunk_rows) {
        group(std::integral_constant<size_t, 2>(),
              std::integral_constant<size_t, 4>(), r);
        r += 2;
      }
      if (r < chunk_rows) {
        group(std::integral_constant<size_t, 1>(),
              std::integral_constant<size_t, 4>(), r);
      }
    }
  }
}

// AccumulateRowsBF16 with vdpbf16ps.
HWY_INLINE void AccumulateRowsNative(const float* HWY_RESTRICT w,
                                     size_t w_stride, size_t rows,
                                     const hwy::bfloat16_t* HWY_RESTRICT v,
                                     size_t v_stride, size_t n, size_t dim,
                                     float* HWY_RESTRICT o, size_t o_stride,
                                     RowPrefetch<hwy::bfloat16_t> next,
                                     size_t next_n) {
  HWY_ALIGN float padded[128];
  const auto pack = [&](size_t r, size_t s0, size_t keys, uint32_t* pairs)
                        HWY_ATTR {
                          const size_t keys16 = RoundUp(keys, size_t{16});
                          const float* w_row = w + r * w_stride + s0;
                          std::copy(w_row, w_row + keys, padded);
                          std::fill(padded + keys, padded + keys16, 0.0f);
                          StoreBF16Pairs(padded, keys16, pairs);
                          return 1.0f;
                        };
  AccumulatePairsNative<BF16PairSum>(rows, v, v_stride, n, dim, o, o_stride,
                                     next, next_n, pack);
}
#endif  // HEADWAY_NATIVE_BF16

// ---------------------------------------------------------------------------
// int8 products (ScoreRowsInt8).

#if HEADWAY_NATIVE_INT8
// The 64 bytes [c, c + 64) of an int8 row, or (its last chunk) the dim - c
// bytes left and zeros: nothing past the row is read.
HWY_INLINE hn::Vec<NativeI8> LoadInt8Chunk(const int8_t* HWY_RESTRICT row,
                                           size_t c, size_t dim) {
  const NativeI8 d8;
  if (c + 64 <= dim) return hn::LoadU(d8, row + c);
  return hn::MaskedLoad(hn::FirstN(d8, dim - c), d8, row + c);
}

// Scores of kRows rows (int8 qi, stride qi_stride, zero-padded to 64-byte
// chunks; bias[r] = 128 sum_p qi[r][p]) against kKeys keys from k: kRows x
// kKeys vpdpbusd sums over the chunks of dim, each K chunk flipped to
// unsigned once for all rows, then reduced 4 keys at a time (SumsOf4) and
// scaled: sc[r * sc_stride + j] = k_scales[j] * (sum - bias[r]). The keys'
// prefetches one per chunk.
template <size_t kRows, size_t kKeys>
HWY_INLINE void ScoreTileInt8(const int8_t* HWY_RESTRICT qi, size_t qi_stride,
                              const int32_t* HWY_RESTRICT bias,
                              const int8_t* HWY_RESTRICT k, size_t k_stride,
                              const float* HWY_RESTRICT k_scales, size_t dim,
                              float* HWY_RESTRICT sc, size_t sc_stride,
                              const KeyPrefetch<int8_t>& prefetch) {
  const NativeI32 d32;
  const NativeI8 d8;
  const NativeU8 du8;
  hn::Vec<NativeI32> acc[kRows][kKeys];
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) acc[r][j] = hn::Zero(d32);
  }
  const auto flip = hn::Set(du8, uint8_t{0x80});
  size_t fetched = 0;
  for (size_t c = 0; c < dim; c += 64) {
    if (fetched < kKeys) prefetch(fetched++);
    hn::Vec<NativeI8> qv[kRows];
    HWY_UNROLL(8)
    for (size_t r = 0; r < kRows; ++r) {
      qv[r] = KeepInRegister(hn::Load(d8, qi + r * qi_stride + c));
    }
    HWY_UNROLL(8)
    for (size_t j = 0; j < kKeys; ++j) {
      // K + 128 as unsigned bytes: the products gain 128 q, the bias.
      const auto ku = hn::Xor(
          hn::BitCast(du8, LoadInt8Chunk(k + j * k_stride, c, dim)), flip);
      HWY_UNROLL(8)
      for (size_t r = 0; r < kRows; ++r) {
        acc[r][j] = DotU8I8Quads(acc[r][j], ku, qv[r]);
      }
    }
  }
  for (; fetched < kKeys; ++fetched) prefetch(fetched);
  const hn::Full128<int32_t> d4i;
  const hn::Full128<float> d4;
  HWY_UNROLL(8)
  for (size_t r = 0; r < kRows; ++r) {
    if constexpr (kKeys % 4 == 0) {
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; j += 4) {
        const auto sums = hn::Sub(SumsOf4(d32, acc[r][j], acc[r][j + 1],
                                          acc[r][j + 2], acc[r][j + 3]),
                                  hn::Set(d4i, bias[r]));
        hn::StoreU(
            hn::Mul(hn::ConvertTo(d4, sums), hn::LoadU(d4, k_scales + j)), d4,
            sc + r * sc_stride + j);
      }
    } else {
      HWY_UNROLL(8)
      for (size_t j = 0; j < kKeys; ++j) {
        const int32_t sum = hn::GetLane(hn::SumOfLanes(d32, acc[r][j]));
        sc[r * sc_stride + j] = static_cast<float>(sum - bias[r]) * k_scales[j];
      }
    }
  }
}

// Every row group's tile over keys [0, kKeys) (ForRowGroups).
template <size_t kKeys>
HWY_INLINE void ScoreKeysInt8(const int8_t* HWY_RESTRICT qi, size_t qi_stride,
                              const int32_t* HWY_RESTRICT bias, size_t rows,
                              const int8_t* HWY_RESTRICT k, size_t k_stride,
                              const float* HWY_RESTRICT k_scales, size_t dim,
                              float* HWY_RESTRICT sc, size_t sc_stride,
                              KeyPrefetch<int8_t> prefetch) {
  ForRowGroups(rows, prefetch,
               [&](auto rows_tag, size_t r, const auto& fetch) HWY_ATTR {
                 ScoreTileInt8<decltype(rows_tag)::value, kKeys>(
                     qi + r * qi_stride, qi_stride, bias + r, k, k_stride,
                     k_scales, dim, sc + r * sc_stride, sc_stride, fetch);
               });
}

// ScoreRowsInt8 with vpdpbusd: rows <= 16, dim <= kMaxInt8ProductDim. q's
// rows as int8 in a buffer (16 KiB), zero-padded to 64-byte chunks.
HWY_INLINE void ScoreRowsInt8Native(
    const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
    const int8_t* HWY_RESTRICT k, size_t k_stride,
    const float* HWY_RESTRICT k_scales, size_t n, size_t dim,
    const int8_t* HWY_RESTRICT v, size_t v_stride, float* HWY_RESTRICT sc,
    size_t sc_stride) {
  constexpr size_t kQStride = kMaxInt8ProductDim;
  HWY_ALIGN int8_t qi[16 * kQStride];
  int32_t bias[16];
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di32;
  const hn::Rebind<int8_t, decltype(d)> di8;
  const size_t N = hn::Lanes(d);
  const size_t padded = RoundUp(dim, size_t{64});
  for (size_t r = 0; r < rows; ++r) {
    int8_t* row = qi + r * kQStride;
    auto sum = hn::Zero(di32);
    for (size_t p = 0; p < dim; p += N) {
      const auto levels =
          hn::ConvertTo(di32, hn::Load(d, q + r * q_stride + p));
      sum = hn::Add(sum, levels);
      hn::Store(hn::DemoteTo(di8, levels), di8, row + p);
    }
    std::fill(row + dim, row + padded, int8_t{0});
    bias[r] = 128 * hn::GetLane(hn::SumOfLanes(di32, sum));
  }
  const auto prefetch_at = [&](size_t s) {
    return KeyPrefetch<int8_t>::At(k, k_stride, v, v_stride, s);
  };
  size_t s = 0;
  if (rows == 1) {
    for (; s + 8 <= n; s += 8) {
      ScoreTileInt8<1, 8>(qi, kQStride, bias, k + s * k_stride, k_stride,
                          k_scales + s, dim, sc + s, sc_stride, prefetch_at(s));
    }
  }
  for (; s + 4 <= n; s += 4) {
    ScoreKeysInt8<4>(qi, kQStride, bias, rows, k + s * k_stride, k_stride,
                     k_scales + s, dim, sc + s, sc_stride, prefetch_at(s));
  }
  for (; s < n; ++s) {
    ScoreKeysInt8<1>(qi, kQStride, bias, rows, k + s * k_stride, k_stride,
                     k_scales + s, dim, sc + s, sc_stride, prefetch_at(s));
  }
}

// The int8 weighted sum's pieces for AccumulateTileNative: V's int8 columns
// sign-extended to int16, int16 weight levels, exact int32 sums.
struct Int8PairSum {
  using T = int8_t;
  using D = NativeI32;
  static constexpr bool kFromO = false;
  static HWY_INLINE hn::Vec<NativePairs> Columns(const int8_t* row, bool half) {
    const hn::Full256<int8_t> d8;
    const auto bytes =
        half ? hn::ZeroExtendVector(d8, hn::LoadU(hn::Full128<int8_t>(), row))
             : hn::LoadU(d8, row);
    return hn::BitCast(NativePairs(), hn::PromoteTo(NativeI16(), bytes));
  }
  static HWY_INLINE hn::Vec<D> Dot(hn::Vec<D> acc, hn::Vec<NativePairs> w,
                                   hn::Vec<NativePairs> x) {
    return DotI16Pairs(acc, hn::BitCast(NativeI16(), w),
                       hn::BitCast(NativeI16(), x));
  }
};

// AccumulateRowsInt8 with vpdpwssd: each row's weights times the V scales
// quantized per chunk of 128 keys (QuantizeWeights), their levels as pairs of
// int16. A chunk's sums are exact: at most 128 x 16384 x 127 < 2^31.
HWY_INLINE void AccumulateRowsInt8Native(
    const float* HWY_RESTRICT w, size_t w_stride, size_t rows,
    const int8_t* HWY_RESTRICT v, size_t v_stride,
    const float* HWY_RESTRICT v_scales, size_t n, size_t dim,
    float* HWY_RESTRICT o, size_t o_stride, RowPrefetch<int8_t> next,
    size_t next_n) {
  const NativeF32 d;
  const NativePairs du;
  HWY_ALIGN float padded[128];
  const auto pack = [&](size_t r, size_t s0, size_t keys,
                        uint32_t* pairs) HWY_ATTR {
    const size_t keys16 = RoundUp(keys, size_t{16});
    const float sigma = QuantizeScaledWeights(
        w + r * w_stride + s0, v_scales + s0, keys, keys16, padded);
    for (size_t c = 0; c < keys16; c += 32) {
      const auto lo =
          hn::BitCast(du, hn::ConvertTo(NativeI32(), hn::Load(d, padded + c)));
      const auto hi =
          c + 16 < keys16
              ? hn::BitCast(du, hn::ConvertTo(NativeI32(),
                                              hn::Load(d, padded + c + 16)))
              : hn::Zero(du);
      const auto low16 = hn::Set(du, 0xFFFFu);
      hn::Store(hn::Or(hn::And(hn::ConcatEven(du, hi, lo), low16),
                       hn::ShiftLeft<16>(hn::ConcatOdd(du, hi, lo))),
                du, pairs + c / 2);
    }
    return sigma;
  };
  AccumulatePairsNative<Int8PairSum>(rows, v, v_stride, n, dim, o, o_stride,
                                     next, next_n, pack);
}
#endif  // HEADWAY_NATIVE_INT8

// ScoreRowsInt8 (decode.h).
void ScoreRowsInt8(const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
                   const int8_t* HWY_RESTRICT k, size_t k_stride,
                   const float* HWY_RESTRICT k_scales, size_t n, size_t dim,
                   const int8_t* HWY_RESTRICT v, size_t v_stride,
                   float* HWY_RESTRICT sc, size_t sc_stride) {
#if HEADWAY_NATIVE_INT8
  if (rows <= 16 && dim <= kMaxInt8ProductDim) {
    ScoreRowsInt8Native(q, q_stride, rows, k, k_stride, k_scales, n, dim, v,
                        v_stride, sc, sc_stride);
    return;
  }
#endif
  ScoreRows(q, q_stride, rows, k, k_stride, k_scales, n, dim, v, v_stride, sc,
            sc_stride);
}

// AccumulateRowsInt8 (decode.h).
void AccumulateRowsInt8(const float* HWY_RESTRICT w, size_t w_stride,
                        size_t rows, const int8_t* HWY_RESTRICT v,
                        size_t v_stride, const float* HWY_RESTRICT v_scales,
                        size_t n, size_t dim, float* HWY_RESTRICT o,
                        size_t o_stride, const int8_t* HWY_RESTRICT next_k,
                        size_t next_k_stride, size_t next_n) {
  const RowPrefetch<int8_t> next{next_k, 0, next_k_stride};
  if (next_k == nullptr) next_n = 0;
#if HEADWAY_NATIVE_INT8
  AccumulateRowsInt8Native(w, w_stride, rows, v, v_stride, v_scales, n, dim, o,
                           o_stride, next, next_n);
#else
  AccumulateScaled<true>(w, w_stride, rows, v, v_stride, v_scales, n, dim, o,
                         o_stride, next, next_n);
#endif
}

// ScoreRowsBF16 (decode.h).
void ScoreRowsBF16(const float* HWY_RESTRICT q, size_t q_stride, size_t rows,
                   const hwy::bfloat16_t* HWY_RESTRICT k, size_t k_stride,
                   size_t n, size_t dim, const hwy::bfloat16_t* HWY_RESTRICT v,
                   size_t v_stride, float* HWY_RESTRICT sc, size_t sc_stride,
                   bool native) {
#if HEADWAY_NATIVE_BF16
  if (native && rows <= 16 && dim <= kMaxBF16PairDim) {
    ScoreRowsNative(q, q_stride, rows, k, k_stride, n, dim, v, v_stride, sc,
                    sc_stride);
    return;
  }
#else
  (void)native;
#endif
  ScoreRows(q, q_stride, rows, k, k_stride, nullptr, n, dim, v, v_stride, sc,
            sc_stride);
}

// AccumulateRowsBF16 (decode.h).
void AccumulateRowsBF16(const float* HWY_RESTRICT w, size_t w_stride,
                        size_t rows, const hwy::bfloat16_t* HWY_RESTRICT v,
                        size_t v_stride, size_t n, size_t dim,
                        float* HWY_RESTRICT o, size_t o_stride,
                        const hwy::bfloat16_t* HWY_RESTRICT next_k,
                        size_t next_k_stride, size_t next_n, bool native) {
#if HEADWAY_NATIVE_BF16
  if (native) {
    AccumulateRowsNative(w, w_stride, rows, v, v_stride, n, dim, o, o_stride,
                         {next_k, 0, next_k_stride}, next_k ? next_n : 0);
    return;
  }
#else
  (void)native;
#endif
  AccumulateRows(w, w_stride, rows, v, v_stride, nullptr, n, dim, o, o_stride,
                 next_k, next_k_stride, next_n);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_DECODE_INL_H_

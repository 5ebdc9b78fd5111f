// Decode kernels of the narrow attention tiles (fewer query rows than lanes:
// decode of MHA and small GQA groups), on K and V rows in their stored type
// (LoadStored, storage-inl.h): the scores of a key block and the weighted sum
// of its V rows. Decode is bound by reading K and V; these stream each stored
// row once for all query rows.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_ATTENTION_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ATTENTION_DECODE_INL_H_
#undef HEADWAY_LIB_ATTENTION_DECODE_INL_H_
#else
#define HEADWAY_LIB_ATTENTION_DECODE_INL_H_
#endif

#include <stddef.h>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lib/core/storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Hints the 64-byte lines of a stored row of `dim` elements (the row may lie
// past the cache: prefetches never fault).
template <class T>
HWY_INLINE void PrefetchStoredRow(const T* row, size_t dim) {
  constexpr size_t kPerLine = 64 / sizeof(T);
  for (size_t p = 0; p < dim; p += kPerLine) hwy::Prefetch(row + p);
}

// sum_{p < dim} q[p] * K(p) over a stored row, two accumulators (dim a multiple
// of the vector length).
template <class T>
HWY_INLINE float DotStored(const float* HWY_RESTRICT q, const T* HWY_RESTRICT k,
                           size_t dim) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  size_t p = 0;
  for (; p + 2 * N <= dim; p += 2 * N) {
    acc0 = hn::MulAdd(hn::Load(d, q + p), LoadStored(d, k + p), acc0);
    acc1 = hn::MulAdd(hn::Load(d, q + p + N), LoadStored(d, k + p + N), acc1);
  }
  if (p < dim)
    acc0 = hn::MulAdd(hn::Load(d, q + p), LoadStored(d, k + p), acc0);
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
}

// Scores of `rows` query rows against n stored key rows:
//   sc[r * sc_stride + s] = k_scale(s) * sum_{p < dim} q[r * q_stride + p] *
//                           K(s, p)
// for r < rows, s < n, with K(s, p) = LoadStored(k + s * k_stride + p) and
// k_scale(s) = k_scales[s] for int8 (null otherwise: 1). dim is a multiple of
// the vector length (rows zero-padded), q and k rows aligned. v (may be null)
// are the same keys' V rows, stride v_stride: with v, K rows 16 keys ahead and
// the V rows are prefetched as the keys go by (several query rows, whose dot
// products let the hardware prefetchers fall behind: GQA-8 decode at 16384
// keys reads at 82/100% of the bandwidth with it, 67/73% without, 1/2 threads,
// Zen 5; one row does without, where it costs 6-9%).
template <class T>
HWY_INLINE void ScoreRows(const float* HWY_RESTRICT q, size_t q_stride,
                          size_t rows, const T* HWY_RESTRICT k, size_t k_stride,
                          const float* HWY_RESTRICT k_scales, size_t n,
                          size_t dim, const T* HWY_RESTRICT v, size_t v_stride,
                          float* HWY_RESTRICT sc, size_t sc_stride) {
  for (size_t s = 0; s < n; ++s) {
    const T* k_row = k + s * k_stride;
    if (v != nullptr) {
      PrefetchStoredRow(k_row + 16 * k_stride, dim);
      PrefetchStoredRow(v + s * v_stride, dim);
    }
    const float scale = k_scales != nullptr ? k_scales[s] : 1.0f;
    for (size_t r = 0; r < rows; ++r) {
      float score = DotStored(q + r * q_stride, k_row, dim);
      if (k_scales != nullptr) score *= scale;
      sc[r * sc_stride + s] = score;
    }
  }
}

// o[i][j] += sum_{s < n} w(i, s) * V[s][j] for kI rows i and kJ vectors j:
//   w(i, s) = w[i * w_stride + s] (times v_scales[s] if kScaled), V[s][j] =
//   LoadStored(v + s * v_stride + j * N), o[i][j] = o + i * o_stride + j * N.
// kI * kJ accumulators stay in registers for the whole key loop (8 of them
// cover the FMA latency of two pipes x 4 cycles).
template <size_t kI, size_t kJ, bool kScaled, class T>
HWY_INLINE void AccumulateTile(const float* HWY_RESTRICT w, size_t w_stride,
                               const T* HWY_RESTRICT v, size_t v_stride,
                               const float* HWY_RESTRICT v_scales, size_t n,
                               float* HWY_RESTRICT o, size_t o_stride) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc[kI][kJ];
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j)
      acc[i][j] = hn::Load(d, o + i * o_stride + j * N);
  }
  for (size_t s = 0; s < n; ++s) {
    hn::Vec<decltype(d)> vs[kJ];
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j)
      vs[j] = LoadStored(d, v + s * v_stride + j * N);
    HWY_UNROLL(8)
    for (size_t i = 0; i < kI; ++i) {
      float weight = w[i * w_stride + s];
      if constexpr (kScaled) weight *= v_scales[s];
      const auto wi = hn::Set(d, weight);
      HWY_UNROLL(8)
      for (size_t j = 0; j < kJ; ++j)
        acc[i][j] = hn::MulAdd(wi, vs[j], acc[i][j]);
    }
  }
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j)
      hn::Store(acc[i][j], d, o + i * o_stride + j * N);
  }
}

// AccumulateRows over kJ vectors of every row: rows in pairs on AVX-512 (32
// registers: 16 accumulators), one by one elsewhere.
template <size_t kJ, bool kScaled, class T>
HWY_INLINE void AccumulateColumns(const float* HWY_RESTRICT w, size_t w_stride,
                                  size_t rows, const T* HWY_RESTRICT v,
                                  size_t v_stride,
                                  const float* HWY_RESTRICT v_scales, size_t n,
                                  float* HWY_RESTRICT o, size_t o_stride) {
  size_t r = 0;
#if HWY_TARGET <= HWY_AVX3
  for (; r + 2 <= rows; r += 2) {
    AccumulateTile<2, kJ, kScaled>(w + r * w_stride, w_stride, v, v_stride,
                                   v_scales, n, o + r * o_stride, o_stride);
  }
#endif
  for (; r < rows; ++r) {
    AccumulateTile<1, kJ, kScaled>(w + r * w_stride, w_stride, v, v_stride,
                                   v_scales, n, o + r * o_stride, o_stride);
  }
}

template <bool kScaled, class T>
HWY_INLINE void AccumulateBlocks(const float* HWY_RESTRICT w, size_t w_stride,
                                 size_t rows, const T* HWY_RESTRICT v,
                                 size_t v_stride,
                                 const float* HWY_RESTRICT v_scales, size_t n,
                                 size_t dim, float* HWY_RESTRICT o,
                                 size_t o_stride) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  const size_t n_vec = dim / N;
  size_t j = 0;
  // Tiles of up to 8 vectors: V is walked row by row in long runs (streamed
  // from memory) instead of in many narrow column passes.
  for (; j + 8 <= n_vec; j += 8) {
    AccumulateColumns<8, kScaled>(w, w_stride, rows, v + j * N, v_stride,
                                  v_scales, n, o + j * N, o_stride);
  }
  for (; j + 4 <= n_vec; j += 4) {
    AccumulateColumns<4, kScaled>(w, w_stride, rows, v + j * N, v_stride,
                                  v_scales, n, o + j * N, o_stride);
  }
  for (; j < n_vec; ++j) {
    AccumulateColumns<1, kScaled>(w, w_stride, rows, v + j * N, v_stride,
                                  v_scales, n, o + j * N, o_stride);
  }
}

// The weighted sum of n stored V rows into `rows` output rows:
//   o[r * o_stride + p] += sum_{s < n} w[r * w_stride + s] * v_scale(s) *
//                          V(s, p)
// for r < rows, p < dim, with V(s, p) = LoadStored(v + s * v_stride + p) and
// v_scale(s) = v_scales[s] for int8 (null otherwise: 1). dim is a multiple of
// the vector length, o and v rows aligned.
template <class T>
HWY_INLINE void AccumulateRows(const float* HWY_RESTRICT w, size_t w_stride,
                               size_t rows, const T* HWY_RESTRICT v,
                               size_t v_stride,
                               const float* HWY_RESTRICT v_scales, size_t n,
                               size_t dim, float* HWY_RESTRICT o,
                               size_t o_stride) {
  if (v_scales != nullptr) {
    AccumulateBlocks<true>(w, w_stride, rows, v, v_stride, v_scales, n, dim, o,
                           o_stride);
  } else {
    AccumulateBlocks<false>(w, w_stride, rows, v, v_stride, v_scales, n, dim, o,
                            o_stride);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_DECODE_INL_H_

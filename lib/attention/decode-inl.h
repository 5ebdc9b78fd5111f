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

// Scores of `rows` query rows against n stored key rows:
//   sc[r * sc_stride + s] = k_scale(s) * sum_{p < dim} q[r * q_stride + p] *
//                           K(s, p)
// for r < rows, s < n, with K(s, p) = LoadStored(k + s * k_stride + p) and
// k_scale(s) = k_scales[s] for int8 (null otherwise: 1). dim is a multiple of
// the vector length (rows zero-padded), q and k rows aligned. v (may be null)
// are the same keys' V rows, stride v_stride: hinted to the prefetcher as the
// keys go by.
template <class T>
HWY_INLINE void ScoreRows(const float* HWY_RESTRICT q, size_t q_stride,
                          size_t rows, const T* HWY_RESTRICT k, size_t k_stride,
                          const float* HWY_RESTRICT k_scales, size_t n,
                          size_t dim, const T* HWY_RESTRICT v, size_t v_stride,
                          float* HWY_RESTRICT sc, size_t sc_stride) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t s = 0; s < n; ++s) {
    const T* k_row = k + s * k_stride;
    if (v != nullptr) hwy::Prefetch(v + s * v_stride);
    for (size_t r = 0; r < rows; ++r) {
      const float* q_row = q + r * q_stride;
      auto acc = hn::Zero(d);
      for (size_t p = 0; p < dim; p += N) {
        acc = hn::MulAdd(hn::Load(d, q_row + p), LoadStored(d, k_row + p), acc);
      }
      float score = hn::GetLane(hn::SumOfLanes(d, acc));
      if (k_scales != nullptr) score *= k_scales[s];
      sc[r * sc_stride + s] = score;
    }
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
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t s = 0; s < n; ++s) {
    const T* v_row = v + s * v_stride;
    for (size_t r = 0; r < rows; ++r) {
      float weight = w[r * w_stride + s];
      if (v_scales != nullptr) weight *= v_scales[s];
      const auto vw = hn::Set(d, weight);
      float* o_row = o + r * o_stride;
      for (size_t p = 0; p < dim; p += N) {
        hn::Store(
            hn::MulAdd(vw, LoadStored(d, v_row + p), hn::Load(d, o_row + p)), d,
            o_row + p);
      }
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_DECODE_INL_H_

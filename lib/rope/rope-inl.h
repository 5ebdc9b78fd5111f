// RoPE: the per-target kernels (cos and sin of a row's angles, the rotation of
// one head). rope.cc runs them for ApplyRope; the layer (layer.cc) includes
// this header and calls them on the Q and K heads of its projection.

// Non-SIMD part: normal include guard.
#ifndef HEADWAY_LIB_ROPE_ROPE_INL_H_PLAN_
#define HEADWAY_LIB_ROPE_ROPE_INL_H_PLAN_

#include <stddef.h>
#include <stdint.h>

#include "headway/rope.h"

namespace headway {

// 2 pi = kTwoPi1 + kTwoPi2 + kTwoPi3 (Cody and Waite): kTwoPi1 and kTwoPi2
// have 24 significant bits each, so k * kTwoPi1 and k * kTwoPi2 are exact for
// integers k < 2^29 (positions < 2^31 at freq <= 1); the three sum to 2 pi
// within 4e-31.
inline constexpr double kTwoPi1 = 6.2831854820251465;
inline constexpr double kTwoPi2 = -1.7484555314695172e-07;
inline constexpr double kTwoPi3 = -6.8604979977715316e-15;
inline constexpr double kInvTwoPi = 0.15915494309189535;

}  // namespace headway

#endif  // HEADWAY_LIB_ROPE_ROPE_INL_H_PLAN_

// Per-target part: toggle guard, included once per target by foreach_target.h.
#if defined(HEADWAY_LIB_ROPE_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ROPE_ROPE_INL_H_
#undef HEADWAY_LIB_ROPE_ROPE_INL_H_
#else
#define HEADWAY_LIB_ROPE_ROPE_INL_H_
#endif

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// cos_sin[i] = cos(pos * freq[i]), cos_sin[n + i] = sin(pos * freq[i]) for i
// < n, rounded to float once: the angle is taken in float64 and reduced
// modulo 2 pi (kTwoPi1..3) into about [-pi, pi], where hn::Cos and hn::Sin
// (float64, 3 ulp) are accurate.
template <class D>  // D: float64 lanes
HWY_INLINE void RopeCosSinLanes(D d, const double* HWY_RESTRICT freq,
                                double pos, size_t i, float* HWY_RESTRICT cos,
                                float* HWY_RESTRICT sin) {
  const hn::Rebind<float, D> df;
  const auto angle = hn::Mul(hn::Set(d, pos), hn::LoadU(d, freq + i));
  const auto k = hn::Round(hn::Mul(angle, hn::Set(d, kInvTwoPi)));
  auto r = hn::NegMulAdd(k, hn::Set(d, kTwoPi1), angle);
  r = hn::NegMulAdd(k, hn::Set(d, kTwoPi2), r);
  r = hn::NegMulAdd(k, hn::Set(d, kTwoPi3), r);
  hn::StoreU(hn::DemoteTo(df, hn::Cos(d, r)), df, cos + i);
  hn::StoreU(hn::DemoteTo(df, hn::Sin(d, r)), df, sin + i);
}

HWY_INLINE void RopeCosSin(const double* HWY_RESTRICT freq, size_t n,
                           int64_t pos, float* HWY_RESTRICT cos_sin) {
  const hn::ScalableTag<double> d;
  const hn::CappedTag<double, 1> d1;
  const size_t N = hn::Lanes(d);
  const double p = static_cast<double>(pos);
  size_t i = 0;
  for (; i + N <= n; i += N)
    RopeCosSinLanes(d, freq, p, i, cos_sin, cos_sin + n);
  for (; i < n; ++i) RopeCosSinLanes(d1, freq, p, i, cos_sin, cos_sin + n);
}

// Rotates pairs [i, i + Lanes(d)) of one head: a' = a c - b s, b' = b c + a s.
template <RopeLayout kLayout, class D>
HWY_INLINE void RopeRotateLanes(D d, size_t half, const float* HWY_RESTRICT cos,
                                const float* HWY_RESTRICT sin, size_t i,
                                float* HWY_RESTRICT head) {
  hn::Vec<D> a, b;
  if (kLayout == RopeLayout::kHalves) {
    a = hn::LoadU(d, head + i);
    b = hn::LoadU(d, head + half + i);
  } else {
    hn::LoadInterleaved2(d, head + 2 * i, a, b);
  }
  const auto c = hn::LoadU(d, cos + i);
  const auto s = hn::LoadU(d, sin + i);
  const auto a_out = hn::MulSub(a, c, hn::Mul(b, s));
  const auto b_out = hn::MulAdd(b, c, hn::Mul(a, s));
  if (kLayout == RopeLayout::kHalves) {
    hn::StoreU(a_out, d, head + i);
    hn::StoreU(b_out, d, head + half + i);
  } else {
    hn::StoreInterleaved2(a_out, b_out, d, head + 2 * i);
  }
}

// Rotates the first 2 * half elements of each of n_heads heads, head_dim
// apart, by the angles whose cos and sin are cos_sin [2 * half] (RopeCosSin).
template <RopeLayout kLayout>
HWY_INLINE void RopeRotateHeads(const float* HWY_RESTRICT cos_sin, size_t half,
                                float* HWY_RESTRICT heads, size_t n_heads,
                                size_t head_dim) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const size_t N = hn::Lanes(d);
  const float* cos = cos_sin;
  const float* sin = cos_sin + half;
  for (size_t h = 0; h < n_heads; ++h) {
    float* head = heads + h * head_dim;
    size_t i = 0;
    for (; i + N <= half; i += N) {
      RopeRotateLanes<kLayout>(d, half, cos, sin, i, head);
    }
    for (; i < half; ++i) RopeRotateLanes<kLayout>(d1, half, cos, sin, i, head);
  }
}

// The layout as a template argument: one switch per row.
HWY_INLINE void RopeRotate(RopeLayout layout, const float* HWY_RESTRICT cos_sin,
                           size_t half, float* HWY_RESTRICT heads,
                           size_t n_heads, size_t head_dim) {
  if (layout == RopeLayout::kHalves) {
    RopeRotateHeads<RopeLayout::kHalves>(cos_sin, half, heads, n_heads,
                                         head_dim);
  } else {
    RopeRotateHeads<RopeLayout::kInterleaved>(cos_sin, half, heads, n_heads,
                                              head_dim);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ROPE_ROPE_INL_H_

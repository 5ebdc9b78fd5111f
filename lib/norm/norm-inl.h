// RMSNorm of heads: the per-target kernel. norm.cc runs it for RmsNormHeads;
// the layer (layer.cc) includes this header for QK-norm.

// Per-target part: toggle guard, included once per target by foreach_target.h.
#if defined(HEADWAY_LIB_NORM_NORM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_NORM_NORM_INL_H_
#undef HEADWAY_LIB_NORM_NORM_INL_H_
#else
#define HEADWAY_LIB_NORM_NORM_INL_H_
#endif

#include <stddef.h>

#include <cmath>
#include <limits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// sum + x[i, i + Lanes(d))^2, the floats widened to float64 (D).
template <class D>
HWY_INLINE hn::Vec<D> SumSquaresLanes(D d, const float* HWY_RESTRICT x,
                                      size_t i, hn::Vec<D> sum) {
  const auto v = hn::PromoteTo(d, hn::LoadU(hn::Rebind<float, D>(), x + i));
  return hn::MulAdd(v, v, sum);
}

// x[i, i + Lanes(d)) = x * factor * weight in float64, rounded once.
template <class D>
HWY_INLINE void ScaleLanes(D d, hn::Vec<D> factor,
                           const float* HWY_RESTRICT weight, size_t i,
                           float* HWY_RESTRICT x) {
  const hn::Rebind<float, D> df;
  const auto v = hn::PromoteTo(d, hn::LoadU(df, x + i));
  const auto w = hn::PromoteTo(d, hn::LoadU(df, weight + i));
  hn::StoreU(hn::DemoteTo(df, hn::Mul(hn::Mul(v, factor), w)), df, x + i);
}

// x [n] = x / sqrt(mean(x^2) + eps) * weight [n], in place, in float64 (no
// overflow or underflow for finite floats). NaN or inf in x: all NaN; all
// zeros with eps == 0: zeros.
HWY_INLINE void RmsNormHead(float* HWY_RESTRICT x, size_t n,
                            const float* HWY_RESTRICT weight, double eps) {
  const hn::ScalableTag<double> d;
  const hn::CappedTag<double, 1> d1;
  const size_t N = hn::Lanes(d);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    sum0 = SumSquaresLanes(d, x, i, sum0);
    sum1 = SumSquaresLanes(d, x, i + N, sum1);
  }
  for (; i + N <= n; i += N) sum0 = SumSquaresLanes(d, x, i, sum0);
  double sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
  for (; i < n; ++i) {
    sum = hn::GetLane(SumSquaresLanes(d1, x, i, hn::Set(d1, sum)));
  }
  const double mean = sum / static_cast<double>(n) + eps;
  double factor = 1.0 / std::sqrt(mean);
  if (!std::isfinite(sum)) factor = std::numeric_limits<double>::quiet_NaN();
  if (mean == 0.0) factor = 0.0;
  const auto vfactor = hn::Set(d, factor);
  i = 0;
  for (; i + N <= n; i += N) ScaleLanes(d, vfactor, weight, i, x);
  for (; i < n; ++i) ScaleLanes(d1, hn::Set(d1, factor), weight, i, x);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_NORM_NORM_INL_H_

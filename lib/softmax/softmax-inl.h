// Numerically stable softmax over rows: the per-target kernels.
//
// The attention kernels include this header from their own per-target
// translation units and call SoftmaxRow / SoftmaxRows directly (no second
// dispatch).
//
// Algorithm, for a row of n logits z = scale * x, cut into blocks whose number
// and length depend on n only, never on the number of threads:
// - pass 1, per block b: m_b = max z over the block, then y = exp(z - m_b) and
//   its sum s_b. The block is still in L1 from the max when exp reads it, so a
//   row far larger than the caches is read from memory once here;
// - combine, in double: m = max_b m_b, S = sum_b s_b * exp(m_b - m);
// - pass 2, per block: y *= exp(m_b - m) / S.
// One exp per element, and memory traffic of 2 reads + 2 writes per element for
// huge rows instead of 3 + 2 for the textbook max / exp-sum / normalize passes.
// For short rows (one block) it is exactly the textbook algorithm.
//
// Error, with u = 2^-24, to first order in u (softmax.h states the bound):
// every pass computes z = fl(scale * x) the same way (no FMA contraction:
// meson.build), so m = max z is one of the z and z_k - m = 0 for the largest.
// With t = scale * (x - x_max) the exact argument, the computed one is
//   fl(z - m_b) + (m_b - m) = t + (z - m_b) e + scale x d_x - scale x_max d_max
// (|e|, |d| <= u; d = 0 when scale is a power of two). The last term is common
// to all elements and cancels in the normalisation; what is left moves y by
//   delta_i - sum_j y_j delta_j, delta_j = |z_j - m| u + |z_j| u
// and sum_j y_j |z_j - m| <= ln n (the entropy of y), sum_j y_j |z_j| <= |m| +
// ln n. Exp is within 1 ulp (2u) for the element and on average for the sum,
// the compensated block sums reduced in double add 2u, the factor exp(m_b - m)
// / S is rounded once (u), the final product once (u): 8u. Outputs below
// FLT_MIN are rounded to the denormal grid (2^-149) by exp and the product.

// Non-SIMD part: normal include guard.
#ifndef HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_PLAN_
#define HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_PLAN_

#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/blocks.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace headway {

// How a row of n elements is cut into blocks.
struct SoftmaxBlocks : EvenBlocks {
  // 2048 floats = 8 KiB: a block stays in the 48 KiB L1d between its max and
  // its exp pass, together with the output it writes.
  static constexpr size_t kMinLength = 2048;
  // Per-block statistics live on the stack; rows longer than 256 * 2048 get
  // longer blocks.
  static constexpr size_t kMaxCount = 256;

  // Lengths are multiples of 64 floats (one AVX-512 vector x 4) so that only
  // the last block has a tail.
  explicit SoftmaxBlocks(size_t n)
      : EvenBlocks(n, std::min(kMaxCount, (n + kMinLength - 1) / kMinLength),
                   64) {}
};

// Work below this many elements is not worth a TBB task (~10 us of exp at ~1
// element/ns).
inline constexpr size_t kSoftmaxGrainElements = 16384;

}  // namespace headway

#endif  // HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_PLAN_

// Per-target part: toggle guard, included once per target by foreach_target.h.
#if defined(HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_
#undef HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_
#else
#define HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_
#endif

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The largest lane of v (-inf if all are). Highway 1.0.3's EMU128 MaxOfLanes
// starts from the lowest finite float, which an all -inf vector would return.
template <class D, class V = hn::Vec<D>>
HWY_INLINE float MaxLane(D d, V v) {
#if HWY_TARGET == HWY_EMU128
  HWY_ALIGN float lanes[hn::MaxLanes(d)];
  hn::Store(v, d, lanes);
  return *std::max_element(lanes, lanes + hn::Lanes(d));
#else
  return hn::GetLane(hn::MaxOfLanes(d, v));
#endif
}

// hn::Exp(x) with 0 for NaN lanes (as hn::Exp gives on x86) on every target:
// EMU128 and SCALAR would convert the NaN to an integer (undefined behaviour).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpNaNToZero(D d, V x) {
  const V neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  return hn::Exp(d, hn::IfThenElse(hn::Eq(x, x), x, neg_inf));
}

// Max of scale * x[0, n), n >= 1. *special is set if any scaled value is NaN or
// +inf.
HWY_INLINE float SoftmaxBlockMax(const float* HWY_RESTRICT x, size_t n,
                                 float scale, bool* special) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vscale = hn::Set(d, scale);
  const auto vinf = hn::Set(d, std::numeric_limits<float>::infinity());
  // Four accumulators hide the latency of Max; NaN/+inf are tracked apart
  // because Max drops NaN on x86 and Exp maps NaN to 0.
  auto max0 = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto max1 = max0, max2 = max0, max3 = max0;
  auto bad = hn::Lt(vinf, vinf);  // all false (1.0.3 has no MaskFalse)
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto z0 = hn::Mul(vscale, hn::LoadU(d, x + i));
    const auto z1 = hn::Mul(vscale, hn::LoadU(d, x + i + N));
    const auto z2 = hn::Mul(vscale, hn::LoadU(d, x + i + 2 * N));
    const auto z3 = hn::Mul(vscale, hn::LoadU(d, x + i + 3 * N));
    max0 = hn::Max(max0, z0);
    max1 = hn::Max(max1, z1);
    max2 = hn::Max(max2, z2);
    max3 = hn::Max(max3, z3);
    // !(z < inf) is true exactly for NaN and +inf.
    const auto ok = hn::And(hn::And(hn::Lt(z0, vinf), hn::Lt(z1, vinf)),
                            hn::And(hn::Lt(z2, vinf), hn::Lt(z3, vinf)));
    bad = hn::Or(bad, hn::Not(ok));
  }
  for (; i + N <= n; i += N) {
    const auto z = hn::Mul(vscale, hn::LoadU(d, x + i));
    max0 = hn::Max(max0, z);
    bad = hn::Or(bad, hn::Not(hn::Lt(z, vinf)));
  }
  max0 = hn::Max(hn::Max(max0, max1), hn::Max(max2, max3));
  float result = MaxLane(d, max0);
  bool any_bad = !hn::AllFalse(d, bad);
  // Tail: one element at a time with the same scaling (no masked loads: they
  // are full-width aligned loads on SSE4 and would read past the row).
  for (; i < n; ++i) {
    const float z = scale * x[i];
    any_bad |= !(z < std::numeric_limits<float>::infinity());
    result = std::max(result, z);
  }
  *special |= any_bad;
  return result;
}

// y[i] = exp(scale * x[i] - max) for i in [0, n); returns the sum of the y
// (compensated). y may equal x. max is finite.
HWY_INLINE double SoftmaxBlockExp(const float* x, float* y, size_t n,
                                  float scale, float max) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const size_t N = hn::Lanes(d);
  const auto vscale = hn::Set(d, scale);
  const auto vmax = hn::Set(d, max);
  // Kahan summation per lane, two independent chains: the sum's error stays ~2
  // ulp for any n.
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  auto comp0 = hn::Zero(d), comp1 = hn::Zero(d);
  const auto kahan_add = [](auto& sum, auto& comp, auto value) HWY_ATTR {
    const auto corrected = hn::Sub(value, comp);
    const auto next = hn::Add(sum, corrected);
    comp = hn::Sub(hn::Sub(next, sum), corrected);
    sum = next;
  };
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto e0 =
        hn::Exp(d, hn::Sub(hn::Mul(vscale, hn::LoadU(d, x + i)), vmax));
    const auto e1 =
        hn::Exp(d, hn::Sub(hn::Mul(vscale, hn::LoadU(d, x + i + N)), vmax));
    hn::StoreU(e0, d, y + i);
    hn::StoreU(e1, d, y + i + N);
    kahan_add(sum0, comp0, e0);
    kahan_add(sum1, comp1, e1);
  }
  for (; i + N <= n; i += N) {
    const auto e =
        hn::Exp(d, hn::Sub(hn::Mul(vscale, hn::LoadU(d, x + i)), vmax));
    hn::StoreU(e, d, y + i);
    kahan_add(sum0, comp0, e);
  }
  // Lanes are reduced in double: exact enough that the order of lanes does not
  // matter.
  HWY_ALIGN float lanes[4][hn::MaxLanes(d)];
  hn::Store(sum0, d, lanes[0]);
  hn::Store(comp0, d, lanes[1]);
  hn::Store(sum1, d, lanes[2]);
  hn::Store(comp1, d, lanes[3]);
  double total = 0.0;
  for (size_t lane = 0; lane < N; ++lane) {
    total += (static_cast<double>(lanes[0][lane]) - lanes[1][lane]) +
             (static_cast<double>(lanes[2][lane]) - lanes[3][lane]);
  }
  // Tail: the same Exp on one-lane vectors, so a value does not depend on its
  // position.
  const auto vscale1 = hn::Set(d1, scale);
  const auto vmax1 = hn::Set(d1, max);
  for (; i < n; ++i) {
    const auto e =
        hn::Exp(d1, hn::Sub(hn::Mul(vscale1, hn::LoadU(d1, x + i)), vmax1));
    hn::StoreU(e, d1, y + i);
    total += hn::GetLane(e);
  }
  return total;
}

// y[i] *= factor for i in [0, n).
HWY_INLINE void SoftmaxBlockScale(float* HWY_RESTRICT y, size_t n,
                                  float factor) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vfactor = hn::Set(d, factor);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Mul(hn::LoadU(d, y + i), vfactor), d, y + i);
  }
  for (; i < n; ++i) y[i] *= factor;
}

// y[0, n) = value.
HWY_INLINE void SoftmaxFill(float* HWY_RESTRICT y, size_t n, float value) {
  std::fill(y, y + n, value);
}

// Statistics of one block after pass 1.
struct SoftmaxBlockStats {
  float max;     // m_b; -inf if the block is all -inf
  double sum;    // s_b = sum exp(z - m_b)
  bool special;  // a NaN or +inf in the block
};

// Pass 1 over block b of a row.
HWY_INLINE SoftmaxBlockStats SoftmaxPass1(const float* x, float* y, size_t n,
                                          const SoftmaxBlocks& blocks, size_t b,
                                          float scale) {
  const size_t begin = blocks.Begin(b), size = blocks.Size(b, n);
  SoftmaxBlockStats stats{0.0f, 0.0, false};
  stats.max = SoftmaxBlockMax(x + begin, size, scale, &stats.special);
  if (stats.special) return stats;
  if (stats.max == -std::numeric_limits<float>::infinity()) {
    SoftmaxFill(y + begin, size, 0.0f);  // pass 2 multiplies by 0: stays 0
    return stats;
  }
  stats.sum = SoftmaxBlockExp(x + begin, y + begin, size, scale, stats.max);
  return stats;
}

// Combines the blocks' statistics into each block's final factor exp(m_b - m) /
// S, written to factors[0, count). Returns false (and the value to fill the row
// with) for special rows.
HWY_INLINE bool SoftmaxCombine(const SoftmaxBlockStats* stats, size_t count,
                               float* factors, float* fill) {
  float max = -std::numeric_limits<float>::infinity();
  for (size_t b = 0; b < count; ++b) {
    if (stats[b].special) {
      *fill = std::numeric_limits<float>::quiet_NaN();
      return false;
    }
    max = std::max(max, stats[b].max);
  }
  if (max == -std::numeric_limits<float>::infinity()) {
    *fill = 0.0f;  // every logit is -inf: a fully masked row
    return false;
  }
  double total = 0.0;
  for (size_t b = 0; b < count; ++b) {
    // exp(-inf) = 0 for all -inf blocks; exp(m_b - m) <= 1.
    total += stats[b].sum * std::exp(static_cast<double>(stats[b].max) - max);
  }
  for (size_t b = 0; b < count; ++b) {
    factors[b] = static_cast<float>(
        std::exp(static_cast<double>(stats[b].max) - max) / total);
  }
  return true;
}

// Softmax of one row of n >= 1 elements, single-threaded. y may equal x.
HWY_INLINE void SoftmaxRow(const float* x, float* y, size_t n, float scale) {
  const SoftmaxBlocks blocks(n);
  SoftmaxBlockStats stats[SoftmaxBlocks::kMaxCount];
  float factors[SoftmaxBlocks::kMaxCount];
  for (size_t b = 0; b < blocks.count; ++b) {
    stats[b] = SoftmaxPass1(x, y, n, blocks, b, scale);
  }
  float fill = 0.0f;
  if (!SoftmaxCombine(stats, blocks.count, factors, &fill)) {
    SoftmaxFill(y, n, fill);
    return;
  }
  for (size_t b = 0; b < blocks.count; ++b) {
    SoftmaxBlockScale(y + blocks.Begin(b), blocks.Size(b, n), factors[b]);
  }
}

// One long row with its blocks spread over threads: the same blocks and the
// same arithmetic as SoftmaxRow, so the result is identical.
HWY_INLINE void SoftmaxRowParallel(const float* x, float* y, size_t n,
                                   float scale) {
  const SoftmaxBlocks blocks(n);
  SoftmaxBlockStats stats[SoftmaxBlocks::kMaxCount];
  float factors[SoftmaxBlocks::kMaxCount];
  const size_t grain =
      std::max<size_t>(1, kSoftmaxGrainElements / blocks.length);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, blocks.count, grain),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t b = range.begin(); b < range.end(); ++b) {
                        stats[b] = SoftmaxPass1(x, y, n, blocks, b, scale);
                      }
                    });
  float fill = 0.0f;
  if (!SoftmaxCombine(stats, blocks.count, factors, &fill)) {
    SoftmaxFill(y, n, fill);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, blocks.count, grain),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t b = range.begin(); b < range.end(); ++b) {
                        SoftmaxBlockScale(y + blocks.Begin(b),
                                          blocks.Size(b, n), factors[b]);
                      }
                    });
}

// Softmax of each row of x [rows, cols] (row stride x_stride) into y (row
// stride y_stride). Rows run in parallel; a few long rows run their blocks in
// parallel instead. Either way the result does not depend on the number of
// threads.
HWY_INLINE void SoftmaxRows(const float* x, size_t x_stride, float* y,
                            size_t y_stride, size_t rows, size_t cols,
                            float scale) {
  if (rows == 1 || cols >= SoftmaxBlocks::kMinLength * 8) {
    // Few, long rows: parallelism comes from the blocks of each row.
    for (size_t r = 0; r < rows; ++r) {
      SoftmaxRowParallel(x + r * x_stride, y + r * y_stride, cols, scale);
    }
    return;
  }
  const size_t grain = std::max<size_t>(1, kSoftmaxGrainElements / cols);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, rows, grain),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t r = range.begin(); r < range.end(); ++r) {
                        SoftmaxRow(x + r * x_stride, y + r * y_stride, cols,
                                   scale);
                      }
                    });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_SOFTMAX_SOFTMAX_INL_H_

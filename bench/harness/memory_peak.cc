// Streaming read and copy: the memory bandwidth ceilings (and the L2 one, on a
// small buffer).
#include <stddef.h>
#include <stdint.h>

#include "bench/harness/peak_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/harness/memory_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four streams (the quarters of data), two vectors of each per step, into
// eight independent sums: 2 loads per cycle from L1/L2 with a 3-cycle Add need
// >= 6 in flight for the L2 ceiling. The hardware prefetchers keep more lines
// in flight for several streams: one stream read at 0.83x / 0.77x the rate of
// four (1 / 2 threads, Zen 5 VM, medians of 6 alternating runs), below what
// decode, which streams K and V, reads. n: a multiple of 8 vectors.
float ReadSumT(const float* HWY_RESTRICT data, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t quarter = n / 4;
  const float* HWY_RESTRICT a = data;
  const float* HWY_RESTRICT b = data + quarter;
  const float* HWY_RESTRICT c = data + 2 * quarter;
  const float* HWY_RESTRICT e = data + 3 * quarter;
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
       s7 = s0;
  for (size_t i = 0; i < quarter; i += 2 * N) {
    s0 = hn::Add(s0, hn::Load(d, a + i));
    s1 = hn::Add(s1, hn::Load(d, b + i));
    s2 = hn::Add(s2, hn::Load(d, c + i));
    s3 = hn::Add(s3, hn::Load(d, e + i));
    s4 = hn::Add(s4, hn::Load(d, a + i + N));
    s5 = hn::Add(s5, hn::Load(d, b + i + N));
    s6 = hn::Add(s6, hn::Load(d, c + i + N));
    s7 = hn::Add(s7, hn::Load(d, e + i + N));
  }
  const auto sum = hn::Add(hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)),
                           hn::Add(hn::Add(s4, s5), hn::Add(s6, s7)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

void CopyT(const float* HWY_RESTRICT src, float* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i < n; i += 4 * N) {
    const auto v0 = hn::Load(d, src + i);
    const auto v1 = hn::Load(d, src + i + N);
    const auto v2 = hn::Load(d, src + i + 2 * N);
    const auto v3 = hn::Load(d, src + i + 3 * N);
    hn::Store(v0, d, dst + i);
    hn::Store(v1, d, dst + i + N);
    hn::Store(v2, d, dst + i + 2 * N);
    hn::Store(v3, d, dst + i + 3 * N);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headway {
namespace bench {

HWY_EXPORT(ReadSumT);
HWY_EXPORT(CopyT);

namespace internal {

float ReadSum(const float* data, size_t n) {
  return HWY_DYNAMIC_DISPATCH(ReadSumT)(data, n);
}

void Copy(const float* src, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(CopyT)(src, dst, n);
}

}  // namespace internal
}  // namespace bench
}  // namespace headway
#endif  // HWY_ONCE

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

// Eight independent sums: 2 loads per cycle from L1/L2 with a 3-cycle Add need
// >= 6 in flight for the L2 ceiling; DRAM needs far fewer.
float ReadSumT(const float* HWY_RESTRICT data, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0,
       s7 = s0;
  for (size_t i = 0; i < n; i += 8 * N) {
    s0 = hn::Add(s0, hn::Load(d, data + i));
    s1 = hn::Add(s1, hn::Load(d, data + i + 1 * N));
    s2 = hn::Add(s2, hn::Load(d, data + i + 2 * N));
    s3 = hn::Add(s3, hn::Load(d, data + i + 3 * N));
    s4 = hn::Add(s4, hn::Load(d, data + i + 4 * N));
    s5 = hn::Add(s5, hn::Load(d, data + i + 5 * N));
    s6 = hn::Add(s6, hn::Load(d, data + i + 6 * N));
    s7 = hn::Add(s7, hn::Load(d, data + i + 7 * N));
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

// Streaming read and copy: the memory bandwidth ceilings (and the L2 one, on a
// small buffer); streaming read with arithmetic, the rate a kernel of a given
// intensity can read.
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

// acc[(s + f) % 12] += x * c for f < kFmas: one vector's MulAdds, spread over
// 12 accumulators (FMA latency x throughput needs 8) from slot s on.
template <size_t kFmas, class D, class V = hn::Vec<D>>
HWY_INLINE void MulAddsInto(V (&acc)[12], size_t s, V x, V c) {
  HWY_UNROLL(16)
  for (size_t f = 0; f < kFmas; ++f) {
    acc[(s + f) % 12] = hn::MulAdd(x, c, acc[(s + f) % 12]);
  }
}

// Two streams (the halves of data, as decode streams K and V), kFmas MulAdds
// per vector loaded: the read rate of a kernel with kFmas / 2 flops per byte
// whose arithmetic and loads are all it does. Three vectors of each stream
// per step fill the 12 accumulators evenly (6 kFmas slots); n: a multiple of
// kStreamElements.
template <size_t kFmas>
float ReadFmaLoop(const float* HWY_RESTRICT data, size_t n) {
  using D = hn::ScalableTag<float>;
  const D d;
  const size_t N = hn::Lanes(d);
  const size_t half = n / 2;
  const float* HWY_RESTRICT a = data;
  const float* HWY_RESTRICT b = data + half;
  const auto c = hn::Set(d, 0.5f);
  // Each from its own value: from equal ones, GCC 12 merges the accumulators
  // that see the same vectors and drops their MulAdds.
  hn::Vec<D> acc[12];
  HWY_UNROLL(12)
  for (size_t s = 0; s < 12; ++s) acc[s] = hn::Set(d, static_cast<float>(s));
  size_t i = 0;
  for (; i + 3 * N <= half; i += 3 * N) {
    HWY_UNROLL(3)
    for (size_t u = 0; u < 3; ++u) {
      MulAddsInto<kFmas, D>(acc, 2 * u * kFmas, hn::Load(d, a + i + u * N), c);
      MulAddsInto<kFmas, D>(acc, (2 * u + 1) * kFmas,
                            hn::Load(d, b + i + u * N), c);
    }
  }
  for (; i < half; i += N) {
    MulAddsInto<kFmas, D>(acc, 0, hn::Load(d, a + i), c);
    MulAddsInto<kFmas, D>(acc, kFmas, hn::Load(d, b + i), c);
  }
  HWY_UNROLL(12)
  for (size_t s = 1; s < 12; ++s) acc[0] = hn::Add(acc[0], acc[s]);
  return hn::GetLane(hn::SumOfLanes(d, acc[0]));
}

float ReadFmaT(const float* HWY_RESTRICT data, size_t n,
               size_t flops_per_byte) {
  switch (flops_per_byte) {
    case 2:
      return ReadFmaLoop<4>(data, n);
    case 4:
      return ReadFmaLoop<8>(data, n);
    default:
      return ReadFmaLoop<16>(data, n);
  }
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
HWY_EXPORT(ReadFmaT);
HWY_EXPORT(CopyT);

namespace internal {

float ReadSum(const float* data, size_t n) {
  return HWY_DYNAMIC_DISPATCH(ReadSumT)(data, n);
}

float ReadFma(const float* data, size_t n, size_t flops_per_byte) {
  return HWY_DYNAMIC_DISPATCH(ReadFmaT)(data, n, flops_per_byte);
}

void Copy(const float* src, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(CopyT)(src, dst, n);
}

}  // namespace internal
}  // namespace bench
}  // namespace headway
#endif  // HWY_ONCE

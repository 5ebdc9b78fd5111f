// Peak float32 FMA rate of one core, per target: independent MulAdd chains and
// nothing else.
#include <stddef.h>
#include <stdint.h>

#include "bench/harness/peak_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/harness/fma_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Chains in flight must cover latency x pipes: 4 cycles x 2 FMA pipes = 8 on
// Zen 4/5 and Skylake-X. AVX-512 has 32 registers, so 16 chains leave a margin
// for a longer latency; the 16-register x86 targets take 12 (plus mul, add and
// a temporary for SSE's separate Mul/Add, whose 3 + 2 cycles x 2 pipes need
// 10).
#if HWY_ARCH_X86 && HWY_TARGET != HWY_AVX3 && HWY_TARGET != HWY_AVX3_DL
constexpr size_t kChains = 12;
#else
constexpr size_t kChains = 16;
#endif

internal::FmaLoopResult FmaLoopT(uint64_t rounds, float mul, float add) {
  const hn::ScalableTag<float> d;
  using V = decltype(hn::Zero(d));
  const V vmul = hn::Set(d, mul);
  const V vadd = hn::Set(d, add);
  V acc[kChains];
  for (size_t i = 0; i < kChains; ++i) {
    acc[i] = hn::Set(d, static_cast<float>(i));
  }
  // mul and add come from the caller and every chain ends in the checksum:
  // nothing folds. bench/meson.build compiles this file without
  // auto-vectorization, or GCC would pack the SCALAR target's chains into SSE
  // vectors and report a vector peak as the scalar one.
  for (uint64_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < kChains; ++i)
      acc[i] = hn::MulAdd(acc[i], vmul, vadd);
  }
  V sum = acc[0];
  for (size_t i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  internal::FmaLoopResult result;
  result.flops = 2.0 * static_cast<double>(rounds) * kChains * hn::Lanes(d);
  result.checksum = hn::GetLane(hn::SumOfLanes(d, sum));
  result.target = HWY_TARGET;
  return result;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headway {
namespace bench {

HWY_EXPORT(FmaLoopT);

namespace internal {

FmaLoopResult FmaLoop(uint64_t rounds, float mul, float add) {
  return HWY_DYNAMIC_DISPATCH(FmaLoopT)(rounds, mul, add);
}

}  // namespace internal
}  // namespace bench
}  // namespace headway
#endif  // HWY_ONCE

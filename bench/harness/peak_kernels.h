// Kernels that measure the machine's ceilings (fma_peak.cc, memory_peak.cc):
// each call dispatches once, to the best target not above the cap
// (headway::SetMaxTarget). Internal to the harness; benchmarks use harness.h.
#ifndef HEADWAY_BENCH_HARNESS_PEAK_KERNELS_H_
#define HEADWAY_BENCH_HARNESS_PEAK_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

namespace headway {
namespace bench {
namespace internal {

struct FmaLoopResult {
  double flops;  // floating-point operations done (a MulAdd is 2 per lane)
  float
      checksum;  // depends on every accumulator, so the loop cannot be dropped
  int64_t target;  // Highway bit of the target that ran, to check the dispatch
};

// `rounds` rounds of independent MulAdd chains acc = acc * mul + add on as many
// vector accumulators as it takes to cover FMA latency x throughput. Use |mul|
// < 1 so that the accumulators converge to add / (1 - mul) instead of
// overflowing.
FmaLoopResult FmaLoop(uint64_t rounds, float mul, float add);

// Sum of data[0, n). data is 64-byte aligned and n a multiple of
// kStreamElements.
float ReadSum(const float* data, size_t n);

// A checksum of data[0, n) that takes flops_per_byte (2, 4 or 8) flops
// per byte read: two streams, 2 flops_per_byte MulAdds per float vector
// loaded. The same alignment and n as ReadSum.
float ReadFma(const float* data, size_t n, size_t flops_per_byte);

// dst[0, n) = src[0, n) with ordinary (write-allocate) stores, as the kernels
// write. Both are 64-byte aligned and n is a multiple of kStreamElements.
void Copy(const float* src, float* dst, size_t n);

// The unit of ReadSum and Copy: 8 AVX-512 vectors.
inline constexpr size_t kStreamElements = 128;

}  // namespace internal
}  // namespace bench
}  // namespace headway

#endif  // HEADWAY_BENCH_HARNESS_PEAK_KERNELS_H_

// The matmul micro-kernel alone, per target: lib/matmul/matmul-inl.h's
// MatmulStrip (for full tiles, MatmulTileFull), called as the driver calls it,
// on operands that stay in the caches, against the FMA ceiling.
//
// One packed A strip [MR][KC + 16] (25 KiB on AVX3: L1) times kPanels packed B
// slices [kc][NR] (256 KiB at kc = 512: L2, like one NC block of the driver)
// into an MR x (kPanels * NR) block of C (L1), C += A B on every pass after the
// first, as the driver's later K blocks do. kc:512 is the driver's K block
// (KC); kc:128 is the K of the per-head scores (head_dim), where each kernel
// call's prologue and epilogue (zeroing, C prefetch, the MR x NR update of C)
// weigh four times as much.
//
// What this row reaches is what the kernel's instruction stream allows; the
// matmul rows' "%FMA" below it is what packing, memory traffic and scheduling
// leave of it (docs/BENCHMARKS.md). Rows on several threads run one such loop
// per thread, as the all-core FMA ceiling does.
#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"
#include "headway/status.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/matmul_kernel_bench.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/matmul/matmul-inl.h"

// Per-target part.
HWY_BEFORE_NAMESPACE();
namespace headway {
namespace bench {
namespace HWY_NAMESPACE {

// The library's kernel and its per-target shapes.
using ::headway::HWY_NAMESPACE::kMatmulAStripFloats;
using ::headway::HWY_NAMESPACE::kMatmulMaxKC;
using ::headway::HWY_NAMESPACE::kMatmulMR;
using ::headway::HWY_NAMESPACE::kMatmulNR;
using ::headway::HWY_NAMESPACE::MatmulStrip;

// B slices per kernel pass: the driver's NC block at KC = 512 on AVX3.
constexpr size_t kPanels = 4;

// `reps` passes of the kernel over kPanels slices at depth kc (<= KC) on this
// thread's operands; returns the flops done (2 per multiply-add).
double MatmulKernelLoopT(size_t kc, uint64_t reps) {
  constexpr size_t NR = kMatmulNR;
  constexpr size_t kBFloats = kPanels * kMatmulMaxKC * NR;
  constexpr size_t kCFloats = kMatmulMR * kPanels * NR;
  // Per thread, filled once (uniform in [-1, 1)).
  thread_local const BufferPtr<float> buffer = [] {
    const size_t n = kMatmulAStripFloats + kBFloats + kCFloats;
    BufferPtr<float> floats = AllocateBuffer<float>(n);
    FillUniform(floats.get(), n, -1.0f, 1.0f, /*seed=*/7);
    return floats;
  }();
  float* a = buffer.get();
  const float* b = a + kMatmulAStripFloats;
  MatmulOut out;
  out.c = buffer.get() + kMatmulAStripFloats + kBFloats;
  out.ldc = kPanels * NR;
  for (uint64_t r = 0; r < reps; ++r) {
    for (size_t p = 0; p < kPanels; ++p) {
      // alpha alternates in sign so that C stays bounded over the passes.
      MatmulStrip(kMatmulMR, kc, a, b + p * kc * NR, out, 0, p * NR, NR,
                  (r & 1) ? -1.0f : 1.0f, 0.0f, r == 0, /*scales=*/nullptr);
    }
  }
  return 2.0 * static_cast<double>(kMatmulMR * NR * kc * kPanels) *
         static_cast<double>(reps);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headway {
namespace bench {
HWY_EXPORT(MatmulKernelLoopT);
namespace {

// One iteration: 128 passes at kc:512 (200 MFLOP per thread on AVX3, about
// 1 ms), as many flops at kc:128.
void BM_MatmulKernel(benchmark::State& state, const RunConfig& run) {
  const size_t kc = static_cast<size_t>(state.range(0));
  const uint64_t reps = 128 * 512 / kc;
  double flops = 0.0;
  const auto step = [&] {
    flops = 0.0;
    std::vector<double> per_thread(static_cast<size_t>(run.threads), 0.0);
    tbb::parallel_for(
        tbb::blocked_range<int>(0, run.threads, 1),
        [&](const tbb::blocked_range<int>& range) {
          for (int i = range.begin(); i != range.end(); ++i) {
            per_thread[static_cast<size_t>(i)] =
                HWY_DYNAMIC_DISPATCH(MatmulKernelLoopT)(kc, reps);
          }
        },
        tbb::simple_partitioner());
    for (double f : per_thread) flops += f;
    return Status::Ok();
  };
  if (!TimeSteps(state, step)) return;
  ReportCompute(state, flops, run.target, run.threads);
}

void RegisterMatmulKernel() {
  RegisterPerTarget("matmul_kernel", BM_MatmulKernel, {"kc"}, {{512}, {128}});
}
HEADWAY_REGISTER_BENCHMARKS(RegisterMatmulKernel);

}  // namespace
}  // namespace bench
}  // namespace headway
#endif  // HWY_ONCE

// headway::Softmax per target and thread count, on rows that fit L1, rows that
// fit L2, rows far larger than the caches, and short rows whose data is cold.
//
// Bytes counted: 8 per element, x read once and y written once (in place: x
// read and written), the least any softmax moves. The kernel reads a row that
// does not fit in the caches twice and writes it twice (softmax-inl.h), so on
// such rows it can reach at most ~50% of the copy ceiling; "%copy" shows how
// close it gets. Flops counted: 5 per element (max, subtract, exp, sum,
// normalize; exp counts as one), for the roofline: at 5 / 8 flop per byte a
// softmax is memory-bound on any machine (docs/BENCHMARKS.md).
//
// Cache-resident rows are bound by exp (~20 vector instructions per element),
// not by memory, and exp is no FMA-peak workload: they report elements/s,
// GFLOP/s and GB/s, to compare targets and thread counts, and no percentage.
#include <stddef.h>
#include <stdint.h>

#include <map>
#include <utility>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"
#include "headway/softmax.h"
#include "headway/view.h"

namespace headway {
namespace bench {
namespace {

// Rows of 2048 floats (8 KiB): softmax-inl.h's block length, so a row stays in
// the 48 KiB L1 from its max pass to its exp pass, with the 8 KiB it writes. 32
// rows: 256 KiB in + 256 KiB out stay in the 1 MiB L2 between iterations, and
// make 4 TBB tasks (grain 8 rows) for 2 threads. Decode-time attention has this
// shape: one row of scores per (head, query).
constexpr int64_t kL1Rows = 32, kL1Cols = 2048;
// One row of 65536 floats (256 KiB): fits L2 with its output (512 KiB); split
// into 32 blocks.
constexpr int64_t kL2Cols = 65536;
// One row of 16M floats (64 MiB, 128 MiB with its output): 4x the 32 MiB L3 of
// this CPU's CCD.
constexpr int64_t kHugeCols = int64_t{1} << 24;

constexpr double kBytesPerElement = 2 * sizeof(float);
constexpr double kFlopsPerElement = 5;

// Counters for `elements` per iteration: the DRAM copy ceiling bounds rows that
// do not stay in the caches; cache-resident rows have no ceiling.
void Report(benchmark::State& state, const RunConfig& run, int64_t elements,
            bool memory_bound) {
  const double n = static_cast<double>(elements);
  state.SetItemsProcessed(state.iterations() * elements);
  if (memory_bound) {
    ReportRoofline(state, kFlopsPerElement * n, kBytesPerElement * n,
                   MemoryCeiling::kCopy, run.target, run.threads);
  } else {
    ReportFlops(state, kFlopsPerElement * n);
    ReportBytes(state, kBytesPerElement * n);
  }
}

// Logits in [-8, 8) (exp spans 7 decades, like attention scores), one buffer
// per (size, seed) for the whole run: filling 64 MiB on every invocation of a
// benchmark would dominate the run time. Used from the benchmark runner's
// thread only.
float* SharedLogits(int64_t elements, uint64_t seed) {
  static std::map<std::pair<int64_t, uint64_t>, BufferPtr<float>> buffers;
  BufferPtr<float>& buffer = buffers[{elements, seed}];
  if (!buffer) {
    buffer = AllocateBuffer<float>(static_cast<size_t>(elements));
    FillUniform(buffer.get(), static_cast<size_t>(elements), -8.0f, 8.0f, seed);
  }
  return buffer.get();
}

// Out of place, the same x every iteration (warm when it fits the caches).
void BM_Softmax(benchmark::State& state, const RunConfig& run,
                bool memory_bound) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const float* x = SharedLogits(rows * cols, 1);
  float* y = SharedLogits(rows * cols, 2);
  // Alternate the scale so that no iteration repeats the previous one's work
  // exactly.
  float scale = 1.0f;
  for (auto _ : state) {
    if (!Check(state, Softmax(MatrixView<const float>(x, rows, cols),
                              MatrixView<float>(y, rows, cols), scale))) {
      break;
    }
    benchmark::ClobberMemory();
    scale = 1.5f - scale;
  }
  Report(state, run, rows * cols, memory_bound);
}

// In place on a row far larger than the caches. Softmax of a softmax is still a
// valid input.
void BM_SoftmaxInPlace(benchmark::State& state, const RunConfig& run) {
  const int64_t rows = state.range(0), cols = state.range(1);
  float* data = SharedLogits(rows * cols, 3);
  for (auto _ : state) {
    if (!Check(state, SoftmaxInPlace(MatrixView<float>(data, rows, cols))))
      break;
    benchmark::ClobberMemory();
  }
  Report(state, run, rows * cols, /*memory_bound=*/true);
}

// In place on short rows whose data is cold: every iteration takes the next of
// kColdBytes of buffers, as attention does when each head's scores were written
// long before.
void BM_SoftmaxCold(benchmark::State& state, const RunConfig& run) {
  const int64_t rows = state.range(0), cols = state.range(1);
  static RotatingBuffers<float>* const buffers = [] {
    auto* rotating = new RotatingBuffers<float>(kL1Rows * kL1Cols);
    for (size_t i = 0; i < rotating->count(); ++i) {
      FillUniform((*rotating)[i], rotating->elements(), -8.0f, 8.0f, 5 + i);
    }
    return rotating;
  }();
  for (auto _ : state) {
    if (!Check(state, SoftmaxInPlace(
                          MatrixView<float>(buffers->Next(), rows, cols)))) {
      break;
    }
    benchmark::ClobberMemory();
  }
  Report(state, run, rows * cols, /*memory_bound=*/true);
}

void RegisterSoftmax() {
  RegisterPerTarget(
      "softmax",
      [](benchmark::State& state, const RunConfig& run) {
        BM_Softmax(state, run, /*memory_bound=*/false);
      },
      {"rows", "cols"}, {{kL1Rows, kL1Cols}, {1, kL2Cols}},
      /*every_target_sets=*/2);
  RegisterPerTarget("softmax",
                    [](benchmark::State& state, const RunConfig& run) {
                      BM_Softmax(state, run, /*memory_bound=*/true);
                    },
                    {"rows", "cols"}, {{1, kHugeCols}});
  RegisterPerTarget("softmax_inplace", BM_SoftmaxInPlace, {"rows", "cols"},
                    {{1, kHugeCols}});
  RegisterPerTarget("softmax_cold", BM_SoftmaxCold, {"rows", "cols"},
                    {{kL1Rows, kL1Cols}});
}

HEADWAY_REGISTER_BENCHMARKS(RegisterSoftmax);

}  // namespace
}  // namespace bench
}  // namespace headway

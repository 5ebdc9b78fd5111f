// The machine's ceilings, measured in-process at start: FMA peak per target
// (one core) and of the best target on all cores, DRAM read and copy bandwidth,
// L2 read bandwidth.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench/harness/harness.h"
#include "bench/harness/peak_kernels.h"
#include "benchmark/benchmark.h"
#include "headway/targets.h"
#include "hwy/targets.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"
#include "tbb/task_arena.h"

namespace headway {
namespace bench {
namespace {

using internal::kStreamElements;

// 512 MiB: 16x the 32 MiB L3 of a Zen 5 CCD, so nearly every byte comes from
// DRAM.
constexpr size_t kMemoryBytes = size_t{512} << 20;
// L2-resident: a quarter of Zen 4/5's 1 MiB L2 (Intel's are 1-2 MiB), far above
// the 48 KiB L1.
constexpr size_t kL2Bytes = size_t{256} << 10;

Ceilings& MutableCeilings() {
  static Ceilings ceilings;
  return ceilings;
}

double Seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Results flow here so that no measured loop is dead code.
volatile float sink;

// The best rate (units per second) of `trial(reps)`, which does `reps`
// repetitions of some work and returns the units of work done. Trials repeat
// for `budget_s` (at least 3 of them); the best one is the ceiling, because
// noise (other processes, interrupts, clock ramp-up) only ever slows a trial
// down. `reps` grows until a trial lasts budget_s / 8.
template <class Trial>
double BestRate(double budget_s, int threads, const Trial& trial) {
  double best = 0.0;
  // 1 thread: on the CPU of every 1-thread row (PinnedIfOneThread).
  PinnedIfOneThread(threads, [&] {
    const double deadline = Seconds() + budget_s;
    uint64_t reps = 1;
    for (int trials = 0;; ++trials) {
      const double start = Seconds();
      const double units = trial(reps);
      const double elapsed = Seconds() - start;
      best = std::max(best, units / std::max(elapsed, 1e-9));
      if (trials >= 2 && Seconds() >= deadline) break;
      if (elapsed < budget_s / 8) {
        const double grow = budget_s / 8 / std::max(elapsed, 1e-9);
        reps = static_cast<uint64_t>(static_cast<double>(reps) *
                                     std::clamp(grow, 1.5, 64.0)) +
               1;
      }
    }
  });
  return best;
}

// Runs body(i) for i in [0, threads), each on its own thread of the calling
// thread's arena of `threads` threads (a row's), or of `arena` (OnThreads).
template <class Body>
void ForEachThread(int threads, const Body& body) {
  tbb::parallel_for(
      tbb::blocked_range<int>(0, threads, 1),
      [&](const tbb::blocked_range<int>& range) {
        for (int i = range.begin(); i != range.end(); ++i) body(i);
      },
      tbb::simple_partitioner());
}
template <class Body>
void OnThreads(tbb::task_arena& arena, int threads, const Body& body) {
  arena.execute([&] { ForEachThread(threads, body); });
}

// `floats` floats set to 1, every page first touched by the threads of an
// arena of all the CPUs, so that the pages spread over the NUMA nodes the
// threads run on and no measurement pays for a page fault.
BufferPtr<float> TouchedBuffer(size_t floats) {
  BufferPtr<float> buffer = AllocateBuffer<float>(floats);
  tbb::task_arena arena(AllThreads());
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, floats, 1 << 20),
                      [&](const tbb::blocked_range<size_t>& range) {
                        std::fill(buffer.get() + range.begin(),
                                  buffer.get() + range.end(), 1.0f);
                      });
  });
  return buffer;
}

// FMA GFLOP/s of the currently capped target on `threads` threads (1: the
// calling thread).
double MeasureFma(double budget_s, int threads, int64_t expected_target) {
  tbb::task_arena arena(threads);
  return 1e-9 * BestRate(budget_s, threads, [&](uint64_t reps) {
           // 1024 rounds x 16 chains of AVX-512 is ~8 us: reps of that amortize
           // the call.
           const uint64_t rounds = reps * 1024;
           std::vector<internal::FmaLoopResult> results(threads);
           OnThreads(arena, threads, [&](int i) {
             results[i] = internal::FmaLoop(rounds, 0.999999f, 1e-3f * (i + 1));
           });
           double flops = 0.0;
           for (const internal::FmaLoopResult& result : results) {
             if (result.target != expected_target) {
               fprintf(stderr,
                       "headway_bench: FMA ceiling dispatched to %s, not %s\n",
                       hwy::TargetName(result.target),
                       hwy::TargetName(expected_target));
             }
             sink = result.checksum;
             flops += result.flops;
           }
           return flops;
         });
}

// Read bandwidth, GB/s, of `threads` threads each summing its own slice of
// `slice_floats` floats of `data`, `reps` times per trial.
double MeasureRead(double budget_s, int threads, const float* data,
                   size_t slice_floats) {
  tbb::task_arena arena(threads);
  return 1e-9 * BestRate(budget_s, threads, [&](uint64_t reps) {
           std::vector<float> sums(threads);
           OnThreads(arena, threads, [&](int i) {
             float sum = 0.0f;
             for (uint64_t r = 0; r < reps; ++r) {
               sum += internal::ReadSum(data + i * slice_floats, slice_floats);
             }
             sums[i] = sum;
           });
           for (float sum : sums) sink = sum;
           return static_cast<double>(reps * threads * slice_floats *
                                      sizeof(float));
         });
}

// Copy bandwidth, GB/s, counting read + written bytes: the first half of
// data[0, floats) to the second, split among `threads` threads.
double MeasureCopy(double budget_s, int threads, float* data, size_t floats) {
  tbb::task_arena arena(threads);
  const size_t half = floats / 2;
  const size_t slice = half / threads / kStreamElements * kStreamElements;
  return 1e-9 * BestRate(budget_s, threads, [&](uint64_t reps) {
           OnThreads(arena, threads, [&](int i) {
             for (uint64_t r = 0; r < reps; ++r) {
               internal::Copy(data + i * slice, data + half + i * slice, slice);
             }
           });
           sink = data[half];
           return static_cast<double>(2 * reps * threads * slice *
                                      sizeof(float));
         });
}

std::string Format(double value) {
  char text[32];
  snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

}  // namespace

const Ceilings& GetCeilings() { return MutableCeilings(); }

double FmaPeakGflops(const Target& target, int threads) {
  const Ceilings& c = GetCeilings();
  if (!c.measured || c.fma.empty()) return 0.0;
  double one_core = 0.0;
  for (const Ceilings::Fma& fma : c.fma) {
    if (fma.target == target) one_core = fma.gflops;
  }
  if (threads <= 1) return one_core;
  // All-core efficiency of the best target (turbo drops as more cores run).
  const double efficiency =
      std::min(1.0, c.fma_all_gflops / (c.all_threads * c.fma.front().gflops));
  return one_core * threads * efficiency;
}

double MemoryPeakGbps(MemoryCeiling kind, int threads) {
  const Ceilings& c = GetCeilings();
  const double* gbps = kind == MemoryCeiling::kRead   ? c.read_gbps
                       : kind == MemoryCeiling::kCopy ? c.copy_gbps
                                                      : c.l2_read_gbps;
  if (threads <= 1 || c.all_threads <= 1) return gbps[0];
  if (threads >= c.all_threads) return gbps[1];
  const double t = static_cast<double>(threads - 1) / (c.all_threads - 1);
  return gbps[0] + t * (gbps[1] - gbps[0]);
}

void MeasureCeilings(double budget_ms) {
  Ceilings& c = MutableCeilings();
  const double budget_s = budget_ms * 1e-3;
  c.budget_ms = budget_ms;
  c.all_threads = AllThreads();
  const int counts[2] = {1, c.all_threads};

  // FMA, one core, per target; then the best target on all cores.
  c.fma.clear();
  for (const Target& target : SupportedTargets()) {
    if (!SetMaxTarget(target.name).ok()) continue;
    c.fma.push_back({target, MeasureFma(budget_s, 1, target.bits)});
  }
  ResetMaxTarget();
  if (c.fma.empty()) return;  // unreachable: the CPU runs at least one target
  c.fma_all_gflops = c.all_threads == 1 ? c.fma.front().gflops
                                        : MeasureFma(budget_s, c.all_threads,
                                                     c.fma.front().target.bits);

  // Memory, on the best target. Small budgets (smoke tests) get a small buffer:
  // 8 MiB per ms, so that allocating and touching it does not dominate.
  c.memory_bytes = std::min(
      kMemoryBytes,
      std::max<size_t>(size_t{4} << 20, static_cast<size_t>(budget_ms) << 23));
  const size_t floats = c.memory_bytes / sizeof(float);
  const BufferPtr<float> buffer = TouchedBuffer(floats);
  for (int k = 0; k < 2; ++k) {
    const size_t slice = floats / counts[k] / kStreamElements * kStreamElements;
    c.read_gbps[k] = MeasureRead(budget_s, counts[k], buffer.get(), slice);
    c.copy_gbps[k] = MeasureCopy(budget_s, counts[k], buffer.get(), floats);
    c.l2_read_gbps[k] = MeasureRead(budget_s, counts[k], buffer.get(),
                                    kL2Bytes / sizeof(float));
  }
  // A ceiling never falls as threads are added (a run could leave the extra
  // threads idle); when a trial on all threads measured less, other processes
  // had the other cores.
  c.fma_all_gflops = std::max(c.fma_all_gflops, c.fma.front().gflops);
  for (double* gbps : {c.read_gbps, c.copy_gbps, c.l2_read_gbps}) {
    gbps[1] = std::max(gbps[1], gbps[0]);
  }
  c.measured = true;
}

void PrintCeilings() {
  const Ceilings& c = GetCeilings();
  if (!c.measured) return;
  const int all = c.all_threads;
  fprintf(stderr,
          "Headway ceilings (best trial of %.0f ms per measurement; '~' = "
          "scaled by the "
          "best target's all-core efficiency)\n",
          c.budget_ms);
  fprintf(stderr, "  %-26s %12s %12s\n", "", "1 thread",
          (std::to_string(all) + " threads").c_str());
  for (const Ceilings::Fma& fma : c.fma) {
    const bool best = &fma == &c.fma.front();
    fprintf(stderr, "  %-26s %12.1f %11s%s\n",
            (std::string("FMA f32 GFLOP/s ") + fma.target.name).c_str(),
            fma.gflops, Format(FmaPeakGflops(fma.target, all)).c_str(),
            best ? " " : "~");
  }
  const std::string mib = std::to_string(c.memory_bytes >> 20) + " MiB";
  const struct {
    std::string name;
    const double* gbps;
  } rows[] = {{"read GB/s (" + mib + ")", c.read_gbps},
              {"copy GB/s (" + mib + ", r+w)", c.copy_gbps},
              {"L2 read GB/s (256 KiB)", c.l2_read_gbps}};
  for (const auto& row : rows) {
    fprintf(stderr, "  %-26s %12.1f %12.1f\n", row.name.c_str(), row.gbps[0],
            row.gbps[1]);
  }
  if (c.memory_bytes < kMemoryBytes) {
    fprintf(
        stderr,
        "  (memory buffer shrunk by the small --headway_ceiling_ms: not DRAM "
        "ceilings)\n");
  }
}

void AddCeilingsToContext() {
  const Ceilings& c = GetCeilings();
  if (!c.measured) return;
  const std::string all = std::to_string(c.all_threads) + "t";
  benchmark::AddCustomContext("headway_ceiling_ms", Format(c.budget_ms));
  // Every supported target, best first (the order of the charts).
  std::string targets;
  for (const Ceilings::Fma& fma : c.fma) {
    targets += (targets.empty() ? "" : ",") + std::string(fma.target.name);
  }
  benchmark::AddCustomContext("headway_targets", targets);
  benchmark::AddCustomContext("headway_memory_buffer_bytes",
                              std::to_string(c.memory_bytes));
  for (const Ceilings::Fma& fma : c.fma) {
    const std::string key =
        std::string("headway_fma_gflops_") + fma.target.name;
    benchmark::AddCustomContext(key + "_1t", Format(fma.gflops));
    benchmark::AddCustomContext(
        key + "_" + all, Format(FmaPeakGflops(fma.target, c.all_threads)));
  }
  const struct {
    const char* name;
    const double* gbps;
  } rows[] = {{"headway_read_gbps", c.read_gbps},
              {"headway_copy_gbps", c.copy_gbps},
              {"headway_l2_read_gbps", c.l2_read_gbps}};
  for (const auto& row : rows) {
    benchmark::AddCustomContext(std::string(row.name) + "_1t",
                                Format(row.gbps[0]));
    benchmark::AddCustomContext(std::string(row.name) + "_" + all,
                                Format(row.gbps[1]));
  }
}

namespace {

// The FMA ceiling as a benchmark row, fma_peak/<TARGET>/threads:N: the loop
// that MeasureFma times, 2^27 flops per thread and iteration on every target
// (so that "vs SCALAR" is the speed-up: 0.6 ms on AVX3_DL, 11 ms on SCALAR,
// one core of this machine). The ceilings above are the best trial at start;
// this row runs among the others (with --benchmark_enable_random_interleaving
// its repetitions are spread over the run), so a row's median over this row's
// median in the same run is its fraction of the FMA peak that this run's
// machine gave, when the VM's speed moves by 5-10% between minutes.
void BM_FmaPeak(benchmark::State& state, const RunConfig& run) {
  // Rounds for 2^27 flops: the flops of one round depend on the target.
  const double round_flops = internal::FmaLoop(1, 0.5f, 1.0f).flops;
  const uint64_t rounds = std::max<uint64_t>(
      1, static_cast<uint64_t>(static_cast<double>(uint64_t{1} << 27) /
                               round_flops));
  double flops = 0.0;
  std::vector<internal::FmaLoopResult> results(
      static_cast<size_t>(run.threads));
  const auto step = [&] {
    ForEachThread(run.threads, [&](int i) {
      results[static_cast<size_t>(i)] =
          internal::FmaLoop(rounds, 0.999999f, 1e-3f * (i + 1));
    });
    flops = 0.0;
    for (const internal::FmaLoopResult& result : results) {
      if (result.target != run.target.bits) {
        return Status::Internal("fma_peak: dispatched to another target");
      }
      sink = result.checksum;
      flops += result.flops;
    }
    return Status::Ok();
  };
  if (!TimeSteps(state, step)) return;
  ReportCompute(state, flops, run.target, run.threads);
}

void RegisterFmaPeak() { RegisterPerTarget("fma_peak", BM_FmaPeak, {}, {{}}); }
HEADWAY_REGISTER_BENCHMARKS(RegisterFmaPeak);

// The buffer of the read rows below, the size of the read ceiling's (512 MiB,
// huge pages), touched once as the start-up one; its floats.
const float* ReadRowsBuffer(size_t* floats) {
  const Ceilings& c = GetCeilings();
  const size_t bytes = c.measured ? c.memory_bytes : kMemoryBytes;
  *floats = bytes / sizeof(float);
  static const BufferPtr<float> buffer = TouchedBuffer(*floats);
  return buffer.get();
}

// Times `read`(slice, floats) on each thread's share of ReadRowsBuffer once
// per iteration. Returns the bytes read per iteration, 0 if skipped.
template <class Read>
double TimeSlices(benchmark::State& state, const RunConfig& run,
                  const Read& read) {
  size_t floats = 0;
  const float* buffer = ReadRowsBuffer(&floats);
  const size_t threads = static_cast<size_t>(run.threads);
  const size_t slice = floats / threads / kStreamElements * kStreamElements;
  std::vector<float> sums(threads);
  const auto step = [&] {
    ForEachThread(run.threads, [&](int i) {
      const size_t t = static_cast<size_t>(i);
      sums[t] = read(buffer + t * slice, slice);
    });
    for (float sum : sums) sink = sum;
    return Status::Ok();
  };
  if (!TimeSteps(state, step)) return 0.0;
  return static_cast<double>(threads * slice * sizeof(float));
}

// The read ceiling as a benchmark row, read_peak/<TARGET>/threads:N, the
// fma_peak row's counterpart for the memory-bound rows: each thread sums its
// share of the buffer (TimeSlices), the loop that MeasureRead times. A row's
// GB/s median over this row's median in the same interleaved run is its
// fraction of the bandwidth that this run's machine gave (bf16 MHA decode
// took 7.1 to 16.0 ms in alternating processes within 3 minutes); its own
// "%read" says how far the run's conditions were from the start-up trial. On
// the key targets: the loop is the same loads on every vector target.
void BM_ReadPeak(benchmark::State& state, const RunConfig& run) {
  const double bytes = TimeSlices(state, run, internal::ReadSum);
  if (bytes == 0.0) return;
  ReportMemory(state, bytes, MemoryCeiling::kRead, run.threads);
}

void RegisterReadPeak() {
  RegisterPerTarget("read_peak", BM_ReadPeak, {}, {{}}, 0);
}
HEADWAY_REGISTER_BENCHMARKS(RegisterReadPeak);

// Streaming with arithmetic, read_fma_peak/<TARGET>/flops_per_byte:I/
// threads:N: read_peak's buffer read as two streams (decode's K and V), with
// I flops per byte on the loaded floats and nothing else (no conversions,
// reductions or softmax). Its bound is the roofline's at intensity I, the
// lower of I x read and FMA; its "in run" % says how much of that bound one
// core reaches when its loads and FMAs share the time. A decode row of the
// same flops per stored byte (docs/BENCHMARKS.md) reads at most about this
// row's rate: GQA-8 decode does 2 (float32), 4 (bf16, f16) and 8 (int8).
void BM_ReadFmaPeak(benchmark::State& state, const RunConfig& run) {
  const size_t flops_per_byte = static_cast<size_t>(state.range(0));
  const double bytes =
      TimeSlices(state, run, [&](const float* slice, size_t floats) {
        return internal::ReadFma(slice, floats, flops_per_byte);
      });
  if (bytes == 0.0) return;
  ReportRoofline(state, bytes * static_cast<double>(flops_per_byte), bytes,
                 MemoryCeiling::kRead, run.target, run.threads);
}

void RegisterReadFmaPeak() {
  RegisterPerTarget("read_fma_peak", BM_ReadFmaPeak, {"flops_per_byte"},
                    {{2}, {4}, {8}}, 0);
}
HEADWAY_REGISTER_BENCHMARKS(RegisterReadFmaPeak);

}  // namespace
}  // namespace bench
}  // namespace headway

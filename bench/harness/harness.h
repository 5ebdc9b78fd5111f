// The benchmark harness: every Headway benchmark runs once per instruction set
// and thread count, and reports how close it comes to a ceiling that main()
// measured on this machine at start.
//
// A benchmark file (bench/<module>_bench.cc, listed in bench/meson.build),
// inside namespace headway::bench, looks like:
//
//   void BM_Scale(benchmark::State& state, const RunConfig& run) {
//     const int64_t n = state.range(0);
//     auto x = AllocateBuffer<float>(n);  // set-up: not timed
//     FillUniform(x.get(), n, -1.0f, 1.0f, /*seed=*/1);
//     for (auto _ : state) {  // inside a tbb::task_arena(run.threads)
//       if (!Check(state, Scale(x.get(), n, 0.5f))) break;
//       benchmark::ClobberMemory();
//     }
//     ReportRoofline(state, 1.0 * n, 8.0 * n, MemoryCeiling::kCopy,
//                    run.target, run.threads);
//   }
//   void RegisterScale() {
//     RegisterPerTarget("scale", BM_Scale, {"n"}, {{1 << 12}, {1 << 24}});
//   }
//   HEADWAY_REGISTER_BENCHMARKS(RegisterScale);
//
// which registers "scale/AVX3/n:4096/threads:1/real_time" and its siblings: on
// 1 and all threads, the first shape on every target the CPU supports and the
// others on the key targets (see RegisterPerTarget). Time is wall-clock
// time (UseRealTime): the work runs on several threads. Counters: "GFLOP/s" and
// "GB/s" (rates, 1e9 per second) and a percentage of the bounding ceiling,
// named after it ("%FMA", "%read", "%copy", "%L2"). ReportRoofline reports all
// three from the flops and bytes of one iteration; docs/BENCHMARKS.md says how
// each benchmark counts them.
#ifndef HEADWAY_BENCH_HARNESS_HARNESS_H_
#define HEADWAY_BENCH_HARNESS_HARNESS_H_

#include <stddef.h>
#include <stdint.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "lib/core/memory.h"

namespace headway {
namespace bench {

// -----------------------------------------------------------------------------
// Machine ceilings, measured once by main() before any benchmark runs.

enum class MemoryCeiling {
  kRead,    // streaming read (and sum) of a buffer far larger than the caches
  kCopy,    // streaming copy far larger than the caches; read + written bytes
  kL2Read,  // repeated read of a 256 KiB buffer per thread, resident in L2
};

// "read", "copy" or "L2": the suffix of the percentage counter.
const char* MemoryCeilingName(MemoryCeiling kind);

struct Ceilings {
  struct Fma {
    Target target;
    double gflops = 0.0;  // one core
  };
  std::vector<Fma> fma;  // every supported target, best first; one core each
  int all_threads = 1;   // the thread count of the "all threads" measurements
  double fma_all_gflops = 0.0;  // best target on all_threads threads
  // GB/s (1e9 bytes/s); [0] is one thread, [1] is all_threads threads.
  double read_gbps[2] = {0.0, 0.0};
  double copy_gbps[2] = {0.0, 0.0};
  double l2_read_gbps[2] = {0.0, 0.0};
  double budget_ms = 0.0;   // time spent on each measurement
  size_t memory_bytes = 0;  // the read buffer (copy: half to half); 512 MiB
                            // unless a tiny budget shrank it
  bool measured = false;
};

// The ceilings of this run; `measured` is false until MeasureCeilings ran.
const Ceilings& GetCeilings();

// Peak float32 FMA rate of `target` on `threads` threads, GFLOP/s: the target's
// one-core peak times threads, times the all-core efficiency measured on the
// best target (clock and power limits scale every target alike). 0 if
// unmeasured.
double FmaPeakGflops(const Target& target, int threads);

// Bandwidth ceiling at `threads` threads, GB/s: measured at 1 and all threads,
// linear in between, never above the all-thread value. 0 if unmeasured.
double MemoryPeakGbps(MemoryCeiling kind, int threads);

// -----------------------------------------------------------------------------
// Reporting: call once after the timed loop. `*_per_iter` is the work of one
// loop iteration.

// Counter "GFLOP/s".
void ReportFlops(benchmark::State& state, double flops_per_iter);
// Counter "GB/s": the bytes the operation must move (its inputs read, its
// outputs written), not what the caches happen to transfer.
void ReportBytes(benchmark::State& state, double bytes_per_iter);
// The roofline of a kernel: "GFLOP/s", "GB/s" and the percentage of the
// ceiling that bounds it at its arithmetic intensity I = flops / bytes. On
// `threads` threads of `target` it can reach at most min(F, I * B), with F =
// FmaPeakGflops(target, threads) and B = MemoryPeakGbps(memory, threads): if F
// is the lower, the counter is "%FMA" (GFLOP/s of F), else "%read" / "%copy" /
// "%L2" (GB/s of B). `memory` is where the bytes come from: kRead for kernels
// that mostly read (kernels with cold inputs), kCopy for kernels that write as
// much as they read. Both counts must be > 0.
void ReportRoofline(benchmark::State& state, double flops_per_iter,
                    double bytes_per_iter, MemoryCeiling memory,
                    const Target& target, int threads);
// For kernels that count flops only (no "GB/s", so they stay off the roofline
// chart): "GFLOP/s" and "%FMA" of FmaPeakGflops(target, threads). Prefer
// ReportRoofline.
void ReportCompute(benchmark::State& state, double flops_per_iter,
                   const Target& target, int threads);
// For kernels that count bytes only (no "GFLOP/s", so they stay off the
// roofline chart): "GB/s" and "%read" / "%copy" / "%L2" of MemoryPeakGbps(kind,
// threads). Prefer ReportRoofline.
void ReportMemory(benchmark::State& state, double bytes_per_iter,
                  MemoryCeiling kind, int threads);

// Skips the benchmark with the status's message when a Headway call fails; true
// if ok. Usage in the loop: if (!Check(state, headway::Softmax(...))) break;
bool Check(benchmark::State& state, const Status& status);

// Times `step` (one call of what the benchmark measures): once untimed, then
// Google Benchmark's timed loop. The untimed call comes every time a benchmark
// function runs (each repetition): at these sizes the first iteration, Google
// Benchmark's estimate, is often the only one timed, and a first call after
// new buffers are allocated and filled runs up to 25% slower (attention
// prefill, 1 thread: 131-146 GFLOP/s cold, 175 warm). False after skipping the
// benchmark if a call fails.
template <class Step>
bool TimeSteps(benchmark::State& state, const Step& step) {
  if (!Check(state, step())) return false;
  for (auto _ : state) {
    if (!Check(state, step())) return false;
    benchmark::ClobberMemory();
  }
  return true;
}

// Runs body() on the calling thread; with threads == 1 pinned (Linux) to one
// fixed CPU, the last one the process may use, so that every 1-thread
// measurement, the ceilings' and the rows', runs on the same core. On the
// 2-vCPU VM the vCPUs differ by 8% (CPU 0 slower) and an unpinned main thread
// moves between them (to CPU 0 after a 2-thread row): its 1-thread rows then
// run about 10% below a 1-thread ceiling measured on CPU 1 (matmul 2048^3:
// 163-167 against 181-191 GFLOP/s, as pinned to CPU 0 / CPU 1). Unpinned when
// the affinity cannot be set.
void PinnedIfOneThread(int threads, const std::function<void()>& body);

// -----------------------------------------------------------------------------
// Registration.

// What a benchmark runs on. The harness has capped dispatch at `target`
// (headway::SetMaxTarget), checked that headway::ActiveTarget() and Highway's
// dispatch are `target`, and calls the benchmark inside a
// tbb::task_arena(threads), so Headway's parallel loops use exactly `threads`
// threads (checked: headway::MaxThreads(), else the row is skipped with an
// error). The cap is removed after the benchmark.
struct RunConfig {
  Target target;
  int threads = 1;
};

// Every benchmark buffer, ours and the peers' alike, comes from the library's
// allocator of large buffers (lib/core/memory.h: huge pages from 4 MiB up), so
// that all read the same kind of pages; n elements of T, aborting when out of
// memory.
template <typename T>
using BufferPtr = internal::LargePtr<T>;
template <typename T>
BufferPtr<T> AllocateBuffer(size_t n) {
  BufferPtr<T> buffer = internal::AllocateLargeArray<T>(n);
  if (buffer == nullptr) std::abort();
  return buffer;
}

using BenchmarkFn = std::function<void(benchmark::State&, const RunConfig&)>;

// Registers `name`/<TARGET>/<arg_names[0]>:<v0>/.../threads:<n> for every
// selected target (SelectedTargets(), best first), tuples of `arg_sets`
// (state.range(i) is tuple[i]) and every count in ThreadCounts(). The default
// run keeps to about 5 minutes: the first `every_target_sets` tuples run on
// every target, the others only on KeyTargets(), so put a cheap,
// representative shape first; a peer (IsPeerFamily(name)) runs on
// KeyTargets() only, and one on OpenBLAS or oneDNN on the first selected
// target only. --headway_full and --headway_targets run every tuple on
// every selected target. Returns one benchmark::internal::Benchmark per
// registered target, to tune further (e.g. ->MinTime(2)). Call it from a
// registrar (HEADWAY_REGISTER_BENCHMARKS).
std::vector<benchmark::internal::Benchmark*> RegisterPerTarget(
    const std::string& name, BenchmarkFn fn,
    const std::vector<std::string>& arg_names,
    const std::vector<std::vector<int64_t>>& arg_sets,
    size_t every_target_sets = 1);

// The cross product of per-argument values: the arg_sets of a sweep.
// ArgProduct({{1, 8}, {4096}}) is {{1, 4096}, {8, 4096}}.
std::vector<std::vector<int64_t>> ArgProduct(
    const std::vector<std::vector<int64_t>>& values);

// The thread count of the "all threads" rows and ceilings: TBB's default
// concurrency, the CPUs this process may use (its affinity mask), at least 1.
// It bounds --headway_threads: TBB runs an arena of more threads on at most
// this many, so a row labelled threads:N above it would run on fewer.
int AllThreads();

// The thread counts to run: --headway_threads, by default 1 and AllThreads():
// {1, 2} on a 2-core machine.
std::vector<int> ThreadCounts();

// True for a peer: a family whose name has the word openblas, onednn, ggml,
// materialized or seed (matmul_openblas, attention_decode_ggml,
// attention_prefill_materialized, layer_seed_decode) is the peer of the
// family without it, which the summary table compares with it.
bool IsPeerFamily(const std::string& family);

// What to run, from main()'s --headway_* flags; set before RegisterAll().
struct Options {
  // --headway_targets: target names (and "best", "fallback": SCALAR or EMU128),
  // case-insensitive; empty: every supported target, the later shapes on
  // KeyTargets() only.
  std::vector<std::string> targets;
  std::vector<int> threads;  // --headway_threads, 1 to AllThreads() each;
                             // empty: 1 and AllThreads()
  bool full = false;         // --headway_full: every shape on every target
  bool amx = true;           // false: --headway_no_amx, SetAmxBFloat16(false)
                             // for the whole run (AMX hosts: the bf16 compute
                             // rows on the kernel a CPU without AMX runs)
};
// Checks `options` against this CPU and keeps them; returns an error message,
// or "".
std::string SetOptions(const Options& options);
const Options& GetOptions();

// The supported targets that the options select, best first.
std::vector<Target> SelectedTargets();
// The targets that run every shape in the default run: the best supported one
// and AVX2 (the most widespread), if supported. SCALAR, the baseline of the "vs
// SCALAR" ratios, is not one: its prefills take seconds per call, so in the
// default run it has the first shapes only, as the other targets.
std::vector<Target> KeyTargets();

// Queues `registrar` to run from main() after the flags are parsed and the
// ceilings measured, so registration never depends on the order of static
// initialization.
bool AddRegistrar(void (*registrar)());

#define HEADWAY_REGISTER_BENCHMARKS(registrar)                   \
  [[maybe_unused]] static const bool headway_bench_##registrar = \
      ::headway::bench::AddRegistrar(registrar)

// -----------------------------------------------------------------------------
// Inputs.

// data[0, n) = uniform floats in [lo, hi), deterministic for a seed.
void FillUniform(float* data, size_t n, float lo, float hi, uint64_t seed);

// Bytes of buffers that are cold when revisited round-robin: 8x the 32 MiB L3
// of the Zen 5 CCD that this machine's cores share. (glibc reports 508 MiB of
// L3 on this VM, the whole socket's, which no core can fill.)
inline constexpr size_t kColdBytes = size_t{256} << 20;

// Identical buffers of `elements` (> 0) T each, enough of them to total >=
// `min_total_bytes`, handed out round-robin: a benchmark that takes Next()
// every iteration works on data that has left the caches since its last visit
// (XNNPACK's practice). Buffers are 64-byte aligned and staggered by 64 bytes
// so that they do not alias in the caches.
template <typename T>
class RotatingBuffers {
 public:
  explicit RotatingBuffers(size_t elements, size_t min_total_bytes = kColdBytes)
      : elements_(elements),
        stride_((elements * sizeof(T) + 127) / 64 * 64 / sizeof(T)),
        count_(min_total_bytes / (elements * sizeof(T)) + 1),
        data_(AllocateBuffer<T>(stride_ * count_)) {
    static_assert(64 % sizeof(T) == 0, "stride must keep 64-byte alignment");
  }

  size_t count() const { return count_; }
  size_t elements() const { return elements_; }
  T* operator[](size_t i) { return data_.get() + i * stride_; }
  // The buffer after the previous one, wrapping around.
  T* Next() {
    T* buffer = (*this)[next_];
    next_ = next_ + 1 == count_ ? 0 : next_ + 1;
    return buffer;
  }

 private:
  size_t elements_;
  size_t stride_;  // elements from one buffer to the next
  size_t count_;
  size_t next_ = 0;
  BufferPtr<T> data_;
};

// -----------------------------------------------------------------------------
// For main() (bench/main.cc).

// Measures the ceilings, spending about `budget_ms` on each of the ~12
// measurements (best of repeated trials). A budget under 64 ms also shrinks the
// memory buffer (for smoke tests: the bandwidths are then not DRAM ceilings).
// Calls SetMaxTarget/ResetMaxTarget: no other Headway call may run meanwhile.
void MeasureCeilings(double budget_ms);
// A small table of the ceilings, on stderr (stdout may carry JSON).
void PrintCeilings();
// The ceilings as benchmark::AddCustomContext entries
// ("headway_fma_gflops_AVX3_1t", ...), so they are in the JSON output's
// "context".
void AddCeilingsToContext();
// Runs the queued registrars.
void RegisterAll();
// benchmark::RunSpecifiedBenchmarks with the display reporter that
// --benchmark_format selects (the file reporter of --benchmark_out is Google
// Benchmark's), wrapped (reporter.cc) to print
// - the percentage counters without the "/s" that Google Benchmark puts after
//   every rate;
// - on stderr, a progress line "[i/N elapsed] name ..." as each benchmark
//   starts, N counted from the filtered list (in a terminal, a line that the
//   results overwrite);
// - at the end, a summary table: per row its figure, its percentage of the
//   bounding ceiling and its speed relative to the fastest peer and to SCALAR
//   on the same shape and thread count (on stdout with the console format, else
//   on stderr).
// To count the filtered list, it runs Google Benchmark's list mode first,
// turning --benchmark_list_tests on and off with two more calls of
// benchmark::Initialize (argv0 and that flag only); the other flags keep their
// values.
size_t RunBenchmarks(char* argv0);

}  // namespace bench
}  // namespace headway

#endif  // HEADWAY_BENCH_HARNESS_HARNESS_H_

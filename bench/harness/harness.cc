// Registration, reporting and inputs of the benchmark harness (the ceilings:
// ceilings.cc; the reporter: reporter.cc).
#include "bench/harness/harness.h"

#include <ctype.h>
#ifdef __linux__
#include <sched.h>
#endif
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/peak_kernels.h"
#include "benchmark/benchmark.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/threads.h"
#include "hwy/targets.h"
#include "tbb/info.h"
#include "tbb/task_arena.h"

namespace headway {
namespace bench {
namespace {

Options& MutableOptions() {
  static Options options;
  return options;
}

bool IsKeyTarget(const Target& target) {
  for (const Target& key : KeyTargets()) {
    if (key == target) return true;
  }
  return false;
}

std::vector<void (*)()>& Registrars() {
  static std::vector<void (*)()> registrars;
  return registrars;
}

// One arena per thread count for the whole run, so that a benchmark's repeated
// invocations do not pay for a new arena. Used from the benchmark runner's
// thread only.
tbb::task_arena& Arena(int threads) {
  static std::map<int, std::unique_ptr<tbb::task_arena>> arenas;
  std::unique_ptr<tbb::task_arena>& arena = arenas[threads];
  if (!arena) arena = std::make_unique<tbb::task_arena>(threads);
  return *arena;
}

// Caps dispatch at `target` and checks that it took; returns an error message,
// or "".
std::string CapDispatch(const Target& target) {
  const Status status = SetMaxTarget(target.name);
  if (!status.ok()) return status.ToString();
  const Target active = ActiveTarget();
  if (active != target) {
    return std::string("ActiveTarget() is ") + active.name + ", not " +
           target.name;
  }
  // Highway 1.0.3's hwy::SupportedTargets() re-chooses the dispatch target
  // without the cap (ActiveTarget() restores it); capping again costs nothing.
  // Then check what dispatch really runs, with a zero-round FMA loop.
  (void)SetMaxTarget(target.name);
  const int64_t dispatched = internal::FmaLoop(0, 0.0f, 0.0f).target;
  if (dispatched != target.bits) {
    return std::string("dispatch runs ") + hwy::TargetName(dispatched) +
           ", not " + target.name;
  }
  return "";
}

void SetPercent(benchmark::State& state, const std::string& name,
                double amount_per_iter, double ceiling_per_second) {
  if (ceiling_per_second <= 0.0) return;  // ceilings not measured
  // A rate, so Google Benchmark divides by the elapsed time: 100 * achieved /
  // ceiling.
  state.counters[name] = benchmark::Counter(
      100.0 * amount_per_iter * static_cast<double>(state.iterations()) /
          ceiling_per_second,
      benchmark::Counter::kIsRate);
}

}  // namespace

const char* MemoryCeilingName(MemoryCeiling kind) {
  switch (kind) {
    case MemoryCeiling::kRead:
      return "read";
    case MemoryCeiling::kCopy:
      return "copy";
    case MemoryCeiling::kL2Read:
      return "L2";
  }
  return "?";
}

void ReportFlops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops_per_iter * 1e-9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void ReportBytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["GB/s"] = benchmark::Counter(
      bytes_per_iter * 1e-9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void ReportRoofline(benchmark::State& state, double flops_per_iter,
                    double bytes_per_iter, MemoryCeiling memory,
                    const Target& target, int threads) {
  ReportFlops(state, flops_per_iter);
  ReportBytes(state, bytes_per_iter);
  const double fma = FmaPeakGflops(target, threads) * 1e9;
  const double bandwidth = MemoryPeakGbps(memory, threads) * 1e9;
  // min(F, I * B) with I = flops / bytes: compare F * bytes with flops * B.
  if (fma * bytes_per_iter <= flops_per_iter * bandwidth) {
    SetPercent(state, "%FMA", flops_per_iter, fma);
  } else {
    SetPercent(state, std::string("%") + MemoryCeilingName(memory),
               bytes_per_iter, bandwidth);
  }
}

void ReportCompute(benchmark::State& state, double flops_per_iter,
                   const Target& target, int threads) {
  ReportFlops(state, flops_per_iter);
  SetPercent(state, "%FMA", flops_per_iter,
             FmaPeakGflops(target, threads) * 1e9);
}

void ReportMemory(benchmark::State& state, double bytes_per_iter,
                  MemoryCeiling kind, int threads) {
  ReportBytes(state, bytes_per_iter);
  SetPercent(state, std::string("%") + MemoryCeilingName(kind), bytes_per_iter,
             MemoryPeakGbps(kind, threads) * 1e9);
}

bool Check(benchmark::State& state, const Status& status) {
  if (status.ok()) return true;
  state.SkipWithError(status.ToString().c_str());
  return false;
}

int AllThreads() { return std::max(1, tbb::info::default_concurrency()); }

std::vector<int> ThreadCounts() {
  if (!GetOptions().threads.empty()) return GetOptions().threads;
  const int all = AllThreads();
  if (all == 1) return {1};
  return {1, all};
}

std::string SetOptions(const Options& given) {
  Options options = given;
  for (std::string& name : options.targets) {
    // Case-insensitive, as SetMaxTarget.
    for (char& c : name) {
      c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
    }
  }
  const std::vector<Target> supported = SupportedTargets();
  for (const std::string& name : options.targets) {
    bool found = name == "BEST" || name == "FALLBACK";
    for (const Target& target : supported) found |= name == target.name;
    if (!found) {
      std::string names;
      for (const Target& target : supported) {
        names += std::string(names.empty() ? "" : ",") + target.name;
      }
      return "target \"" + name + "\" is not one this CPU supports (" + names +
             ", best or fallback)";
    }
  }
  // Rejected, not clamped: a sweep meant for a larger machine fails here
  // rather than come back with fewer or mislabelled rows.
  const int all = AllThreads();
  for (int threads : options.threads) {
    if (threads < 1) {
      return "--headway_threads: " + std::to_string(threads) +
             " is not a thread count";
    }
    if (threads > all) {
      const std::string n = std::to_string(threads), m = std::to_string(all);
      return "--headway_threads: " + n + " is more than the " + m +
             " CPUs this process may use (TBB's default concurrency), and "
             "TBB would run a row labelled threads:" +
             n + " on at most " + m + " threads: take counts from 1 to " + m;
    }
  }
  MutableOptions() = options;
  SetAmxBFloat16(options.amx);
  if (!options.amx) benchmark::AddCustomContext("headway_amx", "off");
  return "";
}

const Options& GetOptions() { return MutableOptions(); }

std::vector<Target> SelectedTargets() {
  const std::vector<Target> supported = SupportedTargets();
  const std::vector<std::string>& names = GetOptions().targets;
  if (names.empty()) return supported;
  std::vector<Target> selected;
  for (const Target& target : supported) {
    for (const std::string& name : names) {
      if (name == target.name || (name == "BEST" && target == supported[0]) ||
          (name == "FALLBACK" && target == supported.back())) {
        selected.push_back(target);
        break;
      }
    }
  }
  return selected;
}

namespace {

// True if one of the '_'-separated words of `family` is in `words`.
bool HasWord(const std::string& family,
             std::initializer_list<const char*> words) {
  size_t begin = 0;
  while (begin <= family.size()) {
    size_t end = family.find('_', begin);
    if (end == std::string::npos) end = family.size();
    const std::string word = family.substr(begin, end - begin);
    for (const char* w : words) {
      if (word == w) return true;
    }
    begin = end + 1;
  }
  return false;
}

// A peer on another library's kernels (layer_seed_onednn_prefill).
bool IsLibraryPeerFamily(const std::string& family) {
  return HasWord(family, {"openblas", "onednn", "ggml"});
}

}  // namespace

bool IsPeerFamily(const std::string& family) {
  return HasWord(family,
                 {"openblas", "onednn", "ggml", "materialized", "seed"});
}

std::vector<Target> KeyTargets() {
  std::vector<Target> keys;
  for (const Target& target : SupportedTargets()) {
    const std::string name = target.name;
    if (keys.empty() || name == "AVX2") {
      keys.push_back(target);
    }
  }
  return keys;
}

std::vector<std::vector<int64_t>> ArgProduct(
    const std::vector<std::vector<int64_t>>& values) {
  std::vector<std::vector<int64_t>> product = {{}};
  for (const std::vector<int64_t>& choices : values) {
    std::vector<std::vector<int64_t>> next;
    for (const std::vector<int64_t>& prefix : product) {
      for (int64_t value : choices) {
        next.push_back(prefix);
        next.back().push_back(value);
      }
    }
    product = std::move(next);
  }
  return product;
}

std::vector<benchmark::internal::Benchmark*> RegisterPerTarget(
    const std::string& name, BenchmarkFn fn,
    const std::vector<std::string>& arg_names,
    const std::vector<std::vector<int64_t>>& arg_sets,
    size_t every_target_sets) {
  // The thread count is the last argument, so that Google Benchmark names it
  // ".../threads:N".
  std::vector<std::string> names = arg_names;
  names.push_back("threads");
  const size_t threads_index = arg_names.size();
  const bool all_shapes = GetOptions().full || !GetOptions().targets.empty();
  if (IsPeerFamily(name)) every_target_sets = 0;
  // A peer on another library's kernels runs on the first selected target
  // only: the library picks its own ISA, so its rows on other targets would
  // compare against the wrong ceiling.
  const bool library_peer = IsLibraryPeerFamily(name);
  const std::vector<Target> selected = SelectedTargets();
  std::vector<benchmark::internal::Benchmark*> registered;
  for (const Target& target : selected) {
    if (library_peer && !(target == selected.front())) continue;
    const size_t sets = all_shapes || IsKeyTarget(target)
                            ? arg_sets.size()
                            : std::min(every_target_sets, arg_sets.size());
    if (sets == 0) continue;
    const std::string full_name = name + "/" + target.name;
    benchmark::internal::Benchmark* bench = benchmark::RegisterBenchmark(
        full_name.c_str(),
        [fn, target, threads_index](benchmark::State& state) {
          const int threads = static_cast<int>(state.range(threads_index));
          const std::string error = CapDispatch(target);
          if (!error.empty()) {
            ResetMaxTarget();
            state.SkipWithError(error.c_str());
            return;
          }
          PinnedIfOneThread(threads, [&] {
            Arena(threads).execute([&] {
              if (MaxThreads() != threads) {
                const std::string message =
                    "Headway's calls get " + std::to_string(MaxThreads()) +
                    " threads in an arena of " + std::to_string(threads);
                state.SkipWithError(message.c_str());
                return;
              }
              fn(state, RunConfig{target, threads});
            });
          });
          ResetMaxTarget();
        });
    bench->ArgNames(names)->UseRealTime();
    for (size_t i = 0; i < sets; ++i) {
      for (int threads : ThreadCounts()) {
        std::vector<int64_t> with_threads = arg_sets[i];
        with_threads.push_back(threads);
        bench->Args(with_threads);
      }
    }
    registered.push_back(bench);
  }
  return registered;
}

void PinnedIfOneThread(int threads, const std::function<void()>& body) {
#ifdef __linux__
  cpu_set_t saved;
  if (threads == 1 && sched_getaffinity(0, sizeof(saved), &saved) == 0) {
    int cpu = CPU_SETSIZE - 1;
    while (cpu >= 0 && !CPU_ISSET(cpu, &saved)) --cpu;
    cpu_set_t one;
    CPU_ZERO(&one);
    if (cpu >= 0) CPU_SET(cpu, &one);
    if (cpu >= 0 && sched_setaffinity(0, sizeof(one), &one) == 0) {
      body();
      sched_setaffinity(0, sizeof(saved), &saved);
      return;
    }
  }
#else
  (void)threads;
#endif
  body();
}

bool AddRegistrar(void (*registrar)()) {
  Registrars().push_back(registrar);
  return true;
}

void RegisterAll() {
  for (void (*registrar)() : Registrars()) registrar();
}

void FillUniform(float* data, size_t n, float lo, float hi, uint64_t seed) {
  // SplitMix64: fast, and the same numbers on every platform (unlike <random>'s
  // distributions).
  uint64_t state = seed;
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float unit = static_cast<float>(z >> 40) * 0x1.0p-24f;  // [0, 1)
    data[i] = lo + (hi - lo) * unit;
  }
}

}  // namespace bench
}  // namespace headway

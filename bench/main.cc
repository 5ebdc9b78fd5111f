// headway_bench: measures this machine's ceilings, then runs the registered
// benchmarks with a progress line, and prints a summary table at the end.
//
//   headway_bench [Google Benchmark flags] [--headway_* flags]
//
// --headway_ceiling_ms=N: time spent on each of the ~12 ceiling measurements
//   (default 100: about 1.5 s in all). A tiny N (e.g. 1) makes start-up nearly
//   instant, for smoke tests.
// --headway_targets=A,B,...: only these targets (names as in
//   headway::SupportedTargets(), or "best"), every shape on each.
// --headway_threads=N,M,...: only these thread counts, each from 1 to all (the
//   CPUs this process may use, TBB's default concurrency; a larger count is
//   an error, not clamped); default: 1 and all. 1,2,4,8,16 on a 16-core
//   machine.
// --headway_full: every shape on every target. By default the shapes after a
//   benchmark's first ones run on KeyTargets() only (the best target and
//   AVX2), which keeps the default run to about 5 minutes on 2 cores.
// --headway_no_amx: on a CPU with AMX, the bf16 compute rows on the kernel a
//   CPU without AMX runs (SetAmxBFloat16(false): vdpbf16ps where
//   CpuPrefersNativeBFloat16, else the fallback). With
//   ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, oneDNN's rows leave AMX too.
// --benchmark_min_time defaults to 0.1 s here, not Google Benchmark's 0.5 s.
// docs/BENCHMARKS.md has the details.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <string>
#include <vector>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"

namespace {

constexpr char kCeilingFlag[] = "--headway_ceiling_ms";
constexpr char kTargetsFlag[] = "--headway_targets";
constexpr char kThreadsFlag[] = "--headway_threads";
constexpr char kFullFlag[] = "--headway_full";
constexpr char kNoAmxFlag[] = "--headway_no_amx";
constexpr double kDefaultCeilingMs = 100.0;
// Put before the user's flags, which override it.
char kDefaultMinTime[] = "--benchmark_min_time=0.1";

void PrintHelp() {
  benchmark::PrintDefaultHelp();
  fprintf(
      stdout,
      "          [%s=<ms>]  (time per ceiling measurement; default %.0f)\n"
      "          [%s=<TARGET>,...|best|fallback]  (default: every supported "
      "one)\n"
      "          [%s=<n>,...]  (each 1 to %d, the CPUs this process may "
      "use;\n"
      "                          more is an error; default: 1 and %d)\n"
      "          [%s]  (every shape on every target; default: a "
      "benchmark's later\n"
      "                          shapes on the best target and AVX2 "
      "only)\n"
      "          [%s]  (bf16 compute without AMX tiles)\n"
      "          (--benchmark_min_time defaults to 0.1 here)\n",
      kCeilingFlag, kDefaultCeilingMs, kTargetsFlag, kThreadsFlag,
      headway::bench::AllThreads(), headway::bench::AllThreads(), kFullFlag,
      kNoAmxFlag);
}

[[noreturn]] void Fail(const char* flag, const std::string& message) {
  fprintf(stderr, "headway_bench: %s: %s\n", flag, message.c_str());
  exit(1);
}

// The value of `arg` if it is "<flag>=<value>", else nullptr.
const char* FlagValue(const char* arg, const char* flag) {
  const size_t length = strlen(flag);
  if (strncmp(arg, flag, length) != 0 || arg[length] != '=') return nullptr;
  return arg + length + 1;
}

double ParseMs(const char* value) {
  char* end = nullptr;
  const double ms = strtod(value, &end);
  if (end == value || *end != '\0' || !std::isfinite(ms) || ms <= 0.0) {
    Fail(kCeilingFlag,
         std::string("needs a positive number of ms, got \"") + value + "\"");
  }
  return ms;
}

std::vector<std::string> ParseList(const char* flag, const char* value) {
  std::vector<std::string> items;
  std::string item;
  for (const char* c = value;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (item.empty())
        Fail(flag, std::string("empty item in \"") + value + "\"");
      items.push_back(item);
      item.clear();
      if (*c == '\0') break;
    } else {
      item += *c;
    }
  }
  return items;
}

std::vector<int> ParseThreads(const char* value) {
  std::vector<int> threads;
  for (const std::string& item : ParseList(kThreadsFlag, value)) {
    char* end = nullptr;
    const long n = strtol(item.c_str(), &end, 10);
    if (*end != '\0' || n < 1 || n > 4096) {
      Fail(kThreadsFlag, "\"" + item + "\" is not a thread count");
    }
    threads.push_back(static_cast<int>(n));
  }
  return threads;
}

// True if Google Benchmark will only list the benchmarks (no need to measure
// ceilings).
bool ListsOnly(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--benchmark_list_tests") == 0 ||
        strcmp(argv[i], "--benchmark_list_tests=true") == 0 ||
        strcmp(argv[i], "--benchmark_list_tests=1") == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const bool lists_only = ListsOnly(argc, argv);
  std::vector<char*> args = {argv[0], kDefaultMinTime};
  args.insert(args.end(), argv + 1, argv + argc);
  args.push_back(nullptr);
  int count = static_cast<int>(args.size()) - 1;
  // Consumes Google Benchmark's own flags (and handles --help); ours are left.
  benchmark::Initialize(&count, args.data(), PrintHelp);

  double ceiling_ms = kDefaultCeilingMs;
  headway::bench::Options options;
  int kept = 1;
  for (int i = 1; i < count; ++i) {
    const char* arg = args[i];
    if (const char* value = FlagValue(arg, kCeilingFlag)) {
      ceiling_ms = ParseMs(value);
    } else if (const char* targets = FlagValue(arg, kTargetsFlag)) {
      options.targets = ParseList(kTargetsFlag, targets);
    } else if (const char* threads = FlagValue(arg, kThreadsFlag)) {
      options.threads = ParseThreads(threads);
    } else if (strcmp(arg, kFullFlag) == 0) {
      options.full = true;
    } else if (strcmp(arg, kNoAmxFlag) == 0) {
      options.amx = false;
    } else {
      args[kept++] = args[i];
    }
  }
  count = kept;
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  const std::string error = headway::bench::SetOptions(options);
  if (!error.empty()) {
    fprintf(stderr, "headway_bench: %s\n", error.c_str());
    return 1;
  }

  if (!lists_only) {
    headway::bench::MeasureCeilings(ceiling_ms);
    headway::bench::PrintCeilings();
    headway::bench::AddCeilingsToContext();
  }
  headway::bench::RegisterAll();
  if (lists_only) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    headway::bench::RunBenchmarks(argv[0]);
  }
  benchmark::Shutdown();
  return 0;
}

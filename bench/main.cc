// headway_bench: measures this machine's ceilings, then runs every registered
// benchmark.
//
//   headway_bench [Google Benchmark flags] [--headway_ceiling_ms=N]
//
// --headway_ceiling_ms=N: time spent on each of the ~12 ceiling measurements
// (default 100: about 1.5 s in all). A tiny N (e.g. 1) makes start-up nearly
// instant, for smoke tests.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"

namespace {

constexpr char kCeilingFlag[] = "--headway_ceiling_ms";
constexpr double kDefaultCeilingMs = 100.0;

void PrintHelp() {
  benchmark::PrintDefaultHelp();
  fprintf(stdout,
          "          [%s=<ms>]  (time per ceiling measurement; default %.0f)\n",
          kCeilingFlag, kDefaultCeilingMs);
}

// Parses "--headway_ceiling_ms=N" into *ms. Returns false if `arg` is another
// flag; exits on a malformed value.
bool ParseCeilingFlag(const char* arg, double* ms) {
  const size_t length = strlen(kCeilingFlag);
  if (strncmp(arg, kCeilingFlag, length) != 0 || arg[length] != '=')
    return false;
  char* end = nullptr;
  const double value = strtod(arg + length + 1, &end);
  if (end == arg + length + 1 || *end != '\0' || !std::isfinite(value) ||
      value <= 0.0) {
    fprintf(stderr,
            "headway_bench: %s needs a positive number of ms, got \"%s\"\n",
            kCeilingFlag, arg + length + 1);
    exit(1);
  }
  *ms = value;
  return true;
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
  // Consumes Google Benchmark's own flags (and handles --help); ours is left in
  // argv.
  benchmark::Initialize(&argc, argv, PrintHelp);
  double ceiling_ms = kDefaultCeilingMs;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (!ParseCeilingFlag(argv[i], &ceiling_ms)) argv[kept++] = argv[i];
  }
  argc = kept;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  if (!lists_only) {
    headway::bench::MeasureCeilings(ceiling_ms);
    headway::bench::PrintCeilings();
    headway::bench::AddCeilingsToContext();
  }
  headway::bench::RegisterAll();
  headway::bench::RunBenchmarks();
  benchmark::Shutdown();
  return 0;
}

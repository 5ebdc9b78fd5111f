// The display reporter of headway_bench: Google Benchmark's own (console, JSON
// or CSV, as --benchmark_format says) wrapped to print a progress line while
// the benchmarks run and the summary table at the end (its one implementation:
// tools/report.py draws only the charts). docs/BENCHMARKS.md describes it.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"
#include "headway/targets.h"

namespace headway {
namespace bench {
namespace {

using Run = benchmark::BenchmarkReporter::Run;

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream stream(text);
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

std::string Join(const std::vector<std::string>& parts, char separator) {
  std::string joined;
  for (const std::string& part : parts) {
    if (!joined.empty()) joined += separator;
    joined += part;
  }
  return joined;
}

bool StartsWith(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// The short name of a KvDtype value in a "dtype:N" argument.
std::string DtypeName(const std::string& value) {
  static const char* const kNames[] = {"f32", "bf16", "f16", "int8"};
  const int n = std::atoi(value.c_str());
  return n >= 0 && n < 4 ? kNames[n] : "dtype" + value;
}

// One benchmark row of the summary, parsed from its name
// (family/TARGET/arg:value/.../threads:N/real_time; peers without a target
// have their kernel's name in place of TARGET).
struct Row {
  std::string family;  // "matmul", "attention_prefill_materialized", ...
  std::string base;    // the family this row is a peer of, or `family`
  std::string peer;    // "onednn/sgemm", "materialized", ...; "" if Headway's
  std::string target;  // "AVX2", ...; "" for a peer that has none
  std::string shape;   // the arguments but threads: "m:1/n:4096/..."
  // `shape` without "packed:" (pre-packing B is Headway's, peers have none)
  // and "dtype:" (the peers store float32): the rows a block of the summary
  // compares.
  std::string peer_shape;
  std::string packed;  // the "packed:1" argument, if any
  // The KV cache's stored type, from the "dtype:N" argument (the KvDtype
  // value): "f32", "bf16", "f16", "int8"; "" for a row without one (float32
  // storage, or no cache).
  std::string dtype;
  // "bf16" for a matmul row in the bf16 compute mode (kPackedCodes; oneDNN's
  // bf16 matmul is packed:4 too) or an attention row in
  // AttentionCompute::kBFloat16 ("compute:1"), "int8" for one in kInt8
  // ("compute:2"), "" for float32 compute: a row is compared with the peers
  // of its compute mode only.
  std::string compute;
  int threads = 0;
  double seconds = 0.0;  // real time per iteration
  double gflops = 0.0;   // 0: not reported
  double gbps = 0.0;
  std::string ceiling;  // "FMA", "read", "copy", "L2"; "" if none reported
  double percent = 0.0;
  std::string error;
};

// What a matmul row's "packed:N" argument (bench/matmul_bench.cc) means here,
// code by code: B as stored ("f32", "bf16", "int8"), whether the row runs the
// bf16 compute mode, whether a peer with that code names its stored weights
// (ggml's matmul, packed:1-3), and the summary's label for a Headway row.
struct PackedCode {
  const char* arg;
  const char* weights;
  bool bf16_compute;
  bool peer_stores;
  const char* label;
};
constexpr PackedCode kPackedCodes[] = {
    {"packed:0", "f32", false, false, ""},
    {"packed:1", "f32", false, true, " packed"},
    {"packed:2", "bf16", false, true, " bf16 weights"},
    {"packed:3", "int8", false, true, " int8 weights"},
    {"packed:4", "bf16", true, false, " bf16"},  // native kernel allowed
    {"packed:5", "bf16", true, false, " bf16 fallback"},
    {"packed:6", "bf16", true, false, " bf16 (A bf16)"},
    {"packed:7", "int8", true, false, " bf16 (int8 B)"}};

// The code of a "packed:N" argument; "" (none) is packed:0's, an unknown code
// float32 weights pre-packed.
const PackedCode& PackedOf(const std::string& arg) {
  static constexpr PackedCode kUnknown = {"", "f32", false, false, " packed"};
  if (arg.empty()) return kPackedCodes[0];
  for (const PackedCode& code : kPackedCodes) {
    if (arg == code.arg) return code;
  }
  return kUnknown;
}

Row ParseRow(const Run& run) {
  Row row;
  const std::vector<std::string> parts = Split(run.run_name.str(), '/');
  row.family = parts.empty() ? "" : parts[0];
  std::vector<std::string> base_words, peer_words;
  for (const std::string& word : Split(row.family, '_')) {
    // A word of a peer family's name marks the peer (harness.h).
    (IsPeerFamily(word) ? peer_words : base_words).push_back(word);
  }
  row.base = Join(base_words, '_');
  row.peer = Join(peer_words, '_');
  size_t first_arg = 1;
  if (parts.size() > 1) {
    first_arg = 2;
    for (const Target& target : CompiledTargets()) {
      if (parts[1] == target.name) row.target = parts[1];
    }
    if (row.target.empty()) row.peer += "/" + parts[1];
  }
  std::vector<std::string> shape, peer_shape;
  for (size_t i = first_arg; i < parts.size(); ++i) {
    const std::string& arg = parts[i];
    if (StartsWith(arg, "threads:")) {
      row.threads = std::stoi(arg.substr(8));
    } else if (arg.find(':') == std::string::npos ||
               StartsWith(arg, "min_time:") ||
               StartsWith(arg, "min_warmup_time:") ||
               StartsWith(arg, "repeats:") || StartsWith(arg, "iterations:")) {
      // real_time, min_time:..., and other run settings: not the shape.
    } else {
      shape.push_back(arg);
      if (StartsWith(arg, "packed:")) {
        row.packed = arg;
        if (PackedOf(arg).bf16_compute) row.compute = "bf16";
      } else if (StartsWith(arg, "compute:")) {
        // Attention's AttentionCompute: 1 is kBFloat16, 2 kInt8.
        if (arg == "compute:1") row.compute = "bf16";
        if (arg == "compute:2") row.compute = "int8";
      } else if (StartsWith(arg, "dtype:")) {
        // The stored type is a variant of the shape, as packed is.
        row.dtype = DtypeName(arg.substr(6));
      } else {
        peer_shape.push_back(arg);
      }
    }
  }
  row.shape = Join(shape, '/');
  row.peer_shape = Join(peer_shape, '/');
  if (run.error_occurred) {
    row.error = run.error_message;
    return row;
  }
  row.seconds = run.GetAdjustedRealTime() /
                benchmark::GetTimeUnitMultiplier(run.time_unit);
  for (const auto& [name, counter] : run.counters) {
    if (name == "GFLOP/s") {
      row.gflops = counter.value;
    } else if (name == "GB/s") {
      row.gbps = counter.value;
    } else if (!name.empty() && name[0] == '%') {
      row.ceiling = name.substr(1);
      row.percent = counter.value;
    }
  }
  return row;
}

// The figure that the bounding ceiling limits: GFLOP/s for the FMA peak, GB/s
// for a bandwidth; without a ceiling, GB/s if counted, else GFLOP/s.
std::string Figure(const Row& row) {
  char text[32];
  if (row.ceiling == "FMA" ||
      (row.ceiling.empty() && row.gbps == 0.0 && row.gflops > 0.0)) {
    snprintf(text, sizeof(text), "%8.1f GFLOP/s", row.gflops);
  } else if (!row.ceiling.empty() || row.gbps > 0.0) {
    snprintf(text, sizeof(text), "%8.1f GB/s   ", row.gbps);
  } else {
    snprintf(text, sizeof(text), "%8.3f ms     ", row.seconds * 1e3);
  }
  return text;
}

// float32 first, then bf16, f16, int8: the KvDtype order.
int DtypeRank(const Row& row) {
  static const char* const kOrder[] = {"f32", "bf16", "f16", "int8"};
  for (int i = 0; i < 4; ++i) {
    if (row.dtype == kOrder[i]) return i;
  }
  return row.dtype.empty() ? 0 : 4;
}

// True if the row stores K and V as float32 (or has no cache).
bool Float32Storage(const Row& row) {
  return row.dtype.empty() || row.dtype == "f32";
}

// How `row`'s matmul B is stored: "f32", "bf16" or "int8" (kPackedCodes).
std::string StoredWeights(const Row& row) {
  return PackedOf(row.packed).weights;
}

// True if the row's weights (a matmul's B) are float32, plain or pre-packed.
bool Float32Weights(const Row& row) { return StoredWeights(row) == "f32"; }

// The weights a peer names as stored ahead of the call (ggml's matmul,
// packed:1-3): StoredWeights; "" for any other peer.
std::string PeerWeights(const Row& peer) {
  return PackedOf(peer.packed).peer_stores ? StoredWeights(peer) : "";
}

// The run's own ceiling row for `row`'s bound: fma_peak of its target and
// thread count for "FMA", read_peak of its target (or of the best target that
// has one: the loop reads the same bytes on every vector target) for "read";
// null for another ceiling, a ceiling row itself or where the run has none.
const Row* RunCeiling(const std::vector<Row>& rows, const Row& row) {
  const char* family = row.ceiling == "FMA"    ? "fma_peak"
                       : row.ceiling == "read" ? "read_peak"
                                               : nullptr;
  if (family == nullptr || row.family == family) return nullptr;
  const Row* found = nullptr;
  for (const Row& other : rows) {
    if (other.family != family || other.threads != row.threads ||
        !other.error.empty()) {
      continue;
    }
    if (other.target == row.target) return &other;
    // Rows come best target first; peers have no target and FMA-bound peers
    // use the best target's peak, as their "bound" does.
    if (found == nullptr && (row.ceiling == "read" || row.target.empty())) {
      found = &other;
    }
  }
  return found;
}

// Prints the summary of `rows` (in run order) to `out`.
void PrintSummary(const std::vector<Row>& rows, std::ostream& out) {
  if (rows.empty()) return;
  // Groups: (base family, shape without packed) in order of first appearance.
  std::map<std::pair<std::string, std::string>, size_t> group_of;
  std::vector<size_t> group(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    group[i] = group_of
                   .emplace(std::make_pair(rows[i].base, rows[i].peer_shape),
                            group_of.size())
                   .first->second;
  }
  std::map<std::string, int> target_rank;
  for (const Target& target : CompiledTargets()) {
    target_rank.emplace(target.name, static_cast<int>(target_rank.size()));
  }
  auto rank = [&](const Row& row) {
    // Headway's rows best target first, then peers with a target, then the
    // others.
    const int t = row.target.empty() ? 99 : target_rank[row.target];
    return std::make_tuple(row.peer.empty() ? 0 : 1, row.target.empty(), t,
                           row.peer, row.packed, DtypeRank(row));
  };
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (group[a] != group[b]) return group[a] < group[b];
    if (rows[a].threads != rows[b].threads) {
      return rows[a].threads < rows[b].threads;
    }
    return rank(rows[a]) < rank(rows[b]);
  });

  out << "\nSummary (figure: the rate that the bounding ceiling limits; "
         "bound: its % of that\nceiling, measured at start; in run: its "
         "% of the same run's fma_peak or read_peak row,\nwhich shares "
         "the run's conditions when repetitions are interleaved; vs "
         "peer, vs SCALAR,\nvs f32: the fastest peer's, SCALAR's or the "
         "float32-cache row's (matmul: the\nfloat32-weights row's) time "
         "/ this row's time on the same shape, target and thread\ncount, "
         "so 2.00x is twice as fast; bf16, f16, int8: the KV cache's "
         "stored type; bf16 /\nint8 weights: B stored so; bf16 (matmul): "
         "bf16 compute)\n";
  char line[288];
  size_t previous_group = rows.size();
  for (size_t i : order) {
    const Row& row = rows[i];
    if (group[i] != previous_group) {
      previous_group = group[i];
      std::string title = row.base;
      for (const std::string& arg : Split(row.peer_shape, '/')) {
        title += " " + arg;
      }
      snprintf(line, sizeof(line),
               "\n%s\n  %-22s %3s %16s %9s %6s %20s %9s %7s\n", title.c_str(),
               "variant", "thr", "figure", "bound", "in run", "vs peer",
               "vs SCALAR", "vs f32");
      out << line;
    }
    std::string variant = row.target;
    if (!row.peer.empty()) variant += (variant.empty() ? "" : " ") + row.peer;
    if (!row.compute.empty() && row.packed.empty()) {
      // Attention and the decode kernels: the cache has the compute mode's
      // type too.
      variant += " " + row.compute + " compute";
    } else if (row.compute.empty() || row.peer.empty()) {
      // A bf16 compute peer's name says bf16 already.
      variant += PackedOf(row.packed).label;
    }
    if (!row.dtype.empty() && row.compute.empty()) variant += " " + row.dtype;
    if (!row.error.empty()) {
      snprintf(line, sizeof(line), "  %-22s %3d  error: %s\n", variant.c_str(),
               row.threads, row.error.c_str());
      out << line;
      continue;
    }
    char bound[16] = "-";
    if (!row.ceiling.empty()) {
      snprintf(bound, sizeof(bound), "%3.0f%% %s", row.percent,
               row.ceiling.c_str());
    }
    // The fastest peer on this shape and thread count (on the same target if
    // the peer has targets). A peer that names its stored type, a dtype or
    // packed:1-3 (ggml's attention on the KV cache types, its matmul on the
    // weight types), compares with the rows that store that type in every
    // compute mode: it multiplies as its library does for that type. The
    // others store float32: they compare with float32-storage rows, a bf16
    // compute row with the bf16 peers, a float32 one with the float32 peers.
    const Row* best_peer = nullptr;
    const Row* scalar = nullptr;
    // This row with a float32 cache, or for narrower weights with float32
    // weights pre-packed.
    const Row* float32 = nullptr;
    for (const Row& other : rows) {
      if (!other.error.empty() || other.threads != row.threads) continue;
      if (row.peer.empty() && !other.peer.empty() && other.base == row.base &&
          other.peer_shape == row.peer_shape &&
          (!other.dtype.empty() ? other.dtype == row.dtype
           : !PeerWeights(other).empty()
               ? PeerWeights(other) == StoredWeights(row)
               : Float32Storage(row) && other.compute == row.compute) &&
          (other.target.empty() || other.target == row.target) &&
          (best_peer == nullptr || other.seconds < best_peer->seconds)) {
        best_peer = &other;
      }
      if (!Float32Storage(row) && other.dtype == "f32" &&
          other.family == row.family && other.target == row.target &&
          other.peer == row.peer && other.peer_shape == row.peer_shape &&
          other.packed == row.packed) {
        float32 = &other;
      }
      if (!Float32Weights(row) && row.peer.empty() && other.peer.empty() &&
          other.packed == "packed:1" && other.family == row.family &&
          other.target == row.target && other.peer_shape == row.peer_shape) {
        float32 = &other;
      }
      if (!row.target.empty() && other.target == "SCALAR" &&
          other.family == row.family && other.shape == row.shape) {
        scalar = &other;
      }
    }
    char vs_peer[32] = "-";
    if (best_peer != nullptr) {
      snprintf(vs_peer, sizeof(vs_peer), "%6.2fx %-12s",
               best_peer->seconds / row.seconds,
               Split(best_peer->peer, '/')[0].c_str());
    }
    char vs_scalar[32] = "-";
    if (scalar != nullptr) {
      snprintf(vs_scalar, sizeof(vs_scalar), "%7.1fx",
               scalar->seconds / row.seconds);
    }
    char vs_f32[32] = "-";
    if (float32 != nullptr) {
      snprintf(vs_f32, sizeof(vs_f32), "%6.2fx",
               float32->seconds / row.seconds);
    }
    char in_run[16] = "-";
    if (const Row* peak = RunCeiling(rows, row)) {
      const double figure = row.ceiling == "FMA" ? row.gflops : row.gbps;
      const double ceiling = row.ceiling == "FMA" ? peak->gflops : peak->gbps;
      if (ceiling > 0.0) {
        snprintf(in_run, sizeof(in_run), "%4.0f%%", 100.0 * figure / ceiling);
      }
    }
    snprintf(line, sizeof(line), "  %-22s %3d %16s %9s %6s %20s %9s %7s\n",
             variant.c_str(), row.threads, Figure(row).c_str(), bound, in_run,
             vs_peer, vs_scalar, vs_f32);
    out << line;
  }
  out.flush();
}

// Wraps Google Benchmark's display reporter: percentages without "/s", a
// progress line on stderr, and the summary at the end.
class HarnessReporter : public benchmark::BenchmarkReporter {
 public:
  HarnessReporter(benchmark::BenchmarkReporter* inner,
                  std::vector<std::string> names)
      : inner_(inner),
        names_(std::move(names)),
        transient_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}

  bool ReportContext(const Context& context) override {
    const bool ok = inner_->ReportContext(context);
    if (ok) ShowProgress();
    return ok;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    ClearProgress();
    std::vector<Run> copy = runs;
    for (Run& run : copy) {
      for (auto& [name, counter] : run.counters) {
        if (!name.empty() && name[0] == '%') {
          counter.flags = static_cast<benchmark::Counter::Flags>(
              counter.flags & ~benchmark::Counter::kIsRate);
        }
      }
    }
    inner_->ReportRuns(copy);
    inner_->GetOutputStream().flush();
    if (!runs.empty()) Record(runs);
    ShowProgress();
  }

  void Finalize() override {
    ClearProgress();
    inner_->Finalize();
    // The table goes with the console output; JSON or CSV on stdout stay
    // clean.
    const bool console =
        dynamic_cast<benchmark::ConsoleReporter*>(inner_) != nullptr;
    PrintSummary(rows_, console ? inner_->GetOutputStream() : std::cerr);
  }

 private:
  // One row per benchmark: its run, or with repetitions the median, which
  // Google Benchmark reports in a second call of its own.
  void Record(const std::vector<Run>& runs) {
    const std::string name = runs[0].run_name.str();
    bool aggregates = true;
    const Run* median = nullptr;
    for (const Run& run : runs) {
      aggregates &= run.run_type == Run::RT_Aggregate;
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median") {
        median = &run;
      }
    }
    const auto row = row_of_.find(name);
    if (aggregates && row != row_of_.end()) {
      if (median != nullptr) rows_[row->second] = ParseRow(*median);
      return;
    }
    row_of_[name] = rows_.size();
    rows_.push_back(ParseRow(median != nullptr ? *median : runs[0]));
    // With --benchmark_enable_random_interleaving the order is not the list's:
    // then the line names the benchmark that finished.
    if (done_ >= names_.size() || names_[done_] != name) in_order_ = false;
    last_ = name;
    ++done_;
  }

  void ShowProgress() {
    if (done_ >= names_.size()) return;
    // A full line once per benchmark; the terminal line again after each
    // output that cleared it.
    if (!transient_ && done_ == lines_) return;
    lines_ = done_;
    const int seconds = static_cast<int>(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count());
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "[%zu/%zu %d:%02d] ",
             in_order_ ? done_ + 1 : done_, names_.size(), seconds / 60,
             seconds % 60);
    std::string text = prefix;
    text += in_order_ ? names_[done_] + " ..." : "done: " + last_;
    if (transient_) {
      // One terminal line, overwritten by the next output: cut to its width.
      winsize size{};
      const size_t width =
          ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0
              ? size.ws_col
              : 80;
      if (text.size() >= width) text.resize(width - 1);
      fprintf(stderr, "%s", text.c_str());
      shown_ = true;
    } else {
      fprintf(stderr, "%s\n", text.c_str());
    }
    fflush(stderr);
  }

  void ClearProgress() {
    if (!shown_) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    shown_ = false;
  }

  benchmark::BenchmarkReporter* inner_;  // owned by Google Benchmark
  std::vector<std::string> names_;       // the filtered list, in run order
  bool transient_;                       // stderr is a terminal
  std::chrono::steady_clock::time_point start_;
  size_t done_ = 0;          // benchmarks reported
  size_t lines_ = SIZE_MAX;  // done_ at the last full line
  bool in_order_ = true;
  bool shown_ = false;
  std::string last_;
  std::vector<Row> rows_;
  std::map<std::string, size_t> row_of_;  // benchmark name -> index in rows_
};

// Collects what Google Benchmark prints in list mode.
class ListReporter : public benchmark::BenchmarkReporter {
 public:
  explicit ListReporter(std::ostream* out) {
    SetOutputStream(out);
    SetErrorStream(out);
  }
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Sets --benchmark_list_tests to `value` through benchmark::Initialize, the
// only public way; other flags keep their values. Initialize also re-adds the
// --benchmark_context pairs and complains on std::cerr that they exist:
// silenced.
void SetListTests(char* argv0, bool value) {
  std::string flag =
      std::string("--benchmark_list_tests=") + (value ? "true" : "false");
  char* args[] = {argv0, flag.data(), nullptr};
  int count = 2;
  std::ostringstream discard;
  std::streambuf* saved = std::cerr.rdbuf(discard.rdbuf());
  benchmark::Initialize(&count, args);
  std::cerr.rdbuf(saved);
}

// The names of the benchmarks that --benchmark_filter selects, in run order.
std::vector<std::string> FilteredNames(char* argv0) {
  SetListTests(argv0, true);
  std::ostringstream listing;
  ListReporter lister(&listing);
  benchmark::RunSpecifiedBenchmarks(&lister);
  SetListTests(argv0, false);
  std::vector<std::string> names;
  for (const std::string& line : Split(listing.str(), '\n')) {
    // Error messages (no match) contain spaces; names do not.
    if (!line.empty() && line.find(' ') == std::string::npos) {
      names.push_back(line);
    }
  }
  return names;
}

}  // namespace

size_t RunBenchmarks(char* argv0) {
  HarnessReporter display(benchmark::CreateDefaultDisplayReporter(),
                          FilteredNames(argv0));
  return benchmark::RunSpecifiedBenchmarks(&display);
}

}  // namespace bench
}  // namespace headway

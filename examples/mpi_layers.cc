// mpi_layers: a decoder stack of Headway attention layers split across MPI
// ranks by query heads (tensor parallelism), checked against the whole stack.
//
// Every rank builds the same stack as generate.cc's "gqa" configuration (random
// weights from fixed seeds, so identical on every rank) but each of its layers
// owns only a range of the query heads, on KV-group boundaries: the
// n_kv_heads groups are split as evenly as possible (3 ranks over 8 groups:
// 3, 3 and 2 groups). A rank keeps a KV cache of its own KV heads only. Each
// layer's Forward returns the rank's partial output projection; MPI_Allreduce
// (MPI_SUM) turns the partials into the layer's output on every rank, and the
// residual and RMS normalisation between layers (h = RmsNorm(h + y), as in
// generate.cc) run on every rank on identical data.
//
// It runs --sequences sequences of different prompt lengths (one prefill
// Forward per layer for all of them), then --tokens decode steps of all the
// sequences in one Forward per layer. Rank 0 then runs the whole stack in one
// process (head_begin = head_end = 0: all heads) on the same inputs and checks
// every step's output against the sharded one; it prints prefill and decode
// tokens per second and the time spent in MPI_Allreduce. The exit code is
// nonzero on a mismatch, on ranks that disagree, or when the rank count cannot
// split the KV groups (more ranks than groups).
//
//   mpirun -np 2 mpi_layers [--layers=4] [--d_model=512] [--heads=16]
//            [--kv_heads=8] [--prompt=64] [--sequences=3] [--tokens=16]
//            [--threads=1] [--check=1] [--sync=0]
//
// --prompt is the longest prompt; sequence s of S has (s + 1) * prompt / S
// tokens (at least 1). --threads is per rank (0: TBB's default); ranks on one
// machine share its cores, hence the default of 1. --check=0 skips the
// single-process reference (for sizes where rank 0 cannot hold the whole
// model's weights and caches twice). --sync=1 puts an MPI_Barrier before each
// MPI_Allreduce and times it apart, so that the all-reduce's time is the
// reduction's own, not the wait for the slowest rank.
// MPI's C API only: Open MPI's and MPICH's deprecated C++ bindings (which
// mpi.h pulls in for C++) do not compile warning-free at -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "examples/example_support.h"
#include "headway/kv_cache.h"
#include "headway/layer.h"
#include "headway/status.h"
#include "headway/view.h"
#include "tbb/task_arena.h"

namespace examples {
namespace {

int g_rank = 0;

}  // namespace

// Ends the program on every rank: MPI_Abort takes down all of them.
[[noreturn]] void Fail(const std::string& message, int code) {
  std::fprintf(stderr, "mpi_layers (rank %d): %s\n", g_rank, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

const char* Usage() {
  return "usage: mpirun -np N mpi_layers [--layers=N] [--d_model=N] "
         "[--heads=N] [--kv_heads=N] [--prompt=N] [--sequences=N] "
         "[--tokens=N] [--threads=N] [--check=0|1] [--sync=0|1]";
}

namespace {

using headway::AttentionLayer;
using headway::AttentionLayerConfig;
using headway::KvCache;
using headway::LayerSequence;
using headway::MatrixView;

struct Options {
  int64_t layers = 4;
  int64_t d_model = 512;
  int64_t heads = 16;
  int64_t kv_heads = 8;
  int64_t prompt = 64;  // the longest prompt
  int64_t sequences = 3;
  int64_t tokens = 16;  // decode steps (one token of every sequence each)
  int64_t threads = 1;  // per rank; 0: TBB's default
  int64_t check = 1;    // rank 0 runs the whole stack and compares
  int64_t sync = 0;     // a timed MPI_Barrier before each MPI_Allreduce
};

Options ParseOptions(int argc, char** argv) {
  Options options;
  ParseFlags(argc, argv,
             {{"layers", &options.layers, 1},
              {"d_model", &options.d_model, 1},
              {"heads", &options.heads, 1},
              {"kv_heads", &options.kv_heads, 1},
              {"prompt", &options.prompt, 1},
              {"sequences", &options.sequences, 1},
              {"tokens", &options.tokens, 0},
              {"threads", &options.threads, 0},
              {"check", &options.check, 0},
              {"sync", &options.sync, 0}},
             [](const std::string& name, const std::string&) {
               UsageError("unknown flag --" + name);
             });
  if (options.heads % options.kv_heads != 0) {
    UsageError("--heads (" + std::to_string(options.heads) +
               ") must be a multiple of --kv_heads (" +
               std::to_string(options.kv_heads) + ")");
  }
  return options;
}

// The stack of one process: its layers (a shard or whole) and their caches.
struct Stack {
  std::vector<AttentionLayer> layers;
  std::vector<KvCache> caches;
  size_t cache_bytes = 0;
};

// head_begin = head_end = 0 builds the whole layers.
Stack MakeStack(const Options& options, int64_t head_begin, int64_t head_end,
                int64_t capacity) {
  const int64_t d = options.d_model, head_dim = d / options.heads;
  const int64_t q_cols = options.heads * head_dim;
  const int64_t kv_cols = options.kv_heads * head_dim;
  Stack stack;
  stack.layers.resize(options.layers);
  stack.caches.resize(options.layers);
  for (int64_t l = 0; l < options.layers; ++l) {
    // The whole layer's weights on every rank: a shard takes its own columns
    // and rows at Create (and b_o if its head_begin is 0).
    const HostWeights w = MakeWeights(d, q_cols, kv_cols, 100 * l + 17);
    AttentionLayerConfig config;
    config.d_model = d;
    config.n_heads = options.heads;
    config.n_kv_heads = options.kv_heads;
    config.head_begin = head_begin;
    config.head_end = head_end;
    Check(AttentionLayer::Create(config, Views(w, d, q_cols, kv_cols),
                                 &stack.layers[l]),
          "AttentionLayer::Create");
    // The cache holds this layer's own KV heads only.
    Check(KvCache::Create(
              stack.layers[l].CacheConfig(options.sequences, capacity),
              &stack.caches[l]),
          "KvCache::Create");
    stack.cache_bytes += stack.caches[l].bytes();
  }
  return stack;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds spent in MPI_Allreduce, and in MPI_Barrier before it with --sync
// (accumulated by StackForward).
double g_allreduce_seconds = 0.0;
double g_barrier_seconds = 0.0;
bool g_sync = false;

// The stack over the new tokens of `sequences`: h [rows, d] is the input and
// becomes the output; y [rows, d] is scratch. With `reduce`, each layer's
// partial output is summed over the ranks before the residual.
void StackForward(Stack& stack, const std::vector<LayerSequence>& sequences,
                  int64_t rows, int64_t d, bool reduce, float* h, float* y) {
  for (size_t l = 0; l < stack.layers.size(); ++l) {
    Check(stack.layers[l].Forward(&stack.caches[l], sequences.data(),
                                  static_cast<int64_t>(sequences.size()),
                                  MatrixView<const float>(h, rows, d),
                                  MatrixView<float>(y, rows, d)),
          "AttentionLayer::Forward");
    if (reduce) {
      if (g_sync) {
        const double wait = Now();
        MPI_Barrier(MPI_COMM_WORLD);
        g_barrier_seconds += Now() - wait;
      }
      const double start = Now();
      MPI_Allreduce(MPI_IN_PLACE, y, static_cast<int>(rows * d), MPI_FLOAT,
                    MPI_SUM, MPI_COMM_WORLD);
      g_allreduce_seconds += Now() - start;
    }
    AddResidualAndNormalize(h, y, rows, d);
  }
}

// Every step's input and (sharded) output, [rows, d] each: the prefill, then
// one step per decode token.
struct Trace {
  std::vector<std::vector<float>> inputs, outputs;
};

struct PhaseTimes {
  double prefill_s = 0.0, prefill_allreduce_s = 0.0;
  double decode_s = 0.0, decode_allreduce_s = 0.0;
  double prefill_barrier_s = 0.0, decode_barrier_s = 0.0;
};

// Runs the prefill and the decode steps on `stack`, recording them in trace.
PhaseTimes Generate(const Options& options, Stack& stack, bool reduce,
                    const std::vector<int64_t>& prompt_lengths,
                    const std::vector<float>& prompt, Trace* trace) {
  const int64_t d = options.d_model, n_seq = options.sequences;
  const int64_t prompt_rows = static_cast<int64_t>(prompt.size()) / d;
  std::vector<LayerSequence> prefill, step;
  for (int64_t s = 0; s < n_seq; ++s) {
    prefill.push_back({s, prompt_lengths[s]});
    step.push_back({s, 1});
  }
  PhaseTimes times;
  std::vector<float> h = prompt, y(prompt.size());
  if (reduce) MPI_Barrier(MPI_COMM_WORLD);
  double start = Now(), allreduce0 = g_allreduce_seconds;
  double barrier0 = g_barrier_seconds;
  StackForward(stack, prefill, prompt_rows, d, reduce, h.data(), y.data());
  times.prefill_s = Now() - start;
  times.prefill_allreduce_s = g_allreduce_seconds - allreduce0;
  times.prefill_barrier_s = g_barrier_seconds - barrier0;
  trace->inputs.push_back(prompt);
  trace->outputs.push_back(h);

  // Decode: the last prompt row of each sequence feeds its first step.
  std::vector<float> last(n_seq * d), x(n_seq * d);
  int64_t row = 0;
  for (int64_t s = 0; s < n_seq; ++s) {
    row += prompt_lengths[s];
    std::copy(h.begin() + (row - 1) * d, h.begin() + row * d,
              last.begin() + s * d);
  }
  if (reduce) MPI_Barrier(MPI_COMM_WORLD);
  start = Now();
  allreduce0 = g_allreduce_seconds;
  barrier0 = g_barrier_seconds;
  for (int64_t t = 0; t < options.tokens; ++t) {
    NextInputs(last.data(), n_seq, d, x.data());
    trace->inputs.push_back(x);
    StackForward(stack, step, n_seq, d, reduce, x.data(), y.data());
    trace->outputs.push_back(x);
    last = x;
  }
  times.decode_s = Now() - start;
  times.decode_allreduce_s = g_allreduce_seconds - allreduce0;
  times.decode_barrier_s = g_barrier_seconds - barrier0;
  return times;
}

// A hash of the bits of every output, to check that all ranks agree.
uint64_t Fingerprint(const Trace& trace) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (const std::vector<float>& output : trace.outputs) {
    for (const float value : output) {
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof(bits));
      hash = (hash ^ bits) * 1099511628211ull;
    }
  }
  return hash;
}

int Main(int argc, char** argv) {
  int n_ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
  const Options options = ParseOptions(argc, argv);
  const int64_t d = options.d_model;
  g_sync = options.sync != 0;

  // The KV groups (a KV head and the query heads that read it) split as evenly
  // as possible: the first n_groups % n_ranks ranks take one more.
  const int64_t n_groups = options.kv_heads;
  if (n_ranks > n_groups) {
    if (g_rank == 0) {
      std::fprintf(stderr,
                   "mpi_layers: %d ranks cannot split %lld KV groups "
                   "(--kv_heads): a shard owns whole KV groups, so run at most "
                   "%lld ranks\n",
                   n_ranks, static_cast<long long>(n_groups),
                   static_cast<long long>(n_groups));
    }
    return 1;
  }
  const int64_t heads_per_group = options.heads / options.kv_heads;
  const int64_t base = n_groups / n_ranks, extra = n_groups % n_ranks;
  const int64_t group_begin = g_rank * base + std::min<int64_t>(g_rank, extra);
  const int64_t group_end = group_begin + base + (g_rank < extra ? 1 : 0);
  const int64_t head_begin = group_begin * heads_per_group;
  const int64_t head_end = group_end * heads_per_group;

  std::vector<int64_t> prompt_lengths;
  int64_t prompt_rows = 0;
  for (int64_t s = 0; s < options.sequences; ++s) {
    prompt_lengths.push_back(
        std::max<int64_t>(1, (s + 1) * options.prompt / options.sequences));
    prompt_rows += prompt_lengths.back();
  }
  const int64_t capacity = options.prompt + options.tokens;
  std::vector<float> prompt =
      RandomUniform(static_cast<size_t>(prompt_rows * d), 1.0f, 1);
  RmsNormalize(prompt.data(), prompt_rows, d);

  tbb::task_arena arena(options.threads > 0 ? static_cast<int>(options.threads)
                                            : tbb::task_arena::automatic);
  arena.initialize();
  if (g_rank == 0) {
    std::printf(
        "%d ranks, %lld layers, d_model %lld, %lld heads of %lld, %lld KV "
        "heads, %lld sequences (prompts of",
        n_ranks, static_cast<long long>(options.layers),
        static_cast<long long>(d), static_cast<long long>(options.heads),
        static_cast<long long>(d / options.heads),
        static_cast<long long>(options.kv_heads),
        static_cast<long long>(options.sequences));
    for (const int64_t length : prompt_lengths) {
      std::printf(" %lld", static_cast<long long>(length));
    }
    std::printf(" tokens), %lld decode steps, %d threads per rank\n",
                static_cast<long long>(options.tokens),
                arena.max_concurrency());
  }

  Trace trace;
  PhaseTimes times;
  size_t cache_bytes = 0;
  arena.execute([&] {
    Stack stack = MakeStack(options, head_begin, head_end, capacity);
    cache_bytes = stack.cache_bytes;
    // Warm-up: the first Forward of a size allocates the layers' scratch and
    // takes its page faults, which a server pays once at start-up.
    Trace warm_up;
    Options short_run = options;
    short_run.tokens = std::min<int64_t>(1, options.tokens);
    Generate(short_run, stack, /*reduce=*/true, prompt_lengths, prompt,
             &warm_up);
    for (KvCache& cache : stack.caches) cache.ResetAll();
    times = Generate(options, stack, /*reduce=*/true, prompt_lengths, prompt,
                     &trace);
  });

  // Each rank's shard and timings, in rank order.
  const double mine[5] = {static_cast<double>(head_begin),
                          static_cast<double>(head_end),
                          static_cast<double>(cache_bytes),
                          times.prefill_allreduce_s, times.decode_allreduce_s};
  std::vector<double> all(5 * static_cast<size_t>(n_ranks));
  MPI_Gather(mine, 5, MPI_DOUBLE, all.data(), 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);

  // The ranks must agree bit for bit: they normalise the same reduced sums.
  const uint64_t fingerprint = Fingerprint(trace);
  uint64_t lowest = 0, highest = 0;
  MPI_Allreduce(&fingerprint, &lowest, 1, MPI_UINT64_T, MPI_MIN,
                MPI_COMM_WORLD);
  MPI_Allreduce(&fingerprint, &highest, 1, MPI_UINT64_T, MPI_MAX,
                MPI_COMM_WORLD);

  int failed = lowest != highest ? 1 : 0;
  if (g_rank == 0) {
    for (int r = 0; r < n_ranks; ++r) {
      const double* row = all.data() + 5 * r;
      std::printf(
          "rank %d: query heads [%lld, %lld), KV heads [%lld, %lld), "
          "KV cache %s\n",
          r, static_cast<long long>(row[0]), static_cast<long long>(row[1]),
          static_cast<long long>(row[0]) / heads_per_group,
          static_cast<long long>(row[1]) / heads_per_group,
          FormatBytes(row[2]).c_str());
    }
    const double decode_tokens =
        static_cast<double>(options.tokens * options.sequences);
    std::printf(
        "prefill: %lld tokens in %.3f ms, %.1f tok/s; MPI_Allreduce %.3f ms "
        "(%.1f%%), MPI_Barrier %.3f ms (%.1f%%)\n",
        static_cast<long long>(prompt_rows), 1e3 * times.prefill_s,
        static_cast<double>(prompt_rows) / times.prefill_s,
        1e3 * times.prefill_allreduce_s,
        100.0 * times.prefill_allreduce_s / times.prefill_s,
        1e3 * times.prefill_barrier_s,
        100.0 * times.prefill_barrier_s / times.prefill_s);
    if (options.tokens > 0) {
      const double steps = static_cast<double>(options.tokens);
      const double layer_steps = steps * static_cast<double>(options.layers);
      std::printf(
          "decode:  %lld steps of %lld tokens in %.3f ms, %.1f tok/s, %.3f ms "
          "per step; MPI_Allreduce %.3f ms (%.1f%%, %.1f us per layer and "
          "step), MPI_Barrier %.3f ms (%.1f%%)\n",
          static_cast<long long>(options.tokens),
          static_cast<long long>(options.sequences), 1e3 * times.decode_s,
          decode_tokens / times.decode_s, 1e3 * times.decode_s / steps,
          1e3 * times.decode_allreduce_s,
          100.0 * times.decode_allreduce_s / times.decode_s,
          1e6 * times.decode_allreduce_s / layer_steps,
          1e3 * times.decode_barrier_s,
          100.0 * times.decode_barrier_s / times.decode_s);
    }
    std::printf(
        "(rank 0's times; without --sync=1, MPI_Allreduce's time includes "
        "waiting for the slowest rank)\n");
    if (failed) {
      std::fprintf(stderr, "mpi_layers: the ranks' outputs differ\n");
    }
  }

  if (g_rank == 0 && options.check != 0) {
    // The whole stack in this process, on the sharded run's inputs.
    Trace reference;
    Options whole = options;
    PhaseTimes whole_times;
    arena.execute([&] {
      Stack stack = MakeStack(whole, 0, 0, capacity);
      // The sharded and whole outputs differ only in the order of the sums
      // of the output projection: a shard sums its own heads' rows of W_O,
      // the all-reduce sums the shards, the whole layer sums all n = n_heads *
      // head_dim rows in its GEMM's order. Rounding errors of a reordered sum
      // of n terms add up like a random walk, to about sqrt(n) ulps of the
      // output's magnitude (unit RMS after each RmsNorm), and a layer passes
      // its input's error on with a gain of about 1 (the normalisation, a
      // softmax of scores of order 1, weights of unit gain), so the error grows
      // about linearly with the layers. The budget: 4 sqrt(n) ulps of 1 per
      // layer, relative to max(1, |whole|), which is 10-45x what the runs
      // measure (max |diff| printed below: 1.0e-6 for 2 layers of d_model
      // 128, 3.1e-6 for 4 of 512, 1.4e-6 for 2 of 4096) and still
      // catches a wrong shard (a missing head, or b_o added twice, moves the
      // outputs by 1e-2 or more).
      const double tolerance =
          4.0 *
          std::sqrt(static_cast<double>(options.heads * (d / options.heads))) *
          0x1.0p-23 * static_cast<double>(options.layers);
      std::vector<LayerSequence> prefill, step;
      for (int64_t s = 0; s < options.sequences; ++s) {
        prefill.push_back({s, prompt_lengths[s]});
        step.push_back({s, 1});
      }
      double worst = 0.0;  // the largest |diff| / max(1, |reference|)
      for (size_t t = 0; t < trace.inputs.size(); ++t) {
        std::vector<float> h = trace.inputs[t], y(h.size());
        const int64_t rows = static_cast<int64_t>(h.size()) / d;
        const double start = Now();
        StackForward(stack, t == 0 ? prefill : step, rows, d,
                     /*reduce=*/false, h.data(), y.data());
        (t == 0 ? whole_times.prefill_s : whole_times.decode_s) +=
            Now() - start;
        for (size_t i = 0; i < h.size(); ++i) {
          const double diff = std::fabs(double{h[i]} - trace.outputs[t][i]) /
                              std::max(1.0, std::fabs(double{h[i]}));
          if (!(diff <= tolerance)) {
            if (!failed) {
              std::fprintf(stderr,
                           "mpi_layers: step %zu, row %lld, column %lld: "
                           "sharded %.9g, whole %.9g (tolerance %.2e)\n",
                           t, static_cast<long long>(i / d),
                           static_cast<long long>(i % d),
                           double{trace.outputs[t][i]}, double{h[i]},
                           tolerance);
            }
            failed = 1;
          }
          worst = std::max(worst, std::isnan(diff) ? INFINITY : diff);
        }
      }
      std::printf(
          "single process: prefill %.1f tok/s, decode %.1f tok/s (no warm-up); "
          "KV cache %s\n",
          static_cast<double>(prompt_rows) / whole_times.prefill_s,
          options.tokens > 0
              ? static_cast<double>(options.tokens * options.sequences) /
                    whole_times.decode_s
              : 0.0,
          FormatBytes(static_cast<double>(stack.cache_bytes)).c_str());
      std::printf(
          "check: %zu steps, max |sharded - whole| / max(1, |whole|) = %.2e, "
          "tolerance %.2e: %s\n",
          trace.inputs.size(), worst, tolerance, failed ? "FAIL" : "ok");
    });
  }
  std::fflush(stdout);
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failed;
}

}  // namespace
}  // namespace examples

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int code = examples::Main(argc, argv);
  MPI_Finalize();
  return code;
}

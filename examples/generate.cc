// generate: a toy decoder made of Headway attention layers, timed on every
// instruction set this CPU supports.
//
// A stack of AttentionLayers with random weights (fixed seeds) runs a prompt
// with one Forward call per layer (prefill), then generates tokens one at a
// time against the layers' KV caches (decode). It does so for each layer
// configuration of --configs, on each instruction set, and prints prefill and
// decode tokens per second, the KV cache's size and the parameter count.
// --kv_dtype picks the KV cache's stored type (float32, bfloat16, float16 or
// int8), as an engine would. The configurations, all of the same d_model:
//   mha, gqa, mqa  plain attention with n_heads, n_heads / 4 and 1 KV heads;
//   llama3   GQA and RoPE with Llama 3.1's scaling (theta 500000, factor 8);
//   qwen3    GQA, QK-norm and RoPE (theta 1000000);
//   mistral  GQA, RoPE and a sliding window on every layer;
//   gemma2   GQA (n_heads / 2), RoPE, logit soft-capping at 50, layers
//            alternating between a sliding window and global attention;
//   gpt-oss  GQA, RoPE, learned sink logits per head, layers alternating
//            between a sliding window and global attention;
//   streaming  GQA, RoPE and a sliding window with 4 pinned sink tokens on
//            every layer (StreamingLLM).
// The window is --window tokens (128 by default, gpt-oss's; Mistral and Gemma
// 2 use 4096, longer than this demo's default prompt). A windowed layer keeps
// a ring cache of window (+ sink tokens) rows, as engines do: "KV total"
// shows what that saves.
//
// There is no vocabulary: no embedding table, no LM head, no sampling. The
// hidden state of the next token is the stack's output for the previous one
// through a fixed nonlinearity and an RMS normalisation (NextInputs), which
// keeps the values bounded, as "sample a token and look up its embedding"
// would. Between layers, h = RmsNorm(h + Attention(h)): a post-norm residual
// block without the MLP.
//
//   generate [--layers=4] [--d_model=512] [--heads=8] [--prompt=256]
//            [--tokens=128] [--threads=0] [--targets=all]
//            [--kv_dtype=float32] [--window=128]
//            [--configs=mha,gqa,mqa,llama3,qwen3,mistral,gemma2,gpt-oss,
//                       streaming]
//
// --threads=0 runs on TBB's default thread count. --targets takes "all" (every
// instruction set this CPU supports), "best", or a comma-separated list of
// names (e.g. "AVX2,SCALAR"). Flags also take their value as the next
// argument ("--layers 1").
#include <strings.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/example_support.h"
#include "headway/attention.h"
#include "headway/headway.h"
#include "headway/kv_cache.h"
#include "headway/layer.h"
#include "headway/rope.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/view.h"
#include "tbb/task_arena.h"

namespace examples {

[[noreturn]] void Fail(const std::string& message, int code) {
  std::fprintf(stderr, "generate: %s\n", message.c_str());
  std::exit(code);
}

const char* Usage() {
  return "usage: generate [--layers=N] [--d_model=N] [--heads=N] "
         "[--prompt=N] [--tokens=N] [--threads=N] "
         "[--targets=all|best|NAME,...] "
         "[--kv_dtype=float32|bfloat16|float16|int8] [--window=N] "
         "[--configs=NAME,...]";
}

namespace {

using headway::AttentionLayer;
using headway::AttentionLayerConfig;
using headway::KvCache;
using headway::KvDtype;
using headway::LayerSequence;
using headway::MatrixView;
using headway::Status;
using headway::Target;

struct Options {
  int64_t layers = 4;
  int64_t d_model = 512;
  int64_t heads = 8;
  int64_t prompt = 256;  // prompt tokens (prefill)
  int64_t tokens = 128;  // generated tokens (decode)
  int64_t threads = 0;   // 0: TBB's default
  std::string targets = "all";
  KvDtype kv_dtype = KvDtype::kFloat32;
  int64_t window = 128;  // of the windowed configurations' local layers
  std::vector<std::string> configs = {"mha",    "gqa",     "mqa",
                                      "llama3", "qwen3",   "mistral",
                                      "gemma2", "gpt-oss", "streaming"};
};

// Whether `name` is one of the configurations the demo knows.
bool KnownConfig(const std::string& name) {
  const Options defaults;
  for (const std::string& known : defaults.configs) {
    if (name == known) return true;
  }
  return false;
}

// The KV cache type's name, as the library spells it.
const char* KvDtypeName(KvDtype dtype) {
  return hw_kv_dtype_name(static_cast<int>(dtype));
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  const auto set_other = [&](const std::string& name,
                             const std::string& value) {
    if (name == "targets") {
      options.targets = value;
    } else if (name == "configs") {
      options.configs.clear();
      size_t begin = 0;
      while (begin <= value.size()) {
        size_t end = value.find(',', begin);
        if (end == std::string::npos) end = value.size();
        const std::string config = value.substr(begin, end - begin);
        if (!KnownConfig(config)) {
          UsageError("--configs: unknown configuration \"" + config +
                     "\" (mha, gqa, mqa, llama3, qwen3, mistral, gemma2, "
                     "gpt-oss, streaming)");
        }
        options.configs.push_back(config);
        begin = end + 1;
      }
    } else if (name == "kv_dtype") {
      // The names of the KvDtype values 0, 1, ... until "unknown".
      int dtype = 0;
      while (std::string(hw_kv_dtype_name(dtype)) != "unknown" &&
             value != hw_kv_dtype_name(dtype)) {
        ++dtype;
      }
      if (std::string(hw_kv_dtype_name(dtype)) == "unknown") {
        UsageError(
            "--kv_dtype takes float32, bfloat16, float16 or int8, got \"" +
            value + "\"");
      }
      options.kv_dtype = static_cast<KvDtype>(dtype);
    } else {
      UsageError("unknown flag --" + name);
    }
  };
  ParseFlags(argc, argv,
             {{"layers", &options.layers, 1},
              {"d_model", &options.d_model, 1},
              {"heads", &options.heads, 1},
              {"prompt", &options.prompt, 1},
              {"tokens", &options.tokens, 0},
              {"threads", &options.threads, 0},
              {"window", &options.window, 1}},
             set_other);
  return options;
}

// The instruction sets to run: `spec` is "all", "best" or "NAME,NAME,...".
std::vector<Target> SelectTargets(const std::string& spec) {
  const std::vector<Target> supported = headway::SupportedTargets();
  if (spec == "all") return supported;
  if (spec == "best") return {supported.front()};
  std::vector<Target> selected;
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    const std::string name = spec.substr(begin, end - begin);
    bool found = false;
    for (const Target& target : supported) {
      if (strcasecmp(name.c_str(), target.name) == 0) {
        selected.push_back(target);
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (const Target& target : supported) {
        names += std::string(names.empty() ? "" : ", ") + target.name;
      }
      UsageError("--targets: \"" + name +
                 "\" is not an instruction set this CPU runs (" + names + ")");
    }
    begin = end + 1;
  }
  return selected;
}

// One configuration of the model: every layer's config and weights. The
// configs' sink_logits point into weights (Run sets them).
struct Model {
  std::string name;
  int64_t n_kv_heads = 0;
  std::vector<AttentionLayerConfig> configs;  // [layers]
  std::vector<HostWeights> weights;           // [layers]
};

// GQA's KV heads: n_heads / divisor where that divides and leaves more than
// one, else n_heads (MHA).
int64_t GqaKvHeads(int64_t n_heads, int64_t divisor) {
  return n_heads % divisor == 0 && n_heads / divisor > 1 ? n_heads / divisor
                                                         : n_heads;
}

// The configuration `name` (see the top of the file).
Model MakeModel(const Options& options, const std::string& name) {
  Model model;
  model.name = name;
  const int64_t heads = options.heads;
  model.n_kv_heads = name == "mha"      ? heads
                     : name == "mqa"    ? 1
                     : name == "gemma2" ? GqaKvHeads(heads, 2)
                                        : GqaKvHeads(heads, 4);
  // head_dim 0: d_model / n_heads (Create reports a d_model that does not
  // divide). The mask is causal and the scale 1 / sqrt(head_dim) by default.
  const int64_t head_dim = options.d_model / heads;
  for (int64_t l = 0; l < options.layers; ++l) {
    AttentionLayerConfig config;
    config.d_model = options.d_model;
    config.n_heads = heads;
    config.n_kv_heads = model.n_kv_heads;
    const bool plain = name == "mha" || name == "gqa" || name == "mqa";
    if (!plain) config.rope.rotary_dim = head_dim - head_dim % 2;
    if (name == "llama3") {
      config.rope.theta = 500000.0;
      config.rope.scaling = headway::RopeScaling::kLlama3;
      config.rope.factor = 8.0;
    }
    if (name == "qwen3") {
      config.rope.theta = 1000000.0;
      config.qk_norm = true;
    }
    // Local (windowed) layers: all of Mistral's and StreamingLLM's, every
    // other one of Gemma 2's and gpt-oss's, starting with the first.
    const bool local = name == "mistral" || name == "streaming" ||
                       ((name == "gemma2" || name == "gpt-oss") && l % 2 == 0);
    if (local) config.attention.window = options.window;
    if (name == "streaming") {
      config.attention.n_sink_tokens = std::min<int64_t>(4, options.window);
    }
    if (name == "gemma2") config.attention.softcap = 50.0f;
    model.configs.push_back(config);
    model.weights.push_back(MakeWeights(options.d_model, heads * head_dim,
                                        model.n_kv_heads * head_dim,
                                        100 * l + 17));
    AddVariantWeights(&model.weights.back(), head_dim, heads, 100 * l + 17);
  }
  return model;
}

// The stack over `rows` new tokens of sequence 0: h [rows, d] is the input and
// becomes the output; y [rows, d] is scratch.
Status StackForward(std::vector<AttentionLayer>& layers,
                    std::vector<KvCache>& caches, int64_t rows, float* h,
                    float* y) {
  const int64_t d = layers.front().config().d_model;
  const LayerSequence sequence{/*seq=*/0, /*n_tokens=*/rows};
  for (size_t l = 0; l < layers.size(); ++l) {
    const Status status = layers[l].Forward(&caches[l], &sequence, 1,
                                            MatrixView<const float>(h, rows, d),
                                            MatrixView<float>(y, rows, d));
    if (!status.ok()) return status;
    AddResidualAndNormalize(h, y, rows, d);
  }
  return Status();
}

struct RunResult {
  double prefill_tokens_per_s = 0.0;
  double decode_tokens_per_s = 0.0;
  size_t cache_bytes_per_token = 0;  // all layers
  size_t cache_bytes = 0;            // all layers' caches, allocated
  int64_t n_weights = 0;             // all layers
  std::vector<float> last;           // the last token's output [d]
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Creates the layers for the current instruction set (packing depends on its
// vector width), runs the prompt, then generates options.tokens tokens.
RunResult Run(const Options& options, const Model& model,
              const std::vector<float>& prompt) {
  const int64_t d = options.d_model, n_layers = options.layers;
  const int64_t head_dim = d / options.heads;
  const int64_t q_cols = options.heads * head_dim;
  const int64_t kv_cols = model.n_kv_heads * head_dim;
  RunResult result;
  std::vector<AttentionLayer> layers(n_layers);
  std::vector<KvCache> caches(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    AttentionLayerConfig config = model.configs[l];
    if (model.name == "gpt-oss") {
      config.attention.sink_logits = model.weights[l].sink_logits.data();
    }
    Check(AttentionLayer::Create(
              config, Views(model.weights[l], d, q_cols, kv_cols), &layers[l]),
          "AttentionLayer::Create");
    // A windowed layer's cache is a ring of window + sink tokens rows.
    Check(
        KvCache::Create(
            config.attention.window > 0
                ? layers[l].RingCacheConfig(/*n_sequences=*/1, options.kv_dtype)
                : layers[l].CacheConfig(/*n_sequences=*/1,
                                        options.prompt + options.tokens,
                                        options.kv_dtype),
            &caches[l]),
        "KvCache::Create");
    result.cache_bytes_per_token +=
        layers[l].cache_bytes_per_token(options.kv_dtype);
    result.cache_bytes += caches[l].bytes();
    result.n_weights += layers[l].n_weights();
  }

  std::vector<float> h(prompt.size()), y(prompt.size());
  // Warm-up: the first Forward of a size allocates the layer's scratch memory
  // and takes its page faults, which a server pays once at start-up.
  h = prompt;
  Check(StackForward(layers, caches, options.prompt, h.data(), y.data()),
        "Forward (warm-up)");
  for (KvCache& cache : caches) cache.ResetAll();

  h = prompt;
  auto start = std::chrono::steady_clock::now();
  Check(StackForward(layers, caches, options.prompt, h.data(), y.data()),
        "Forward (prefill)");
  result.prefill_tokens_per_s =
      static_cast<double>(options.prompt) / SecondsSince(start);

  // Decode: each step feeds the previous token's output back as the input.
  std::vector<float> x(d);
  const float* out = h.data() + (options.prompt - 1) * d;
  start = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < options.tokens; ++t) {
    NextInputs(out, /*rows=*/1, d, x.data());
    Check(StackForward(layers, caches, 1, x.data(), y.data()),
          "Forward (decode)");
    out = x.data();
  }
  if (options.tokens > 0) {
    result.decode_tokens_per_s =
        static_cast<double>(options.tokens) / SecondsSince(start);
  }
  result.last.assign(out, out + d);
  return result;
}

int Main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  const std::vector<Target> targets = SelectTargets(options.targets);

  std::vector<float> prompt = RandomUniform(
      static_cast<size_t>(options.prompt * options.d_model), 1.0f, 1);
  RmsNormalize(prompt.data(), options.prompt, options.d_model);

  tbb::task_arena arena(options.threads > 0 ? static_cast<int>(options.threads)
                                            : tbb::task_arena::automatic);
  arena.initialize();
  std::printf(
      "%lld layers, d_model %lld, %lld heads of %lld, prompt %lld tokens, "
      "%lld generated, %d threads, KV cache in %s, window %lld\n",
      static_cast<long long>(options.layers),
      static_cast<long long>(options.d_model),
      static_cast<long long>(options.heads),
      static_cast<long long>(options.d_model / options.heads),
      static_cast<long long>(options.prompt),
      static_cast<long long>(options.tokens), arena.max_concurrency(),
      KvDtypeName(options.kv_dtype), static_cast<long long>(options.window));
  std::printf(
      "max|diff|: largest difference of the last output from the first "
      "target's\n\n");
  std::printf("%-14s %-8s %14s %14s %12s %12s %12s %10s\n", "config", "target",
              "prefill tok/s", "decode tok/s", "KV B/token", "KV total",
              "weights", "max|diff|");

  for (const std::string& name : options.configs) {
    const Model model = MakeModel(options, name);
    const std::string label = name + " kv" + std::to_string(model.n_kv_heads);
    std::vector<float> reference;
    for (const Target& target : targets) {
      Check(headway::SetMaxTarget(target.name), "SetMaxTarget");
      RunResult result;
      arena.execute([&] { result = Run(options, model, prompt); });
      headway::ResetMaxTarget();

      char diff[32] = "-";
      if (reference.empty()) {
        reference = result.last;
      } else {
        float max_diff = 0.0f;
        for (size_t i = 0; i < reference.size(); ++i) {
          max_diff =
              std::fmax(max_diff, std::fabs(result.last[i] - reference[i]));
        }
        std::snprintf(diff, sizeof(diff), "%.1e", max_diff);
      }
      std::printf("%-14s %-8s %14.1f %14.1f %12zu %12s %12lld %10s\n",
                  label.c_str(), target.name, result.prefill_tokens_per_s,
                  result.decode_tokens_per_s, result.cache_bytes_per_token,
                  FormatBytes(static_cast<double>(result.cache_bytes)).c_str(),
                  static_cast<long long>(result.n_weights), diff);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace examples

int main(int argc, char** argv) { return examples::Main(argc, argv); }

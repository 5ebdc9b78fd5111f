// The host-side helpers that the example programs share: flag parsing and error
// exits, deterministic random weights and inputs, the RMS normalisation and
// the next-token nonlinearity between layers, and byte formatting.
//
// Header-only. A program that includes it defines the two hooks below, Fail
// and Usage, in namespace examples: how it reports an error and ends (one
// process, or every MPI rank), and its usage line.
#ifndef HEADWAY_EXAMPLES_EXAMPLE_SUPPORT_H_
#define HEADWAY_EXAMPLES_EXAMPLE_SUPPORT_H_

#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "headway/layer.h"
#include "headway/status.h"
#include "headway/view.h"

namespace examples {

// -----------------------------------------------------------------------------
// Hooks each program defines.

// Prints "<program>: <message>" (and a newline) on stderr and ends the program
// with exit code `code`.
[[noreturn]] void Fail(const std::string& message, int code);

// The program's usage line: "usage: <program> [--flag=N] ...".
const char* Usage();

// -----------------------------------------------------------------------------
// Errors and flags.

// Fails with `message` and the usage line, exit code 2.
[[noreturn]] inline void UsageError(const std::string& message) {
  Fail(message + "\n" + Usage(), 2);
}

// Fails with "<what>: <status>", exit code 1, unless status is ok.
inline void Check(const headway::Status& status, const char* what) {
  if (!status.ok()) Fail(std::string(what) + ": " + status.ToString(), 1);
}

// The integer value `text` of flag --<name>; a usage error unless it is a
// whole decimal number >= min.
inline int64_t ParseCount(const std::string& name, const std::string& text,
                          int64_t min) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < min) {
    UsageError("--" + name + " needs an integer >= " + std::to_string(min) +
               ", got \"" + text + "\"");
  }
  return value;
}

// A flag whose value is an integer >= min, stored in *value.
struct CountFlag {
  const char* name;
  int64_t* value;
  int64_t min;
};

// Parses the flags of argv in order, each written "--name=value" or "--name
// value": a flag of `counts` stores its value (ParseCount), any other calls
// set_other(name, value), which reports an unknown name or a bad value
// (UsageError). --help, -h, an argument that is not a flag and a flag without
// a value are usage errors.
template <typename SetOther>
void ParseFlags(int argc, char** argv, const std::vector<CountFlag>& counts,
                const SetOther& set_other) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") UsageError("help requested");
    if (arg.compare(0, 2, "--") != 0) UsageError("unexpected \"" + arg + "\"");
    std::string name = arg.substr(2), value;
    const size_t equals = name.find('=');
    if (equals != std::string::npos) {
      value = name.substr(equals + 1);
      name.resize(equals);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      UsageError("--" + name + " needs a value");
    }
    bool counted = false;
    for (const CountFlag& flag : counts) {
      if (name != flag.name) continue;
      *flag.value = ParseCount(name, value, flag.min);
      counted = true;
    }
    if (!counted) set_other(name, value);
  }
}

// -----------------------------------------------------------------------------
// Data.

// Uniform floats in [-bound, bound), the same on every platform for a seed
// (SplitMix64).
inline std::vector<float> RandomUniform(size_t n, float bound, uint64_t seed) {
  std::vector<float> data(n);
  uint64_t state = seed;
  for (float& value : data) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float unit = static_cast<float>(z >> 40) * 0x1.0p-24f;  // [0, 1)
    value = bound * (2.0f * unit - 1.0f);
  }
  return data;
}

// Scales each row of h [rows, d] to a root mean square of 1.
inline void RmsNormalize(float* h, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = h + r * d;
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += double{row[i]} * row[i];
    const float inv = static_cast<float>(
        1.0 / std::sqrt(sum / static_cast<double>(d) + 1e-6));
    for (int64_t i = 0; i < d; ++i) row[i] *= inv;
  }
}

// The block between layers: h = RmsNorm(h + y), h and y [rows, d] (a post-norm
// residual without the MLP).
inline void AddResidualAndNormalize(float* h, const float* y, int64_t rows,
                                    int64_t d) {
  for (int64_t i = 0; i < rows * d; ++i) h[i] += y[i];
  RmsNormalize(h, rows, d);
}

// The next tokens' hidden states from the stack's outputs for the previous
// ones, out and next [rows, d]: there is no vocabulary, so a fixed
// nonlinearity and an RMS normalisation keep the values bounded, as "sample a
// token and look up its embedding" would.
inline void NextInputs(const float* out, int64_t rows, int64_t d, float* next) {
  for (int64_t i = 0; i < rows * d; ++i) next[i] = std::tanh(2.0f * out[i]);
  RmsNormalize(next, rows, d);
}

// -----------------------------------------------------------------------------
// Weights.

// One layer's weights as the host holds them, float32 row-major, for a layer
// of d_model d, q_cols = n_heads * head_dim and kv_cols = n_kv_heads *
// head_dim.
struct HostWeights {
  std::vector<float> w_q, w_k, w_v, w_o;  // [d, q_cols], [d, kv_cols] x 2,
                                          // [q_cols, d]
  std::vector<float> b_q, b_k, b_v, b_o;  // [q_cols], [kv_cols] x 2, [d]
  std::vector<float> q_norm, k_norm;      // [head_dim] (QK-norm; near 1)
  std::vector<float> sink_logits;         // [n_heads] (gpt-oss's sinks)
};

// The projections: weights scaled by 1 / sqrt(fan_in), so that a projection
// of a unit-RMS input has outputs of about unit RMS, and small biases (no
// QK-norm weights or sink logits: AddVariantWeights).
inline HostWeights MakeWeights(int64_t d, int64_t q_cols, int64_t kv_cols,
                               uint64_t seed) {
  const float in_bound = std::sqrt(3.0f / static_cast<float>(d));
  const float out_bound = std::sqrt(3.0f / static_cast<float>(q_cols));
  HostWeights w;
  w.w_q = RandomUniform(d * q_cols, in_bound, seed + 1);
  w.w_k = RandomUniform(d * kv_cols, in_bound, seed + 2);
  w.w_v = RandomUniform(d * kv_cols, in_bound, seed + 3);
  w.w_o = RandomUniform(q_cols * d, out_bound, seed + 4);
  w.b_q = RandomUniform(q_cols, 0.1f, seed + 5);
  w.b_k = RandomUniform(kv_cols, 0.1f, seed + 6);
  w.b_v = RandomUniform(kv_cols, 0.1f, seed + 7);
  w.b_o = RandomUniform(d, 0.1f, seed + 8);
  return w;
}

// Adds the QK-norm weights and sink logits of a layer of n_heads heads.
inline void AddVariantWeights(HostWeights* w, int64_t head_dim, int64_t n_heads,
                              uint64_t seed) {
  w->q_norm = RandomUniform(head_dim, 0.2f, seed + 9);
  w->k_norm = RandomUniform(head_dim, 0.2f, seed + 10);
  for (float& x : w->q_norm) x += 1.0f;
  for (float& x : w->k_norm) x += 1.0f;
  w->sink_logits = RandomUniform(n_heads, 1.0f, seed + 11);
}

// The views of `w` that AttentionLayer::Create takes (the layer copies them).
inline headway::AttentionLayerWeights Views(const HostWeights& w, int64_t d,
                                            int64_t q_cols, int64_t kv_cols) {
  using headway::MatrixView;
  headway::AttentionLayerWeights views;
  views.w_q = MatrixView<const float>(w.w_q.data(), d, q_cols);
  views.w_k = MatrixView<const float>(w.w_k.data(), d, kv_cols);
  views.w_v = MatrixView<const float>(w.w_v.data(), d, kv_cols);
  views.w_o = MatrixView<const float>(w.w_o.data(), q_cols, d);
  views.b_q = w.b_q.data();
  views.b_k = w.b_k.data();
  views.b_v = w.b_v.data();
  views.b_o = w.b_o.data();
  views.q_norm = w.q_norm.data();
  views.k_norm = w.k_norm.data();
  return views;
}

// -----------------------------------------------------------------------------
// Output.

// "512 B", "1.5 KiB", ... up to GiB.
inline std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 3) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes,
                units[unit]);
  return text;
}

}  // namespace examples

#endif  // HEADWAY_EXAMPLES_EXAMPLE_SUPPORT_H_

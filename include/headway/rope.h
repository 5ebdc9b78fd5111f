// RoPE: rotary position embeddings (Su et al., RoFormer, 2021), applied in
// place to the heads of query or key rows at given absolute positions.
#ifndef HEADWAY_ROPE_H_
#define HEADWAY_ROPE_H_

#include <cstdint>

#include "headway/export.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

// Which elements of a head form the rotated pairs. Pair i (i < rotary_dim / 2)
// is rotated by the angle pos * freq_i.
enum class RopeLayout : int {
  // (x[i], x[i + rotary_dim / 2]): GPT-NeoX, Hugging Face transformers.
  kHalves = 0,
  // (x[2i], x[2i + 1]): GPT-J, Meta's Llama reference code.
  kInterleaved = 1,
};

// How the frequencies are stretched for contexts past the trained one.
enum class RopeScaling : int {
  kNone = 0,
  kLinear = 1,  // freq_i / factor (position interpolation)
  // Llama 3.1: wavelengths 2 pi / freq_i shorter than original_max_position /
  // high_freq_factor keep freq_i, longer than original_max_position /
  // low_freq_factor get freq_i / factor, in between a linear blend in
  // original_max_position / wavelength (Hugging Face's "llama3" rope_type).
  kLlama3 = 2,
};

struct RopeConfig {
  // Rotated elements of each head, the first rotary_dim of head_dim (the rest
  // pass through): even, 2 .. head_dim. 0 means no RoPE (a layer's default;
  // ApplyRope rejects it).
  int64_t rotary_dim = 0;
  RopeLayout layout = RopeLayout::kHalves;
  // freq_i = theta^(-2 i / rotary_dim), then scaled; finite, > 0.
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;                   // kLinear, kLlama3: finite, > 0
  double low_freq_factor = 1.0;          // kLlama3: finite, > 0
  double high_freq_factor = 4.0;         // kLlama3: finite, > low_freq_factor
  int64_t original_max_position = 8192;  // kLlama3: >= 1
};

// Rotates every head of every row of x in place:
//   x: [n_tokens, n_heads * head_dim], any stride >= cols; head h in columns
//      [h * head_dim, (h + 1) * head_dim); cols a multiple of head_dim.
//   positions: [n_tokens], the absolute position of each row, >= 0.
// For pair (a, b) of a head of row t, with angle = positions[t] * freq_i:
//   a' = a cos(angle) - b sin(angle),  b' = b cos(angle) + a sin(angle).
// Angles are taken in float64 and reduced modulo 2 pi before cos and sin,
// which are rounded to float once: float32 pos * freq would be off by up to
// pos * 2^-24 radians (0.06 at position 2^20). Error per output element,
// u = 2^-24, for angles pos * freq_i < 2^31:
//   |x' - exact| <= (4 u + 2^-52 pos freq_i) (|a| + |b|),
// the second term the float64 angle's rounding (under 0.1 u below position
// 2^24 with freq_i <= 1). Rows run in parallel.
// Errors (kInvalidArgument, nothing written): head_dim < 1, a bad config
// (rotary_dim odd, < 2 or > head_dim, theta, factor or the kLlama3 fields out
// of range, an unknown layout or scaling), a bad view of x or cols not a
// multiple of head_dim, null positions or a negative position (the message
// names its index); kResourceExhausted: a view whose byte size overflows.
HEADWAY_API Status ApplyRope(const RopeConfig& rope, int64_t head_dim,
                             const int64_t* positions, MatrixView<float> x);

}  // namespace headway

#endif  // HEADWAY_ROPE_H_

// RoPE's non-SIMD rules, shared by ApplyRope (rope.cc) and the layer
// (layer.cc): which configs are valid and the frequencies a config gives.
#ifndef HEADWAY_LIB_ROPE_ROPE_CALL_H_
#define HEADWAY_LIB_ROPE_ROPE_CALL_H_

#include <cstdint>

#include "headway/rope.h"
#include "headway/status.h"

namespace headway {
namespace internal {

// The config is valid for heads of head_dim (>= 1) elements: rotary_dim even
// in [2, head_dim], a known layout and scaling, theta and the scaling's fields
// in range. name prefixes the fields in messages ("rope", "config.rope").
Status CheckRope(const char* fn, const char* name, const RopeConfig& rope,
                 int64_t head_dim);

// freq[i] for i < rope.rotary_dim / 2 (rope.h), of a checked config, in
// float64.
void RopeFrequencies(const RopeConfig& rope, double* freq);

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_ROPE_ROPE_CALL_H_

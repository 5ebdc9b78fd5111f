// RMSNorm's argument rules, shared by RmsNormHeads (norm.cc) and the layer's
// QK-norm (layer.cc).
#ifndef HEADWAY_LIB_NORM_NORM_CALL_H_
#define HEADWAY_LIB_NORM_NORM_CALL_H_

#include <cstdint>

#include "headway/status.h"

namespace headway {
namespace internal {

// weight [n] is not null and finite (the message names the first bad index).
Status CheckNormWeight(const char* fn, const char* name, const float* weight,
                       int64_t n);

// eps is finite and >= 0.
Status CheckNormEps(const char* fn, const char* name, float eps);

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_NORM_NORM_CALL_H_

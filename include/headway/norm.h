// RMSNorm per head (Zhang and Sennrich, 2019), as QK-norm applies it to the
// query and key heads (Qwen3, Gemma 3, OLMo 2) before RoPE.
#ifndef HEADWAY_NORM_H_
#define HEADWAY_NORM_H_

#include <cstdint>

#include "headway/export.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

// Normalises every head_dim-long segment (head) of every row of x in place:
//   x_i' = x_i / sqrt(mean_j x_j^2 + eps) * weight[i]
//   x: [rows, n_heads * head_dim], any stride >= cols, cols a multiple of
//      head_dim; weight: [head_dim], shared by the heads.
// Sums are taken in float64, so no row of finite floats overflows or
// underflows (|x| up to FLT_MAX, down to the denormals); each output is
// rounded once: |x' - exact| <= 2^-24 |exact| (1 + 2^-20). A head holding a
// NaN or an inf becomes all NaN; an all-zero head with eps == 0 stays zero.
// Rows run in parallel.
// Errors (kInvalidArgument, nothing written): head_dim < 1, a bad view of x
// or cols not a multiple of head_dim, null weight or a weight that is not
// finite (the message names its index), eps < 0 or not finite, weight
// overlapping x; kResourceExhausted: a view whose byte size overflows.
HEADWAY_API Status RmsNormHeads(MatrixView<float> x, int64_t head_dim,
                                const float* weight, float eps);

}  // namespace headway

#endif  // HEADWAY_NORM_H_

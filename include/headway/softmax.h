// Softmax: numerically stable softmax over the rows of a float32 matrix.
#ifndef HEADWAY_SOFTMAX_H_
#define HEADWAY_SOFTMAX_H_

#include "headway/export.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

// y[r, c] = exp(z[r, c] - m_r) / sum_j exp(z[r, j] - m_r), where z = scale * x
// and m_r is the largest z of row r, so no exp overflows whatever the magnitude
// of the logits.
//   x, y: [rows, cols], any strides >= cols. y may be x itself (same data and
//   stride: in place);
//         any other overlap is an error.
//   A row whose z are all -inf gives zeros; -inf entries give 0. A row with a
//   NaN or a +inf z is all NaN (exp(inf - inf) is undefined).
// Error bound, per element of a row of n, with u = 2^-24:
//   |y - exact| <= (8 + |z - m| + ln n + I * (|z| + |m| + ln n)) * u * exact
//                  + 2^-149
// where I = 0 when scale is a power of two (scale * x is exact) and 1 when it
// is not, and 2^-149 is the spacing of the denormals (outputs below FLT_MIN).
// For logits in [-4, 4] and n <= 4096, 1.5e-6 with an exact scale. Large
// logits under an inexact scale lose |z| u and |m| u to the rounding of
// scale * x: the relative error is bounded, not small, once |m| nears 2^24.
// Cost: one exp per element; rows run in parallel; a row is read twice from
// memory when it does not fit in the caches.
// Errors (kInvalidArgument, nothing written): null data, rows or cols < 1, a
// stride < cols, y's shape != x's, y partly overlapping x, a scale that is not
// finite; kResourceExhausted: a view whose byte size overflows.
HEADWAY_API Status Softmax(MatrixView<const float> x, MatrixView<float> y,
                           float scale = 1.0f);

// In place: x = softmax(scale * x) row by row. Same contract as above.
HEADWAY_API Status SoftmaxInPlace(MatrixView<float> x, float scale = 1.0f);

}  // namespace headway

#endif  // HEADWAY_SOFTMAX_H_

#include "test/support/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace headway {
namespace test {
namespace ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The gemm of both public Matmul overloads; T is float or double.
template <typename T>
void MatmulT(int64_t m, int64_t n, int64_t k, double alpha, const T* a,
             int64_t lda, bool trans_a, const T* b, int64_t ldb, bool trans_b,
             double beta, double* c, double* abs_c) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      double abs_sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double a_ip = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double b_pj = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += a_ip * b_pj;
        abs_sum += std::fabs(a_ip) * std::fabs(b_pj);
      }
      double& c_ij = c[i * n + j];
      const double old = beta != 0.0 ? c_ij : 0.0;
      c_ij = alpha * sum + (beta != 0.0 ? beta * old : 0.0);
      if (abs_c != nullptr) {
        abs_c[i * n + j] =
            std::fabs(alpha) * abs_sum +
            (beta != 0.0 ? std::fabs(beta) * std::fabs(old) : 0.0);
      }
    }
  }
}

// z[0, n) = softmax(z) in place, with exp(sink) in the denominator (a virtual
// key of that score and zero value; -inf: none). All -inf gives zeros; a NaN
// or +inf gives all NaN. Returns false when every value is -inf (or n == 0): z
// is then zeros.
bool SoftmaxRowInPlace(double* z, int64_t n, double sink = -kInf) {
  double max = -kInf;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(z[i]) || z[i] == kInf) {
      for (int64_t j = 0; j < n; ++j) z[j] = kNaN;
      return true;
    }
    if (z[i] > max) max = z[i];
  }
  if (max == -kInf) {
    for (int64_t j = 0; j < n; ++j) z[j] = 0.0;
    return false;
  }
  double sum = std::exp(sink - max);
  for (int64_t i = 0; i < n; ++i) {
    z[i] = std::exp(z[i] - max);  // exp(-inf) = 0
    sum += z[i];
  }
  for (int64_t i = 0; i < n; ++i)
    z[i] /= sum;  // sum >= 1: the max term is exp(0)
  return true;
}

// Adds b [cols] to every row of y [rows, cols] dense; b may be null (no bias).
void AddBias(const float* b, int64_t rows, int64_t cols, double* y) {
  if (b == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] += b[c];
  }
}

}  // namespace

void Matmul(int64_t m, int64_t n, int64_t k, double alpha, const float* a,
            int64_t lda, bool trans_a, const float* b, int64_t ldb,
            bool trans_b, double beta, double* c, double* abs_c) {
  MatmulT(m, n, k, alpha, a, lda, trans_a, b, ldb, trans_b, beta, c, abs_c);
}

void Matmul(int64_t m, int64_t n, int64_t k, double alpha, const double* a,
            int64_t lda, bool trans_a, const double* b, int64_t ldb,
            bool trans_b, double beta, double* c, double* abs_c) {
  MatmulT(m, n, k, alpha, a, lda, trans_a, b, ldb, trans_b, beta, c, abs_c);
}

std::vector<double> Softmax(const float* x, int64_t stride, int64_t rows,
                            int64_t cols, double scale) {
  std::vector<double> y(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    double* y_row = y.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) y_row[c] = scale * x[r * stride + c];
    SoftmaxRowInPlace(y_row, cols);
  }
  return y;
}

std::vector<double> ToDouble(const float* x, int64_t rows, int64_t cols,
                             int64_t stride) {
  std::vector<double> y(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * stride + c];
  }
  return y;
}

float RoundToBFloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // ties to the even upper half
  bits &= 0xFFFF0000u;
  std::memcpy(&x, &bits, sizeof(bits));
  return x;
}

std::vector<float> Int8ColumnScales(const float* w, int64_t rows, int64_t cols,
                                    int64_t stride) {
  std::vector<float> scales(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    float max_abs = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      max_abs = std::max(max_abs, std::fabs(w[r * stride + c]));
    }
    scales[c] = max_abs < 127.0f * std::numeric_limits<float>::min()
                    ? 0.0f
                    : max_abs / 127.0f;
  }
  return scales;
}

std::vector<double> StoredWeights(const float* w, int64_t rows, int64_t cols,
                                  int64_t stride, WeightDtype dtype) {
  std::vector<double> stored = ToDouble(w, rows, cols, stride);
  if (dtype == WeightDtype::kBFloat16) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        stored[r * cols + c] = RoundToBFloat16(w[r * stride + c]);
      }
    }
  }
  if (dtype != WeightDtype::kInt8) return stored;
  const std::vector<float> scales = Int8ColumnScales(w, rows, cols, stride);
  for (int64_t c = 0; c < cols; ++c) {
    const float scale = scales[c];
    for (int64_t r = 0; r < rows; ++r) {
      const float q =
          scale == 0.0f ? 0.0f : std::nearbyint(w[r * stride + c] / scale);
      stored[r * cols + c] =
          static_cast<double>(scale) * std::clamp(q, -127.0f, 127.0f);
    }
  }
  return stored;
}

VisibleSpan VisibleKeys(const Variants& variants, int64_t p, int64_t end) {
  end = std::max<int64_t>(0, end);
  if (variants.window <= 0) return {0, 0, end};
  const int64_t first =
      std::min(end, std::max<int64_t>(0, p - variants.window + 1));
  return {std::min(first, variants.n_sink_tokens), first, end};
}

std::vector<double> AttentionCore(const double* q, int64_t q_stride,
                                  int64_t n_q, const double* k,
                                  int64_t k_stride, const double* v,
                                  int64_t v_stride, int64_t n_kv,
                                  int64_t n_heads, int64_t n_kv_heads,
                                  int64_t head_dim, int64_t q_pos0, bool causal,
                                  const float* mask, int64_t mask_stride,
                                  double scale, const Variants& variants) {
  const int64_t group_size = n_heads / n_kv_heads;  // query heads per KV head
  const int64_t out_cols = n_heads * head_dim;
  std::vector<double> out(static_cast<size_t>(n_q * out_cols), 0.0);
  std::vector<double> weights(static_cast<size_t>(n_kv));  // [n_kv]
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t g = h / group_size;
    for (int64_t t = 0; t < n_q; ++t) {
      // Keys 0 .. n_keys-1 take part; causal excludes positions after the
      // query's.
      const int64_t p = q_pos0 + t;
      int64_t n_keys = n_kv;
      if (causal) n_keys = std::max<int64_t>(0, std::min(n_kv, p + 1));
      // The window hides keys at positions <= p - window, but for the sinks.
      const VisibleSpan visible = VisibleKeys(variants, p, n_keys);
      const double* q_row = q + t * q_stride + h * head_dim;
      for (int64_t s = 0; s < n_keys; ++s) {
        if (!visible.Contains(s)) {
          weights[s] = -kInf;
          continue;
        }
        const double* k_row = k + s * k_stride + g * head_dim;
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) dot += q_row[d] * k_row[d];
        double score = scale * dot;
        if (variants.softcap != 0.0) {
          score = variants.softcap * std::tanh(score / variants.softcap);
        }
        if (variants.alibi_slopes != nullptr) {
          score += static_cast<double>(variants.alibi_slopes[h]) *
                   static_cast<double>(s - p);
        }
        // A -inf mask entry hides the key, whatever its score (NaN included).
        if (mask != nullptr) {
          const double m = mask[t * mask_stride + s];
          score = m == -INFINITY ? m : score + m;
        }
        weights[s] = score;
      }
      const double sink = variants.sink_logits != nullptr
                              ? static_cast<double>(variants.sink_logits[h])
                              : -kInf;
      // A row with no key left stays zeros.
      if (!SoftmaxRowInPlace(weights.data(), n_keys, sink)) {
        continue;
      }
      double* out_row = out.data() + t * out_cols + h * head_dim;
      for (int64_t s = 0; s < n_keys; ++s) {
        // A hidden key adds nothing, not even 0 * NaN.
        if (!visible.Contains(s)) continue;
        if (mask != nullptr && mask[t * mask_stride + s] == -INFINITY) continue;
        const double* v_row = v + s * v_stride + g * head_dim;
        for (int64_t d = 0; d < head_dim; ++d)
          out_row[d] += weights[s] * v_row[d];
      }
    }
  }
  return out;
}

std::vector<double> MultiHeadAttention(const AttentionShape& shape,
                                       const LayerWeights& w, const float* x,
                                       int64_t seq, bool causal,
                                       const float* mask, int64_t mask_stride,
                                       double scale) {
  const int64_t d_model = shape.d_model;
  const int64_t q_cols = shape.n_heads * shape.head_dim;
  const int64_t kv_cols = shape.n_kv_heads * shape.head_dim;

  // 1. Projections: q [seq, q_cols], k and v [seq, kv_cols].
  std::vector<double> q(static_cast<size_t>(seq * q_cols));
  std::vector<double> k(static_cast<size_t>(seq * kv_cols));
  std::vector<double> v(static_cast<size_t>(seq * kv_cols));
  Matmul(seq, q_cols, d_model, 1.0, x, d_model, false, w.w_q, q_cols, false,
         0.0, q.data());
  Matmul(seq, kv_cols, d_model, 1.0, x, d_model, false, w.w_k, kv_cols, false,
         0.0, k.data());
  Matmul(seq, kv_cols, d_model, 1.0, x, d_model, false, w.w_v, kv_cols, false,
         0.0, v.data());
  AddBias(w.b_q, seq, q_cols, q.data());
  AddBias(w.b_k, seq, kv_cols, k.data());
  AddBias(w.b_v, seq, kv_cols, v.data());

  // 2-4. Per-head attention, heads already side by side: combined [seq,
  // q_cols].
  const std::vector<double> combined =
      AttentionCore(q.data(), q_cols, seq, k.data(), kv_cols, v.data(), kv_cols,
                    seq, shape.n_heads, shape.n_kv_heads, shape.head_dim,
                    /*q_pos0=*/0, causal, mask, mask_stride, scale);

  // 5. Output projection: [seq, d_model].
  std::vector<double> out(static_cast<size_t>(seq * d_model));
  Matmul(seq, d_model, q_cols, 1.0, combined.data(), q_cols, false,
         ToDouble(w.w_o, q_cols, d_model, d_model).data(), d_model, false, 0.0,
         out.data());
  AddBias(w.b_o, seq, d_model, out.data());
  return out;
}

std::vector<long double> RopeFrequencies(const RopeConfig& rope) {
  const int64_t half = rope.rotary_dim / 2;
  std::vector<long double> freq(static_cast<size_t>(half));
  const long double pi = 3.14159265358979323846264338327950288L;
  for (int64_t i = 0; i < half; ++i) {
    long double f = powl(static_cast<long double>(rope.theta),
                         -2.0L * i / static_cast<long double>(rope.rotary_dim));
    if (rope.scaling == RopeScaling::kLinear) f /= rope.factor;
    if (rope.scaling == RopeScaling::kLlama3) {
      const long double old_len = rope.original_max_position;
      const long double wavelength = 2 * pi / f;
      if (wavelength > old_len / rope.low_freq_factor) {
        f /= rope.factor;
      } else if (wavelength >= old_len / rope.high_freq_factor) {
        const long double smooth =
            (old_len / wavelength - rope.low_freq_factor) /
            (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
    }
    freq[static_cast<size_t>(i)] = f;
  }
  return freq;
}

void RopePair(RopeLayout layout, int64_t half, int64_t i, int64_t* a,
              int64_t* b) {
  *a = layout == RopeLayout::kHalves ? i : 2 * i;
  *b = layout == RopeLayout::kHalves ? i + half : 2 * i + 1;
}

}  // namespace ref
}  // namespace test
}  // namespace headway

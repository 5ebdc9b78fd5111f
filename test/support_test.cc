// Tests of the shared test support (test/support/): the float64 references
// against hand-computed values and a transcription of the seed's numpy code,
// the random data, the guard pages and the lane count of each target.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "headway/targets.h"
#include "hwy/targets.h"
#include "test/support/guard_page.h"
#include "test/support/lanes.h"
#include "test/support/random.h"
#include "test/support/reference.h"

namespace headway {
namespace test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNaNF = std::numeric_limits<float>::quiet_NaN();

void ExpectAllNear(const std::vector<double>& expected,
                   const std::vector<double>& actual, double tolerance) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(expected[i], actual[i], tolerance) << "at " << i;
  }
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// --------------------------------------------------------------------------
// Matmul

TEST(RefMatmulTest, HandComputed) {
  const float a[] = {1, 2, 3,   //
                     4, 5, 6};  // [2, 3]
  const float b[] = {7,  8,     //
                     9,  10,    //
                     11, 12};   // [3, 2]
  std::vector<double> c(4);
  ref::Matmul(2, 2, 3, 1.0, a, 3, false, b, 2, false, 0.0, c.data());
  EXPECT_EQ(c, (std::vector<double>{58, 64, 139, 154}));
}

TEST(RefMatmulTest, TransposesAgree) {
  constexpr int64_t m = 3, n = 5, k = 4;
  const std::vector<float> a = RandomVector(m * k, 1);  // [m, k]
  const std::vector<float> b = RandomVector(k * n, 2);  // [k, n]
  std::vector<float> a_t(k * m), b_t(n * k);            // [k, m], [n, k]
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) a_t[p * m + i] = a[i * k + p];
  }
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = 0; j < n; ++j) b_t[j * k + p] = b[p * n + j];
  }
  std::vector<double> expected(m * n);
  ref::Matmul(m, n, k, 1.0, a.data(), k, false, b.data(), n, false, 0.0,
              expected.data());
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      std::vector<double> c(m * n);
      ref::Matmul(m, n, k, 1.0, trans_a ? a_t.data() : a.data(),
                  trans_a ? m : k, trans_a, trans_b ? b_t.data() : b.data(),
                  trans_b ? k : n, trans_b, 0.0, c.data());
      EXPECT_EQ(expected, c) << "trans_a " << trans_a << " trans_b " << trans_b;
    }
  }
}

TEST(RefMatmulTest, AlphaBetaAndMagnitude) {
  const float a[] = {1, -2};  // [1, 2]
  const float b[] = {3, 4};   // [2, 1]
  std::vector<double> c = {-4};
  std::vector<double> abs_c(1);
  // alpha * (3 - 8) + beta * -4 = 10 - 2; |alpha| (3 + 8) + |beta| 4 = 22 + 2.
  ref::Matmul(1, 1, 2, -2.0, a, 2, false, b, 1, false, 0.5, c.data(),
              abs_c.data());
  EXPECT_EQ(c[0], 8.0);
  EXPECT_EQ(abs_c[0], 24.0);
}

TEST(RefMatmulTest, BetaZeroIgnoresOldC) {
  const float a[] = {1, 2};  // [1, 2]
  const float b[] = {3, 4};  // [2, 1]
  std::vector<double> c = {std::nan("")};
  std::vector<double> abs_c = {std::nan("")};
  ref::Matmul(1, 1, 2, 1.0, a, 2, false, b, 1, false, 0.0, c.data(),
              abs_c.data());
  EXPECT_EQ(c[0], 11.0);
  EXPECT_EQ(abs_c[0], 11.0);
}

TEST(RefMatmulTest, StridesSkipPadding) {
  constexpr int64_t m = 4, n = 3, k = 5, lda = 8, ldb = 7;
  std::vector<float> a((m - 1) * lda + k), b((k - 1) * ldb + n);
  FillRandomMatrix(a.data(), m, k, lda, 3);
  FillRandomMatrix(b.data(), k, n, ldb, 4);
  std::vector<double> strided(m * n), dense(m * n);
  ref::Matmul(m, n, k, 1.0, a.data(), lda, false, b.data(), ldb, false, 0.0,
              strided.data());
  const std::vector<float> a_dense = RandomVector(m * k, 3);
  const std::vector<float> b_dense = RandomVector(k * n, 4);
  ref::Matmul(m, n, k, 1.0, a_dense.data(), k, false, b_dense.data(), n, false,
              0.0, dense.data());
  EXPECT_EQ(dense, strided);
}

TEST(RefMatmulTest, DoubleOverloadMatchesFloat) {
  constexpr int64_t m = 2, n = 3, k = 4;
  const std::vector<float> a = RandomVector(m * k, 5);
  const std::vector<float> b = RandomVector(k * n, 6);
  const std::vector<double> a_d = ref::ToDouble(a.data(), m, k, k);
  const std::vector<double> b_d = ref::ToDouble(b.data(), k, n, n);
  std::vector<double> c(m * n, 1.0), c_d(m * n, 1.0);
  ref::Matmul(m, n, k, 0.5, a.data(), k, false, b.data(), n, false, 2.0,
              c.data());
  ref::Matmul(m, n, k, 0.5, a_d.data(), k, false, b_d.data(), n, false, 2.0,
              c_d.data());
  EXPECT_EQ(c, c_d);
}

// --------------------------------------------------------------------------
// Stored weights

TEST(RefStoredWeightsTest, BFloat16RoundsToNearestEven) {
  const float one_ulp = std::ldexp(1.0f, -7);                 // bf16's ulp at 1
  EXPECT_EQ(ref::RoundToBFloat16(1.0f + one_ulp / 2), 1.0f);  // tie: even
  EXPECT_EQ(ref::RoundToBFloat16(1.0f + 3 * one_ulp / 2), 1.0f + 2 * one_ulp);
  EXPECT_EQ(ref::RoundToBFloat16(1.0f + one_ulp / 2 + std::ldexp(1.0f, -20)),
            1.0f + one_ulp);
  EXPECT_EQ(ref::RoundToBFloat16(-1.0f - one_ulp / 4), -1.0f);
  EXPECT_EQ(ref::RoundToBFloat16(1.5f), 1.5f);
}

// op(B) [3, 4] with row stride 5 (the padding is NaN, never read): float32 as
// is, bf16 rounded, int8 with the columns' scales 1, 0 (zeros), 0 (max below
// 127 FLT_MIN) and 2, and halves rounded to even (62.5 to 62).
TEST(RefStoredWeightsTest, HandComputed) {
  const float tiny = 1e-37f;
  const float tie = 1.0f + std::ldexp(1.0f, -8);
  const std::vector<float> w = {127.0f, 0.0f, tiny,  -254.0f, kNaNF,
                                -63.5f, 0.0f, -tiny, 3.0f,    kNaNF,
                                62.5f,  0.0f, 0.0f,  tie,     kNaNF};
  const std::vector<double> as_float =
      ref::StoredWeights(w.data(), 3, 4, 5, WeightDtype::kFloat32);
  const std::vector<double> want_float = {127,   0, tiny, -254, -63.5, 0,
                                          -tiny, 3, 62.5, 0,    0,     tie};
  EXPECT_EQ(as_float, want_float);
  const std::vector<double> bf16 =
      ref::StoredWeights(w.data(), 3, 4, 5, WeightDtype::kBFloat16);
  EXPECT_EQ(bf16[11], 1.0);
  EXPECT_EQ(bf16[2], ref::RoundToBFloat16(tiny));
  const std::vector<double> int8 =
      ref::StoredWeights(w.data(), 3, 4, 5, WeightDtype::kInt8);
  const std::vector<double> want_int8 = {127, 0, 0,  -254, -64, 0,
                                         0,   4, 62, 0,    0,   2};
  EXPECT_EQ(int8, want_int8);
  const std::vector<float> want_scales = {1, 0, 0, 2};
  EXPECT_EQ(ref::Int8ColumnScales(w.data(), 3, 4, 5), want_scales);
}

// --------------------------------------------------------------------------
// Softmax

TEST(RefSoftmaxTest, HandComputed) {
  // exp of {0, ln 2, ln 3} is {1, 2, 3}: the weights are {1, 2, 3} / 6.
  const float x[] = {0.0f, static_cast<float>(std::log(2.0) / 2),
                     static_cast<float>(std::log(3.0) / 2)};
  const std::vector<double> y = ref::Softmax(x, 3, 1, 3, 2.0);
  ExpectAllNear({1.0 / 6, 2.0 / 6, 3.0 / 6}, y, 1e-7);  // x rounds to float
}

TEST(RefSoftmaxTest, RowsSumToOne) {
  constexpr int64_t rows = 5, cols = 37, stride = 40;
  std::vector<float> x((rows - 1) * stride + cols);
  FillRandomMatrix(x.data(), rows, cols, stride, 7, -20.0f, 20.0f);
  const std::vector<double> y = ref::Softmax(x.data(), stride, rows, cols, 0.7);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_GT(y[r * cols + c], 0.0);
      sum += y[r * cols + c];
    }
    EXPECT_NEAR(sum, 1.0, 1e-14) << "row " << r;
  }
}

TEST(RefSoftmaxTest, LargeLogitsDoNotOverflow) {
  const float x[] = {1e30f, 1e30f, -1e30f};
  ExpectAllNear({0.5, 0.5, 0.0}, ref::Softmax(x, 3, 1, 3, 1.0), 0.0);
}

TEST(RefSoftmaxTest, InfinitiesAndNaN) {
  const float x[] = {-kInfF, -kInfF, -kInfF,  // all -inf: zeros
                     -kInfF, 0.0f,   0.0f,    // one -inf: 0 there
                     1.0f,   kNaNF,  2.0f,    // NaN: all NaN
                     1.0f,   kInfF,  2.0f};   // +inf: all NaN
  const std::vector<double> y = ref::Softmax(x, 3, 4, 3, 1.0);
  ExpectAllNear({0, 0, 0, 0, 0.5, 0.5}, {y.begin(), y.begin() + 6}, 0.0);
  for (int i = 6; i < 12; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
  // A negative scale turns -inf into +inf.
  const float neg[] = {-kInfF, 0.0f};
  const std::vector<double> y_neg = ref::Softmax(neg, 2, 1, 2, -1.0);
  EXPECT_TRUE(std::isnan(y_neg[0]) && std::isnan(y_neg[1]));
}

// --------------------------------------------------------------------------
// AttentionCore

TEST(RefAttentionCoreTest, HandComputed) {
  // Scores {0, ln 3}: weights {1/4, 3/4}; values {1, 5}: 1/4 + 15/4 = 4.
  const double q[] = {1.0};                 // [1, 1]
  const double k[] = {0.0, std::log(3.0)};  // [2, 1]
  const double v[] = {1.0, 5.0};            // [2, 1]
  const std::vector<double> out = ref::AttentionCore(
      q, 1, 1, k, 1, v, 1, 2, 1, 1, 1, 0, false, nullptr, 0, 1.0);
  ExpectAllNear({4.0}, out, 1e-15);
}

TEST(RefAttentionCoreTest, MaskIsAdditive) {
  // Equal scores, mask {0, ln 2}: weights {1/3, 2/3}.
  const double q[] = {0.0};
  const double k[] = {1.0, 2.0};
  const double v[] = {3.0, 6.0};
  const float mask[] = {0.0f, static_cast<float>(std::log(2.0))};
  const std::vector<double> out = ref::AttentionCore(
      q, 1, 1, k, 1, v, 1, 2, 1, 1, 1, 0, false, mask, 2, 1.0);
  ExpectAllNear({5.0}, out, 1e-7);  // ln 2 rounds to float
}

// Grouped K/V heads give the same result as MHA whose K/V heads are the groups'
// heads repeated.
TEST(RefAttentionCoreTest, GroupedEqualsRepeatedHeads) {
  constexpr int64_t n_heads = 6, head_dim = 5, n_q = 3, n_kv = 7, q_pos0 = 4;
  for (int64_t n_kv_heads : {1, 2, 3}) {
    const int64_t group_size = n_heads / n_kv_heads;
    const int64_t q_cols = n_heads * head_dim, kv_cols = n_kv_heads * head_dim;
    const std::vector<float> q = RandomVector(n_q * q_cols, 10);
    const std::vector<float> k = RandomVector(n_kv * kv_cols, 11);
    const std::vector<float> v = RandomVector(n_kv * kv_cols, 12);
    std::vector<float> mask = RandomVector(n_q * n_kv, 13);
    mask[1] = -kInfF;
    // [n_kv, q_cols]: head h holds KV head h / group_size.
    std::vector<float> k_rep(n_kv * q_cols), v_rep(n_kv * q_cols);
    for (int64_t s = 0; s < n_kv; ++s) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t d = 0; d < head_dim; ++d) {
          const int64_t from = s * kv_cols + (h / group_size) * head_dim + d;
          k_rep[s * q_cols + h * head_dim + d] = k[from];
          v_rep[s * q_cols + h * head_dim + d] = v[from];
        }
      }
    }
    const auto q_d = ref::ToDouble(q.data(), n_q, q_cols, q_cols);
    const auto k_d = ref::ToDouble(k.data(), n_kv, kv_cols, kv_cols);
    const auto v_d = ref::ToDouble(v.data(), n_kv, kv_cols, kv_cols);
    const auto k_rep_d = ref::ToDouble(k_rep.data(), n_kv, q_cols, q_cols);
    const auto v_rep_d = ref::ToDouble(v_rep.data(), n_kv, q_cols, q_cols);
    for (bool causal : {false, true}) {
      const std::vector<double> grouped =
          ref::AttentionCore(q_d.data(), q_cols, n_q, k_d.data(), kv_cols,
                             v_d.data(), kv_cols, n_kv, n_heads, n_kv_heads,
                             head_dim, q_pos0, causal, mask.data(), n_kv, 0.3);
      const std::vector<double> repeated =
          ref::AttentionCore(q_d.data(), q_cols, n_q, k_rep_d.data(), q_cols,
                             v_rep_d.data(), q_cols, n_kv, n_heads, n_heads,
                             head_dim, q_pos0, causal, mask.data(), n_kv, 0.3);
      EXPECT_EQ(grouped, repeated)
          << "n_kv_heads " << n_kv_heads << " causal " << causal;
    }
  }
}

// With all scores equal and v[s] = s, the output is the mean position of the
// keys a query sees.
TEST(RefAttentionCoreTest, CausalWithPositions) {
  constexpr int64_t n_kv = 10, head_dim = 2;
  std::vector<double> k(n_kv * head_dim), v(n_kv * head_dim);
  for (int64_t s = 0; s < n_kv; ++s) {
    k[s * head_dim] = k[s * head_dim + 1] = 0.25 * s;
    v[s * head_dim] = v[s * head_dim + 1] = static_cast<double>(s);
  }
  const std::vector<double> q_zero(3 * head_dim, 0.0);  // [3, head_dim]
  // Decode: one row at position p sees keys 0 .. p, whose mean is p / 2.
  for (int64_t p = 0; p < n_kv; ++p) {
    const std::vector<double> out = ref::AttentionCore(
        q_zero.data(), head_dim, 1, k.data(), head_dim, v.data(), head_dim,
        n_kv, 1, 1, head_dim, p, true, nullptr, 0, 1.0);
    ExpectAllNear({p / 2.0, p / 2.0}, out, 1e-14);
  }
  // A chunk of 3 rows at positions 4, 5, 6; keys after a row's position are
  // excluded even where the mask holds NaN.
  std::vector<float> mask(3 * n_kv, 0.0f);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t s = 4 + t + 1; s < n_kv; ++s) mask[t * n_kv + s] = kNaNF;
  }
  const std::vector<double> chunk = ref::AttentionCore(
      q_zero.data(), head_dim, 3, k.data(), head_dim, v.data(), head_dim, n_kv,
      1, 1, head_dim, 4, true, mask.data(), n_kv, 1.0);
  ExpectAllNear({2.0, 2.0, 2.5, 2.5, 3.0, 3.0}, chunk, 1e-14);
  // Without causal every row sees all 10 keys.
  const std::vector<double> full = ref::AttentionCore(
      q_zero.data(), head_dim, 3, k.data(), head_dim, v.data(), head_dim, n_kv,
      1, 1, head_dim, 4, false, nullptr, 0, 1.0);
  ExpectAllNear(std::vector<double>(6, 4.5), full, 1e-14);
}

TEST(RefAttentionCoreTest, FullyMaskedRowsAreZeros) {
  constexpr int64_t n_q = 3, n_kv = 4, n_heads = 2, head_dim = 3;
  const auto q =
      ref::ToDouble(RandomVector(n_q * n_heads * head_dim, 20).data(), n_q,
                    n_heads * head_dim, n_heads * head_dim);
  const auto k = ref::ToDouble(RandomVector(n_kv * head_dim, 21).data(), n_kv,
                               head_dim, head_dim);
  const auto v = ref::ToDouble(RandomVector(n_kv * head_dim, 22).data(), n_kv,
                               head_dim, head_dim);
  // Causal from q_pos0 = 0: row t sees keys 0 .. t. Row 0: all -inf. Row 1:
  // -inf on keys 0 and 1, its only keys (2 and 3 are finite but causally
  // excluded). Row 2: key 2 is the only one left, so its weight is exactly 1.
  std::vector<float> mask(n_q * n_kv, 0.0f);
  for (int64_t s = 0; s < n_kv; ++s) mask[s] = -kInfF;
  mask[1 * n_kv + 0] = mask[1 * n_kv + 1] = -kInfF;
  mask[2 * n_kv + 0] = mask[2 * n_kv + 1] = -kInfF;
  const std::vector<double> out = ref::AttentionCore(
      q.data(), n_heads * head_dim, n_q, k.data(), head_dim, v.data(), head_dim,
      n_kv, n_heads, 1, head_dim, 0, true, mask.data(), n_kv, 1.0);
  const int64_t cols = n_heads * head_dim;
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_EQ(out[0 * cols + c], 0.0) << c;
    EXPECT_EQ(out[1 * cols + c], 0.0) << c;
    EXPECT_EQ(out[2 * cols + c], v[2 * head_dim + c % head_dim]) << c;
  }
}

// --------------------------------------------------------------------------
// MultiHeadAttention against the seed's numpy forward(), transcribed step by
// step with K/V heads repeated for GQA (n_kv_heads = n_heads is the seed
// itself).

std::vector<double> NumpyForward(const ref::AttentionShape& shape,
                                 const ref::LayerWeights& w, const float* x,
                                 int64_t seq, const float* mask) {
  const int64_t d_model = shape.d_model, n_heads = shape.n_heads;
  const int64_t d_k = shape.head_dim;
  const int64_t group_size = n_heads / shape.n_kv_heads;
  using Tensor3 = std::vector<std::vector<std::vector<double>>>;
  // 1. Q = X @ W_Q (+ b), [seq, width].
  auto project = [&](const float* w_mat, const float* bias, int64_t width) {
    std::vector<std::vector<double>> y(seq, std::vector<double>(width, 0.0));
    for (int64_t i = 0; i < seq; ++i) {
      for (int64_t j = 0; j < width; ++j) {
        for (int64_t p = 0; p < d_model; ++p) {
          y[i][j] += double{x[i * d_model + p]} * w_mat[p * width + j];
        }
        if (bias != nullptr) y[i][j] += bias[j];
      }
    }
    return y;
  };
  // 2. split_heads: (seq, heads * d_k) -> (heads, seq, d_k).
  auto split_heads = [&](const std::vector<std::vector<double>>& y,
                         int64_t heads) {
    Tensor3 t(heads,
              std::vector<std::vector<double>>(seq, std::vector<double>(d_k)));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        for (int64_t d = 0; d < d_k; ++d) t[h][i][d] = y[i][h * d_k + d];
      }
    }
    return t;
  };
  const Tensor3 q = split_heads(project(w.w_q, w.b_q, n_heads * d_k), n_heads);
  const Tensor3 k = split_heads(project(w.w_k, w.b_k, shape.n_kv_heads * d_k),
                                shape.n_kv_heads);
  const Tensor3 v = split_heads(project(w.w_v, w.b_v, shape.n_kv_heads * d_k),
                                shape.n_kv_heads);
  // 3. scores = einsum('hid,hjd->hij', Q, K) / sqrt(d_k) (+ mask), then
  //    weights = softmax(scores, axis=-1).
  // 4. attn_output = einsum('hij,hjd->hid', weights, V).
  Tensor3 attn(n_heads, std::vector<std::vector<double>>(
                            seq, std::vector<double>(d_k, 0.0)));
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t g = h / group_size;  // repeat_kv
    for (int64_t i = 0; i < seq; ++i) {
      std::vector<double> scores(seq, 0.0);
      for (int64_t j = 0; j < seq; ++j) {
        for (int64_t d = 0; d < d_k; ++d) scores[j] += q[h][i][d] * k[g][j][d];
        scores[j] /= std::sqrt(static_cast<double>(d_k));
        if (mask != nullptr) scores[j] += mask[i * seq + j];
      }
      // softmax: e = exp(x - max(x)); e / sum(e).
      double max = -kInf, sum = 0.0;
      for (double score : scores) max = std::max(max, score);
      for (double& score : scores) {
        score = std::exp(score - max);
        sum += score;
      }
      for (int64_t j = 0; j < seq; ++j) {
        for (int64_t d = 0; d < d_k; ++d) {
          attn[h][i][d] += scores[j] / sum * v[g][j][d];
        }
      }
    }
  }
  // 5. combine_heads, then @ W_O (+ b_o).
  std::vector<double> out(seq * d_model, 0.0);
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t j = 0; j < d_model; ++j) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t d = 0; d < d_k; ++d) {
          out[i * d_model + j] +=
              attn[h][i][d] * w.w_o[(h * d_k + d) * d_model + j];
        }
      }
      if (w.b_o != nullptr) out[i * d_model + j] += w.b_o[j];
    }
  }
  return out;
}

struct RandomLayer {
  RandomLayer(const ref::AttentionShape& shape, bool with_bias, uint64_t seed) {
    const int64_t q_cols = shape.n_heads * shape.head_dim;
    const int64_t kv_cols = shape.n_kv_heads * shape.head_dim;
    w_q = RandomVector(shape.d_model * q_cols, seed + 1);
    w_k = RandomVector(shape.d_model * kv_cols, seed + 2);
    w_v = RandomVector(shape.d_model * kv_cols, seed + 3);
    w_o = RandomVector(q_cols * shape.d_model, seed + 4);
    weights = {w_q.data(), w_k.data(), w_v.data(), w_o.data()};
    if (with_bias) {
      b_q = RandomVector(q_cols, seed + 5);
      b_k = RandomVector(kv_cols, seed + 6);
      b_v = RandomVector(kv_cols, seed + 7);
      b_o = RandomVector(shape.d_model, seed + 8);
      weights.b_q = b_q.data();
      weights.b_k = b_k.data();
      weights.b_v = b_v.data();
      weights.b_o = b_o.data();
    }
  }
  std::vector<float> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;
  ref::LayerWeights weights;
};

TEST(RefMultiHeadAttentionTest, MatchesSeedTranscription) {
  constexpr int64_t seq = 5;
  // The seed's MHA (d_model = n_heads * d_k, no bias), then GQA and MQA with
  // biases and a head_dim that differs from d_model / n_heads.
  const ref::AttentionShape shapes[] = {
      {8, 2, 2, 4}, {12, 4, 2, 5}, {6, 3, 1, 4}};
  for (const ref::AttentionShape& shape : shapes) {
    const bool with_bias = shape.n_kv_heads != shape.n_heads;
    const RandomLayer layer(shape, with_bias, 30);
    const std::vector<float> x = RandomVector(seq * shape.d_model, 40, -2, 2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
    SCOPED_TRACE("d_model " + std::to_string(shape.d_model) + " n_heads " +
                 std::to_string(shape.n_heads) + " n_kv_heads " +
                 std::to_string(shape.n_kv_heads));
    // No mask.
    ExpectAllNear(NumpyForward(shape, layer.weights, x.data(), seq, nullptr),
                  ref::MultiHeadAttention(shape, layer.weights, x.data(), seq,
                                          false, nullptr, 0, scale),
                  1e-12);
    // The causal mask, as an additive -inf matrix in numpy and as `causal`
    // here.
    std::vector<float> mask(seq * seq, 0.0f);
    for (int64_t i = 0; i < seq; ++i) {
      for (int64_t j = i + 1; j < seq; ++j) mask[i * seq + j] = -kInfF;
    }
    const std::vector<double> expected =
        NumpyForward(shape, layer.weights, x.data(), seq, mask.data());
    ExpectAllNear(expected,
                  ref::MultiHeadAttention(shape, layer.weights, x.data(), seq,
                                          true, nullptr, 0, scale),
                  1e-12);
    ExpectAllNear(expected,
                  ref::MultiHeadAttention(shape, layer.weights, x.data(), seq,
                                          false, mask.data(), seq, scale),
                  1e-12);
  }
}

// --------------------------------------------------------------------------
// Random data and tail sizes

TEST(RandomTest, PortableValues) {
  // splitmix64 computed independently (Python): these bits must not change on
  // any platform.
  const std::vector<float> v = RandomVector(4, 42);
  EXPECT_EQ(Bits(v[0]), 0x3ef75cc9u);
  EXPECT_EQ(Bits(v[1]), 0xbf2e203au);
  EXPECT_EQ(Bits(v[2]), 0xbee2b663u);
  EXPECT_EQ(Bits(v[3]), 0xbe9f8c78u);
  const std::vector<float> zero_seed = RandomVector(2, 0);
  EXPECT_EQ(Bits(zero_seed[0]), 0x3f444150u);
  EXPECT_EQ(Bits(zero_seed[1]), 0xbe0c3b0du);
}

TEST(RandomTest, DeterministicInRangeNotZeros) {
  for (uint64_t seed : {0ull, 1ull, 0xFFFFFFFFFFFFFFFFull}) {
    const std::vector<float> v = RandomVector(1000, seed, 2.0f, 3.0f);
    EXPECT_EQ(v, RandomVector(1000, seed, 2.0f, 3.0f));
    EXPECT_NE(v, RandomVector(1000, seed + 1, 2.0f, 3.0f));
    for (float f : v) {
      EXPECT_GE(f, 2.0f);
      EXPECT_LE(f, 3.0f);
    }
    const std::vector<float> w = RandomVector(1000, seed);
    int zeros = 0, negatives = 0;
    for (float f : w) {
      zeros += f == 0.0f;
      negatives += f < 0.0f;
    }
    EXPECT_LT(zeros, 2);
    EXPECT_GT(negatives, 400);
    EXPECT_LT(negatives, 600);
  }
}

TEST(RandomTest, MatrixPaddingIsNaN) {
  constexpr int64_t rows = 4, cols = 5, stride = 9;
  const float sentinel = 7.0f;
  // One element past the view: must stay untouched.
  std::vector<float> data((rows - 1) * stride + cols + 1, sentinel);
  FillRandomMatrix(data.data(), rows, cols, stride, 50);
  const std::vector<float> logical = RandomVector(rows * cols, 50);
  bool any_nonzero = false;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const size_t i = r * stride + c;
      if (i >= data.size() - 1) break;
      if (c < cols) {
        EXPECT_EQ(data[i], logical[r * cols + c]) << r << "," << c;
        EXPECT_FALSE(std::isnan(data[i]));
        any_nonzero |= data[i] != 0.0f;
      } else {
        EXPECT_TRUE(std::isnan(data[i])) << r << "," << c;
      }
    }
  }
  EXPECT_TRUE(any_nonzero);
  EXPECT_EQ(data.back(), sentinel);
  // stride == cols: no padding, same values as RandomVector.
  std::vector<float> dense(rows * cols);
  FillRandomMatrix(dense.data(), rows, cols, cols, 50);
  EXPECT_EQ(dense, logical);
}

TEST(RandomTest, TailSizes) {
  EXPECT_EQ(TailSizes(8, 100000),
            (std::vector<size_t>{1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 61,
                                 127, 251, 509, 1021}));
  EXPECT_EQ(TailSizes(16, 40),
            (std::vector<size_t>{1, 2, 3, 15, 16, 17, 31, 32, 33}));
  EXPECT_EQ(TailSizes(1, 5), (std::vector<size_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(TailSizes(4, 0), std::vector<size_t>{});
}

// --------------------------------------------------------------------------
// Guard pages

TEST(GuardedBufferTest, EndsAtGuardPage) {
  const uintptr_t page = GuardedBytes::PageSize();
  for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1024},
                       size_t{1025}, size_t{5000}}) {
    GuardedBuffer<float> after(count);
    EXPECT_EQ(after.size(), count);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(after.data() + count) % page, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(after.data()) % alignof(float), 0u);
    GuardedBuffer<double> before(count, GuardSide::kBefore);
    EXPECT_EQ(before.side(), GuardSide::kBefore);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(before.data()) % page, 0u);
    // Zero-filled, and every element readable and writable.
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(after[i], 0.0f);
      EXPECT_EQ(before[i], 0.0);
      after[i] = 1.0f;
      before[i] = 2.0;
    }
    if (count > 0) {
      const volatile float* last = after.data() + count - 1;
      EXPECT_EQ(*last, 1.0f);
    }
  }
  // Three floats end at a page boundary, so they cannot start on a 64-byte
  // boundary.
  GuardedBuffer<float> three(3);
  EXPECT_NE(reinterpret_cast<uintptr_t>(three.data()) % 64, 0u);
}

TEST(GuardedBufferTest, Moves) {
  GuardedBuffer<int32_t> a(10);
  a[9] = 42;
  int32_t* data = a.data();
  GuardedBuffer<int32_t> b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 10u);
  EXPECT_EQ(b[9], 42);
  // A moved-from buffer is empty.
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move)
  GuardedBuffer<int32_t> c(1);
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c[9], 42);
}

// Death tests run first (the name ends in DeathTest) and in a fresh process
// ("threadsafe"), since TBB may have started threads.
TEST(GuardedBufferDeathTest, ReadPastEndFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  GuardedBuffer<float> after(5);
  const volatile float* past_end = after.data() + after.size();
  EXPECT_DEATH((void)*past_end, "");
  GuardedBuffer<float> before(5, GuardSide::kBefore);
  const volatile float* before_start = before.data() - 1;
  EXPECT_DEATH((void)*before_start, "");
}

// --------------------------------------------------------------------------
// Lanes

// The float lanes Highway gives each x86 target; 0 for a name not listed
// (checked loosely).
size_t KnownFloatLanes(const std::string& name) {
  if (name == "AVX3_DL" || name == "AVX3") return 16;
  if (name == "AVX2") return 8;
  if (name == "SSE4" || name == "SSSE3" || name == "EMU128") return 4;
  if (name == "SCALAR") return 1;
  return 0;
}

TEST(ActiveFloatLanesTest, MatchesEachTarget) {
  const std::vector<Target> targets = SupportedTargets();
  std::vector<size_t> lanes_of(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string name = targets[i].name;
    ASSERT_TRUE(SetMaxTarget(name).ok()) << name;
    const size_t lanes = ActiveFloatLanes();
    lanes_of[i] = lanes;
    EXPECT_GE(lanes, 1u) << name;
    EXPECT_EQ(lanes & (lanes - 1), 0u) << name << ": " << lanes;
    const size_t expected = KnownFloatLanes(name);
    if (expected != 0) {
      EXPECT_EQ(lanes, expected) << name;
    }
  }
  // Uncapped, calls go to the best target.
  ResetMaxTarget();
  EXPECT_EQ(ActiveFloatLanes(), lanes_of.front());
}

// What every TargetTest does in SetUp: cap, then check ActiveTarget(). Asking
// must not move dispatch off the cap (Highway 1.0.3's hwy::SupportedTargets()
// re-initialises dispatch with every CPU target, ignoring DisableTargets).
TEST(ActiveFloatLanesTest, ActiveTargetDoesNotUndoTheCap) {
  for (const Target& target : SupportedTargets()) {
    const std::string name = target.name;
    ASSERT_TRUE(SetMaxTarget(name).ok()) << name;
    ASSERT_EQ(ActiveTarget(), target) << name;
    const size_t expected = KnownFloatLanes(name);
    if (expected != 0) {
      EXPECT_EQ(ActiveFloatLanes(), expected) << name;
    }
  }
  ResetMaxTarget();
}

// A host (or another library) asking Highway for the CPU's targets must not
// undo the cap: Highway 1.0.3's SupportedTargets() re-initialises dispatch (see
// lib/core/targets.cc).
TEST(ActiveFloatLanesTest, HostCallToHighwayDoesNotUndoTheCap) {
  for (const Target& target : SupportedTargets()) {
    const std::string name = target.name;
    ASSERT_TRUE(SetMaxTarget(name).ok()) << name;
    (void)hwy::SupportedTargets();
    const size_t expected = KnownFloatLanes(name);
    if (expected != 0) {
      EXPECT_EQ(ActiveFloatLanes(), expected) << name;
    }
    EXPECT_EQ(ActiveTarget(), target) << name;
  }
  ResetMaxTarget();
}

}  // namespace
}  // namespace test
}  // namespace headway

// RMSNorm tests (RmsNormHeads): every target, against a long-double reference.
//
// Tolerance, norm.h's bound, per element: |x' - exact| <= 2^-24 |exact| (1 +
// head_dim 2^-28) + 2^-149. The kernel sums in float64 and rounds each output
// to float once (2^-24 relative); the float64 sum, square root, division and
// products add under (head_dim + 4) 2^-53 relative; outputs below FLT_MIN
// round to the denormal grid (2^-149).
#include "headway/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "test/support/guard_page.h"
#include "test/support/lanes.h"
#include "test/support/random.h"
#include "test/support/status_matchers.h"
#include "test/support/target_test.h"

namespace headway {
namespace {

constexpr double kDenormUlp = 1.4012984643248171e-45;  // 2^-149

// Checks got [rows, cols] (stride) against RMSNorm of x's heads.
void ExpectNormalised(const float* x, const float* got, int64_t rows,
                      int64_t cols, int64_t stride, int64_t head_dim,
                      const float* weight, float eps) {
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < cols / head_dim; ++h) {
      const int64_t base = t * stride + h * head_dim;
      long double sum = 0;
      for (int64_t i = 0; i < head_dim; ++i) {
        sum += static_cast<long double>(x[base + i]) * x[base + i];
      }
      const long double mean = sum / head_dim + eps;
      const long double factor = mean == 0 ? 0 : 1 / sqrtl(mean);
      for (int64_t i = 0; i < head_dim; ++i) {
        const double want =
            static_cast<double>(x[base + i] * factor * weight[i]);
        const double tol =
            std::fabs(want) * 0x1.0p-24 * (1 + head_dim * 0x1.0p-28) +
            kDenormUlp;
        ASSERT_LE(std::fabs(got[base + i] - want), tol)
            << "row " << t << " head " << h << " element " << i << " of "
            << head_dim << ": got " << got[base + i] << ", want " << want;
      }
    }
    for (int64_t c = cols; c < stride && t + 1 < rows; ++c) {
      ASSERT_EQ(std::memcmp(&got[t * stride + c], &x[t * stride + c], 4), 0)
          << "padding changed";
    }
  }
}

class NormTest : public test::TargetTest {};

// Every tail of the float64 loops, strided and misaligned rows, the last
// element against a guard page.
TEST_P(NormTest, MatchesReferenceOnTails) {
  const size_t lanes = test::ActiveFloatLanes();
  std::vector<size_t> sizes = test::TailSizes(lanes, 300);
  sizes.push_back(128);
  uint64_t seed = 1;
  for (const size_t head_dim : sizes) {
    for (const int64_t n_heads : {1, 3}) {
      for (const int64_t pad : {0, 5}) {
        const int64_t rows = 3, hd = static_cast<int64_t>(head_dim);
        const int64_t cols = n_heads * hd, stride = cols + pad;
        const size_t n = static_cast<size_t>((rows - 1) * stride + cols + 1);
        test::GuardedBuffer<float> buffer(n);
        float* data = buffer.data() + 1;
        test::FillRandom(buffer.data(), n, seed++, -3.0f, 3.0f);
        const std::vector<float> x(data, data + (n - 1));
        const std::vector<float> weight =
            test::RandomVector(head_dim, seed++, 0.5f, 2.0f);
        ASSERT_TRUE(RmsNormHeads(MatrixView<float>(data, rows, cols, stride),
                                 hd, weight.data(), 1e-6f)
                        .ok());
        ExpectNormalised(x.data(), data, rows, cols, stride, hd, weight.data(),
                         1e-6f);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Heads of tiny (denormal), huge (near FLT_MAX) and zero values, with eps 0
// and 1e-6: no overflow or underflow; zeros stay zeros.
TEST_P(NormTest, TinyHugeAndZeroHeads) {
  const int64_t hd = 37, rows = 1, cols = 4 * hd;
  const std::vector<float> weight = test::RandomVector(hd, 5, 0.5f, 2.0f);
  for (const float eps : {0.0f, 1e-6f}) {
    std::vector<float> x = test::RandomVector(cols, 6);
    for (int64_t i = 0; i < hd; ++i) {
      x[i] *= 1e-40f;           // denormals
      x[hd + i] *= 3e38f;       // x^2 overflows float
      x[2 * hd + i] = 0.0f;     // all zero
      x[3 * hd + i] *= 1e-20f;  // x^2 underflows float
    }
    std::vector<float> got = x;
    ASSERT_TRUE(RmsNormHeads(MatrixView<float>(got.data(), rows, cols), hd,
                             weight.data(), eps)
                    .ok());
    ExpectNormalised(x.data(), got.data(), rows, cols, cols, hd, weight.data(),
                     eps);
    for (int64_t i = 0; i < hd; ++i) EXPECT_EQ(got[2 * hd + i], 0.0f);
    if (eps == 0.0f) {
      // Without eps a head's RMS is 1 before the weight, at any magnitude.
      for (const int64_t h : {0, 1, 3}) {
        double sum = 0;
        for (int64_t i = 0; i < hd; ++i) {
          const double v = got[h * hd + i] / weight[i];
          sum += v * v;
        }
        EXPECT_NEAR(sum / hd, 1.0, 1e-5) << "head " << h;
      }
    }
  }
}

// A NaN or an inf makes its head all NaN and leaves the other heads alone.
TEST_P(NormTest, NonFiniteHeadIsNaN) {
  const int64_t hd = 20, cols = 3 * hd;
  const std::vector<float> weight = test::RandomVector(hd, 8, 0.5f, 2.0f);
  std::vector<float> x = test::RandomVector(cols, 9);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[2 * hd + 7] = -std::numeric_limits<float>::infinity();
  std::vector<float> got = x;
  ASSERT_TRUE(RmsNormHeads(MatrixView<float>(got.data(), 1, cols), hd,
                           weight.data(), 1e-6f)
                  .ok());
  for (int64_t i = 0; i < hd; ++i) {
    EXPECT_TRUE(std::isnan(got[i])) << i;
    EXPECT_TRUE(std::isnan(got[2 * hd + i])) << i;
  }
  ExpectNormalised(x.data() + hd, got.data() + hd, 1, hd, hd, hd, weight.data(),
                   1e-6f);
}

HEADWAY_INSTANTIATE_TARGET_TEST(NormTest);

TEST(NormErrors, NameTheArgumentAndWriteNothing) {
  const int64_t hd = 8, cols = 16;
  std::vector<float> x = test::RandomVector(2 * cols, 3);
  const std::vector<float> before = x;
  std::vector<float> weight = test::RandomVector(hd, 4);
  const MatrixView<float> xv(x.data(), 2, cols);
  const auto expect_error = [&](MatrixView<float> view, int64_t head_dim,
                                const float* w, float eps,
                                const std::string& part) {
    EXPECT_TRUE(test::IsError(RmsNormHeads(view, head_dim, w, eps),
                              StatusCode::kInvalidArgument, {part},
                              "RmsNormHeads: "));
    EXPECT_EQ(x, before) << part;
  };
  expect_error(xv, 0, weight.data(), 1e-6f, "head_dim");
  expect_error(xv, 5, weight.data(), 1e-6f, "x.cols (16)");
  expect_error(MatrixView<float>(nullptr, 2, cols), hd, weight.data(), 1e-6f,
               "x");
  expect_error(MatrixView<float>(x.data(), 2, cols, 3), hd, weight.data(),
               1e-6f, "x.stride");
  expect_error(xv, hd, nullptr, 1e-6f, "weight is null");
  expect_error(xv, hd, weight.data(), -1.0f, "eps");
  expect_error(xv, hd, weight.data(), NAN, "eps");
  expect_error(xv, hd, x.data() + 4, 1e-6f, "x overlaps weight");
  weight[5] = INFINITY;
  expect_error(xv, hd, weight.data(), 1e-6f, "weight[5]");
}

}  // namespace
}  // namespace headway

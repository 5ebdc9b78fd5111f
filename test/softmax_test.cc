// Softmax tests: every target, against the float64 reference
// (test/support/reference.h).
//
// Tolerance, per element, the bound of softmax.h (u = 2^-24, n = cols, m the
// row's largest z = scale * x):
//   (8 + |z - m| + ln n + (scale inexact ? |z| + |m| + ln n : 0)) * u * exact
//   + 2^-149
// The derivation is in lib/softmax/softmax-inl.h. The 2^-149 (one ulp of the
// denormals) covers outputs below FLT_MIN, which exp and the final product
// round to the denormal grid. For the logits of the tail tests (|x| <= 4, so
// |z - m| <= 8, n <= 4096) the bound is at most (16 + 8.3) u = 1.5e-6 with
// an exact scale; the measured worst is under 4e-7 on every target, and the
// edge test below reaches a large fraction of the bound.
#include "headway/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "headway/threads.h"
#include "tbb/task_arena.h"
#include "test/support/guard_page.h"
#include "test/support/lanes.h"
#include "test/support/random.h"
#include "test/support/reference.h"
#include "test/support/status_matchers.h"
#include "test/support/target_test.h"

namespace headway {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

constexpr double kDenormUlp = 1.4012984643248171e-45;  // 2^-149

// softmax.h's relative bound for an element z of a row of n whose largest
// element is m.
double SoftmaxRelativeBound(double z, double m, int64_t n, bool exact_scale) {
  const double log_n = std::log(static_cast<double>(n));
  const double inexact =
      exact_scale ? 0.0 : std::fabs(z) + std::fabs(m) + log_n;
  return (8.0 + std::fabs(z - m) + log_n + inexact) * kU;
}

bool IsPowerOfTwo(float scale) {
  int exponent = 0;
  return std::frexp(std::fabs(scale), &exponent) == 0.5f;
}

// Checks y [rows, cols] (stride y_stride) against the reference for x, element
// by element; raises *worst to the largest relative error seen (over elements
// >= FLT_MIN).
void ExpectMatchesReference(const float* x, int64_t x_stride, const float* y,
                            int64_t y_stride, int64_t rows, int64_t cols,
                            float scale, double* worst = nullptr) {
  const std::vector<double> ref =
      test::ref::Softmax(x, x_stride, rows, cols, scale);
  const bool exact_scale = IsPowerOfTwo(scale);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) {
      m = std::max(m, static_cast<double>(scale) * x[r * x_stride + c]);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double z = static_cast<double>(scale) * x[r * x_stride + c];
      const double want = ref[r * cols + c];
      const double got = y[r * y_stride + c];
      const double rel_tol = SoftmaxRelativeBound(z, m, cols, exact_scale);
      // (want == 0: exp underflowed or the logit is -inf; rel_tol may then be
      // inf.)
      const double tol = (want > 0 ? rel_tol * want : 0.0) + kDenormUlp;
      ASSERT_LE(std::fabs(got - want), tol)
          << "row " << r << " col " << c << " of [" << rows << ", " << cols
          << "], scale " << scale << ": got " << got << ", want " << want;
      if (worst != nullptr && want >= std::numeric_limits<float>::min()) {
        *worst = std::max(*worst, std::fabs(got - want) / want);
      }
    }
  }
}

class SoftmaxTest : public test::TargetTest {};

// Every tail of the vector loops, strided (NaN padding) and misaligned views,
// in and out of place, exact and inexact scales.
TEST_P(SoftmaxTest, MatchesReferenceOnTails) {
  const size_t lanes = test::ActiveFloatLanes();
  std::vector<size_t> sizes = test::TailSizes(lanes, 4096);
  for (size_t extra : {64, 2047, 2048, 2049, 4095, 4096})
    sizes.push_back(extra);
  uint64_t seed = 1;
  double worst = 0.0;
  for (const size_t cols : sizes) {
    for (const int64_t rows : {1, 3}) {
      for (const int64_t pad : {0, 3}) {
        for (const float scale : {1.0f, 0.125f, 0.08838834764f}) {
          const int64_t stride = static_cast<int64_t>(cols) + pad;
          // +1: the view starts one float past the allocation's alignment.
          std::vector<float> x(rows * stride + 1), y(rows * stride + 1);
          test::FillRandomMatrix(x.data() + 1, rows, cols, stride, seed++,
                                 -4.0f, 4.0f);
          test::FillRandomMatrix(y.data() + 1, rows, cols, stride, seed++);
          MatrixView<const float> xv(x.data() + 1, rows, cols, stride);
          MatrixView<float> yv(y.data() + 1, rows, cols, stride);
          ASSERT_TRUE(Softmax(xv, yv, scale).ok());
          ExpectMatchesReference(xv.data, stride, yv.data, stride, rows, cols,
                                 scale, &worst);
          if (HasFatalFailure()) return;
          // Padding between rows is not the kernel's: it must still hold the
          // NaN.
          for (int64_t r = 0; r + 1 < rows; ++r) {
            for (int64_t c = cols; c < stride; ++c) {
              ASSERT_TRUE(std::isnan(yv.data[r * stride + c]));
            }
          }
          // In place gives the same bits as out of place.
          std::vector<float> inplace = x;
          MatrixView<float> iv(inplace.data() + 1, rows, cols, stride);
          ASSERT_TRUE(SoftmaxInPlace(iv, scale).ok());
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(0, std::memcmp(iv.data + r * stride, yv.data + r * stride,
                                     cols * sizeof(float)));
          }
        }
      }
    }
  }
  // The bar for rows up to 4096: 1e-6 relative.
  EXPECT_LE(worst, 1e-6);
  std::printf("  max relative error, rows up to 4096: %.3g\n", worst);
}

// Long rows: several blocks, combined through their maxima; the 1e-5 bar up to
// 1M columns.
TEST_P(SoftmaxTest, LongRows) {
  double worst = 0.0;
  for (const int64_t cols : {4099, 65537, 1000003}) {
    const int64_t rows = cols > 100000 ? 1 : 3;
    std::vector<float> x(rows * cols), y(rows * cols);
    test::FillRandom(x.data(), x.size(), cols, -4.0f, 4.0f);
    // A far larger logit late in the row: earlier blocks are rescaled by
    // exp(m_b - m).
    x[cols - 5] = 30.0f;
    ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), rows, cols),
                        MatrixView<float>(y.data(), rows, cols))
                    .ok());
    ExpectMatchesReference(x.data(), cols, y.data(), cols, rows, cols, 1.0f,
                           &worst);
    if (HasFatalFailure()) return;
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("  max relative error, rows up to 1000003: %.3g\n", worst);
}

TEST_P(SoftmaxTest, ExtremeRows) {
  const int64_t cols = 37;  // a vector loop and a tail on every target
  std::vector<std::vector<float>> rows;
  std::vector<float> row(cols);
  // +-1e30: exp of the differences underflows to 0, never overflows.
  for (int64_t c = 0; c < cols; ++c) row[c] = (c % 3 == 0) ? 1e30f : -1e30f;
  rows.push_back(row);
  // Near the float range: -FLT_MAX - FLT_MAX is -inf, exp(-inf) = 0.
  for (int64_t c = 0; c < cols; ++c) {
    row[c] = (c % 2) ? std::numeric_limits<float>::max()
                     : -std::numeric_limits<float>::max();
  }
  rows.push_back(row);
  // Mixed -inf (masked positions) and finite logits.
  test::FillRandom(row.data(), cols, 7, -4.0f, 4.0f);
  for (int64_t c = 0; c < cols; c += 2) row[c] = -kInf;
  rows.push_back(row);
  // The maximum in the tail only.
  test::FillRandom(row.data(), cols, 8, -4.0f, 4.0f);
  row[cols - 1] = 50.0f;
  rows.push_back(row);
  for (const auto& logits : rows) {
    std::vector<float> y(cols, kNaN);
    ASSERT_TRUE(Softmax(MatrixView<const float>(logits.data(), 1, cols),
                        MatrixView<float>(y.data(), 1, cols))
                    .ok());
    double sum = 0.0;
    for (float v : y) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    ExpectMatchesReference(logits.data(), cols, y.data(), cols, 1, cols, 1.0f);
    if (HasFatalFailure()) return;
  }
}

TEST_P(SoftmaxTest, FullyMaskedRowIsZeros) {
  for (const int64_t cols : {1, 5, 16, 37, 5000}) {
    std::vector<float> x(2 * cols, -kInf), y(2 * cols, kNaN);
    test::FillRandom(x.data() + cols, cols, 3, -4.0f, 4.0f);  // row 1 is normal
    ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), 2, cols),
                        MatrixView<float>(y.data(), 2, cols))
                    .ok());
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(y[c], 0.0f) << c;
    ExpectMatchesReference(x.data() + cols, cols, y.data() + cols, cols, 1,
                           cols, 1.0f);
  }
}

TEST_P(SoftmaxTest, NaNAndPlusInfPropagate) {
  for (const int64_t cols : {1, 7, 16, 33, 5000}) {
    for (const float poison : {kNaN, kInf}) {
      for (const int64_t at : {int64_t{0}, cols / 2, cols - 1}) {
        std::vector<float> x(2 * cols), y(2 * cols);
        test::FillRandom(x.data(), x.size(), cols + at, -4.0f, 4.0f);
        x[at] = poison;
        ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), 2, cols),
                            MatrixView<float>(y.data(), 2, cols))
                        .ok());
        for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(std::isnan(y[c])) << c;
        // The other row is untouched by the poison.
        ExpectMatchesReference(x.data() + cols, cols, y.data() + cols, cols, 1,
                               cols, 1.0f);
      }
    }
  }
  // A NaN among -inf: still NaN, not the zeros of a masked row.
  std::vector<float> x(9, -kInf), y(9);
  x[4] = kNaN;
  ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), 1, 9),
                      MatrixView<float>(y.data(), 1, 9))
                  .ok());
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

// Tails never read or write past a row: the row ends (or starts) at an unmapped
// page.
TEST_P(SoftmaxTest, GuardPages) {
  const size_t lanes = test::ActiveFloatLanes();
  for (const size_t cols : test::TailSizes(lanes, 300)) {
    for (const auto side :
         {test::GuardSide::kAfter, test::GuardSide::kBefore}) {
      test::GuardedBuffer<float> x(cols, side), y(cols, side);
      test::FillRandom(x.data(), cols, cols, -4.0f, 4.0f);
      MatrixView<const float> xv(x.data(), 1, cols);
      ASSERT_TRUE(Softmax(xv, MatrixView<float>(y.data(), 1, cols)).ok());
      ExpectMatchesReference(x.data(), cols, y.data(), cols, 1, cols, 1.0f);
      ASSERT_TRUE(SoftmaxInPlace(MatrixView<float>(x.data(), 1, cols)).ok());
    }
  }
}

// The split into blocks depends on the shape only: bit-identical for any thread
// count.
TEST_P(SoftmaxTest, SameBitsForAnyThreadCount) {
  for (const auto& shape : std::vector<std::pair<int64_t, int64_t>>{
           {1, 300001}, {64, 1000}, {5, 40000}}) {
    // Named copies: C++17 lambdas cannot capture structured bindings (clang).
    const int64_t rows = shape.first, cols = shape.second;
    std::vector<float> x(rows * cols);
    test::FillRandom(x.data(), x.size(), 11, -8.0f, 8.0f);
    std::vector<float> first;
    for (const int threads : {1, 2, 7}) {
      std::vector<float> y(rows * cols);
      tbb::task_arena arena(threads);
      arena.execute([&] {
        ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), rows, cols),
                            MatrixView<float>(y.data(), rows, cols))
                        .ok());
      });
      if (first.empty()) {
        first = y;
      } else {
        ASSERT_EQ(0,
                  std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
            << threads << " threads, [" << rows << ", " << cols << "]";
      }
    }
  }
}

// Equal logits far from zero under a scale that is not a power of two: every
// pass must see the same rounded scale * x, so z - m is exactly 0 and each
// element is 1 / n (a pass that fused scale * x - m into one FMA saw z - m up
// to half an ulp of m: NaN at 1e30, 0.856 row sums at 1e8).
TEST_P(SoftmaxTest, EqualLargeLogitsInexactScale) {
  const size_t lanes = test::ActiveFloatLanes();
  std::vector<size_t> sizes = test::TailSizes(lanes, 64);
  sizes.push_back(5000);
  for (const size_t cols : sizes) {
    for (const float value : {1e30f, -1e30f, 1e8f, 1e4f, 2.0e38f}) {
      for (const float scale : {0.3f, 0.08838834764f, 1.1f}) {
        std::vector<float> x(cols, value), y(cols, kNaN);
        ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), 1, cols),
                            MatrixView<float>(y.data(), 1, cols), scale)
                        .ok());
        const float want = static_cast<float>(1.0 / static_cast<double>(cols));
        for (size_t c = 0; c < cols; ++c) {
          // 1 / n to within the 8u of exp, sum and the two roundings.
          ASSERT_NEAR(y[c], want, 8 * kU * want)
              << cols << " x " << value << ", scale " << scale << ", col " << c;
        }
      }
    }
  }
}

// The bound at its edge: logits near 1e4 under an inexact scale, where the
// rounding of scale * x (|z| u and |m| u, about 1.8e-4 relative) dominates,
// and outputs below FLT_MIN, where the 2^-149 term does. The largest error
// must reach a good part of the bound (it is tight), never exceed it.
TEST_P(SoftmaxTest, ErrorBoundAtItsEdge) {
  struct Row {
    float offset, spread, scale;
  };
  for (const Row& row : {Row{1e4f, 20.0f, 0.3f}, Row{-3e3f, 8.0f, 0.7f},
                         Row{0.0f, 30.0f, 1.0f}}) {
    const int64_t cols = 997;
    std::vector<float> x(cols), y(cols, kNaN);
    test::FillRandom(x.data(), cols, 41, row.offset - row.spread,
                     row.offset + row.spread);
    if (row.scale == 1.0f) {
      // Denormal outputs: logits 80 to 104 below the maximum.
      for (int64_t c = 1; c < cols; ++c) x[c] = -80.0f - 24.0f * c / cols;
      x[0] = 0.0f;
    }
    ASSERT_TRUE(Softmax(MatrixView<const float>(x.data(), 1, cols),
                        MatrixView<float>(y.data(), 1, cols), row.scale)
                    .ok());
    const std::vector<double> ref =
        test::ref::Softmax(x.data(), cols, 1, cols, row.scale);
    double m = -INFINITY;
    for (float v : x) m = std::max(m, static_cast<double>(row.scale) * v);
    double worst = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double z = static_cast<double>(row.scale) * x[c];
      const double tol =
          SoftmaxRelativeBound(z, m, cols, IsPowerOfTwo(row.scale)) * ref[c] +
          kDenormUlp;
      worst = std::max(worst, std::fabs(y[c] - ref[c]) / tol);
    }
    EXPECT_LE(worst, 1.0) << "offset " << row.offset;
    EXPECT_GE(worst, 0.2) << "offset " << row.offset;
    std::printf("  offset %g, scale %g: worst error / bound %.3f\n", row.offset,
                row.scale, worst);
  }
}

// All -inf rows in place and strided, on every tail and across blocks: zeros
// (a maximum of -FLT_MAX instead of -inf, as EMU128's MaxOfLanes can give,
// would make the rows NaN).
TEST_P(SoftmaxTest, AllNegInfRowsInPlaceAndStridedAreZeros) {
  for (const int64_t cols : {1, 2, 3, 4, 8, 9, 4096 + 3}) {
    const int64_t stride = cols + 2;
    std::vector<float> x(3 * stride, -kInf);
    ASSERT_TRUE(
        SoftmaxInPlace(MatrixView<float>(x.data(), 3, cols, stride)).ok());
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(x[r * stride + c], 0.0f)
            << cols << " cols, " << r << ", " << c;
      }
    }
  }
}

HEADWAY_INSTANTIATE_TARGET_TEST(SoftmaxTest);

// Bad arguments: a clear error naming the argument, and y untouched.
TEST(SoftmaxErrors, RejectsBadArgumentsWithoutWriting) {
  std::vector<float> x(64, 1.0f), y(64, -7.0f), other(64, -7.0f);
  struct Case {
    MatrixView<const float> x;
    MatrixView<float> y;
    float scale;
    StatusCode code;
    const char* expect;
  };
  const MatrixView<const float> good_x(x.data(), 4, 8);
  const MatrixView<float> good_y(y.data(), 4, 8);
  const Case cases[] = {
      {{nullptr, 4, 8, 8},
       good_y,
       1.0f,
       StatusCode::kInvalidArgument,
       "x.data is null"},
      {good_x,
       {nullptr, 4, 8, 8},
       1.0f,
       StatusCode::kInvalidArgument,
       "y.data is null"},
      {{x.data(), 0, 8, 8},
       {y.data(), 0, 8, 8},
       1.0f,
       StatusCode::kInvalidArgument,
       "x.rows must be >= 1 (got 0)"},
      {{x.data(), -3, 8, 8},
       good_y,
       1.0f,
       StatusCode::kInvalidArgument,
       "x.rows must be >= 1 (got -3)"},
      {{x.data(), 4, 0, 8},
       good_y,
       1.0f,
       StatusCode::kInvalidArgument,
       "x.cols must be >= 1 (got 0)"},
      {{x.data(), 4, -1, 8},
       good_y,
       1.0f,
       StatusCode::kInvalidArgument,
       "x.cols must be >= 1 (got -1)"},
      {{x.data(), 4, 8, 7},
       good_y,
       1.0f,
       StatusCode::kInvalidArgument,
       "x.stride (7) is shorter than x.cols (8)"},
      {good_x,
       {y.data(), 4, 8, 4},
       1.0f,
       StatusCode::kInvalidArgument,
       "y.stride (4) is shorter than y.cols (8)"},
      {good_x,
       {y.data(), 4, 7, 8},
       1.0f,
       StatusCode::kInvalidArgument,
       "y is [4, 7] but x is [4, 8]"},
      {good_x,
       {y.data(), 3, 8, 8},
       1.0f,
       StatusCode::kInvalidArgument,
       "y is [3, 8] but x is [4, 8]"},
      {good_x, good_y, kNaN, StatusCode::kInvalidArgument,
       "scale must be finite"},
      {good_x, good_y, kInf, StatusCode::kInvalidArgument,
       "scale must be finite"},
      {{x.data(), int64_t{1} << 40, 8, int64_t{1} << 40},
       good_y,
       1.0f,
       StatusCode::kResourceExhausted,
       "x: rows (1099511627776) x stride (1099511627776) overflows"},
      // Near INT64_MAX: by far, and the widest row plus one element.
      {{x.data(), std::numeric_limits<int64_t>::max(), 8, 8},
       good_y,
       1.0f,
       StatusCode::kResourceExhausted,
       "x: rows (9223372036854775807) x stride (8) overflows"},
      {good_x,
       {y.data(), 2, 8, std::numeric_limits<int64_t>::max()},
       1.0f,
       StatusCode::kResourceExhausted,
       "y: rows (2) x stride (9223372036854775807) overflows"},
      {{x.data(), 1, std::numeric_limits<int64_t>::max() / 4 + 1,
        std::numeric_limits<int64_t>::max() / 4 + 1},
       good_y,
       1.0f,
       StatusCode::kResourceExhausted,
       "x: rows (1) x stride (2305843009213693952) overflows"},
  };
  for (const Case& c : cases) {
    const Status status = Softmax(c.x, c.y, c.scale);
    EXPECT_TRUE(test::IsError(status, c.code, {c.expect}, "Softmax: "));
    EXPECT_EQ(y, other) << "y was written on error: " << status.ToString();
  }
}

TEST(SoftmaxErrors, RejectsPartialOverlap) {
  std::vector<float> buf(64);
  test::FillRandom(buf.data(), buf.size(), 5);
  const std::vector<float> before = buf;
  // y starts one element into x: neither in place nor disjoint.
  const Status status = Softmax(MatrixView<const float>(buf.data(), 4, 8),
                                MatrixView<float>(buf.data() + 1, 4, 8));
  EXPECT_TRUE(
      test::IsError(status, StatusCode::kInvalidArgument, {"y overlaps x"}));
  EXPECT_EQ(buf, before);
  // Same start, different stride: also an overlap, not in place.
  EXPECT_FALSE(Softmax(MatrixView<const float>(buf.data(), 4, 8, 8),
                       MatrixView<float>(buf.data(), 4, 8, 9))
                   .ok());
  EXPECT_EQ(buf, before);
  // Interleaved rows of one buffer that do not touch each other's elements
  // still count as an overlap of the views' spans: rejected rather than
  // reasoned about.
  EXPECT_FALSE(Softmax(MatrixView<const float>(buf.data(), 4, 4, 16),
                       MatrixView<float>(buf.data() + 8, 4, 4, 16))
                   .ok());
}

}  // namespace
}  // namespace headway

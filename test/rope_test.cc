// RoPE tests (ApplyRope): every target, against a long-double reference
// from the formulas (ref::RopeFrequencies), not from the library's code.
//
// Tolerance, per output element of pair (a, b) at angle pos * freq_i, rope.h's
// bound:
//   |x' - exact| <= (4 u + 2^-52 pos freq_i) (|a| + |b|),  u = 2^-24.
// Derivation: cos and sin are rounded to float once (<= u each); the float64
// angle pos * freq_i is off by its own rounding and freq_i's (2^-53 relative
// each: 2^-52 pos freq_i radians); a c - b s takes two products and a sum,
// each rounded: 3 u (|a| + |b|) with the first, 4 u with room. The same on
// every target (fused or unfused multiply-adds). Elements past rotary_dim, and
// the padding of strided rows, must come back bit for bit.
#include "headway/rope.h"

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
#include "test/support/reference.h"
#include "test/support/status_matchers.h"
#include "test/support/target_test.h"

namespace headway {
namespace {

namespace ref = test::ref;

constexpr double kU = 1.0 / (1 << 24);

// Checks got [rows, cols] (stride) against RoPE of x (same layout) at
// positions; raises *worst to the largest error / bound.
void ExpectRotated(const RopeConfig& rope, int64_t head_dim,
                   const std::vector<int64_t>& positions, const float* x,
                   const float* got, int64_t rows, int64_t cols, int64_t stride,
                   double* worst) {
  const std::vector<long double> freq = ref::RopeFrequencies(rope);
  const int64_t half = rope.rotary_dim / 2;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < cols / head_dim; ++h) {
      const int64_t base = t * stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        int64_t ia = 0, ib = 0;
        ref::RopePair(rope.layout, half, i, &ia, &ib);
        const long double angle = positions[t] * freq[i];
        const long double c = cosl(angle), s = sinl(angle);
        const long double a = x[base + ia], b = x[base + ib];
        const double want_a = static_cast<double>(a * c - b * s);
        const double want_b = static_cast<double>(b * c + a * s);
        const double bound = (4 * kU + 0x1.0p-52 * static_cast<double>(angle)) *
                             static_cast<double>(fabsl(a) + fabsl(b));
        const double err = std::max(std::fabs(got[base + ia] - want_a),
                                    std::fabs(got[base + ib] - want_b));
        ASSERT_LE(err, bound)
            << "row " << t << " head " << h << " pair " << i << " at position "
            << positions[t] << ", rotary_dim " << rope.rotary_dim;
        if (bound > 0) *worst = std::max(*worst, err / bound);
      }
      for (int64_t c = rope.rotary_dim; c < head_dim; ++c) {
        ASSERT_EQ(std::memcmp(&got[base + c], &x[base + c], sizeof(float)), 0)
            << "element " << c << " past rotary_dim changed";
      }
    }
    for (int64_t c = cols; c < stride && t + 1 < rows; ++c) {
      ASSERT_EQ(std::memcmp(&got[t * stride + c], &x[t * stride + c], 4), 0)
          << "padding changed";
    }
  }
}

std::vector<int64_t> RandomPositions(int64_t rows, uint64_t seed,
                                     int64_t max_position) {
  test::SplitMix64 rng(seed);
  std::vector<int64_t> positions(rows);
  for (int64_t t = 0; t < rows; ++t) {
    positions[t] = static_cast<int64_t>(rng.Next() % (max_position + 1));
  }
  positions[0] = max_position;
  if (rows > 1) positions[1] = 0;
  return positions;
}

class RopeTest : public test::TargetTest {};

// Every tail of the pair loops (half = rotary_dim / 2 around the lanes), both
// layouts, full and partial rotation, strided and misaligned rows, the last
// element against a guard page.
TEST_P(RopeTest, MatchesReferenceOnTails) {
  const size_t lanes = test::ActiveFloatLanes();
  uint64_t seed = 1;
  double worst = 0;
  for (const size_t half : test::TailSizes(lanes, 130)) {
    for (const RopeLayout layout :
         {RopeLayout::kHalves, RopeLayout::kInterleaved}) {
      for (const int64_t extra : {0, 3}) {
        RopeConfig rope;
        rope.rotary_dim = static_cast<int64_t>(2 * half);
        rope.layout = layout;
        const int64_t head_dim = rope.rotary_dim + extra;
        for (const int64_t n_heads : {1, 3}) {
          const int64_t rows = 5, cols = n_heads * head_dim;
          const int64_t stride = cols + extra;
          // The view starts one float past the buffer's start; its last
          // element is the buffer's last.
          const size_t n = static_cast<size_t>((rows - 1) * stride + cols + 1);
          test::GuardedBuffer<float> buffer(n);
          float* data = buffer.data() + 1;
          test::FillRandom(buffer.data(), n, seed++);
          const std::vector<float> x(data, data + (n - 1));
          const std::vector<int64_t> positions =
              RandomPositions(rows, seed++, int64_t{1} << 20);
          ASSERT_TRUE(ApplyRope(rope, head_dim, positions.data(),
                                MatrixView<float>(data, rows, cols, stride))
                          .ok());
          ExpectRotated(rope, head_dim, positions, x.data(), data, rows, cols,
                        stride, &worst);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  RecordProperty("worst_fraction_of_bound", std::to_string(worst));
}

// Positions up to 2^30 (float32 pos * freq would be off by up to 64 rad),
// theta of Llama 3 (500000), both scalings, head_dim 128.
TEST_P(RopeTest, LargePositionsAndScalings) {
  uint64_t seed = 100;
  double worst = 0;
  for (const RopeScaling scaling :
       {RopeScaling::kNone, RopeScaling::kLinear, RopeScaling::kLlama3}) {
    for (const int64_t max_position :
         {int64_t{1} << 14, int64_t{1} << 20, int64_t{1} << 30}) {
      RopeConfig rope;
      rope.rotary_dim = 128;
      rope.theta = 500000.0;
      rope.scaling = scaling;
      rope.factor = scaling == RopeScaling::kLinear ? 4.0 : 8.0;
      const int64_t rows = 64, head_dim = 128, cols = 4 * head_dim;
      std::vector<float> x = test::RandomVector(rows * cols, seed++);
      std::vector<float> got = x;
      std::vector<int64_t> positions =
          RandomPositions(rows, seed++, max_position);
      for (int64_t t = 2; t < 6; ++t) positions[t] = max_position - t;
      ASSERT_TRUE(ApplyRope(rope, head_dim, positions.data(),
                            MatrixView<float>(got.data(), rows, cols))
                      .ok());
      ExpectRotated(rope, head_dim, positions, x.data(), got.data(), rows, cols,
                    cols, &worst);
      if (HasFatalFailure()) return;
    }
  }
  RecordProperty("worst_fraction_of_bound", std::to_string(worst));
}

// Llama 3.1's scaling keeps the high frequencies, divides the low ones by
// factor and blends in between; the wavelengths of theta 500000 and
// head_dim 128 fall in all three bands.
TEST_P(RopeTest, Llama3ScalingBands) {
  RopeConfig rope;
  rope.rotary_dim = 128;
  rope.theta = 500000.0;
  rope.scaling = RopeScaling::kLlama3;
  rope.factor = 8.0;
  const std::vector<long double> freq = ref::RopeFrequencies(rope);
  RopeConfig plain = rope;
  plain.scaling = RopeScaling::kNone;
  const std::vector<long double> base = ref::RopeFrequencies(plain);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < freq.size(); ++i) {
    if (freq[i] == base[i]) {
      ++kept;
    } else if (fabsl(freq[i] * 8 - base[i]) < 1e-15L * base[i]) {
      ++divided;
    } else {
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // The library's frequencies agree: one row at a position where every pair
  // turns by a different angle.
  const int64_t position = 123457;
  std::vector<float> x = test::RandomVector(128, 7);
  std::vector<float> got = x;
  ASSERT_TRUE(
      ApplyRope(rope, 128, &position, MatrixView<float>(got.data(), 1, 128))
          .ok());
  double worst = 0;
  ExpectRotated(rope, 128, {position}, x.data(), got.data(), 1, 128, 128,
                &worst);
}

// A rotation keeps each pair's norm and position 0 is the identity.
TEST_P(RopeTest, PositionZeroIsIdentity) {
  RopeConfig rope;
  rope.rotary_dim = 64;
  const int64_t rows = 3, cols = 256;
  std::vector<float> x = test::RandomVector(rows * cols, 11);
  std::vector<float> got = x;
  const std::vector<int64_t> positions(rows, 0);
  ASSERT_TRUE(ApplyRope(rope, 64, positions.data(),
                        MatrixView<float>(got.data(), rows, cols))
                  .ok());
  EXPECT_EQ(got, x);
}

HEADWAY_INSTANTIATE_TARGET_TEST(RopeTest);

// Bad arguments: a clear error naming the argument, nothing written.
TEST(RopeErrors, NameTheArgumentAndWriteNothing) {
  const int64_t rows = 2, head_dim = 8, cols = 16;
  std::vector<float> x = test::RandomVector(rows * cols, 3);
  const std::vector<float> before = x;
  const int64_t positions[2] = {4, 5};
  const MatrixView<float> xv(x.data(), rows, cols);
  RopeConfig good;
  good.rotary_dim = 8;
  ASSERT_TRUE(ApplyRope(good, head_dim, positions, xv).ok());
  x = before;
  struct Case {
    RopeConfig rope;
    int64_t head_dim;
    const int64_t* positions;
    MatrixView<float> x;
    std::string part;
  };
  std::vector<Case> cases;
  const auto with = [&](auto change, std::string part) {
    Case c{good, head_dim, positions, xv, part};
    change(&c);
    cases.push_back(c);
  };
  with([](Case* c) { c->rope.rotary_dim = 7; }, "rope.rotary_dim (7)");
  with([](Case* c) { c->rope.rotary_dim = 0; }, "rope.rotary_dim (0)");
  with([](Case* c) { c->rope.rotary_dim = 10; }, "rope.rotary_dim (10)");
  with([](Case* c) { c->head_dim = 0; }, "head_dim");
  with([](Case* c) { c->head_dim = 6; }, "rope.rotary_dim (8)");
  with([](Case* c) { c->rope.theta = 0; }, "rope.theta");
  with([](Case* c) { c->rope.theta = NAN; }, "rope.theta");
  with([](Case* c) { c->rope.layout = static_cast<RopeLayout>(5); },
       "rope.layout (5)");
  with([](Case* c) { c->rope.scaling = static_cast<RopeScaling>(9); },
       "rope.scaling (9)");
  with(
      [](Case* c) {
        c->rope.scaling = RopeScaling::kLinear;
        c->rope.factor = -1;
      },
      "rope.factor");
  with(
      [](Case* c) {
        c->rope.scaling = RopeScaling::kLlama3;
        c->rope.factor = INFINITY;
      },
      "rope.factor");
  with(
      [](Case* c) {
        c->rope.scaling = RopeScaling::kLlama3;
        c->rope.low_freq_factor = 0;
      },
      "rope.low_freq_factor");
  with(
      [](Case* c) {
        c->rope.scaling = RopeScaling::kLlama3;
        c->rope.high_freq_factor = 1;
      },
      "rope.high_freq_factor");
  with(
      [](Case* c) {
        c->rope.scaling = RopeScaling::kLlama3;
        c->rope.original_max_position = 0;
      },
      "rope.original_max_position");
  with([](Case* c) { c->positions = nullptr; }, "positions is null");
  static const int64_t negative[2] = {3, -1};
  with([](Case* c) { c->positions = negative; }, "positions[1] (-1)");
  with([](Case* c) { c->x.cols = 12; }, "x.cols (12)");
  with([](Case* c) { c->x.stride = 4; }, "x.stride");
  with([](Case* c) { c->x.data = nullptr; }, "x");
  for (const Case& c : cases) {
    EXPECT_TRUE(test::IsError(ApplyRope(c.rope, c.head_dim, c.positions, c.x),
                              StatusCode::kInvalidArgument, {c.part},
                              "ApplyRope: "));
    EXPECT_EQ(x, before) << c.part;
  }
}

}  // namespace
}  // namespace headway

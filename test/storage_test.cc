// Storage-type tests (lib/core/storage.h, storage-inl.h):
// - LoadStored, on every target, gives FloatFrom's bits for all 65536 bf16 and
//   f16 patterns and all 256 int8 values (aligned buffers, full and 4-lane
//   vectors); LoadStoredPair gives them in the order StoreInPairOrder puts
//   floats in.
// - BF16FromFloat and F16FromFloat equal an independent float64 round to
//   nearest even, written here, on edge cases (ties, subnormals, the largest
//   finite values, overflow to inf, NaN, signed zero) and on 4M random bit
//   patterns each; every f16 and bf16 pattern survives a round trip.
// - int8 StoreRow: scale = max|x| / 127, |x - scale * q| <= scale / 2, and
//   the documented all-zero, tiny, huge, NaN and inf rows.
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test/storage_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/core/storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace test {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t TargetBitsT() { return HWY_TARGET; }

// out[0, n) = LoadStored of p[0, n) in vectors of d; n a multiple of 16.
template <class D, class T>
HWY_INLINE void LoadAll(D d, const T* HWY_RESTRICT p, size_t n,
                        float* HWY_RESTRICT out) {
  const size_t lanes = hn::Lanes(d);
  for (size_t i = 0; i < n; i += lanes) {
    hn::StoreU(headway::HWY_NAMESPACE::LoadStored(d, p + i), d, out + i);
  }
}

// Full vectors into out, then 4-lane vectors (128-bit loads of float) into
// out_capped.
template <class T>
void LoadStoredAll(const T* HWY_RESTRICT p, size_t n, float* HWY_RESTRICT out,
                   float* HWY_RESTRICT out_capped) {
  LoadAll(hn::ScalableTag<float>(), p, n, out);
  LoadAll(hn::CappedTag<float, 4>(), p, n, out_capped);
}

void LoadF32T(const float* p, size_t n, float* out, float* out_capped) {
  LoadStoredAll(p, n, out, out_capped);
}
void LoadBF16T(const hwy::bfloat16_t* p, size_t n, float* out,
               float* out_capped) {
  LoadStoredAll(p, n, out, out_capped);
}
void LoadF16T(const hwy::float16_t* p, size_t n, float* out,
              float* out_capped) {
  LoadStoredAll(p, n, out, out_capped);
}
void LoadI8T(const int8_t* p, size_t n, float* out, float* out_capped) {
  LoadStoredAll(p, n, out, out_capped);
}

// Per 2N-element chunk of p[0, n) (n a multiple of 32): the two vectors of
// LoadStoredPair into out, and from[] (the chunk's floats) put in T's pair
// order by StoreInPairOrder into ordered.
template <class T>
void PairsAll(const T* HWY_RESTRICT p, const float* HWY_RESTRICT from, size_t n,
              float* HWY_RESTRICT out, float* HWY_RESTRICT ordered) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i + 2 * N <= n; i += 2 * N) {
    hn::Vec<decltype(d)> a, b;
    headway::HWY_NAMESPACE::LoadStoredPair(d, p + i, a, b);
    hn::StoreU(a, d, out + i);
    hn::StoreU(b, d, out + i + N);
    headway::HWY_NAMESPACE::StoreInPairOrder<T>(d, from + i, ordered + i);
  }
}
void PairsF32T(const float* p, const float* from, size_t n, float* out,
               float* ordered) {
  PairsAll(p, from, n, out, ordered);
}
void PairsBF16T(const hwy::bfloat16_t* p, const float* from, size_t n,
                float* out, float* ordered) {
  PairsAll(p, from, n, out, ordered);
}
void PairsF16T(const hwy::float16_t* p, const float* from, size_t n, float* out,
               float* ordered) {
  PairsAll(p, from, n, out, ordered);
}
void PairsI8T(const int8_t* p, const float* from, size_t n, float* out,
              float* ordered) {
  PairsAll(p, from, n, out, ordered);
}

// StoreRowVec with full vectors of this target.
void StoreF32T(const float* src, size_t n, float* dst, float* scale) {
  headway::HWY_NAMESPACE::StoreRowVec(hn::ScalableTag<float>(), src, n, dst,
                                      scale);
}
void StoreBF16T(const float* src, size_t n, hwy::bfloat16_t* dst,
                float* scale) {
  headway::HWY_NAMESPACE::StoreRowVec(hn::ScalableTag<float>(), src, n, dst,
                                      scale);
}
void StoreF16T(const float* src, size_t n, hwy::float16_t* dst, float* scale) {
  headway::HWY_NAMESPACE::StoreRowVec(hn::ScalableTag<float>(), src, n, dst,
                                      scale);
}
void StoreI8T(const float* src, size_t n, int8_t* dst, float* scale) {
  headway::HWY_NAMESPACE::StoreRowVec(hn::ScalableTag<float>(), src, n, dst,
                                      scale);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace test
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "gtest/gtest.h"
#include "hwy/aligned_allocator.h"
#include "lib/core/storage.h"
#include "test/support/random.h"
#include "test/support/target_test.h"

namespace headway {
namespace test {

HWY_EXPORT(TargetBitsT);
HWY_EXPORT(LoadF32T);
HWY_EXPORT(LoadBF16T);
HWY_EXPORT(LoadF16T);
HWY_EXPORT(LoadI8T);
HWY_EXPORT(PairsF32T);
HWY_EXPORT(PairsBF16T);
HWY_EXPORT(PairsF16T);
HWY_EXPORT(PairsI8T);
HWY_EXPORT(StoreF32T);
HWY_EXPORT(StoreBF16T);
HWY_EXPORT(StoreF16T);
HWY_EXPORT(StoreI8T);

namespace {

using headway::internal::BitsFloat;
using headway::internal::FloatBits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------------------
// Independent references: float64 arithmetic, no bit tricks.

// x rounded to nearest even on a grid of `significand` bits whose smallest
// normal is 2^min_exp (below it: the subnormal step 2^(min_exp -
// significand + 1)). Exact: a float has 24 bits, a double 53, and the
// scalings are powers of two.
double RoundToGrid(double x, int significand, int min_exp) {
  const double a = std::fabs(x);
  if (a == 0.0) return x;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int exp = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, exp - significand + 1);
  return std::copysign(std::nearbyint(a / ulp) * ulp, x);
}

// bf16: float32's exponent range, 8 significant bits; inf from 2^128 up.
uint16_t RefBF16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x)) return sign | 0x7F80;
  const double y = RoundToGrid(x, 8, -126);
  if (std::fabs(y) >= std::ldexp(1.0, 128)) return sign | 0x7F80;
  // y is a float whose low 16 bits are zero.
  return static_cast<uint16_t>(FloatBits(static_cast<float>(y)) >> 16);
}

// IEEE half: 11 significant bits, smallest normal 2^-14, subnormal step
// 2^-24; inf from 2^16 up.
uint16_t RefF16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x)) return sign | 0x7C00;
  const double a = std::fabs(RoundToGrid(x, 11, -14));
  if (a >= 65536.0) return sign | 0x7C00;
  if (a < std::ldexp(1.0, -14)) {
    return sign | static_cast<uint16_t>(a / std::ldexp(1.0, -24));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = (2m) * 2^(e - 1)
  const int biased = e - 1 + 15;
  const int mantissa = static_cast<int>((2.0 * m - 1.0) * 1024.0);
  return sign | static_cast<uint16_t>(biased << 10 | mantissa);
}

// The value of a half, decoded from its fields.
double RefFloatFromF16(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exp == 31) {
    return mantissa == 0 ? sign * HUGE_VAL
                         : std::numeric_limits<double>::quiet_NaN();
  }
  if (exp == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exp - 15 - 10);
}

// NaN results: a quiet NaN of x's sign (bf16 quiet bit 0x0040, f16 0x0200).
bool IsQuietNaNOf(uint16_t bits, float x, uint16_t exp_mask,
                  uint16_t quiet_bit) {
  return (bits & exp_mask) == exp_mask && (bits & quiet_bit) != 0 &&
         ((bits & 0x8000) != 0) == std::signbit(x);
}

void ExpectBF16(float x) {
  const uint16_t got = headway::internal::BF16FromFloat(x).bits;
  if (std::isnan(x)) {
    EXPECT_TRUE(IsQuietNaNOf(got, x, 0x7F80, 0x0040))
        << std::hex << FloatBits(x) << " -> " << got;
  } else {
    EXPECT_EQ(got, RefBF16(x)) << std::hex << "bits " << FloatBits(x);
  }
}

void ExpectF16(float x) {
  const uint16_t got = headway::internal::F16FromFloat(x).bits;
  if (std::isnan(x)) {
    EXPECT_TRUE(IsQuietNaNOf(got, x, 0x7C00, 0x0200))
        << std::hex << FloatBits(x) << " -> " << got;
  } else {
    EXPECT_EQ(got, RefF16(x))
        << std::hex << "bits " << FloatBits(x) << " (" << std::dec << x << ")";
  }
}

// Float bit patterns every conversion must get right, as bits and values.
std::vector<float> EdgeFloats() {
  std::vector<float> edges = {
      0.0f,
      -0.0f,
      1.0f,
      -1.0f,
      FLT_MIN,
      -FLT_MIN,
      FLT_MAX,
      -FLT_MAX,
      std::numeric_limits<float>::denorm_min(),
      kInf,
      -kInf,
      kNaN,
      -kNaN,
      // f16: largest finite, the ties around it and overflow.
      65504.0f,
      65519.0f,
      65519.996f,
      65520.0f,
      65536.0f,
      -65520.0f,
      // f16: the smallest normal and subnormals, their ties.
      0x1.0p-14f,
      0x1.0p-24f,
      0x1.0p-25f,
      0x1.8p-24f,
      0x1.0p-26f,
      3 * 0x1.0p-25f,
      0x1.000002p-25f,
      1023 * 0x1.0p-24f,
      1023.5f * 0x1.0p-24f,
      1022.5f * 0x1.0p-24f,
      0x1.ffcp-15f,
      // f16 ties in the normal range: to even down, to even up.
      1.0f + 0x1.0p-11f,
      1.0f + 3 * 0x1.0p-11f,
      2048.0f + 1.0f,
      // bf16 ties: 1 + 2^-8 (down to 1), 1 + 3 * 2^-8 (up), and just above.
      1.0f + 0x1.0p-8f,
      1.0f + 3 * 0x1.0p-8f,
      1.0f + 0x1.02p-8f,
  };
  // bf16: bit patterns at the rounding boundary of the low 16 bits, across
  // the exponent range (subnormals, normals, the top binade).
  for (const uint32_t high : {0x0000u, 0x0001u, 0x007Fu, 0x0080u, 0x3F80u,
                              0x3F81u, 0x7F7Eu, 0x7F7Fu}) {
    for (const uint32_t low :
         {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      edges.push_back(BitsFloat(high << 16 | low));
      edges.push_back(BitsFloat((high | 0x8000u) << 16 | low));
    }
  }
  // NaN payloads: signaling, quiet, the largest.
  for (const uint32_t nan : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x7F802000u,
                             0xFF800001u, 0xFFC00001u, 0x7FA00000u}) {
    edges.push_back(BitsFloat(nan));
  }
  return edges;
}

TEST(Storage, BF16FromFloatRoundsToNearestEven) {
  for (const float x : EdgeFloats()) ExpectBF16(x);
  // Spot checks of the reference itself.
  EXPECT_EQ(RefBF16(1.0f + 0x1.0p-8f), 0x3F80);
  EXPECT_EQ(RefBF16(1.0f + 3 * 0x1.0p-8f), 0x3F82);
  EXPECT_EQ(RefBF16(FLT_MAX), 0x7F80);
  EXPECT_EQ(RefBF16(-0.0f), 0x8000);
  SplitMix64 rng(1);
  for (int i = 0; i < (1 << 22); ++i) {
    const float x = BitsFloat(static_cast<uint32_t>(rng.Next()));
    const uint16_t got = headway::internal::BF16FromFloat(x).bits;
    if (std::isnan(x)) {
      ASSERT_TRUE(IsQuietNaNOf(got, x, 0x7F80, 0x0040)) << std::hex << got;
    } else {
      ASSERT_EQ(got, RefBF16(x)) << std::hex << "bits " << FloatBits(x);
    }
  }
}

TEST(Storage, F16FromFloatRoundsToNearestEven) {
  for (const float x : EdgeFloats()) ExpectF16(x);
  EXPECT_EQ(RefF16(65504.0f), 0x7BFF);
  EXPECT_EQ(RefF16(65520.0f), 0x7C00);
  EXPECT_EQ(RefF16(0x1.0p-25f), 0x0000);
  EXPECT_EQ(RefF16(3 * 0x1.0p-25f), 0x0002);
  EXPECT_EQ(RefF16(1023.5f * 0x1.0p-24f), 0x0400);
  SplitMix64 rng(2);
  for (int i = 0; i < (1 << 22); ++i) {
    // Half of the patterns in f16's range (|x| < 2^17), where the rounding is
    // interesting; the others anywhere.
    uint32_t bits = static_cast<uint32_t>(rng.Next());
    if (i % 2 == 0) bits = (bits & 0x87FFFFFFu) | 0x30000000u;
    const float x = BitsFloat(bits);
    const uint16_t got = headway::internal::F16FromFloat(x).bits;
    if (std::isnan(x)) {
      ASSERT_TRUE(IsQuietNaNOf(got, x, 0x7C00, 0x0200)) << std::hex << got;
    } else {
      ASSERT_EQ(got, RefF16(x)) << std::hex << "bits " << FloatBits(x);
    }
  }
}

// Every half and every bf16 reads as its decoded value and stores back to
// itself (a signaling NaN comes back quiet).
TEST(Storage, EveryF16AndBF16RoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    hwy::float16_t h;
    h.bits = bits;
    const float x = headway::internal::FloatFromF16(h);
    const double want = RefFloatFromF16(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(x)) << std::hex << bits;
      ASSERT_EQ(headway::internal::F16FromFloat(x).bits, bits | 0x0200)
          << std::hex << bits;
    } else {
      ASSERT_EQ(static_cast<double>(x), want) << std::hex << bits;
      ASSERT_EQ(std::signbit(x), (bits & 0x8000) != 0);
      ASSERT_EQ(headway::internal::F16FromFloat(x).bits, bits)
          << std::hex << bits;
    }

    hwy::bfloat16_t b;
    b.bits = bits;
    const float y = headway::internal::FloatFromBF16(b);
    ASSERT_EQ(FloatBits(y), static_cast<uint32_t>(bits) << 16);
    const uint16_t back = headway::internal::BF16FromFloat(y).bits;
    ASSERT_EQ(back, std::isnan(y) ? bits | 0x0040 : bits) << std::hex << bits;
  }
}

// ---------------------------------------------------------------------------
// int8 rows.

// Stores x as an int8 row; checks the documented scale and bound.
void ExpectInt8Row(const std::vector<float>& x, const char* what) {
  SCOPED_TRACE(what);
  std::vector<int8_t> q(x.size(), 99);
  float scale = -1.0f;
  headway::internal::StoreRow(x.data(), x.size(), q.data(), &scale);
  bool special = false;
  float max_abs = 0.0f;
  for (const float v : x) {
    special = special || !std::isfinite(v);
    max_abs = std::fmax(max_abs, std::fabs(v));
  }
  if (special) {  // NaN or inf: scale NaN, q = 0
    EXPECT_TRUE(std::isnan(scale));
    for (const int8_t v : q) ASSERT_EQ(v, 0);
    return;
  }
  if (max_abs < 127.0f * FLT_MIN) {  // all-zero and tiny rows: zeros
    EXPECT_EQ(FloatBits(scale), 0u) << scale;
    for (const int8_t v : q) ASSERT_EQ(v, 0);
    return;
  }
  // scale = max|x| / 127, one ulp lower where 127 * scale would overflow.
  float want = max_abs / 127.0f;
  if (std::isinf(want * 127.0f)) want = std::nextafter(want, 0.0f);
  EXPECT_EQ(scale, want);
  EXPECT_TRUE(std::isfinite(scale * 127.0f));
  std::vector<float> back(x.size());
  headway::internal::LoadRow(q.data(), q.size(), scale, back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_GE(q[i], -127);
    ASSERT_LE(q[i], 127);
    // Rounding x / scale in float adds at most 127 * 2^-24 < 2^-16 of a
    // step; scale * q in float 2^-24 relative.
    ASSERT_TRUE(std::isfinite(back[i]));
    ASSERT_LE(std::fabs(double{x[i]} - back[i]),
              scale * (0.5 + std::ldexp(1.0, -16)))
        << "element " << i << ": " << x[i] << " -> " << int{q[i]};
  }
}

TEST(Storage, Int8StoreRow) {
  SplitMix64 rng(3);
  for (const size_t n : {1, 2, 15, 16, 17, 64, 127, 128, 129, 1000}) {
    for (const float magnitude : {1.0f, 1e-30f, 3e30f, 1.0f / 3}) {
      std::vector<float> x(n);
      for (float& v : x) v = magnitude * rng.Uniform(-1.0f, 1.0f);
      ExpectInt8Row(x, "random");
      // The largest element exactly at +-max (q = +-127) and half steps
      // (ties).
      x[n / 2] = -magnitude;
      ExpectInt8Row(x, "with -max");
    }
  }
  // Exact ties round to even: max 127 makes scale 1.
  ExpectInt8Row({127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -3.5f}, "ties");
  std::vector<int8_t> q(6);
  float scale = 0.0f;
  const float ties[6] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -3.5f};
  headway::internal::StoreRow(ties, 6, q.data(), &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(std::vector<int8_t>(q), (std::vector<int8_t>{127, 0, 2, 2, 0, -4}));

  ExpectInt8Row(std::vector<float>(37, 0.0f), "all zero");
  ExpectInt8Row({0.0f, -0.0f, 0.0f}, "signed zeros");
  // Tiny rows: a subnormal max, and the boundary 127 * FLT_MIN.
  ExpectInt8Row({0x1.0p-140f, -0x1.0p-141f, 0x1.0p-149f}, "subnormal max");
  ExpectInt8Row({std::nextafter(127.0f * FLT_MIN, 0.0f), 1e-40f},
                "just under 127 * FLT_MIN");
  ExpectInt8Row({127.0f * FLT_MIN, -FLT_MIN, 1e-40f}, "127 * FLT_MIN");
  // Huge rows: FLT_MAX and the values around the overflow of 127 * scale.
  ExpectInt8Row({FLT_MAX, -FLT_MAX / 3, 1.0f, FLT_MAX / 254}, "FLT_MAX");
  ExpectInt8Row({-FLT_MAX}, "-FLT_MAX alone");
  for (int k = 0; k < 64; ++k) {
    float top = FLT_MAX;
    for (int i = 0; i < k * 5000; ++i) top = std::nextafter(top, 0.0f);
    ExpectInt8Row({top, -top / 2, top / 127}, "near FLT_MAX");
  }
  // NaN and inf anywhere in the row.
  ExpectInt8Row({1.0f, kNaN, 2.0f}, "NaN");
  ExpectInt8Row({kInf, 1.0f}, "inf");
  ExpectInt8Row({1.0f, 2.0f, -kInf}, "-inf last");
  ExpectInt8Row({-kNaN}, "NaN alone");
  ExpectInt8Row({0.0f, kInf}, "zeros and inf");
}

// bf16 and f16 StoreRow is the element conversion, element by element.
TEST(Storage, StoreRowAndLoadRowOfHalfTypes) {
  const std::vector<float> x = RandomVector(333, 4, -70000.0f, 70000.0f);
  std::vector<hwy::bfloat16_t> b(x.size());
  std::vector<hwy::float16_t> h(x.size());
  float unused = 5.0f;
  headway::internal::StoreRow(x.data(), x.size(), b.data(), &unused);
  headway::internal::StoreRow(x.data(), x.size(), h.data(), &unused);
  EXPECT_EQ(unused, 5.0f);
  std::vector<float> back_b(x.size()), back_h(x.size());
  headway::internal::LoadRow(b.data(), b.size(), 0.0f, back_b.data());
  headway::internal::LoadRow(h.data(), h.size(), 0.0f, back_h.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(b[i].bits, RefBF16(x[i]));
    ASSERT_EQ(h[i].bits, RefF16(x[i]));
    ASSERT_EQ(FloatBits(back_b[i]),
              FloatBits(headway::internal::FloatFromBF16(b[i])));
    ASSERT_EQ(FloatBits(back_h[i]),
              FloatBits(headway::internal::FloatFromF16(h[i])));
  }
}

// ---------------------------------------------------------------------------
// LoadStored, per target.

class StorageTest : public TargetTest {
 protected:
  void SetUp() override {
    TargetTest::SetUp();
    // The test's own dispatch reaches the target the cap chose.
    ASSERT_EQ(HWY_DYNAMIC_DISPATCH(TargetBitsT)(), GetParam().bits);
  }
};

// Compares out and out_capped with FloatFrom of every element, bit for bit.
template <class T>
void ExpectLoads(const T* p, size_t n, const float* out,
                 const float* out_capped) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t want = FloatBits(headway::internal::FloatFrom(p[i]));
    ASSERT_EQ(FloatBits(out[i]), want) << "element " << i;
    ASSERT_EQ(FloatBits(out_capped[i]), want) << "element " << i << " capped";
  }
}

TEST_P(StorageTest, LoadStoredEqualsFloatFromForEveryPattern) {
  constexpr size_t kN = 65536;
  auto out = hwy::AllocateAligned<float>(kN);
  auto out_capped = hwy::AllocateAligned<float>(kN);
  auto bf16 = hwy::AllocateAligned<hwy::bfloat16_t>(kN);
  auto f16 = hwy::AllocateAligned<hwy::float16_t>(kN);
  for (size_t i = 0; i < kN; ++i) {
    bf16[i].bits = static_cast<uint16_t>(i);
    f16[i].bits = static_cast<uint16_t>(i);
  }
  HWY_DYNAMIC_DISPATCH(LoadBF16T)(bf16.get(), kN, out.get(), out_capped.get());
  ExpectLoads(bf16.get(), kN, out.get(), out_capped.get());
  HWY_DYNAMIC_DISPATCH(LoadF16T)(f16.get(), kN, out.get(), out_capped.get());
  ExpectLoads(f16.get(), kN, out.get(), out_capped.get());

  auto i8 = hwy::AllocateAligned<int8_t>(256);
  for (size_t i = 0; i < 256; ++i) i8[i] = static_cast<int8_t>(i - 128);
  HWY_DYNAMIC_DISPATCH(LoadI8T)(i8.get(), 256, out.get(), out_capped.get());
  ExpectLoads(i8.get(), 256, out.get(), out_capped.get());

  auto f32 = hwy::AllocateAligned<float>(1024);
  SplitMix64 rng(5);
  for (size_t i = 0; i < 1024; ++i) {
    f32[i] = BitsFloat(static_cast<uint32_t>(rng.Next()));
  }
  HWY_DYNAMIC_DISPATCH(LoadF32T)(f32.get(), 1024, out.get(), out_capped.get());
  ExpectLoads(f32.get(), 1024, out.get(), out_capped.get());
}

// LoadStoredPair and StoreInPairOrder agree: per 32-element chunk (two
// AVX-512 vectors, four of 8 lanes, ...), the pair of vectors read from the
// stored elements holds, bit for bit, their FloatFrom floats put in pair order,
// and that order is a permutation of the chunk.
template <class T, class Fn>
void ExpectPairs(Fn pairs, const T* p, size_t n) {
  auto from = hwy::AllocateAligned<float>(n);
  auto out = hwy::AllocateAligned<float>(n);
  auto ordered = hwy::AllocateAligned<float>(n);
  for (size_t i = 0; i < n; ++i) from[i] = headway::internal::FloatFrom(p[i]);
  pairs(p, from.get(), n, out.get(), ordered.get());
  for (size_t c = 0; c < n; c += 32) {
    std::vector<uint32_t> want, got;
    for (size_t i = c; i < c + 32; ++i) {
      ASSERT_EQ(FloatBits(out[i]), FloatBits(ordered[i])) << "element " << i;
      want.push_back(FloatBits(from[i]));
      got.push_back(FloatBits(ordered[i]));
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    ASSERT_EQ(want, got) << "chunk at " << c;
  }
}

TEST_P(StorageTest, LoadStoredPairMatchesStoreInPairOrder) {
  constexpr size_t kN = 65536;
  auto bf16 = hwy::AllocateAligned<hwy::bfloat16_t>(kN);
  auto f16 = hwy::AllocateAligned<hwy::float16_t>(kN);
  for (size_t i = 0; i < kN; ++i) {
    // Every pattern, in an order that puts unlike values side by side.
    const uint16_t bits = static_cast<uint16_t>(i * 40503u);
    bf16[i].bits = bits;
    f16[i].bits = bits;
  }
  ExpectPairs(HWY_DYNAMIC_DISPATCH(PairsBF16T), bf16.get(), kN);
  ExpectPairs(HWY_DYNAMIC_DISPATCH(PairsF16T), f16.get(), kN);
  auto i8 = hwy::AllocateAligned<int8_t>(256);
  for (size_t i = 0; i < 256; ++i) i8[i] = static_cast<int8_t>(i * 37u);
  ExpectPairs(HWY_DYNAMIC_DISPATCH(PairsI8T), i8.get(), 256);
  auto f32 = hwy::AllocateAligned<float>(1024);
  SplitMix64 rng(6);
  for (size_t i = 0; i < 1024; ++i) {
    f32[i] = BitsFloat(static_cast<uint32_t>(rng.Next()));
  }
  ExpectPairs(HWY_DYNAMIC_DISPATCH(PairsF32T), f32.get(), 1024);
}

// StoreRowVec(src [n]) with T's exported entry point, against StoreRow:
// the same bytes and scale (NaN scales: both NaN), nothing written past n.
template <class T, class Fn>
void ExpectStoreRowVec(Fn store, const std::vector<float>& src, size_t offset,
                       const char* what) {
  const size_t n = src.size();
  std::vector<T> want(n);
  float want_scale = -1.0f;
  headway::internal::StoreRow(src.data(), n, want.data(), &want_scale);
  // dst `offset` elements into its buffer, a sentinel after it.
  std::vector<unsigned char> buffer((offset + n + 4) * sizeof(T), 0xA5);
  T* dst = reinterpret_cast<T*>(buffer.data()) + offset;
  float scale = -1.0f;
  store(src.data(), n, dst, &scale);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(dst + i, &want[i], sizeof(T)), 0)
        << what << ", n " << n << ", element " << i << " of "
        << FloatBits(src[i]);
  }
  for (size_t b = (offset + n) * sizeof(T); b < buffer.size(); ++b) {
    ASSERT_EQ(buffer[b], 0xA5) << what << ": written past n " << n;
  }
  if (headway::internal::kKvScaled<T>) {
    ASSERT_TRUE(FloatBits(scale) == FloatBits(want_scale) ||
                (std::isnan(scale) && std::isnan(want_scale)))
        << what << ", n " << n << ": " << scale << " != " << want_scale;
  }
}

// Rows of every length up to 5 vectors of AVX-512, from misaligned sources
// and into misaligned rows: random bit patterns (every exponent, NaN, inf,
// subnormals), the edge floats, and for int8 rows of every magnitude plus
// the documented special rows.
TEST_P(StorageTest, StoreRowVecEqualsStoreRow) {
  const auto store_f32 = HWY_DYNAMIC_DISPATCH(StoreF32T);
  const auto store_bf16 = HWY_DYNAMIC_DISPATCH(StoreBF16T);
  const auto store_f16 = HWY_DYNAMIC_DISPATCH(StoreF16T);
  const auto store_i8 = HWY_DYNAMIC_DISPATCH(StoreI8T);
  SplitMix64 rng(6);
  const std::vector<float> edges = EdgeFloats();
  for (size_t n = 1; n <= 80; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> bits(n + 3);
      for (float& x : bits) {
        x = trial % 4 == 0 ? edges[rng.Next() % edges.size()]
                           : BitsFloat(static_cast<uint32_t>(rng.Next()));
      }
      const std::vector<float> src(bits.begin() + trial % 4,
                                   bits.begin() + trial % 4 + n);
      const size_t offset = trial % 3;
      ExpectStoreRowVec<float>(store_f32, src, offset, "float32");
      ExpectStoreRowVec<hwy::bfloat16_t>(store_bf16, src, offset, "bf16");
      ExpectStoreRowVec<hwy::float16_t>(store_f16, src, offset, "f16");
      ExpectStoreRowVec<int8_t>(store_i8, src, offset, "int8 bits");

      // int8: finite rows of one magnitude.
      std::vector<float> row(n);
      const float magnitude =
          std::ldexp(1.0f, static_cast<int>(rng.Next() % 250) - 125);
      for (float& x : row) x = magnitude * rng.Uniform(-1.0f, 1.0f);
      ExpectStoreRowVec<int8_t>(store_i8, row, offset, "int8 random");
      ExpectStoreRowVec<hwy::float16_t>(store_f16, row, offset, "f16 random");
    }
    // Special int8 rows, the special element at every position class.
    const size_t at = n / 2;
    std::vector<float> row(n, 0.0f);
    ExpectStoreRowVec<int8_t>(store_i8, row, 1, "int8 zero");
    for (const float special : {kNaN, kInf, -kInf, FLT_MAX, -FLT_MAX,
                                0x1.0p-140f, 127.0f * FLT_MIN}) {
      for (size_t i = 0; i < n; ++i) row[i] = 0.25f * static_cast<float>(i % 5);
      row[at] = special;
      ExpectStoreRowVec<int8_t>(store_i8, row, 2, "int8 special");
      for (size_t i = 0; i < n; ++i) row[i] *= 1e-38f;
      row[at] = special;
      ExpectStoreRowVec<int8_t>(store_i8, row, 0, "int8 special tiny");
    }
    // Quotients just under a half and exact ties: max 127 gives scale 1.
    for (size_t i = 0; i < n; ++i) {
      row[i] = i % 3 == 0 ? 0.49999997f : (i % 3 == 1 ? 2.5f : -0.5f);
    }
    row[0] = 127.0f;
    ExpectStoreRowVec<int8_t>(store_i8, row, 0, "int8 ties");
  }
}

HEADWAY_INSTANTIATE_TARGET_TEST(StorageTest);

}  // namespace
}  // namespace test
}  // namespace headway
#endif  // HWY_ONCE

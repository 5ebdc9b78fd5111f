// Deterministic test data: the same seed gives the same floats with every
// compiler, standard library and CPU (splitmix64 and IEEE double arithmetic
// only; std::uniform_real_distribution differs between libstdc++ and libc++),
// plus the tail sizes that a SIMD kernel must survive.
#ifndef HEADWAY_TEST_SUPPORT_RANDOM_H_
#define HEADWAY_TEST_SUPPORT_RANDOM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace headway {
namespace test {

// splitmix64 (Steele, Lea, Flood 2014): a full-period 64-bit generator, any
// seed (0 included).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  // The next 64 random bits.
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [lo, hi] (hi itself only through float rounding). Requires lo <
  // hi.
  float Uniform(float lo, float hi) {
    // 53 random bits give a double in [0, 1); its rounding to float is IEEE, so
    // portable.
    const double unit = static_cast<double>(Next() >> 11) * 0x1.0p-53;
    return static_cast<float>(lo + (static_cast<double>(hi) - lo) * unit);
  }

 private:
  uint64_t state_;
};

namespace internal {

inline void CheckRange(float lo, float hi) {
  // lo < hi also rejects NaN, and lo == hi == 0, which would make all-zero
  // data.
  if (!(lo < hi)) {
    std::fprintf(stderr, "headway test: random range [%g, %g] is empty\n",
                 static_cast<double>(lo), static_cast<double>(hi));
    std::abort();
  }
}

}  // namespace internal

// Fills data[0, n) with uniform floats in [lo, hi], a fixed function of seed.
// Requires lo < hi.
inline void FillRandom(float* data, size_t n, uint64_t seed, float lo = -1.0f,
                       float hi = 1.0f) {
  internal::CheckRange(lo, hi);
  SplitMix64 rng(seed);
  for (size_t i = 0; i < n; ++i) data[i] = rng.Uniform(lo, hi);
}

// n uniform floats in [lo, hi], the same as FillRandom.
inline std::vector<float> RandomVector(size_t n, uint64_t seed,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  FillRandom(v.data(), n, seed, lo, hi);
  return v;
}

// Fills a strided view: element (r, c) = data[r * stride + c] gets the (r *
// cols + c)-th value of RandomVector(rows * cols, seed, lo, hi), so the logical
// matrix does not depend on stride. The padding between rows (columns cols ..
// stride-1 of every row but the last) gets quiet NaN, so a kernel that reads or
// sums padding produces NaN and fails its test. Nothing after the last row's
// last element is written: data needs (rows - 1) * stride + cols elements.
inline void FillRandomMatrix(float* data, int64_t rows, int64_t cols,
                             int64_t stride, uint64_t seed, float lo = -1.0f,
                             float hi = 1.0f) {
  internal::CheckRange(lo, hi);
  SplitMix64 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = data + r * stride;
    for (int64_t c = 0; c < cols; ++c) row[c] = rng.Uniform(lo, hi);
    if (r + 1 < rows) {
      std::fill(row + cols, row + stride,
                std::numeric_limits<float>::quiet_NaN());
    }
  }
}

// Sizes where SIMD loops break: around 1, 2 and 4 vectors of `lanes` (tails,
// exact multiples, one more) and odd primes that are no multiple of any vector
// size. Sorted, unique, clipped to [1, max_size] (empty when max_size is 0).
// lanes 0 is taken as 1.
inline std::vector<size_t> TailSizes(size_t lanes, size_t max_size) {
  const size_t l = std::max<size_t>(lanes, 1);
  std::vector<size_t> sizes = {1,     2,         3,     l - 1,     l,
                               l + 1, 2 * l - 1, 2 * l, 2 * l + 1, 4 * l - 1,
                               4 * l, 4 * l + 1, 17,    31,        61,
                               127,   251,       509,   1021};
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(),
                             [max_size](size_t size) {
                               return size < 1 || size > max_size;
                             }),
              sizes.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_RANDOM_H_

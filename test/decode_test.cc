// Decode tile kernels (lib/attention/decode.h): ScoreRows and
// AccumulateRows for every stored type, on every target, against float64 sums
// over the dequantized stored rows; ScoreRowPair and AccumulateRowPair
// (float32) against ScoreRows and AccumulateRows on each of their two heads,
// bit for bit.
//
// Tolerances (u = 2^-24), the worst case of float32 summation in any order,
// which is the same bound on every target:
// - a score sums dim products in float32 (FMA: each product enters its sum
//   unrounded) and is multiplied by the int8 scale once: its error is at most
//   (dim + 1) u sum_p |q_p K_p scale|;
// - an output element adds n products to o in float32 in key order, each
//   weight rounded once when multiplied by the int8 scale: at most
//   (n + 2) u (|o| + sum_s |w_s scale_s V_s|).
//
// Shapes: every stored type, rows 1..8 and lanes - 1, n around the vector
// length and the 128-key block, dim 16..144 (multiples of 16, as the cache's
// row_stride; for the scores also kMaxPairOrderDim and 16 past it, and
// kMaxInt8ProductDim and 16 past it for int8 products; for the sums also 16
// vectors, one pass of kOneRowWide on AVX-512), rows strided past dim
// (NaN or garbage in the padding), score rows strided as NarrowTile's (the key
// block rounded up to vectors), and the K and V buffers ending at a guard page.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "headway/targets.h"
#include "hwy/aligned_allocator.h"
#include "lib/core/storage.h"
#include "test/support/guard_page.h"
#include "test/support/random.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test/decode_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "lib/attention/decode.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;

constexpr double kU = 1.0 / (1 << 24);

// Stored rows of one operand (K or V): n rows of `stride` elements against a
// guard page (the last row's dim-th element is the first inaccessible byte),
// the padding past dim a NaN (int8: -128, a value no row stores), and the row
// values as float64 (dequantized: scale included).
template <class T>
struct StoredRows {
  StoredRows(size_t n, size_t dim, size_t stride, bool scaled, uint64_t seed)
      : bytes(((n - 1) * stride + dim) * sizeof(T), test::GuardSide::kAfter,
              16 * sizeof(T)),
        values(n * dim) {
    T* data = rows();
    test::SplitMix64 rng(seed);
    if (scaled) scales.resize(n);
    std::vector<float> row(dim);
    for (size_t s = 0; s < n; ++s) {
      for (size_t p = 0; p < dim; ++p) row[p] = rng.Uniform(-1.0f, 1.0f);
      float scale = 1.0f;
      internal::StoreRow(row.data(), dim, data + s * stride, &scale);
      if (scaled) scales[s] = scale;
      for (size_t p = 0; p < dim; ++p) {
        values[s * dim + p] = static_cast<double>(scaled ? scale : 1.0f) *
                              internal::FloatFrom(data[s * stride + p]);
      }
      if (s + 1 < n) {
        for (size_t p = dim; p < stride; ++p) data[s * stride + p] = Padding();
      }
    }
  }
  T* rows() { return static_cast<T*>(bytes.data()); }
  const float* scale_data() const {
    return scales.empty() ? nullptr : scales.data();
  }
  static T Padding() {
    if constexpr (internal::kKvScaled<T>) {
      return static_cast<T>(-128);
    } else {
      return internal::StoredFrom(std::numeric_limits<float>::quiet_NaN(), T{});
    }
  }

  test::GuardedBytes bytes;
  std::vector<float> scales;   // [n], int8 only
  std::vector<double> values;  // [n, dim]
};

size_t RoundUpTo(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Rows 1..8 and lanes - 1 (the most a narrow tile has).
std::vector<size_t> RowCounts(size_t lanes) {
  std::vector<size_t> rows = {1, 2, 3, 4, 5, 6, 7, 8};
  if (lanes - 1 > 8) rows.push_back(lanes - 1);
  return rows;
}

std::vector<size_t> KeyCounts(size_t lanes) {
  std::vector<size_t> n = {1, 2, 3, 127, 128, 129};
  for (size_t x : {lanes - 1, lanes, lanes + 1}) {
    if (x != 0 && std::find(n.begin(), n.end(), x) == n.end()) n.push_back(x);
  }
  return n;
}

constexpr size_t kDims[] = {16, 32, 80, 128, 144};

// Appends the dims of kUnrolledDims that dims lacks (one-row scores).
void AddUnrolledDims(std::vector<size_t>* dims) {
  for (size_t dim : kUnrolledDims) {
    if (std::find(dims->begin(), dims->end(), dim) == dims->end()) {
      dims->push_back(dim);
    }
  }
}

// The score rows' stride as NarrowTile has it: the 128-key block rounded up to
// vectors (n > 128 here only to test the key tail: the stride grows with it).
size_t ScoreStride(size_t n, size_t lanes) {
  return RoundUpTo(std::max<size_t>(n, 128), lanes);
}

// What a check runs: ScoreRows / AccumulateRows, or on a bf16 cache their
// bf16-products forms (ScoreRowsBF16, AccumulateRowsBF16) with q or w rounded
// to bf16 first, the fallback or vdpbf16ps (on the targets that have it; the
// others run the fallback either way). The bound is the same for all: the
// products of bf16 values are exact, and vdpbf16ps rounds once per addition.
// kInt8: ScoreRowsInt8 on an int8 cache with q of int8 levels, whose scores
// are exact: the integer dot product times the key's scale, rounded once; and
// AccumulateRowsInt8, against the quantization rule written out here
// (Int8WeightLevels).
enum class Products { kStored, kBF16Fallback, kBF16Native, kInt8 };

// x[0, n) replaced by its bf16 roundings, as the callers of the bf16-products
// kernels do.
void RoundToBF16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    x[i] = internal::FloatFromBF16(internal::BF16FromFloat(x[i]));
  }
}

template <class T>
void CheckScoreRows(size_t rows, size_t n, size_t dim, bool with_v,
                    uint64_t seed, Products products = Products::kStored) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const bool scaled = internal::kKvScaled<T>;
  // Strides past dim, multiples of 16 elements (alignment of every target).
  const size_t k_stride = dim + 16 * (1 + seed % 2);
  const size_t q_stride = dim + 16;
  StoredRows<T> keys(n, dim, k_stride, scaled, seed);
  StoredRows<T> values(n, dim, k_stride + 16, scaled, seed + 1);
  auto q = hwy::AllocateAligned<float>(rows * q_stride);
  test::FillRandomMatrix(q.get(), static_cast<int64_t>(rows),
                         static_cast<int64_t>(dim),
                         static_cast<int64_t>(q_stride), seed + 2);
  const size_t sc_stride = ScoreStride(n, lanes);
  const float kSentinel = 12345.0f;
  std::vector<float> sc(rows * sc_stride, kSentinel);

  if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
    if (products != Products::kStored) {
      RoundToBF16(q.get(), rows * q_stride);
      ScoreRowsBF16(q.get(), q_stride, rows, keys.rows(), k_stride, n, dim,
                    with_v ? values.rows() : nullptr, k_stride + 16, sc.data(),
                    sc_stride, products == Products::kBF16Native);
    }
  }
  if constexpr (hwy::IsSame<T, int8_t>()) {
    if (products == Products::kInt8) {
      // Levels in [-127, 127], the ends included.
      test::SplitMix64 rng(seed + 3);
      for (size_t i = 0; i < rows * q_stride; ++i) {
        q[i] = std::nearbyint(rng.Uniform(-127.4f, 127.4f));
      }
      ScoreRowsInt8(q.get(), q_stride, rows, keys.rows(), k_stride,
                    keys.scale_data(), n, dim, with_v ? values.rows() : nullptr,
                    k_stride + 16, sc.data(), sc_stride);
    }
  }
  if (products == Products::kStored) {
    ScoreRows(q.get(), q_stride, rows, keys.rows(), k_stride, keys.scale_data(),
              n, dim, with_v ? values.rows() : nullptr, k_stride + 16,
              sc.data(), sc_stride);
  }

  for (size_t r = 0; r < rows; ++r) {
    for (size_t s = 0; s < sc_stride; ++s) {
      const float got = sc[r * sc_stride + s];
      if (s >= n) {
        ASSERT_EQ(got, kSentinel) << "wrote past n: r=" << r << " s=" << s;
        continue;
      }
      if constexpr (hwy::IsSame<T, int8_t>()) {
        if (products == Products::kInt8) {
          int64_t dot = 0;
          for (size_t p = 0; p < dim; ++p) {
            dot += static_cast<int64_t>(q[r * q_stride + p]) *
                   keys.rows()[s * k_stride + p];
          }
          const float exact = static_cast<float>(dot) * keys.scales[s];
          ASSERT_EQ(got, exact) << "rows=" << rows << " n=" << n
                                << " dim=" << dim << " r=" << r << " s=" << s;
          continue;
        }
      }
      double want = 0.0, magnitude = 0.0;
      for (size_t p = 0; p < dim; ++p) {
        const double term =
            static_cast<double>(q[r * q_stride + p]) * keys.values[s * dim + p];
        want += term;
        magnitude += std::fabs(term);
      }
      const double tol = static_cast<double>(dim + 1) * kU * magnitude;
      ASSERT_LE(std::fabs(got - want), tol)
          << "rows=" << rows << " n=" << n << " dim=" << dim << " r=" << r
          << " s=" << s << " want " << want << " got " << got;
    }
  }
}

// AccumulateRowsInt8's rule for one row's weights x of a chunk of keys (x
// already times the V scales): levels round(x / sigma), sigma = 2^(E - 13)
// for the largest x = m 2^E (1 <= m < 2), at least 2^-126.
double Int8WeightLevels(const float* x, size_t n, std::vector<double>* levels) {
  const float x_max = *std::max_element(x, x + n);
  int e = 0;
  std::frexp(x_max, &e);  // x_max = f 2^e, 1/2 <= f < 1: E = e - 1
  const double sigma = std::ldexp(1.0, std::max(e - 1, -113) - 13);
  levels->resize(n);
  for (size_t s = 0; s < n; ++s) (*levels)[s] = std::nearbyint(x[s] / sigma);
  return sigma;
}

template <class T>
void CheckAccumulateRows(size_t rows, size_t n, size_t dim, uint64_t seed,
                         Products products = Products::kStored) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const bool scaled = internal::kKvScaled<T>;
  const size_t v_stride = dim + 16 * (1 + seed % 2);
  const size_t o_stride = dim + 16;
  StoredRows<T> values(n, dim, v_stride, scaled, seed);
  const size_t w_stride = ScoreStride(n, lanes);
  std::vector<float> w(rows * w_stride);
  test::FillRandomMatrix(w.data(), static_cast<int64_t>(rows),
                         static_cast<int64_t>(n),
                         static_cast<int64_t>(w_stride), seed + 1, 0.0f, 1.0f);
  auto o = hwy::AllocateAligned<float>(rows * o_stride);
  const float kSentinel = 12345.0f;
  test::FillRandom(o.get(), rows * o_stride, seed + 2);
  for (size_t r = 0; r < rows; ++r) {
    std::fill(o.get() + r * o_stride + dim, o.get() + (r + 1) * o_stride,
              kSentinel);
  }
  const std::vector<float> o0(o.get(), o.get() + rows * o_stride);

  // Odd seeds prefetch "next" rows (here V's own, one fewer than n: the count
  // of a shorter last block), which must not change a result.
  const bool next = seed % 2 == 1;
  if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
    if (products != Products::kStored) {
      RoundToBF16(w.data(), w.size());
      AccumulateRowsBF16(w.data(), w_stride, rows, values.rows(), v_stride, n,
                         dim, o.get(), o_stride, next ? values.rows() : nullptr,
                         v_stride, next ? n - 1 : 0,
                         products == Products::kBF16Native);
    }
  }
  // int8: o[r, p] as AccumulateRowsInt8 leaves it, chunk by chunk (sigma
  // times the exact integer sum, rounded once, added to o), and what it adds
  // in float64.
  std::vector<float> o_int8;
  std::vector<double> added, added_abs;
  if constexpr (hwy::IsSame<T, int8_t>()) {
    if (products == Products::kInt8) {
      // Rows of tiny weights (sigma's floor) and a chunk of zeros (levels 0).
      for (size_t r = 1; r < rows; r += 3) {
        for (size_t s = 0; s < n; ++s) {
          w[r * w_stride + s] = std::ldexp(w[r * w_stride + s], -120);
        }
      }
      for (size_t r = 2; r < rows; r += 3) {
        std::fill(w.begin() + r * w_stride,
                  w.begin() + r * w_stride + std::min<size_t>(n, 128), 0.0f);
      }
      o_int8.assign(o0.begin(), o0.end());
      added.assign(rows * dim, 0.0);
      added_abs.assign(rows * dim, 0.0);
      std::vector<float> x;
      std::vector<double> levels;
      for (size_t r = 0; r < rows; ++r) {
        for (size_t s0 = 0; s0 < n; s0 += 128) {
          const size_t keys = std::min<size_t>(128, n - s0);
          x.resize(keys);
          for (size_t s = 0; s < keys; ++s) {
            x[s] = w[r * w_stride + s0 + s] * values.scales[s0 + s];
          }
          const double sigma = Int8WeightLevels(x.data(), keys, &levels);
          for (size_t p = 0; p < dim; ++p) {
            int64_t sum = 0;
            for (size_t s = 0; s < keys; ++s) {
              sum += static_cast<int64_t>(levels[s]) *
                     values.rows()[(s0 + s) * v_stride + p];
            }
            const float chunk =
                static_cast<float>(static_cast<float>(sum) * sigma);
            o_int8[r * o_stride + p] += chunk;
            added[r * dim + p] += static_cast<double>(sum) * sigma;
            double magnitude = 0.0;
            for (size_t s = 0; s < keys; ++s) {
              magnitude += std::fabs(levels[s] * sigma *
                                     values.rows()[(s0 + s) * v_stride + p]);
            }
            added_abs[r * dim + p] += magnitude;
          }
        }
      }
      AccumulateRowsInt8(w.data(), w_stride, rows, values.rows(), v_stride,
                         values.scale_data(), n, dim, o.get(), o_stride,
                         next ? values.rows() : nullptr, v_stride,
                         next ? n - 1 : 0);
    }
  }
  if (products == Products::kStored) {
    AccumulateRows(w.data(), w_stride, rows, values.rows(), v_stride,
                   values.scale_data(), n, dim, o.get(), o_stride,
                   next ? values.rows() : nullptr, v_stride, next ? n - 1 : 0);
  }

  for (size_t r = 0; r < rows; ++r) {
    for (size_t p = 0; p < o_stride; ++p) {
      const float got = o[r * o_stride + p];
      if (p >= dim) {
        ASSERT_EQ(got, kSentinel) << "wrote past dim: r=" << r << " p=" << p;
        continue;
      }
      if (!o_int8.empty()) {
        // vpdpwssd's sums are exact: the same bits as the rule's.
        if (HWY_TARGET == HWY_AVX3_DL) {
          ASSERT_EQ(got, o_int8[r * o_stride + p])
              << "rows=" << rows << " n=" << n << " dim=" << dim << " r=" << r
              << " p=" << p;
        }
        const double want = o0[r * o_stride + p] + added[r * dim + p];
        const double tol =
            static_cast<double>(n + 2) * kU *
            (std::fabs(o0[r * o_stride + p]) + added_abs[r * dim + p]);
        ASSERT_LE(std::fabs(got - want), tol)
            << "rows=" << rows << " n=" << n << " dim=" << dim << " r=" << r
            << " p=" << p << " want " << want << " got " << got;
        continue;
      }
      double want = o0[r * o_stride + p];
      double magnitude = std::fabs(want);
      for (size_t s = 0; s < n; ++s) {
        const double term = static_cast<double>(w[r * w_stride + s]) *
                            values.values[s * dim + p];
        want += term;
        magnitude += std::fabs(term);
      }
      const double tol = static_cast<double>(n + 2) * kU * magnitude;
      ASSERT_LE(std::fabs(got - want), tol)
          << "rows=" << rows << " n=" << n << " dim=" << dim << " r=" << r
          << " p=" << p << " want " << want << " got " << got;
    }
  }
}

template <class T>
void SweepScoreRows(Products products = Products::kStored) {
  const size_t lanes = hn::Lanes(hn::ScalableTag<float>());
  uint64_t seed = 1;
  std::vector<size_t> dims(std::begin(kDims), std::end(kDims));
  // int8 products: the longest native dim, and one past it (the fallback).
  if (products == Products::kInt8) {
    for (size_t dim : {kMaxInt8ProductDim, kMaxInt8ProductDim + 16}) {
      dims.push_back(dim);
    }
  }
  // One row: the longest q in pair order, and one past it (natural order);
  // the dims whose loop is unrolled.
  if (products == Products::kStored) {
    for (size_t dim : {kMaxPairOrderDim, kMaxPairOrderDim + 16}) {
      dims.push_back(dim);
    }
    AddUnrolledDims(&dims);
  }
  for (size_t dim : dims) {
    for (size_t rows : RowCounts(lanes)) {
      for (size_t n : KeyCounts(lanes)) {
        CheckScoreRows<T>(rows, n, dim, /*with_v=*/seed % 2 == 0, seed,
                          products);
        if (::testing::Test::HasFatalFailure()) return;
        seed += 3;
      }
    }
  }
}

template <class T>
void SweepAccumulateRows(Products products = Products::kStored) {
  const size_t lanes = hn::Lanes(hn::ScalableTag<float>());
  uint64_t seed = 100;
  std::vector<size_t> counts = KeyCounts(lanes);
  // Past the native sums' 128-key weight chunks, odd and even.
  if (products != Products::kStored) {
    for (size_t n : {255, 258}) counts.push_back(n);
  }
  std::vector<size_t> dims(std::begin(kDims), std::end(kDims));
  // One row of 16 vectors in one pass of 16 sums (kOneRowWide on AVX-512).
  if (products == Products::kStored &&
      std::find(dims.begin(), dims.end(), 16 * lanes) == dims.end()) {
    dims.push_back(16 * lanes);
  }
  for (size_t dim : dims) {
    for (size_t rows : RowCounts(lanes)) {
      for (size_t n : counts) {
        CheckAccumulateRows<T>(rows, n, dim, seed, products);
        if (::testing::Test::HasFatalFailure()) return;
        seed += 3;
      }
    }
  }
}

// The pair kernels (float32 only) on two heads (each its own K and V rows
// against a guard page, q, scores, o) give bit for bit what ScoreRows and
// AccumulateRows with one row give on each head, and write nothing past n or
// dim.
void CheckRowPair(size_t n, size_t dim, uint64_t seed) {
  const size_t lanes = hn::Lanes(hn::ScalableTag<float>());
  const size_t stride = dim + 16 * (1 + seed % 2);
  const size_t sc_stride = ScoreStride(n, lanes);
  const size_t o_stride = dim + 16;
  const float kSentinel = 12345.0f;
  std::vector<StoredRows<float>> keys, values;
  hwy::AlignedFreeUniquePtr<float[]> q[2], o[2], o_single[2];
  std::vector<float> sc[2], sc_single[2], w[2];
  for (size_t h = 0; h < 2; ++h) {
    keys.emplace_back(n, dim, stride, false, seed + 10 * h);
    values.emplace_back(n, dim, stride, false, seed + 10 * h + 1);
    q[h] = hwy::AllocateAligned<float>(dim);
    test::FillRandom(q[h].get(), dim, seed + 10 * h + 2);
    sc[h].assign(sc_stride, kSentinel);
    sc_single[h].assign(sc_stride, kSentinel);
    w[h].resize(n);
    test::FillRandom(w[h].data(), n, seed + 10 * h + 3, 0.0f, 1.0f);
    o[h] = hwy::AllocateAligned<float>(o_stride);
    o_single[h] = hwy::AllocateAligned<float>(o_stride);
    test::FillRandom(o[h].get(), dim, seed + 10 * h + 4);
    std::fill(o[h].get() + dim, o[h].get() + o_stride, kSentinel);
    std::copy(o[h].get(), o[h].get() + o_stride, o_single[h].get());
  }
  const float* const qs[2] = {q[0].get(), q[1].get()};
  const float* const ks[2] = {keys[0].rows(), keys[1].rows()};
  const float* const vs[2] = {values[0].rows(), values[1].rows()};
  float* const scs[2] = {sc[0].data(), sc[1].data()};
  const float* const ws[2] = {w[0].data(), w[1].data()};
  float* const os[2] = {o[0].get(), o[1].get()};
  ScoreRowPair(qs, ks, stride, n, dim, scs);
  AccumulateRowPair(ws, vs, stride, n, dim, os);
  for (size_t h = 0; h < 2; ++h) {
    ScoreRows(qs[h], dim, 1, ks[h], stride, nullptr, n, dim,
              static_cast<const float*>(nullptr), 0, sc_single[h].data(),
              sc_stride);
    AccumulateRows(ws[h], n, 1, vs[h], stride, nullptr, n, dim,
                   o_single[h].get(), o_stride,
                   static_cast<const float*>(nullptr), 0, 0);
    for (size_t s = 0; s < sc_stride; ++s) {
      ASSERT_EQ(sc[h][s], sc_single[h][s])
          << "score: h=" << h << " n=" << n << " dim=" << dim << " s=" << s;
    }
    for (size_t p = 0; p < o_stride; ++p) {
      ASSERT_EQ(o[h][p], o_single[h][p])
          << "output: h=" << h << " n=" << n << " dim=" << dim << " p=" << p;
    }
  }
}

void SweepRowPair() {
  const size_t lanes = hn::Lanes(hn::ScalableTag<float>());
  std::vector<size_t> counts = KeyCounts(lanes);
  // Past the pair tiles' 4 and 8 keys.
  for (size_t n : {5, 7, 9, 15, 17, 257}) counts.push_back(n);
  uint64_t seed = 500;
  std::vector<size_t> dims(std::begin(kDims), std::end(kDims));
  AddUnrolledDims(&dims);
  for (size_t dim : dims) {
    for (size_t n : counts) {
      CheckRowPair(n, dim, seed);
      if (::testing::Test::HasFatalFailure()) return;
      seed += 3;
    }
  }
}

}  // namespace

void TestScoreRowsFloat32() { SweepScoreRows<float>(); }
void TestScoreRowsBF16() { SweepScoreRows<hwy::bfloat16_t>(); }
void TestScoreRowsF16() { SweepScoreRows<hwy::float16_t>(); }
void TestScoreRowsInt8() { SweepScoreRows<int8_t>(); }
void TestAccumulateRowsFloat32() { SweepAccumulateRows<float>(); }
void TestAccumulateRowsBF16() { SweepAccumulateRows<hwy::bfloat16_t>(); }
void TestAccumulateRowsF16() { SweepAccumulateRows<hwy::float16_t>(); }
void TestAccumulateRowsInt8() { SweepAccumulateRows<int8_t>(); }
// The bf16-products kernels: the fallback on every target, vdpbf16ps where
// the CPU has it (the targets without it run the fallback again).
void TestScoreRowsBF16Products() {
  SweepScoreRows<hwy::bfloat16_t>(Products::kBF16Fallback);
  if (CpuHasNativeBFloat16()) {
    SweepScoreRows<hwy::bfloat16_t>(Products::kBF16Native);
  }
}
void TestAccumulateRowsBF16Products() {
  SweepAccumulateRows<hwy::bfloat16_t>(Products::kBF16Fallback);
  if (CpuHasNativeBFloat16()) {
    SweepAccumulateRows<hwy::bfloat16_t>(Products::kBF16Native);
  }
}
// The int8-products kernels: vpdpbusd and vpdpwssd on AVX3_DL, the float32
// fallbacks elsewhere: the same exact scores, and weighted sums of the same
// quantized weights (bit for bit on AVX3_DL, whose sums are exact).
void TestScoreRowsInt8Products() { SweepScoreRows<int8_t>(Products::kInt8); }
void TestAccumulateRowsInt8Products() {
  SweepAccumulateRows<int8_t>(Products::kInt8);
}
void TestRowPairFloat32() { SweepRowPair(); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headway {
namespace {

class DecodeTest : public hwy::TestWithParamTarget {};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(DecodeTest);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestScoreRowsFloat32);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestScoreRowsBF16);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestScoreRowsF16);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestScoreRowsInt8);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestAccumulateRowsFloat32);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestAccumulateRowsBF16);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestAccumulateRowsF16);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestAccumulateRowsInt8);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestScoreRowsBF16Products);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestAccumulateRowsBF16Products);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestScoreRowsInt8Products);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestAccumulateRowsInt8Products);
HWY_EXPORT_AND_TEST_P(DecodeTest, TestRowPairFloat32);

}  // namespace
}  // namespace headway
#endif  // HWY_ONCE

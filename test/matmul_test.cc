// Matmul tests: every target, against the float64 reference
// (test/support/reference.h), over the tile edges of the micro-kernel, every op
// combination, alpha/beta, strided, misaligned and guard-paged views,
// pre-packed B, thread counts and every argument error.
#include "headway/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/threads.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"
#include "test/support/guard_page.h"
#include "test/support/lanes.h"
#include "test/support/random.h"
#include "test/support/reference.h"
#include "test/support/status_matchers.h"
#include "test/support/target_test.h"

namespace headway {
namespace {

constexpr Transpose kOps[2] = {Transpose::kNo, Transpose::kYes};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// The micro-kernel tile of the active target (lib/matmul/matmul-inl.h): MR
// rows, NR = 2 vectors of columns (4 single floats on SCALAR), K blocks of at
// most 512.
struct Tile {
  int64_t lanes, mr, nr, kc;
};
Tile ActiveTile() {
  const int64_t lanes = static_cast<int64_t>(test::ActiveFloatLanes());
  if (lanes == 1) return {1, 4, 4, 512};
  if (lanes >= 16) return {lanes, 12, 2 * lanes, 512};
  return {lanes, 6, 2 * lanes, 512};
}

// Storage for op(x) [rows, cols] given as x [rows, cols] (kNo) or [cols, rows]
// (kYes), with row stride = stored cols + pad and `offset` floats before the
// data (misaligned views).
struct Operand {
  Operand(int64_t op_rows, int64_t op_cols, Transpose t, int64_t pad,
          int64_t offset, uint64_t seed)
      : rows(t == Transpose::kNo ? op_rows : op_cols),
        cols(t == Transpose::kNo ? op_cols : op_rows),
        stride(cols + pad),
        storage(static_cast<size_t>(offset + (rows - 1) * stride + cols)),
        data(storage.data() + offset) {
    test::FillRandomMatrix(data, rows, cols, stride, seed);
  }
  MatrixView<const float> view() const {
    return MatrixView<const float>(data, rows, cols, stride);
  }
  int64_t rows, cols, stride;
  std::vector<float> storage;
  float* data;
};

// The documented bound (include/headway/matmul.h), the same on every target:
// |c - exact| <= (K + K / 512 + 3) * 2^-24 * (|alpha| sum_k |a| |b| + |beta|
// |c_old|). Each element is a float32 dot product accumulated with one FMA (one
// rounding) per term in K blocks of at most 512, each block added to C with one
// more FMA (ceil(K / 512) <= K / 512 + 1 roundings), plus the rounding of beta
// * c_old and of the split accumulators' final sums (small tiles): at most K +
// K / 512 + 3 roundings, each at most 2^-24 relative to a partial sum that
// abs_c bounds (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1).
// The float64 reference is exact to ~1e-16 of abs_c, far below the bound.
double Tolerance(int64_t k, double abs_c) {
  const double kd = static_cast<double>(k);
  return (kd + kd / 512.0 + 3.0) * std::ldexp(1.0, -24) * abs_c +
         std::numeric_limits<float>::denorm_min();
}

// Runs Matmul on op(A) [m, k], op(B) [k, n] with the given ops and checks it
// against the reference. C has a row stride of n + c_pad with sentinels in the
// padding that must survive.
void CheckCase(int64_t m, int64_t n, int64_t k, Transpose ta, Transpose tb,
               float alpha, float beta, int64_t pad = 0, int64_t offset = 0,
               bool packed = false, uint64_t seed = 1) {
  SCOPED_TRACE(testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " ta="
               << static_cast<int>(ta) << " tb=" << static_cast<int>(tb)
               << " alpha=" << alpha << " beta=" << beta << " pad=" << pad
               << " offset=" << offset << " packed=" << packed);
  const Operand a(m, k, ta, pad, offset, seed * 3 + 1);
  const Operand b(k, n, tb, pad, offset, seed * 3 + 2);
  const int64_t ldc = n + pad;
  std::vector<float> c_storage(static_cast<size_t>(offset + m * ldc), -7.0f);
  float* c = c_storage.data() + offset;
  std::vector<double> ref(static_cast<size_t>(m * n)), abs_ref(ref.size());
  if (beta == 0.0f) {
    // Whatever C holds must not survive, NaN included.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = kNaN;
    }
  } else {
    test::FillRandomMatrix(c, m, n, ldc, seed * 3 + 3);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) ref[i * n + j] = c[i * ldc + j];
    }
  }
  // FillRandomMatrix put NaN in C's padding: make it a sentinel that must stay.
  for (int64_t i = 0; i + 1 < m; ++i) {
    for (int64_t j = n; j < ldc; ++j) c[i * ldc + j] = -7.0f;
  }
  test::ref::Matmul(m, n, k, alpha, a.data, a.stride, ta == Transpose::kYes,
                    b.data, b.stride, tb == Transpose::kYes, beta, ref.data(),
                    abs_ref.data());
  const MatrixView<float> c_view(c, m, n, ldc);
  if (packed) {
    PackedB packed_b;
    ASSERT_TRUE(PackedB::Pack(b.view(), tb, &packed_b).ok());
    const Status status = Matmul(a.view(), ta, packed_b, c_view, alpha, beta);
    ASSERT_TRUE(status.ok()) << status.ToString();
  } else {
    const Status status =
        Matmul(a.view(), ta, b.view(), tb, c_view, alpha, beta);
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i) {
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      const double got = c[i * ldc + j];
      const double want = ref[i * n + j];
      const double tol = Tolerance(k, abs_ref[i * n + j]);
      if (!(std::abs(got - want) <= tol)) {
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", want "
                      << want << " +- " << tol;
        ++failures;
      }
    }
    if (i + 1 < m) {
      for (int64_t j = n; j < ldc; ++j) {
        if (c[i * ldc + j] != -7.0f) {
          ADD_FAILURE() << "padding c[" << i << ", " << j << "] was written";
          ++failures;
        }
      }
    }
  }
  for (int64_t i = 0; i < offset; ++i) {
    EXPECT_EQ(c_storage[i], -7.0f) << "wrote before c";
  }
}

class MatmulTest : public test::TargetTest {};

// Each of M, N, K swept over the kernel's edges while the other two stay at
// sizes with edges of their own, for every op combination.
TEST_P(MatmulTest, TileEdges) {
  const Tile t = ActiveTile();
  const std::vector<int64_t> sizes = {
      1,        2,    3,        t.lanes - 1, t.lanes,  t.lanes + 1,
      t.mr - 1, t.mr, t.mr + 1, t.nr - 1,    t.nr + 1, 2 * t.mr + 1,
      17};
  for (Transpose ta : kOps) {
    for (Transpose tb : kOps) {
      for (int64_t s : sizes) {
        if (s < 1) continue;
        CheckCase(s, t.nr + 3, 19, ta, tb, 1.0f, 0.0f);
        CheckCase(t.mr + 2, s, 23, ta, tb, 1.0f, 0.0f);
        CheckCase(t.mr - 1, t.nr - 1, s, ta, tb, 1.0f, 0.0f);
      }
    }
  }
}

// K across the K-block boundary (KC = 512) and beyond, with M and N crossing
// their tiles.
TEST_P(MatmulTest, KBlocks) {
  const Tile t = ActiveTile();
  for (int64_t k : {t.kc - 1, t.kc, t.kc + 1, 2 * t.kc + 3, int64_t{1009}}) {
    CheckCase(t.mr + 1, t.nr + 1, k, Transpose::kNo, Transpose::kNo, 1.0f,
              0.0f);
    CheckCase(2 * t.mr - 1, 2 * t.nr - 3, k, Transpose::kYes, Transpose::kYes,
              -1.5f, 0.5f);
  }
}

// Sizes from the small-M (decode) path, M = 1..17, against wide B.
TEST_P(MatmulTest, SmallM) {
  const Tile t = ActiveTile();
  for (int64_t m = 1; m <= 17; ++m) {
    CheckCase(m, 5 * t.nr + 3, 300, Transpose::kNo, Transpose::kNo, 1.0f, 0.0f);
  }
  CheckCase(1, 1021, 509, Transpose::kNo, Transpose::kYes, 1.0f, 1.0f);
  CheckCase(16, 1021, 509, Transpose::kYes, Transpose::kNo, 2.0f, 0.0f);
}

// Larger primes: many tasks, every edge at once.
TEST_P(MatmulTest, Primes) {
  CheckCase(127, 251, 509, Transpose::kNo, Transpose::kNo, 1.0f, 0.0f);
  CheckCase(1009, 37, 61, Transpose::kNo, Transpose::kNo, 1.0f, 0.5f);
  CheckCase(97, 1009, 61, Transpose::kYes, Transpose::kNo, 1.0f, 0.0f);
  CheckCase(211, 61, 263, Transpose::kNo, Transpose::kYes, 1.0f, 0.0f);
}

TEST_P(MatmulTest, Random) {
  test::SplitMix64 rng(42);
  for (int i = 0; i < 12; ++i) {
    const int64_t m = 1 + static_cast<int64_t>(rng.Next() % 150);
    const int64_t n = 1 + static_cast<int64_t>(rng.Next() % 150);
    const int64_t k = 1 + static_cast<int64_t>(rng.Next() % 400);
    const Transpose ta = kOps[rng.Next() % 2], tb = kOps[rng.Next() % 2];
    const float alpha = rng.Uniform(-2.0f, 2.0f);
    const float beta = (rng.Next() % 2) ? 0.0f : rng.Uniform(-2.0f, 2.0f);
    CheckCase(
        m, n, k, ta, tb, alpha, beta, static_cast<int64_t>(rng.Next() % 3),
        static_cast<int64_t>(rng.Next() % 3), rng.Next() % 2 == 0, rng.Next());
  }
}

TEST_P(MatmulTest, AlphaBeta) {
  const Tile t = ActiveTile();
  const int64_t m = t.mr + 3, n = t.nr + 5, k = 37;
  const float cases[][2] = {{1, 0}, {2.5f, 0}, {1, 1}, {-0.5f, 0.75f}, {1, -1}};
  for (const auto& ab : cases) {
    for (Transpose ta : kOps) {
      for (Transpose tb : kOps) CheckCase(m, n, k, ta, tb, ab[0], ab[1]);
    }
  }
}

// alpha == 0 reads neither A nor B (BLAS): NaN there does not reach C.
TEST_P(MatmulTest, AlphaZeroIgnoresInputs) {
  for (float beta : {0.0f, 0.5f}) {
    const int64_t m = 7, n = 9, k = 5;
    std::vector<float> a(m * k, kNaN), b(k * n, kNaN), c(m * n);
    test::FillRandom(c.data(), c.size(), 3);
    const std::vector<float> old = c;
    ASSERT_TRUE(Matmul(MatrixView<const float>(a.data(), m, k), Transpose::kNo,
                       MatrixView<const float>(b.data(), k, n), Transpose::kNo,
                       MatrixView<float>(c.data(), m, n), 0.0f, beta)
                    .ok());
    for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], beta * old[i]) << i;
  }
}

// Row strides longer than the rows (NaN padding that must not be read) and data
// that starts off vector alignment, packed and unpacked.
TEST_P(MatmulTest, StridedAndMisaligned) {
  const Tile t = ActiveTile();
  for (int64_t pad : {1, 3, 17}) {
    for (int64_t offset : {1, 3}) {
      for (Transpose ta : kOps) {
        for (Transpose tb : kOps) {
          for (bool packed : {false, true}) {
            CheckCase(2 * t.mr + 1, 2 * t.nr + 1, 45, ta, tb, 1.0f, 0.5f, pad,
                      offset, packed);
          }
        }
      }
    }
  }
}

// Views that end or start against a PROT_NONE page: a read or write past them
// crashes.
TEST_P(MatmulTest, GuardPages) {
  const Tile t = ActiveTile();
  for (test::GuardSide side :
       {test::GuardSide::kAfter, test::GuardSide::kBefore}) {
    for (int64_t m : {int64_t{1}, t.mr + 1}) {
      for (int64_t n : {int64_t{1}, t.lanes + 1, t.nr - 1}) {
        for (Transpose ta : kOps) {
          for (Transpose tb : kOps) {
            const int64_t k = 13;
            test::GuardedBuffer<float> a(static_cast<size_t>(m * k), side);
            test::GuardedBuffer<float> b(static_cast<size_t>(k * n), side);
            test::GuardedBuffer<float> c(static_cast<size_t>(m * n), side);
            test::FillRandom(a.data(), a.size(), 1);
            test::FillRandom(b.data(), b.size(), 2);
            test::FillRandom(c.data(), c.size(), 3);
            const int64_t a_cols = ta == Transpose::kNo ? k : m;
            const int64_t b_cols = tb == Transpose::kNo ? n : k;
            const MatrixView<const float> av(a.data(), m * k / a_cols, a_cols);
            const MatrixView<const float> bv(b.data(), k * n / b_cols, b_cols);
            const MatrixView<float> cv(c.data(), m, n);
            ASSERT_TRUE(Matmul(av, ta, bv, tb, cv, 1.0f, 1.0f).ok());
            PackedB packed;
            ASSERT_TRUE(PackedB::Pack(bv, tb, &packed).ok());
            ASSERT_TRUE(Matmul(av, ta, packed, cv, 1.0f, 0.0f).ok());
          }
        }
      }
    }
  }
}

// Multiplies with fresh C buffers, returns C.
std::vector<float> RunMatmul(const Operand& a, Transpose ta, const Operand& b,
                             Transpose tb, int64_t m, int64_t n,
                             const PackedB* packed, float beta,
                             MatmulCompute compute = MatmulCompute::kFloat32) {
  std::vector<float> c(static_cast<size_t>(m * n));
  test::FillRandom(c.data(), c.size(), 77);
  const MatrixView<float> cv(c.data(), m, n);
  const Status status =
      packed != nullptr
          ? Matmul(a.view(), ta, *packed, cv, 0.75f, beta, compute)
          : Matmul(a.view(), ta, b.view(), tb, cv, 0.75f, beta);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return c;
}

bool BitIdentical(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Pre-packed B gives exactly the unpacked result.
TEST_P(MatmulTest, PackedEqualsUnpacked) {
  const Tile t = ActiveTile();
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& s : {Shape{1, 300, 700}, Shape{9, 77, 513},
                         Shape{3 * t.mr + 1, 3 * t.nr + 1, 2 * t.kc + 1}}) {
    for (Transpose ta : kOps) {
      for (Transpose tb : kOps) {
        const Operand a(s.m, s.k, ta, 1, 0, 11), b(s.k, s.n, tb, 2, 0, 12);
        PackedB packed;
        ASSERT_TRUE(PackedB::Pack(b.view(), tb, &packed).ok());
        EXPECT_EQ(packed.rows(), s.k);
        EXPECT_EQ(packed.cols(), s.n);
        EXPECT_EQ(packed.panel_width(), t.nr);
        EXPECT_EQ(packed.bytes(),
                  static_cast<size_t>(s.k * ((s.n + t.nr - 1) / t.nr) * t.nr) *
                      sizeof(float));
        EXPECT_STREQ(packed.target_name(), GetParam().name);
        for (float beta : {0.0f, 1.0f}) {
          EXPECT_TRUE(
              BitIdentical(RunMatmul(a, ta, b, tb, s.m, s.n, nullptr, beta),
                           RunMatmul(a, ta, b, tb, s.m, s.n, &packed, beta)))
              << s.m << "x" << s.n << "x" << s.k;
        }
      }
    }
  }
}

// PackColumns of parts side by side packs exactly what Pack of the whole
// matrix packs: parts that end inside a panel (straddled panels are gathered),
// parts that fill panels, several K blocks; the parts as column ranges of one
// strided, misaligned matrix and as separate buffers with their own strides.
TEST_P(MatmulTest, PackColumnsEqualsPack) {
  const Tile t = ActiveTile();
  const std::vector<std::vector<int64_t>> widths = {
      {1},
      {1, t.nr - 1, t.nr + 1},
      {t.nr, 2 * t.nr, t.nr},
      {3 * t.nr + 5, 7, 2, 1, t.nr},
      {13, 3 * t.nr, 29}};
  for (const int64_t k : {int64_t{1}, int64_t{5}, t.kc + 3}) {
    for (const std::vector<int64_t>& w : widths) {
      int64_t n = 0;
      for (int64_t cols : w) n += cols;
      // The whole matrix: stride n + 3, one float of offset.
      const Operand whole(k, n, Transpose::kNo, 3, 1, 41);
      PackedB want;
      ASSERT_TRUE(PackedB::Pack(whole.view(), Transpose::kNo, &want).ok());
      // Its column ranges, and copies of them with strides of their own.
      std::vector<MatrixView<const float>> ranges;
      std::vector<std::vector<float>> copies(w.size());
      std::vector<MatrixView<const float>> separate;
      int64_t j = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        ranges.emplace_back(whole.data + j, k, w[i], whole.stride);
        const int64_t stride = w[i] + static_cast<int64_t>(i);
        copies[i].assign(static_cast<size_t>(k * stride), kNaN);
        for (int64_t r = 0; r < k; ++r) {
          std::memcpy(&copies[i][static_cast<size_t>(r * stride)],
                      whole.data + r * whole.stride + j,
                      static_cast<size_t>(w[i]) * sizeof(float));
        }
        separate.emplace_back(copies[i].data(), k, w[i], stride);
        j += w[i];
      }
      for (const auto* parts : {&ranges, &separate}) {
        PackedB got;
        ASSERT_TRUE(PackedB::PackColumns(parts->data(),
                                         static_cast<int64_t>(parts->size()),
                                         &got)
                        .ok());
        EXPECT_EQ(got.rows(), k);
        EXPECT_EQ(got.cols(), n);
        ASSERT_EQ(got.bytes(), want.bytes());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0)
            << "k " << k << ", " << w.size() << " parts";
      }
    }
  }
}

// 1, 2 and 7 threads give bit-identical results (work split over M and N
// only). 1100 rows are several row blocks on one thread too (up to 86 strips
// each: kMatmulMCOneThread).
TEST_P(MatmulTest, ThreadCountInvariant) {
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& s : {Shape{1, 1000, 600}, Shape{13, 517, 300},
                         Shape{301, 263, 700}, Shape{1100, 70, 90}}) {
    const Operand a(s.m, s.k, Transpose::kNo, 0, 0, 21);
    const Operand b(s.k, s.n, Transpose::kYes, 0, 0, 22);
    PackedB packed;
    ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kYes, &packed).ok());
    std::vector<float> results[3], packed_results[3];
    const int threads[3] = {1, 2, 7};
    for (int i = 0; i < 3; ++i) {
      tbb::task_arena arena(threads[i]);
      arena.execute([&] {
        results[i] = RunMatmul(a, Transpose::kNo, b, Transpose::kYes, s.m, s.n,
                               nullptr, 0.5f);
        packed_results[i] = RunMatmul(a, Transpose::kNo, b, Transpose::kYes,
                                      s.m, s.n, &packed, 0.5f);
      });
    }
    for (int i = 1; i < 3; ++i) {
      EXPECT_TRUE(BitIdentical(results[0], results[i]))
          << threads[i] << " threads";
      EXPECT_TRUE(BitIdentical(results[0], packed_results[i]))
          << threads[i] << " threads, packed";
    }
  }
}

// On one thread 1100 rows are 2 to 4 row blocks (kMatmulMCOneThread, 86
// strips: 1032 rows on AVX3, 516 on AVX2, 344 on SCALAR), which
// ThreadCountInvariant checks bit for bit against other thread counts: here
// against the float64 reference, both transposes of A, strided and misaligned.
TEST_P(MatmulTest, RowBlocksOnOneThread) {
  tbb::task_arena one(1);
  one.execute([&] {
    for (Transpose ta : kOps) {
      CheckCase(1100, 70, 90, ta, Transpose::kYes, 0.5f, 1.0f, /*pad=*/3,
                /*offset=*/1);
      CheckCase(1100, 37, 61, ta, Transpose::kNo, 1.0f, 0.0f, /*pad=*/0,
                /*offset=*/0, /*packed=*/true);
    }
  });
}

// A B whose packed form is larger than 4 MiB is packed during the call slice
// by slice: by each task into a window of its own where one task has all the
// rows (small M, or one thread), else into one copy that the tasks share.
// Against the reference, and bit-identical to pre-packed B on 1, 2 and 7
// threads.
TEST_P(MatmulTest, LargeB) {
  const Tile t = ActiveTile();
  const int64_t n = 1000, k = 1100;  // >= 1.1M floats packed
  CheckCase(5, n, k, Transpose::kNo, Transpose::kYes, 1.0f, 0.0f);
  CheckCase(2 * t.mr + 1, n, k, Transpose::kYes, Transpose::kNo, 0.5f, 1.0f,
            /*pad=*/1, /*offset=*/1);
  for (const int64_t m : {int64_t{5}, 2 * t.mr + 1}) {
    for (Transpose tb : kOps) {
      const Operand a(m, k, Transpose::kNo, 0, 0, 51);
      const Operand b(k, n, tb, 0, 0, 52);
      PackedB packed;
      ASSERT_TRUE(PackedB::Pack(b.view(), tb, &packed).ok());
      const std::vector<float> want =
          RunMatmul(a, Transpose::kNo, b, tb, m, n, &packed, 0.0f);
      for (const int threads : {1, 2, 7}) {
        tbb::task_arena arena(threads);
        std::vector<float> got;
        arena.execute([&] {
          got = RunMatmul(a, Transpose::kNo, b, tb, m, n, nullptr, 0.0f);
        });
        EXPECT_TRUE(BitIdentical(want, got))
            << "m " << m << ", " << threads << " threads";
      }
    }
  }
}

// Calls from inside the host's own parallel loop (nested parallelism): each
// call's per-thread buffers stay its own. A worker may run tasks of several
// calls in turn; B, packed by each thread into a buffer of its own, is then
// packed again for each call (two K blocks here, B and B^T).
TEST_P(MatmulTest, ConcurrentCalls) {
  constexpr int kCalls = 12;
  const int64_t k = ActiveTile().kc + 88;
  const Operand a(37, k, Transpose::kNo, 0, 0, 31);
  const auto op = [](int i) {
    return i % 2 ? Transpose::kYes : Transpose::kNo;
  };
  std::vector<Operand> bs;
  for (int i = 0; i < kCalls; ++i)
    bs.emplace_back(k, 70 + i, op(i), 0, 0, 40 + i);
  std::vector<std::vector<float>> serial(kCalls), nested(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    serial[i] =
        RunMatmul(a, Transpose::kNo, bs[i], op(i), 37, 70 + i, nullptr, 0.0f);
  }
  tbb::parallel_for(0, kCalls, [&](int i) {
    nested[i] =
        RunMatmul(a, Transpose::kNo, bs[i], op(i), 37, 70 + i, nullptr, 0.0f);
  });
  for (int i = 0; i < kCalls; ++i)
    EXPECT_TRUE(BitIdentical(serial[i], nested[i])) << i;
}

// A PackedB from a target with another panel width is refused, not misread.
TEST_P(MatmulTest, PackedForOtherTarget) {
  const Operand a(5, 40, Transpose::kNo, 0, 0, 1),
      b(40, 50, Transpose::kNo, 0, 0, 2);
  PackedB packed;
  ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed).ok());
  std::vector<float> c(5 * 50);
  for (const Target& other : SupportedTargets()) {
    ASSERT_TRUE(SetMaxTarget(other.name).ok());
    const int64_t width = ActiveTile().nr;
    const std::vector<float> before = c;
    const Status status = Matmul(a.view(), Transpose::kNo, packed,
                                 MatrixView<float>(c.data(), 5, 50));
    if (width == packed.panel_width()) {
      EXPECT_TRUE(status.ok()) << other.name << ": " << status.ToString();
    } else {
      EXPECT_TRUE(test::IsError(status, StatusCode::kFailedPrecondition,
                                {"pack b again"}))
          << other.name;
      EXPECT_TRUE(BitIdentical(before, c)) << "written on error";
    }
  }
  ASSERT_TRUE(SetMaxTarget(GetParam().name).ok());
}

// ---------------------------------------------------------------------------
// B stored as bf16 or int8 (WeightDtype).

// A B stored as dtype, multiplied in `compute`; bf16 compute (over bf16 or
// int8 weights) with the native kernel wherever the CPU has it (on the AVX3
// targets) or nowhere (the fallback kernel runs on every target), and with AMX
// tiles for more than 16 rows wherever the CPU has them (`amx`) or nowhere.
struct StoredMode {
  WeightDtype dtype;
  MatmulCompute compute = MatmulCompute::kFloat32;
  NativeBFloat16 native = NativeBFloat16::kWhereSupported;
  bool amx = false;
};
constexpr StoredMode kStoredModes[] = {
    {WeightDtype::kBFloat16},
    {WeightDtype::kInt8},
    {WeightDtype::kBFloat16, MatmulCompute::kBFloat16,
     NativeBFloat16::kWhereSupported},
    {WeightDtype::kBFloat16, MatmulCompute::kBFloat16, NativeBFloat16::kNever},
    {WeightDtype::kBFloat16, MatmulCompute::kBFloat16,
     NativeBFloat16::kWhereSupported, /*amx=*/true},
    {WeightDtype::kInt8, MatmulCompute::kBFloat16,
     NativeBFloat16::kWhereSupported},
    {WeightDtype::kInt8, MatmulCompute::kBFloat16, NativeBFloat16::kNever},
    {WeightDtype::kInt8, MatmulCompute::kBFloat16,
     NativeBFloat16::kWhereSupported, /*amx=*/true}};

// The kernels a StoredMode names, for the lifetime of the scope.
struct StoredModeScope {
  explicit StoredModeScope(const StoredMode& mode)
      : native(mode.native), amx(mode.amx) {}
  NativeBFloat16Scope native;
  AmxBFloat16Scope amx;
};

// op(x) dense: [x.rows, x.cols] for kNo, [x.cols, x.rows] for kYes.
std::vector<float> DenseOp(const Operand& x, Transpose t) {
  const bool trans = t == Transpose::kYes;
  const int64_t rows = trans ? x.cols : x.rows, cols = trans ? x.rows : x.cols;
  std::vector<float> dense(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dense[r * cols + c] =
          trans ? x.data[c * x.stride + r] : x.data[r * x.stride + c];
    }
  }
  return dense;
}

// Matmul with B packed as mode.dtype against the float64 product with the
// weights it stands for (test::ref::StoredWeights; in bf16 compute, with op(a)
// rounded to bf16), within the documented bound (K + K / 512 + 3 roundings, one
// more for int8's scale): vdpbf16ps rounds at most once per product as an FMA
// does (its products of bf16 values are exact in float). C has row stride n +
// pad, sentinels in the padding.
void CheckStored(int64_t m, int64_t n, int64_t k, Transpose ta, Transpose tb,
                 float alpha, float beta, StoredMode mode, int64_t pad = 0,
                 int64_t offset = 0, uint64_t seed = 1) {
  const WeightDtype dtype = mode.dtype;
  const bool bf16_compute = mode.compute == MatmulCompute::kBFloat16;
  const StoredModeScope scope(mode);
  SCOPED_TRACE(testing::Message()
               << "m=" << m << " n=" << n << " k=" << k
               << " ta=" << static_cast<int>(ta)
               << " tb=" << static_cast<int>(tb) << " alpha=" << alpha
               << " beta=" << beta << " dtype=" << static_cast<int>(dtype)
               << " compute=" << static_cast<int>(mode.compute)
               << " native=" << NativeBFloat16Active()
               << " amx=" << AmxBFloat16Active() << " pad=" << pad);
  const Operand a(m, k, ta, pad, offset, seed * 3 + 1);
  const Operand b(k, n, tb, pad, offset, seed * 3 + 2);
  const std::vector<float> op_b = DenseOp(b, tb);
  const std::vector<double> w =
      test::ref::StoredWeights(op_b.data(), k, n, n, dtype);
  PackedB packed;
  ASSERT_TRUE(PackedB::Pack(b.view(), tb, &packed, dtype).ok());
  ASSERT_EQ(packed.dtype(), dtype);
  if (dtype == WeightDtype::kInt8) {
    const std::vector<float> scales =
        test::ref::Int8ColumnScales(op_b.data(), k, n, n);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(packed.scales()[j], scales[j]) << "scale of column " << j;
    }
  } else {
    EXPECT_EQ(packed.scales(), nullptr);
  }
  const int64_t ldc = n + pad;
  std::vector<float> c(static_cast<size_t>(m * ldc), -7.0f);
  test::FillRandomMatrix(c.data(), m, n, ldc, seed * 3 + 3);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n; j < ldc; ++j) c[i * ldc + j] = -7.0f;
    if (beta == 0.0f) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = kNaN;
    }
  }
  const std::vector<float> c_old = c;
  ASSERT_TRUE(Matmul(a.view(), ta, packed,
                     MatrixView<float>(c.data(), m, n, ldc), alpha, beta,
                     mode.compute)
                  .ok());
  const double rounds = dtype == WeightDtype::kInt8 ? 4.0 : 3.0;
  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i) {
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float a_ik = ta == Transpose::kNo ? a.data[i * a.stride + kk]
                                                : a.data[kk * a.stride + i];
        const double x = bf16_compute ? test::ref::RoundToBFloat16(a_ik) : a_ik;
        sum += x * w[kk * n + j];
        abs_sum += std::fabs(x * w[kk * n + j]);
      }
      const double old = beta == 0.0f ? 0.0 : c_old[i * ldc + j];
      const double want = alpha * sum + beta * old;
      const double abs_want =
          std::fabs(alpha) * abs_sum + std::fabs(beta * old);
      const double kd = static_cast<double>(k);
      const double tol =
          (kd + kd / 512.0 + rounds) * std::ldexp(1.0, -24) * abs_want +
          std::numeric_limits<float>::denorm_min();
      const double got = c[i * ldc + j];
      if (!(std::abs(got - want) <= tol)) {
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", want "
                      << want << " +- " << tol;
        ++failures;
      }
    }
    for (int64_t j = n; j < ldc; ++j) {
      if (c[i * ldc + j] != -7.0f) {
        ADD_FAILURE() << "padding c[" << i << ", " << j << "] was written";
        ++failures;
      }
    }
  }
}

TEST_P(MatmulTest, StoredTileEdges) {
  const Tile t = ActiveTile();
  const std::vector<int64_t> sizes = {
      1,        2,        t.lanes - 1, t.lanes,  t.lanes + 1, t.mr,
      t.mr + 1, t.nr - 1, t.nr,        t.nr + 1, 17};
  for (const StoredMode& mode : kStoredModes) {
    for (Transpose tb : kOps) {
      for (int64_t s : sizes) {
        if (s < 1) continue;
        CheckStored(s, t.nr + 3, 19, Transpose::kNo, tb, 1.0f, 0.0f, mode);
        CheckStored(t.mr + 2, s, 23, Transpose::kYes, tb, 1.0f, 0.0f, mode);
        CheckStored(t.mr - 1 > 0 ? t.mr - 1 : 1, t.nr - 1 > 0 ? t.nr - 1 : 1, s,
                    Transpose::kNo, tb, 1.0f, 0.0f, mode);
      }
    }
  }
}

// K blocks, the small-M (GEMV) path, primes, alpha/beta, strides and offsets.
TEST_P(MatmulTest, StoredShapes) {
  const Tile t = ActiveTile();
  for (const StoredMode& mode : kStoredModes) {
    for (int64_t k : {t.kc - 1, t.kc + 1, 2 * t.kc + 3}) {
      CheckStored(1, 2 * t.nr + 1, k, Transpose::kNo, Transpose::kNo, 1.0f,
                  0.0f, mode);
      CheckStored(2 * t.mr - 1, 2 * t.nr - 3, k, Transpose::kYes,
                  Transpose::kYes, -1.5f, 0.5f, mode);
    }
    for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{16}, int64_t{17}}) {
      CheckStored(m, 5 * t.nr + 3, 300, Transpose::kNo, Transpose::kNo, 1.0f,
                  0.0f, mode);
    }
    CheckStored(1, 1021, 509, Transpose::kNo, Transpose::kYes, 1.0f, 1.0f,
                mode);
    CheckStored(127, 251, 509, Transpose::kNo, Transpose::kNo, 1.0f, 0.0f,
                mode);
    CheckStored(97, 131, 61, Transpose::kYes, Transpose::kNo, 1.0f, 0.5f, mode);
    const float cases[][2] = {{2.5f, 0}, {1, 1}, {-0.5f, 0.75f}, {1, -1}};
    for (const auto& ab : cases) {
      CheckStored(t.mr + 3, t.nr + 5, 37, Transpose::kNo, Transpose::kYes,
                  ab[0], ab[1], mode);
    }
    for (int64_t pad : {1, 17}) {
      for (int64_t offset : {1, 3}) {
        CheckStored(2 * t.mr + 1, 2 * t.nr + 1, 45, Transpose::kNo,
                    Transpose::kNo, 1.0f, 0.5f, mode, pad, offset);
      }
    }
  }
}

// Expects Matmul of op(A) [m, k] by `packed` (B) in `compute` to give the
// same bits on 1, 2 and 7 threads; `what` names the case in a failure.
void ExpectSameOnThreads(const Operand& a, const Operand& b, Transpose tb,
                         int64_t m, int64_t n, const PackedB& packed,
                         float beta, MatmulCompute compute,
                         const std::string& what) {
  std::vector<float> results[3];
  const int threads[3] = {1, 2, 7};
  for (int i = 0; i < 3; ++i) {
    tbb::task_arena arena(threads[i]);
    arena.execute([&] {
      results[i] =
          RunMatmul(a, Transpose::kNo, b, tb, m, n, &packed, beta, compute);
    });
    EXPECT_TRUE(BitIdentical(results[0], results[i]))
        << what << ", " << threads[i] << " threads, compute "
        << static_cast<int>(compute) << ", native " << NativeBFloat16Active()
        << ", amx " << AmxBFloat16Active();
  }
}

// 1, 2 and 7 threads give bit-identical results for every dtype.
TEST_P(MatmulTest, StoredThreadCountInvariant) {
  struct Shape {
    int64_t m, n, k;
  };
  for (const StoredMode& mode : kStoredModes) {
    const StoredModeScope scope(mode);
    for (const Shape& s :
         {Shape{1, 1000, 600}, Shape{13, 517, 300}, Shape{301, 263, 701}}) {
      const Operand a(s.m, s.k, Transpose::kNo, 0, 0, 21);
      const Operand b(s.k, s.n, Transpose::kYes, 0, 0, 22);
      PackedB packed;
      ASSERT_TRUE(
          PackedB::Pack(b.view(), Transpose::kYes, &packed, mode.dtype).ok());
      ExpectSameOnThreads(
          a, b, Transpose::kYes, s.m, s.n, packed, 0.5f, mode.compute,
          "dtype " + std::to_string(static_cast<int>(mode.dtype)));
    }
  }
}

// Few rows against B packed before the call run its panels two at a time on
// AVX-512 (lib/matmul/matmul-inl.h, MatmulGemvPanelPairs): rows 1 to 5 (5 is
// past the pairs), 1, 2, 3 and 7 panels (an odd one alone, the last one half
// full), odd and even k, every dtype and compute mode, against the float64
// reference. An element's arithmetic is the same as one panel at a time, so
// float32 equals the unpacked call (one panel at a time) bit for bit, and 1, 2
// and 7 threads (other pairs of panels) agree for every dtype and mode.
TEST_P(MatmulTest, GemvPanelPairs) {
  const Tile t = ActiveTile();
  for (int64_t m = 1; m <= 5; ++m) {
    for (int64_t panels : {1, 2, 3, 7}) {
      const int64_t n = (panels - 1) * t.nr + (t.nr + 1) / 2;
      for (int64_t k : {1, 2, 3, 513}) {
        CheckCase(m, n, k, Transpose::kNo, Transpose::kNo, 1.0f, 0.5f, 0, 0,
                  /*packed=*/true);
        for (const StoredMode& mode : kStoredModes) {
          CheckStored(m, n, k, Transpose::kNo, Transpose::kYes, 1.0f, 0.0f,
                      mode);
        }
        const Operand a(m, k, Transpose::kNo, 1, 0, 41);
        const Operand b(k, n, Transpose::kNo, 2, 0, 42);
        PackedB packed;
        ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed).ok());
        EXPECT_TRUE(BitIdentical(RunMatmul(a, Transpose::kNo, b, Transpose::kNo,
                                           m, n, nullptr, 1.0f),
                                 RunMatmul(a, Transpose::kNo, b, Transpose::kNo,
                                           m, n, &packed, 1.0f)))
            << m << "x" << n << "x" << k;
      }
    }
  }
  const StoredMode float32_mode{WeightDtype::kFloat32};
  std::vector<StoredMode> modes(std::begin(kStoredModes),
                                std::end(kStoredModes));
  modes.push_back(float32_mode);
  for (const StoredMode& mode : modes) {
    const StoredModeScope scope(mode);
    // 1 row: int8 pairs its panels only then; 3: the other types still do.
    for (int64_t m : {1, 3}) {
      const Operand a(m, 1031, Transpose::kNo, 0, 0, 43);
      const Operand b(1031, 7 * t.nr + 5, Transpose::kNo, 0, 0, 44);
      PackedB packed;
      ASSERT_TRUE(
          PackedB::Pack(b.view(), Transpose::kNo, &packed, mode.dtype).ok());
      ExpectSameOnThreads(a, b, Transpose::kNo, m, 7 * t.nr + 5, packed, 0.0f,
                          mode.compute,
                          std::to_string(m) + " rows, dtype " +
                              std::to_string(static_cast<int>(mode.dtype)));
    }
  }
}

// Packing bf16 weights packs exactly what packing the same values as floats
// does, for every dtype, B and B^T, and PackColumns (of float or bf16 parts)
// stores what Pack stores.
TEST_P(MatmulTest, StoredFromBF16AndColumns) {
  const Tile t = ActiveTile();
  const int64_t rows = t.kc + 3, cols = 2 * t.nr + 5;
  std::vector<float> as_float(static_cast<size_t>(rows * cols));
  test::FillRandom(as_float.data(), as_float.size(), 61);
  std::vector<BFloat16> as_bf16(as_float.size());
  for (size_t i = 0; i < as_float.size(); ++i) {
    as_float[i] = test::ref::RoundToBFloat16(as_float[i]);
    uint32_t u;
    std::memcpy(&u, &as_float[i], sizeof(u));
    as_bf16[i].bits = static_cast<uint16_t>(u >> 16);
  }
  for (WeightDtype dtype :
       {WeightDtype::kFloat32, WeightDtype::kBFloat16, WeightDtype::kInt8}) {
    for (Transpose tb : kOps) {
      PackedB want, got;
      ASSERT_TRUE(
          PackedB::Pack(MatrixView<const float>(as_float.data(), rows, cols),
                        tb, &want, dtype)
              .ok());
      ASSERT_TRUE(
          PackedB::Pack(MatrixView<const BFloat16>(as_bf16.data(), rows, cols),
                        tb, &got, dtype)
              .ok());
      ASSERT_EQ(got.bytes(), want.bytes());
      EXPECT_EQ(got.dtype(), dtype);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0);
    }
    // Columns [0, 7) and [7, cols) of the float matrix as two parts.
    const MatrixView<const float> parts[2] = {
        MatrixView<const float>(as_float.data(), rows, 7, cols),
        MatrixView<const float>(as_float.data() + 7, rows, cols - 7, cols)};
    PackedB whole, columns;
    ASSERT_TRUE(
        PackedB::Pack(MatrixView<const float>(as_float.data(), rows, cols),
                      Transpose::kNo, &whole, dtype)
            .ok());
    ASSERT_TRUE(PackedB::PackColumns(parts, 2, &columns, dtype).ok());
    ASSERT_EQ(columns.bytes(), whole.bytes());
    EXPECT_EQ(std::memcmp(columns.data(), whole.data(), whole.bytes()), 0);
    // The same columns as bf16 parts (a checkpoint's W_Q, W_K, W_V).
    const MatrixView<const BFloat16> bf16_parts[2] = {
        MatrixView<const BFloat16>(as_bf16.data(), rows, 7, cols),
        MatrixView<const BFloat16>(as_bf16.data() + 7, rows, cols - 7, cols)};
    PackedB from_bf16;
    ASSERT_TRUE(PackedB::PackColumns(bf16_parts, 2, &from_bf16, dtype).ok());
    ASSERT_EQ(from_bf16.bytes(), whole.bytes());
    EXPECT_EQ(std::memcmp(from_bf16.data(), whole.data(), whole.bytes()), 0);
  }
}

// bytes(): the panels of the stored type (rounded up to 64 bytes), plus the
// int8 scales.
TEST_P(MatmulTest, StoredBytes) {
  const Tile t = ActiveTile();
  const int64_t k = 37, n = 3 * t.nr + 1;
  const Operand b(k, n, Transpose::kNo, 0, 0, 5);
  const size_t elements = static_cast<size_t>(k * 4 * t.nr);
  const auto round64 = [](size_t x) { return (x + 63) / 64 * 64; };
  const struct {
    WeightDtype dtype;
    size_t bytes;
  } cases[] = {
      {WeightDtype::kFloat32, elements * 4},
      {WeightDtype::kBFloat16, round64(elements * 2)},
      {WeightDtype::kInt8,
       round64(elements) + static_cast<size_t>(4 * t.nr) * sizeof(float)}};
  for (const auto& c : cases) {
    PackedB packed;
    ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed, c.dtype).ok());
    EXPECT_EQ(packed.bytes(), c.bytes) << static_cast<int>(c.dtype);
    EXPECT_EQ(WeightDtypeSize(c.dtype) * elements <= packed.bytes(), true);
  }
  EXPECT_EQ(WeightDtypeSize(static_cast<WeightDtype>(7)), 0u);
}

// int8: the weights read are scale_j * q exactly (C = I * B gives
// fl(scale_j * q) with alpha 1), a zero column has scale 0 and gives zeros, a
// column with NaN or inf is refused by name; bf16 keeps NaN (as float32).
TEST_P(MatmulTest, StoredInt8Columns) {
  const Tile t = ActiveTile();
  const int64_t k = 9, n = t.nr + 3;
  Operand b(k, n, Transpose::kNo, 0, 0, 8);
  for (int64_t kk = 0; kk < k; ++kk) b.data[kk * b.stride + 2] = 0.0f;
  const std::vector<double> w =
      test::ref::StoredWeights(b.data, k, n, b.stride, WeightDtype::kInt8);
  PackedB packed;
  ASSERT_TRUE(
      PackedB::Pack(b.view(), Transpose::kNo, &packed, WeightDtype::kInt8)
          .ok());
  EXPECT_EQ(packed.scales()[2], 0.0f);
  for (int64_t j = n; j < 2 * t.nr; ++j) EXPECT_EQ(packed.scales()[j], 0.0f);
  std::vector<float> identity(static_cast<size_t>(k * k), 0.0f);
  for (int64_t i = 0; i < k; ++i) identity[i * k + i] = 1.0f;
  std::vector<float> c(static_cast<size_t>(k * n), kNaN);
  ASSERT_TRUE(Matmul(MatrixView<const float>(identity.data(), k, k),
                     Transpose::kNo, packed, MatrixView<float>(c.data(), k, n))
                  .ok());
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(c[kk * n + j], static_cast<float>(w[kk * n + j]))
          << kk << ", " << j;
    }
    EXPECT_EQ(c[kk * n + 2], 0.0f);
  }
  // NaN or inf in column 5 of op(b) (row 5 of b^T).
  for (const float bad : {kNaN, std::numeric_limits<float>::infinity()}) {
    Operand bt(k, n, Transpose::kYes, 0, 0, 9);
    bt.data[5 * bt.stride + 3] = bad;
    PackedB refused;
    EXPECT_TRUE(test::IsError(
        PackedB::Pack(bt.view(), Transpose::kYes, &refused, WeightDtype::kInt8),
        StatusCode::kInvalidArgument, {"column 5 ", "NaN or inf"}));
    EXPECT_EQ(refused.data(), nullptr);
    PackedB bf16;
    ASSERT_TRUE(
        PackedB::Pack(bt.view(), Transpose::kYes, &bf16, WeightDtype::kBFloat16)
            .ok());
    std::vector<float> out(static_cast<size_t>(k * n));
    ASSERT_TRUE(Matmul(MatrixView<const float>(identity.data(), k, k),
                       Transpose::kNo, bf16,
                       MatrixView<float>(out.data(), k, n))
                    .ok());
    // As float32: 1 * NaN is NaN, 1 * inf is inf.
    const float got = out[3 * n + 5];
    EXPECT_TRUE(std::isnan(bad) ? std::isnan(got) : got == bad) << got;
  }
  PackedB bad_dtype;
  EXPECT_TRUE(test::IsError(PackedB::Pack(b.view(), Transpose::kNo, &bad_dtype,
                                          static_cast<WeightDtype>(7)),
                            StatusCode::kInvalidArgument,
                            {"dtype", "WeightDtype", "got 7"}));
  const MatrixView<const float> part = b.view();
  EXPECT_TRUE(test::IsError(
      PackedB::PackColumns(&part, 1, &bad_dtype, static_cast<WeightDtype>(-1)),
      StatusCode::kInvalidArgument, {"got -1"}));
  std::vector<BFloat16> b16(static_cast<size_t>(k * n));
  EXPECT_TRUE(test::IsError(
      PackedB::Pack(MatrixView<const BFloat16>(b16.data(), k, n),
                    Transpose::kNo, &bad_dtype, static_cast<WeightDtype>(3)),
      StatusCode::kInvalidArgument, {"got 3"}));
}

// The bf16 compute mode runs the native kernel, on AVX3 and AVX3_DL, where
// the CPU prefers it (the default), where it has it, or nowhere, as
// SetNativeBFloat16 says, and AMX tiles where the CPU has them unless
// SetAmxBFloat16(false); and the AMX, native and fallback kernels agree within
// the bound they meet (twice it).
TEST_P(MatmulTest, BF16NativeAndFallback) {
  const Target active = ActiveTarget();
  const bool avx3 = std::string(active.name).rfind("AVX3", 0) == 0;
  EXPECT_EQ(NativeBFloat16Active(), CpuPrefersNativeBFloat16() && avx3);
  EXPECT_TRUE(CpuHasNativeBFloat16() || !CpuPrefersNativeBFloat16());
  {
    const NativeBFloat16Scope never(NativeBFloat16::kNever);
    EXPECT_FALSE(NativeBFloat16Active());
    {
      const NativeBFloat16Scope supported(NativeBFloat16::kWhereSupported);
      EXPECT_EQ(NativeBFloat16Active(), CpuHasNativeBFloat16() && avx3);
    }
    // The inner scope gave back the setting it found.
    EXPECT_FALSE(NativeBFloat16Active());
    // A value outside the enum runs the fallback.
    const NativeBFloat16Scope bad(static_cast<NativeBFloat16>(7));
    EXPECT_FALSE(NativeBFloat16Active());
  }
  EXPECT_EQ(NativeBFloat16Active(), CpuPrefersNativeBFloat16() && avx3);
  const bool amx = CpuHasAmxBFloat16() && CpuHasNativeBFloat16() && avx3;
  EXPECT_EQ(AmxBFloat16Active(), amx);
  {
    const AmxBFloat16Scope off(false);
    EXPECT_FALSE(AmxBFloat16Active());
    {
      const AmxBFloat16Scope on(true);
      EXPECT_EQ(AmxBFloat16Active(), amx);
    }
    EXPECT_FALSE(AmxBFloat16Active());
  }
  EXPECT_EQ(AmxBFloat16Active(), amx);
  const Tile t = ActiveTile();
  struct Shape {
    int64_t m, n, k;
  };
  // The last three on AMX where the CPU has it: K = 777 in blocks of 392 and
  // 385 (8 and 1 k past a multiple of 32), K = 1031 in 344, 344 and 343 (24,
  // 24 and 23), 300 rows (two tasks of rows, the last block of 12); K = 3001
  // with 250 rows: two tasks of rows (A's bf16 rows past
  // kMatmulAmxTaskABytes at 256).
  for (WeightDtype dtype : {WeightDtype::kBFloat16, WeightDtype::kInt8}) {
    for (const Shape& s :
         {Shape{1, 4 * t.nr + 3, 1031}, Shape{t.mr, t.nr, 2},
          Shape{2 * t.mr + 5, 3 * t.nr - 1, 777},
          Shape{300, 2 * t.nr + 7, 1031}, Shape{250, t.nr + 5, 3001}}) {
      SCOPED_TRACE(testing::Message() << "dtype=" << static_cast<int>(dtype));
      const Operand a(s.m, s.k, Transpose::kNo, 0, 0, 31);
      const Operand b(s.k, s.n, Transpose::kNo, 0, 0, 32);
      const std::vector<double> w =
          test::ref::StoredWeights(b.data, s.k, s.n, b.stride, dtype);
      PackedB packed;
      ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed, dtype).ok());
      std::vector<float> tiles, native, fallback;
      {
        const NativeBFloat16Scope where(NativeBFloat16::kWhereSupported);
        tiles = RunMatmul(a, Transpose::kNo, b, Transpose::kNo, s.m, s.n,
                          &packed, 0.0f, MatmulCompute::kBFloat16);
        const AmxBFloat16Scope off(false);
        native = RunMatmul(a, Transpose::kNo, b, Transpose::kNo, s.m, s.n,
                           &packed, 0.0f, MatmulCompute::kBFloat16);
      }
      {
        const NativeBFloat16Scope never(NativeBFloat16::kNever);
        const AmxBFloat16Scope off(false);
        fallback = RunMatmul(a, Transpose::kNo, b, Transpose::kNo, s.m, s.n,
                             &packed, 0.0f, MatmulCompute::kBFloat16);
      }
      double worst = 0.0, worst_tiles = 0.0;
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double abs_sum = 0.0;
          for (int64_t kk = 0; kk < s.k; ++kk) {
            const double a_ik =
                test::ref::RoundToBFloat16(a.data[i * a.stride + kk]);
            abs_sum += std::fabs(a_ik * w[kk * s.n + j]);
          }
          const double tol = 2.0 * 0.75 * Tolerance(s.k, abs_sum);
          const double diff = std::fabs(
              static_cast<double>(native[i * s.n + j]) - fallback[i * s.n + j]);
          worst = std::max(worst, diff / tol);
          ASSERT_LE(diff, tol) << "c[" << i << ", " << j << "] m=" << s.m;
          const double diff_tiles = std::fabs(
              static_cast<double>(tiles[i * s.n + j]) - fallback[i * s.n + j]);
          worst_tiles = std::max(worst_tiles, diff_tiles / tol);
          ASSERT_LE(diff_tiles, tol)
              << "AMX c[" << i << ", " << j << "] m=" << s.m;
        }
      }
      const std::string suffix =
          std::string(dtype == WeightDtype::kInt8 ? "int8_" : "bf16_") +
          std::to_string(s.m) + "x" + std::to_string(s.k);
      RecordProperty("worst_native_vs_fallback_" + suffix,
                     std::to_string(worst));
      RecordProperty("worst_amx_vs_fallback_" + suffix,
                     std::to_string(worst_tiles));
    }
  }
}

// The compute mode is checked: a bad value for every dtype, and bf16 compute
// over float32 weights.
TEST_P(MatmulTest, BF16ComputeErrors) {
  const Operand a(3, 5, Transpose::kNo, 0, 0, 41);
  const Operand b(5, 4, Transpose::kNo, 0, 0, 42);
  std::vector<float> c(12, 9.0f);
  const MatrixView<float> cv(c.data(), 3, 4);
  for (WeightDtype dtype :
       {WeightDtype::kFloat32, WeightDtype::kBFloat16, WeightDtype::kInt8}) {
    PackedB packed;
    ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed, dtype).ok());
    if (dtype == WeightDtype::kFloat32) {
      EXPECT_TRUE(test::IsError(Matmul(a.view(), Transpose::kNo, packed, cv,
                                       1.0f, 0.0f, MatmulCompute::kBFloat16),
                                StatusCode::kInvalidArgument,
                                {"MatmulCompute::kBFloat16",
                                 "kBFloat16 or kInt8", "b.dtype() is 0"}));
    }
    EXPECT_TRUE(test::IsError(Matmul(a.view(), Transpose::kNo, packed, cv, 1.0f,
                                     0.0f, static_cast<MatmulCompute>(2)),
                              StatusCode::kInvalidArgument,
                              {"compute", "got 2"}));
  }
  for (float x : c) EXPECT_EQ(x, 9.0f);
}

// A given as bf16 (Matmul's BFloat16 overload) gives bit for bit what a float
// A holding the same values gives, in every StoredMode (float32 compute, bf16
// compute native, fallback and on AMX tiles), over GEMV, tile-edge and AMX
// shapes (300 rows: two tasks, the second's last block of 12 rows; K = 1024
// in two blocks of whole steps and K = 1031 with tails), both ops of A,
// strided and misaligned A, alpha and beta; C's padding is not written.
TEST_P(MatmulTest, BF16ActivationsEqualFloat) {
  const Tile t = ActiveTile();
  struct Shape {
    int64_t m, n, k;
  };
  for (const StoredMode& mode : kStoredModes) {
    const StoredModeScope scope(mode);
    for (const Shape& s :
         {Shape{1, 2 * t.nr + 1, 300}, Shape{t.mr + 1, t.nr - 1, 19},
          Shape{300, t.nr + 3, 1024}, Shape{300, 2 * t.nr + 7, 1031}}) {
      for (Transpose ta : kOps) {
        SCOPED_TRACE(testing::Message()
                     << "m=" << s.m << " n=" << s.n << " k=" << s.k
                     << " ta=" << static_cast<int>(ta)
                     << " dtype=" << static_cast<int>(mode.dtype)
                     << " compute=" << static_cast<int>(mode.compute)
                     << " native=" << NativeBFloat16Active()
                     << " amx=" << AmxBFloat16Active());
        // op(A) with a row pad of 3 and one element before it (misaligned),
        // its values rounded to bf16, and the same bits as BFloat16.
        Operand a(s.m, s.k, ta, 3, 1, 51);
        std::vector<BFloat16> a16_storage(a.storage.size());
        for (size_t i = 0; i < a.storage.size(); ++i) {
          a.storage[i] = test::ref::RoundToBFloat16(a.storage[i]);
          uint32_t bits;
          std::memcpy(&bits, &a.storage[i], sizeof(bits));
          a16_storage[i].bits = static_cast<uint16_t>(bits >> 16);
        }
        const MatrixView<const BFloat16> a16(a16_storage.data() + 1, a.rows,
                                             a.cols, a.stride);
        const Operand b(s.k, s.n, Transpose::kNo, 0, 0, 52);
        PackedB packed;
        ASSERT_TRUE(
            PackedB::Pack(b.view(), Transpose::kNo, &packed, mode.dtype).ok());
        const int64_t ldc = s.n + 2;
        for (float beta : {0.0f, 0.5f}) {
          std::vector<float> c_float(static_cast<size_t>(s.m * ldc));
          test::FillRandom(c_float.data(), c_float.size(), 53);
          std::vector<float> c_bf16 = c_float;
          const std::vector<float> c_old = c_bf16;
          // The bf16 call first: the float call's packed A strips, left in
          // the kernels' buffers, would hide a strip the bf16 call left
          // unpacked.
          ASSERT_TRUE(Matmul(a16, ta, packed,
                             MatrixView<float>(c_bf16.data(), s.m, s.n, ldc),
                             0.75f, beta, mode.compute)
                          .ok());
          ASSERT_TRUE(Matmul(a.view(), ta, packed,
                             MatrixView<float>(c_float.data(), s.m, s.n, ldc),
                             0.75f, beta, mode.compute)
                          .ok());
          ASSERT_TRUE(BitIdentical(c_float, c_bf16)) << "beta=" << beta;
          for (int64_t i = 0; i < s.m; ++i) {
            for (int64_t j = s.n; j < ldc; ++j) {
              ASSERT_EQ(c_bf16[i * ldc + j], c_old[i * ldc + j])
                  << "padding c[" << i << ", " << j << "] was written";
            }
          }
        }
      }
    }
  }
}

// The BFloat16 overload checks its arguments as the float one does, a's bytes
// counted as bf16 for the overlap with c, and writes nothing on error.
TEST_P(MatmulTest, BF16ActivationsErrors) {
  const Operand b(5, 4, Transpose::kNo, 0, 0, 61);
  PackedB packed, packed_f32;
  ASSERT_TRUE(
      PackedB::Pack(b.view(), Transpose::kNo, &packed, WeightDtype::kBFloat16)
          .ok());
  ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed_f32).ok());
  std::vector<BFloat16> a16(15, BFloat16{0x3F80});  // 1.0
  const MatrixView<const BFloat16> a(a16.data(), 3, 5);
  std::vector<float> c(12, 9.0f);
  const MatrixView<float> cv(c.data(), 3, 4);
  EXPECT_TRUE(test::IsError(Matmul(MatrixView<const BFloat16>(nullptr, 3, 5),
                                   Transpose::kNo, packed, cv),
                            StatusCode::kInvalidArgument, {"a.data is null"}));
  EXPECT_TRUE(test::IsError(Matmul(MatrixView<const BFloat16>(a16.data(), 3, 4),
                                   Transpose::kNo, packed, cv),
                            StatusCode::kInvalidArgument,
                            {"inner dimensions"}));
  EXPECT_TRUE(test::IsError(Matmul(a, static_cast<Transpose>(3), packed, cv),
                            StatusCode::kInvalidArgument, {"ta is not"}));
  EXPECT_TRUE(test::IsError(Matmul(a, Transpose::kNo, PackedB(), cv),
                            StatusCode::kInvalidArgument, {"b is empty"}));
  EXPECT_TRUE(test::IsError(Matmul(a, Transpose::kNo, packed_f32, cv, 1.0f,
                                   0.0f, MatmulCompute::kBFloat16),
                            StatusCode::kInvalidArgument,
                            {"MatmulCompute::kBFloat16", "b.dtype()"}));
  EXPECT_TRUE(
      test::IsError(Matmul(a, Transpose::kNo, packed, cv, std::nanf(""), 0.0f),
                    StatusCode::kInvalidArgument, {"alpha"}));
  for (float x : c) EXPECT_EQ(x, 9.0f);
  // a [3, 5] (30 bytes) and c [3, 4] in one buffer: c from byte 28 overlaps
  // a's last element, from byte 32 it does not.
  alignas(64) unsigned char bytes[128] = {};
  for (int i = 0; i < 15; ++i) {
    const uint16_t one = 0x3F80;
    std::memcpy(bytes + 2 * i, &one, sizeof(one));
  }
  const MatrixView<const BFloat16> a_in(reinterpret_cast<BFloat16*>(bytes), 3,
                                        5);
  EXPECT_TRUE(test::IsError(
      Matmul(a_in, Transpose::kNo, packed,
             MatrixView<float>(reinterpret_cast<float*>(bytes + 28), 3, 4)),
      StatusCode::kInvalidArgument, {"c overlaps a"}));
  EXPECT_TRUE(
      Matmul(a_in, Transpose::kNo, packed,
             MatrixView<float>(reinterpret_cast<float*>(bytes + 32), 3, 4))
          .ok());
}

HEADWAY_INSTANTIATE_TARGET_TEST(MatmulTest);

// The calling thread of an unpacked call with a B of over 4 MiB packed and
// several row blocks keeps that packed copy (include/headway/threads.h), one
// per instruction set; ReleaseThreadScratch frees it and the thread's other
// scratch, and the next calls give the same results, which equal pre-packed
// B's.
TEST(MatmulScratch, ReleaseThreadScratch) {
  const int64_t m = 200, n = 1100, k = 1100;  // 2 row blocks on 2 threads
  const Operand a(m, k, Transpose::kNo, 0, 0, 61);
  const Operand b(k, n, Transpose::kNo, 0, 0, 62);
  const std::vector<Target> supported = SupportedTargets();
  std::vector<Target> targets = {supported.front()};
  if (supported.size() > 1) targets.push_back(supported[supported.size() / 2]);
  tbb::task_arena arena(2);
  arena.execute([&] {
    ReleaseThreadScratch();  // what earlier tests left
    ASSERT_EQ(ThreadScratchBytes(), 0);
    std::vector<std::vector<float>> first;
    int64_t packed_bytes = 0;
    for (const Target& target : targets) {
      ASSERT_TRUE(SetMaxTarget(target.name).ok());
      first.push_back(
          RunMatmul(a, Transpose::kNo, b, Transpose::kNo, m, n, nullptr, 0.5f));
      PackedB packed;
      ASSERT_TRUE(PackedB::Pack(b.view(), Transpose::kNo, &packed).ok());
      packed_bytes += static_cast<int64_t>(packed.bytes());
      EXPECT_TRUE(BitIdentical(
          first.back(),
          RunMatmul(a, Transpose::kNo, b, Transpose::kNo, m, n, &packed, 0.5f)))
          << target.name;
    }
    const int64_t held = ThreadScratchBytes();
    EXPECT_GE(held, packed_bytes);
    EXPECT_EQ(ReleaseThreadScratch(), held);
    EXPECT_EQ(ThreadScratchBytes(), 0);
    EXPECT_EQ(ReleaseThreadScratch(), 0);
    for (size_t i = 0; i < targets.size(); ++i) {
      ASSERT_TRUE(SetMaxTarget(targets[i].name).ok());
      EXPECT_TRUE(BitIdentical(
          first[i],
          RunMatmul(a, Transpose::kNo, b, Transpose::kNo, m, n, nullptr, 0.5f)))
          << targets[i].name;
    }
    EXPECT_GE(ThreadScratchBytes(), packed_bytes);
    ReleaseThreadScratch();
  });
  ResetMaxTarget();
}

// ---------------------------------------------------------------------------------------------
// Errors (target-independent: checked before dispatch).

Status Mm(MatrixView<const float> a, MatrixView<const float> b,
          MatrixView<float> c, Transpose ta = Transpose::kNo,
          Transpose tb = Transpose::kNo, float alpha = 1, float beta = 0) {
  return Matmul(a, ta, b, tb, c, alpha, beta);
}

TEST(MatmulErrors, Arguments) {
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 3.0f);
  const MatrixView<const float> a44(a.data(), 4, 4), b44(b.data(), 4, 4);
  const MatrixView<float> c44(c.data(), 4, 4);
  EXPECT_TRUE(
      test::IsError(Mm(MatrixView<const float>(nullptr, 4, 4), b44, c44),
                    StatusCode::kInvalidArgument, {"a.data is null"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, MatrixView<const float>(nullptr, 4, 4), c44),
                    StatusCode::kInvalidArgument, {"b.data is null"}));
  EXPECT_TRUE(test::IsError(Mm(a44, b44, MatrixView<float>(nullptr, 4, 4)),
                            StatusCode::kInvalidArgument, {"c.data is null"}));
  EXPECT_TRUE(
      test::IsError(Mm(MatrixView<const float>(a.data(), 0, 4), b44, c44),
                    StatusCode::kInvalidArgument, {"a.rows"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, MatrixView<const float>(b.data(), 4, -1), c44),
                    StatusCode::kInvalidArgument, {"b.cols"}));
  EXPECT_TRUE(
      test::IsError(Mm(MatrixView<const float>(a.data(), 4, 4, 3), b44, c44),
                    StatusCode::kInvalidArgument, {"a.stride (3)"}));
  EXPECT_TRUE(test::IsError(Mm(a44, b44, MatrixView<float>(c.data(), 4, 4, 2)),
                            StatusCode::kInvalidArgument, {"c.stride (2)"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, MatrixView<const float>(b.data(), 3, 4), c44),
                    StatusCode::kInvalidArgument, {"inner dimensions"}));
  EXPECT_TRUE(test::IsError(Mm(a44, b44, MatrixView<float>(c.data(), 4, 3)),
                            StatusCode::kInvalidArgument, {"c is [4, 3]"}));
  EXPECT_TRUE(test::IsError(Mm(a44, MatrixView<const float>(b.data(), 4, 2),
                               c44, Transpose::kNo, Transpose::kYes),
                            StatusCode::kInvalidArgument,
                            {"inner dimensions"}));
  EXPECT_TRUE(test::IsError(Mm(a44, b44, c44, static_cast<Transpose>(2)),
                            StatusCode::kInvalidArgument, {"ta is not"}));
  EXPECT_TRUE(test::IsError(
      Mm(a44, b44, c44, Transpose::kNo, static_cast<Transpose>(-1)),
      StatusCode::kInvalidArgument, {"tb is not"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, b44, c44, Transpose::kNo, Transpose::kNo, kNaN),
                    StatusCode::kInvalidArgument, {"alpha must be finite"}));
  EXPECT_TRUE(test::IsError(Mm(a44, b44, c44, Transpose::kNo, Transpose::kNo, 1,
                               std::numeric_limits<float>::infinity()),
                            StatusCode::kInvalidArgument,
                            {"beta must be finite"}));
  // Aliasing: C overlapping A or B (even partly) is refused.
  EXPECT_TRUE(
      test::IsError(Mm(MatrixView<const float>(c.data(), 4, 4), b44, c44),
                    StatusCode::kInvalidArgument, {"c overlaps a"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, MatrixView<const float>(c.data() + 15, 4, 4), c44),
                    StatusCode::kInvalidArgument, {"c overlaps b"}));
  // Byte counts that overflow.
  const int64_t huge = int64_t{1} << 62;
  EXPECT_TRUE(
      test::IsError(Mm(MatrixView<const float>(a.data(), 4, 4, huge), b44, c44),
                    StatusCode::kResourceExhausted, {"overflows"}));
  for (float x : c) EXPECT_EQ(x, 3.0f) << "c written on error";
}

TEST(MatmulErrors, PackedB) {
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 3.0f);
  const MatrixView<const float> a44(a.data(), 4, 4), b44(b.data(), 4, 4);
  const MatrixView<float> c44(c.data(), 4, 4);
  PackedB empty;
  EXPECT_EQ(empty.rows(), 0);
  EXPECT_EQ(empty.bytes(), 0u);
  EXPECT_TRUE(test::IsError(Matmul(a44, Transpose::kNo, empty, c44),
                            StatusCode::kInvalidArgument, {"b is empty"}));
  EXPECT_TRUE(test::IsError(PackedB::Pack(b44, Transpose::kNo, nullptr),
                            StatusCode::kInvalidArgument, {"out is null"}));
  EXPECT_TRUE(
      test::IsError(PackedB::Pack(MatrixView<const float>(nullptr, 4, 4),
                                  Transpose::kNo, &empty),
                    StatusCode::kInvalidArgument, {"b.data is null"}));
  EXPECT_TRUE(
      test::IsError(PackedB::Pack(b44, static_cast<Transpose>(5), &empty),
                    StatusCode::kInvalidArgument, {"tb is not"}));
  // K * N * 4 overflows although the view itself (one huge row) is addressable.
  EXPECT_TRUE(test::IsError(
      PackedB::Pack(MatrixView<const float>(b.data(), int64_t{1} << 31,
                                            int64_t{1} << 31, int64_t{1} << 31),
                    Transpose::kNo, &empty),
      StatusCode::kResourceExhausted, {"overflows"}));
  EXPECT_EQ(empty.bytes(), 0u);
  // K * N * 4 = 2^50 bytes fits int64_t but not memory; b (a view that claims
  // as much) is read only after the allocation.
  EXPECT_TRUE(test::IsError(
      PackedB::Pack(
          MatrixView<const float>(b.data(), int64_t{1} << 24, int64_t{1} << 24),
          Transpose::kNo, &empty),
      StatusCode::kResourceExhausted, {"no memory"}));
  EXPECT_EQ(empty.bytes(), 0u);

  const MatrixView<const float> parts[2] = {b44, b44};
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(parts, 2, nullptr),
                            StatusCode::kInvalidArgument, {"out is null"}));
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(nullptr, 2, &empty),
                            StatusCode::kInvalidArgument, {"parts is null"}));
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(parts, 0, &empty),
                            StatusCode::kInvalidArgument, {"n_parts is 0"}));
  EXPECT_TRUE(test::IsError(
      PackedB::PackColumns(parts, PackedB::kMaxColumnParts + 1, &empty),
      StatusCode::kInvalidArgument, {"n_parts is 17"}));
  const MatrixView<const float> bad_data[2] = {
      b44, MatrixView<const float>(nullptr, 4, 4)};
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(bad_data, 2, &empty),
                            StatusCode::kInvalidArgument,
                            {"parts[1].data is null"}));
  const MatrixView<const float> bad_rows[2] = {
      b44, MatrixView<const float>(b.data(), 3, 4)};
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(bad_rows, 2, &empty),
                            StatusCode::kInvalidArgument,
                            {"parts[1] has 3 rows but parts[0] has 4"}));
  EXPECT_EQ(empty.bytes(), 0u);

  PackedB packed;
  ASSERT_TRUE(PackedB::Pack(b44, Transpose::kNo, &packed).ok());
  EXPECT_GT(packed.bytes(), 0u);
  EXPECT_TRUE(test::IsError(Matmul(MatrixView<const float>(a.data(), 4, 3),
                                   Transpose::kNo, packed, c44),
                            StatusCode::kInvalidArgument,
                            {"inner dimensions"}));
  EXPECT_TRUE(test::IsError(
      Matmul(a44, Transpose::kNo, packed, MatrixView<float>(c.data(), 4, 5)),
      StatusCode::kInvalidArgument, {"c is [4, 5]"}));
  EXPECT_TRUE(test::IsError(Matmul(MatrixView<const float>(c.data(), 4, 4),
                                   Transpose::kNo, packed, c44),
                            StatusCode::kInvalidArgument, {"c overlaps a"}));
  for (float x : c) EXPECT_EQ(x, 3.0f) << "c written on error";

  // Moves transfer ownership.
  const size_t bytes = packed.bytes();
  PackedB moved(std::move(packed));
  EXPECT_EQ(moved.bytes(), bytes);
  EXPECT_EQ(packed.bytes(),
            0u);  // NOLINT(bugprone-use-after-move): documented empty
  EXPECT_TRUE(Matmul(a44, Transpose::kNo, moved, c44).ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(c[i], 4.0f);
}

// Sizes near and past INT64_MAX: kResourceExhausted (a byte count that
// overflows, as matmul.h says), without signed overflow (the sanitizer build
// traps on one); nothing is read, allocated or written.
TEST(MatmulErrors, HugeSizes) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t wide = kMax / 4;  // the widest row whose bytes fit
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 3.0f);
  const MatrixView<const float> a44(a.data(), 4, 4), b44(b.data(), 4, 4);
  const MatrixView<float> c44(c.data(), 4, 4);
  const MatrixView<const float> row(b.data(), 1, wide);
  PackedB packed;
  // Four parts of `wide` columns: 2^63 - 4 columns in all, which the panel
  // rounding would take past INT64_MAX; five overflow the column count.
  const MatrixView<const float> rows[5] = {row, row, row, row, row};
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(rows, 4, &packed),
                            StatusCode::kResourceExhausted, {"overflows"}));
  EXPECT_TRUE(test::IsError(PackedB::PackColumns(rows, 5, &packed),
                            StatusCode::kResourceExhausted,
                            {"column count overflows"}));
  EXPECT_TRUE(test::IsError(PackedB::Pack(row, Transpose::kNo, &packed),
                            StatusCode::kResourceExhausted, {"overflows"}));
  EXPECT_TRUE(
      test::IsError(PackedB::Pack(MatrixView<const float>(b.data(), wide, 1),
                                  Transpose::kYes, &packed),
                    StatusCode::kResourceExhausted, {"overflows"}));
  EXPECT_TRUE(
      test::IsError(PackedB::Pack(MatrixView<const float>(b.data(), kMax, 1),
                                  Transpose::kNo, &packed),
                    StatusCode::kResourceExhausted, {"b: rows"}));
  EXPECT_EQ(packed.bytes(), 0u);
  // Views one element past the limit, and strides of INT64_MAX.
  EXPECT_TRUE(test::IsError(
      Mm(MatrixView<const float>(a.data(), 1, wide + 1), b44, c44),
      StatusCode::kResourceExhausted, {"a: rows"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, MatrixView<const float>(b.data(), 4, 4, kMax), c44),
                    StatusCode::kResourceExhausted, {"b: rows (4) x stride"}));
  EXPECT_TRUE(test::IsError(Mm(a44, b44, MatrixView<float>(c.data(), kMax, 4)),
                            StatusCode::kResourceExhausted, {"c: rows"}));
  EXPECT_TRUE(
      test::IsError(Mm(a44, b44, MatrixView<float>(c.data(), 2, 4, kMax)),
                    StatusCode::kResourceExhausted, {"c: rows (2)"}));
  ASSERT_TRUE(PackedB::Pack(b44, Transpose::kNo, &packed).ok());
  EXPECT_TRUE(test::IsError(Matmul(MatrixView<const float>(a.data(), kMax, 4),
                                   Transpose::kNo, packed, c44),
                            StatusCode::kResourceExhausted, {"a: rows"}));
  for (float x : c) EXPECT_EQ(x, 3.0f) << "c written on error";
}

}  // namespace
}  // namespace headway

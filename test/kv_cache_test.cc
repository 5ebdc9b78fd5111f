// KvCache tests, once per stored type (KvDtype) and target: layout and byte
// counts, appends (whole-view and through PendingRows + StoreKvRows), the
// sequence operations (Truncate, CopySequence, Reset), the documented results
// for NaN, inf, all-zero, huge and tiny rows, StoreKvRows and LoadKvRows, and
// every error, which must leave the cache bit-identical (lengths, both buffers
// and the int8 scales, padding and rows past the lengths included).
//
// Every check compares against a plain model: per sequence, the appended K and
// V rows [tokens, n_kv_heads * head_dim] as floats; each cache row must hold
// exactly the bits (and int8 scale) lib/core/storage.h's StoreRow gives for
// the model's row. Source views are strided with NaN padding
// (FillRandomMatrix), so copying a source's padding shows up as NaN in the
// cache rows or their padding, which must stay exactly zero.
#include "headway/kv_cache.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "gtest/gtest.h"
#include "headway/targets.h"
#include "lib/core/storage.h"
#include "tbb/task_arena.h"
#include "test/support/cache.h"
#include "test/support/random.h"
#include "test/support/status_matchers.h"
#include "test/support/target_test.h"

namespace headway {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

constexpr KvDtype kDtypes[] = {KvDtype::kFloat32, KvDtype::kBFloat16,
                               KvDtype::kFloat16, KvDtype::kInt8};

KvCacheConfig ConfigOf(KvDtype dtype, int64_t n_sequences, int64_t n_kv_heads,
                       int64_t head_dim, int64_t capacity) {
  KvCacheConfig config;
  config.n_sequences = n_sequences;
  config.n_kv_heads = n_kv_heads;
  config.head_dim = head_dim;
  config.capacity = capacity;
  config.dtype = dtype;
  return config;
}

bool IsInt8(KvDtype dtype) { return dtype == KvDtype::kInt8; }
// Bytes of one stored row's int8 scale: 4 for int8, else 0.
int64_t ScaleBytes(KvDtype dtype) { return IsInt8(dtype) ? 4 : 0; }
int64_t Size(KvDtype dtype) { return static_cast<int64_t>(KvDtypeSize(dtype)); }

// Every test of KvCacheTest runs once per dtype and target (Append converts
// with the target's StoreRowVec), named by both: "int8_AVX2".
class KvCacheTest
    : public ::testing::TestWithParam<std::tuple<KvDtype, Target>> {
 protected:
  void SetUp() override {
    const Target target = std::get<1>(GetParam());
    ASSERT_TRUE(SetMaxTarget(target.name).ok()) << target.name;
    ASSERT_EQ(ActiveTarget(), target) << target.name;
  }
  void TearDown() override { ResetMaxTarget(); }

  KvDtype dtype() const { return std::get<0>(GetParam()); }
  KvCacheConfig Config(int64_t n_sequences, int64_t n_kv_heads,
                       int64_t head_dim, int64_t capacity) const {
    return ConfigOf(dtype(), n_sequences, n_kv_heads, head_dim, capacity);
  }
};

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<KvDtype, Target>>& info) {
  return std::string(internal::KvDtypeName(std::get<0>(info.param))) + "_" +
         std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, KvCacheTest,
    ::testing::Combine(::testing::ValuesIn(kDtypes),
                       ::testing::ValuesIn(SupportedTargets())),
    ParamName);

}  // namespace

// Prints a dtype by name in gtest messages (found by argument-dependent
// lookup).
void PrintTo(KvDtype dtype, std::ostream* os) {
  *os << internal::KvDtypeName(dtype);
}

namespace {

using test::FloatRows;
using test::MakeCache;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }
// int8 scales: the same bits, or both NaN (the documented scale of a row with
// a NaN or inf; its payload is not part of the contract).
bool SameScale(float a, float b) {
  return SameBits(a, b) || (std::isnan(a) && std::isnan(b));
}

// One row as StoreRow stores it: n elements of dtype as bytes, and the int8
// scale (0 for other dtypes).
struct StoredRow {
  std::vector<unsigned char> bytes;
  float scale = 0.0f;
};
StoredRow StoreOne(KvDtype dtype, const float* x, size_t n) {
  StoredRow row;
  row.bytes.resize(n * KvDtypeSize(dtype));
  internal::VisitKvDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> out(n);
    internal::StoreRow<T>(x, n, out.data(), &row.scale);
    std::memcpy(row.bytes.data(), out.data(), n * sizeof(T));
  });
  return row;
}

// The floats a stored view stands for, [rows * cols], through LoadKvRows.
std::vector<float> Load(const KvView& view) {
  std::vector<float> out(static_cast<size_t>(view.rows * view.cols) + 1);
  const Status status = LoadKvRows(
      view, MatrixView<float>(out.data(), view.rows, view.cols, view.cols));
  EXPECT_TRUE(status.ok()) << status.ToString();
  out.pop_back();
  return out;
}

// What a cache should hold: per sequence, the rows appended so far.
class Model {
 public:
  explicit Model(const KvCacheConfig& config)
      : n_kv_heads_(config.n_kv_heads),
        head_dim_(config.head_dim),
        keys_(config.n_sequences),
        values_(config.n_sequences) {}

  int64_t width() const { return n_kv_heads_ * head_dim_; }
  int64_t length(int64_t seq) const {
    return static_cast<int64_t>(keys_[seq].size()) / width();
  }
  // Head g of token t: [head_dim].
  const float* Row(bool is_key, int64_t seq, int64_t t, int64_t g) const {
    const std::vector<float>& rows = is_key ? keys_[seq] : values_[seq];
    return rows.data() + t * width() + g * head_dim_;
  }

  // Appends the logical [rows, width] matrices of two views.
  void Append(int64_t seq, MatrixView<const float> k,
              MatrixView<const float> v) {
    for (int64_t r = 0; r < k.rows; ++r) {
      keys_[seq].insert(keys_[seq].end(), k.data + r * k.stride,
                        k.data + r * k.stride + k.cols);
      values_[seq].insert(values_[seq].end(), v.data + r * v.stride,
                          v.data + r * v.stride + v.cols);
    }
  }
  void Truncate(int64_t seq, int64_t length) {
    keys_[seq].resize(length * width());
    values_[seq].resize(length * width());
  }
  void Copy(int64_t from, int64_t to) {
    keys_[to] = keys_[from];
    values_[to] = values_[from];
  }

 private:
  int64_t n_kv_heads_, head_dim_;
  std::vector<std::vector<float>> keys_, values_;  // [seq][token * width]
};

// Strided K and V source matrices [rows, width], NaN between rows, starting
// `offset` floats into their buffers (1 to 3: not 8- or 16-byte aligned).
struct Source {
  Source(int64_t rows, int64_t width, int64_t pad, uint64_t seed,
         int64_t offset = 0)
      : stride(width + pad),
        k(offset + rows * stride),
        v(offset + rows * stride),
        k_view(k.data() + offset, rows, width, stride),
        v_view(v.data() + offset, rows, width, stride) {
    test::FillRandomMatrix(k.data() + offset, rows, width, stride, seed);
    test::FillRandomMatrix(v.data() + offset, rows, width, stride, seed + 1000);
  }
  // The views point into k and v: a move keeps those buffers, a copy would not.
  Source(Source&&) = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // Multiplies element (r, c) of K and V by scale(r, c).
  template <class F>
  void Scale(F scale) {
    for (int64_t r = 0; r < k_view.rows; ++r) {
      for (int64_t c = 0; c < k_view.cols; ++c) {
        k[k_view.data - k.data() + r * stride + c] *= scale(r, c);
        v[v_view.data - v.data() + r * stride + c] *= scale(r, c);
      }
    }
  }

  int64_t stride;
  std::vector<float> k, v;
  MatrixView<const float> k_view, v_view;
};

// The cache holds exactly StoreRow of the model's rows (and their int8
// scales), with zero padding and the views' documented shape, alignment and
// scale pointers.
void ExpectMatchesModel(const KvCache& cache, const Model& model) {
  const KvDtype dtype = cache.config().dtype;
  const int64_t head_dim = cache.head_dim();
  const int64_t row_stride = cache.row_stride();
  const int64_t size = Size(dtype);
  for (int64_t seq = 0; seq < cache.n_sequences(); ++seq) {
    ASSERT_EQ(cache.length(seq), model.length(seq)) << "seq " << seq;
    for (int64_t g = 0; g < cache.n_kv_heads(); ++g) {
      for (const bool is_key : {true, false}) {
        const KvView view = is_key ? cache.Keys(seq, g) : cache.Values(seq, g);
        const KvView buffer = is_key ? cache.KeyBuffer() : cache.ValueBuffer();
        const char* name = is_key ? "K" : "V";
        ASSERT_EQ(view.dtype, dtype);
        ASSERT_NE(view.data, nullptr);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(view.data) % (16 * size), 0u);
        ASSERT_EQ(view.rows, model.length(seq));
        ASSERT_EQ(view.cols, head_dim);
        ASSERT_EQ(view.stride, row_stride);
        const int64_t first_row = (seq * cache.n_kv_heads() + g) *
                                  cache.capacity();  // in the whole buffer
        ASSERT_EQ(view.data, static_cast<const char*>(buffer.data) +
                                 first_row * row_stride * size);
        if (IsInt8(dtype)) {
          ASSERT_EQ(view.scales, buffer.scales + first_row);
        } else {
          ASSERT_EQ(view.scales, nullptr);
        }
        for (int64_t t = 0; t < view.rows; ++t) {
          const unsigned char* row =
              static_cast<const unsigned char*>(view.data) +
              t * row_stride * size;
          const StoredRow want = StoreOne(dtype, model.Row(is_key, seq, t, g),
                                          static_cast<size_t>(head_dim));
          for (int64_t b = 0; b < head_dim * size; ++b) {
            ASSERT_EQ(row[b], want.bytes[b])
                << name << " seq " << seq << " head " << g << " token " << t
                << " col " << b / size;
          }
          for (int64_t b = head_dim * size; b < row_stride * size; ++b) {
            ASSERT_EQ(row[b], 0) << name << " padding, seq " << seq << " head "
                                 << g << " token " << t << " col " << b / size;
          }
          if (IsInt8(dtype)) {
            ASSERT_TRUE(SameScale(view.scales[t], want.scale))
                << name << " scale, seq " << seq << " head " << g << " token "
                << t << ": " << view.scales[t] << " != " << want.scale;
          }
        }
      }
    }
  }
}

// Everything a call could change: the lengths, both whole buffers and the
// int8 scales, as bytes.
struct Snapshot {
  explicit Snapshot(const KvCache& cache) {
    for (int64_t seq = 0; seq < cache.n_sequences(); ++seq) {
      lengths.push_back(cache.length(seq));
    }
    for (const KvView& buffer : {cache.KeyBuffer(), cache.ValueBuffer()}) {
      if (buffer.data == nullptr) continue;
      const auto* data = static_cast<const unsigned char*>(buffer.data);
      bytes.insert(bytes.end(), data,
                   data + buffer.rows * buffer.stride * Size(buffer.dtype));
      if (buffer.scales != nullptr) {
        const auto* scales =
            reinterpret_cast<const unsigned char*>(buffer.scales);
        bytes.insert(bytes.end(), scales, scales + buffer.rows * 4);
      }
    }
  }
  bool operator==(const Snapshot& other) const {
    return lengths == other.lengths && bytes == other.bytes;
  }
  bool AllZero() const {
    for (unsigned char b : bytes) {
      if (b != 0) return false;
    }
    return true;
  }
  std::vector<int64_t> lengths;
  std::vector<unsigned char> bytes;  // K, its scales, V, its scales
};

// Appends random rows to the cache and the model; `pad` extra source columns.
void AppendRandom(KvCache* cache, Model* model, int64_t seq, int64_t rows,
                  int64_t pad, uint64_t seed) {
  const Source src(rows, model->width(), pad, seed);
  const Status status = cache->Append(seq, src.k_view, src.v_view);
  ASSERT_TRUE(status.ok()) << status.ToString();
  model->Append(seq, src.k_view, src.v_view);
}

TEST_P(KvCacheTest, CreateLayout) {
  const int64_t size = Size(dtype());
  const std::pair<int64_t, int64_t> stride_of[] = {
      {1, 16},  {15, 16}, {16, 16},   {17, 32},  {72, 80},
      {80, 80}, {96, 96}, {128, 128}, {256, 256}};
  for (const auto& [head_dim, row_stride] : stride_of) {
    for (const int64_t n_kv_heads : {1, 3}) {
      const KvCacheConfig config = Config(2, n_kv_heads, head_dim, 5);
      const KvCache cache = MakeCache(config);
      ASSERT_EQ(cache.row_stride(), row_stride) << "head_dim " << head_dim;
      EXPECT_EQ(cache.n_sequences(), 2);
      EXPECT_EQ(cache.n_kv_heads(), n_kv_heads);
      EXPECT_EQ(cache.head_dim(), head_dim);
      EXPECT_EQ(cache.capacity(), 5);
      EXPECT_EQ(cache.config().dtype, dtype());
      EXPECT_EQ(cache.config().head_dim, head_dim);
      EXPECT_EQ(cache.head_stride(), 5 * row_stride);
      EXPECT_EQ(cache.scale_head_stride(), IsInt8(dtype()) ? 5 : 0);
      const int64_t row_bytes = row_stride * size + ScaleBytes(dtype());
      EXPECT_EQ(cache.bytes_per_token(),
                static_cast<size_t>(2 * n_kv_heads * row_bytes));
      EXPECT_EQ(KvCache::BytesPerToken(config), cache.bytes_per_token());
      EXPECT_EQ(cache.bytes(),
                static_cast<size_t>(2 * 2 * n_kv_heads * 5 * row_bytes));
      EXPECT_EQ(cache.bytes(), 2 * 5 * cache.bytes_per_token());
      for (int64_t seq = 0; seq < 2; ++seq) {
        EXPECT_EQ(cache.length(seq), 0);
        for (int64_t g = 0; g < n_kv_heads; ++g) {
          for (const KvView& view :
               {cache.Keys(seq, g), cache.Values(seq, g)}) {
            EXPECT_EQ(view.dtype, dtype());
            ASSERT_NE(view.data, nullptr);
            EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data) % (16 * size), 0u);
            EXPECT_EQ(view.rows, 0);
            EXPECT_EQ(view.cols, head_dim);
            EXPECT_EQ(view.stride, row_stride);
            EXPECT_EQ(view.scales != nullptr, IsInt8(dtype()));
          }
          // [sequence][kv_head][capacity][row_stride]: heads follow each
          // other, capacity rows apart; int8 scales [sequence][kv_head]
          // [capacity].
          const int64_t head = seq * n_kv_heads + g;
          EXPECT_EQ(cache.Keys(seq, g).data,
                    static_cast<const char*>(cache.Keys(0, 0).data) +
                        head * cache.head_stride() * size);
          EXPECT_EQ(cache.Values(seq, g).data,
                    static_cast<const char*>(cache.Values(0, 0).data) +
                        head * cache.head_stride() * size);
          if (IsInt8(dtype())) {
            EXPECT_EQ(
                cache.Keys(seq, g).scales,
                cache.Keys(seq, 0).scales + g * cache.scale_head_stride());
            EXPECT_EQ(cache.Values(seq, g).scales,
                      cache.Values(0, 0).scales + head * 5);
          }
        }
      }
      // KeyBuffer and ValueBuffer: each whole buffer, padding and scales
      // included.
      const int64_t buffer_rows = 2 * n_kv_heads * 5;
      const KvView buffers[2][2] = {{cache.KeyBuffer(), cache.Keys(0, 0)},
                                    {cache.ValueBuffer(), cache.Values(0, 0)}};
      for (const auto& [buffer, first] : buffers) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data) % 64, 0u);
        EXPECT_EQ(buffer.dtype, dtype());
        EXPECT_EQ(buffer.data, first.data);
        EXPECT_EQ(buffer.scales, first.scales);
        EXPECT_EQ(buffer.rows, buffer_rows);
        EXPECT_EQ(buffer.cols, row_stride);
        EXPECT_EQ(buffer.stride, row_stride);
        EXPECT_EQ(static_cast<size_t>(buffer.rows * buffer.stride * size +
                                      buffer.rows * ScaleBytes(dtype())),
                  cache.bytes() / 2);
      }
      // Both buffers and the scales are all zeros, padding and unused rows
      // included.
      EXPECT_TRUE(Snapshot(cache).AllZero());
    }
  }
}

// A cache over several 2 MiB pieces, the last one partial, created in arenas
// of 1, 2 and 7 threads (AllocateLargeZeroed gives each thread a share of the
// pieces to zero), in memory that held a dirty cache of the same size just
// before (glibc's heap serves both once its mmap and trim thresholds are
// raised, so a piece left unzeroed shows; AddressSanitizer's allocator
// ignores them, and catches a write past the buffer instead): every byte is
// zero, scales and padding included.
TEST(KvCache, LargeCacheIsZeroOnEveryThreadCount) {
#if defined(__GLIBC__)
  (void)mallopt(M_MMAP_THRESHOLD, 64 << 20);
  (void)mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
  for (const KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBFloat16,
                              KvDtype::kFloat16, KvDtype::kInt8}) {
    // 3 x 7001 rows of 112 elements: 9.0 MiB of float32 per buffer.
    const KvCacheConfig config = ConfigOf(dtype, 1, 3, 100, 7001);
    for (const int threads : {1, 2, 7}) {
      SCOPED_TRACE(testing::Message() << "dtype " << static_cast<int>(dtype)
                                      << ", " << threads << " threads");
      {
        KvCache dirty = MakeCache(config);
        for (const KvView& buffer : {dirty.KeyBuffer(), dirty.ValueBuffer()}) {
          // The test's own cache, written behind its back to leave the
          // memory dirty.
          std::memset(const_cast<void*>(buffer.data), 0xA5,
                      buffer.rows * buffer.stride * Size(dtype));
          if (buffer.scales != nullptr) {
            std::memset(const_cast<float*>(buffer.scales), 0xA5,
                        buffer.rows * sizeof(float));
          }
        }
      }
      KvCache cache;
      tbb::task_arena arena(threads);
      arena.execute([&] {
        const Status status = KvCache::Create(config, &cache);
        EXPECT_TRUE(status.ok()) << status.ToString();
      });
      EXPECT_TRUE(Snapshot(cache).AllZero());
    }
  }
#if defined(__GLIBC__)
  // glibc's defaults.
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_TRIM_THRESHOLD, 128 << 10);
#endif
}

// Exact byte counts of a typical config (8 KV heads of 128): 2 x 8 x 128 x
// 4 bytes for float32, half that for bf16 and f16, and 2 x 8 x (128 + 4) for
// int8 with its scales.
TEST(KvCache, BytesPerTokenOfEachDtype) {
  const std::pair<KvDtype, size_t> bytes_of[] = {{KvDtype::kFloat32, 8192},
                                                 {KvDtype::kBFloat16, 4096},
                                                 {KvDtype::kFloat16, 4096},
                                                 {KvDtype::kInt8, 2112}};
  for (const auto& [dtype, bytes] : bytes_of) {
    const KvCacheConfig config = ConfigOf(dtype, 3, 8, 128, 7);
    EXPECT_EQ(KvCache::BytesPerToken(config), bytes);
    const KvCache cache = MakeCache(config);
    EXPECT_EQ(cache.bytes_per_token(), bytes);
    EXPECT_EQ(cache.bytes(), 3 * 7 * bytes);
  }
  EXPECT_EQ(KvDtypeSize(KvDtype::kFloat32), 4u);
  EXPECT_EQ(KvDtypeSize(KvDtype::kBFloat16), 2u);
  EXPECT_EQ(KvDtypeSize(KvDtype::kFloat16), 2u);
  EXPECT_EQ(KvDtypeSize(KvDtype::kInt8), 1u);
  EXPECT_EQ(KvDtypeSize(static_cast<KvDtype>(4)), 0u);
  EXPECT_EQ(KvDtypeSize(static_cast<KvDtype>(-1)), 0u);
  // head_dim 1 still takes a 16-element row.
  EXPECT_EQ(KvCache::BytesPerToken(ConfigOf(KvDtype::kInt8, 1, 1, 1, 1)),
            size_t{2 * (16 + 4)});
}

TEST_P(KvCacheTest, AppendInChunks) {
  uint64_t seed = 1;
  for (const int64_t head_dim : {1, 16, 17, 72}) {
    for (const int64_t n_kv_heads : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message()
                   << "head_dim " << head_dim << ", n_kv_heads " << n_kv_heads);
      const KvCacheConfig config = Config(3, n_kv_heads, head_dim, 40);
      KvCache cache = MakeCache(config);
      Model model(config);
      // Chunk sizes: a decode step (1), a prefill, chunks across 16-row
      // boundaries; sequences in a mixed order.
      const std::pair<int64_t, int64_t> chunks[] = {
          {0, 1}, {1, 5}, {0, 16}, {2, 1}, {0, 1}, {1, 7}, {2, 39}, {0, 22}};
      for (const auto& [seq, rows] : chunks) {
        ASSERT_NO_FATAL_FAILURE(
            AppendRandom(&cache, &model, seq, rows, seed % 2 ? 3 : 0, seed));
        ++seed;
        ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
      }
      EXPECT_EQ(cache.length(0), 40);  // full
      EXPECT_EQ(cache.length(1), 12);
      EXPECT_EQ(cache.length(2), 40);
    }
  }
}

TEST_P(KvCacheTest, CapacityExceededChangesNothing) {
  const KvCacheConfig config = Config(2, 2, 17, 10);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 8, 2, 1));
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 1, 3, 0, 2));
  const Snapshot before(cache);
  const Source three(3, model.width(), 1, 3);
  EXPECT_TRUE(test::IsError(
      cache.Append(0, three.k_view, three.v_view), StatusCode::kOutOfRange,
      {"length (8) + k.rows (3) exceeds capacity (10) of seq 0"},
      "KvCache::Append: "));
  EXPECT_TRUE(Snapshot(cache) == before);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  // Exactly full is fine; one more is not.
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 2, 0, 4));
  const Snapshot full(cache);
  const Source one(1, model.width(), 0, 5);
  EXPECT_TRUE(test::IsError(
      cache.Append(0, one.k_view, one.v_view), StatusCode::kOutOfRange,
      {"length (10) + k.rows (1) exceeds capacity (10)"}, "KvCache::Append: "));
  EXPECT_TRUE(Snapshot(cache) == full);
  // A chunk larger than the whole capacity, into an emptier sequence.
  const Source big(11, model.width(), 0, 6);
  EXPECT_TRUE(test::IsError(
      cache.Append(1, big.k_view, big.v_view), StatusCode::kOutOfRange,
      {"length (3) + k.rows (11) exceeds capacity (10) of seq 1"},
      "KvCache::Append: "));
  EXPECT_TRUE(Snapshot(cache) == full);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

TEST_P(KvCacheTest, AppendRejectsBadArgumentsWithoutWriting) {
  const KvCacheConfig config = Config(4, 2, 3, 8);  // width 6
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 1, 2, 1, 1));
  const Snapshot before(cache);
  std::vector<float> buf(64, 0.5f);
  const float* data = buf.data();
  const MatrixView<const float> good(data, 2, 6, 7);
  struct Case {
    int64_t seq;
    MatrixView<const float> k, v;
    StatusCode code;
    const char* expect;
  };
  const Case cases[] = {
      {-1, good, good, StatusCode::kInvalidArgument,
       "seq (-1) is out of range [0, 4)"},
      {4, good, good, StatusCode::kInvalidArgument,
       "seq (4) is out of range [0, 4)"},
      {kInt64Min, good, good, StatusCode::kInvalidArgument,
       "seq (-9223372036854775808) is out of range [0, 4)"},
      {0,
       {nullptr, 2, 6, 6},
       good,
       StatusCode::kInvalidArgument,
       "k.data is null"},
      {0,
       good,
       {nullptr, 2, 6, 6},
       StatusCode::kInvalidArgument,
       "v.data is null"},
      {0,
       {data, 0, 6, 6},
       {data, 0, 6, 6},
       StatusCode::kInvalidArgument,
       "k.rows must be >= 1 (got 0)"},
      {0,
       {data, -2, 6, 6},
       good,
       StatusCode::kInvalidArgument,
       "k.rows must be >= 1 (got -2)"},
      {0,
       good,
       {data, -1, 6, 6},
       StatusCode::kInvalidArgument,
       "v.rows must be >= 1 (got -1)"},
      {0,
       {data, 2, 0, 6},
       good,
       StatusCode::kInvalidArgument,
       "k.cols must be >= 1 (got 0)"},
      {0,
       good,
       {data, 2, -6, 6},
       StatusCode::kInvalidArgument,
       "v.cols must be >= 1 (got -6)"},
      {0,
       {data, 2, 6, 5},
       good,
       StatusCode::kInvalidArgument,
       "k.stride (5) is shorter than k.cols (6)"},
      {0,
       good,
       {data, 2, 6, -1},
       StatusCode::kInvalidArgument,
       "v.stride (-1) is shorter than v.cols (6)"},
      {0,
       good,
       {data, 3, 6, 6},
       StatusCode::kInvalidArgument,
       "v is [3, 6] but k is [2, 6]"},
      {0,
       good,
       {data, 2, 5, 6},
       StatusCode::kInvalidArgument,
       "v is [2, 5] but k is [2, 6]"},
      {0,
       {data, 2, 5, 6},
       {data, 2, 5, 6},
       StatusCode::kInvalidArgument,
       "k.cols (5) must be n_kv_heads * head_dim (2 * 3 = 6)"},
      {0,
       {data, 2, 7, 7},
       {data, 2, 7, 7},
       StatusCode::kInvalidArgument,
       "k.cols (7) must be n_kv_heads * head_dim (2 * 3 = 6)"},
      {0,
       {data, int64_t{1} << 40, 6, int64_t{1} << 40},
       good,
       StatusCode::kResourceExhausted,
       "k: rows (1099511627776) x stride (1099511627776) overflows"},
      // Shapes are checked before the capacity.
      {0,
       {data, 9, 5, 5},
       {data, 9, 5, 5},
       StatusCode::kInvalidArgument,
       "k.cols (5) must be"},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(test::IsError(cache.Append(c.seq, c.k, c.v), c.code, {c.expect},
                              "KvCache::Append: "));
    EXPECT_TRUE(Snapshot(cache) == before) << c.expect;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

// The direct-write path (PendingRows, StoreKvRows, CommitAppend) gives the
// same cache, bit for bit, as Append.
TEST_P(KvCacheTest, PendingRowsThenCommitEqualsAppend) {
  const int64_t size = Size(dtype());
  for (const int64_t head_dim : {5, 16, 80}) {
    const KvCacheConfig config = Config(2, 3, head_dim, 24);
    KvCache appended = MakeCache(config);
    KvCache direct = MakeCache(config);
    Model model(config);
    uint64_t seed = 10;
    for (const auto& [seq, rows] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 4}, {1, 1}, {0, 1}, {1, 17}, {0, 19}}) {
      const Source src(rows, model.width(), 2, seed++, seq + 1);
      ASSERT_TRUE(appended.Append(seq, src.k_view, src.v_view).ok());
      model.Append(seq, src.k_view, src.v_view);
      const int64_t length = direct.length(seq);
      for (int64_t g = 0; g < 3; ++g) {
        KvMutableView k, v;
        ASSERT_TRUE(direct.PendingRows(seq, g, rows, &k, &v).ok());
        EXPECT_EQ(direct.length(seq), length);  // not yet
        for (const auto& [view, rows_of] :
             {std::pair{k, direct.Keys(seq, g)},
              std::pair{v, direct.Values(seq, g)}}) {
          EXPECT_EQ(view.dtype, dtype());
          EXPECT_EQ(view.data, static_cast<const char*>(rows_of.data) +
                                   length * view.stride * size);
          EXPECT_EQ(view.rows, rows);
          EXPECT_EQ(view.cols, head_dim);
          EXPECT_EQ(view.stride, direct.row_stride());
          if (IsInt8(dtype())) {
            EXPECT_EQ(view.scales, rows_of.scales + length);
          } else {
            EXPECT_EQ(view.scales, nullptr);
          }
        }
        // Head g's columns of the source.
        const MatrixView<const float> k_src(src.k_view.data + g * head_dim,
                                            rows, head_dim, src.stride);
        const MatrixView<const float> v_src(src.v_view.data + g * head_dim,
                                            rows, head_dim, src.stride);
        ASSERT_TRUE(StoreKvRows(k_src, k).ok());
        ASSERT_TRUE(StoreKvRows(v_src, v).ok());
      }
      ASSERT_TRUE(direct.CommitAppend(seq, rows).ok());
      ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(direct, model));
    }
    EXPECT_TRUE(Snapshot(direct) == Snapshot(appended));
  }
}

TEST_P(KvCacheTest, PendingRowsAndCommitRejectBadArguments) {
  const KvCacheConfig config = Config(3, 2, 16, 6);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 2, 4, 0, 1));
  const Snapshot before(cache);
  float sentinel = 0.0f;
  const KvMutableView untouched{KvDtype::kFloat16, &sentinel, 7, 8, 9,
                                &sentinel};
  struct Case {
    int64_t seq, kv_head, n_new;
    StatusCode code;
    const char* expect;
  };
  const Case cases[] = {
      {-1, 0, 1, StatusCode::kInvalidArgument,
       "seq (-1) is out of range [0, 3)"},
      {3, 0, 1, StatusCode::kInvalidArgument, "seq (3) is out of range [0, 3)"},
      {0, -1, 1, StatusCode::kInvalidArgument,
       "kv_head (-1) is out of range [0, 2)"},
      {0, 2, 1, StatusCode::kInvalidArgument,
       "kv_head (2) is out of range [0, 2)"},
      {0, 0, 0, StatusCode::kInvalidArgument, "n_new must be >= 1 (got 0)"},
      {0, 0, -5, StatusCode::kInvalidArgument, "n_new must be >= 1 (got -5)"},
      {0, 0, 7, StatusCode::kOutOfRange,
       "length (0) + n_new (7) exceeds capacity (6) of seq 0"},
      {2, 1, 3, StatusCode::kOutOfRange,
       "length (4) + n_new (3) exceeds capacity (6) of seq 2"},
      {2, 1, kInt64Max, StatusCode::kOutOfRange,
       "length (4) + n_new (9223372036854775807) exceeds capacity (6)"},
  };
  for (const Case& c : cases) {
    KvMutableView k = untouched, v = untouched;
    EXPECT_TRUE(
        test::IsError(cache.PendingRows(c.seq, c.kv_head, c.n_new, &k, &v),
                      c.code, {c.expect}, "KvCache::PendingRows: "));
    EXPECT_EQ(k.data, untouched.data);
    EXPECT_EQ(k.rows, 7);
    EXPECT_EQ(v.data, untouched.data);
    EXPECT_EQ(v.stride, 9);
    EXPECT_TRUE(Snapshot(cache) == before) << c.expect;
    // CommitAppend checks the same seq, n_new and capacity (it has no head).
    if (c.kv_head == 0 || c.code == StatusCode::kOutOfRange) {
      EXPECT_TRUE(test::IsError(cache.CommitAppend(c.seq, c.n_new), c.code,
                                {c.expect}, "KvCache::CommitAppend: "));
      EXPECT_TRUE(Snapshot(cache) == before) << c.expect;
    }
  }
  KvMutableView k = untouched, v = untouched;
  EXPECT_TRUE(test::IsError(cache.PendingRows(0, 0, 1, nullptr, &v),
                            StatusCode::kInvalidArgument, {"k is null"},
                            "KvCache::PendingRows: "));
  EXPECT_TRUE(test::IsError(cache.PendingRows(0, 0, 1, &k, nullptr),
                            StatusCode::kInvalidArgument, {"v is null"},
                            "KvCache::PendingRows: "));
  EXPECT_TRUE(test::IsError(
      cache.PendingRows(0, 0, 1, &k, &k), StatusCode::kInvalidArgument,
      {"k and v point to the same view"}, "KvCache::PendingRows: "));
  EXPECT_EQ(k.data, untouched.data);
  EXPECT_EQ(v.data, untouched.data);
  EXPECT_TRUE(Snapshot(cache) == before);
  // Filling to exactly the capacity works.
  ASSERT_TRUE(cache.PendingRows(2, 1, 2, &k, &v).ok());
  ASSERT_TRUE(cache.CommitAppend(2, 2).ok());
  EXPECT_EQ(cache.length(2), 6);
}

// Rolling back tokens and appending others gives the cache a fresh one would
// have with the kept and the new tokens.
TEST_P(KvCacheTest, TruncateThenAppendEqualsFreshCache) {
  const KvCacheConfig config = Config(2, 2, 17, 16);
  KvCache rolled_back = MakeCache(config);
  KvCache fresh = MakeCache(config);
  Model model(config);
  const Source prompt(6, model.width(), 1, 1);
  const Source rejected(5, model.width(), 0, 2);
  const Source accepted(4, model.width(), 3, 3);
  ASSERT_TRUE(rolled_back.Append(1, prompt.k_view, prompt.v_view).ok());
  ASSERT_TRUE(rolled_back.Append(1, rejected.k_view, rejected.v_view).ok());
  ASSERT_EQ(rolled_back.length(1), 11);
  ASSERT_TRUE(rolled_back.Truncate(1, 8).ok());  // keeps 2 of the 5
  EXPECT_EQ(rolled_back.length(1), 8);
  EXPECT_EQ(rolled_back.Keys(1, 1).rows, 8);
  ASSERT_TRUE(rolled_back.Truncate(1, 6).ok());
  ASSERT_TRUE(rolled_back.Truncate(1, 6).ok());  // no-op
  ASSERT_TRUE(rolled_back.Append(1, accepted.k_view, accepted.v_view).ok());

  ASSERT_TRUE(fresh.Append(1, prompt.k_view, prompt.v_view).ok());
  ASSERT_TRUE(fresh.Append(1, accepted.k_view, accepted.v_view).ok());
  model.Append(1, prompt.k_view, prompt.v_view);
  model.Append(1, accepted.k_view, accepted.v_view);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(rolled_back, model));
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(fresh, model));
  // Truncate to 0 empties the sequence.
  ASSERT_TRUE(rolled_back.Truncate(1, 0).ok());
  EXPECT_EQ(rolled_back.length(1), 0);
  EXPECT_EQ(rolled_back.Values(1, 0).rows, 0);
}

TEST_P(KvCacheTest, TruncateRejectsBadArguments) {
  const KvCacheConfig config = Config(2, 1, 4, 8);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 5, 0, 1));
  const Snapshot before(cache);
  EXPECT_TRUE(test::IsError(cache.Truncate(-1, 0), StatusCode::kInvalidArgument,
                            {"seq (-1) is out of range [0, 2)"},
                            "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(cache.Truncate(2, 0), StatusCode::kInvalidArgument,
                            {"seq (2) is out of range [0, 2)"},
                            "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(
      cache.Truncate(0, -1), StatusCode::kOutOfRange,
      {"new_length (-1) is out of range [0, 5], the length of seq 0"},
      "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(cache.Truncate(0, 6), StatusCode::kOutOfRange,
                            {"new_length (6) is out of range [0, 5]"},
                            "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(
      cache.Truncate(1, 1), StatusCode::kOutOfRange,
      {"new_length (1) is out of range [0, 0], the length of seq 1"},
      "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(
      cache.Truncate(0, kInt64Min), StatusCode::kOutOfRange,
      {"new_length (-9223372036854775808)"}, "KvCache::Truncate: "));
  EXPECT_TRUE(Snapshot(cache) == before);
}

// Forked sequences share the prompt and then diverge without touching each
// other, including when the target held a longer sequence before.
TEST_P(KvCacheTest, CopySequenceForksIndependentSequences) {
  const KvCacheConfig config = Config(4, 2, 24, 32);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 3, 20, 0, 1));
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 9, 2, 2));
  for (const int64_t to : {1, 3}) {
    ASSERT_TRUE(cache.CopySequence(0, to).ok());
    model.Copy(0, to);
  }
  ASSERT_TRUE(cache.CopySequence(2, 2).ok());  // no-op
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  EXPECT_EQ(cache.length(3), 9);  // was 20
  uint64_t seed = 3;
  for (int step = 0; step < 3; ++step) {
    for (const int64_t seq : {0, 1, 3}) {
      ASSERT_NO_FATAL_FAILURE(
          AppendRandom(&cache, &model, seq, 1 + seq, step, seed++));
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  // Copying an empty sequence empties the target.
  ASSERT_TRUE(cache.CopySequence(2, 1).ok());
  model.Copy(2, 1);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));

  const Snapshot before(cache);
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(-1, 0), StatusCode::kInvalidArgument,
      {"from (-1) is out of range [0, 4)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(4, 0), StatusCode::kInvalidArgument,
      {"from (4) is out of range [0, 4)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(0, -1), StatusCode::kInvalidArgument,
      {"to (-1) is out of range [0, 4)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(0, 4), StatusCode::kInvalidArgument,
      {"to (4) is out of range [0, 4)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(7, 7), StatusCode::kInvalidArgument,
      {"from (7) is out of range [0, 4)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(Snapshot(cache) == before);
}

// k and v may be views of a float32 cache: Append copies tokens between
// sequences (n_kv_heads 1, where a head's view has the width Append wants).
TEST(KvCache, AppendFromItsOwnViews) {
  const KvCacheConfig config = ConfigOf(KvDtype::kFloat32, 2, 1, 17, 12);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 5, 1, 1));
  ASSERT_TRUE(
      cache
          .Append(1, FloatRows(cache.Keys(0, 0)), FloatRows(cache.Values(0, 0)))
          .ok());
  model.Copy(0, 1);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  // From its own earlier rows, onto its end.
  const MatrixView<const float> k = FloatRows(cache.Keys(0, 0)),
                                v = FloatRows(cache.Values(0, 0));
  ASSERT_TRUE(cache.Append(0, k, v).ok());
  model.Append(0, k, v);  // k, v still show the first 5 rows
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

TEST_P(KvCacheTest, ResetAndResetAll) {
  const KvCacheConfig config = Config(3, 2, 9, 8);
  KvCache cache = MakeCache(config);
  Model model(config);
  for (int64_t seq = 0; seq < 3; ++seq) {
    ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, seq, 3 + seq, 1, seq));
  }
  ASSERT_TRUE(cache.Reset(1).ok());
  model.Truncate(1, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 1, 8, 0, 10));
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));

  const Snapshot before(cache);
  EXPECT_TRUE(test::IsError(cache.Reset(-1), StatusCode::kInvalidArgument,
                            {"seq (-1) is out of range [0, 3)"},
                            "KvCache::Reset: "));
  EXPECT_TRUE(test::IsError(cache.Reset(3), StatusCode::kInvalidArgument,
                            {"seq (3) is out of range [0, 3)"},
                            "KvCache::Reset: "));
  EXPECT_TRUE(Snapshot(cache) == before);

  cache.ResetAll();
  for (int64_t seq = 0; seq < 3; ++seq) {
    EXPECT_EQ(cache.length(seq), 0);
    model.Truncate(seq, 0);
  }
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 2, 8, 0, 11));
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

TEST_P(KvCacheTest, AccessorsOfBadIndicesAreEmpty) {
  const KvCacheConfig config = Config(2, 3, 8, 4);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 1, 2, 0, 1));
  for (const auto& [seq, kv_head] : std::vector<std::pair<int64_t, int64_t>>{
           {-1, 0}, {2, 0}, {kInt64Min, 0}, {0, -1}, {1, 3}, {1, kInt64Max}}) {
    for (const KvView& view :
         {cache.Keys(seq, kv_head), cache.Values(seq, kv_head)}) {
      EXPECT_EQ(view.data, nullptr) << seq << ", " << kv_head;
      EXPECT_EQ(view.rows, 0);
      EXPECT_EQ(view.cols, 0);
      EXPECT_EQ(view.stride, 0);
      EXPECT_EQ(view.scales, nullptr);
    }
  }
  EXPECT_EQ(cache.length(-1), 0);
  EXPECT_EQ(cache.length(2), 0);
  EXPECT_EQ(cache.length(kInt64Max), 0);
  EXPECT_EQ(cache.length(1), 2);
}

TEST_P(KvCacheTest, CreateRejectsBadConfigs) {
  // *out holds a cache with data: every error must leave it as it was.
  const KvCacheConfig good = Config(2, 2, 8, 4);
  KvCache out = MakeCache(good);
  Model model(good);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&out, &model, 1, 3, 0, 1));
  const Snapshot before(out);
  const void* keys = out.Keys(0, 0).data;

  EXPECT_TRUE(test::IsError(KvCache::Create(good, nullptr),
                            StatusCode::kInvalidArgument, {"out is null"},
                            "KvCache::Create: "));
  struct Case {
    KvCacheConfig config;
    StatusCode code;
    std::string expect;
  };
  std::vector<Case> cases;
  const char* names[] = {"n_sequences", "n_kv_heads", "head_dim", "capacity"};
  for (int i = 0; i < 4; ++i) {
    for (const int64_t bad : {int64_t{0}, int64_t{-1}, kInt64Min}) {
      KvCacheConfig config = good;
      int64_t* fields[] = {&config.n_sequences, &config.n_kv_heads,
                           &config.head_dim, &config.capacity};
      *fields[i] = bad;
      cases.push_back({config, StatusCode::kInvalidArgument,
                       std::string("config.") + names[i] +
                           " must be >= 1 (got " + std::to_string(bad) + ")"});
    }
  }
  KvCacheConfig bad_dtype = good;
  bad_dtype.dtype = static_cast<KvDtype>(7);
  cases.push_back({bad_dtype, StatusCode::kInvalidArgument,
                   "config.dtype (7) is not a known KvDtype"});
  // Overflows: of int64_t, of the head_dim rounding, and of K + V together.
  const std::string element =
      std::to_string(Size(dtype())) + " bytes" +
      (IsInt8(dtype()) ? " + 4 bytes of scale) overflows" : " overflows");
  cases.push_back({Config(4, int64_t{1} << 20, 128, int64_t{1} << 40),
                   StatusCode::kResourceExhausted,
                   std::string("2 x n_sequences (4) x n_kv_heads (1048576) x "
                               "capacity (1099511627776) x ") +
                       (IsInt8(dtype()) ? "(" : "") +
                       "head_dim (128) rounded up to 16 x " + element});
  cases.push_back(
      {Config(1, 1, kInt64Max, 1), StatusCode::kResourceExhausted,
       "head_dim (9223372036854775807) rounded up to 16 x " + element});
  cases.push_back({Config(kInt64Max, kInt64Max, 1, 1),
                   StatusCode::kResourceExhausted, "overflows"});
  // 2^62 bytes of elements per buffer fits int64_t; K and V together do not.
  cases.push_back({Config(1, 1, 16, (int64_t{1} << 58) / Size(dtype())),
                   StatusCode::kResourceExhausted, "overflows"});
  // 2^52 bytes (4 PiB) of elements per buffer: representable, but no machine
  // has it (under ASan too: test/support/sanitizer_options.cc).
  cases.push_back({Config(1, 1, 16, (int64_t{1} << 48) / Size(dtype())),
                   StatusCode::kResourceExhausted, "out of memory"});
  for (const Case& c : cases) {
    EXPECT_TRUE(test::IsError(KvCache::Create(c.config, &out), c.code,
                              {c.expect}, "KvCache::Create: "));
    EXPECT_EQ(out.config().head_dim, 8) << c.expect;
    EXPECT_EQ(out.Keys(0, 0).data, keys);
    EXPECT_TRUE(Snapshot(out) == before) << c.expect;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(out, model));
}

TEST_P(KvCacheTest, CreateReplacesWhatOutHeld) {
  KvCache cache = MakeCache(Config(2, 2, 8, 4));
  Model old_model(cache.config());
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &old_model, 1, 3, 0, 1));
  const KvCacheConfig config = Config(3, 1, 33, 5);
  ASSERT_TRUE(KvCache::Create(config, &cache).ok());
  EXPECT_EQ(cache.n_sequences(), 3);
  EXPECT_EQ(cache.row_stride(), 48);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 2, 5, 2, 2));
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

void ExpectEmpty(KvCache& cache) {
  EXPECT_EQ(cache.n_sequences(), 0);
  EXPECT_EQ(cache.n_kv_heads(), 0);
  EXPECT_EQ(cache.head_dim(), 0);
  EXPECT_EQ(cache.capacity(), 0);
  EXPECT_EQ(cache.row_stride(), 0);
  EXPECT_EQ(cache.head_stride(), 0);
  EXPECT_EQ(cache.scale_head_stride(), 0);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_EQ(cache.bytes_per_token(), 0u);
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_EQ(cache.Keys(0, 0).data, nullptr);
  EXPECT_EQ(cache.Values(0, 0).data, nullptr);
  EXPECT_EQ(cache.KeyBuffer().data, nullptr);
  EXPECT_EQ(cache.ValueBuffer().rows, 0);
  EXPECT_EQ(cache.KeyBuffer().scales, nullptr);
  float data[4] = {};
  const MatrixView<const float> row(data, 1, 4);
  EXPECT_TRUE(
      test::IsError(cache.Append(0, row, row), StatusCode::kInvalidArgument,
                    {"seq (0) is out of range [0, 0)"}, "KvCache::Append: "));
  KvMutableView k, v;
  EXPECT_TRUE(test::IsError(
      cache.PendingRows(0, 0, 1, &k, &v), StatusCode::kInvalidArgument,
      {"seq (0) is out of range [0, 0)"}, "KvCache::PendingRows: "));
  EXPECT_TRUE(test::IsError(
      cache.CommitAppend(0, 1), StatusCode::kInvalidArgument,
      {"seq (0) is out of range [0, 0)"}, "KvCache::CommitAppend: "));
  EXPECT_TRUE(test::IsError(cache.Truncate(0, 0), StatusCode::kInvalidArgument,
                            {"seq (0) is out of range [0, 0)"},
                            "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(0, 0), StatusCode::kInvalidArgument,
      {"from (0) is out of range [0, 0)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(test::IsError(cache.Reset(0), StatusCode::kInvalidArgument,
                            {"seq (0) is out of range [0, 0)"},
                            "KvCache::Reset: "));
  cache.ResetAll();
}

TEST(KvCache, DefaultConstructedIsEmpty) {
  KvCache cache;
  ExpectEmpty(cache);
}

TEST_P(KvCacheTest, MoveTransfersTheBuffersAndEmptiesTheSource) {
  const KvCacheConfig config = Config(2, 2, 20, 6);
  KvCache first = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&first, &model, 0, 4, 1, 1));
  const void* keys = first.Keys(0, 0).data;
  const size_t bytes = first.bytes();

  KvCache second(std::move(first));
  EXPECT_EQ(second.Keys(0, 0).data, keys);  // moved, not copied
  EXPECT_EQ(second.bytes(), bytes);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(second, model));
  ExpectEmpty(first);  // NOLINT(bugprone-use-after-move): documented state

  KvCache third = MakeCache(Config(1, 1, 4, 2));
  third = std::move(second);
  EXPECT_EQ(third.Keys(0, 0).data, keys);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(third, model));
  ExpectEmpty(second);  // NOLINT(bugprone-use-after-move)

  KvCache& alias = third;
  third = std::move(alias);  // self-move keeps the cache
  EXPECT_EQ(third.Keys(0, 0).data, keys);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(third, model));

  // A moved-from cache can be created again, and keeps working after.
  ASSERT_TRUE(KvCache::Create(config, &first).ok());
  Model fresh(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&first, &fresh, 1, 6, 0, 2));
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(first, fresh));
}

// Sizes near and past INT64_MAX, every entry point: the status kv_cache.h
// documents, without signed overflow (the sanitizer build traps on one), and
// the cache unchanged.
TEST_P(KvCacheTest, HugeSizesAreRejectedWithoutOverflow) {
  const KvCacheConfig config = Config(2, 2, 8, 4);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 1, 3, 0, 1));
  const Snapshot before(cache);
  // Create: head_dim whose rounding up to 16 overflows by one, head_dim that
  // rounds but whose bytes overflow, and products that overflow by far.
  for (const KvCacheConfig& bad :
       {Config(1, 1, kInt64Max - 14, 1), Config(1, 1, kInt64Max - 15, 1),
        Config(int64_t{1} << 62, 2, 16, 1), Config(1, kInt64Max, 1, kInt64Max),
        Config(kInt64Max, 1, 16, 1)}) {
    KvCache out;
    EXPECT_TRUE(test::IsError(KvCache::Create(bad, &out),
                              StatusCode::kResourceExhausted, {"overflows"},
                              "KvCache::Create: "));
    EXPECT_EQ(out.n_sequences(), 0);
    EXPECT_EQ(KvCache::BytesPerToken(bad), 0u);
  }
  // BytesPerToken of a config Create rejects for its sizes or dtype: 0.
  EXPECT_EQ(KvCache::BytesPerToken(Config(1, 1, 0, 1)), 0u);
  KvCacheConfig bad_dtype = config;
  bad_dtype.dtype = static_cast<KvDtype>(4);
  EXPECT_EQ(KvCache::BytesPerToken(bad_dtype), 0u);
  // A token of 2^40 KV heads still counts exactly.
  EXPECT_EQ(KvCache::BytesPerToken(Config(1, int64_t{1} << 40, 16, 1)),
            static_cast<size_t>((int64_t{1} << 41) *
                                (16 * Size(dtype()) + ScaleBytes(dtype()))));
  // Append: views whose byte span overflows; then more rows than fit.
  std::vector<float> rows(64, 1.0f);
  const int64_t width = config.n_kv_heads * config.head_dim;
  const MatrixView<const float> good(rows.data(), 1, width);
  const MatrixView<const float> tall(rows.data(), kInt64Max, width);
  const MatrixView<const float> strided(rows.data(), 2, width, kInt64Max);
  EXPECT_TRUE(
      test::IsError(cache.Append(0, tall, tall), StatusCode::kResourceExhausted,
                    {"k: rows (9223372036854775807)"}, "KvCache::Append: "));
  EXPECT_TRUE(test::IsError(
      cache.Append(0, good, strided), StatusCode::kResourceExhausted,
      {"v: rows (2) x stride (9223372036854775807)"}, "KvCache::Append: "));
  const MatrixView<const float> many(rows.data(), kInt64Max / (4 * width),
                                     width);
  EXPECT_TRUE(test::IsError(cache.Append(0, many, many),
                            StatusCode::kOutOfRange, {"exceeds capacity"},
                            "KvCache::Append: "));
  // Lengths: length + n_new past INT64_MAX.
  KvMutableView k, v;
  EXPECT_TRUE(test::IsError(cache.PendingRows(0, 0, kInt64Max, &k, &v),
                            StatusCode::kOutOfRange, {"exceeds capacity"},
                            "KvCache::PendingRows: "));
  EXPECT_TRUE(test::IsError(cache.CommitAppend(0, kInt64Max),
                            StatusCode::kOutOfRange, {"exceeds capacity"},
                            "KvCache::CommitAppend: "));
  EXPECT_TRUE(test::IsError(
      cache.Truncate(0, kInt64Max), StatusCode::kOutOfRange,
      {"new_length (9223372036854775807)"}, "KvCache::Truncate: "));
  EXPECT_TRUE(test::IsError(
      cache.CopySequence(kInt64Max, 0), StatusCode::kInvalidArgument,
      {"from (9223372036854775807)"}, "KvCache::CopySequence: "));
  EXPECT_TRUE(test::IsError(cache.Reset(kInt64Max),
                            StatusCode::kInvalidArgument,
                            {"seq (9223372036854775807)"}, "KvCache::Reset: "));
  EXPECT_TRUE(cache.Keys(kInt64Max, 0).data == nullptr);
  EXPECT_TRUE(cache.Values(0, kInt64Max).data == nullptr);
  EXPECT_TRUE(Snapshot(cache) == before);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

// Calls on different sequences may run concurrently (the contract in
// kv_cache.h); under a thread sanitizer this is the race check.
TEST_P(KvCacheTest, ConcurrentAppendsToDifferentSequences) {
  const int64_t n_sequences = 4;
  const KvCacheConfig config = Config(n_sequences, 2, 17, 64);
  KvCache cache = MakeCache(config);
  Model model(config);
  std::vector<Source> sources;
  for (int64_t seq = 0; seq < n_sequences; ++seq) {
    sources.emplace_back(64, model.width(), 1, 100 + seq);
  }
  std::vector<std::thread> threads;
  for (int64_t seq = 0; seq < n_sequences; ++seq) {
    threads.emplace_back([&cache, &sources, seq] {
      const Source& src = sources[seq];
      for (int64_t t = 0; t < 64; ++t) {
        const MatrixView<const float> k(src.k_view.data + t * src.stride, 1,
                                        src.k_view.cols, src.stride);
        const MatrixView<const float> v(src.v_view.data + t * src.stride, 1,
                                        src.v_view.cols, src.stride);
        if (!cache.Append(seq, k, v).ok()) return;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int64_t seq = 0; seq < n_sequences; ++seq) {
    model.Append(seq, sources[seq].k_view, sources[seq].v_view);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

// Sources at every alignment (1 to 3 floats past a vector boundary) and
// stride, at head sizes around the 16-element row: every cache row holds
// StoreRow's bits of its source row.
TEST_P(KvCacheTest, AppendFromStridedAndMisalignedViews) {
  uint64_t seed = 40;
  for (const int64_t head_dim : {1, 7, 16, 33}) {
    const KvCacheConfig config = Config(2, 2, head_dim, 27);
    KvCache cache = MakeCache(config);
    Model model(config);
    for (const int64_t offset : {1, 2, 3}) {
      for (const int64_t pad : {0, 1, 5}) {
        const int64_t seq = (offset + pad) % 2;
        const Source src(1 + pad, model.width(), pad, seed++, offset);
        ASSERT_TRUE(cache.Append(seq, src.k_view, src.v_view).ok());
        model.Append(seq, src.k_view, src.v_view);
      }
    }
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  }
}

// Rows across the whole float range (2^-40 .. 2^24 times [-1, 1], some
// elements of each row far apart): bf16 and f16 rounding, f16 subnormals and
// overflow to inf, int8 rows with a wide spread.
TEST_P(KvCacheTest, AppendWideRangeRows) {
  const KvCacheConfig config = Config(1, 2, 37, 64);
  KvCache cache = MakeCache(config);
  Model model(config);
  Source src(64, model.width(), 3, 77, 1);
  test::SplitMix64 rng(78);
  src.Scale([&](int64_t, int64_t) {
    return std::ldexp(1.0f, static_cast<int>(rng.Uniform(-40.0f, 24.0f)));
  });
  ASSERT_TRUE(cache.Append(0, src.k_view, src.v_view).ok());
  model.Append(0, src.k_view, src.v_view);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

// What LoadKvRows reads back from random rows is within each dtype's rounding
// bound of what was appended: exact (float32), half an ulp of 8 (bf16) or 11
// (f16) significant bits, scale / 2 (int8; plus the float rounding of x / scale
// and scale * q, under 2^-16 scale).
TEST_P(KvCacheTest, LoadKvRowsReadsTheRoundedValues) {
  const KvCacheConfig config = Config(1, 3, 40, 32);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 32, 2, 5));
  for (int64_t g = 0; g < 3; ++g) {
    for (const bool is_key : {true, false}) {
      const KvView view = is_key ? cache.Keys(0, g) : cache.Values(0, g);
      const std::vector<float> got = Load(view);
      for (int64_t t = 0; t < 32; ++t) {
        const float* row = model.Row(is_key, 0, t, g);
        double max_abs = 0.0;
        for (int64_t c = 0; c < 40; ++c) {
          max_abs = std::fmax(max_abs, std::fabs(double{row[c]}));
        }
        for (int64_t c = 0; c < 40; ++c) {
          const double x = row[c];
          const double error = std::fabs(x - got[t * 40 + c]);
          double bound = 0.0;
          switch (dtype()) {
            case KvDtype::kFloat32:
              break;
            case KvDtype::kBFloat16:
              bound = std::fabs(x) * std::ldexp(1.0, -8);
              break;
            case KvDtype::kFloat16:
              // Random rows in [-1, 1]: normal halves (>= 2^-14) or the
              // subnormal step 2^-24 below.
              bound = std::fmax(std::fabs(x) * std::ldexp(1.0, -11),
                                std::ldexp(1.0, -25));
              break;
            case KvDtype::kInt8: {
              const double scale = view.scales[t];
              EXPECT_EQ(view.scales[t], static_cast<float>(max_abs / 127.0))
                  << "token " << t;
              bound = scale * (0.5 + std::ldexp(1.0, -16));
              break;
            }
          }
          ASSERT_LE(error, bound) << "token " << t << " col " << c << ": " << x
                                  << " read back as " << got[t * 40 + c];
        }
      }
    }
  }
}

// NaN, +-inf, all-zero, huge (up to FLT_MAX) and tiny (below 127 * FLT_MIN)
// rows: stored as storage.h's table says, no error, and only the row (one
// token's head) that holds them changes: the other head of the same token and
// the other tokens read back as if appended alone.
TEST_P(KvCacheTest, NanInfZeroHugeAndTinyRows) {
  const int64_t head_dim = 21;
  const KvCacheConfig config = Config(1, 2, head_dim, 16);
  KvCache cache = MakeCache(config);
  Model model(config);
  Source src(8, model.width(), 1, 91, 2);
  // Head 0's columns of row r get the special values; head 1 stays random.
  float* k = src.k.data() + (src.k_view.data - src.k.data());
  auto head0 = [&](int64_t r) { return k + r * src.stride; };
  head0(1)[4] = kNaN;
  head0(2)[0] = kInf;
  head0(3)[head_dim - 1] = -kInf;
  std::fill(head0(4), head0(4) + head_dim, 0.0f);
  for (int64_t c = 0; c < head_dim; ++c) head0(5)[c] *= FLT_MAX;
  head0(5)[7] = -FLT_MAX;
  for (int64_t c = 0; c < head_dim; ++c) head0(6)[c] *= 1e-37f;
  ASSERT_TRUE(cache.Append(0, src.k_view, src.v_view).ok());
  model.Append(0, src.k_view, src.v_view);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));

  // Appended alone, without the special rows: the same bits everywhere else.
  KvCache clean = MakeCache(config);
  Source plain(8, model.width(), 1, 91, 2);
  ASSERT_TRUE(clean.Append(0, plain.k_view, plain.v_view).ok());
  const KvView keys = cache.Keys(0, 0);
  const KvView clean_keys = clean.Keys(0, 0);
  const std::vector<float> got = Load(keys);
  const std::vector<float> want = Load(clean_keys);
  const std::vector<float> head1 = Load(cache.Keys(0, 1));
  const std::vector<float> clean_head1 = Load(clean.Keys(0, 1));
  for (size_t i = 0; i < head1.size(); ++i) {
    ASSERT_TRUE(SameBits(head1[i], clean_head1[i])) << i;
  }
  for (const int64_t t : {0, 7}) {
    for (int64_t c = 0; c < head_dim; ++c) {
      ASSERT_TRUE(SameBits(got[t * head_dim + c], want[t * head_dim + c]))
          << "token " << t << " col " << c;
    }
  }
  EXPECT_TRUE(Snapshot(cache).bytes.size() == Snapshot(clean).bytes.size());
  auto at = [&](int64_t t, int64_t c) { return got[t * head_dim + c]; };
  const float* x5 = head0(5);
  const float* x6 = head0(6);
  if (IsInt8(dtype())) {
    // A NaN or inf makes the row's scale NaN and every element NaN.
    for (const int64_t t : {1, 2, 3}) {
      EXPECT_TRUE(std::isnan(keys.scales[t])) << t;
      for (int64_t c = 0; c < head_dim; ++c) ASSERT_TRUE(std::isnan(at(t, c)));
    }
    // All-zero and tiny rows: scale 0, zeros.
    for (const int64_t t : {4, 6}) {
      EXPECT_TRUE(SameBits(keys.scales[t], 0.0f)) << t;
      for (int64_t c = 0; c < head_dim; ++c) {
        ASSERT_TRUE(SameBits(at(t, c), 0.0f)) << t << ", " << c;
      }
    }
    // Huge: finite, within half a scale (the scale is one ulp under
    // FLT_MAX / 127, so 127 * scale stays finite).
    const float scale = keys.scales[5];
    EXPECT_TRUE(std::isfinite(scale));
    EXPECT_EQ(scale, std::nextafter(FLT_MAX / 127.0f, 0.0f));
    for (int64_t c = 0; c < head_dim; ++c) {
      ASSERT_TRUE(std::isfinite(at(5, c))) << c;
      ASSERT_LE(std::fabs(double{x5[c]} - at(5, c)),
                scale * (0.5 + std::ldexp(1.0, -16)))
          << c;
    }
  } else {
    // NaN stays NaN, inf stays inf, in their own element only.
    EXPECT_TRUE(std::isnan(at(1, 4)));
    EXPECT_EQ(at(2, 0), kInf);
    EXPECT_EQ(at(3, head_dim - 1), -kInf);
    for (int64_t t = 1; t <= 3; ++t) {
      for (int64_t c = 0; c < head_dim; ++c) {
        if ((t == 1 && c == 4) || (t == 2 && c == 0) ||
            (t == 3 && c == head_dim - 1)) {
          continue;
        }
        ASSERT_TRUE(std::isfinite(at(t, c))) << t << ", " << c;
      }
    }
    for (int64_t c = 0; c < head_dim; ++c) {
      ASSERT_TRUE(SameBits(at(4, c), 0.0f));
      if (dtype() == KvDtype::kFloat16) {
        // Beyond 65520: inf of its sign; tiny: signed zero.
        ASSERT_EQ(at(5, c), std::copysign(kInf, x5[c])) << c;
        ASSERT_EQ(at(6, c), 0.0f) << c;
        ASSERT_EQ(std::signbit(at(6, c)), std::signbit(x6[c])) << c;
      } else {
        // bf16 has float32's exponent range: huge and tiny rows stay finite
        // and nonzero (FLT_MAX itself rounds to inf in bf16: its
        // significand rounds up past the largest exponent).
        if (std::fabs(x5[c]) < 0x1.fefffep127f) {
          ASSERT_TRUE(std::isfinite(at(5, c))) << c;
        }
        ASSERT_NE(at(6, c), 0.0f) << c;
      }
    }
  }
}

// StoreKvRows and LoadKvRows on views outside any cache: strided, misaligned
// float views and stored views with a longer stride; rows between the
// elements (the stored padding) are not written.
TEST_P(KvCacheTest, StoreKvRowsAndLoadKvRows) {
  const int64_t size = Size(dtype());
  uint64_t seed = 300;
  for (const int64_t cols : {1, 8, 19, 64}) {
    for (const int64_t rows : {1, 5}) {
      const int64_t float_stride = cols + 3, stored_stride = cols + 2;
      std::vector<float> src(1 + rows * float_stride);
      test::FillRandomMatrix(src.data() + 1, rows, cols, float_stride, seed++,
                             -4.0f, 4.0f);
      const MatrixView<const float> src_view(src.data() + 1, rows, cols,
                                             float_stride);
      std::vector<unsigned char> stored(rows * stored_stride * size, 0xA5);
      std::vector<float> scales(rows, -1.0f);
      const KvMutableView dst{
          dtype(), stored.data(), rows,
          cols,    stored_stride, IsInt8(dtype()) ? scales.data() : nullptr};
      ASSERT_TRUE(StoreKvRows(src_view, dst).ok());
      for (int64_t r = 0; r < rows; ++r) {
        const StoredRow want =
            StoreOne(dtype(), src_view.data + r * float_stride,
                     static_cast<size_t>(cols));
        const unsigned char* row = stored.data() + r * stored_stride * size;
        ASSERT_EQ(std::memcmp(row, want.bytes.data(), cols * size), 0) << r;
        for (int64_t b = cols * size; b < stored_stride * size; ++b) {
          ASSERT_EQ(row[b], 0xA5) << "padding of row " << r;
        }
        if (IsInt8(dtype())) {
          ASSERT_TRUE(SameBits(scales[r], want.scale));
        }
      }
      // Back to floats: LoadRow of each stored row, the destination's padding
      // untouched.
      std::vector<float> out(2 + rows * (cols + 1), -7.0f);
      ASSERT_TRUE(LoadKvRows(dst, MatrixView<float>(out.data() + 2, rows, cols,
                                                    cols + 1))
                      .ok());
      internal::VisitKvDtype(dtype(), [&](auto tag) {
        using T = decltype(tag);
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> want(cols);
          internal::LoadRow<T>(
              reinterpret_cast<const T*>(stored.data()) + r * stored_stride,
              static_cast<size_t>(cols), IsInt8(dtype()) ? scales[r] : 1.0f,
              want.data());
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_TRUE(SameBits(out[2 + r * (cols + 1) + c], want[c]))
                << r << ", " << c;
          }
          if (r + 1 < rows) {
            ASSERT_EQ(out[2 + r * (cols + 1) + cols], -7.0f);
          }
        }
      });
      EXPECT_EQ(out[0], -7.0f);
      EXPECT_EQ(out[1], -7.0f);
    }
  }
  // Zero rows on both sides: nothing to do.
  float x = 1.0f;
  unsigned char byte = 3;
  float scale = 2.0f;
  const KvMutableView none{dtype(), &byte, 0,
                           1,       1,     IsInt8(dtype()) ? &scale : nullptr};
  EXPECT_TRUE(StoreKvRows(MatrixView<const float>(&x, 0, 1, 1), none).ok());
  EXPECT_TRUE(LoadKvRows(none, MatrixView<float>(&x, 0, 1, 1)).ok());
  EXPECT_EQ(byte, 3);
  EXPECT_EQ(x, 1.0f);
  EXPECT_EQ(scale, 2.0f);
}

// Every bad view is a Status naming the argument, with nothing written.
TEST_P(KvCacheTest, StoreKvRowsAndLoadKvRowsRejectBadViews) {
  const int64_t size = Size(dtype());
  std::vector<float> floats(64, 0.5f);
  std::vector<unsigned char> stored(256, 0x5A);
  std::vector<float> scales(16, 3.0f);
  float* const scale_ptr = IsInt8(dtype()) ? scales.data() : nullptr;
  const KvMutableView good{dtype(), stored.data(), 2, 4, 6, scale_ptr};
  const MatrixView<const float> src(floats.data(), 2, 4, 5);
  ASSERT_TRUE(StoreKvRows(src, good).ok());
  const std::vector<float> floats_before = floats;
  const std::vector<unsigned char> stored_before = stored;
  const std::vector<float> scales_before = scales;

  struct Case {
    KvMutableView kv;
    MatrixView<const float> floats;
    StatusCode code;
    std::string store_expect, load_expect;  // StoreKvRows: dst; Load: src
  };
  auto with = [&](auto change) {
    KvMutableView view = good;
    change(&view);
    return view;
  };
  std::vector<Case> cases = {
      {with([](KvMutableView* v) { v->dtype = static_cast<KvDtype>(9); }), src,
       StatusCode::kInvalidArgument, "dst.dtype (9) is not a known KvDtype",
       "src.dtype (9) is not a known KvDtype"},
      {with([](KvMutableView* v) { v->data = nullptr; }), src,
       StatusCode::kInvalidArgument, "dst.data is null", "src.data is null"},
      {with([](KvMutableView* v) { v->rows = -1; }), src,
       StatusCode::kInvalidArgument, "dst.rows (-1) is negative",
       "src.rows (-1) is negative"},
      {with([](KvMutableView* v) { v->cols = 0; }), src,
       StatusCode::kInvalidArgument, "dst.cols must be >= 1 (got 0)",
       "src.cols must be >= 1 (got 0)"},
      {with([](KvMutableView* v) { v->stride = 3; }), src,
       StatusCode::kInvalidArgument,
       "dst.stride (3) is shorter than dst.cols (4)",
       "src.stride (3) is shorter than src.cols (4)"},
      {with([](KvMutableView* v) { v->rows = kInt64Max; }), src,
       StatusCode::kResourceExhausted, "dst: rows (9223372036854775807)",
       "src: rows (9223372036854775807)"},
      {with([](KvMutableView* v) { v->rows = 3; }), src,
       StatusCode::kInvalidArgument, "dst is [3, 4] but src is [2, 4]",
       "src is [3, 4] but dst is [2, 4]"},
      {with([](KvMutableView* v) { v->cols = 5; }), src,
       StatusCode::kInvalidArgument, "dst is [2, 5] but src is [2, 4]",
       "src is [2, 5] but dst is [2, 4]"},
      {good, MatrixView<const float>(nullptr, 2, 4, 5),
       StatusCode::kInvalidArgument, "src.data is null", "dst.data is null"},
      {good, MatrixView<const float>(floats.data(), -2, 4, 5),
       StatusCode::kInvalidArgument, "src.rows (-2) is negative",
       "dst.rows (-2) is negative"},
      {good, MatrixView<const float>(floats.data(), 2, 4, 3),
       StatusCode::kInvalidArgument, "src.stride (3) is shorter than src.cols",
       "dst.stride (3) is shorter than dst.cols"},
      // The float view inside the stored elements.
      {good,
       MatrixView<const float>(
           reinterpret_cast<const float*>(stored.data()) + 1, 2, 4, 5),
       StatusCode::kInvalidArgument, "dst overlaps src", "src overlaps dst"},
  };
  if (IsInt8(dtype())) {
    cases.push_back({with([](KvMutableView* v) { v->scales = nullptr; }), src,
                     StatusCode::kInvalidArgument,
                     "dst.scales is null for dtype int8",
                     "src.scales is null for dtype int8"});
    // The float view over the scales.
    cases.push_back({good, MatrixView<const float>(scales.data() + 1, 2, 4, 5),
                     StatusCode::kInvalidArgument, "dst.scales overlaps src",
                     "src.scales overlaps dst"});
  } else {
    cases.push_back({with([&](KvMutableView* v) { v->scales = scales.data(); }),
                     src, StatusCode::kInvalidArgument,
                     std::string("dst.scales is not null for dtype ") +
                         internal::KvDtypeName(dtype()),
                     std::string("src.scales is not null for dtype ") +
                         internal::KvDtypeName(dtype())});
  }
  if (dtype() == KvDtype::kFloat32) {
    // A float32 view identical to the stored one is in place, not an overlap.
    const MatrixView<const float> same(
        reinterpret_cast<const float*>(stored.data()), 2, 4, 6);
    EXPECT_TRUE(StoreKvRows(same, good).ok());
    EXPECT_TRUE(stored == stored_before);
  }
  for (const Case& c : cases) {
    EXPECT_TRUE(test::IsError(StoreKvRows(c.floats, c.kv), c.code,
                              {c.store_expect}, "StoreKvRows: "));
    EXPECT_TRUE(stored == stored_before) << c.store_expect;
    EXPECT_TRUE(scales == scales_before) << c.store_expect;
    // LoadKvRows into the same float memory (a mutable view of it).
    const MatrixView<float> dst(const_cast<float*>(c.floats.data),
                                c.floats.rows, c.floats.cols, c.floats.stride);
    EXPECT_TRUE(test::IsError(LoadKvRows(c.kv, dst), c.code, {c.load_expect},
                              "LoadKvRows: "));
    EXPECT_TRUE(floats == floats_before) << c.load_expect;
    EXPECT_TRUE(stored == stored_before) << c.load_expect;
    EXPECT_TRUE(scales == scales_before) << c.load_expect;
  }
  (void)size;
}

// A host's round trip: read a sequence's rows back as floats (LoadKvRows) and
// append them to another sequence; the stored bits are StoreRow of what was
// read, and for bf16 and f16 exactly the first sequence's (storing a stored
// value again is exact).
TEST_P(KvCacheTest, AppendWhatLoadKvRowsReadBack) {
  const KvCacheConfig config = Config(2, 1, 24, 8);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 6, 1, 61));
  const std::vector<float> k = Load(cache.Keys(0, 0));
  const std::vector<float> v = Load(cache.Values(0, 0));
  const MatrixView<const float> k_view(k.data(), 6, 24),
      v_view(v.data(), 6, 24);
  ASSERT_TRUE(cache.Append(1, k_view, v_view).ok());
  model.Append(1, k_view, v_view);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
  if (!IsInt8(dtype())) {
    const int64_t bytes = 6 * cache.row_stride() * Size(dtype());
    EXPECT_EQ(std::memcmp(cache.Keys(0, 0).data, cache.Keys(1, 0).data, bytes),
              0);
  }
}

// Serializing as kv_cache.h says: the stored bytes and int8 scales of each
// head, copied out of Keys and Values and back through PendingRows and
// CommitAppend, give the same sequence.
TEST_P(KvCacheTest, SaveAndRestoreStoredBits) {
  const KvCacheConfig config = Config(2, 3, 20, 9);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 0, 7, 1, 81));
  const int64_t rows = cache.length(0);
  const size_t bytes =
      static_cast<size_t>(rows * cache.row_stride()) * KvDtypeSize(dtype());
  std::vector<std::vector<unsigned char>> saved;
  std::vector<std::vector<float>> saved_scales;
  for (int64_t g = 0; g < 3; ++g) {
    for (const KvView& view : {cache.Keys(0, g), cache.Values(0, g)}) {
      const auto* data = static_cast<const unsigned char*>(view.data);
      saved.emplace_back(data, data + bytes);
      saved_scales.emplace_back(
          view.scales, view.scales + (view.scales != nullptr ? rows : 0));
    }
  }
  for (int64_t g = 0; g < 3; ++g) {
    KvMutableView k, v;
    ASSERT_TRUE(cache.PendingRows(1, g, rows, &k, &v).ok());
    int i = 0;
    for (const KvMutableView& view : {k, v}) {
      const size_t at = static_cast<size_t>(2 * g + i++);
      std::memcpy(view.data, saved[at].data(), bytes);
      if (view.scales != nullptr) {
        std::memcpy(view.scales, saved_scales[at].data(), rows * sizeof(float));
      }
    }
  }
  ASSERT_TRUE(cache.CommitAppend(1, rows).ok());
  model.Copy(0, 1);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(cache, model));
}

// ---------------------------------------------------------------- Ring mode
//
// A ring cache is checked against a reference: a non-ring cache, large enough
// for every position, that was given the same rows. Each held position p of
// the ring (the sinks and [ring_begin, length)) must hold in row Slot(p)
// exactly the bytes, zero padding and int8 scale of the reference's row p.

KvCacheConfig RingConfigOf(KvDtype dtype, int64_t n_sequences,
                           int64_t n_kv_heads, int64_t head_dim,
                           int64_t capacity, int64_t n_sink_tokens) {
  KvCacheConfig config =
      ConfigOf(dtype, n_sequences, n_kv_heads, head_dim, capacity);
  config.ring = true;
  config.n_sink_tokens = n_sink_tokens;
  return config;
}

// The documented Slot rule, written out again for the tests.
int64_t ExpectedSlot(int64_t p, int64_t capacity, int64_t sinks) {
  return p < sinks ? p : sinks + (p - sinks) % (capacity - sinks);
}

// One stored row of a view (Keys or Values) as a one-row view.
KvView RowOf(const KvView& view, int64_t row) {
  KvView one = view;
  one.data = static_cast<const char*>(view.data) +
             row * view.stride * static_cast<int64_t>(KvDtypeSize(view.dtype));
  one.rows = 1;
  if (view.scales != nullptr) one.scales = view.scales + row;
  return one;
}

// Row `row` of (seq, head g) of `ring` holds exactly what row `ref_row` of
// (ref_seq, g) of `ref` holds: bytes, padding, int8 scale and the floats
// LoadKvRows reads back; K and V.
void ExpectSameRow(const KvCache& ring, int64_t seq, int64_t row,
                   const KvCache& ref, int64_t ref_seq, int64_t ref_row,
                   int64_t g) {
  const int64_t size = Size(ring.config().dtype);
  for (const bool is_key : {true, false}) {
    const KvView got_view = is_key ? ring.Keys(seq, g) : ring.Values(seq, g);
    const KvView want_view =
        is_key ? ref.Keys(ref_seq, g) : ref.Values(ref_seq, g);
    ASSERT_LT(row, got_view.rows);
    ASSERT_LT(ref_row, want_view.rows);
    const KvView got = RowOf(got_view, row), want = RowOf(want_view, ref_row);
    ASSERT_EQ(std::memcmp(got.data, want.data, got.stride * size), 0)
        << (is_key ? "K" : "V") << " head " << g << " row " << row
        << " != reference row " << ref_row;
    if (got.scales != nullptr) {
      ASSERT_TRUE(SameScale(*got.scales, *want.scales))
          << "scale of row " << row << ": " << *got.scales
          << " != " << *want.scales;
    }
    const std::vector<float> got_floats = Load(got);
    const std::vector<float> want_floats = Load(want);
    for (size_t c = 0; c < got_floats.size(); ++c) {
      ASSERT_TRUE(SameBits(got_floats[c], want_floats[c])) << "col " << c;
    }
  }
}

// Sequence seq of `ring` holds the positions kv_cache.h says, each as row p of
// ref_seq of `ref`, with the length, ring_begin and view rows documented.
void ExpectRingHolds(const KvCache& ring, int64_t seq, const KvCache& ref,
                     int64_t ref_seq, int64_t ring_begin) {
  const int64_t length = ring.length(seq);
  const int64_t capacity = ring.capacity();
  const int64_t sinks = ring.config().n_sink_tokens;
  ASSERT_EQ(length, ref.length(ref_seq));
  ASSERT_EQ(ring.ring_begin(seq), ring_begin);
  ASSERT_GE(ring_begin, sinks);
  ASSERT_LE(length - ring_begin, capacity - sinks);
  for (int64_t g = 0; g < ring.n_kv_heads(); ++g) {
    ASSERT_EQ(ring.Keys(seq, g).rows, std::min(length, capacity));
    ASSERT_EQ(ring.Values(seq, g).rows, std::min(length, capacity));
    for (int64_t p = 0; p < length; ++p) {
      if (p >= sinks && p < ring_begin) continue;  // dropped
      ASSERT_EQ(ring.Slot(p), ExpectedSlot(p, capacity, sinks)) << p;
      ASSERT_NO_FATAL_FAILURE(
          ExpectSameRow(ring, seq, ring.Slot(p), ref, ref_seq, p, g))
          << "position " << p;
    }
  }
}

// The ring_begin of a ring that only grew to `length`.
int64_t GrownRingBegin(int64_t length, int64_t capacity, int64_t sinks) {
  return std::max(sinks, length - (capacity - sinks));
}

TEST_P(KvCacheTest, RingSlotsRingBeginAndContiguousRows) {
  // Hand-computed slots of capacity 5 with 2 sinks (a ring of 3 rows).
  {
    const KvCache cache = MakeCache(RingConfigOf(dtype(), 1, 1, 4, 5, 2));
    const std::pair<int64_t, int64_t> slot_of[] = {{0, 0}, {1, 1}, {2, 2},
                                                   {3, 3}, {4, 4}, {5, 2},
                                                   {7, 4}, {8, 2}, {100, 4}};
    for (const auto& [position, slot] : slot_of) {
      EXPECT_EQ(cache.Slot(position), slot) << position;
    }
  }
  uint64_t seed = 500;
  for (const auto& [capacity, sinks] : std::vector<std::pair<int64_t, int64_t>>{
           {5, 0}, {5, 2}, {5, 4}, {1, 0}, {8, 3}, {2, 1}}) {
    SCOPED_TRACE(::testing::Message()
                 << "capacity " << capacity << ", sinks " << sinks);
    const KvCacheConfig config =
        RingConfigOf(dtype(), 2, 2, 3, capacity, sinks);
    KvCache cache = MakeCache(config);
    EXPECT_TRUE(cache.config().ring);
    EXPECT_EQ(cache.config().n_sink_tokens, sinks);
    for (int64_t p = 0; p < 5 * capacity; ++p) {
      ASSERT_EQ(cache.Slot(p), ExpectedSlot(p, capacity, sinks)) << p;
    }
    EXPECT_EQ(cache.ring_begin(0), sinks);
    EXPECT_EQ(cache.ContiguousRows(0), capacity);
    EXPECT_EQ(cache.ring_begin(-1), 0);
    EXPECT_EQ(cache.ring_begin(2), 0);
    EXPECT_EQ(cache.ContiguousRows(-1), 0);
    EXPECT_EQ(cache.ContiguousRows(2), 0);
    EXPECT_EQ(cache.ContiguousRows(kInt64Min), 0);
    const Source src(1, 6, 0, seed++);
    for (int64_t length = 1; length <= 3 * capacity + 1; ++length) {
      ASSERT_TRUE(cache.Append(1, src.k_view, src.v_view).ok());
      ASSERT_EQ(cache.length(1), length);
      EXPECT_EQ(cache.ring_begin(1), GrownRingBegin(length, capacity, sinks));
      // The rows from Slot(length) to the end of the buffer: the next
      // positions, until the ring wraps.
      const int64_t contiguous = cache.ContiguousRows(1);
      EXPECT_EQ(contiguous, length < sinks
                                ? capacity - length
                                : (capacity - sinks) -
                                      (length - sinks) % (capacity - sinks));
      EXPECT_EQ(cache.Slot(length) + contiguous, capacity);
      for (int64_t i = 1; i < contiguous; ++i) {
        EXPECT_EQ(cache.Slot(length + i), cache.Slot(length) + i);
      }
      EXPECT_EQ(cache.Keys(1, 1).rows, std::min(length, capacity));
      // The other sequence stays empty.
      EXPECT_EQ(cache.length(0), 0);
      EXPECT_EQ(cache.ring_begin(0), sinks);
    }
  }
  // Without ring: Slot is the position, ring_begin 0, ContiguousRows the room.
  KvCache plain = MakeCache(Config(2, 1, 4, 6));
  Model model(plain.config());
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&plain, &model, 0, 4, 0, 1));
  EXPECT_FALSE(plain.config().ring);
  EXPECT_EQ(plain.Slot(0), 0);
  EXPECT_EQ(plain.Slot(5), 5);
  EXPECT_EQ(plain.ring_begin(0), 0);
  EXPECT_EQ(plain.ring_begin(1), 0);
  EXPECT_EQ(plain.ContiguousRows(0), 2);
  EXPECT_EQ(plain.ContiguousRows(1), 6);
  EXPECT_EQ(plain.ContiguousRows(2), 0);
}

// Appends of 1, R - 1, R, R + 1 and 3R + 2 rows, around and across several
// wraps: after each call every held position reads back what a non-ring cache
// stores for its row; the other sequence's rows stay zero.
TEST_P(KvCacheTest, RingAppendAcrossWraps) {
  uint64_t seed = 600;
  for (const auto& [capacity, sinks] : std::vector<std::pair<int64_t, int64_t>>{
           {6, 0}, {6, 2}, {7, 6}, {5, 4}, {9, 1}}) {
    SCOPED_TRACE(::testing::Message()
                 << "capacity " << capacity << ", sinks " << sinks);
    const int64_t ring_rows = capacity - sinks;
    const int64_t head_dim = 17;
    KvCache ring =
        MakeCache(RingConfigOf(dtype(), 2, 2, head_dim, capacity, sinks));
    std::vector<int64_t> calls = {
        1, ring_rows - 1, ring_rows, ring_rows + 1, 3 * ring_rows + 2,
        1, ring_rows,     1,         ring_rows + 1};
    int64_t total = 0;
    for (const int64_t n : calls) total += n;
    KvCache ref = MakeCache(Config(1, 2, head_dim, total));
    int64_t length = 0;
    for (const int64_t n : calls) {
      if (n < 1) continue;  // R - 1 of a one-row ring
      const int64_t offset = 1 + static_cast<int64_t>(seed % 3);
      const Source src(n, 2 * head_dim, 3, seed++, offset);
      ASSERT_TRUE(ring.Append(1, src.k_view, src.v_view).ok());
      ASSERT_TRUE(ref.Append(0, src.k_view, src.v_view).ok());
      length += n;
      SCOPED_TRACE(::testing::Message() << "length " << length);
      ASSERT_NO_FATAL_FAILURE(ExpectRingHolds(
          ring, 1, ref, 0, GrownRingBegin(length, capacity, sinks)));
      // Sequence 0: no length, all-zero rows.
      EXPECT_EQ(ring.length(0), 0);
      const KvView keys0 = ring.KeyBuffer();
      const auto* bytes = static_cast<const unsigned char*>(keys0.data);
      for (int64_t b = 0; b < 2 * capacity * keys0.stride * Size(dtype());
           ++b) {
        ASSERT_EQ(bytes[b], 0) << "byte " << b << " of seq 0";
      }
    }
  }
}

// PendingRows, StoreKvRows and CommitAppend, in pieces of at most
// ContiguousRows, give the same cache as Append; a piece that would wrap is
// an error that changes nothing.
TEST_P(KvCacheTest, RingPendingRowsInPiecesEqualsAppend) {
  const int64_t size = Size(dtype());
  const int64_t head_dim = 20, capacity = 7, sinks = 2;  // a ring of 5
  const KvCacheConfig config =
      RingConfigOf(dtype(), 2, 3, head_dim, capacity, sinks);
  KvCache appended = MakeCache(config);
  KvCache direct = MakeCache(config);
  uint64_t seed = 700;
  for (const int64_t rows : {3, 11, 1, 5, 4, 17}) {
    const Source src(rows, 3 * head_dim, 2, seed++, 2);
    ASSERT_TRUE(appended.Append(0, src.k_view, src.v_view).ok());
    int64_t done = 0;
    while (done < rows) {
      const int64_t length = direct.length(0);
      const int64_t n = std::min(rows - done, direct.ContiguousRows(0));
      ASSERT_GE(n, 1);
      for (int64_t g = 0; g < 3; ++g) {
        KvMutableView k, v;
        ASSERT_TRUE(direct.PendingRows(0, g, n, &k, &v).ok());
        EXPECT_EQ(k.data, static_cast<const char*>(direct.Keys(0, g).data) +
                              direct.Slot(length) * k.stride * size);
        EXPECT_EQ(v.data, static_cast<const char*>(direct.Values(0, g).data) +
                              direct.Slot(length) * v.stride * size);
        EXPECT_EQ(k.rows, n);
        if (IsInt8(dtype())) {
          EXPECT_EQ(k.scales, direct.Keys(0, g).scales + direct.Slot(length));
        }
        const MatrixView<const float> k_src(
            src.k_view.data + done * src.stride + g * head_dim, n, head_dim,
            src.stride);
        const MatrixView<const float> v_src(
            src.v_view.data + done * src.stride + g * head_dim, n, head_dim,
            src.stride);
        ASSERT_TRUE(StoreKvRows(k_src, k).ok());
        ASSERT_TRUE(StoreKvRows(v_src, v).ok());
      }
      ASSERT_TRUE(direct.CommitAppend(0, n).ok());
      done += n;
    }
    ASSERT_EQ(direct.length(0), appended.length(0));
    EXPECT_EQ(direct.ring_begin(0), appended.ring_begin(0));
    EXPECT_EQ(direct.ring_begin(0),
              GrownRingBegin(direct.length(0), capacity, sinks));
    // Every row that holds a position is the same (rows past the length
    // are zero in both).
    EXPECT_TRUE(Snapshot(direct) == Snapshot(appended));

    // One row past where the ring wraps: an error, nothing changed.
    const Snapshot before(direct);
    const int64_t contiguous = direct.ContiguousRows(0);
    float sentinel = 0.0f;
    KvMutableView k{KvDtype::kFloat16, &sentinel, 7, 8, 9, nullptr};
    KvMutableView v = k;
    EXPECT_TRUE(test::IsError(
        direct.PendingRows(0, 1, contiguous + 1, &k, &v),
        StatusCode::kOutOfRange,
        {"n_new (" + std::to_string(contiguous + 1) +
             ") exceeds ContiguousRows(seq) (" + std::to_string(contiguous) +
             ") of seq 0",
         "write ContiguousRows(seq) rows, CommitAppend them, then the rest"},
        "KvCache::PendingRows: "));
    EXPECT_EQ(k.data, &sentinel);
    EXPECT_EQ(v.rows, 7);
    EXPECT_TRUE(Snapshot(direct) == before);
    EXPECT_EQ(direct.ring_begin(0), appended.ring_begin(0));
  }
}

// Lengths near 2^62: CommitAppend has no capacity limit in ring mode, only
// the bound on positions, which Append and CommitAppend both check.
TEST_P(KvCacheTest, RingLengthsStopAt2To62) {
  const int64_t max_length = int64_t{1} << 62;
  KvCache cache = MakeCache(RingConfigOf(dtype(), 1, 1, 4, 6, 2));
  ASSERT_TRUE(cache.CommitAppend(0, max_length - 5).ok());
  EXPECT_EQ(cache.length(0), max_length - 5);
  EXPECT_EQ(cache.ring_begin(0), max_length - 5 - 4);
  EXPECT_EQ(cache.Keys(0, 0).rows, 6);
  EXPECT_EQ(cache.Slot(max_length - 1), 2 + (max_length - 3) % 4);
  const Snapshot before(cache);
  const Source six(6, 4, 0, 800);
  EXPECT_TRUE(test::IsError(
      cache.Append(0, six.k_view, six.v_view), StatusCode::kOutOfRange,
      {"length (4611686018427387899) + k.rows (6) exceeds 2^62 "
       "(4611686018427387904), the most positions of a ring, in seq 0"},
      "KvCache::Append: "));
  EXPECT_TRUE(test::IsError(
      cache.CommitAppend(0, kInt64Max), StatusCode::kOutOfRange,
      {"n_new (9223372036854775807) exceeds 2^62"}, "KvCache::CommitAppend: "));
  EXPECT_TRUE(Snapshot(cache) == before);
  // Exactly 2^62 is fine.
  const Source five(5, 4, 0, 801);
  ASSERT_TRUE(cache.Append(0, five.k_view, five.v_view).ok());
  EXPECT_EQ(cache.length(0), max_length);
  EXPECT_EQ(cache.ring_begin(0), max_length - 4);
}

// Truncate after a wrap rolls back to ring_begin and no further; appending
// afterwards gives the positions a fresh history would have.
TEST_P(KvCacheTest, RingTruncateAfterWrap) {
  const int64_t head_dim = 9, capacity = 6, sinks = 2;  // a ring of 4
  KvCache ring =
      MakeCache(RingConfigOf(dtype(), 2, 2, head_dim, capacity, sinks));
  const Source first(11, 2 * head_dim, 1, 900);
  ASSERT_TRUE(ring.Append(0, first.k_view, first.v_view).ok());
  ASSERT_EQ(ring.ring_begin(0), 7);
  const Snapshot before(ring);
  for (const int64_t bad : {6, 2, 1, 0}) {
    EXPECT_TRUE(test::IsError(
        ring.Truncate(0, bad), StatusCode::kOutOfRange,
        {"new_length (" + std::to_string(bad) +
         ") is before ring_begin (7) of seq 0: rows before it were "
         "overwritten"},
        "KvCache::Truncate: "));
  }
  EXPECT_TRUE(test::IsError(
      ring.Truncate(0, 12), StatusCode::kOutOfRange,
      {"new_length (12) is out of range [0, 11], the length of seq 0"},
      "KvCache::Truncate: "));
  EXPECT_TRUE(Snapshot(ring) == before);
  EXPECT_EQ(ring.ring_begin(0), 7);
  ASSERT_TRUE(ring.Truncate(0, 9).ok());
  EXPECT_EQ(ring.length(0), 9);
  EXPECT_EQ(ring.ring_begin(0), 7);
  ASSERT_TRUE(ring.Truncate(0, 7).ok());  // to ring_begin: the ring is empty
  EXPECT_EQ(ring.length(0), 7);
  EXPECT_EQ(ring.ring_begin(0), 7);
  EXPECT_EQ(ring.Keys(0, 0).rows, capacity);
  EXPECT_EQ(ring.ContiguousRows(0), 3);  // position 7 is row 3

  // The reference: the 7 kept rows, then the new ones.
  KvCache ref = MakeCache(Config(1, 2, head_dim, 20));
  ASSERT_TRUE(ref.Append(0,
                         MatrixView<const float>(first.k_view.data, 7,
                                                 2 * head_dim, first.stride),
                         MatrixView<const float>(first.v_view.data, 7,
                                                 2 * head_dim, first.stride))
                  .ok());
  ASSERT_NO_FATAL_FAILURE(ExpectRingHolds(ring, 0, ref, 0, 7));
  const Source next(5, 2 * head_dim, 0, 901);
  ASSERT_TRUE(ring.Append(0, next.k_view, next.v_view).ok());
  ASSERT_TRUE(ref.Append(0, next.k_view, next.v_view).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectRingHolds(ring, 0, ref, 0, 8));

  // Before a wrap, any length down to 0 (sinks included) is fine, and
  // ring_begin stays at the sinks.
  const Source short_src(5, 2 * head_dim, 2, 902);
  ASSERT_TRUE(ring.Append(1, short_src.k_view, short_src.v_view).ok());
  ASSERT_EQ(ring.ring_begin(1), sinks);
  ASSERT_TRUE(ring.Truncate(1, 1).ok());
  EXPECT_EQ(ring.ring_begin(1), sinks);
  EXPECT_EQ(ring.ContiguousRows(1), capacity - 1);
  KvCache ref1 = MakeCache(Config(1, 2, head_dim, 20));
  ASSERT_TRUE(
      ref1.Append(0,
                  MatrixView<const float>(short_src.k_view.data, 1,
                                          2 * head_dim, short_src.stride),
                  MatrixView<const float>(short_src.v_view.data, 1,
                                          2 * head_dim, short_src.stride))
          .ok());
  const Source more(8, 2 * head_dim, 1, 903);
  ASSERT_TRUE(ring.Append(1, more.k_view, more.v_view).ok());
  ASSERT_TRUE(ref1.Append(0, more.k_view, more.v_view).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectRingHolds(ring, 1, ref1, 0, 5));
  // A ring filled exactly to its capacity has dropped nothing yet.
  ASSERT_TRUE(ring.Reset(1).ok());
  const Source full(capacity, 2 * head_dim, 0, 904);
  ASSERT_TRUE(ring.Append(1, full.k_view, full.v_view).ok());
  EXPECT_EQ(ring.ring_begin(1), sinks);
  ASSERT_TRUE(ring.Truncate(1, 0).ok());
  EXPECT_EQ(ring.length(1), 0);
}

// CopySequence copies the held rows, the length and ring_begin; Reset and
// ResetAll empty the ring (ring_begin back at the sinks).
TEST_P(KvCacheTest, RingCopySequenceAndReset) {
  const int64_t head_dim = 16, capacity = 5, sinks = 1;  // a ring of 4
  KvCache ring =
      MakeCache(RingConfigOf(dtype(), 3, 2, head_dim, capacity, sinks));
  KvCache ref = MakeCache(Config(3, 2, head_dim, 40));
  uint64_t seed = 1000;
  const auto append = [&](int64_t seq, int64_t rows) {
    const Source src(rows, 2 * head_dim, 1, seed++, 1);
    ASSERT_TRUE(ring.Append(seq, src.k_view, src.v_view).ok());
    ASSERT_TRUE(ref.Append(seq, src.k_view, src.v_view).ok());
  };
  const auto expect_all = [&]() {
    for (int64_t seq = 0; seq < 3; ++seq) {
      ASSERT_NO_FATAL_FAILURE(
          ExpectRingHolds(ring, seq, ref, seq,
                          GrownRingBegin(ring.length(seq), capacity, sinks)))
          << "seq " << seq;
    }
  };
  ASSERT_NO_FATAL_FAILURE(append(0, 11));  // wrapped
  ASSERT_NO_FATAL_FAILURE(append(2, 13));  // longer
  ASSERT_NO_FATAL_FAILURE(append(1, 2));
  ASSERT_TRUE(ring.CopySequence(0, 2).ok());
  ASSERT_TRUE(ref.CopySequence(0, 2).ok());
  EXPECT_EQ(ring.length(2), 11);
  EXPECT_EQ(ring.ring_begin(2), ring.ring_begin(0));
  ASSERT_NO_FATAL_FAILURE(expect_all());
  // The copies diverge without touching each other.
  ASSERT_NO_FATAL_FAILURE(append(0, 3));
  ASSERT_NO_FATAL_FAILURE(append(2, 6));
  ASSERT_NO_FATAL_FAILURE(expect_all());
  // A short sequence copied over a wrapped one: ring_begin back at the sinks.
  ASSERT_TRUE(ring.CopySequence(1, 0).ok());
  ASSERT_TRUE(ref.CopySequence(1, 0).ok());
  EXPECT_EQ(ring.ring_begin(0), sinks);
  ASSERT_NO_FATAL_FAILURE(append(0, 9));
  ASSERT_NO_FATAL_FAILURE(expect_all());

  ASSERT_TRUE(ring.Reset(2).ok());
  ASSERT_TRUE(ref.Reset(2).ok());
  EXPECT_EQ(ring.length(2), 0);
  EXPECT_EQ(ring.ring_begin(2), sinks);
  EXPECT_EQ(ring.ContiguousRows(2), capacity);
  EXPECT_EQ(ring.Keys(2, 1).rows, 0);
  ASSERT_NO_FATAL_FAILURE(append(2, 7));
  ASSERT_NO_FATAL_FAILURE(expect_all());

  ring.ResetAll();
  for (int64_t seq = 0; seq < 3; ++seq) {
    ASSERT_TRUE(ref.Reset(seq).ok());
    EXPECT_EQ(ring.length(seq), 0);
    EXPECT_EQ(ring.ring_begin(seq), sinks);
  }
  ASSERT_NO_FATAL_FAILURE(append(1, 1));
  ASSERT_NO_FATAL_FAILURE(append(1, 14));
  ASSERT_NO_FATAL_FAILURE(expect_all());
}

TEST_P(KvCacheTest, RingCreateErrorsAndBytes) {
  const KvCacheConfig good = RingConfigOf(dtype(), 2, 2, 8, 6, 2);
  KvCache out = MakeCache(good);
  const Source src(9, 16, 0, 1100);
  ASSERT_TRUE(out.Append(0, src.k_view, src.v_view).ok());
  const Snapshot before(out);
  struct Case {
    bool ring;
    int64_t capacity, sinks;
    std::string expect;
  };
  const Case cases[] = {
      {true, 6, 6,
       "config.n_sink_tokens (6) must be less than config.capacity (6) in "
       "ring mode"},
      {true, 6, 7,
       "config.n_sink_tokens (7) must be less than config.capacity (6)"},
      {true, 1, 1, "config.n_sink_tokens (1) must be less than"},
      {true, 6, -1, "config.n_sink_tokens must be >= 0 (got -1)"},
      {true, 6, kInt64Min,
       "config.n_sink_tokens must be >= 0 (got -9223372036854775808)"},
      {false, 6, -1, "config.n_sink_tokens must be >= 0 (got -1)"},
      {false, 6, 1, "config.n_sink_tokens (1) must be 0 without config.ring"},
      {false, 6, 5, "config.n_sink_tokens (5) must be 0 without config.ring"},
  };
  for (const Case& c : cases) {
    KvCacheConfig config = good;
    config.ring = c.ring;
    config.capacity = c.capacity;
    config.n_sink_tokens = c.sinks;
    EXPECT_TRUE(test::IsError(KvCache::Create(config, &out),
                              StatusCode::kInvalidArgument, {c.expect},
                              "KvCache::Create: "));
    EXPECT_EQ(KvCache::BytesPerToken(config), 0u) << c.expect;
    EXPECT_TRUE(Snapshot(out) == before) << c.expect;
    EXPECT_EQ(out.ring_begin(0), 5);
  }
  // A ring of W + S rows takes what a plain cache of capacity W + S takes.
  for (const auto& [window, sinks] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 0}, {4, 0}, {4, 3}, {128, 4}}) {
    const KvCacheConfig ring_config =
        RingConfigOf(dtype(), 3, 2, 40, window + sinks, sinks);
    const KvCacheConfig plain_config = Config(3, 2, 40, window + sinks);
    const KvCache ring = MakeCache(ring_config);
    const KvCache plain = MakeCache(plain_config);
    EXPECT_EQ(ring.bytes(), plain.bytes());
    EXPECT_EQ(ring.bytes_per_token(), plain.bytes_per_token());
    EXPECT_EQ(KvCache::BytesPerToken(ring_config),
              KvCache::BytesPerToken(plain_config));
    EXPECT_EQ(ring.head_stride(), plain.head_stride());
    EXPECT_EQ(ring.scale_head_stride(), plain.scale_head_stride());
    EXPECT_TRUE(Snapshot(ring).AllZero());
  }
}

// Create rejects an unknown dtype, whatever the sizes.
TEST(KvCache, CreateRejectsUnknownDtypes) {
  for (const int dtype : {-1, 4, 1000}) {
    KvCache out;
    KvCacheConfig config = ConfigOf(KvDtype::kFloat32, 1, 1, 8, 4);
    config.dtype = static_cast<KvDtype>(dtype);
    EXPECT_TRUE(test::IsError(
        KvCache::Create(config, &out), StatusCode::kInvalidArgument,
        {"config.dtype (" + std::to_string(dtype) + ") is not a known KvDtype"},
        "KvCache::Create: "));
    EXPECT_EQ(out.n_sequences(), 0);
    EXPECT_EQ(KvCache::BytesPerToken(config), 0u);
  }
}

}  // namespace
}  // namespace headway

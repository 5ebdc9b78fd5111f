// KvCache tests: layout, appends (whole-view and through PendingRows), the
// sequence operations (Truncate, CopySequence, Reset), and every error, which
// must leave the cache bit-identical (lengths and both buffers, padding and
// rows past the lengths included).
//
// Every check compares against a plain model: per sequence, the appended K and
// V rows [tokens, n_kv_heads * head_dim]. Source views are strided with NaN
// padding (FillRandomMatrix), so copying a source's padding shows up as NaN in
// the cache rows or their padding, which must stay exactly zero.
#include "headway/kv_cache.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "test/support/cache.h"
#include "test/support/random.h"
#include "test/support/status_matchers.h"

namespace headway {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

KvCacheConfig Config(int64_t n_sequences, int64_t n_kv_heads, int64_t head_dim,
                     int64_t capacity) {
  KvCacheConfig config;
  config.n_sequences = n_sequences;
  config.n_kv_heads = n_kv_heads;
  config.head_dim = head_dim;
  config.capacity = capacity;
  return config;
}

using test::FloatRows;
using test::MakeCache;

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
  // Element c of head g of token t.
  float Key(int64_t seq, int64_t t, int64_t g, int64_t c) const {
    return keys_[seq][t * width() + g * head_dim_ + c];
  }
  float Value(int64_t seq, int64_t t, int64_t g, int64_t c) const {
    return values_[seq][t * width() + g * head_dim_ + c];
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

// Strided K and V source matrices [rows, width], NaN between rows.
struct Source {
  Source(int64_t rows, int64_t width, int64_t pad, uint64_t seed)
      : stride(width + pad),
        k(rows * stride),
        v(rows * stride),
        k_view(k.data(), rows, width, stride),
        v_view(v.data(), rows, width, stride) {
    test::FillRandomMatrix(k.data(), rows, width, stride, seed);
    test::FillRandomMatrix(v.data(), rows, width, stride, seed + 1000);
  }
  // The views point into k and v: a move keeps those buffers, a copy would not.
  Source(Source&&) = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  int64_t stride;
  std::vector<float> k, v;
  MatrixView<const float> k_view, v_view;
};

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// The cache holds exactly the model's rows, with zero padding and the views'
// documented shape and alignment.
void ExpectMatchesModel(const KvCache& cache, const Model& model) {
  const int64_t head_dim = cache.head_dim();
  const int64_t row_stride = cache.row_stride();
  for (int64_t seq = 0; seq < cache.n_sequences(); ++seq) {
    ASSERT_EQ(cache.length(seq), model.length(seq)) << "seq " << seq;
    for (int64_t g = 0; g < cache.n_kv_heads(); ++g) {
      for (const bool is_key : {true, false}) {
        const MatrixView<const float> view =
            FloatRows(is_key ? cache.Keys(seq, g) : cache.Values(seq, g));
        const char* name = is_key ? "K" : "V";
        ASSERT_NE(view.data, nullptr);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(view.data) % 64, 0u);
        ASSERT_EQ(view.rows, model.length(seq));
        ASSERT_EQ(view.cols, head_dim);
        ASSERT_EQ(view.stride, row_stride);
        for (int64_t t = 0; t < view.rows; ++t) {
          const float* row = view.data + t * row_stride;
          for (int64_t c = 0; c < head_dim; ++c) {
            const float want =
                is_key ? model.Key(seq, t, g, c) : model.Value(seq, t, g, c);
            ASSERT_TRUE(SameBits(row[c], want))
                << name << " seq " << seq << " head " << g << " token " << t
                << " col " << c << ": " << row[c] << " != " << want;
          }
          for (int64_t c = head_dim; c < row_stride; ++c) {
            ASSERT_TRUE(SameBits(row[c], 0.0f))
                << name << " padding, seq " << seq << " head " << g << " token "
                << t << " col " << c << ": " << row[c];
          }
        }
      }
    }
  }
}

// Everything a call could change: the lengths and both whole buffers.
struct Snapshot {
  explicit Snapshot(const KvCache& cache) {
    for (int64_t seq = 0; seq < cache.n_sequences(); ++seq) {
      lengths.push_back(cache.length(seq));
    }
    if (cache.n_sequences() > 0) {
      // Keys(0, 0) starts at the start of its buffer.
      const size_t n = cache.bytes() / 2 / sizeof(float);
      const float* k = FloatRows(cache.Keys(0, 0)).data;
      const float* v = FloatRows(cache.Values(0, 0)).data;
      keys.assign(k, k + n);
      values.assign(v, v + n);
    }
  }
  bool operator==(const Snapshot& other) const {
    return lengths == other.lengths && keys.size() == other.keys.size() &&
           std::memcmp(keys.data(), other.keys.data(), keys.size() * 4) == 0 &&
           std::memcmp(values.data(), other.values.data(), values.size() * 4) ==
               0;
  }
  std::vector<int64_t> lengths;
  std::vector<float> keys, values;
};

// Appends random rows to the cache and the model; `pad` extra source columns.
void AppendRandom(KvCache* cache, Model* model, int64_t seq, int64_t rows,
                  int64_t pad, uint64_t seed) {
  const Source src(rows, model->width(), pad, seed);
  const Status status = cache->Append(seq, src.k_view, src.v_view);
  ASSERT_TRUE(status.ok()) << status.ToString();
  model->Append(seq, src.k_view, src.v_view);
}

TEST(KvCache, CreateLayout) {
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
      EXPECT_EQ(cache.config().dtype, KvDtype::kFloat32);
      EXPECT_EQ(cache.config().head_dim, head_dim);
      EXPECT_EQ(cache.bytes_per_token(),
                static_cast<size_t>(2 * n_kv_heads * row_stride * 4));
      EXPECT_EQ(cache.bytes(),
                static_cast<size_t>(2 * 2 * n_kv_heads * 5 * row_stride * 4));
      EXPECT_EQ(cache.bytes(), 2 * 5 * cache.bytes_per_token());
      for (int64_t seq = 0; seq < 2; ++seq) {
        EXPECT_EQ(cache.length(seq), 0);
        for (int64_t g = 0; g < n_kv_heads; ++g) {
          for (const MatrixView<const float> view :
               {FloatRows(cache.Keys(seq, g)),
                FloatRows(cache.Values(seq, g))}) {
            ASSERT_NE(view.data, nullptr);
            EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data) % 64, 0u);
            EXPECT_EQ(view.rows, 0);
            EXPECT_EQ(view.cols, head_dim);
            EXPECT_EQ(view.stride, row_stride);
          }
          // [sequence][kv_head][capacity][row_stride]: heads follow each
          // other, capacity rows apart.
          EXPECT_EQ(FloatRows(cache.Keys(seq, g)).data,
                    FloatRows(cache.Keys(0, 0)).data +
                        (seq * n_kv_heads + g) * 5 * row_stride);
          EXPECT_EQ(FloatRows(cache.Values(seq, g)).data,
                    FloatRows(cache.Values(0, 0)).data +
                        (seq * n_kv_heads + g) * 5 * row_stride);
        }
      }
      // KeyBuffer and ValueBuffer: each whole buffer, padding included.
      const int64_t buffer_rows = 2 * n_kv_heads * 5;
      const MatrixView<const float> buffers[2][2] = {
          {FloatRows(cache.KeyBuffer()), FloatRows(cache.Keys(0, 0))},
          {FloatRows(cache.ValueBuffer()), FloatRows(cache.Values(0, 0))}};
      for (const auto& [buffer, first] : buffers) {
        EXPECT_EQ(buffer.data, first.data);
        EXPECT_EQ(buffer.rows, buffer_rows);
        EXPECT_EQ(buffer.cols, row_stride);
        EXPECT_EQ(buffer.stride, row_stride);
        EXPECT_EQ(static_cast<size_t>(buffer.rows * buffer.stride) * 4,
                  cache.bytes() / 2);
      }
      // Both buffers are all zeros, padding and unused rows included.
      const Snapshot snapshot(cache);
      for (float x : snapshot.keys) ASSERT_TRUE(SameBits(x, 0.0f));
      for (float x : snapshot.values) ASSERT_TRUE(SameBits(x, 0.0f));
    }
  }
}

TEST(KvCache, AppendInChunks) {
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

TEST(KvCache, CapacityExceededChangesNothing) {
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

TEST(KvCache, AppendRejectsBadArgumentsWithoutWriting) {
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

// The direct-write path gives the same cache, bit for bit, as Append.
TEST(KvCache, PendingRowsThenCommitEqualsAppend) {
  for (const int64_t head_dim : {5, 16, 80}) {
    const KvCacheConfig config = Config(2, 3, head_dim, 24);
    KvCache appended = MakeCache(config);
    KvCache direct = MakeCache(config);
    Model model(config);
    uint64_t seed = 10;
    for (const auto& [seq, rows] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 4}, {1, 1}, {0, 1}, {1, 17}, {0, 19}}) {
      const Source src(rows, model.width(), 2, seed++);
      ASSERT_TRUE(appended.Append(seq, src.k_view, src.v_view).ok());
      model.Append(seq, src.k_view, src.v_view);
      const int64_t length = direct.length(seq);
      for (int64_t g = 0; g < 3; ++g) {
        KvMutableView k_rows, v_rows;
        ASSERT_TRUE(direct.PendingRows(seq, g, rows, &k_rows, &v_rows).ok());
        const MatrixView<float> k = FloatRows(k_rows), v = FloatRows(v_rows);
        EXPECT_EQ(direct.length(seq), length);  // not yet
        EXPECT_EQ(k.data,
                  FloatRows(direct.Keys(seq, g)).data + length * k.stride);
        EXPECT_EQ(v.data,
                  FloatRows(direct.Values(seq, g)).data + length * v.stride);
        EXPECT_EQ(k.rows, rows);
        EXPECT_EQ(k.cols, head_dim);
        EXPECT_EQ(k.stride, direct.row_stride());
        EXPECT_EQ(v.rows, rows);
        EXPECT_EQ(v.cols, head_dim);
        EXPECT_EQ(v.stride, direct.row_stride());
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(k.data + r * k.stride,
                      src.k_view.data + r * src.stride + g * head_dim,
                      head_dim * sizeof(float));
          std::memcpy(v.data + r * v.stride,
                      src.v_view.data + r * src.stride + g * head_dim,
                      head_dim * sizeof(float));
        }
      }
      ASSERT_TRUE(direct.CommitAppend(seq, rows).ok());
      ASSERT_NO_FATAL_FAILURE(ExpectMatchesModel(direct, model));
    }
    EXPECT_TRUE(Snapshot(direct) == Snapshot(appended));
  }
}

TEST(KvCache, PendingRowsAndCommitRejectBadArguments) {
  const KvCacheConfig config = Config(3, 2, 16, 6);
  KvCache cache = MakeCache(config);
  Model model(config);
  ASSERT_NO_FATAL_FAILURE(AppendRandom(&cache, &model, 2, 4, 0, 1));
  const Snapshot before(cache);
  float sentinel = 0.0f;
  const KvMutableView untouched{KvDtype::kFloat32, &sentinel, 7, 8, 9, nullptr};
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
TEST(KvCache, TruncateThenAppendEqualsFreshCache) {
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

TEST(KvCache, TruncateRejectsBadArguments) {
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
TEST(KvCache, CopySequenceForksIndependentSequences) {
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

// k and v may be views of this cache: Append copies tokens between sequences
// (n_kv_heads 1, where a head's view has the width Append wants).
TEST(KvCache, AppendFromItsOwnViews) {
  const KvCacheConfig config = Config(2, 1, 17, 12);
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

TEST(KvCache, ResetAndResetAll) {
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

TEST(KvCache, AccessorsOfBadIndicesAreEmpty) {
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
    }
  }
  EXPECT_EQ(cache.length(-1), 0);
  EXPECT_EQ(cache.length(2), 0);
  EXPECT_EQ(cache.length(kInt64Max), 0);
  EXPECT_EQ(cache.length(1), 2);
}

TEST(KvCache, CreateRejectsBadConfigs) {
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
  cases.push_back({Config(4, int64_t{1} << 20, 128, int64_t{1} << 40),
                   StatusCode::kResourceExhausted,
                   "2 x n_sequences (4) x n_kv_heads (1048576) x capacity "
                   "(1099511627776) x head_dim (128) rounded up to 16 x 4 "
                   "bytes overflows"});
  cases.push_back({Config(1, 1, kInt64Max, 1), StatusCode::kResourceExhausted,
                   "head_dim (9223372036854775807) rounded up to 16 x 4 bytes "
                   "overflows"});
  cases.push_back({Config(kInt64Max, kInt64Max, 1, 1),
                   StatusCode::kResourceExhausted, "overflows"});
  // 2^62 bytes per buffer fits int64_t; K and V together do not.
  cases.push_back({Config(1, 1, 16, int64_t{1} << 56),
                   StatusCode::kResourceExhausted, "overflows"});
  // 2^52 bytes (4 PiB) per buffer: representable, but no machine has it (under
  // ASan too: test/support/sanitizer_options.cc).
  cases.push_back({Config(1, 1, 16, int64_t{1} << 46),
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

TEST(KvCache, CreateReplacesWhatOutHeld) {
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
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_EQ(cache.bytes_per_token(), 0u);
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_EQ(cache.Keys(0, 0).data, nullptr);
  EXPECT_EQ(cache.Values(0, 0).data, nullptr);
  EXPECT_EQ(cache.KeyBuffer().data, nullptr);
  EXPECT_EQ(cache.ValueBuffer().rows, 0);
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

TEST(KvCache, MoveTransfersTheBuffersAndEmptiesTheSource) {
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
TEST(KvCache, HugeSizesAreRejectedWithoutOverflow) {
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
  }
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
TEST(KvCache, ConcurrentAppendsToDifferentSequences) {
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

}  // namespace
}  // namespace headway

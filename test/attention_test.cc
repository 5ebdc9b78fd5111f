// Attention core tests: every target and every KvDtype, against the float64
// reference (test/support/reference.h) over the K and V the cache stores
// (dequantized with LoadKvRows): the kernels' only error is float32
// arithmetic, bounded as below for every dtype; StorageErrorWithinBound adds
// the storage rounding, against K and V as appended.
//
// Tolerance, per output element of query row t and head h: the bound stated
// in include/headway/attention.h (u = 2^-24),
//   4 u |V|max (sqrt(d) S_t + sqrt(L_t) + 8)
// S_t = scale * max_s sum_p |q_p k_sp| bounds the row's scores, L_t is the
// number of keys the row sees. An error e in a score changes the weights by
// about e relative, and a float32 sum of n terms is off by about sqrt(n) u
// times its magnitude (rounding errors behave like a random walk: Higham,
// Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 2.8); the score
// is a sum of d products, the output a sum of L weighted values. The factor 4
// and the 8 cover exp, the online rescaling and the chunk merge. It is the same
// on every target; the observed errors are several times smaller, and the
// worst-case bound (n instead of sqrt(n)) would be loose by a factor of ten or
// more. LargeLogitsWithinTheBound shows the score term at work.
#include "headway/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "headway/kv_cache.h"
#include "headway/targets.h"
#include "lib/core/storage.h"
#include "tbb/task_arena.h"
#include "test/support/cache.h"
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

struct Layout {
  int64_t n_heads;
  int64_t n_kv_heads;
};

using test::MakeCache;

const KvDtype kDtypes[] = {KvDtype::kFloat32, KvDtype::kBFloat16,
                           KvDtype::kFloat16, KvDtype::kInt8};

std::string DtypeName(KvDtype dtype) { return internal::KvDtypeName(dtype); }

// The sizes of a sweep for dtype: all of them for float32; for the stored
// types, whose kernels are float32's after the one reader (KvRows, ScoreRows,
// AccumulateRows; storage_test and decode_test sweep the reader itself), the
// ones marked for them, one per tail class. 4 full sweeps made this test 88 s
// of the release suite and pushed the sanitizer build past meson's timeout.
template <class T>
std::vector<T> SweepFor(KvDtype dtype, const std::vector<T>& all,
                        const std::vector<T>& stored) {
  return dtype == KvDtype::kFloat32 ? all : stored;
}

// A cache of dtype with one sequence holding k and v (appended, so rounded to
// dtype), [length, n_kv_heads * head_dim] dense.
KvCache CacheHolding(KvDtype dtype, int64_t n_kv_heads, int64_t head_dim,
                     int64_t length, const std::vector<float>& k,
                     const std::vector<float>& v) {
  KvCacheConfig config;
  config.dtype = dtype;
  config.n_kv_heads = n_kv_heads;
  config.head_dim = head_dim;
  config.capacity = length;
  KvCache cache = MakeCache(config);
  const int64_t width = n_kv_heads * head_dim;
  EXPECT_TRUE(cache
                  .Append(0, MatrixView<const float>(k.data(), length, width),
                          MatrixView<const float>(v.data(), length, width))
                  .ok());
  return cache;
}

// The cache's rows of one sequence as it stores them, read back with
// LoadKvRows (dequantized), as a dense double [length, n_kv_heads *
// head_dim].
void CacheToDouble(const KvCache& cache, int64_t seq, std::vector<double>* k,
                   std::vector<double>* v) {
  const int64_t length = cache.length(seq), d = cache.head_dim();
  const int64_t width = cache.n_kv_heads() * d;
  k->assign(length * width, 0.0);
  v->assign(length * width, 0.0);
  std::vector<float> rows(length * d);
  for (int64_t g = 0; g < cache.n_kv_heads(); ++g) {
    for (std::vector<double>* out : {k, v}) {
      const KvView view = out == k ? cache.Keys(seq, g) : cache.Values(seq, g);
      const Status status =
          LoadKvRows(view, MatrixView<float>(rows.data(), length, d));
      ASSERT_TRUE(status.ok()) << status.ToString();
      for (int64_t s = 0; s < length; ++s) {
        for (int64_t p = 0; p < d; ++p) {
          (*out)[s * width + g * d + p] = rows[s * d + p];
        }
      }
    }
  }
}

// The float64 reference of one query of a cache, and its tolerance per (token,
// head): out [n_tokens, n_heads * d], tol [n_tokens, n_heads].
struct Reference {
  std::vector<double> out, tol;
};

// A 64-bit FNV-1a hash (of 8-byte words) of everything a result reads.
struct InputHash {
  template <class T>
  InputHash& Add(const T* data, size_t count) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(data);
    const size_t size = count * sizeof(T);
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {  // 8 bytes a step
      uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      h = (h ^ word) * 0x100000001b3ull;
    }
    for (; i < size; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
    return *this;
  }
  uint64_t h = 0xcbf29ce484222325ull;
};

// compute(), a result of the float64 reference that depends on its inputs
// alone (hashed into key), which every target's run of a test repeats (same
// seeds): kept for the running test (all its targets) and dropped at the next,
// so each is computed once rather than once per target (5/6 of this test's
// time was the reference).
template <class Result, class Compute>
const Result& ComputedOnce(uint64_t key, Compute compute) {
  static std::string test_name;
  static std::map<uint64_t, Result> results;
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info == nullptr ? "" : info->name();
  name = name.substr(0, name.find('/'));  // Decode/AVX2: Decode
  if (name != test_name) {
    test_name = name;
    results.clear();
  }
  const auto found = results.find(key);
  if (found != results.end()) return found->second;
  return results.emplace(key, compute()).first->second;
}

// The reference for query `query` of `cache` (ComputedOnce), with the
// options' variants. The tolerance's S_t counts softcap and the row's largest
// |ALiBi bias| too (attention.h), and L_t the keys of its window.
const Reference& ReferenceFor(const KvCache& cache, int64_t n_heads,
                              const AttentionQuery& query, bool causal,
                              float scale,
                              const test::ref::Variants& variants = {}) {
  const int64_t d = cache.head_dim(), n_tokens = query.q.rows;
  const int64_t length = cache.length(query.seq);
  const int64_t group = n_heads / cache.n_kv_heads();
  const int64_t kv_width = cache.n_kv_heads() * d;
  std::vector<double> k, v;
  CacheToDouble(cache, query.seq, &k, &v);
  const std::vector<double> q =
      test::ref::ToDouble(query.q.data, n_tokens, n_heads * d, query.q.stride);
  const int64_t shape[] = {n_heads, cache.n_kv_heads(), d,     n_tokens,
                           length,  query.q_pos0,       causal};
  InputHash key;
  key.Add(shape, 7).Add(&scale, 1).Add(q.data(), q.size());
  const double variant_values[] = {static_cast<double>(variants.window),
                                   static_cast<double>(variants.n_sink_tokens),
                                   variants.softcap};
  key.Add(variant_values, 3);
  for (const float* array : {variants.alibi_slopes, variants.sink_logits}) {
    const float none = -1234.5f;
    if (array != nullptr) {
      key.Add(array, static_cast<size_t>(n_heads));
    } else {
      key.Add(&none, 1);
    }
  }
  key.Add(k.data(), k.size()).Add(v.data(), v.size());
  if (query.mask.data != nullptr) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      key.Add(query.mask.data + t * query.mask.stride,
              static_cast<size_t>(length));
    }
  }
  return ComputedOnce<Reference>(key.h, [&] {
    Reference r;
    r.out = test::ref::AttentionCore(
        q.data(), n_heads * d, n_tokens, k.data(), kv_width, v.data(), kv_width,
        length, n_heads, cache.n_kv_heads(), d, query.q_pos0, causal,
        query.mask.data, query.mask.stride, scale, variants);
    // The magnitudes that scale the tolerance, over the finite inputs (a NaN or
    // inf input makes the rows that see it non-finite, checked as such).
    double v_abs = 0.0;
    for (double x : v) {
      if (std::isfinite(x)) v_abs = std::max(v_abs, std::fabs(x));
    }
    r.tol.resize(static_cast<size_t>(n_tokens * n_heads));
    for (int64_t t = 0; t < n_tokens; ++t) {
      const int64_t pos = query.q_pos0 + t;
      const int64_t end = causal ? std::min(length, pos + 1) : length;
      const test::ref::VisibleSpan visible =
          test::ref::VisibleKeys(variants, pos, end);
      const int64_t seen = visible.count();
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t g = h / group;
        double s_abs = 0.0;
        for (int64_t s = 0; s < end; ++s) {
          if (!visible.Contains(s)) continue;
          double dot = 0.0;
          for (int64_t p = 0; p < d; ++p) {
            dot += std::fabs(q[t * n_heads * d + h * d + p] *
                             k[s * kv_width + g * d + p]);
          }
          double bias = variants.softcap;
          if (variants.alibi_slopes != nullptr) {
            bias += std::fabs(variants.alibi_slopes[h] *
                              static_cast<double>(s - pos));
          }
          if (std::isfinite(dot)) s_abs = std::max(s_abs, scale * dot + bias);
        }
        r.tol[t * n_heads + h] = 4 * kU * v_abs *
                                 (std::sqrt(static_cast<double>(d)) * s_abs +
                                  std::sqrt(static_cast<double>(seen)) + 8);
      }
    }
    return r;
  });
}

// Checks out [n_tokens, n_heads * d] against the reference for query `query` of
// `cache`.
void ExpectMatchesReference(const KvCache& cache, int64_t n_heads,
                            const AttentionQuery& query, bool causal,
                            float scale, const std::string& what,
                            double* worst = nullptr,
                            const test::ref::Variants& variants = {}) {
  const int64_t d = cache.head_dim(), n_tokens = query.q.rows;
  const Reference& reference =
      ReferenceFor(cache, n_heads, query, causal, scale, variants);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<double>& ref = reference.out;
  double worst_ratio = 0.0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const double tol = reference.tol[t * n_heads + h];
      for (int64_t p = 0; p < d; ++p) {
        const double want = ref[t * n_heads * d + h * d + p];
        const double got = query.out.data[t * query.out.stride + h * d + p];
        if (!std::isfinite(want)) {
          ASSERT_FALSE(std::isfinite(got))
              << what << ": token " << t << " head " << h << " col " << p
              << ": got " << got << ", want " << want;
          continue;
        }
        ASSERT_LE(std::fabs(got - want), tol)
            << what << ": token " << t << " head " << h << " col " << p
            << ": got " << got << ", want " << want;
        worst_ratio = std::max(worst_ratio, std::fabs(got - want) / tol);
      }
    }
  }
  // The tolerance must stay meaningful: errors well inside it, not at its edge.
  EXPECT_LT(worst_ratio, 1.0) << what;
  if (worst != nullptr) *worst = std::max(*worst, worst_ratio);
}

struct Case {
  Layout layout;
  int64_t head_dim;
  int64_t kv_len;
  int64_t n_tokens;
  bool causal;
  KvDtype dtype = KvDtype::kFloat32;
};

std::string Describe(const Case& c) {
  return DtypeName(c.dtype) + ", heads " + std::to_string(c.layout.n_heads) +
         "/" + std::to_string(c.layout.n_kv_heads) + ", d " +
         std::to_string(c.head_dim) + ", kv_len " + std::to_string(c.kv_len) +
         ", n_tokens " + std::to_string(c.n_tokens) +
         (c.causal ? ", causal" : ", no mask");
}

// Runs one case through the fused path (q strided, out strided), checks it.
// scale 0: 1 / sqrt(head_dim).
void RunCase(const Case& c, uint64_t seed, float scale = 0.0f) {
  KvCache cache = MakeCache(c.layout.n_kv_heads, c.head_dim, {c.kv_len}, seed,
                            /*extra_capacity=*/0, c.dtype);
  const int64_t width = c.layout.n_heads * c.head_dim;
  const int64_t q_stride = width + 5, out_stride = width + 3;
  std::vector<float> q(c.n_tokens * q_stride), out(c.n_tokens * out_stride);
  test::FillRandomMatrix(q.data(), c.n_tokens, width, q_stride, seed + 100);
  test::FillRandomMatrix(out.data(), c.n_tokens, width, out_stride, seed + 101);
  AttentionQuery query;
  query.seq = 0;
  query.q_pos0 = c.kv_len - c.n_tokens;
  query.q = MatrixView<const float>(q.data(), c.n_tokens, width, q_stride);
  query.out = MatrixView<float>(out.data(), c.n_tokens, width, out_stride);
  AttentionOptions options;
  options.mask = c.causal ? AttentionMask::kCausal : AttentionMask::kNone;
  options.scale = scale;
  const Status status = Attention(cache, c.layout.n_heads, &query, 1, options);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectMatchesReference(
      cache, c.layout.n_heads, query, c.causal,
      scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(c.head_dim)),
      Describe(c));
  // Padding of out is not the kernel's.
  for (int64_t t = 0; t + 1 < c.n_tokens; ++t) {
    for (int64_t col = width; col < out_stride; ++col) {
      ASSERT_TRUE(std::isnan(out[t * out_stride + col])) << Describe(c);
    }
  }
}

class AttentionTest : public test::TargetTest {};

const Layout kLayouts[] = {{8, 8}, {8, 4}, {8, 2}, {8, 1}, {32, 1}};

// Decode: one query token against caches around half a key block and one (64,
// 128: kAttentionKeyBlock in lib/attention/attention-inl.h) and longer than
// the 512-key minimum chunk (700, 3001).
TEST_P(AttentionTest, Decode) {
  for (const KvDtype dtype : kDtypes) {
    uint64_t seed = 1;
    for (const Layout& layout : kLayouts) {
      for (const int64_t head_dim :
           SweepFor<int64_t>(dtype, {16, 72, 128}, {72})) {
        for (const int64_t kv_len :
             SweepFor<int64_t>(dtype, {1, 63, 64, 65, 127, 128, 129, 700, 3001},
                               {1, 65, 128, 3001})) {
          RunCase({layout, head_dim, kv_len, 1, true, dtype}, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Prefill: tile edges (the wide tile has 2 vectors of query rows), every
// head_dim for float32; the other dtypes (whose conversion depends on the row
// stride only) on one head_dim per row tail, which keeps the test's time
// below a minute per target.
TEST_P(AttentionTest, Prefill) {
  const int64_t lanes = static_cast<int64_t>(test::ActiveFloatLanes());
  const int64_t tile = 2 * lanes;
  const std::vector<int64_t> all_dims = {16, 64, 72, 80, 96, 128, 256};
  const std::vector<int64_t> some_dims = {16, 72, 128};
  for (const KvDtype dtype : kDtypes) {
    uint64_t seed = 100;
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      for (const int64_t head_dim :
           dtype == KvDtype::kFloat32 ? all_dims : some_dims) {
        for (const int64_t n :
             {int64_t{1}, tile - 1, tile, tile + 1, int64_t{130}}) {
          for (const bool causal : {true, false}) {
            RunCase({layout, head_dim, n, n, causal, dtype}, seed++);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// head_dim below, between and above the 16-element row padding, odd: the
// rows' padding columns (zero) on every path, decode and prefill.
TEST_P(AttentionTest, OddHeadDims) {
  for (const KvDtype dtype : kDtypes) {
    uint64_t seed = 150;
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      for (const int64_t head_dim : {1, 5, 17, 33}) {
        for (const auto& [kv_len, n_tokens] :
             std::vector<std::pair<int64_t, int64_t>>{
                 {300, 1}, {70, 70}, {150, 20}}) {
          RunCase({layout, head_dim, kv_len, n_tokens, true, dtype}, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Scores that span hundreds (scale 80 / sqrt(d)): exp's range reduction far
// from 0, weights below 2^-127 of the row's largest (flushed to 0), and running
// maxima that jump by more than that from one key block to the next (alpha 0),
// on wide (prefill) and narrow (decode) tiles.
TEST_P(AttentionTest, LargeScoreRange) {
  for (const KvDtype dtype : kDtypes) {
    uint64_t seed = 900;
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 1}}) {
      for (const int64_t n_tokens : {1, 40}) {
        for (const bool causal : {true, false}) {
          RunCase({layout, 64, 300, n_tokens, causal, dtype}, seed++,
                  80.0f / std::sqrt(64.0f));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_P(AttentionTest, LongPrefillAndGroup32) {
  for (const KvDtype dtype : kDtypes) {
    // 1009 queries: float32 only (Prefill covers the stored types' tiles).
    if (dtype == KvDtype::kFloat32) {
      RunCase({{4, 2}, 64, 1009, 1009, true, dtype}, 7);
    }
    RunCase({{32, 1}, 64, 300, 300, true, dtype}, 8);
    RunCase({{32, 32}, 32, 257, 257, false, dtype}, 9);
    if (HasFatalFailure()) return;
  }
}

// Chunked prefill: new queries at q_pos0 > 0 attend to the cached prefix and to
// each other.
TEST_P(AttentionTest, ChunkedPrefill) {
  for (const KvDtype dtype : kDtypes) {
    uint64_t seed = 200;
    for (const Layout& layout : kLayouts) {
      for (const int64_t n_tokens : {2, 17, 50}) {
        RunCase({layout, 64, 300, n_tokens, true, dtype}, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Additive masks with -inf entries, a fully masked row (zeros), causal and not.
TEST_P(AttentionTest, AdditiveMask) {
  for (const KvDtype dtype : kDtypes) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{32, 1}}) {
      for (const int64_t n_tokens : {1, 5, 40}) {
        for (const bool causal : {true, false}) {
          const int64_t d = 64, kv_len = 150;
          KvCache cache = MakeCache(layout.n_kv_heads, d, {kv_len}, 31,
                                    /*extra_capacity=*/0, dtype);
          const int64_t width = layout.n_heads * d;
          std::vector<float> q(n_tokens * width), out(n_tokens * width, -7.0f);
          test::FillRandom(q.data(), q.size(), 32);
          std::vector<float> mask(n_tokens * (kv_len + 2));
          test::FillRandom(mask.data(), mask.size(), 33, -2.0f, 2.0f);
          for (size_t i = 0; i < mask.size(); i += 3) mask[i] = -kInf;
          // Row 0 sees nothing: zeros, not NaN.
          std::fill(mask.begin(), mask.begin() + kv_len, -kInf);
          AttentionQuery query;
          query.q_pos0 = kv_len - n_tokens;
          query.q = MatrixView<const float>(q.data(), n_tokens, width);
          query.out = MatrixView<float>(out.data(), n_tokens, width);
          query.mask = MatrixView<const float>(mask.data(), n_tokens, kv_len,
                                               kv_len + 2);
          AttentionOptions options;
          options.mask = causal ? AttentionMask::kCausal : AttentionMask::kNone;
          ASSERT_TRUE(
              Attention(cache, layout.n_heads, &query, 1, options).ok());
          for (int64_t col = 0; col < width; ++col) ASSERT_EQ(out[col], 0.0f);
          ExpectMatchesReference(cache, layout.n_heads, query, causal, 0.125f,
                                 "masked, " + DtypeName(dtype));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Several sequences of different lengths in one call: each matches the
// reference.
TEST_P(AttentionTest, SeveralSequences) {
  for (const KvDtype dtype : kDtypes) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      const int64_t d = 64;
      const std::vector<int64_t> lengths = {1, 90, 700, 33};
      const std::vector<int64_t> tokens = {1, 90, 1, 5};
      KvCache cache = MakeCache(layout.n_kv_heads, d, lengths, 41,
                                /*extra_capacity=*/0, dtype);
      const int64_t width = layout.n_heads * d;
      std::vector<std::vector<float>> qs, outs;
      std::vector<AttentionQuery> queries;
      for (size_t i = 0; i < lengths.size(); ++i) {
        qs.emplace_back(tokens[i] * width);
        outs.emplace_back(tokens[i] * width);
        test::FillRandom(qs.back().data(), qs.back().size(), 50 + i);
      }
      for (size_t i = 0; i < lengths.size(); ++i) {
        AttentionQuery query;
        query.seq = static_cast<int64_t>(i);
        query.q_pos0 = lengths[i] - tokens[i];
        query.q = MatrixView<const float>(qs[i].data(), tokens[i], width);
        query.out = MatrixView<float>(outs[i].data(), tokens[i], width);
        queries.push_back(query);
      }
      ASSERT_TRUE(Attention(cache, layout.n_heads, queries.data(),
                            static_cast<int64_t>(queries.size()))
                      .ok());
      for (const AttentionQuery& query : queries) {
        ExpectMatchesReference(
            cache, layout.n_heads, query, true, 0.125f,
            DtypeName(dtype) + ", sequence " + std::to_string(query.seq));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// GQA with K/V heads repeated G times is MHA.
TEST_P(AttentionTest, GqaEqualsRepeatedMha) {
  const int64_t d = 32, n_heads = 8, kv_len = 200, n_tokens = 40;
  for (const KvDtype dtype : kDtypes) {
    for (const int64_t n_kv : {1, 2, 4}) {
      const int64_t group = n_heads / n_kv;
      // K and V of the GQA heads, repeated for the MHA cache: each (token,
      // head) row rounds the same way in both (int8 scales are per row).
      std::vector<float> k_gqa(kv_len * n_kv * d), v_gqa(k_gqa.size());
      test::FillRandom(k_gqa.data(), k_gqa.size(), 61);
      test::FillRandom(v_gqa.data(), v_gqa.size(), 63);
      std::vector<float> k(kv_len * n_heads * d), v(kv_len * n_heads * d);
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t s = 0; s < kv_len; ++s) {
          const int64_t from = (s * n_kv + h / group) * d;
          std::copy_n(&k_gqa[from], d, &k[(s * n_heads + h) * d]);
          std::copy_n(&v_gqa[from], d, &v[(s * n_heads + h) * d]);
        }
      }
      const KvCache gqa = CacheHolding(dtype, n_kv, d, kv_len, k_gqa, v_gqa);
      const KvCache mha = CacheHolding(dtype, n_heads, d, kv_len, k, v);
      std::vector<float> q(n_tokens * n_heads * d), out_gqa(q.size()),
          out_mha(q.size());
      test::FillRandom(q.data(), q.size(), 62);
      AttentionQuery query;
      query.q_pos0 = kv_len - n_tokens;
      query.q = MatrixView<const float>(q.data(), n_tokens, n_heads * d);
      query.out = MatrixView<float>(out_gqa.data(), n_tokens, n_heads * d);
      ASSERT_TRUE(Attention(gqa, n_heads, &query, 1).ok());
      query.out = MatrixView<float>(out_mha.data(), n_tokens, n_heads * d);
      ASSERT_TRUE(Attention(mha, n_heads, &query, 1).ok());
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_NEAR(out_gqa[i], out_mha[i], 1e-5)
            << DtypeName(dtype) << ", n_kv " << n_kv << " at " << i;
      }
    }
  }
}

// The materialised path: weights are a softmax per row, masked entries are 0,
// and its output matches both the reference and the fused path.
TEST_P(AttentionTest, MaterializedMatchesFused) {
  for (const KvDtype dtype : kDtypes) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      for (const int64_t n_tokens : {1, 37}) {
        const int64_t d = 80, kv_len = 150;
        KvCache cache = MakeCache(layout.n_kv_heads, d, {kv_len}, 71,
                                  /*extra_capacity=*/0, dtype);
        const int64_t width = layout.n_heads * d;
        std::vector<float> q(n_tokens * width), fused(q.size()), mat(q.size());
        test::FillRandom(q.data(), q.size(), 72);
        std::vector<float> weights(layout.n_heads * n_tokens * kv_len);
        AttentionQuery query;
        query.q_pos0 = kv_len - n_tokens;
        query.q = MatrixView<const float>(q.data(), n_tokens, width);
        query.out = MatrixView<float>(fused.data(), n_tokens, width);
        ASSERT_TRUE(Attention(cache, layout.n_heads, &query, 1).ok());
        query.out = MatrixView<float>(mat.data(), n_tokens, width);
        const Status status = AttentionWithWeights(
            cache, layout.n_heads, query,
            MatrixView<float>(weights.data(), layout.n_heads * n_tokens,
                              kv_len));
        ASSERT_TRUE(status.ok()) << status.ToString();
        ExpectMatchesReference(cache, layout.n_heads, query, true,
                               static_cast<float>(1.0 / std::sqrt(d)),
                               "materialized, " + DtypeName(dtype));
        for (size_t i = 0; i < q.size(); ++i) {
          ASSERT_NEAR(fused[i], mat[i], 2e-6)
              << DtypeName(dtype) << " at " << i;
        }
        for (int64_t row = 0; row < layout.n_heads * n_tokens; ++row) {
          const int64_t t = row % n_tokens;
          double sum = 0.0;
          for (int64_t s = 0; s < kv_len; ++s) {
            const float w = weights[row * kv_len + s];
            if (s > query.q_pos0 + t) {
              ASSERT_EQ(w, 0.0f);
            }
            sum += w;
          }
          ASSERT_NEAR(sum, 1.0, 1e-5);
        }
      }
    }
  }
}

// Runs case c's query (q, the options, mask [n_tokens, kv_len] or null) on
// 1, 2 and 7 threads: the outputs must be the same bits.
void ExpectSameBitsOnAnyThreadCount(const KvCache& cache, const Case& c,
                                    const std::vector<float>& q,
                                    const AttentionOptions& options,
                                    const float* mask) {
  const int64_t width = c.layout.n_heads * c.head_dim;
  std::vector<float> first;
  for (const int threads : {1, 2, 7}) {
    std::vector<float> out(q.size());
    AttentionQuery query;
    query.q_pos0 = c.kv_len - c.n_tokens;
    query.q = MatrixView<const float>(q.data(), c.n_tokens, width);
    query.out = MatrixView<float>(out.data(), c.n_tokens, width);
    if (mask != nullptr) {
      query.mask = MatrixView<const float>(mask, c.n_tokens, c.kv_len);
    }
    tbb::task_arena arena(threads);
    arena.execute([&] {
      ASSERT_TRUE(Attention(cache, c.layout.n_heads, &query, 1, options).ok());
    });
    if (first.empty()) {
      first = out;
    } else {
      ASSERT_EQ(
          0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float)))
          << Describe(c) << ", " << threads << " threads";
    }
  }
}

// Bit-identical outputs for 1, 2 and 7 threads: decode (chunked) and prefill.
// The engines of AttentionCompute::kBFloat16's wide tiles, each where the
// CPU has it: AMX tiles (AmxBFloat16Active), vdpbf16ps with AMX off
// (NativeBFloat16Active under kWhereSupported), float32 products.
struct BF16Engine {
  bool amx;
  NativeBFloat16 native;
  const char* label;
};
constexpr BF16Engine kBF16Engines[] = {
    {true, NativeBFloat16::kNever, "AMX"},
    {false, NativeBFloat16::kWhereSupported, "vdpbf16ps"},
    {false, NativeBFloat16::kNever, "float32 products"}};

// A BF16Engine's settings for the lifetime of the scope.
struct BF16EngineScope {
  explicit BF16EngineScope(const BF16Engine& engine)
      : amx(engine.amx), native(engine.native) {}
  AmxBFloat16Scope amx;
  NativeBFloat16Scope native;
};

TEST_P(AttentionTest, SameBitsForAnyThreadCount) {
  for (const KvDtype dtype : kDtypes) {
    for (Case c :
         {Case{{8, 2}, 64, 5000, 1, true}, Case{{8, 8}, 128, 3000, 1, true},
          Case{{32, 1}, 64, 2000, 1, true}, Case{{8, 4}, 64, 300, 300, true}}) {
      c.dtype = dtype;
      KvCache cache = MakeCache(c.layout.n_kv_heads, c.head_dim, {c.kv_len}, 81,
                                /*extra_capacity=*/0, dtype);
      std::vector<float> q(c.n_tokens * c.layout.n_heads * c.head_dim);
      test::FillRandom(q.data(), q.size(), 82);
      ExpectSameBitsOnAnyThreadCount(cache, c, q, {}, nullptr);
      if (HasFatalFailure()) return;
      if (dtype == KvDtype::kInt8) {
        AttentionOptions options;
        options.compute = AttentionCompute::kInt8;
        ExpectSameBitsOnAnyThreadCount(cache, c, q, options, nullptr);
        if (HasFatalFailure()) return;
      }
      if (dtype == KvDtype::kBFloat16) {
        AttentionOptions options;
        options.compute = AttentionCompute::kBFloat16;
        for (const BF16Engine& engine : kBF16Engines) {
          const BF16EngineScope scope(engine);
          ExpectSameBitsOnAnyThreadCount(cache, c, q, options, nullptr);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Prefill of k tokens, then one-token decode steps, equals one-shot prefill of
// all tokens.
TEST_P(AttentionTest, PrefillThenDecodeEqualsOneShot) {
  for (const KvDtype dtype : kDtypes) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      const int64_t d = 64, total = 80, first = 50;
      const int64_t width = layout.n_heads * d,
                    kv_width = layout.n_kv_heads * d;
      std::vector<float> q(total * width), k(total * kv_width),
          v(total * kv_width);
      test::FillRandom(q.data(), q.size(), 91);
      test::FillRandom(k.data(), k.size(), 92);
      test::FillRandom(v.data(), v.size(), 93);
      KvCacheConfig config{1, layout.n_kv_heads, d, total, dtype};
      KvCache one_shot, stepped;
      ASSERT_TRUE(KvCache::Create(config, &one_shot).ok());
      ASSERT_TRUE(KvCache::Create(config, &stepped).ok());
      ASSERT_TRUE(
          one_shot
              .Append(0, MatrixView<const float>(k.data(), total, kv_width),
                      MatrixView<const float>(v.data(), total, kv_width))
              .ok());
      std::vector<float> want(total * width), got(total * width);
      AttentionQuery query;
      query.q = MatrixView<const float>(q.data(), total, width);
      query.out = MatrixView<float>(want.data(), total, width);
      ASSERT_TRUE(Attention(one_shot, layout.n_heads, &query, 1).ok());
      for (int64_t t0 = 0; t0 < total;) {
        const int64_t n = t0 == 0 ? first : 1;
        ASSERT_TRUE(
            stepped
                .Append(0,
                        MatrixView<const float>(&k[t0 * kv_width], n, kv_width),
                        MatrixView<const float>(&v[t0 * kv_width], n, kv_width))
                .ok());
        query.q_pos0 = t0;
        query.q = MatrixView<const float>(&q[t0 * width], n, width);
        query.out = MatrixView<float>(&got[t0 * width], n, width);
        ASSERT_TRUE(Attention(stepped, layout.n_heads, &query, 1).ok());
        t0 += n;
      }
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-6) << DtypeName(dtype) << " at " << i;
    }
  }
}

TEST_P(AttentionTest, NaNInAQueryRowReachesItsOutput) {
  const int64_t d = 32, n_heads = 8, kv_len = 100;
  for (const KvDtype dtype : kDtypes) {
    for (const int64_t n_kv : {8, 1}) {
      for (const int64_t n_tokens : {1, 40}) {
        KvCache cache =
            MakeCache(n_kv, d, {kv_len}, 101, /*extra_capacity=*/0, dtype);
        std::vector<float> q(n_tokens * n_heads * d), out(q.size());
        test::FillRandom(q.data(), q.size(), 102);
        q[(n_tokens - 1) * n_heads * d + 3] =
            std::numeric_limits<float>::quiet_NaN();
        AttentionQuery query;
        query.q_pos0 = kv_len - n_tokens;
        query.q = MatrixView<const float>(q.data(), n_tokens, n_heads * d);
        query.out = MatrixView<float>(out.data(), n_tokens, n_heads * d);
        ASSERT_TRUE(Attention(cache, n_heads, &query, 1).ok());
        // Head 0 of the last token is NaN; head 1 is not.
        EXPECT_TRUE(std::isnan(out[(n_tokens - 1) * n_heads * d]));
        EXPECT_FALSE(std::isnan(out[(n_tokens - 1) * n_heads * d + d]));
      }
    }
  }
}

// Runs `query` through the fused and the materialised path and checks both
// against the reference.
void ExpectBothPathsMatch(const KvCache& cache, int64_t n_heads,
                          AttentionQuery query, const AttentionOptions& options,
                          const std::string& what) {
  const bool causal = options.mask == AttentionMask::kCausal;
  const float scale = options.scale;
  Status status = Attention(cache, n_heads, &query, 1, options);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectMatchesReference(cache, n_heads, query, causal, scale,
                         what + ", fused");
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<float> weights(n_heads * query.q.rows * cache.length(query.seq));
  status = AttentionWithWeights(
      cache, n_heads, query,
      MatrixView<float>(weights.data(), n_heads * query.q.rows,
                        cache.length(query.seq)),
      options);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ExpectMatchesReference(cache, n_heads, query, causal, scale,
                         what + ", materialised");
}

// A mask of -FLT_MAX on a whole row (the Hugging Face convention) leaves the
// row's visible keys visible: s + mask rounds to -FLT_MAX for each, so the row
// is their uniform average on every path. Masks near the float range (+3e38,
// -3e38 beside -FLT_MAX) are added in natural units as well.
TEST_P(AttentionTest, MasksNearTheFloatRange) {
  const float lowest = std::numeric_limits<float>::lowest();
  const int64_t lanes = static_cast<int64_t>(test::ActiveFloatLanes());
  for (const KvDtype dtype : kDtypes) {
    for (const Layout& layout : {Layout{4, 4}, Layout{8, 2}, Layout{8, 1}}) {
      for (const int64_t n_tokens :
           SweepFor<int64_t>(dtype, {1, 3, 2 * lanes, 16}, {1, 2 * lanes})) {
        for (const int64_t kv_len :
             SweepFor<int64_t>(dtype, {66, 1500}, {1500})) {
          const int64_t d = 64;
          KvCache cache = MakeCache(layout.n_kv_heads, d, {kv_len}, 301,
                                    /*extra_capacity=*/0, dtype);
          const int64_t width = layout.n_heads * d;
          std::vector<float> q(n_tokens * width), out(q.size(), -7.0f);
          test::FillRandom(q.data(), q.size(), 302);
          std::vector<float> mask(n_tokens * kv_len);
          test::FillRandom(mask.data(), mask.size(), 303, -2.0f, 2.0f);
          std::fill(mask.begin(), mask.begin() + kv_len, lowest);  // row 0
          for (int64_t t = 1; t < n_tokens; ++t) {
            float* row = mask.data() + t * kv_len;
            if (t % 3 == 1) {
              for (int64_t s = 0; s < kv_len; ++s) {
                row[s] = s % 2 ? -3e38f : lowest;
              }
            } else if (t % 3 == 2) {
              row[t % kv_len] = 3e38f;
            }
          }
          AttentionQuery query;
          query.q_pos0 = kv_len - n_tokens - 3 * (kv_len > 100);
          query.q = MatrixView<const float>(q.data(), n_tokens, width);
          query.out = MatrixView<float>(out.data(), n_tokens, width);
          query.mask = MatrixView<const float>(mask.data(), n_tokens, kv_len);
          for (const AttentionMask kind :
               {AttentionMask::kCausal, AttentionMask::kNone}) {
            AttentionOptions options;
            options.mask = kind;
            options.scale = 0.125f;
            ExpectBothPathsMatch(cache, layout.n_heads, query, options,
                                 DtypeName(dtype) + ", lowest mask, n_tokens " +
                                     std::to_string(n_tokens) + ", kv_len " +
                                     std::to_string(kv_len));
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// A NaN or inf in the K or V row of a key that a query must not see (past its
// position, or under a -inf mask entry) changes nothing for that query; the
// queries that see it get a non-finite row. Wide and narrow tiles, chunked
// decode and the materialised path, every dtype: bf16 and f16 keep the NaN or
// inf, int8 gives the row a NaN scale (storage.h), so the whole row reads NaN
// and every query that sees it gets NaN in every column. A bf16 cache in
// AttentionCompute::kBFloat16 (AMX in wide tiles where it runs) gives NaN in
// the same outputs.
TEST_P(AttentionTest, HiddenKeysContributeNothing) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t lanes = static_cast<int64_t>(test::ActiveFloatLanes());
  struct Shape {
    Layout layout;
    int64_t d, kv_len, n_tokens;
    bool with_mask;
  };
  const Shape shapes[] = {
      {{1, 1}, 4, 6, 6, false},  // every query but the last misses key 5
      {{8, 8}, 64, 300, 40, false}, {{8, 2}, 64, 300, 2 * lanes, true},
      {{32, 1}, 16, 200, 40, true}, {{8, 8}, 64, 3000, 1, true},
      {{8, 8}, 72, 150, 3, false},  {{4, 2}, 64, 3000, 5, true},
  };
  for (const KvDtype dtype : kDtypes) {
    for (const Shape& shape : shapes) {
      // The stored types keep NaN and inf as float32 reads them (storage.h):
      // NaN alone for them.
      for (const float poison : SweepFor<float>(dtype, {nan, kInf}, {nan})) {
        for (const bool in_v : {true, false}) {
          const int64_t d = shape.d, kv_len = shape.kv_len;
          const int64_t n_tokens = shape.n_tokens;
          const int64_t kv_width = shape.layout.n_kv_heads * d;
          std::vector<float> k(kv_len * kv_width), v(k.size());
          test::FillRandom(k.data(), k.size(), 401);
          test::FillRandom(v.data(), v.size(), 402);
          // The last key (seen by the last query only, under causal) and, with
          // the mask, key 3 (hidden from even tokens by the mask).
          (in_v ? v : k)[(kv_len - 1) * kv_width + d / 2] = poison;
          if (shape.with_mask) (in_v ? v : k)[3 * kv_width + d / 2] = poison;
          const KvCache cache =
              CacheHolding(dtype, shape.layout.n_kv_heads, d, kv_len, k, v);
          const int64_t width = shape.layout.n_heads * d;
          std::vector<float> q(n_tokens * width), out(q.size(), -7.0f);
          test::FillRandom(q.data(), q.size(), 403);
          std::vector<float> mask(n_tokens * kv_len);
          test::FillRandom(mask.data(), mask.size(), 404, -1.0f, 1.0f);
          for (int64_t t = 0; t < n_tokens; t += 2)
            mask[t * kv_len + 3] = -kInf;
          AttentionQuery query;
          query.q_pos0 = kv_len - n_tokens;
          query.q = MatrixView<const float>(q.data(), n_tokens, width);
          query.out = MatrixView<float>(out.data(), n_tokens, width);
          if (shape.with_mask) {
            query.mask = MatrixView<const float>(mask.data(), n_tokens, kv_len);
          }
          AttentionOptions options;
          options.scale = 0.25f;
          const std::string what =
              DtypeName(dtype) + ", " +
              std::string(std::isnan(poison) ? "NaN" : "inf") + " in " +
              (in_v ? "V" : "K") + ", heads " +
              std::to_string(shape.layout.n_heads) + "/" +
              std::to_string(shape.layout.n_kv_heads) + ", kv_len " +
              std::to_string(kv_len) + ", n_tokens " + std::to_string(n_tokens);
          ExpectBothPathsMatch(cache, shape.layout.n_heads, query, options,
                               what);
          if (HasFatalFailure()) return;
          // kBFloat16 on each engine: NaN in the same outputs.
          if (dtype == KvDtype::kBFloat16) {
            std::vector<float> out_bf16(out.size());
            AttentionQuery bf16_query = query;
            bf16_query.out =
                MatrixView<float>(out_bf16.data(), n_tokens, width);
            AttentionOptions bf16_options = options;
            bf16_options.compute = AttentionCompute::kBFloat16;
            for (const BF16Engine& engine : kBF16Engines) {
              const BF16EngineScope scope(engine);
              ASSERT_TRUE(Attention(cache, shape.layout.n_heads, &bf16_query, 1,
                                    bf16_options)
                              .ok());
              for (size_t i = 0; i < out.size(); ++i) {
                ASSERT_EQ(std::isnan(out_bf16[i]), std::isnan(out[i]))
                    << what << ", bf16 products on " << engine.label
                    << ", element " << i;
              }
            }
          }
          // The first query misses the last key under causal: finite.
          if (n_tokens > 1 && !shape.with_mask) {
            for (int64_t col = 0; col < width; ++col) {
              ASSERT_TRUE(std::isfinite(out[col])) << what << ", col " << col;
            }
          }
          // int8: the last query sees the NaN-scale row: NaN in every column of
          // the heads that read its KV head (0).
          if (dtype == KvDtype::kInt8 && !shape.with_mask) {
            const int64_t group =
                shape.layout.n_heads / shape.layout.n_kv_heads;
            for (int64_t col = 0; col < group * d; ++col) {
              ASSERT_TRUE(std::isnan(out[(n_tokens - 1) * width + col]))
                  << what << ", col " << col;
            }
          }
        }
      }
    }
  }
}

// Large logits, where the rounding of the scores dominates attention.h's
// bound: q is all ones and every key row is a permutation of one row, so all
// scores are exactly equal (about 960) and the exact output is the mean of V;
// what moves the weights is only how each score's sum of d products rounds.
// Wide and narrow tiles, few keys (the error averages out over many).
TEST_P(AttentionTest, LargeLogitsWithinTheBound) {
  const int64_t d = 64;
  for (const KvDtype dtype : kDtypes) {
    double worst = 0.0;
    for (const Layout& layout : {Layout{8, 2}, Layout{8, 8}}) {
      for (const auto& [kv_len, n_tokens] :
           std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {5, 1}, {40, 40}}) {
        const int64_t kv_width = layout.n_kv_heads * d;
        std::vector<float> base(d), k(kv_len * kv_width), v(k.size());
        test::FillRandom(base.data(), d, 501, 0.5f, 1.0f);
        std::mt19937 rng(502);
        for (int64_t i = 0; i < kv_len * layout.n_kv_heads; ++i) {
          std::shuffle(base.begin(), base.end(), rng);
          std::copy(base.begin(), base.end(), k.begin() + i * d);
        }
        for (int64_t s = 0; s < kv_len; ++s) {
          std::fill_n(v.begin() + s * kv_width, kv_width, s % 2 ? -1.0f : 1.0f);
        }
        const KvCache cache =
            CacheHolding(dtype, layout.n_kv_heads, d, kv_len, k, v);
        const int64_t width = layout.n_heads * d;
        std::vector<float> q(n_tokens * width, 1.0f), out(q.size());
        AttentionQuery query;
        query.q_pos0 = kv_len - n_tokens;
        query.q = MatrixView<const float>(q.data(), n_tokens, width);
        query.out = MatrixView<float>(out.data(), n_tokens, width);
        AttentionOptions options;
        options.mask = AttentionMask::kNone;
        options.scale = 20.0f;  // scores of 20 * 64 * 0.75 = 960
        ASSERT_TRUE(Attention(cache, layout.n_heads, &query, 1, options).ok());
        ExpectMatchesReference(cache, layout.n_heads, query, false,
                               options.scale,
                               DtypeName(dtype) + ", large logits, kv_len " +
                                   std::to_string(kv_len),
                               &worst);
        if (HasFatalFailure()) return;
      }
    }
    // Not vacuous: the score rounding shows, within the bound.
    EXPECT_GT(worst, 0.01) << DtypeName(dtype);
    std::printf("  %s, equal scores near 960: worst error / bound %.3f\n",
                DtypeName(dtype).c_str(), worst);
  }
}

// Decode (one query row: the narrow-tile path) with a NaN in q, in a visible K
// row or in a visible V row: the NaN reaches the heads that read it and no
// other, and no NaN is converted to an integer on the way (as EMU128's Exp
// would; the clang build's -fsanitize=undefined reports one). Every dtype
// (int8: the row's NaN scale).
// GQA (query heads 0 and 1 read KV head 0) and MHA over 3 KV heads (heads 0
// and 1 run as a pair, head 2 alone): a NaN in q, K or V of KV head 0 reaches
// the heads that read it and no other.
TEST_P(AttentionTest, DecodeWithNaNInQKOrV) {
  const int64_t d = 16, kv_len = 70;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Layout layout : {Layout{4, 2}, Layout{3, 3}}) {
    const int64_t n_heads = layout.n_heads, n_kv_heads = layout.n_kv_heads;
    const int64_t group = n_heads / n_kv_heads;
    for (const KvDtype dtype : kDtypes) {
      for (const int where : {0, 1, 2}) {  // q, K, V
        std::vector<float> k(kv_len * n_kv_heads * d), v(k.size());
        test::FillRandom(k.data(), k.size(), 201);
        test::FillRandom(v.data(), v.size(), 203);
        // Key 5 of KV head 0, column 3.
        if (where > 0) (where == 1 ? k : v)[5 * n_kv_heads * d + 3] = nan;
        const KvCache cache = CacheHolding(dtype, n_kv_heads, d, kv_len, k, v);
        std::vector<float> q(n_heads * d), out(q.size());
        test::FillRandom(q.data(), q.size(), 202);
        if (where == 0) q[3] = nan;  // head 0
        AttentionQuery query;
        query.q_pos0 = kv_len - 1;
        query.q = MatrixView<const float>(q.data(), 1, n_heads * d);
        query.out = MatrixView<float>(out.data(), 1, n_heads * d);
        ASSERT_TRUE(Attention(cache, n_heads, &query, 1).ok());
        const std::string what = DtypeName(dtype) + ", " +
                                 std::to_string(where) + ", heads " +
                                 std::to_string(n_heads);
        EXPECT_TRUE(std::isnan(out[where == 2 ? 3 : 0])) << what;
        if (where > 0 && group > 1) {
          EXPECT_TRUE(std::isnan(out[d + (where == 2 ? 3 : 0)])) << what;
        }
        for (int64_t i = group * d; i < n_heads * d; ++i) {
          ASSERT_FALSE(std::isnan(out[i])) << what << ", " << i;
        }
      }
    }
  }
}

// q, out and the mask next to guard pages (test/support/guard_page.h), with
// odd strides and start addresses aligned to a float only: no path reads or
// writes a byte outside its views. Every dtype, narrow and wide tiles, the
// fused and the materialised path.
TEST_P(AttentionTest, ViewsAtGuardPages) {
  const int64_t d = 40, kv_len = 200;
  for (const KvDtype dtype : kDtypes) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      const KvCache cache = MakeCache(layout.n_kv_heads, d, {kv_len}, 601,
                                      /*extra_capacity=*/0, dtype);
      for (const int64_t n_tokens : {1, 3, 40}) {
        for (const test::GuardSide side :
             {test::GuardSide::kAfter, test::GuardSide::kBefore}) {
          const int64_t width = layout.n_heads * d;
          const int64_t q_stride = width + 1, out_stride = width + 3;
          const int64_t mask_stride = kv_len + 1;
          test::GuardedBuffer<float> q((n_tokens - 1) * q_stride + width, side);
          test::GuardedBuffer<float> out((n_tokens - 1) * out_stride + width,
                                         side);
          test::GuardedBuffer<float> mask((n_tokens - 1) * mask_stride + kv_len,
                                          side);
          test::FillRandom(q.data(), q.size(), 602);
          test::FillRandom(mask.data(), mask.size(), 603);
          for (size_t i = 0; i < mask.size(); i += 5) mask[i] = -kInf;
          AttentionQuery query;
          query.q_pos0 = kv_len - n_tokens;
          query.q =
              MatrixView<const float>(q.data(), n_tokens, width, q_stride);
          query.out =
              MatrixView<float>(out.data(), n_tokens, width, out_stride);
          query.mask = MatrixView<const float>(mask.data(), n_tokens, kv_len,
                                               mask_stride);
          AttentionOptions options;
          options.scale = 0.125f;
          ExpectBothPathsMatch(cache, layout.n_heads, query, options,
                               DtypeName(dtype) + ", guard pages, heads " +
                                   std::to_string(layout.n_heads) + "/" +
                                   std::to_string(layout.n_kv_heads) +
                                   ", n_tokens " + std::to_string(n_tokens));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The compute modes with q, out and the mask in strided views against guard
// pages, before and after: the same bits as with contiguous views, kBFloat16
// on each engine (head_dim 64: bf16 pairs in the wide tiles where an engine
// runs). Decode (narrow tiles) and prefill (wide).
TEST_P(AttentionTest, ComputeModesAtGuardPages) {
  const int64_t d = 64, kv_len = 200;
  struct Mode {
    KvDtype dtype;
    AttentionCompute compute;
    size_t engines;  // the first of kBF16Engines
  };
  for (const Mode& mode :
       {Mode{KvDtype::kBFloat16, AttentionCompute::kBFloat16, 3},
        Mode{KvDtype::kInt8, AttentionCompute::kInt8, 1}}) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      const KvCache cache = MakeCache(layout.n_kv_heads, d, {kv_len}, 611,
                                      /*extra_capacity=*/0, mode.dtype);
      const int64_t width = layout.n_heads * d;
      for (const int64_t n_tokens : {1, 3, 40}) {
        std::vector<float> q(n_tokens * width), mask(n_tokens * kv_len);
        test::FillRandom(q.data(), q.size(), 612);
        test::FillRandom(mask.data(), mask.size(), 613);
        for (size_t i = 0; i < mask.size(); i += 5) mask[i] = -kInf;
        AttentionOptions options;
        options.scale = 0.125f;
        options.compute = mode.compute;
        for (size_t e = 0; e < mode.engines; ++e) {
          const BF16EngineScope scope(kBF16Engines[e]);
          const std::string what = DtypeName(mode.dtype) + " products on " +
                                   kBF16Engines[e].label + ", heads " +
                                   std::to_string(layout.n_heads) + "/" +
                                   std::to_string(layout.n_kv_heads) +
                                   ", n_tokens " + std::to_string(n_tokens);
          std::vector<float> expected(q.size());
          AttentionQuery query;
          query.q_pos0 = kv_len - n_tokens;
          query.q = MatrixView<const float>(q.data(), n_tokens, width);
          query.out = MatrixView<float>(expected.data(), n_tokens, width);
          query.mask = MatrixView<const float>(mask.data(), n_tokens, kv_len);
          ASSERT_TRUE(Attention(cache, layout.n_heads, &query, 1, options).ok())
              << what;
          for (const test::GuardSide side :
               {test::GuardSide::kAfter, test::GuardSide::kBefore}) {
            const int64_t q_stride = width + 1, out_stride = width + 3;
            const int64_t mask_stride = kv_len + 1;
            test::GuardedBuffer<float> gq((n_tokens - 1) * q_stride + width,
                                          side);
            test::GuardedBuffer<float> gout((n_tokens - 1) * out_stride + width,
                                            side);
            test::GuardedBuffer<float> gmask(
                (n_tokens - 1) * mask_stride + kv_len, side);
            for (int64_t t = 0; t < n_tokens; ++t) {
              std::copy(q.begin() + t * width, q.begin() + (t + 1) * width,
                        gq.begin() + t * q_stride);
              std::copy(mask.begin() + t * kv_len,
                        mask.begin() + (t + 1) * kv_len,
                        gmask.begin() + t * mask_stride);
            }
            query.q =
                MatrixView<const float>(gq.data(), n_tokens, width, q_stride);
            query.out =
                MatrixView<float>(gout.data(), n_tokens, width, out_stride);
            query.mask = MatrixView<const float>(gmask.data(), n_tokens, kv_len,
                                                 mask_stride);
            ASSERT_TRUE(
                Attention(cache, layout.n_heads, &query, 1, options).ok())
                << what;
            for (int64_t t = 0; t < n_tokens; ++t) {
              ASSERT_EQ(std::memcmp(gout.data() + t * out_stride,
                                    expected.data() + t * width,
                                    width * sizeof(float)),
                        0)
                  << what << ", token " << t;
            }
          }
        }
      }
    }
  }
}

// The most an element x of a row whose largest |x| is row_max moves when the
// cache stores it (storage.h): bf16 and f16 round to nearest even, a relative
// error of at most 2^-8 and 2^-11 (8 and 11 significant bits), f16 below 2^-14
// in steps of 2^-24 (half a step: 2^-25); int8 rounds x / scale to an integer,
// scale = row_max / 127, so at most scale / 2 = row_max / 254, plus 2^-22
// row_max for the float32 roundings of the scale and of scale * q.
double StorageError(KvDtype dtype, double row_max, double x) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return 0.0;
    case KvDtype::kBFloat16:
      return std::ldexp(std::fabs(x), -8);
    case KvDtype::kFloat16:
      return std::ldexp(std::fabs(x), -11) + std::ldexp(1.0, -25);
    case KvDtype::kInt8:
      return row_max * (1.0 / 254 + std::ldexp(1.0, -22));
  }
  return 0.0;
}

// A shape of the error-bound tests: a layout, head_dim d, kv_len cached keys
// and the n_tokens last positions as queries.
struct BoundShape {
  Layout layout;
  int64_t d, kv_len, n_tokens;
};

// Random K and V [kv_len, n_kv_heads * d] for shape (seeds seed, seed + 1).
void RandomKv(const BoundShape& shape, uint64_t seed, std::vector<float>* k,
              std::vector<float>* v) {
  k->resize(shape.kv_len * shape.layout.n_kv_heads * shape.d);
  v->resize(k->size());
  test::FillRandom(k->data(), k->size(), seed);
  test::FillRandom(v->data(), v->size(), seed + 1);
}

// The float32 tolerance of an output element of a row that sees `seen` keys,
// its scores at most s_abs and V at most v_abs in magnitude: the summation
// errors of the scores through the softmax and of P V.
double Float32OutputTolerance(double v_abs, double s_abs, int64_t d,
                              int64_t seen) {
  return 4 * kU * v_abs *
         (std::sqrt(static_cast<double>(d)) * s_abs +
          std::sqrt(static_cast<double>(seen)) + 8);
}

// The error of storage rounding: each dtype against the float64 attention over
// K and V as appended (not rounded). For a query row whose visible scores move
// by at most delta (|scale * q . (k' - k)| <= scale * sum_p |q_p| err(k_p),
// err: StorageError), each softmax weight moves by a factor in [e^-2delta,
// e^2delta], so sum_s |w'_s - w_s| <= e^(2 delta) - 1; with V's elements moved
// by at most dv:
//   |o' - o| = |sum_s (w'_s - w_s) v'_s + sum_s w_s (v'_s - v_s)|
//           <= |V'|max (e^(2 delta) - 1) + dv,
// plus the float32 tolerance of ExpectMatchesReference. This bound is the
// worst case (every rounding against the result): the test checks it holds on
// every target and prints the measured errors, relative to |V|max and as the
// RMS error over the RMS output.
TEST_P(AttentionTest, StorageErrorWithinBound) {
  // MHA prefill, GQA-4 split-KV decode, MQA chunked prefill.
  const BoundShape shapes[] = {
      {{8, 8}, 64, 300, 300}, {{8, 2}, 128, 3001, 1}, {{8, 1}, 72, 300, 50}};
  for (const KvDtype dtype : kDtypes) {
    double worst_ratio = 0.0, worst_rel = 0.0, err_sq = 0.0, out_sq = 0.0;
    for (const BoundShape& shape : shapes) {
      const int64_t d = shape.d, kv_len = shape.kv_len;
      const int64_t n_tokens = shape.n_tokens, n_heads = shape.layout.n_heads;
      const int64_t n_kv = shape.layout.n_kv_heads, group = n_heads / n_kv;
      const int64_t kv_width = n_kv * d, width = n_heads * d;
      std::vector<float> k, v;
      RandomKv(shape, 701, &k, &v);
      // An all-zero row (int8 scale 0) reads back exactly.
      std::fill_n(k.begin() + 7 * kv_width, kv_width, 0.0f);
      std::fill_n(v.begin() + 7 * kv_width, kv_width, 0.0f);
      const KvCache cache = CacheHolding(dtype, n_kv, d, kv_len, k, v);
      std::vector<float> q(n_tokens * width), out(q.size());
      test::FillRandom(q.data(), q.size(), 703);
      AttentionQuery query;
      query.q_pos0 = kv_len - n_tokens;
      query.q = MatrixView<const float>(q.data(), n_tokens, width);
      query.out = MatrixView<float>(out.data(), n_tokens, width);
      AttentionOptions options;
      options.scale = static_cast<float>(1.0 / std::sqrt(d));
      ASSERT_TRUE(Attention(cache, n_heads, &query, 1, options).ok());
      // The exact output and the bound per (token, head) (ComputedOnce).
      struct Bounded {
        std::vector<double> exact, bound, v_abs;
      };
      InputHash key;
      const int64_t sizes[] = {
          static_cast<int64_t>(dtype), n_heads, n_kv, d, kv_len, n_tokens};
      key.Add(sizes, 6).Add(q.data(), q.size()).Add(k.data(), k.size());
      key.Add(v.data(), v.size());
      const Bounded& want = ComputedOnce<Bounded>(key.h, [&] {
        Bounded r;
        const std::vector<double> qd =
            test::ref::ToDouble(q.data(), n_tokens, width, width);
        const std::vector<double> kd =
            test::ref::ToDouble(k.data(), kv_len, kv_width, kv_width);
        const std::vector<double> vd =
            test::ref::ToDouble(v.data(), kv_len, kv_width, kv_width);
        r.exact = test::ref::AttentionCore(
            qd.data(), width, n_tokens, kd.data(), kv_width, vd.data(),
            kv_width, kv_len, n_heads, n_kv, d, query.q_pos0, /*causal=*/true,
            nullptr, 0, options.scale);
        // Per (key, KV head) row: the largest |x| of V and the storage error
        // of each K element and of V's worst.
        std::vector<double> k_err(k.size()), v_max(kv_len * n_kv),
            dv_row(v_max.size());
        for (int64_t i = 0; i < kv_len * n_kv; ++i) {
          double k_max = 0.0;
          for (int64_t p = 0; p < d; ++p) {
            k_max = std::max<double>(k_max, std::fabs(k[i * d + p]));
            v_max[i] = std::max<double>(v_max[i], std::fabs(v[i * d + p]));
          }
          for (int64_t p = 0; p < d; ++p) {
            k_err[i * d + p] = StorageError(dtype, k_max, k[i * d + p]);
            dv_row[i] = std::max(dv_row[i],
                                 StorageError(dtype, v_max[i], v[i * d + p]));
          }
        }
        for (int64_t t = 0; t < n_tokens; ++t) {
          const int64_t seen = query.q_pos0 + t + 1;
          for (int64_t h = 0; h < n_heads; ++h) {
            const int64_t g = h / group;
            const double* q_row = &qd[t * width + h * d];
            double delta = 0.0, dv = 0.0, v_abs = 0.0, s_abs = 0.0;
            for (int64_t s = 0; s < seen; ++s) {
              const int64_t row = s * n_kv + g;
              double shift = 0.0, dot = 0.0;
              for (int64_t p = 0; p < d; ++p) {
                shift += std::fabs(q_row[p]) * k_err[row * d + p];
                dot += std::fabs(q_row[p] * k[row * d + p]);
              }
              dv = std::max(dv, dv_row[row]);
              delta = std::max(delta, options.scale * shift);
              s_abs = std::max(s_abs, options.scale * (dot + shift));
              v_abs = std::max(v_abs, v_max[row]);
            }
            v_abs += dv;  // |V'|max
            const double f32_tol =
                Float32OutputTolerance(v_abs, s_abs, d, seen);
            r.bound.push_back(v_abs * std::expm1(2 * delta) + dv + f32_tol);
            r.v_abs.push_back(v_abs);
          }
        }
        return r;
      });
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t h = 0; h < n_heads; ++h) {
          const double bound = want.bound[t * n_heads + h];
          const double v_abs = want.v_abs[t * n_heads + h];
          for (int64_t p = 0; p < d; ++p) {
            const double exact = want.exact[t * width + h * d + p];
            const double err = std::fabs(out[t * width + h * d + p] - exact);
            ASSERT_LE(err, bound)
                << DtypeName(dtype) << ": heads " << n_heads << "/" << n_kv
                << ", token " << t << ", head " << h << ", col " << p;
            worst_ratio = std::max(worst_ratio, err / bound);
            worst_rel = std::max(worst_rel, err / v_abs);
            err_sq += err * err;
            out_sq += exact * exact;
          }
        }
      }
    }
    std::printf(
        "  %s storage: max |error| / |V|max %.2e, rms error / rms output "
        "%.2e, worst error / bound %.3f\n",
        DtypeName(dtype).c_str(), worst_rel, std::sqrt(err_sq / out_sq),
        worst_ratio);
    // Not vacuous: the storage rounding reaches a tenth of the worst case
    // (0.12 for bf16, f16 and int8 when written).
    if (dtype != KvDtype::kFloat32) {
      EXPECT_GT(worst_ratio, 0.05) << DtypeName(dtype);
    }
  }
}

struct VariantSet {
  std::string name;
  int64_t window = 0;
  float softcap = 0.0f;
  bool alibi = false;
  bool sinks = false;
  bool additive_mask = false;
  int64_t n_sink_tokens = 0;
};

const std::vector<VariantSet>& VariantSets() {
  static const std::vector<VariantSet> sets = {
      {"window 1", 1},
      {"window 100", 100},
      {"softcap", 0, 1.5f},
      {"alibi", 0, 0.0f, true},
      {"sinks", 0, 0.0f, false, true},
      {"window 37 + softcap + sinks", 37, 2.0f, false, true},
      {"alibi + mask", 0, 0.0f, true, false, true},
      {"window 100 + 4 sink tokens", 100, 0.0f, false, false, false, 4},
      {"window 1 + 1 sink token", 1, 0.0f, false, false, false, 1},
      {"all", 200, 3.0f, true, true, true, 5},
  };
  return sets;
}

// The options, reference variants and (with additive_mask) mask [n_tokens,
// kv_len] of a set for n_heads heads; slopes and sinks live in *arrays.
struct VariantCall {
  AttentionOptions options;
  test::ref::Variants variants;
  std::vector<float> slopes, sinks, mask;
};
VariantCall MakeVariantCall(const VariantSet& set, int64_t n_heads,
                            int64_t n_tokens, int64_t kv_len, bool causal,
                            uint64_t seed) {
  VariantCall call;
  call.options.mask = causal ? AttentionMask::kCausal : AttentionMask::kNone;
  // Scores of a few units, where tanh bends.
  call.options.scale = 0.5f;
  call.options.window = set.window;
  call.options.n_sink_tokens = set.n_sink_tokens;
  call.options.softcap = set.softcap;
  call.variants.window = set.window;
  call.variants.n_sink_tokens = set.n_sink_tokens;
  call.variants.softcap = set.softcap;
  if (set.alibi) {
    call.slopes.resize(static_cast<size_t>(n_heads));
    EXPECT_TRUE(AlibiSlopes(n_heads, call.slopes.data()).ok());
    call.options.alibi_slopes = call.variants.alibi_slopes = call.slopes.data();
  }
  if (set.sinks) {
    call.sinks = test::RandomVector(n_heads, seed, -1.0f, 3.0f);
    call.options.sink_logits = call.variants.sink_logits = call.sinks.data();
  }
  if (set.additive_mask) {
    call.mask = test::RandomVector(n_tokens * kv_len, seed + 1, -2.0f, 2.0f);
    for (size_t i = 0; i < call.mask.size(); i += 5) call.mask[i] = -kInf;
  }
  return call;
}

// An AttentionCompute mode against the float64 attention over the stored
// (dequantized) K and V, on shapes of 1 token (decode) or many (prefill):
// with score_shift(q_row, k_row) the most a score of the row moves (times
// the scale), and with the weights P rounded to relative p_round, each
// weight moves by a factor in [e^-2delta, e^2delta] (delta the row's largest
// shift) times 1 + eta, |eta| <= p_round. Then
//   |o' - o| <= sum_s |w'_s (1 + eta_s) - w_s| |V_s|
//           <= (e^(2 delta) (1 + p_round) - 1) |V|max,
// plus the float32 tolerance of StorageErrorWithinBound (AttentionCompute's
// stated bounds). With the weights times V's scales quantized per block of
// 128 keys to a step of p_levels of the block's largest (of at most the 255
// keys around a key, wherever the blocks start), an output moves by at most
// p_levels e^(2 delta) |V|max sum_s max_{|j - s| < 128} w_j more. Returns the
// worst error / bound; *differs: whether the mode changed an output against
// kFloat32. With int8_grid, each query row holds integers in [-127, 127] (127
// in magnitude once) times 2^-4, which int8 quantization keeps (up to float32
// rounding), the scores spread so that the weights peak. With variants (not
// null), the calls take its options, mask and variants: soft-capping moves a
// score by no more than its shift, ALiBi and the mask add exact values, and a
// sink only adds to the denominator, so the same bound holds over the keys a
// row sees.
template <class ScoreShift>
double ProductsErrorOverBound(AttentionCompute compute, KvDtype dtype,
                              const BoundShape& shape,
                              const ScoreShift& score_shift, double p_round,
                              double p_levels, const char* label, bool* differs,
                              bool int8_grid = false,
                              const VariantCall* variants = nullptr) {
  const int64_t kv_len = shape.kv_len, n_tokens = shape.n_tokens;
  const int64_t n_heads = shape.layout.n_heads, d = shape.d;
  const int64_t n_kv = shape.layout.n_kv_heads, group = n_heads / n_kv;
  std::vector<float> k, v;
  RandomKv(shape, 711, &k, &v);
  const int64_t kv_width = n_kv * d, width = n_heads * d;
  const KvCache cache = CacheHolding(dtype, n_kv, d, kv_len, k, v);
  std::vector<double> kd, vd;
  CacheToDouble(cache, 0, &kd, &vd);
  std::vector<float> q(n_tokens * width), out(q.size()), out_f32(q.size());
  test::FillRandom(q.data(), q.size(), 713);
  if (int8_grid) {
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = std::ldexp(std::nearbyint(127 * q[i]), -4);
      if (i % d == 0) q[i] = std::copysign(127.0f / 16, q[i]);
    }
  }
  AttentionQuery query;
  query.q_pos0 = kv_len - n_tokens;
  query.q = MatrixView<const float>(q.data(), n_tokens, width);
  query.out = MatrixView<float>(out_f32.data(), n_tokens, width);
  AttentionOptions options = variants ? variants->options : AttentionOptions();
  const float* mask = nullptr;
  if (variants && !variants->mask.empty()) {
    mask = variants->mask.data();
    query.mask = MatrixView<const float>(mask, n_tokens, kv_len);
  }
  EXPECT_TRUE(Attention(cache, n_heads, &query, 1, options).ok());
  options.compute = compute;
  query.out = MatrixView<float>(out.data(), n_tokens, width);
  EXPECT_TRUE(Attention(cache, n_heads, &query, 1, options).ok());
  *differs = *differs || out != out_f32;
  const test::ref::Variants rv =
      variants ? variants->variants : test::ref::Variants();
  const double scale = variants ? variants->options.scale
                                : 1.0 / std::sqrt(static_cast<double>(d));
  const std::vector<double> qd =
      test::ref::ToDouble(q.data(), n_tokens, width, width);
  const std::vector<double> exact = test::ref::AttentionCore(
      qd.data(), width, n_tokens, kd.data(), kv_width, vd.data(), kv_width,
      kv_len, n_heads, n_kv, d, query.q_pos0, /*causal=*/true, mask, kv_len,
      static_cast<float>(scale), rv);
  double worst_ratio = 0.0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t seen = query.q_pos0 + t + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / group;
      const double* q_row = &qd[t * width + h * d];
      const int64_t pos = query.q_pos0 + t;
      const test::ref::VisibleSpan span = test::ref::VisibleKeys(rv, pos, seen);
      double delta = 0.0, v_abs = 0.0, s_abs = 0.0;
      // The row's scores as the reference takes them; -inf: not seen.
      std::vector<double> w(seen, -std::numeric_limits<double>::infinity());
      for (int64_t s = 0; s < seen; ++s) {
        const double added = mask ? mask[t * kv_len + s] : 0.0;
        if (!span.Contains(s) || added == -kInf) continue;
        const double* k_row = &kd[(s * n_kv + g) * d];
        const double* v_row = &vd[(s * n_kv + g) * d];
        double dot = 0.0, score = 0.0;
        for (int64_t p = 0; p < d; ++p) {
          dot += std::fabs(q_row[p] * k_row[p]);
          score += scale * q_row[p] * k_row[p];
          v_abs = std::max(v_abs, std::fabs(v_row[p]));
        }
        if (rv.softcap > 0) score = rv.softcap * std::tanh(score / rv.softcap);
        if (rv.alibi_slopes) score += rv.alibi_slopes[h] * (s - pos);
        w[s] = score + added;
        delta = std::max(delta, scale * score_shift(q_row, k_row));
        s_abs = std::max(s_abs, scale * dot);
      }
      // Weights quantized per block of 128 keys (wherever a block starts):
      // each moves by p_levels of the block's largest weight, at most that
      // of the 255 keys around it, times the V row's scale, whose levels
      // times it reach v_abs at most.
      double levels_term = 0.0;
      const double w_max = *std::max_element(w.begin(), w.end());
      if (p_levels > 0.0 && w_max > -std::numeric_limits<double>::infinity()) {
        double sum = rv.sink_logits ? std::exp(rv.sink_logits[h] - w_max) : 0.0;
        for (double& x : w) sum += x = std::exp(x - w_max);
        for (int64_t s = 0; s < seen; ++s) {
          double around = 0.0;
          for (int64_t j = std::max<int64_t>(0, s - 127);
               j < std::min(seen, s + 128); ++j) {
            around = std::max(around, w[j] / sum);
          }
          levels_term += around;
        }
        levels_term *= p_levels * std::exp(2 * delta) * v_abs;
      }
      const double f32_tol = Float32OutputTolerance(v_abs, s_abs, d, seen);
      const double bound = v_abs * (std::exp(2 * delta) * (1 + p_round) - 1) +
                           levels_term + f32_tol;
      for (int64_t p = 0; p < d; ++p) {
        const double err = std::fabs(out[t * width + h * d + p] -
                                     exact[t * width + h * d + p]);
        EXPECT_LE(err, bound)
            << label << ": heads " << n_heads << "/" << n_kv << ", token " << t
            << ", head " << h << ", col " << p;
        if (err > bound) return worst_ratio;
        worst_ratio = std::max(worst_ratio, err / bound);
      }
    }
  }
  return worst_ratio;
}

// ProductsErrorOverBound of AttentionCompute::kBFloat16 on a bf16 cache over
// shapes, the worst of them (stopping at a failure): rounding scale * q to
// bf16 moves each score by at most 2^-9 scale sum_p |q_p K_sp|, and P is
// rounded to bf16 (p_round 2^-9).
template <size_t kShapes>
double BF16ErrorOverBound(const BoundShape (&shapes)[kShapes],
                          const char* label, bool* differs) {
  double worst_ratio = 0.0;
  for (const BoundShape& shape : shapes) {
    const auto bf16_shift = [&](const double* q_row, const double* k_row) {
      double dot = 0.0;
      for (int64_t p = 0; p < shape.d; ++p) {
        dot += std::fabs(q_row[p] * k_row[p]);
      }
      return std::ldexp(dot, -9);
    };
    worst_ratio = std::max(
        worst_ratio, ProductsErrorOverBound(
                         AttentionCompute::kBFloat16, KvDtype::kBFloat16, shape,
                         bf16_shift, std::ldexp(1.0, -9), 0.0, label, differs));
    if (::testing::Test::HasFailure()) break;
  }
  return worst_ratio;
}

// AttentionCompute::kBFloat16 on a bf16 cache, with vdpbf16ps (where the CPU
// has it) and with the fallback, within BF16ErrorOverBound's bound. Shapes:
// GQA-2 decode (head_dim 80: a 16-element tail of pairs), GQA-4 split-KV
// decode, a 12-row group (narrow on AVX-512, wide elsewhere), MQA prefill
// (wide tiles: at head_dim 72 float32 products, AMX or not).
TEST_P(AttentionTest, BF16ProductsWithinBound) {
  const BoundShape shapes[] = {{{8, 4}, 80, 515, 1},
                               {{8, 2}, 128, 3001, 1},
                               {{12, 1}, 64, 700, 1},
                               {{8, 1}, 72, 300, 50}};
  for (const bool native : {true, false}) {
    const NativeBFloat16Scope scope(native ? NativeBFloat16::kWhereSupported
                                           : NativeBFloat16::kNever);
    const char* label = native ? "bf16 native" : "bf16 fallback";
    bool differs = false;
    const double worst_ratio = BF16ErrorOverBound(shapes, label, &differs);
    if (HasFailure()) return;
    std::printf("  %s products: worst error / bound %.3f\n", label,
                worst_ratio);
    // The mode changed the results (SCALAR, one lane, has no narrow tiles),
    // and they stay well inside the bound (the worst case adds every rounding
    // against the result: 0.013 when written).
    if (std::string(GetParam().name) != "SCALAR") {
      EXPECT_TRUE(differs);
      EXPECT_GT(worst_ratio, 0.005);
    }
  }
}

// AttentionCompute::kBFloat16 prefill on bf16 pairs: on AMX tiles (where
// AmxBFloat16Active: AVX3 and AVX3_DL on a CPU with AMX), by vdpbf16ps with
// AMX off (where NativeBFloat16Active: AVX3 and AVX3_DL on a CPU with
// AVX512_BF16, kWhereSupported) and with neither (float32 products in wide
// tiles), within the same bound as decode. Shapes: MHA over 300 keys (tiles
// of 32 rows, the last of 4), GQA-4 over 515 keys (key blocks of 3 keys past a
// multiple of 32, the last K rows through AMX's zero-padded copy; an odd
// count of keys in a block for vdpbf16ps), MQA of 64 heads at head_dim 32
// (over 32 rows per tile: float32 products), GQA-2 at head_dim 96 over 3001
// keys (chunked, merged), MHA at head_dim 256 (33 tokens: a tile of one row),
// MQA of 32 heads at head_dim 32 (one step of 32 per product). Each engine
// changes the results wherever it runs.
TEST_P(AttentionTest, BF16PrefillOnPairsWithinBound) {
  const BoundShape shapes[] = {{{8, 8}, 128, 300, 100}, {{8, 2}, 64, 515, 70},
                               {{64, 1}, 32, 200, 3},   {{4, 2}, 96, 3001, 40},
                               {{2, 2}, 256, 170, 33},  {{32, 1}, 32, 90, 2}};
  for (const BF16Engine& engine : kBF16Engines) {
    const BF16EngineScope scope(engine);
    bool differs = false;
    const double worst_ratio =
        BF16ErrorOverBound(shapes, engine.label, &differs);
    if (HasFailure()) return;
    std::printf("  bf16 prefill on %s: worst error / bound %.3f\n",
                engine.label, worst_ratio);
  }
  // The outputs of a tile of 32 rows on each engine against float32 products
  // (the last engine): different bits where the engine runs, the same
  // elsewhere.
  const BoundShape shape{{8, 8}, 128, 300, 32};
  std::vector<float> k, v;
  RandomKv(shape, 715, &k, &v);
  const KvCache cache =
      CacheHolding(KvDtype::kBFloat16, 8, shape.d, shape.kv_len, k, v);
  const int64_t width = 8 * shape.d;
  std::vector<float> q(shape.n_tokens * width);
  test::FillRandom(q.data(), q.size(), 716);
  AttentionOptions options;
  options.compute = AttentionCompute::kBFloat16;
  AttentionQuery query;
  query.q_pos0 = shape.kv_len - shape.n_tokens;
  query.q = MatrixView<const float>(q.data(), shape.n_tokens, width);
  std::vector<float> out[3];
  bool active[3] = {};
  for (size_t e = 0; e < 3; ++e) {
    const BF16EngineScope scope(kBF16Engines[e]);
    active[e] =
        kBF16Engines[e].amx ? AmxBFloat16Active() : NativeBFloat16Active();
    out[e].resize(q.size());
    query.out = MatrixView<float>(out[e].data(), shape.n_tokens, width);
    ASSERT_TRUE(Attention(cache, 8, &query, 1, options).ok());
  }
  EXPECT_EQ(out[0] != out[2], active[0]) << kBF16Engines[0].label;
  EXPECT_EQ(out[1] != out[2], active[1]) << kBF16Engines[1].label;
}

// AttentionCompute::kInt8's weights times V's scales, quantized per block of
// 128 keys: each moves by at most 2^-14 of the block's largest (decode.h's
// AccumulateRowsInt8).
constexpr double kInt8WeightStep = 1.0 / (1 << 14);

// AttentionCompute::kInt8 on an int8 cache: quantizing scale * q to int8
// (the cache's rule: level step max_p |scale q_p| / 127, half a step at most,
// plus 2^-22 for the float32 roundings) moves each score by at most
// max_p |scale q_p| (1 / 254 + 2^-22) sum_p |K_sp|, and the weights move as
// kInt8WeightStep says. Shapes:
// MHA split-KV decode (one row per KV head), GQA-2 decode (head_dim 80: a
// 16-byte last chunk), GQA-4 split-KV decode, a 12-row group, MQA prefill
// (wide tiles: float32 products). vpdpbusd on AVX3_DL, the float32 fallback
// elsewhere (decode_test checks that both give the exact scores).
TEST_P(AttentionTest, Int8ProductsWithinBound) {
  const BoundShape shapes[] = {{{8, 8}, 128, 3001, 1},
                               {{8, 4}, 80, 515, 1},
                               {{8, 2}, 128, 3001, 1},
                               {{12, 1}, 64, 700, 1},
                               {{8, 1}, 72, 300, 50}};
  double worst_ratio = 0.0;
  bool differs = false;
  for (const BoundShape& shape : shapes) {
    const auto int8_shift = [&](const double* q_row, const double* k_row) {
      double q_max = 0.0, k_sum = 0.0;
      for (int64_t p = 0; p < shape.d; ++p) {
        q_max = std::max(q_max, std::fabs(q_row[p]));
        k_sum += std::fabs(k_row[p]);
      }
      return q_max * (1.0 / 254 + std::ldexp(1.0, -22)) * k_sum;
    };
    worst_ratio = std::max(
        worst_ratio, ProductsErrorOverBound(
                         AttentionCompute::kInt8, KvDtype::kInt8, shape,
                         int8_shift, 0.0, kInt8WeightStep, "int8", &differs));
    if (HasFailure()) return;
  }
  std::printf("  int8 products: worst error / bound %.3f\n", worst_ratio);
  // The mode changed the results (not on SCALAR: no narrow tiles), within a
  // bound that adds every rounding against the result (0.003 when written).
  if (std::string(GetParam().name) != "SCALAR") {
    EXPECT_TRUE(differs);
    EXPECT_GT(worst_ratio, 0.001);
  }
  // A q that int8 keeps: the weights' term and float32's tolerance alone,
  // which a q scale off by 2^-6 exceeds (one 2^-10 off hides within the
  // weights' term, as it does in the bound above).
  const auto no_shift = [](const double*, const double*) { return 0.0; };
  for (const BoundShape& shape : shapes) {
    ProductsErrorOverBound(AttentionCompute::kInt8, KvDtype::kInt8, shape,
                           no_shift, 0.0, kInt8WeightStep,
                           "int8, q on the int8 grid", &differs,
                           /*int8_grid=*/true);
    if (HasFailure()) return;
  }
}

// Both compute modes under every variant set (the variants' rules act on the
// scores after q's int8 scale, and see the keys the mode sums): MHA and GQA-2
// split-KV decode (narrow on every target but SCALAR), 3 tokens of GQA-4 at
// once (12 rows: narrow on AVX-512), and a prefill of 40 tokens of GQA-4
// (wide tiles: kBFloat16's on AMX, or by vdpbf16ps, where they run), within
// the modes' bounds over the variants' float64 attention.
TEST_P(AttentionTest, ComputeModesWithVariants) {
  const BoundShape shapes[] = {{{8, 8}, 64, 700, 1},
                               {{8, 4}, 128, 1100, 1},
                               {{8, 2}, 64, 300, 3},
                               {{8, 2}, 64, 300, 40}};
  struct Mode {
    AttentionCompute compute;
    KvDtype dtype;
    double p_round, p_levels;
    const BF16Engine* engine;  // kBFloat16's (null: the defaults)
  };
  const Mode modes[] = {
      {AttentionCompute::kBFloat16, KvDtype::kBFloat16, std::ldexp(1.0, -9),
       0.0, &kBF16Engines[0]},
      {AttentionCompute::kBFloat16, KvDtype::kBFloat16, std::ldexp(1.0, -9),
       0.0, &kBF16Engines[1]},
      {AttentionCompute::kInt8, KvDtype::kInt8, 0.0, kInt8WeightStep, nullptr}};
  uint64_t seed = 9000;
  for (const Mode& mode : modes) {
    std::optional<BF16EngineScope> scope;
    if (mode.engine != nullptr) scope.emplace(*mode.engine);
    const std::string name =
        DtypeName(mode.dtype) + " products" +
        (mode.engine != nullptr ? std::string(" on ") + mode.engine->label
                                : std::string());
    double worst_ratio = 0.0;
    bool differs = false;
    for (const BoundShape& shape : shapes) {
      const auto shift = [&](const double* q_row, const double* k_row) {
        double dot = 0.0, q_max = 0.0, k_sum = 0.0;
        for (int64_t p = 0; p < shape.d; ++p) {
          dot += std::fabs(q_row[p] * k_row[p]);
          q_max = std::max(q_max, std::fabs(q_row[p]));
          k_sum += std::fabs(k_row[p]);
        }
        return mode.compute == AttentionCompute::kInt8
                   ? q_max * (1.0 / 254 + std::ldexp(1.0, -22)) * k_sum
                   : std::ldexp(dot, -9);
      };
      for (const VariantSet& set : VariantSets()) {
        const VariantCall call =
            MakeVariantCall(set, shape.layout.n_heads, shape.n_tokens,
                            shape.kv_len, /*causal=*/true, seed++);
        const std::string label = name + ", " + set.name;
        worst_ratio = std::max(
            worst_ratio,
            ProductsErrorOverBound(mode.compute, mode.dtype, shape, shift,
                                   mode.p_round, mode.p_levels, label.c_str(),
                                   &differs, /*int8_grid=*/false, &call));
        if (HasFailure()) return;
      }
    }
    std::printf("  %s with variants: worst error / bound %.3f\n", name.c_str(),
                worst_ratio);
    if (std::string(GetParam().name) != "SCALAR") {
      EXPECT_TRUE(differs);
    }
  }
}

// ---------------------------------------------------------------------------
// Variants: sliding window, soft-capping, ALiBi, sink logits.

// Every set on MHA, GQA and MQA: decode (narrow tiles; chunked past 512 keys,
// where the sinks join at the merge), prefill (wide tiles) and a window far
// from the cache's start; both masks; fused and materialised paths.
TEST_P(AttentionTest, VariantsMatchReference) {
  struct Shape {
    int64_t n_tokens, kv_len;
  };
  const Shape shapes[] = {{1, 1},    {1, 130},  {1, 700},
                          {1, 3001}, {40, 150}, {3, 2000}};
  uint64_t seed = 4000;
  for (const KvDtype dtype : {KvDtype::kFloat32, KvDtype::kInt8}) {
    for (const Layout& layout : {Layout{8, 8}, Layout{8, 2}, Layout{8, 1}}) {
      for (const Shape& shape : shapes) {
        for (const bool causal : {true, false}) {
          if (!causal && shape.kv_len > 700) continue;
          const int64_t d = 64, n = shape.n_tokens, kv_len = shape.kv_len;
          KvCache cache = MakeCache(layout.n_kv_heads, d, {kv_len}, seed,
                                    /*extra_capacity=*/0, dtype);
          const int64_t width = layout.n_heads * d;
          std::vector<float> q(n * width);
          test::FillRandom(q.data(), q.size(), seed + 1);
          for (const VariantSet& set : VariantSets()) {
            if (dtype != KvDtype::kFloat32 && set.name != "all") continue;
            const std::string what =
                DtypeName(dtype) + ", " + set.name + ", heads " +
                std::to_string(layout.n_heads) + "/" +
                std::to_string(layout.n_kv_heads) + ", n_tokens " +
                std::to_string(n) + ", kv_len " + std::to_string(kv_len) +
                (causal ? ", causal" : ", no mask");
            VariantCall call = MakeVariantCall(set, layout.n_heads, n, kv_len,
                                               causal, seed + 2);
            std::vector<float> out(q.size(), -7.0f);
            AttentionQuery query;
            query.q_pos0 = kv_len - n;
            query.q = MatrixView<const float>(q.data(), n, width);
            query.out = MatrixView<float>(out.data(), n, width);
            if (!call.mask.empty()) {
              query.mask = MatrixView<const float>(call.mask.data(), n, kv_len);
            }
            Status status =
                Attention(cache, layout.n_heads, &query, 1, call.options);
            ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
            ExpectMatchesReference(cache, layout.n_heads, query, causal,
                                   call.options.scale, what, nullptr,
                                   call.variants);
            if (HasFatalFailure()) return;
            // The materialised path: the same outputs, and weights that are 0
            // outside the window and sum to 1 less the sink's share.
            if (kv_len > 700) continue;
            std::vector<float> mat(q.size(), -7.0f);
            std::vector<float> weights(layout.n_heads * n * kv_len, -7.0f);
            query.out = MatrixView<float>(mat.data(), n, width);
            status = AttentionWithWeights(
                cache, layout.n_heads, query,
                MatrixView<float>(weights.data(), layout.n_heads * n, kv_len),
                call.options);
            ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
            ExpectMatchesReference(cache, layout.n_heads, query, causal,
                                   call.options.scale, what + ", materialised",
                                   nullptr, call.variants);
            if (HasFatalFailure()) return;
            for (int64_t row = 0; row < layout.n_heads * n; ++row) {
              const int64_t pos = query.q_pos0 + row % n;
              double sum = 0.0;
              for (int64_t s = 0; s < kv_len; ++s) {
                const float w = weights[row * kv_len + s];
                if (set.window > 0 && s <= pos - set.window &&
                    s >= set.n_sink_tokens) {
                  ASSERT_EQ(w, 0.0f) << what << ": key " << s;
                }
                sum += w;
              }
              ASSERT_LE(sum, 1.0 + 1e-5) << what;
              if (!set.sinks && !set.additive_mask) {
                ASSERT_NEAR(sum, 1.0, 1e-5) << what;
              }
            }
          }
          seed += 10;
        }
      }
    }
  }
}

// A ring cache (kv_cache.h's Ring mode) across several wrap-arounds: after
// each append, the new tokens' attention on the ring matches the float64
// reference over a plain cache that holds every position (appended alike, so
// rounded alike), with the window and the sink tokens: decode (narrow tiles;
// chunked within a segment for the long window), prefill chunks of up to
// capacity - n_sink_tokens - window + 1 tokens (wide tiles), a ring of
// exactly window + n_sink_tokens rows.
TEST_P(AttentionTest, RingCacheMatchesReference) {
  struct RingCase {
    Layout layout;
    int64_t head_dim, window, n_sink_tokens, slack;
    KvDtype dtype;
    bool variants;        // softcap, ALiBi and sink logits too
    int64_t check_every;  // attend after every check_every-th append
  };
  const RingCase cases[] = {
      {{4, 4}, 64, 64, 0, 0, KvDtype::kFloat32, false, 1},
      {{8, 2}, 64, 100, 4, 37, KvDtype::kFloat32, true, 1},
      {{4, 1}, 40, 50, 3, 20, KvDtype::kInt8, false, 1},
      {{8, 8}, 16, 33, 1, 5, KvDtype::kBFloat16, true, 1},
      {{8, 2}, 64, 1100, 4, 3, KvDtype::kFloat16, false, 97},
  };
  uint64_t seed = 7100;
  for (const RingCase& c : cases) {
    const int64_t d = c.head_dim, n_kv = c.layout.n_kv_heads;
    const int64_t n_heads = c.layout.n_heads;
    const int64_t capacity = c.window + c.n_sink_tokens + c.slack;
    const int64_t total = 3 * capacity + 17;
    KvCacheConfig config{1, n_kv, d, capacity, c.dtype, true, c.n_sink_tokens};
    KvCache ring = test::MakeCache(config);
    KvCache plain = test::MakeCache({1, n_kv, d, total, c.dtype});
    ASSERT_EQ(ring.bytes() * static_cast<size_t>(total),
              plain.bytes() * static_cast<size_t>(capacity));
    VariantCall call =
        MakeVariantCall(c.variants ? VariantSet{"", c.window, 2.0f, true, true}
                                   : VariantSet{"", c.window},
                        n_heads, 1, 1, true, seed);
    call.options.n_sink_tokens = call.variants.n_sink_tokens = c.n_sink_tokens;
    int64_t length = 0;
    for (int64_t step = 0; length < total; ++step) {
      // 1, the most a call can attend, 2, ...
      const int64_t most = c.slack + 1;
      const int64_t n = std::min(total - length,
                                 step % 3 == 0   ? 1
                                 : step % 3 == 1 ? most
                                                 : std::min<int64_t>(2, most));
      std::vector<float> k(n * n_kv * d), v(k.size()), q(n * n_heads * d);
      test::FillRandom(k.data(), k.size(), seed + 1);
      test::FillRandom(v.data(), v.size(), seed + 2);
      test::FillRandom(q.data(), q.size(), seed + 3);
      seed += 3;
      const MatrixView<const float> k_view(k.data(), n, n_kv * d);
      const MatrixView<const float> v_view(v.data(), n, n_kv * d);
      ASSERT_TRUE(ring.Append(0, k_view, v_view).ok());
      ASSERT_TRUE(plain.Append(0, k_view, v_view).ok());
      length += n;
      ASSERT_EQ(ring.length(0), length);
      if (step % c.check_every != 0 && length < total) continue;
      std::vector<float> out(q.size(), -7.0f);
      AttentionQuery query;
      query.q_pos0 = length - n;
      query.q = MatrixView<const float>(q.data(), n, n_heads * d);
      query.out = MatrixView<float>(out.data(), n, n_heads * d);
      const Status status = Attention(ring, n_heads, &query, 1, call.options);
      const std::string what =
          DtypeName(c.dtype) + ", heads " + std::to_string(n_heads) + "/" +
          std::to_string(n_kv) + ", window " + std::to_string(c.window) +
          " + " + std::to_string(c.n_sink_tokens) + " sink tokens, ring of " +
          std::to_string(capacity) + ", positions " +
          std::to_string(query.q_pos0) + " .. " + std::to_string(length - 1);
      ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
      ExpectMatchesReference(plain, n_heads, query, true, call.options.scale,
                             what, nullptr, call.variants);
      if (HasFatalFailure()) return;
    }
  }
}

// A ring cache's errors: a window it cannot hold, other sink tokens, a mask,
// a first query whose window the ring has overwritten, the materialised path.
TEST(AttentionRing, Errors) {
  const int64_t d = 16, window = 8, sinks = 2, capacity = 12;
  KvCache ring =
      test::MakeCache({1, 1, d, capacity, KvDtype::kFloat32, true, sinks});
  std::vector<float> k(30 * d), q(30 * d), out(30 * d, -7.0f);
  test::FillRandom(k.data(), k.size(), 1);
  test::FillRandom(q.data(), q.size(), 2);
  ASSERT_TRUE(ring.Append(0, MatrixView<const float>(k.data(), 30, d),
                          MatrixView<const float>(k.data(), 30, d))
                  .ok());
  AttentionOptions options;
  options.window = window;
  options.n_sink_tokens = sinks;
  AttentionQuery query;
  query.q_pos0 = 29;
  query.q = MatrixView<const float>(q.data(), 1, d);
  query.out = MatrixView<float>(out.data(), 1, d);
  ASSERT_TRUE(Attention(ring, 1, &query, 1, options).ok());
  const std::vector<float> expect = out;
  struct Bad {
    std::string message;
    StatusCode code;
    std::function<void(AttentionOptions&, AttentionQuery&)> change;
  };
  std::vector<float> mask(30, 0.0f);
  const Bad bads[] = {
      {"options.window (0) must be in [1, capacity - n_sink_tokens = 10] "
       "with a ring cache",
       StatusCode::kInvalidArgument,
       [](AttentionOptions& o, AttentionQuery&) {
         o.window = 0;
         o.n_sink_tokens = 0;
       }},
      {"options.window (11) must be in [1, capacity - n_sink_tokens = 10]",
       StatusCode::kInvalidArgument,
       [](AttentionOptions& o, AttentionQuery&) { o.window = 11; }},
      {"options.n_sink_tokens (1) must equal the ring cache's n_sink_tokens "
       "(2)",
       StatusCode::kInvalidArgument,
       [](AttentionOptions& o, AttentionQuery&) { o.n_sink_tokens = 1; }},
      {"queries[0].mask must be null with a ring cache",
       StatusCode::kInvalidArgument,
       [&](AttentionOptions&, AttentionQuery& q) {
         q.mask = MatrixView<const float>(mask.data(), 1, 30);
       }},
      // Positions 20 .. 29 are held; the query at 26 needs 19 on.
      {"queries[0]: the query at position 26 sees keys from position 19 on, "
       "but the ring of sequence 0 holds them from 20 on",
       StatusCode::kOutOfRange,
       [](AttentionOptions&, AttentionQuery& q) {
         q.q_pos0 = 26;
         q.q.rows = q.out.rows = 4;
       }},
  };
  for (const Bad& bad : bads) {
    AttentionOptions o = options;
    AttentionQuery qy = query;
    bad.change(o, qy);
    EXPECT_TRUE(test::IsError(Attention(ring, 1, &qy, 1, o), bad.code,
                              {bad.message}, "Attention: "))
        << bad.message;
  }
  std::vector<float> weights(30, -7.0f);
  EXPECT_TRUE(test::IsError(
      AttentionWithWeights(ring, 1, query,
                           MatrixView<float>(weights.data(), 1, 30), options),
      StatusCode::kInvalidArgument, {"cache is a ring cache"},
      "AttentionWithWeights: "));
  EXPECT_EQ(out, expect);  // nothing written
  // The query at 27 needs 20 on: fine.
  query.q_pos0 = 27;
  query.q.rows = query.out.rows = 3;
  EXPECT_TRUE(Attention(ring, 1, &query, 1, options).ok());
}

// With every variant on: 1, 2 and 7 threads give the same bits (decode,
// chunked, and prefill).
TEST_P(AttentionTest, VariantsSameBitsForAnyThreadCount) {
  for (const Case& c :
       {Case{{8, 2}, 64, 5000, 1, true}, Case{{8, 4}, 64, 300, 300, true}}) {
    KvCache cache = MakeCache(c.layout.n_kv_heads, c.head_dim, {c.kv_len}, 85);
    std::vector<float> q(c.n_tokens * c.layout.n_heads * c.head_dim);
    test::FillRandom(q.data(), q.size(), 86);
    VariantCall call = MakeVariantCall(VariantSets().back(), c.layout.n_heads,
                                       c.n_tokens, c.kv_len, true, 87);
    call.options.window = 1000;
    ExpectSameBitsOnAnyThreadCount(cache, c, q, call.options, call.mask.data());
    if (HasFatalFailure()) return;
  }
}

// The ALiBi paper's slopes: 2^-1 .. 2^-8 for 8 heads; for 12, those of 8 then
// the odd slopes of 16.
TEST(AttentionAlibi, PaperSlopes) {
  float slopes[12];
  ASSERT_TRUE(AlibiSlopes(8, slopes).ok());
  for (int h = 0; h < 8; ++h) EXPECT_EQ(slopes[h], std::exp2(-(h + 1.0f)));
  ASSERT_TRUE(AlibiSlopes(12, slopes).ok());
  for (int h = 0; h < 8; ++h) EXPECT_EQ(slopes[h], std::exp2(-(h + 1.0f)));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(slopes[8 + i], std::exp2(-(2 * i + 1) * 0.5f)) << i;
  }
  EXPECT_TRUE(test::IsError(AlibiSlopes(0, slopes),
                            StatusCode::kInvalidArgument, {"n_heads"},
                            "AlibiSlopes: "));
  EXPECT_TRUE(test::IsError(AlibiSlopes(4, nullptr),
                            StatusCode::kInvalidArgument, {"slopes is null"},
                            "AlibiSlopes: "));
}

HEADWAY_INSTANTIATE_TARGET_TEST(AttentionTest);

// The decode step shown in README.md, as written there.
TEST(AttentionReadme, DecodeStep) {
  std::vector<float> k(8 * 128), v(8 * 128), q(32 * 128), out(32 * 128);
  test::FillRandom(k.data(), k.size(), 1);
  test::FillRandom(v.data(), v.size(), 2);
  test::FillRandom(q.data(), q.size(), 3);
  const int64_t seq = 2;
  headway::KvCache cache;
  headway::Status s = headway::KvCache::Create(
      {/*n_sequences=*/4, /*n_kv_heads=*/8, /*head_dim=*/128,
       /*capacity=*/8192},
      &cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = cache.Append(seq, headway::MatrixView<const float>(k.data(), 1, 8 * 128),
                   headway::MatrixView<const float>(v.data(), 1, 8 * 128));
  ASSERT_TRUE(s.ok()) << s.ToString();
  headway::AttentionQuery query;
  query.seq = seq;
  query.q_pos0 = cache.length(seq) - 1;
  query.q = headway::MatrixView<const float>(q.data(), 1, 32 * 128);
  query.out = headway::MatrixView<float>(out.data(), 1, 32 * 128);
  s = headway::Attention(cache, /*n_heads=*/32, &query, /*n_queries=*/1);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // One cached token: every head's output is that token's value row of its KV
  // head.
  for (int64_t h = 0; h < 32; ++h) {
    for (int64_t p = 0; p < 128; ++p) {
      ASSERT_EQ(out[h * 128 + p], v[(h / 4) * 128 + p]);
    }
  }
}

// Bad arguments: a clear error naming the argument, and nothing written.
TEST(AttentionErrors, RejectBadArguments) {
  const int64_t d = 16, n_heads = 4, kv_len = 10, n_tokens = 3;
  KvCache cache = MakeCache(2, d, {kv_len, 4}, 5);
  const int64_t width = n_heads * d;
  std::vector<float> q(n_tokens * width, 0.5f), out(n_tokens * width, -7.0f),
      mask(n_tokens * kv_len, 0.0f);
  const std::vector<float> out_before = out;
  AttentionQuery good;
  good.q_pos0 = kv_len - n_tokens;
  good.q = MatrixView<const float>(q.data(), n_tokens, width);
  good.out = MatrixView<float>(out.data(), n_tokens, width);

  struct Bad {
    std::string expect;
    StatusCode code;
    AttentionQuery query;
    int64_t n_heads = 4;
    AttentionOptions options = {};
  };
  std::vector<Bad> cases;
  auto add = [&](std::string expect, StatusCode code, auto edit) {
    Bad bad{std::move(expect), code, good};
    edit(bad);
    cases.push_back(bad);
  };
  add("n_heads must be >= 1 (got 0)", StatusCode::kInvalidArgument,
      [](Bad& b) { b.n_heads = 0; });
  add("n_heads (3) is not a multiple of the cache's n_kv_heads (2)",
      StatusCode::kInvalidArgument, [](Bad& b) { b.n_heads = 3; });
  add("queries[0].seq (2) is out of range [0, 2)", StatusCode::kInvalidArgument,
      [](Bad& b) { b.query.seq = 2; });
  add("queries[0].seq (-1) is out of range", StatusCode::kInvalidArgument,
      [](Bad& b) { b.query.seq = -1; });
  add("queries[0].q.data is null", StatusCode::kInvalidArgument,
      [](Bad& b) { b.query.q.data = nullptr; });
  add("queries[0].out.data is null", StatusCode::kInvalidArgument,
      [](Bad& b) { b.query.out.data = nullptr; });
  add("queries[0].q.cols (63) != n_heads * head_dim (4 * 16)",
      StatusCode::kInvalidArgument, [&](Bad& b) {
        b.query.q.cols = 63;
        b.query.out.cols = 63;
      });
  add("queries[0].out is [2, 64] but queries[0].q is [3, 64]",
      StatusCode::kInvalidArgument, [](Bad& b) { b.query.out.rows = 2; });
  add("queries[0].q_pos0 must be >= 0 (got -1)", StatusCode::kInvalidArgument,
      [](Bad& b) { b.query.q_pos0 = -1; });
  add("q_pos0 + n_tokens (8 + 3) exceeds the 10 cached rows of sequence 0",
      StatusCode::kOutOfRange, [](Bad& b) { b.query.q_pos0 = 8; });
  add("q_pos0 + n_tokens (2 + 3) exceeds the 4 cached rows of sequence 1",
      StatusCode::kOutOfRange, [](Bad& b) {
        b.query.seq = 1;
        b.query.q_pos0 = 2;
      });
  add("queries[0].mask is [3, 9] but must be [n_tokens, length] = [3, 10]",
      StatusCode::kInvalidArgument, [&](Bad& b) {
        b.query.mask =
            MatrixView<const float>(mask.data(), n_tokens, kv_len - 1);
      });
  add("queries[0].out overlaps queries[0].q", StatusCode::kInvalidArgument,
      [&](Bad& b) {
        b.query.out = MatrixView<float>(q.data(), n_tokens, width);
      });
  add("options.scale must be finite and >= 0", StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.scale = -1.0f; });
  add("options.scale must be finite and >= 0", StatusCode::kInvalidArgument,
      [](Bad& b) {
        b.options.scale = std::numeric_limits<float>::quiet_NaN();
      });
  add("options.mask is not an AttentionMask (got 7)",
      StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.mask = static_cast<AttentionMask>(7); });
  add("options.window must be >= 0 (got -1)", StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.window = -1; });
  add("options.n_sink_tokens must be >= 0 (got -2)",
      StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.n_sink_tokens = -2; });
  add("options.n_sink_tokens (4) must be <= options.window (0): sink tokens "
      "stay visible beside a window",
      StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.n_sink_tokens = 4; });
  add("options.n_sink_tokens (4) must be <= options.window (3)",
      StatusCode::kInvalidArgument, [](Bad& b) {
        b.options.window = 3;
        b.options.n_sink_tokens = 4;
      });
  add("options.compute is not an AttentionCompute (got 7)",
      StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.compute = static_cast<AttentionCompute>(7); });
  add("options.compute kBFloat16 needs a bfloat16 cache (got float32)",
      StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.compute = AttentionCompute::kBFloat16; });
  add("options.compute kInt8 needs an int8 cache (got float32)",
      StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.compute = AttentionCompute::kInt8; });
  add("options.softcap must be finite and >= 0", StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.softcap = -1.0f; });
  add("options.softcap must be finite and >= 0", StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.softcap = kInf; });
  static const float kBadSlopes[4] = {0.5f, 0.25f, kInf, 0.0625f};
  static const float kBadSinks[4] = {0.0f, 1.0f, 2.0f, NAN};
  add("options.alibi_slopes[2] is not finite", StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.alibi_slopes = kBadSlopes; });
  add("options.sink_logits[3] is not finite", StatusCode::kInvalidArgument,
      [](Bad& b) { b.options.sink_logits = kBadSinks; });
  for (const Bad& bad : cases) {
    const Status status =
        Attention(cache, bad.n_heads, &bad.query, 1, bad.options);
    EXPECT_TRUE(test::IsError(status, bad.code, {bad.expect}, "Attention: "));
    EXPECT_EQ(out, out_before)
        << "out was written on error: " << status.ToString();
  }
  // Null or empty query lists, an empty cache.
  EXPECT_EQ(Attention(cache, n_heads, nullptr, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Attention(cache, n_heads, &good, 0).code(),
            StatusCode::kInvalidArgument);
  const Status empty = Attention(KvCache(), n_heads, &good, 1);
  EXPECT_NE(empty.message().find("cache is empty"), std::string::npos)
      << empty.message();
  // Two queries writing the same out.
  AttentionQuery twice[2] = {good, good};
  const Status overlap = Attention(cache, n_heads, twice, 2);
  EXPECT_NE(overlap.message().find("queries[1].out overlaps queries[0].out"),
            std::string::npos)
      << overlap.message();
  EXPECT_EQ(out, out_before);
  // The materialised path checks its weights.
  std::vector<float> weights(n_heads * n_tokens * kv_len);
  const Status bad_weights = AttentionWithWeights(
      cache, n_heads, good,
      MatrixView<float>(weights.data(), n_heads * n_tokens, kv_len - 1));
  EXPECT_NE(bad_weights.message().find("weights is [12, 9] but must be"),
            std::string::npos)
      << bad_weights.message();
  EXPECT_EQ(out, out_before);
}

// Sizes near and past INT64_MAX: rejected with a status naming the argument,
// without signed overflow (the sanitizer build traps on one).
TEST(AttentionErrors, HugeSizesAreRejectedWithoutOverflow) {
  const int64_t d = 16, n_tokens = 2, kv_len = 4;
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  KvCache cache = MakeCache(2, d, {kv_len}, 11);
  std::vector<float> q(n_tokens * 4 * d, 0.5f), out(n_tokens * 4 * d, -7.0f),
      weights(64, -7.0f);
  const std::vector<float> out_before = out, weights_before = weights;
  AttentionQuery good;
  good.q_pos0 = kv_len - n_tokens;
  good.q = MatrixView<const float>(q.data(), n_tokens, 4 * d);
  good.out = MatrixView<float>(out.data(), n_tokens, 4 * d);
  struct Bad {
    int64_t n_heads;
    AttentionQuery query;
    StatusCode code;
    std::string expect;
  };
  std::vector<Bad> cases;
  auto add = [&](int64_t n_heads, StatusCode code, std::string expect,
                 auto edit) {
    Bad bad{n_heads, good, code, std::move(expect)};
    edit(bad.query);
    cases.push_back(bad);
  };
  auto same = [](AttentionQuery&) {};
  // n_heads * head_dim overflows (the multiples of n_kv_heads = 2 here), by
  // far and just barely (2^59 * 16 = 2^63), then just fits.
  for (const int64_t n_heads : {int64_t{1} << 62, kMax - 1, int64_t{1} << 59}) {
    add(n_heads, StatusCode::kInvalidArgument,
        "n_heads * head_dim (" + std::to_string(n_heads) + " * 16) overflows",
        same);
  }
  add((int64_t{1} << 59) - 2, StatusCode::kInvalidArgument,
      "q.cols (64) != n_heads * head_dim (576460752303423486 * 16)", same);
  // Views whose byte span overflows.
  add(4, StatusCode::kResourceExhausted, "q: rows (" + std::to_string(kMax),
      [&](AttentionQuery& b) { b.q.rows = b.out.rows = kMax; });
  add(4, StatusCode::kResourceExhausted,
      "q: rows (2) x stride (" + std::to_string(kMax / 2),
      [&](AttentionQuery& b) { b.q.stride = kMax / 2; });
  add(4, StatusCode::kResourceExhausted, "mask: rows", [&](AttentionQuery& b) {
    b.mask = MatrixView<const float>(q.data(), n_tokens, kv_len, kMax);
  });
  // Positions and lengths: q_pos0 + n_tokens would overflow.
  add(4, StatusCode::kOutOfRange, "exceeds the 4 cached rows",
      [&](AttentionQuery& b) { b.q_pos0 = kMax; });
  add(4, StatusCode::kOutOfRange, "exceeds the 4 cached rows",
      [&](AttentionQuery& b) { b.q_pos0 = kMax - n_tokens + 1; });
  for (const Bad& bad : cases) {
    const Status status = Attention(cache, bad.n_heads, &bad.query, 1);
    EXPECT_TRUE(test::IsError(status, bad.code, {bad.expect}, "Attention: "));
    const Status with_weights = AttentionWithWeights(
        cache, bad.n_heads, bad.query,
        MatrixView<float>(weights.data(), 4 * n_tokens, kv_len));
    EXPECT_TRUE(test::IsError(with_weights, bad.code, {bad.expect}));
    EXPECT_EQ(out, out_before) << status.ToString();
    EXPECT_EQ(weights, weights_before) << with_weights.ToString();
  }
  // The weights' shape: n_heads * n_tokens rows, huge views.
  const std::pair<MatrixView<float>, StatusCode> bad_weights[] = {
      {MatrixView<float>(weights.data(), kMax, kv_len),
       StatusCode::kResourceExhausted},
      {MatrixView<float>(weights.data(), 1, kMax),
       StatusCode::kResourceExhausted},
      {MatrixView<float>(weights.data(), 4 * n_tokens, kv_len, kMax / 4),
       StatusCode::kResourceExhausted},
  };
  for (const auto& [view, code] : bad_weights) {
    const Status status = AttentionWithWeights(cache, 4, good, view);
    EXPECT_TRUE(test::IsError(status, code, {"weights"}));
    EXPECT_EQ(out, out_before) << status.ToString();
  }
}

// Attention reads only the sequences of its queries: one thread appends to
// sequence 0 while another attends over sequence 1 (kv_cache.h allows it). The
// second thread's outputs equal the single-threaded result, bit for bit; under
// ThreadSanitizer this is the race check.
TEST(AttentionThreads, ReadsOnlyTheSequencesOfItsQueries) {
  const int64_t d = 32, n_heads = 4, n_kv_heads = 2, n_steps = 64;
  KvCache cache = MakeCache(n_kv_heads, d, {0, 20}, 21, n_steps);
  const int64_t width = n_heads * d, kv_width = n_kv_heads * d;
  const std::vector<float> q = test::RandomVector(width, 22);
  const std::vector<float> kv = test::RandomVector(n_steps * kv_width, 23);
  AttentionQuery query;
  query.seq = 1;
  query.q_pos0 = 19;
  query.q = MatrixView<const float>(q.data(), 1, width);
  std::vector<float> want(width);
  query.out = MatrixView<float>(want.data(), 1, width);
  ASSERT_TRUE(Attention(cache, n_heads, &query, 1).ok());
  std::vector<std::vector<float>> got(n_steps, std::vector<float>(width));
  Status append_status, attention_status;
  std::thread appender([&] {
    for (int64_t t = 0; t < n_steps && append_status.ok(); ++t) {
      const MatrixView<const float> row(kv.data() + t * kv_width, 1, kv_width);
      append_status = cache.Append(0, row, row);
    }
  });
  std::thread reader([&] {
    for (int64_t t = 0; t < n_steps && attention_status.ok(); ++t) {
      AttentionQuery mine = query;
      mine.out = MatrixView<float>(got[t].data(), 1, width);
      attention_status = Attention(cache, n_heads, &mine, 1);
    }
  });
  appender.join();
  reader.join();
  ASSERT_TRUE(append_status.ok()) << append_status.ToString();
  ASSERT_TRUE(attention_status.ok()) << attention_status.ToString();
  EXPECT_EQ(cache.length(0), n_steps);
  for (int64_t t = 0; t < n_steps; ++t) {
    EXPECT_EQ(0, std::memcmp(got[t].data(), want.data(), width * sizeof(float)))
        << "call " << t;
  }
}

}  // namespace
}  // namespace headway

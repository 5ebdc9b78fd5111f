// The non-kernel public API: Status, version, instruction-set and thread
// control. This test links the shared library, so it also proves that the
// exported symbols are enough to use it.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "headway/headway.h"
#include "headway/headway.hpp"
#include "test/support/status_matchers.h"

namespace headway {
namespace {

TEST(Status, OkAndErrors) {
  const Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  const Status bad = Status::InvalidArgument("Softmax: x.data is null");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.ToString(), "INVALID_ARGUMENT: Softmax: x.data is null");
  EXPECT_STREQ(StatusCodeName(StatusCode::kResourceExhausted),
               "RESOURCE_EXHAUSTED");
}

TEST(Version, MatchesMacros) {
  EXPECT_EQ(std::string(HEADWAY_VERSION_STRING),
            std::to_string(HEADWAY_VERSION_MAJOR) + "." +
                std::to_string(HEADWAY_VERSION_MINOR) + "." +
                std::to_string(HEADWAY_VERSION_PATCH));
}

std::vector<std::string> Names(const std::vector<Target>& targets) {
  std::vector<std::string> names;
  for (const Target& t : targets) names.push_back(t.name);
  return names;
}

TEST(Targets, CompiledAndSupported) {
  const std::vector<Target> compiled = CompiledTargets();
  const std::vector<Target> supported = SupportedTargets();
  ASSERT_FALSE(supported.empty());
  // The fallback is always compiled and always runs: SCALAR, or EMU128 where
  // Highway 1.0.3 enables it (clang; g++ 12.3 and later).
  const std::string fallback = Names(compiled).back();
  EXPECT_TRUE(fallback == "SCALAR" || fallback == "EMU128") << fallback;
  EXPECT_EQ(Names(supported).back(), fallback);
#if defined(__x86_64__)
  EXPECT_EQ(Names(compiled),
            (std::vector<std::string>{"AVX3_DL", "AVX3", "AVX2", "SSE4",
                                      "SSSE3", fallback}));
#endif
  // Supported is a subset of compiled, in the same (best first) order.
  size_t at = 0;
  for (const Target& t : supported) {
    while (at < compiled.size() && compiled[at] != t) ++at;
    ASSERT_LT(at, compiled.size())
        << t.name << " is supported but not compiled";
  }
}

TEST(Targets, CapAndReset) {
  const std::vector<Target> supported = SupportedTargets();
  for (const Target& t : supported) {
    std::string lower = t.name;
    for (char& c : lower) c = static_cast<char>(std::tolower(c));
    ASSERT_TRUE(SetMaxTarget(lower).ok()) << lower;
    EXPECT_EQ(ActiveTarget(), t) << t.name;
  }
  ResetMaxTarget();
  EXPECT_EQ(ActiveTarget(), supported.front());
}

TEST(Targets, BadNamesAreErrorsAndKeepTheCap) {
  const Target before = ActiveTarget();
  for (const char* name : {"", "AVX9", "avx2 ", "NEON_SVE"}) {
    const Status status = SetMaxTarget(name);
    // The message lists the compiled targets.
    EXPECT_TRUE(
        test::IsError(status, StatusCode::kInvalidArgument,
                      {"unknown target", CompiledTargets().back().name}))
        << name;
    EXPECT_EQ(ActiveTarget(), before);
  }
}

// Run by `meson test` a second time with HEADWAY_MAX_TARGET set (see
// test/meson.build).
TEST(Targets, EnvironmentCapAppliesAtFirstCall) {
  const char* env = std::getenv("HEADWAY_MAX_TARGET");
  if (env == nullptr) GTEST_SKIP() << "HEADWAY_MAX_TARGET is not set";
  EXPECT_EQ(std::string(ActiveTarget().name), env);
  ResetMaxTarget();
  EXPECT_EQ(ActiveTarget(), SupportedTargets().front());
}

TEST(Threads, CapAndUncap) {
  const int uncapped = MaxThreads();
  EXPECT_GE(uncapped, 1);
  ASSERT_TRUE(SetMaxThreads(1).ok());
  EXPECT_EQ(MaxThreads(), 1);
  ASSERT_TRUE(SetMaxThreads(0).ok());
  EXPECT_EQ(MaxThreads(), uncapped);
  const Status status = SetMaxThreads(-2);
  EXPECT_TRUE(test::IsError(status, StatusCode::kInvalidArgument,
                            {"n must be >= 0 (got -2)"}));
}

// A cap, not a request (threads.h): more threads than the arena has give the
// arena's, as hw_set_max_threads does in C.
TEST(Threads, CapAboveTheArenaGivesTheArena) {
  const int uncapped = MaxThreads();
  ASSERT_TRUE(SetMaxThreads(uncapped + 5).ok());
  EXPECT_EQ(MaxThreads(), uncapped);
  ASSERT_TRUE(SetMaxThreads(0).ok());
}

// The C API's numbering (hw_attention_mask): 0, the value a zeroed or
// value-initialised mask has, is causal, the default.
TEST(AttentionMask, ZeroIsCausalAsInC) {
  EXPECT_EQ(static_cast<int>(AttentionMask::kCausal), 0);
  EXPECT_EQ(static_cast<int>(AttentionMask::kNone), 1);
  EXPECT_EQ(AttentionMask{}, AttentionMask::kCausal);
  EXPECT_EQ(AttentionOptions{}.mask, AttentionMask::kCausal);
}

// A stride of 0 given to MatrixView's constructor means dense, in C++ as in C
// (view.h): KvCache::Append takes such views.
TEST(MatrixView, StrideZeroMeansDense) {
  const float data[6] = {1, 2, 3, 4, 5, 6};
  const MatrixView<const float> view(data, 2, 3, 0);
  EXPECT_EQ(view.stride, 3);
  EXPECT_EQ(MatrixView<const float>(data, 2, 3, 4).stride, 4);
  EXPECT_EQ(MatrixView<const float>(data, 2, 3, -1).stride, -1);

  KvCacheConfig config;
  config.n_kv_heads = 1;
  config.head_dim = 3;
  config.capacity = 4;
  KvCache cache;
  ASSERT_TRUE(KvCache::Create(config, &cache).ok());
  const Status status = cache.Append(0, view, view);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(cache.length(0), 2);
  EXPECT_EQ(
      static_cast<const float*>(cache.Keys(0, 0).data)[cache.row_stride()],
      4.0f);
  // A stride field set to 0 after construction is below cols: an error.
  MatrixView<const float> zeroed = view;
  zeroed.stride = 0;
  EXPECT_EQ(cache.Append(0, zeroed, zeroed).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.length(0), 2);
}

// The pre-packed matmul shown in README.md, as written there, through the
// shared library.
TEST(Readme, PackedMatmul) {
  const int64_t M = 3, K = 4, N = 5;
  std::vector<float> weights(K * N), x(M * K), y(M * N);
  for (size_t i = 0; i < weights.size(); ++i)
    weights[i] = 0.25f * (i % 7) - 0.5f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * (i % 5) - 1.0f;
  headway::Status s;
  headway::PackedB w;  // op(B): [K, N]
  s = headway::PackedB::Pack(
      headway::MatrixView<const float>(weights.data(), K, N),
      headway::Transpose::kNo, &w);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = headway::Matmul(headway::MatrixView<const float>(x.data(), M, K),
                      headway::Transpose::kNo, w,
                      headway::MatrixView<float>(y.data(), M, N));  // y = x W
  ASSERT_TRUE(s.ok()) << s.ToString();
  // Small integers times quarters: every product and sum is exact in float.
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      float want = 0.0f;
      for (int64_t p = 0; p < K; ++p) want += x[i * K + p] * weights[p * N + j];
      EXPECT_EQ(y[i * N + j], want) << i << ", " << j;
    }
  }
}

// The attention layer shown in README.md, as written there, through the shared
// library; the decode step for sequence 0 must equal the prompt's output for
// the same input at the same position (checked against a second layer call).
TEST(Readme, AttentionLayer) {
  std::vector<float> wq(512 * 8 * 64), wk(512 * 2 * 64), wv(512 * 2 * 64),
      wo(8 * 64 * 512), x(100 * 512), y(100 * 512), x2(2 * 512), y2(2 * 512);
  uint32_t state = 12345;
  const auto fill = [&state](std::vector<float>& v, float scale) {
    for (float& e : v) {
      state = state * 1664525u + 1013904223u;
      e = scale * (static_cast<float>(state >> 8) / 16777216.0f - 0.5f);
    }
  };
  fill(wq, 0.1f);
  fill(wk, 0.1f);
  fill(wv, 0.1f);
  fill(wo, 0.1f);
  fill(x, 2.0f);
  fill(x2, 2.0f);
  headway::Status s;
  headway::AttentionLayerConfig config;
  config.d_model = 512;
  config.n_heads = 8;                // head_dim = d_model / n_heads = 64
  config.n_kv_heads = 2;             // 8 for MHA, 1 for MQA
  headway::AttentionLayerWeights w;  // float32 row-major; biases optional
  w.w_q = headway::MatrixView<const float>(wq.data(), 512, 8 * 64);
  w.w_k = headway::MatrixView<const float>(wk.data(), 512, 2 * 64);
  w.w_v = headway::MatrixView<const float>(wv.data(), 512, 2 * 64);
  w.w_o = headway::MatrixView<const float>(wo.data(), 8 * 64, 512);
  headway::AttentionLayer layer;
  s = headway::AttentionLayer::Create(config, w, &layer);
  ASSERT_TRUE(s.ok()) << s.ToString();
  headway::KvCache layer_cache;
  s = headway::KvCache::Create(
      layer.CacheConfig(/*n_sequences=*/4, /*capacity=*/4096), &layer_cache);
  ASSERT_TRUE(s.ok()) << s.ToString();
  headway::LayerSequence prompt{/*seq=*/0, /*n_tokens=*/100};
  s = layer.Forward(&layer_cache, &prompt, 1,
                    headway::MatrixView<const float>(x.data(), 100, 512),
                    headway::MatrixView<float>(y.data(), 100, 512));
  ASSERT_TRUE(s.ok()) << s.ToString();
  headway::LayerSequence step[2] = {{/*seq=*/0, 1}, {/*seq=*/1, 1}};
  s = layer.Forward(&layer_cache, step, 2,
                    headway::MatrixView<const float>(x2.data(), 2, 512),
                    headway::MatrixView<float>(y2.data(), 2, 512));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(layer_cache.length(0), 101);
  EXPECT_EQ(layer_cache.length(1), 1);
  EXPECT_EQ(layer.n_weights(), 512 * (8 + 2 + 2) * 64 + 8 * 64 * 512);
  EXPECT_EQ(layer.cache_bytes_per_token(), size_t{2 * 2 * 64 * 4});
  // Sequence 1 saw one token: its softmax weight is 1, so y2[1] = (x2[1] W_V
  // per KV head, repeated for its 4 query heads) W_O. Two float32 sums of 512
  // products each, all terms below 0.05 in size: errors near 1e-6, well inside
  // the bound.
  std::vector<double> v(2 * 64, 0.0);
  for (int p = 0; p < 512; ++p) {
    for (int c = 0; c < 2 * 64; ++c)
      v[c] += double{x2[512 + p]} * wv[p * 128 + c];
  }
  for (int j = 0; j < 512; ++j) {
    double want = 0.0;
    for (int h = 0; h < 8; ++h) {
      for (int c = 0; c < 64; ++c)
        want += v[(h / 4) * 64 + c] * wo[(h * 64 + c) * 512 + j];
    }
    EXPECT_NEAR(y2[512 + j], want, 1e-4 * (1.0 + std::abs(want))) << j;
  }
}

// The C API with sizes near and past INT64_MAX: an error status naming the
// argument, never signed overflow (the sanitizer build traps on one).
TEST(CApi, HugeSizesAreErrorsWithoutOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  std::vector<float> a(64, 1.0f), c(64, 3.0f);
  const std::vector<float> c_before = c;
  hw_kv_cache* cache = nullptr;
  EXPECT_EQ(hw_kv_cache_create(kMax, kMax, 1, 1, &cache),
            HW_RESOURCE_EXHAUSTED);
  EXPECT_EQ(hw_kv_cache_create(1, 1, kMax - 14, 1, &cache),
            HW_RESOURCE_EXHAUSTED);
  EXPECT_EQ(cache, nullptr);
  EXPECT_EQ(hw_matmul(HW_NO_TRANS, HW_NO_TRANS, kMax, 4, 4, 1.0f, a.data(), 0,
                      a.data(), 0, 0.0f, c.data(), 0),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  EXPECT_EQ(hw_matmul(HW_NO_TRANS, HW_NO_TRANS, 4, 4, 4, 1.0f, a.data(), kMax,
                      a.data(), 0, 0.0f, c.data(), 0),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  EXPECT_EQ(hw_softmax_rows(kMax, 8, a.data(), 0, c.data(), 0, 1.0f),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  EXPECT_EQ(hw_softmax_rows(2, 8, a.data(), kMax, c.data(), 0, 1.0f),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  EXPECT_EQ(c, c_before);

  // A layer: d_model 4, one head of 4.
  std::vector<float> w(16, 0.5f);
  hw_attention_layer_config config = {};
  config.d_model = 4;
  config.n_heads = 1;
  config.mask = HW_MASK_CAUSAL;
  const hw_matrix square = {w.data(), 4, 4, 0};
  const hw_attention_layer_weights weights = {
      square, square, square, square, nullptr, nullptr, nullptr, nullptr};
  hw_attention_layer* layer = nullptr;
  hw_attention_layer_config huge = config;
  huge.d_model = kMax;
  huge.n_heads = kMax;
  EXPECT_EQ(hw_attention_layer_create(&huge, &weights, &layer),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  huge = config;
  huge.head_dim = kMax / 192 + 1;
  EXPECT_EQ(hw_attention_layer_create(&huge, &weights, &layer),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  ASSERT_EQ(hw_attention_layer_create(&config, &weights, &layer), HW_OK)
      << hw_last_error();
  ASSERT_EQ(hw_attention_layer_create_cache(layer, 2, 8, &cache), HW_OK);
  hw_kv_cache* too_big = nullptr;
  EXPECT_EQ(hw_attention_layer_create_cache(layer, kMax, kMax, &too_big),
            HW_RESOURCE_EXHAUSTED);
  EXPECT_EQ(too_big, nullptr);
  // Token counts whose sum overflows: more than the cache can hold.
  const hw_layer_sequence sequences[2] = {{0, kMax}, {1, kMax}};
  EXPECT_EQ(hw_attention_layer_forward(layer, cache, sequences, 2, a.data(), 0,
                                       c.data(), 0),
            HW_OUT_OF_RANGE)
      << hw_last_error();
  // Forward checks each sequence before the sum: the first one is too long.
  EXPECT_NE(std::string(hw_last_error()).find("exceeds the cache capacity"),
            std::string::npos)
      << hw_last_error();
  // x of two rows kMax apart.
  const hw_layer_sequence two[2] = {{0, 1}, {1, 1}};
  EXPECT_EQ(hw_attention_layer_forward(layer, cache, two, 2, a.data(), kMax,
                                       c.data(), 0),
            HW_RESOURCE_EXHAUSTED)
      << hw_last_error();
  EXPECT_EQ(c, c_before);
  int64_t length = -1;
  EXPECT_EQ(hw_kv_cache_length(cache, 0, &length), HW_OK);
  EXPECT_EQ(length, 0);
  hw_kv_cache_destroy(cache);
  hw_attention_layer_destroy(layer);
}

}  // namespace
}  // namespace headway

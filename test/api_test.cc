// The non-kernel public API: Status, version, instruction-set and thread
// control. This test links the shared library, so it also proves that the
// exported symbols are enough to use it.
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "headway/headway.hpp"

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
  // SCALAR is always compiled and always runs.
  EXPECT_EQ(Names(compiled).back(), "SCALAR");
  EXPECT_EQ(Names(supported).back(), "SCALAR");
#if defined(__x86_64__)
  EXPECT_EQ(Names(compiled),
            (std::vector<std::string>{"AVX3_DL", "AVX3", "AVX2", "SSE4",
                                      "SSSE3", "SCALAR"}));
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
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(status.message().find("unknown target"), std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("SCALAR"), std::string::npos)
        << "the message lists the compiled targets: " << status.message();
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
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("n must be >= 0 (got -2)"),
            std::string::npos);
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

}  // namespace
}  // namespace headway

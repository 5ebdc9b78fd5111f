#include "test/support/cache.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "headway/status.h"
#include "headway/view.h"
#include "test/support/random.h"

namespace headway {
namespace test {

KvCache MakeCache(const KvCacheConfig& config) {
  KvCache cache;
  const Status status = KvCache::Create(config, &cache);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return cache;
}

MatrixView<const float> FloatRows(const KvView& view) {
  EXPECT_EQ(view.dtype, KvDtype::kFloat32);
  if (view.dtype != KvDtype::kFloat32) return MatrixView<const float>();
  return MatrixView<const float>(static_cast<const float*>(view.data),
                                 view.rows, view.cols, view.stride);
}

MatrixView<float> FloatRows(const KvMutableView& view) {
  EXPECT_EQ(view.dtype, KvDtype::kFloat32);
  if (view.dtype != KvDtype::kFloat32) return MatrixView<float>();
  return MatrixView<float>(static_cast<float*>(view.data), view.rows, view.cols,
                           view.stride);
}

KvCache MakeCache(int64_t n_kv_heads, int64_t head_dim,
                  const std::vector<int64_t>& lengths, uint64_t seed,
                  int64_t extra_capacity, KvDtype dtype) {
  KvCacheConfig config;
  config.dtype = dtype;
  config.n_sequences = static_cast<int64_t>(lengths.size());
  config.n_kv_heads = n_kv_heads;
  config.head_dim = head_dim;
  config.capacity =
      *std::max_element(lengths.begin(), lengths.end()) + extra_capacity;
  config.capacity = std::max<int64_t>(config.capacity, 1);
  KvCache cache = MakeCache(config);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] == 0) continue;
    const int64_t width = n_kv_heads * head_dim;
    std::vector<float> k(lengths[i] * width), v(lengths[i] * width);
    FillRandom(k.data(), k.size(), seed + 2 * i);
    FillRandom(v.data(), v.size(), seed + 2 * i + 1);
    EXPECT_TRUE(
        cache
            .Append(static_cast<int64_t>(i),
                    MatrixView<const float>(k.data(), lengths[i], width),
                    MatrixView<const float>(v.data(), lengths[i], width))
            .ok());
  }
  return cache;
}

}  // namespace test
}  // namespace headway

// KV caches for tests: KvCache::Create with the failure reported, and caches of
// random rows.
#ifndef HEADWAY_TEST_SUPPORT_CACHE_H_
#define HEADWAY_TEST_SUPPORT_CACHE_H_

#include <cstdint>
#include <vector>

#include "headway/kv_cache.h"
#include "headway/view.h"

namespace headway {
namespace test {

// KvCache::Create(config); a failed Create fails the test and gives an empty
// cache.
KvCache MakeCache(const KvCacheConfig& config);

// The float rows of a float32 view (Keys, Values, PendingRows, KeyBuffer); a
// view of another dtype fails the test and gives an empty view.
MatrixView<const float> FloatRows(const KvView& view);
MatrixView<float> FloatRows(const KvMutableView& view);

// A cache of dtype, lengths.size() sequences of n_kv_heads * head_dim columns
// and capacity max(lengths) + extra_capacity (at least 1); sequence i holds
// lengths[i] rows of random K and V in [-1, 1] (FillRandom, seeds seed + 2 i
// and seed + 2 i + 1), appended (so rounded to dtype).
KvCache MakeCache(int64_t n_kv_heads, int64_t head_dim,
                  const std::vector<int64_t>& lengths, uint64_t seed,
                  int64_t extra_capacity = 0,
                  KvDtype dtype = KvDtype::kFloat32);

}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_CACHE_H_

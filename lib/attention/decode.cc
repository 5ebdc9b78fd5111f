// The decode kernels (decode.h) for every target and stored type, compiled
// once here rather than in every file that calls them: the tiles of four
// stored types are the costliest code to compile in the library.
#include <stddef.h>
#include <stdint.h>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/attention/decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/attention/decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

#define HEADWAY_DECODE_INSTANTIATE(T)                                        \
  template void ScoreRows<T>(const float*, size_t, size_t, const T*, size_t, \
                             const float*, size_t, size_t, const T*, size_t, \
                             float*, size_t);                                \
  template void AccumulateRows<T>(const float*, size_t, size_t, const T*,    \
                                  size_t, const float*, size_t, size_t,      \
                                  float*, size_t, const T*, size_t, size_t);
HEADWAY_DECODE_INSTANTIATE(float)
HEADWAY_DECODE_INSTANTIATE(hwy::bfloat16_t)
HEADWAY_DECODE_INSTANTIATE(hwy::float16_t)
HEADWAY_DECODE_INSTANTIATE(int8_t)
#undef HEADWAY_DECODE_INSTANTIATE

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

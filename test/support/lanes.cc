// ActiveFloatLanes: one tiny per-target function, reached through the same
// Highway dispatch as the library's kernels, so it reports the vector width
// those kernels run with.
#include <stddef.h>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test/support/lanes.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace test {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

size_t FloatLanesT() { return hn::Lanes(hn::ScalableTag<float>()); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace test
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "headway/targets.h"
#include "test/support/lanes.h"

namespace headway {
namespace test {

HWY_EXPORT(FloatLanesT);

size_t ActiveFloatLanes() {
  // Headway's first call applies HEADWAY_MAX_TARGET: make sure that has
  // happened. Not through ActiveTarget(): with Highway 1.0.3 its
  // hwy::SupportedTargets() call resets dispatch to the best target whatever
  // the cap, unless lib/core/targets.cc undoes that.
  (void)SupportedTargets();
  return HWY_DYNAMIC_DISPATCH(FloatLanesT)();
}

}  // namespace test
}  // namespace headway
#endif  // HWY_ONCE

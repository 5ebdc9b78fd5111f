// How wide the vectors of the target that Headway dispatches to are, so that a
// test can pick sizes around them (TailSizes in test/support/random.h).
#ifndef HEADWAY_TEST_SUPPORT_LANES_H_
#define HEADWAY_TEST_SUPPORT_LANES_H_

#include <cstddef>

namespace headway {
namespace test {

// float32 lanes of a full vector of the target the next Headway call dispatches
// to (under the current SetMaxTarget cap): 16 on AVX3 and AVX3_DL, 8 on AVX2, 4
// on SSE4 and SSSE3, 1 on SCALAR.
size_t ActiveFloatLanes();

}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_LANES_H_

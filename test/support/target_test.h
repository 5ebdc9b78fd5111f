// Runs a test once per instruction set this CPU supports, named by it:
//
//   class SoftmaxTest : public headway::test::TargetTest {};
//   TEST_P(SoftmaxTest, MatchesReference) { ... public API calls ... }
//   HEADWAY_INSTANTIATE_TARGET_TEST(SoftmaxTest);
//
// shows up as "Targets/SoftmaxTest.MatchesReference/AVX2" and so on. Each test
// caps dispatch at its target through the public API and checks that the cap
// took, so a test can never pass on another target by accident.
#ifndef HEADWAY_TEST_SUPPORT_TARGET_TEST_H_
#define HEADWAY_TEST_SUPPORT_TARGET_TEST_H_

#include <ostream>
#include <string>

#include "gtest/gtest.h"
#include "headway/targets.h"

namespace headway {

// Prints a target by name in gtest messages (found by argument-dependent
// lookup).
inline void PrintTo(const Target& target, std::ostream* os) {
  *os << target.name;
}

namespace test {

class TargetTest : public ::testing::TestWithParam<Target> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SetMaxTarget(GetParam().name).ok()) << GetParam().name;
    ASSERT_EQ(ActiveTarget(), GetParam()) << GetParam().name;
  }
  void TearDown() override { ResetMaxTarget(); }
};

inline std::string TargetParamName(
    const ::testing::TestParamInfo<Target>& info) {
  return info.param.name;
}

}  // namespace test
}  // namespace headway

#define HEADWAY_INSTANTIATE_TARGET_TEST(Suite)                               \
  INSTANTIATE_TEST_SUITE_P(Targets, Suite,                                   \
                           ::testing::ValuesIn(headway::SupportedTargets()), \
                           headway::test::TargetParamName)

#endif  // HEADWAY_TEST_SUPPORT_TARGET_TEST_H_

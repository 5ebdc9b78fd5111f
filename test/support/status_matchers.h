// The check of a failed call's Status, for every test:
//   EXPECT_TRUE(test::IsError(status, StatusCode::kOutOfRange,
//                             {"exceeds capacity", "of seq 1"},
//                             "KvCache::Append: "));
// Header-only, so that api_test (which links only the shared library) has it.
#ifndef HEADWAY_TEST_SUPPORT_STATUS_MATCHERS_H_
#define HEADWAY_TEST_SUPPORT_STATUS_MATCHERS_H_

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "headway/status.h"

namespace headway {
namespace test {

// Whether `status` has `code` and a message that starts with `prefix` and
// contains each of `parts`. A failure shows the status and all it expected.
inline ::testing::AssertionResult IsError(const Status& status, StatusCode code,
                                          const std::vector<std::string>& parts,
                                          const std::string& prefix = "") {
  bool ok = status.code() == code && status.message().rfind(prefix, 0) == 0;
  for (const std::string& part : parts) {
    ok = ok && status.message().find(part) != std::string::npos;
  }
  if (ok) return ::testing::AssertionSuccess();
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  failure << "status: " << status.ToString() << "\nexpected "
          << StatusCodeName(code);
  if (!prefix.empty())
    failure << ", a message starting with \"" << prefix << "\"";
  for (const std::string& part : parts)
    failure << "\n  containing \"" << part << "\"";
  return failure;
}

}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_STATUS_MATCHERS_H_

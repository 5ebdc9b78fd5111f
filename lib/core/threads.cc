#include "headway/threads.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include "tbb/global_control.h"
#include "tbb/task_arena.h"

namespace headway {
namespace {

std::mutex& CapMutex() {
  static std::mutex mutex;
  return mutex;
}

std::unique_ptr<tbb::global_control>& Cap() {
  static std::unique_ptr<tbb::global_control> cap;
  return cap;
}

}  // namespace

Status SetMaxThreads(int n) {
  if (n < 0) {
    return Status::InvalidArgument("SetMaxThreads: n must be >= 0 (got " +
                                   std::to_string(n) + ")");
  }
  std::lock_guard<std::mutex> lock(CapMutex());
  Cap().reset();  // one global_control at a time: TBB uses the most restrictive
                  // live one
  if (n > 0) {
    Cap() = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, static_cast<size_t>(n));
  }
  return Status::Ok();
}

int MaxThreads() {
  const size_t allowed = tbb::global_control::active_value(
      tbb::global_control::max_allowed_parallelism);
  const int arena = tbb::this_task_arena::max_concurrency();
  return static_cast<int>(
      std::min<size_t>(allowed, static_cast<size_t>(arena)));
}

}  // namespace headway

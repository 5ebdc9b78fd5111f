#include "headway/threads.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include "lib/core/blocks.h"
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

// The calling thread's live ThreadScratch objects, a doubly linked list. The
// head is a plain pointer (constant-initialised, no destructor), so it is valid
// while the thread's other thread_locals are constructed and destroyed.
class ThreadScratchRegistry {
 public:
  static void Add(ThreadScratch* s) {
    s->next_ = head_;
    if (head_ != nullptr) head_->prev_ = s;
    head_ = s;
  }
  static void Remove(ThreadScratch* s) {
    if (s->prev_ != nullptr) {
      s->prev_->next_ = s->next_;
    } else {
      head_ = s->next_;
    }
    if (s->next_ != nullptr) s->next_->prev_ = s->prev_;
  }
  template <typename Visit>
  static void ForEach(const Visit& visit) {
    for (ThreadScratch* s = head_; s != nullptr; s = s->next_) visit(s);
  }

 private:
  static thread_local ThreadScratch* head_;
};

thread_local ThreadScratch* ThreadScratchRegistry::head_ = nullptr;

ThreadScratch::ThreadScratch() { ThreadScratchRegistry::Add(this); }
ThreadScratch::~ThreadScratch() { ThreadScratchRegistry::Remove(this); }

int64_t ThreadScratchBytes() {
  size_t bytes = 0;
  ThreadScratchRegistry::ForEach(
      [&](ThreadScratch* s) { bytes += s->Bytes(); });
  return static_cast<int64_t>(bytes);
}

int64_t ReleaseThreadScratch() {
  size_t bytes = 0;
  ThreadScratchRegistry::ForEach([&](ThreadScratch* s) {
    bytes += s->Bytes();
    s->Release();
  });
  return static_cast<int64_t>(bytes);
}

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

// Small pieces shared by the kernels' planning code (no SIMD): rounding,
// cutting a length into equal blocks, a grow-only scratch buffer, and the
// registry of each thread's scratch (ReleaseThreadScratch, threads.h).
#ifndef HEADWAY_LIB_CORE_BLOCKS_H_
#define HEADWAY_LIB_CORE_BLOCKS_H_

#include <stddef.h>

#include <algorithm>
#include <new>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/base.h"
#include "tbb/task_arena.h"

namespace headway {

// x rounded up to a multiple of align (> 0).
template <typename T>
constexpr T RoundUp(T x, T align) {
  return (x + align - 1) / align * align;
}

// [0, n) cut into about `count` blocks of one length, a multiple of `multiple`;
// only the last block is shorter. n = 600 in 2 blocks of multiples of 4 is 300
// + 300, not 512 + 88. The split depends on its arguments only (never on
// threads), which keeps results deterministic.
struct EvenBlocks {
  EvenBlocks(size_t n, size_t count, size_t multiple) {
    count = std::max<size_t>(count, 1);
    length = RoundUp((n + count - 1) / count, multiple);
    this->count = (n + length - 1) / length;
  }
  size_t Begin(size_t b) const { return b * length; }
  size_t Size(size_t b, size_t n) const {
    return std::min(length, n - b * length);
  }

  size_t count;
  size_t length;
};

// A grow-only, 64-byte aligned buffer, one per thread and call site: no
// allocation once warm. Throws std::bad_alloc, which the public entry points
// turn into a Status.
struct ScratchBuffer {
  float* Get(size_t floats) {
    if (capacity < floats) {
      buffer.reset();
      capacity = 0;
      buffer = hwy::AllocateAligned<float>(floats);
      if (!buffer) throw std::bad_alloc();
      capacity = floats;
    }
    return buffer.get();
  }
  // Frees a buffer above `keep` floats, so that one huge call does not pin
  // memory forever.
  void Trim(size_t keep) {
    if (capacity > keep) {
      buffer.reset();
      capacity = 0;
    }
  }

  hwy::AlignedFreeUniquePtr<float[]> buffer;
  size_t capacity = 0;
};

// A caller's scratch for the tasks of its parallel loops: one buffer per
// thread of the arena, indexed by tbb::this_task_arena::current_thread_index(),
// every one sized before the loop for the call's largest task, so that a call
// no bigger than an earlier one of the same caller allocates nothing whichever
// threads take its tasks (a thread_local buffer of each worker grows on the
// first task its thread takes: TBB's choice). The caller keeps it in a
// thread_local (ThreadScratchSlots) and runs the loop under
// this_task_arena::isolate, so that while it waits it takes no task of
// another call of its own that would resize the buffers in use.
struct ThreadSlots {
  // Every slot of the current arena holds at least `floats` floats.
  void Reserve(size_t floats) {
    const size_t threads =
        static_cast<size_t>(tbb::this_task_arena::max_concurrency());
    if (slots.size() < threads) slots.resize(threads);
    for (ScratchBuffer& slot : slots) slot.Get(floats);
  }
  // The calling thread's slot (in a task of the loop Reserve was for).
  ScratchBuffer& Mine() {
    const int index = tbb::this_task_arena::current_thread_index();
    HWY_DASSERT(index >= 0 && static_cast<size_t>(index) < slots.size());
    return slots[static_cast<size_t>(index)];
  }
  size_t Bytes() const {
    size_t bytes = slots.capacity() * sizeof(ScratchBuffer);
    for (const ScratchBuffer& slot : slots)
      bytes += slot.capacity * sizeof(float);
    return bytes;
  }

  std::vector<ScratchBuffer> slots;
};

// Base of every thread_local scratch object of the library: while it lives it
// is listed in its thread's registry (lib/core/threads.cc), through which
// ReleaseThreadScratch and ThreadScratchBytes (threads.h) reach all of them.
// Construct and destroy it on the thread that owns it (a thread_local is).
class ThreadScratch {
 public:
  ThreadScratch();
  virtual ~ThreadScratch();
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;

  // Bytes of memory held now.
  virtual size_t Bytes() const = 0;
  // Frees that memory; the next use allocates again.
  virtual void Release() = 0;

 private:
  friend class ThreadScratchRegistry;
  ThreadScratch* prev_ = nullptr;
  ThreadScratch* next_ = nullptr;
};

// A ScratchBuffer that is a thread_local.
struct ThreadScratchBuffer final : ScratchBuffer, ThreadScratch {
  size_t Bytes() const override { return capacity * sizeof(float); }
  void Release() override { Trim(0); }
};

// ThreadSlots that are a thread_local of the calling thread.
struct ThreadScratchSlots final : ThreadSlots, ThreadScratch {
  size_t Bytes() const override { return ThreadSlots::Bytes(); }
  void Release() override { slots = std::vector<ScratchBuffer>(); }
};

}  // namespace headway

#endif  // HEADWAY_LIB_CORE_BLOCKS_H_

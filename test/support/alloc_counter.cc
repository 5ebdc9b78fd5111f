// The counters of test/support/alloc_counter.h and the allocation functions
// that bump them.
#include "test/support/alloc_counter.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <thread>

#include "headway/threads.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"
#include "tbb/task_arena.h"

namespace {

std::atomic<int64_t> g_operator_new_calls{0};
std::atomic<int64_t> g_malloc_calls{0};

void* CountedNew(std::size_t size) {
  g_operator_new_calls.fetch_add(1, std::memory_order_relaxed);
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* CountedAlignedNew(std::size_t size, std::align_val_t align) {
  g_operator_new_calls.fetch_add(1, std::memory_order_relaxed);
  const std::size_t alignment =
      std::max(static_cast<std::size_t>(align), sizeof(void*));
  void* p = nullptr;
  if (posix_memalign(&p, alignment, size == 0 ? 1 : size) != 0) {
    throw std::bad_alloc();
  }
  return p;
}

}  // namespace

void* operator new(std::size_t size) { return CountedNew(size); }
void* operator new[](std::size_t size) { return CountedNew(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return CountedNew(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return CountedNew(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t size, std::align_val_t align) {
  return CountedAlignedNew(size, align);
}
void* operator new[](std::size_t size, std::align_val_t align) {
  return CountedAlignedNew(size, align);
}
void* operator new(std::size_t size, std::align_val_t align,
                   const std::nothrow_t&) noexcept {
  try {
    return CountedAlignedNew(size, align);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, std::align_val_t align,
                     const std::nothrow_t&) noexcept {
  try {
    return CountedAlignedNew(size, align);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t,
                     const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t,
                       const std::nothrow_t&) noexcept {
  std::free(p);
}

// The C allocator: glibc lets an executable interpose malloc and friends and
// exports its own as __libc_*.
#if defined(HEADWAY_TEST_COUNTS_MALLOC)
extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t n, std::size_t size);
void* __libc_realloc(void* p, std::size_t size);
void* __libc_memalign(std::size_t align, std::size_t size);
void* __libc_valloc(std::size_t size);
void* __libc_pvalloc(std::size_t size);
void __libc_free(void* p);

void* malloc(std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(size);
}
void* calloc(std::size_t n, std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, size);
}
void* memalign(std::size_t align, std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, size);
}
void* aligned_alloc(std::size_t align, std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, size);
}
int posix_memalign(void** out, std::size_t align, std::size_t size) {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  void* p = __libc_memalign(align, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_valloc(size);
}
void* pvalloc(std::size_t size) {
  g_malloc_calls.fetch_add(1, std::memory_order_relaxed);
  return __libc_pvalloc(size);
}
void free(void* p) { __libc_free(p); }
}  // extern "C"
#endif

namespace headway {
namespace test {

AllocationCount Allocations() {
  return {g_operator_new_calls.load(std::memory_order_relaxed),
          g_malloc_calls.load(std::memory_order_relaxed)};
}

void StartAllThreads() {
  // One task per thread, each waiting until all have started: a thread that
  // waits in a task takes no other, so every task runs on its own thread.
  const int threads = MaxThreads();
  std::atomic<int> started{0};
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(2);
  tbb::parallel_for(
      0, threads, 1,
      [&](int) {
        started.fetch_add(1, std::memory_order_relaxed);
        while (started.load(std::memory_order_relaxed) < threads &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
      },
      tbb::simple_partitioner());
}

}  // namespace test
}  // namespace headway

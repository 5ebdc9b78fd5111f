// Allocation counting for a test binary that has test/support/alloc_counter.cc
// among its sources (test/meson.build): every global operator new of the
// binary (a statically linked library's too) and, on glibc without a
// sanitizer, every C allocation (malloc and friends, which
// hwy::AllocateAligned and the operator new here call) bumps a counter.
// Counting is always on; a test reads Allocations() around the call it checks.
#ifndef HEADWAY_TEST_SUPPORT_ALLOC_COUNTER_H_
#define HEADWAY_TEST_SUPPORT_ALLOC_COUNTER_H_

#include <cstdint>

// Sanitizers interpose malloc themselves, so C allocations are counted only
// without one, on glibc (which exports its own allocator as __libc_*).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HEADWAY_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define HEADWAY_TEST_SANITIZED 1
#endif
#endif
#if defined(__GLIBC__) && !defined(HEADWAY_TEST_SANITIZED)
#define HEADWAY_TEST_COUNTS_MALLOC 1
#endif

namespace headway {
namespace test {

struct AllocationCount {
  // Calls of any global operator new, and of malloc and friends (0 without
  // HEADWAY_TEST_COUNTS_MALLOC).
  int64_t operator_new;
  int64_t malloc;
};

inline AllocationCount operator-(const AllocationCount& a,
                                 const AllocationCount& b) {
  return {a.operator_new - b.operator_new, a.malloc - b.malloc};
}

// The calls so far in this process.
AllocationCount Allocations();

// Has each of the threads a Headway call may use here (MaxThreads) run a
// task, so that TBB has created all its worker threads. TBB creates a worker
// when work first needs it, and creating one allocates (glibc's TLS for it: a
// calloc): with 16 threads on this 2-CPU VM a warm decode met 2-14 such
// mallocs, with 2 none. A test calls this before the calls whose allocations
// it counts. Gives up after 2 s (threads it cannot get), so it never hangs.
void StartAllThreads();

}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_ALLOC_COUNTER_H_

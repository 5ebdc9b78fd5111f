// The one allocator of the library's large, long-lived buffers (the KV cache,
// packed weights), which decode streams from memory once per token: from
// 4 MiB up they start on a 2 MiB boundary and are advised as transparent huge
// pages (Linux, madvise), which spares the page walks of 4 KiB pages. A
// 4-stream read of 256 MiB ran at 28-31 GB/s in huge pages against 23-24 GB/s
// in 4 KiB ones (one thread, AVX3_DL, THP in madvise mode, alternating runs).
// Where the kernel gives no huge pages the buffer is an ordinary aligned one.
#ifndef HEADWAY_LIB_CORE_MEMORY_H_
#define HEADWAY_LIB_CORE_MEMORY_H_

#include <cstddef>
#include <memory>

namespace headway {
namespace internal {

// `bytes` bytes, aligned to 64 (to 2 MiB from 4 MiB up); null when out of
// memory or for 0 bytes. Contents unspecified. Free with FreeLarge.
void* AllocateLarge(size_t bytes);
void FreeLarge(void* data);

// AllocateLarge's `bytes`, zeroed, and first touched by the threads of the
// calling thread's arena, each a contiguous share of 2 MiB pieces: a page
// lands on the NUMA node of the thread that first writes it, so the buffer
// spreads over the nodes the library's threads run on, whose decode reads it
// from all of them, instead of sitting on the creating thread's node (what
// one memset does). Below 4 MiB, one memset. null as AllocateLarge; an
// exception from the threads frees the buffer and propagates.
void* AllocateLargeZeroed(size_t bytes);

struct LargeFree {
  void operator()(void* data) const { FreeLarge(data); }
};
template <typename T>
using LargePtr = std::unique_ptr<T[], LargeFree>;

// n elements of T (trivially constructible); null as AllocateLarge.
template <typename T>
LargePtr<T> AllocateLargeArray(size_t n) {
  if (n > static_cast<size_t>(-1) / sizeof(T)) return nullptr;
  return LargePtr<T>(static_cast<T*>(AllocateLarge(n * sizeof(T))));
}

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_CORE_MEMORY_H_

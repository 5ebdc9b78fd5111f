#include "lib/core/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace headway {
namespace internal {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kLineAlignment = 64;

}  // namespace

void* AllocateLarge(size_t bytes) {
  if (bytes == 0) return nullptr;
  const bool huge = bytes >= 2 * kHugePage;
  const size_t alignment = huge ? kHugePage : kLineAlignment;
  // aligned_alloc takes a multiple of the alignment.
  if (bytes > static_cast<size_t>(-1) - alignment) return nullptr;
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, rounded);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where THP is off the pages stay 4 KiB.
  if (data != nullptr && huge) (void)madvise(data, rounded, MADV_HUGEPAGE);
#endif
  return data;
}

void FreeLarge(void* data) { std::free(data); }

void* AllocateLargeZeroed(size_t bytes) {
  void* data = AllocateLarge(bytes);
  if (data == nullptr) return nullptr;
  char* base = static_cast<char*>(data);
  if (bytes < 2 * kHugePage) {
    std::memset(base, 0, bytes);
    return data;
  }
  const size_t pieces = (bytes + kHugePage - 1) / kHugePage;
  try {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, pieces),
        [&](const tbb::blocked_range<size_t>& range) {
          const size_t begin = range.begin() * kHugePage;
          const size_t end = std::min(bytes, range.end() * kHugePage);
          std::memset(base + begin, 0, end - begin);
        },
        tbb::static_partitioner());
  } catch (...) {
    FreeLarge(data);
    throw;
  }
  return data;
}

}  // namespace internal
}  // namespace headway

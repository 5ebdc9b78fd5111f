#include "lib/core/memory.h"

#include <cstdlib>

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

}  // namespace internal
}  // namespace headway

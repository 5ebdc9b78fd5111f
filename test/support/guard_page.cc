#include "test/support/guard_page.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace headway {
namespace test {

size_t GuardedBytes::PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

GuardedBytes::GuardedBytes(size_t bytes, GuardSide side, size_t align)
    : bytes_(bytes), side_(side) {
  const size_t page = PageSize();
  if (align == 0 || (align & (align - 1)) != 0 || page % align != 0 ||
      bytes % align != 0) {
    throw std::bad_alloc();
  }
  // [data pages][guard] (kAfter) or [guard][data pages] (kBefore).
  const size_t data_pages = (bytes + page - 1) / page * page;
  mapping_bytes_ = data_pages + page;
  void* mapping = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::bad_alloc();
  mapping_ = mapping;
  char* base = static_cast<char*>(mapping_);
  char* guard = side == GuardSide::kAfter ? base + data_pages : base;
  if (mprotect(guard, page, PROT_NONE) != 0) {
    Release();
    throw std::bad_alloc();
  }
  // kAfter: the data ends where the guard starts; page - bytes % page keeps
  // `align`.
  data_ = side == GuardSide::kAfter ? guard - bytes : guard + page;
}

GuardedBytes::~GuardedBytes() { Release(); }

GuardedBytes::GuardedBytes(GuardedBytes&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      side_(other.side_) {}

GuardedBytes& GuardedBytes::operator=(GuardedBytes&& other) noexcept {
  if (this != &other) {
    Release();
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    side_ = other.side_;
  }
  return *this;
}

void GuardedBytes::Release() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  mapping_bytes_ = 0;
}

}  // namespace test
}  // namespace headway

// Buffers that end (or start) exactly at an inaccessible page, so that a kernel
// reading even one element past its data crashes its test instead of reading
// garbage. This is how tail handling is tested: Highway 1.0.3's MaskedLoad is a
// full vector load on some targets (HIGHWAY.md).
//
//   GuardedBuffer<float> x(n);           // x[n] is on a PROT_NONE page
//   FillRandom(x.data(), n, seed);
//   ... Softmax(MatrixView<const float>(x.data(), 1, n), ...) ...
//
// The data start is aligned to alignof(T) only, not to a vector, which is
// intended: kernels must also handle misaligned views.
#ifndef HEADWAY_TEST_SUPPORT_GUARD_PAGE_H_
#define HEADWAY_TEST_SUPPORT_GUARD_PAGE_H_

#include <cstddef>
#include <type_traits>

namespace headway {
namespace test {

enum class GuardSide {
  kAfter,   // the byte after the last element is inaccessible
  kBefore,  // the byte before the first element is inaccessible
};

// Untyped core of GuardedBuffer: `bytes` zero-filled bytes next to a PROT_NONE
// page.
class GuardedBytes {
 public:
  // Maps the pages; throws std::bad_alloc if mmap or mprotect fails. `align` (a
  // power of two dividing the page size; bytes a multiple of it, else bad_alloc
  // too) is the alignment that the data start keeps. A moved-from object is
  // empty (null data, size 0).
  GuardedBytes(size_t bytes, GuardSide side, size_t align = 1);
  ~GuardedBytes();
  GuardedBytes(GuardedBytes&& other) noexcept;
  GuardedBytes& operator=(GuardedBytes&& other) noexcept;
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  GuardSide side() const { return side_; }

  // The system page size, the granularity of the guard.
  static size_t PageSize();

 private:
  void Release();

  void* mapping_ = nullptr;  // the whole mmap, guard page included
  size_t mapping_bytes_ = 0;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  GuardSide side_ = GuardSide::kAfter;
};

// `count` elements of T (zero-initialised) against a guard page on `side`.
// Movable, not copyable; the pages are unmapped by the destructor.
template <typename T>
class GuardedBuffer {
  static_assert(std::is_trivial_v<T>, "mmap memory is not constructed");

 public:
  explicit GuardedBuffer(size_t count, GuardSide side = GuardSide::kAfter)
      : bytes_(count * sizeof(T), side, alignof(T)) {}

  T* data() { return static_cast<T*>(bytes_.data()); }
  const T* data() const { return static_cast<const T*>(bytes_.data()); }
  size_t size() const { return bytes_.size() / sizeof(T); }
  GuardSide side() const { return bytes_.side(); }

  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }

 private:
  GuardedBytes bytes_;
};

}  // namespace test
}  // namespace headway

#endif  // HEADWAY_TEST_SUPPORT_GUARD_PAGE_H_

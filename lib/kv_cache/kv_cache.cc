// KvCache: argument checks, allocation and row copies (plain C++: the copies
// are memmove/memcpy of whole head rows, which the C library vectorizes).
#include "headway/kv_cache.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "lib/core/message.h"
#include "lib/core/validate.h"

namespace headway {
namespace {

// 64 bytes: a cache line, and one AVX-512 vector, so every row (row_stride is
// a multiple of 16 floats) starts on a vector boundary.
constexpr size_t kAlignment = 64;
constexpr int64_t kRowAlignFloats = 16;  // kAlignment / sizeof(float)

// n_new (>= 1) more tokens fit after `length` (<= capacity). Written as a
// subtraction so that a huge n_new cannot overflow.
Status CheckFits(const char* fn, const char* n_name, int64_t n_new, int64_t seq,
                 int64_t length, int64_t capacity) {
  if (n_new <= capacity - length) return Status::Ok();
  return internal::Fail(StatusCode::kOutOfRange, fn, "length (", length, ") + ",
                        n_name, " (", n_new, ") exceeds capacity (", capacity,
                        ") of seq ", seq);
}

// row_stride = head_dim rounded up to kRowAlignFloats, and the bytes of one
// buffer. False if a product overflows: every one must fit in int64_t (row
// offsets and MatrixView sizes are int64_t), and the two buffers together must
// fit in ptrdiff_t, so that bytes() cannot wrap.
bool BufferBytes(const KvCacheConfig& config, int64_t* row_stride,
                 int64_t* buffer_bytes) {
  int64_t rounded = 0, total_bytes = 0;
  if (!internal::CheckedAdd(config.head_dim, kRowAlignFloats - 1, &rounded)) {
    return false;
  }
  *row_stride = rounded / kRowAlignFloats * kRowAlignFloats;
  return internal::CheckedProduct(
             {config.n_sequences, config.n_kv_heads, config.capacity,
              *row_stride, int64_t{sizeof(float)}},
             buffer_bytes) &&
         internal::CheckedMul(*buffer_bytes, 2, &total_bytes) &&
         static_cast<uint64_t>(total_bytes) <=
             static_cast<uint64_t>(std::numeric_limits<ptrdiff_t>::max());
}

// `bytes` (> 0) zeroed bytes, kAlignment-aligned; null when out of memory.
// Highway's allocator calls malloc, which returns null (under ASan only with
// allocator_may_return_null=1), where aligned operator new under ASan aborts.
float* AllocateZeroed(size_t bytes) {
  static_assert(HWY_ALIGNMENT % kAlignment == 0, "alignment");
  void* data = hwy::AllocateAlignedBytes(bytes, nullptr, nullptr);
  if (data != nullptr) std::memset(data, 0, bytes);
  return static_cast<float*>(data);
}

}  // namespace

struct KvCache::Impl {
  // Frees what AllocateZeroed returned.
  struct AlignedFree {
    void operator()(float* data) const {
      hwy::FreeAlignedBytes(data, nullptr, nullptr);
    }
  };

  // Elements from a buffer's start to row `row` of (seq, kv_head).
  int64_t RowOffset(int64_t seq, int64_t kv_head, int64_t row) const {
    return (seq * config.n_kv_heads + kv_head) * head_stride + row * row_stride;
  }
  float* KeyRow(int64_t seq, int64_t kv_head, int64_t row) const {
    return keys.get() + RowOffset(seq, kv_head, row);
  }
  float* ValueRow(int64_t seq, int64_t kv_head, int64_t row) const {
    return values.get() + RowOffset(seq, kv_head, row);
  }

  KvCacheConfig config;
  int64_t row_stride = 0;   // head_dim rounded up to kRowAlignFloats
  int64_t head_stride = 0;  // capacity * row_stride
  // Each [n_sequences][n_kv_heads][capacity][row_stride].
  std::unique_ptr<float, AlignedFree> keys;
  std::unique_ptr<float, AlignedFree> values;
  std::vector<int64_t> lengths;  // [n_sequences]
};

namespace {
const KvCacheConfig kEmptyConfig{0, 0, 0, 0, KvDtype::kFloat32};
}  // namespace

KvCache::KvCache() = default;
KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&& other) noexcept = default;
KvCache& KvCache::operator=(KvCache&& other) noexcept = default;

namespace {

// The sizes and dtype of a config, before any byte count.
Status CheckConfig(const char* fn, const KvCacheConfig& config) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"config.n_sequences", config.n_sequences},
      {"config.n_kv_heads", config.n_kv_heads},
      {"config.head_dim", config.head_dim},
      {"config.capacity", config.capacity},
  };
  for (const auto& [name, value] : sizes) {
    Status status = internal::CheckPositive(fn, name, value);
    if (!status.ok()) return status;
  }
  if (config.dtype != KvDtype::kFloat32) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, "config.dtype (",
                          static_cast<int>(config.dtype),
                          ") is not a known KvDtype");
  }
  return Status::Ok();
}

}  // namespace

Status KvCache::Create(const KvCacheConfig& config, KvCache* out) {
  constexpr const char* kFn = "KvCache::Create";
  if (out == nullptr) {
    return internal::Fail(StatusCode::kInvalidArgument, kFn, "out is null");
  }
  Status status = CheckConfig(kFn, config);
  if (!status.ok()) return status;
  int64_t row_stride = 0;
  int64_t buffer_bytes = 0;
  if (!BufferBytes(config, &row_stride, &buffer_bytes)) {
    return internal::Fail(
        StatusCode::kResourceExhausted, kFn, "2 x n_sequences (",
        config.n_sequences, ") x n_kv_heads (", config.n_kv_heads,
        ") x capacity (", config.capacity, ") x head_dim (", config.head_dim,
        ") rounded up to 16 x 4 bytes overflows");
  }

  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>();
    impl->keys.reset(AllocateZeroed(static_cast<size_t>(buffer_bytes)));
    if (impl->keys != nullptr) {
      impl->values.reset(AllocateZeroed(static_cast<size_t>(buffer_bytes)));
    }
    if (impl->values != nullptr) {
      impl->lengths.assign(static_cast<size_t>(config.n_sequences), 0);
    }
  } catch (const std::bad_alloc&) {
    impl.reset();
  }
  if (impl == nullptr || impl->lengths.empty()) {
    return internal::Fail(StatusCode::kResourceExhausted, kFn,
                          "out of memory for 2 x ", buffer_bytes, " bytes");
  }
  impl->config = config;
  impl->row_stride = row_stride;
  impl->head_stride = config.capacity * row_stride;  // fits: BufferBytes
  out->impl_ = std::move(impl);
  return Status::Ok();
}

size_t KvCache::BytesPerToken(const KvCacheConfig& config) {
  int64_t row_stride = 0, buffer_bytes = 0;
  if (!CheckConfig("KvCache::BytesPerToken", config).ok() ||
      !BufferBytes(config, &row_stride, &buffer_bytes)) {
    return 0;
  }
  return 2 * static_cast<size_t>(config.n_kv_heads * row_stride) *
         sizeof(float);
}

const KvCacheConfig& KvCache::config() const {
  return impl_ ? impl_->config : kEmptyConfig;
}
int64_t KvCache::n_sequences() const {
  return impl_ ? impl_->config.n_sequences : 0;
}
int64_t KvCache::n_kv_heads() const {
  return impl_ ? impl_->config.n_kv_heads : 0;
}
int64_t KvCache::head_dim() const { return impl_ ? impl_->config.head_dim : 0; }
int64_t KvCache::capacity() const { return impl_ ? impl_->config.capacity : 0; }
int64_t KvCache::row_stride() const { return impl_ ? impl_->row_stride : 0; }
int64_t KvCache::head_stride() const { return impl_ ? impl_->head_stride : 0; }

int64_t KvCache::length(int64_t seq) const {
  if (seq < 0 || seq >= n_sequences()) return 0;
  return impl_->lengths[static_cast<size_t>(seq)];
}

size_t KvCache::bytes() const {
  // Cannot overflow: Create checked this product.
  return static_cast<size_t>(n_sequences() * capacity()) * bytes_per_token();
}

size_t KvCache::bytes_per_token() const {
  return 2 * static_cast<size_t>(n_kv_heads() * row_stride()) * sizeof(float);
}

Status KvCache::Append(int64_t seq, MatrixView<const float> k,
                       MatrixView<const float> v) {
  constexpr const char* kFn = "KvCache::Append";
  Status status = internal::CheckIndex(kFn, "seq", seq, n_sequences());
  if (status.ok()) status = internal::CheckMatrix(kFn, "k", k);
  if (status.ok()) status = internal::CheckMatrix(kFn, "v", v);
  if (status.ok()) {
    status =
        internal::CheckSameShape(kFn, "k", k.rows, k.cols, "v", v.rows, v.cols);
  }
  if (!status.ok()) return status;
  Impl& impl = *impl_;
  const int64_t n_kv_heads = impl.config.n_kv_heads;
  const int64_t head_dim = impl.config.head_dim;
  const int64_t width = n_kv_heads * head_dim;
  if (k.cols != width) {
    return internal::Fail(StatusCode::kInvalidArgument, kFn, "k.cols (", k.cols,
                          ") must be n_kv_heads * head_dim (", n_kv_heads,
                          " * ", head_dim, " = ", width, ")");
  }
  int64_t& length = impl.lengths[static_cast<size_t>(seq)];
  status = CheckFits(kFn, "k.rows", k.rows, seq, length, impl.config.capacity);
  if (!status.ok()) return status;

  // memmove, not memcpy: k or v may be read from this cache (rows other than
  // the ones written, but possibly the identical row of a no-op copy).
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    // Destination rows of one head are contiguous: [k.rows, row_stride].
    float* key_rows = impl.KeyRow(seq, g, length);
    float* value_rows = impl.ValueRow(seq, g, length);
    for (int64_t r = 0; r < k.rows; ++r) {
      std::memmove(key_rows + r * impl.row_stride,
                   k.data + r * k.stride + g * head_dim, row_bytes);
      std::memmove(value_rows + r * impl.row_stride,
                   v.data + r * v.stride + g * head_dim, row_bytes);
    }
  }
  length += k.rows;
  return Status::Ok();
}

Status KvCache::PendingRows(int64_t seq, int64_t kv_head, int64_t n_new,
                            MatrixView<float>* k, MatrixView<float>* v) {
  constexpr const char* kFn = "KvCache::PendingRows";
  if (k == nullptr) {
    return internal::Fail(StatusCode::kInvalidArgument, kFn, "k is null");
  }
  if (v == nullptr) {
    return internal::Fail(StatusCode::kInvalidArgument, kFn, "v is null");
  }
  if (k == v) {
    // The second view would overwrite the first.
    return internal::Fail(StatusCode::kInvalidArgument, kFn,
                          "k and v point to the same view");
  }
  Status status = internal::CheckIndex(kFn, "seq", seq, n_sequences());
  if (status.ok()) {
    status = internal::CheckIndex(kFn, "kv_head", kv_head, n_kv_heads());
  }
  if (status.ok()) status = internal::CheckPositive(kFn, "n_new", n_new);
  if (!status.ok()) return status;
  const Impl& impl = *impl_;
  const int64_t length = impl.lengths[static_cast<size_t>(seq)];
  status = CheckFits(kFn, "n_new", n_new, seq, length, impl.config.capacity);
  if (!status.ok()) return status;
  *k = MatrixView<float>(impl.KeyRow(seq, kv_head, length), n_new,
                         impl.config.head_dim, impl.row_stride);
  *v = MatrixView<float>(impl.ValueRow(seq, kv_head, length), n_new,
                         impl.config.head_dim, impl.row_stride);
  return Status::Ok();
}

Status KvCache::CommitAppend(int64_t seq, int64_t n_new) {
  constexpr const char* kFn = "KvCache::CommitAppend";
  Status status = internal::CheckIndex(kFn, "seq", seq, n_sequences());
  if (status.ok()) status = internal::CheckPositive(kFn, "n_new", n_new);
  if (!status.ok()) return status;
  int64_t& length = impl_->lengths[static_cast<size_t>(seq)];
  status = CheckFits(kFn, "n_new", n_new, seq, length, capacity());
  if (!status.ok()) return status;
  length += n_new;
  return Status::Ok();
}

Status KvCache::Truncate(int64_t seq, int64_t new_length) {
  constexpr const char* kFn = "KvCache::Truncate";
  Status status = internal::CheckIndex(kFn, "seq", seq, n_sequences());
  if (!status.ok()) return status;
  int64_t& length = impl_->lengths[static_cast<size_t>(seq)];
  if (new_length < 0 || new_length > length) {
    return internal::Fail(StatusCode::kOutOfRange, kFn, "new_length (",
                          new_length, ") is out of range [0, ", length,
                          "], the length of seq ", seq);
  }
  length = new_length;
  return Status::Ok();
}

Status KvCache::CopySequence(int64_t from, int64_t to) {
  constexpr const char* kFn = "KvCache::CopySequence";
  Status status = internal::CheckIndex(kFn, "from", from, n_sequences());
  if (status.ok()) status = internal::CheckIndex(kFn, "to", to, n_sequences());
  if (!status.ok() || from == to) return status;
  Impl& impl = *impl_;
  const int64_t length = impl.lengths[static_cast<size_t>(from)];
  // The rows of one head are contiguous: one copy per head and buffer (the
  // padding copied along is zero on both sides).
  const size_t head_bytes =
      static_cast<size_t>(length * impl.row_stride) * sizeof(float);
  if (head_bytes != 0) {
    for (int64_t g = 0; g < impl.config.n_kv_heads; ++g) {
      std::memcpy(impl.KeyRow(to, g, 0), impl.KeyRow(from, g, 0), head_bytes);
      std::memcpy(impl.ValueRow(to, g, 0), impl.ValueRow(from, g, 0),
                  head_bytes);
    }
  }
  impl.lengths[static_cast<size_t>(to)] = length;
  return Status::Ok();
}

Status KvCache::Reset(int64_t seq) {
  Status status =
      internal::CheckIndex("KvCache::Reset", "seq", seq, n_sequences());
  if (!status.ok()) return status;
  impl_->lengths[static_cast<size_t>(seq)] = 0;
  return Status::Ok();
}

void KvCache::ResetAll() {
  if (impl_) std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0);
}

MatrixView<const float> KvCache::Keys(int64_t seq, int64_t kv_head) const {
  if (seq < 0 || seq >= n_sequences() || kv_head < 0 ||
      kv_head >= n_kv_heads()) {
    return MatrixView<const float>();
  }
  return MatrixView<const float>(impl_->KeyRow(seq, kv_head, 0),
                                 impl_->lengths[static_cast<size_t>(seq)],
                                 impl_->config.head_dim, impl_->row_stride);
}

MatrixView<const float> KvCache::Values(int64_t seq, int64_t kv_head) const {
  if (seq < 0 || seq >= n_sequences() || kv_head < 0 ||
      kv_head >= n_kv_heads()) {
    return MatrixView<const float>();
  }
  return MatrixView<const float>(impl_->ValueRow(seq, kv_head, 0),
                                 impl_->lengths[static_cast<size_t>(seq)],
                                 impl_->config.head_dim, impl_->row_stride);
}

MatrixView<const float> KvCache::KeyBuffer() const {
  if (!impl_) return MatrixView<const float>();
  return MatrixView<const float>(impl_->keys.get(),
                                 n_sequences() * n_kv_heads() * capacity(),
                                 impl_->row_stride, impl_->row_stride);
}

MatrixView<const float> KvCache::ValueBuffer() const {
  if (!impl_) return MatrixView<const float>();
  return MatrixView<const float>(impl_->values.get(),
                                 n_sequences() * n_kv_heads() * capacity(),
                                 impl_->row_stride, impl_->row_stride);
}

}  // namespace headway

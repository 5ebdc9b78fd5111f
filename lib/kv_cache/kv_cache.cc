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

#include "hwy/aligned_allocator.h"
#include "lib/core/validate.h"

namespace headway {
namespace {

// 64 bytes: a cache line, and one AVX-512 vector, so every row (row_stride is
// a multiple of 16 floats) starts on a vector boundary.
constexpr size_t kAlignment = 64;
constexpr int64_t kRowAlignFloats = 16;  // kAlignment / sizeof(float)

std::string Str(int64_t value) { return std::to_string(value); }

// "fn: name (value) is out of range [0, limit)".
Status CheckIndex(const char* fn, const char* name, int64_t value,
                  int64_t limit) {
  if (value >= 0 && value < limit) return Status::Ok();
  return Status::InvalidArgument(std::string(fn) + ": " + name + " (" +
                                 Str(value) + ") is out of range [0, " +
                                 Str(limit) + ")");
}

Status CheckPositive(const char* fn, const char* name, int64_t value) {
  if (value >= 1) return Status::Ok();
  return Status::InvalidArgument(std::string(fn) + ": " + name +
                                 " must be >= 1 (got " + Str(value) + ")");
}

// n_new (>= 1) more tokens fit after `length` (<= capacity). Written as a
// subtraction so that a huge n_new cannot overflow.
Status CheckFits(const char* fn, const char* n_name, int64_t n_new, int64_t seq,
                 int64_t length, int64_t capacity) {
  if (n_new <= capacity - length) return Status::Ok();
  return Status::OutOfRange(std::string(fn) + ": length (" + Str(length) +
                            ") + " + n_name + " (" + Str(n_new) +
                            ") exceeds capacity (" + Str(capacity) +
                            ") of seq " + Str(seq));
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

void KvCache::AlignedFree::operator()(float* data) const {
  hwy::FreeAlignedBytes(data, nullptr, nullptr);
}

KvCache::KvCache() = default;
KvCache::~KvCache() = default;

KvCache::KvCache(KvCache&& other) noexcept
    : config_(other.config_),
      row_stride_(other.row_stride_),
      keys_(std::move(other.keys_)),
      values_(std::move(other.values_)),
      lengths_(std::move(other.lengths_)) {
  other.config_ = KvCacheConfig{0, 0, 0, 0, KvDtype::kFloat32};
  other.row_stride_ = 0;
  other.lengths_.clear();
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this != &other) {
    config_ = other.config_;
    row_stride_ = other.row_stride_;
    keys_ = std::move(other.keys_);
    values_ = std::move(other.values_);
    lengths_ = std::move(other.lengths_);
    other.config_ = KvCacheConfig{0, 0, 0, 0, KvDtype::kFloat32};
    other.row_stride_ = 0;
    other.lengths_.clear();
  }
  return *this;
}

Status KvCache::Create(const KvCacheConfig& config, KvCache* out) {
  constexpr const char* kFn = "KvCache::Create";
  if (out == nullptr) {
    return Status::InvalidArgument(std::string(kFn) + ": out is null");
  }
  const std::pair<const char*, int64_t> sizes[] = {
      {"config.n_sequences", config.n_sequences},
      {"config.n_kv_heads", config.n_kv_heads},
      {"config.head_dim", config.head_dim},
      {"config.capacity", config.capacity},
  };
  for (const auto& [name, value] : sizes) {
    Status status = CheckPositive(kFn, name, value);
    if (!status.ok()) return status;
  }
  if (config.dtype != KvDtype::kFloat32) {
    return Status::InvalidArgument(
        std::string(kFn) + ": config.dtype (" +
        std::to_string(static_cast<int>(config.dtype)) +
        ") is not a known KvDtype");
  }

  int64_t row_stride = 0;
  int64_t buffer_bytes = 0;
  if (!BufferBytes(config, &row_stride, &buffer_bytes)) {
    return Status::ResourceExhausted(
        std::string(kFn) + ": 2 x n_sequences (" + Str(config.n_sequences) +
        ") x n_kv_heads (" + Str(config.n_kv_heads) + ") x capacity (" +
        Str(config.capacity) + ") x head_dim (" + Str(config.head_dim) +
        ") rounded up to 16 x 4 bytes overflows");
  }

  KvCache cache;
  bool allocated = false;
  try {
    cache.keys_.reset(AllocateZeroed(static_cast<size_t>(buffer_bytes)));
    if (cache.keys_ != nullptr) {
      cache.values_.reset(AllocateZeroed(static_cast<size_t>(buffer_bytes)));
    }
    if (cache.values_ != nullptr) {
      cache.lengths_.assign(static_cast<size_t>(config.n_sequences), 0);
      allocated = true;
    }
  } catch (const std::bad_alloc&) {
  }
  if (!allocated) {
    return Status::ResourceExhausted(std::string(kFn) +
                                     ": out of memory for 2 x " +
                                     Str(buffer_bytes) + " bytes");
  }
  cache.config_ = config;
  cache.row_stride_ = row_stride;
  *out = std::move(cache);
  return Status::Ok();
}

int64_t KvCache::RowOffset(int64_t seq, int64_t kv_head, int64_t row) const {
  return ((seq * config_.n_kv_heads + kv_head) * config_.capacity + row) *
         row_stride_;
}

float* KvCache::KeyRow(int64_t seq, int64_t kv_head, int64_t row) const {
  return keys_.get() + RowOffset(seq, kv_head, row);
}

float* KvCache::ValueRow(int64_t seq, int64_t kv_head, int64_t row) const {
  return values_.get() + RowOffset(seq, kv_head, row);
}

int64_t KvCache::length(int64_t seq) const {
  if (seq < 0 || seq >= config_.n_sequences) return 0;
  return lengths_[static_cast<size_t>(seq)];
}

size_t KvCache::bytes() const {
  // Cannot overflow: Create checked this product.
  return static_cast<size_t>(config_.n_sequences * config_.capacity) *
         bytes_per_token();
}

size_t KvCache::bytes_per_token() const {
  return 2 * static_cast<size_t>(config_.n_kv_heads * row_stride_) *
         sizeof(float);
}

Status KvCache::Append(int64_t seq, MatrixView<const float> k,
                       MatrixView<const float> v) {
  constexpr const char* kFn = "KvCache::Append";
  Status status = CheckIndex(kFn, "seq", seq, config_.n_sequences);
  if (status.ok()) status = internal::CheckMatrix(kFn, "k", k);
  if (status.ok()) status = internal::CheckMatrix(kFn, "v", v);
  if (status.ok()) {
    status =
        internal::CheckSameShape(kFn, "k", k.rows, k.cols, "v", v.rows, v.cols);
  }
  if (!status.ok()) return status;
  const int64_t head_dim = config_.head_dim;
  const int64_t width = config_.n_kv_heads * head_dim;
  if (k.cols != width) {
    return Status::InvalidArgument(
        std::string(kFn) + ": k.cols (" + Str(k.cols) +
        ") must be n_kv_heads * head_dim (" + Str(config_.n_kv_heads) + " * " +
        Str(head_dim) + " = " + Str(width) + ")");
  }
  int64_t& length = lengths_[static_cast<size_t>(seq)];
  status = CheckFits(kFn, "k.rows", k.rows, seq, length, config_.capacity);
  if (!status.ok()) return status;

  // memmove, not memcpy: k or v may be read from this cache (rows other than
  // the ones written, but possibly the identical row of a no-op copy).
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t g = 0; g < config_.n_kv_heads; ++g) {
    // Destination rows of one head are contiguous: [k.rows, row_stride].
    float* key_rows = KeyRow(seq, g, length);
    float* value_rows = ValueRow(seq, g, length);
    for (int64_t r = 0; r < k.rows; ++r) {
      std::memmove(key_rows + r * row_stride_,
                   k.data + r * k.stride + g * head_dim, row_bytes);
      std::memmove(value_rows + r * row_stride_,
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
    return Status::InvalidArgument(std::string(kFn) + ": k is null");
  }
  if (v == nullptr) {
    return Status::InvalidArgument(std::string(kFn) + ": v is null");
  }
  if (k == v) {
    // The second view would overwrite the first.
    return Status::InvalidArgument(std::string(kFn) +
                                   ": k and v point to the same view");
  }
  Status status = CheckIndex(kFn, "seq", seq, config_.n_sequences);
  if (status.ok()) {
    status = CheckIndex(kFn, "kv_head", kv_head, config_.n_kv_heads);
  }
  if (status.ok()) status = CheckPositive(kFn, "n_new", n_new);
  if (!status.ok()) return status;
  const int64_t length = lengths_[static_cast<size_t>(seq)];
  status = CheckFits(kFn, "n_new", n_new, seq, length, config_.capacity);
  if (!status.ok()) return status;
  *k = MatrixView<float>(KeyRow(seq, kv_head, length), n_new, config_.head_dim,
                         row_stride_);
  *v = MatrixView<float>(ValueRow(seq, kv_head, length), n_new,
                         config_.head_dim, row_stride_);
  return Status::Ok();
}

Status KvCache::CommitAppend(int64_t seq, int64_t n_new) {
  constexpr const char* kFn = "KvCache::CommitAppend";
  Status status = CheckIndex(kFn, "seq", seq, config_.n_sequences);
  if (status.ok()) status = CheckPositive(kFn, "n_new", n_new);
  if (!status.ok()) return status;
  int64_t& length = lengths_[static_cast<size_t>(seq)];
  status = CheckFits(kFn, "n_new", n_new, seq, length, config_.capacity);
  if (!status.ok()) return status;
  length += n_new;
  return Status::Ok();
}

Status KvCache::Truncate(int64_t seq, int64_t new_length) {
  constexpr const char* kFn = "KvCache::Truncate";
  Status status = CheckIndex(kFn, "seq", seq, config_.n_sequences);
  if (!status.ok()) return status;
  int64_t& length = lengths_[static_cast<size_t>(seq)];
  if (new_length < 0 || new_length > length) {
    return Status::OutOfRange(std::string(kFn) + ": new_length (" +
                              Str(new_length) + ") is out of range [0, " +
                              Str(length) + "], the length of seq " + Str(seq));
  }
  length = new_length;
  return Status::Ok();
}

Status KvCache::CopySequence(int64_t from, int64_t to) {
  constexpr const char* kFn = "KvCache::CopySequence";
  Status status = CheckIndex(kFn, "from", from, config_.n_sequences);
  if (status.ok()) status = CheckIndex(kFn, "to", to, config_.n_sequences);
  if (!status.ok() || from == to) return status;
  const int64_t length = lengths_[static_cast<size_t>(from)];
  // The rows of one head are contiguous: one copy per head and buffer (the
  // padding copied along is zero on both sides).
  const size_t head_bytes =
      static_cast<size_t>(length * row_stride_) * sizeof(float);
  if (head_bytes != 0) {
    for (int64_t g = 0; g < config_.n_kv_heads; ++g) {
      std::memcpy(KeyRow(to, g, 0), KeyRow(from, g, 0), head_bytes);
      std::memcpy(ValueRow(to, g, 0), ValueRow(from, g, 0), head_bytes);
    }
  }
  lengths_[static_cast<size_t>(to)] = length;
  return Status::Ok();
}

Status KvCache::Reset(int64_t seq) {
  Status status = CheckIndex("KvCache::Reset", "seq", seq, config_.n_sequences);
  if (!status.ok()) return status;
  lengths_[static_cast<size_t>(seq)] = 0;
  return Status::Ok();
}

void KvCache::ResetAll() { std::fill(lengths_.begin(), lengths_.end(), 0); }

MatrixView<const float> KvCache::Keys(int64_t seq, int64_t kv_head) const {
  if (seq < 0 || seq >= config_.n_sequences || kv_head < 0 ||
      kv_head >= config_.n_kv_heads) {
    return MatrixView<const float>();
  }
  return MatrixView<const float>(KeyRow(seq, kv_head, 0),
                                 lengths_[static_cast<size_t>(seq)],
                                 config_.head_dim, row_stride_);
}

MatrixView<const float> KvCache::Values(int64_t seq, int64_t kv_head) const {
  if (seq < 0 || seq >= config_.n_sequences || kv_head < 0 ||
      kv_head >= config_.n_kv_heads) {
    return MatrixView<const float>();
  }
  return MatrixView<const float>(ValueRow(seq, kv_head, 0),
                                 lengths_[static_cast<size_t>(seq)],
                                 config_.head_dim, row_stride_);
}

MatrixView<const float> KvCache::KeyBuffer() const {
  if (config_.n_sequences == 0) return MatrixView<const float>();
  return MatrixView<const float>(
      keys_.get(), config_.n_sequences * config_.n_kv_heads * config_.capacity,
      row_stride_, row_stride_);
}

MatrixView<const float> KvCache::ValueBuffer() const {
  if (config_.n_sequences == 0) return MatrixView<const float>();
  return MatrixView<const float>(
      values_.get(),
      config_.n_sequences * config_.n_kv_heads * config_.capacity, row_stride_,
      row_stride_);
}

}  // namespace headway

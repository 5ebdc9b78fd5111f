// KvCache: argument checks, allocation, conversion of appended rows to the
// stored type (storage-inl.h's StoreRowVec, per target, dispatched once per
// head) and row copies (plain C++: the copies are memmove/memcpy of whole
// head rows, which the C library vectorizes).
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/kv_cache/kv_cache.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/core/storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// rows rows of cols floats (src_stride apart) into rows of T (dst_stride
// elements apart) and, for int8, scales[0, rows).
template <class T>
void StoreRowsOf(const float* src, int64_t src_stride, int64_t rows,
                 int64_t cols, void* dst, int64_t dst_stride, float* scales) {
  const hn::ScalableTag<float> d;
  T* out = static_cast<T*>(dst);
  float unused_scale = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    StoreRowVec(d, src + r * src_stride, static_cast<size_t>(cols),
                out + r * dst_stride,
                internal::kKvScaled<T> ? scales + r : &unused_scale);
  }
}

// One entry point per stored type (HWY_EXPORT takes no templates).
void StoreRowsBF16(const float* src, int64_t src_stride, int64_t rows,
                   int64_t cols, void* dst, int64_t dst_stride, float* scales) {
  StoreRowsOf<hwy::bfloat16_t>(src, src_stride, rows, cols, dst, dst_stride,
                               scales);
}
void StoreRowsF16(const float* src, int64_t src_stride, int64_t rows,
                  int64_t cols, void* dst, int64_t dst_stride, float* scales) {
  StoreRowsOf<hwy::float16_t>(src, src_stride, rows, cols, dst, dst_stride,
                              scales);
}
void StoreRowsI8(const float* src, int64_t src_stride, int64_t rows,
                 int64_t cols, void* dst, int64_t dst_stride, float* scales) {
  StoreRowsOf<int8_t>(src, src_stride, rows, cols, dst, dst_stride, scales);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "headway/kv_cache.h"
#include "lib/core/memory.h"
#include "lib/core/message.h"
#include "lib/core/storage.h"
#include "lib/core/validate.h"

namespace headway {
namespace {

// 64 bytes: a cache line, and one AVX-512 vector, so every row (row_stride is
// a multiple of 16 elements) starts on a vector boundary.
constexpr size_t kAlignment = 64;
constexpr int64_t kRowAlignElements = 16;
constexpr int64_t kScaleBytes = sizeof(float);

// The most positions a ring sequence may reach: 2^62, far from overflowing
// the position arithmetic (length + n_new, Slot).
constexpr int64_t kMaxRingLength = int64_t{1} << 62;

// n_new (>= 1) more tokens fit after `length` (<= capacity). Written as a
// subtraction so that a huge n_new cannot overflow.
Status CheckFits(const char* fn, const char* n_name, int64_t n_new, int64_t seq,
                 int64_t length, int64_t capacity) {
  if (n_new <= capacity - length) return Status::Ok();
  return internal::Fail(StatusCode::kOutOfRange, fn, "length (", length, ") + ",
                        n_name, " (", n_new, ") exceeds capacity (", capacity,
                        ") of seq ", seq);
}

// Ring mode: n_new (>= 1) more positions after `length` stay within
// kMaxRingLength.
Status CheckRingFits(const char* fn, const char* n_name, int64_t n_new,
                     int64_t seq, int64_t length) {
  if (n_new <= kMaxRingLength - length) return Status::Ok();
  return internal::Fail(StatusCode::kOutOfRange, fn, "length (", length, ") + ",
                        n_name, " (", n_new, ") exceeds 2^62 (", kMaxRingLength,
                        "), the most positions of a ring, in seq ", seq);
}

// The sizes of a checked config's buffers.
struct Sizes {
  int64_t row_stride = 0;   // head_dim rounded up to kRowAlignElements
  int64_t row_bytes = 0;    // row_stride * KvDtypeSize(dtype)
  int64_t rows = 0;         // n_sequences * n_kv_heads * capacity, per buffer
  int64_t data_bytes = 0;   // rows * row_bytes, per buffer (K or V)
  int64_t scale_bytes = 0;  // rows * 4 for int8, else 0, per buffer
  int64_t token_bytes = 0;  // 2 * n_kv_heads * (row_bytes + int8 scale)
};

// The sizes of a config with a known dtype. False if a product overflows:
// every one must fit in int64_t (row offsets and view sizes are int64_t), and
// the four buffers together must fit in ptrdiff_t, so that bytes() cannot
// wrap.
bool BufferSizes(const KvCacheConfig& config, Sizes* sizes) {
  int64_t rounded = 0, total = 0;
  if (!internal::CheckedAdd(config.head_dim, kRowAlignElements - 1, &rounded)) {
    return false;
  }
  sizes->row_stride = rounded / kRowAlignElements * kRowAlignElements;
  const int64_t scale = internal::KvDtypeScaled(config.dtype) ? kScaleBytes : 0;
  return internal::CheckedMul(
             sizes->row_stride,
             static_cast<int64_t>(internal::KvDtypeBytes(config.dtype)),
             &sizes->row_bytes) &&
         internal::CheckedProduct(
             {config.n_sequences, config.n_kv_heads, config.capacity},
             &sizes->rows) &&
         internal::CheckedMul(sizes->rows, sizes->row_bytes,
                              &sizes->data_bytes) &&
         internal::CheckedMul(sizes->rows, scale, &sizes->scale_bytes) &&
         internal::CheckedAdd(sizes->data_bytes, sizes->scale_bytes, &total) &&
         internal::CheckedMul(total, 2, &total) &&
         static_cast<uint64_t>(total) <=
             static_cast<uint64_t>(std::numeric_limits<ptrdiff_t>::max()) &&
         internal::CheckedProduct(
             {2, config.n_kv_heads, sizes->row_bytes + scale},
             &sizes->token_bytes);
}

// `bytes` zeroed bytes, kAlignment-aligned, in huge pages where large, first
// touched by the library's threads (AllocateLargeZeroed); null when out of
// memory (or for 0 bytes).
void* AllocateZeroed(size_t bytes) {
  static_assert(64 % kAlignment == 0, "alignment");
  return internal::AllocateLargeZeroed(bytes);
}

}  // namespace

struct KvCache::Impl {
  using Buffer = std::unique_ptr<void, internal::LargeFree>;  // AllocateZeroed

  // Rows from a buffer's start to row `row` of (seq, kv_head).
  int64_t RowIndex(int64_t seq, int64_t kv_head, int64_t row) const {
    return (seq * config.n_kv_heads + kv_head) * config.capacity + row;
  }
  char* Row(const Buffer& buffer, int64_t seq, int64_t kv_head,
            int64_t row) const {
    return static_cast<char*>(buffer.get()) +
           RowIndex(seq, kv_head, row) * sizes.row_bytes;
  }
  // Null unless int8.
  float* Scale(const Buffer& buffer, int64_t seq, int64_t kv_head,
               int64_t row) const {
    if (buffer == nullptr) return nullptr;
    return static_cast<float*>(buffer.get()) + RowIndex(seq, kv_head, row);
  }
  KvMutableView Rows(const Buffer& data, const Buffer& scales, int64_t seq,
                     int64_t kv_head, int64_t row, int64_t n) const {
    return KvMutableView{
        config.dtype,     Row(data, seq, kv_head, row),    n, config.head_dim,
        sizes.row_stride, Scale(scales, seq, kv_head, row)};
  }

  // Ring mode: the rows past the sinks, capacity - n_sink_tokens.
  int64_t RingRows() const { return config.capacity - config.n_sink_tokens; }
  // The row of position p (>= 0): kv_cache.h's Slot rule.
  int64_t Slot(int64_t p) const {
    if (!config.ring || p < config.n_sink_tokens) return p;
    return config.n_sink_tokens + (p - config.n_sink_tokens) % RingRows();
  }
  // Rows of a sequence that hold data: its length, at most capacity.
  int64_t HeldRows(int64_t seq) const {
    return std::min(lengths[static_cast<size_t>(seq)], config.capacity);
  }
  // Ring mode: length of seq becomes new_length (>= length); ring_begin
  // follows the positions the ring dropped.
  void Grow(int64_t seq, int64_t new_length) {
    const size_t i = static_cast<size_t>(seq);
    lengths[i] = new_length;
    if (config.ring) {
      ring_begins[i] = std::max(ring_begins[i], new_length - RingRows());
    }
  }

  KvCacheConfig config;
  Sizes sizes;
  int64_t head_stride = 0;  // capacity * row_stride
  // Each [n_sequences][n_kv_heads][capacity][row_stride] of the stored type.
  Buffer keys;
  Buffer values;
  // Each [n_sequences][n_kv_heads][capacity] for int8, else null.
  Buffer key_scales;
  Buffer value_scales;
  std::vector<int64_t> lengths;  // [n_sequences], positions appended
  // [n_sequences]: the oldest position held past the sinks; n_sink_tokens
  // while nothing was dropped (always 0 without ring).
  std::vector<int64_t> ring_begins;
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
  if (!internal::KvDtypeKnown(config.dtype)) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, "config.dtype (",
                          static_cast<int>(config.dtype),
                          ") is not a known KvDtype");
  }
  if (config.n_sink_tokens < 0) {
    return internal::Fail(StatusCode::kInvalidArgument, fn,
                          "config.n_sink_tokens must be >= 0 (got ",
                          config.n_sink_tokens, ")");
  }
  if (config.ring && config.n_sink_tokens >= config.capacity) {
    return internal::Fail(StatusCode::kInvalidArgument, fn,
                          "config.n_sink_tokens (", config.n_sink_tokens,
                          ") must be less than config.capacity (",
                          config.capacity, ") in ring mode");
  }
  if (!config.ring && config.n_sink_tokens != 0) {
    return internal::Fail(StatusCode::kInvalidArgument, fn,
                          "config.n_sink_tokens (", config.n_sink_tokens,
                          ") must be 0 without config.ring");
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
  Sizes sizes;
  if (!BufferSizes(config, &sizes)) {
    const bool scaled = internal::KvDtypeScaled(config.dtype);
    return internal::Fail(
        StatusCode::kResourceExhausted, kFn, "2 x n_sequences (",
        config.n_sequences, ") x n_kv_heads (", config.n_kv_heads,
        ") x capacity (", config.capacity, ") x ", scaled ? "(" : "",
        "head_dim (", config.head_dim, ") rounded up to 16 x ",
        internal::KvDtypeBytes(config.dtype), " bytes",
        scaled ? " + 4 bytes of scale)" : "", " overflows");
  }

  const size_t data_bytes = static_cast<size_t>(sizes.data_bytes);
  const size_t scale_bytes = static_cast<size_t>(sizes.scale_bytes);
  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>();
    impl->keys.reset(AllocateZeroed(data_bytes));
    impl->values.reset(AllocateZeroed(data_bytes));
    impl->key_scales.reset(AllocateZeroed(scale_bytes));
    impl->value_scales.reset(AllocateZeroed(scale_bytes));
    impl->lengths.assign(static_cast<size_t>(config.n_sequences), 0);
    impl->ring_begins.assign(static_cast<size_t>(config.n_sequences),
                             config.n_sink_tokens);
  } catch (const std::bad_alloc&) {
    impl.reset();
  }
  if (impl == nullptr || impl->keys == nullptr || impl->values == nullptr ||
      (scale_bytes != 0 &&
       (impl->key_scales == nullptr || impl->value_scales == nullptr))) {
    return internal::Fail(StatusCode::kResourceExhausted, kFn,
                          "out of memory for 2 x ", data_bytes + scale_bytes,
                          " bytes");
  }
  impl->config = config;
  impl->sizes = sizes;
  impl->head_stride = config.capacity * sizes.row_stride;  // fits: BufferSizes
  out->impl_ = std::move(impl);
  return Status::Ok();
}

size_t KvCache::BytesPerToken(const KvCacheConfig& config) {
  Sizes sizes;
  if (!CheckConfig("KvCache::BytesPerToken", config).ok() ||
      !BufferSizes(config, &sizes)) {
    return 0;
  }
  return static_cast<size_t>(sizes.token_bytes);
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
int64_t KvCache::row_stride() const {
  return impl_ ? impl_->sizes.row_stride : 0;
}
int64_t KvCache::head_stride() const { return impl_ ? impl_->head_stride : 0; }
int64_t KvCache::scale_head_stride() const {
  return impl_ && impl_->key_scales != nullptr ? impl_->config.capacity : 0;
}

int64_t KvCache::length(int64_t seq) const {
  if (seq < 0 || seq >= n_sequences()) return 0;
  return impl_->lengths[static_cast<size_t>(seq)];
}

int64_t KvCache::ring_begin(int64_t seq) const {
  if (seq < 0 || seq >= n_sequences()) return 0;
  return impl_->ring_begins[static_cast<size_t>(seq)];
}

int64_t KvCache::Slot(int64_t position) const {
  return impl_ ? impl_->Slot(position) : position;
}

int64_t KvCache::ContiguousRows(int64_t seq) const {
  if (seq < 0 || seq >= n_sequences()) return 0;
  const KvCacheConfig& config = impl_->config;
  const int64_t length = impl_->lengths[static_cast<size_t>(seq)];
  if (!config.ring || length < config.n_sink_tokens) {
    return config.capacity - length;
  }
  const int64_t ring_rows = impl_->RingRows();
  return ring_rows - (length - config.n_sink_tokens) % ring_rows;
}

size_t KvCache::bytes() const {
  if (!impl_) return 0;
  // Cannot overflow: Create checked this sum.
  return 2 * static_cast<size_t>(impl_->sizes.data_bytes +
                                 impl_->sizes.scale_bytes);
}

size_t KvCache::bytes_per_token() const {
  return impl_ ? static_cast<size_t>(impl_->sizes.token_bytes) : 0;
}

namespace {

HWY_EXPORT(StoreRowsBF16);
HWY_EXPORT(StoreRowsF16);
HWY_EXPORT(StoreRowsI8);

// The best target's StoreRows for stored type T.
auto StoreRowsFor(hwy::bfloat16_t /*tag*/) {
  return HWY_DYNAMIC_DISPATCH(StoreRowsBF16);
}
auto StoreRowsFor(hwy::float16_t /*tag*/) {
  return HWY_DYNAMIC_DISPATCH(StoreRowsF16);
}
auto StoreRowsFor(int8_t /*tag*/) { return HWY_DYNAMIC_DISPATCH(StoreRowsI8); }

// Converts columns [src_col, src_col + dst.cols) of src's rows into the rows
// of dst [src.rows, cols] offset by `offset` elements and `scale_offset`
// scales. For float32 a memmove per row: src may be another row of this cache
// (or the identical one).
template <class T>
void StoreHeadRows(MatrixView<const float> src, int64_t src_col,
                   const KvMutableView& dst, int64_t offset,
                   int64_t scale_offset) {
  T* rows = static_cast<T*>(dst.data) + offset;
  if constexpr (std::is_same_v<T, float>) {
    const size_t row_bytes = static_cast<size_t>(dst.cols) * sizeof(float);
    for (int64_t r = 0; r < src.rows; ++r) {
      std::memmove(rows + r * dst.stride, src.data + r * src.stride + src_col,
                   row_bytes);
    }
  } else {
    StoreRowsFor(T{})(
        src.data + src_col, src.stride, src.rows, dst.cols, rows, dst.stride,
        internal::kKvScaled<T> ? dst.scales + scale_offset : nullptr);
  }
}

}  // namespace

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
  const int64_t length = impl.lengths[static_cast<size_t>(seq)];
  status = impl.config.ring ? CheckRingFits(kFn, "k.rows", k.rows, seq, length)
                            : CheckFits(kFn, "k.rows", k.rows, seq, length,
                                        impl.config.capacity);
  if (!status.ok()) return status;

  // Source rows [src_row, src_row + n) into rows [row, row + n) of every head.
  const auto store = [&](int64_t src_row, int64_t n, int64_t row) {
    const MatrixView<const float> k_rows(k.data + src_row * k.stride, n, k.cols,
                                         k.stride);
    const MatrixView<const float> v_rows(v.data + src_row * v.stride, n, v.cols,
                                         v.stride);
    const KvMutableView key_rows =
        impl.Rows(impl.keys, impl.key_scales, seq, 0, row, n);
    const KvMutableView value_rows =
        impl.Rows(impl.values, impl.value_scales, seq, 0, row, n);
    internal::VisitKvDtype(impl.config.dtype, [&](auto tag) {
      using T = decltype(tag);
      for (int64_t g = 0; g < n_kv_heads; ++g) {
        const int64_t src_col = g * head_dim;
        StoreHeadRows<T>(k_rows, src_col, key_rows, g * impl.head_stride,
                         g * impl.config.capacity);
        StoreHeadRows<T>(v_rows, src_col, value_rows, g * impl.head_stride,
                         g * impl.config.capacity);
      }
    });
  };
  const int64_t new_length = length + k.rows;
  if (!impl.config.ring) {
    store(0, k.rows, length);
  } else {
    // The positions still held after the call, in at most three runs of
    // contiguous rows: new sinks, then the ring up to its end and from its
    // start. Positions the call itself overwrites are never written.
    const int64_t sinks = impl.config.n_sink_tokens;
    const int64_t sink_end = std::min(new_length, sinks);
    if (length < sink_end) store(0, sink_end - length, length);
    const int64_t first =
        std::max({length, sinks, new_length - impl.RingRows()});
    if (first < new_length) {
      const int64_t n = new_length - first, slot = impl.Slot(first);
      const int64_t to_end = std::min(n, impl.config.capacity - slot);
      store(first - length, to_end, slot);
      if (to_end < n) store(first - length + to_end, n - to_end, sinks);
    }
  }
  impl.Grow(seq, new_length);
  return Status::Ok();
}

Status KvCache::PendingRows(int64_t seq, int64_t kv_head, int64_t n_new,
                            KvMutableView* k, KvMutableView* v) {
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
  if (!impl.config.ring) {
    status = CheckFits(kFn, "n_new", n_new, seq, length, impl.config.capacity);
    if (!status.ok()) return status;
  } else if (n_new > ContiguousRows(seq)) {
    return internal::Fail(
        StatusCode::kOutOfRange, kFn, "n_new (", n_new,
        ") exceeds ContiguousRows(seq) (", ContiguousRows(seq), ") of seq ",
        seq, ", where its ring wraps: write ContiguousRows(seq) rows, ",
        "CommitAppend them, then the rest");
  }
  const int64_t row = impl.Slot(length);
  *k = impl.Rows(impl.keys, impl.key_scales, seq, kv_head, row, n_new);
  *v = impl.Rows(impl.values, impl.value_scales, seq, kv_head, row, n_new);
  return Status::Ok();
}

Status KvCache::CommitAppend(int64_t seq, int64_t n_new) {
  constexpr const char* kFn = "KvCache::CommitAppend";
  Status status = internal::CheckIndex(kFn, "seq", seq, n_sequences());
  if (status.ok()) status = internal::CheckPositive(kFn, "n_new", n_new);
  if (!status.ok()) return status;
  const int64_t length = impl_->lengths[static_cast<size_t>(seq)];
  status = impl_->config.ring
               ? CheckRingFits(kFn, "n_new", n_new, seq, length)
               : CheckFits(kFn, "n_new", n_new, seq, length, capacity());
  if (!status.ok()) return status;
  impl_->Grow(seq, length + n_new);
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
  // Once the ring dropped a position (ring_begin past the sinks), the
  // positions before ring_begin cannot come back.
  const int64_t ring_begin = impl_->ring_begins[static_cast<size_t>(seq)];
  if (ring_begin > impl_->config.n_sink_tokens && new_length < ring_begin) {
    return internal::Fail(StatusCode::kOutOfRange, kFn, "new_length (",
                          new_length, ") is before ring_begin (", ring_begin,
                          ") of seq ", seq,
                          ": rows before it were overwritten");
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
  // padding copied along is zero on both sides). A ring's rows in slot order,
  // stale ones included.
  const int64_t rows = impl.HeldRows(from);
  const size_t head_bytes = static_cast<size_t>(rows * impl.sizes.row_bytes);
  const size_t scale_bytes = static_cast<size_t>(rows) * sizeof(float);
  if (rows != 0) {
    for (int64_t g = 0; g < impl.config.n_kv_heads; ++g) {
      std::memcpy(impl.Row(impl.keys, to, g, 0),
                  impl.Row(impl.keys, from, g, 0), head_bytes);
      std::memcpy(impl.Row(impl.values, to, g, 0),
                  impl.Row(impl.values, from, g, 0), head_bytes);
      if (impl.key_scales != nullptr) {
        std::memcpy(impl.Scale(impl.key_scales, to, g, 0),
                    impl.Scale(impl.key_scales, from, g, 0), scale_bytes);
        std::memcpy(impl.Scale(impl.value_scales, to, g, 0),
                    impl.Scale(impl.value_scales, from, g, 0), scale_bytes);
      }
    }
  }
  impl.lengths[static_cast<size_t>(to)] = length;
  impl.ring_begins[static_cast<size_t>(to)] =
      impl.ring_begins[static_cast<size_t>(from)];
  return Status::Ok();
}

Status KvCache::Reset(int64_t seq) {
  Status status =
      internal::CheckIndex("KvCache::Reset", "seq", seq, n_sequences());
  if (!status.ok()) return status;
  impl_->lengths[static_cast<size_t>(seq)] = 0;
  impl_->ring_begins[static_cast<size_t>(seq)] = impl_->config.n_sink_tokens;
  return Status::Ok();
}

void KvCache::ResetAll() {
  if (!impl_) return;
  std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0);
  std::fill(impl_->ring_begins.begin(), impl_->ring_begins.end(),
            impl_->config.n_sink_tokens);
}

KvView KvCache::Keys(int64_t seq, int64_t kv_head) const {
  if (seq < 0 || seq >= n_sequences() || kv_head < 0 ||
      kv_head >= n_kv_heads()) {
    return KvView();
  }
  return impl_->Rows(impl_->keys, impl_->key_scales, seq, kv_head, 0,
                     impl_->HeldRows(seq));
}

KvView KvCache::Values(int64_t seq, int64_t kv_head) const {
  if (seq < 0 || seq >= n_sequences() || kv_head < 0 ||
      kv_head >= n_kv_heads()) {
    return KvView();
  }
  return impl_->Rows(impl_->values, impl_->value_scales, seq, kv_head, 0,
                     impl_->HeldRows(seq));
}

KvView KvCache::KeyBuffer() const {
  if (!impl_) return KvView();
  KvView view =
      impl_->Rows(impl_->keys, impl_->key_scales, 0, 0, 0, impl_->sizes.rows);
  view.cols = impl_->sizes.row_stride;
  return view;
}

KvView KvCache::ValueBuffer() const {
  if (!impl_) return KvView();
  KvView view = impl_->Rows(impl_->values, impl_->value_scales, 0, 0, 0,
                            impl_->sizes.rows);
  view.cols = impl_->sizes.row_stride;
  return view;
}

size_t KvDtypeSize(KvDtype dtype) { return internal::KvDtypeBytes(dtype); }

namespace {

// A stored view as StoreKvRows and LoadKvRows take it: a known dtype, data
// not null, rows >= 0, cols >= 1, stride >= cols, scales given exactly for
// int8, a byte span that fits.
Status CheckKvView(const char* fn, const char* name, const KvView& view) {
  if (!internal::KvDtypeKnown(view.dtype)) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name, ".dtype (",
                          static_cast<int>(view.dtype),
                          ") is not a known KvDtype");
  }
  if (view.rows < 0) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name, ".rows (",
                          view.rows, ") is negative");
  }
  // One row stands for zero rows: the checks of data, cols and stride hold.
  Status status = internal::CheckMatrix(
      fn, name, view.data, std::max<int64_t>(view.rows, 1), view.cols,
      view.stride, internal::KvDtypeBytes(view.dtype));
  if (!status.ok()) return status;
  const bool scaled = internal::KvDtypeScaled(view.dtype);
  if (scaled && view.scales == nullptr) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".scales is null for dtype int8");
  }
  if (!scaled && view.scales != nullptr) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".scales is not null for dtype ",
                          internal::KvDtypeName(view.dtype));
  }
  return Status::Ok();
}

// A float view with rows >= 0 (checked as CheckMatrix otherwise).
Status CheckFloatView(const char* fn, const char* name, const void* data,
                      int64_t rows, int64_t cols, int64_t stride) {
  if (rows < 0) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name, ".rows (",
                          rows, ") is negative");
  }
  return internal::CheckMatrix(fn, name, data, std::max<int64_t>(rows, 1), cols,
                               stride, sizeof(float));
}

// The checks StoreKvRows and LoadKvRows share: both views, their shapes, and
// the float view disjoint from the stored one's elements and scales (a float32
// view identical to the stored one is allowed: in place).
Status CheckKvTransfer(const char* fn, const char* float_name,
                       const float* data, int64_t rows, int64_t cols,
                       int64_t stride, const char* kv_name, const KvView& kv) {
  Status status = CheckFloatView(fn, float_name, data, rows, cols, stride);
  if (status.ok()) status = CheckKvView(fn, kv_name, kv);
  if (status.ok()) {
    status = internal::CheckSameShape(fn, float_name, rows, cols, kv_name,
                                      kv.rows, kv.cols);
  }
  if (!status.ok() || rows == 0) return status;
  const MatrixView<const float> floats(data, rows, cols, stride);
  const bool in_place =
      kv.dtype == KvDtype::kFloat32 && kv.data == data && kv.stride == stride;
  if (!in_place) {
    status = internal::CheckDisjoint(fn, internal::SpanOf(kv), kv_name,
                                     internal::SpanOf(floats), float_name);
  }
  if (status.ok()) {
    status = internal::CheckDisjoint(fn, internal::ScaleSpanOf(kv),
                                     internal::Cat(kv_name, ".scales"),
                                     internal::SpanOf(floats), float_name);
  }
  return status;
}

}  // namespace

Status StoreKvRows(MatrixView<const float> src, const KvMutableView& dst) {
  Status status = CheckKvTransfer("StoreKvRows", "src", src.data, src.rows,
                                  src.cols, src.stride, "dst", dst);
  if (!status.ok() || src.rows == 0) return status;
  internal::VisitKvDtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    StoreHeadRows<T>(src, 0, dst, 0, 0);
  });
  return Status::Ok();
}

Status LoadKvRows(const KvView& src, MatrixView<float> dst) {
  Status status = CheckKvTransfer("LoadKvRows", "dst", dst.data, dst.rows,
                                  dst.cols, dst.stride, "src", src);
  if (!status.ok() || dst.rows == 0) return status;
  internal::VisitKvDtype(src.dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t cols = static_cast<size_t>(src.cols);
    for (int64_t r = 0; r < src.rows; ++r) {
      const T* row = static_cast<const T*>(src.data) + r * src.stride;
      float* out = dst.data + r * dst.stride;
      if constexpr (std::is_same_v<T, float>) {
        std::memmove(out, row, cols * sizeof(float));
      } else {
        internal::LoadRow<T>(
            row, cols, internal::kKvScaled<T> ? src.scales[r] : 1.0f, out);
      }
    }
  });
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

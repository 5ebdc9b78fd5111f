// KvCache: the keys and values of one attention layer for several sequences,
// kept between calls so that generating a token only computes that token's K
// and V.
//
// Layout: K and V in two separate buffers, each
// [sequence][kv_head][capacity][row_stride] elements, 64-byte aligned,
// row_stride = head_dim rounded up to 16 floats (64 bytes). The rows of one
// (sequence, kv_head) are contiguous, so a decode step streams each head's keys
// and values from memory in one pass. The element type is part of the config
// (float32, the one KvDtype); row_stride(), head_stride() and
// bytes_per_token() are the one home of the strides and sizes it sets.
//
// Padding: columns [head_dim, row_stride) of every row are zero, always
// (Create zero-fills both buffers and KvCache never writes past head_dim), so
// a SIMD kernel may load whole padded rows: the padding adds 0 * q to a dot
// product, never garbage or NaN.
//
// Views returned by Keys, Values and PendingRows point into the cache: they
// stay valid until the cache is destroyed, moved from or replaced by Create,
// whatever is appended or truncated meanwhile.
//
// Threads: const methods may run concurrently. Calls that change one sequence
// (Append, PendingRows and its writes, CommitAppend, Truncate, Reset,
// CopySequence's `to`) may run concurrently with calls on other sequences, not
// with calls on the same one; ResetAll needs the cache to itself.
#ifndef HEADWAY_KV_CACHE_H_
#define HEADWAY_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "headway/export.h"
#include "headway/status.h"
#include "headway/view.h"

namespace headway {

// The element type of stored K and V (lib/core/storage.h has the rounding).
enum class KvDtype : int {
  kFloat32 = 0,   // 4 bytes
  kBFloat16 = 1,  // 2 bytes, round to nearest even
  kFloat16 = 2,   // 2 bytes (IEEE half), round to nearest even
  kInt8 = 3,      // 1 byte, plus one float scale per (token, KV head) row
};

struct KvCacheConfig {
  int64_t n_sequences = 1;  // sequence slots, 0 .. n_sequences - 1
  int64_t n_kv_heads = 1;   // K/V heads (n_heads for MHA, 1 for MQA)
  int64_t head_dim = 0;     // elements per head
  int64_t capacity = 0;     // tokens per sequence
  KvDtype dtype = KvDtype::kFloat32;
};

// ABI: KvCache and AttentionLayer keep their state behind a pointer to an
// Impl, so that they can grow (a dtype, scales) without changing their size or
// layout for a host compiled against an older header.
class HEADWAY_API KvCache {
 public:
  // Allocates a cache (all sequences empty, every element 0) into *out,
  // replacing what it held. Cost: writes bytes() bytes once, which also commits
  // the memory up front (the first decode steps take no page faults).
  // Errors (*out unchanged): kInvalidArgument for a null out, any size < 1, an
  // unknown dtype; kResourceExhausted for a byte count that overflows
  // (n_sequences * n_kv_heads * capacity * row_stride * sizeof(element), times
  // 2 for K and V), or no memory.
  static Status Create(const KvCacheConfig& config, KvCache* out);

  // Bytes one token of one sequence takes in a cache of this config (as
  // bytes_per_token()); 0 for a config Create rejects.
  static size_t BytesPerToken(const KvCacheConfig& config);

  KvCache();  // empty: n_sequences() == 0, bytes() == 0, every seq is bad
  ~KvCache();
  KvCache(KvCache&& other) noexcept;             // leaves other empty
  KvCache& operator=(KvCache&& other) noexcept;  // leaves other empty
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // The config Create was given; all zeros for an empty cache. (Accessors are
  // out of line: callers read them once per call, never per element.)
  const KvCacheConfig& config() const;
  int64_t n_sequences() const;
  int64_t n_kv_heads() const;
  int64_t head_dim() const;
  int64_t capacity() const;

  // Geometry of both buffers, in elements: the one place the layout's strides
  // are defined.
  // From one row of a head to the next: head_dim rounded up to 16.
  int64_t row_stride() const;
  // From one KV head's rows to the next head's of the same sequence:
  // capacity * row_stride, so Keys(seq, g).data == Keys(seq, 0).data +
  // g * head_stride() (likewise Values and PendingRows).
  int64_t head_stride() const;

  // Tokens cached for sequence seq (0 for a bad seq).
  int64_t length(int64_t seq) const;

  // Bytes of the K and V buffers together, padding included.
  size_t bytes() const;
  // Bytes one token of one sequence takes:
  // 2 * n_kv_heads * row_stride * sizeof(element).
  size_t bytes_per_token() const;

  // Appends n_new tokens to sequence seq: k and v are [n_new, n_kv_heads *
  // head_dim] (head g in columns [g * head_dim, (g + 1) * head_dim)), any
  // stride >= cols. Only columns [0, head_dim) of the cache rows are written.
  // k and v may point into this cache (Keys/Values of another sequence, say),
  // but not into the rows being written. (A view constructed with stride 0 is
  // dense: view.h.)
  // Errors (cache unchanged): kInvalidArgument for a bad seq, a bad view (null
  // data, rows or cols < 1, stride < cols), k and v of different shapes,
  // cols != n_kv_heads * head_dim; kOutOfRange if length + n_new > capacity;
  // kResourceExhausted for a view whose byte span overflows.
  Status Append(int64_t seq, MatrixView<const float> k,
                MatrixView<const float> v);

  // Direct writes, for a producer that computes K and V straight into the
  // cache (the layer's QKV projection): rows [length, length + n_new) of head
  // kv_head, [n_new, head_dim], stride row_stride(). Writing them does not
  // change the length; CommitAppend does. Write columns [0, head_dim) only:
  // the padding must stay zero. Until written, the rows hold zeros or tokens
  // dropped by an earlier Truncate or Reset.
  // Errors (*k, *v and the cache unchanged): kInvalidArgument for a null k or
  // v, a bad seq or kv_head, n_new < 1; kOutOfRange if length + n_new >
  // capacity.
  Status PendingRows(int64_t seq, int64_t kv_head, int64_t n_new,
                     MatrixView<float>* k, MatrixView<float>* v);
  // Makes n_new rows written through PendingRows part of the sequence:
  // length += n_new for every kv_head at once (write all heads' rows first).
  // Errors (cache unchanged): kInvalidArgument for a bad seq or n_new < 1;
  // kOutOfRange if length + n_new > capacity.
  Status CommitAppend(int64_t seq, int64_t n_new);

  // Keeps the first new_length tokens (rolls back rejected speculative
  // tokens). O(1): the rows past new_length are not cleared.
  // Errors (cache unchanged): kInvalidArgument for a bad seq; kOutOfRange if
  // new_length < 0 or > length.
  Status Truncate(int64_t seq, int64_t new_length);

  // Makes sequence `to` a copy of sequence `from` (its length and rows): forks
  // a shared prompt for beam search or parallel sampling. from == to is a
  // no-op. Cost: copies length(from) rows of every head, K and V.
  // Errors (cache unchanged): kInvalidArgument for a bad from or to.
  Status CopySequence(int64_t from, int64_t to);

  // Empties sequence seq (length 0; O(1), the rows are not cleared).
  // Error (cache unchanged): kInvalidArgument for a bad seq.
  Status Reset(int64_t seq);
  // Empties every sequence.
  void ResetAll();

  // The cached rows of one head, [length, head_dim] with stride row_stride(),
  // data 64-byte aligned; 0 rows (data not null) for an empty sequence; empty
  // (null data, 0 rows, 0 cols) for a bad seq or kv_head.
  MatrixView<const float> Keys(int64_t seq, int64_t kv_head) const;
  MatrixView<const float> Values(int64_t seq, int64_t kv_head) const;

  // The whole K (or V) buffer, padding included: [n_sequences * n_kv_heads *
  // capacity, row_stride], data 64-byte aligned, bytes() / 2 bytes; empty for
  // an empty cache. For base addresses and overlap checks: unlike Keys and
  // Values it reads no sequence's length, so it may run while other threads
  // change any sequence.
  MatrixView<const float> KeyBuffer() const;
  MatrixView<const float> ValueBuffer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace headway

#endif  // HEADWAY_KV_CACHE_H_

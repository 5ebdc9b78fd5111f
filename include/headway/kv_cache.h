// KvCache: the keys and values of one attention layer for several sequences,
// kept between calls so that generating a token only computes that token's K
// and V.
//
// Stored types (config.dtype): float32, bfloat16, float16 or int8 with one
// float scale per row. Append converts float rows to the stored type with the
// one rounding rule of each (lib/core/storage.h):
//
//   kFloat32   float                as is
//   kBFloat16  bfloat16             round to nearest even; NaN stays a quiet
//                                   NaN, +-inf stays +-inf
//   kFloat16   IEEE half            round to nearest even: |x| >= 65520
//                                   becomes +-inf, below 2^-14 subnormal
//   kInt8      int8 + one float     symmetric per row: scale = max|x| / 127,
//              scale per row        q = round-to-even(x / scale) in
//                                   [-127, 127], x' = scale * q, so
//                                   |x - x'| <= scale / 2 (to float rounding);
//                                   a row with max|x| < 127 * FLT_MIN
//                                   (1.5e-36, all-zero rows included) has
//                                   scale 0 and q = 0 (a subnormal scale
//                                   would lose that bound); near FLT_MAX the
//                                   scale is one ulp lower where 127 * scale
//                                   would overflow, so x' stays finite; a row
//                                   with a NaN or inf has scale NaN and q = 0
//                                   (every element reads back as NaN)
//
// NaN and inf are stored, never an error; they change only their own element
// (int8: their own row of one token and KV head).
//
// Layout: K and V in two separate buffers, each
// [sequence][kv_head][capacity][row_stride] elements of the stored type,
// 64-byte aligned, row_stride = head_dim rounded up to 16 elements for every
// dtype, so every row is aligned to 16 elements (64 bytes for float32, 32 for
// bf16 and f16, 16 for int8) and a vector of up to 16 floats always comes
// from one aligned load of the stored type.
// int8 adds two float scale buffers, each [sequence][kv_head][capacity]
// (scale_head_stride() = capacity). The rows of one (sequence, kv_head) are
// contiguous, so a decode step streams each head's keys and values from memory
// in one pass. row_stride(), head_stride(), scale_head_stride() and
// bytes_per_token() are the one home of the strides and sizes.
//
// Padding: columns [head_dim, row_stride) of every row are zero (all bits
// zero, for every dtype), always (Create zero-fills the buffers and KvCache
// never writes past head_dim), so a SIMD kernel may load whole padded rows:
// the padding adds 0 * q to a dot product, never garbage or NaN.
//
// Reading the rows (a host that inspects or serializes the cache): Keys and
// Values give a KvView of the stored elements and, for int8, their scales;
// LoadKvRows converts a KvView to floats (scale * q for int8). To save the
// exact stored bits, copy rows * row_stride * KvDtypeSize bytes from data
// and, for int8, rows floats from scales; to restore them, copy them into
// PendingRows' views of an empty sequence and CommitAppend.
//
// Writing rows directly (a producer that computes K and V into the cache):
// PendingRows gives a KvMutableView; StoreKvRows converts float rows into it
// with Append's rounding, or the producer writes the stored type itself (and,
// for int8, one scale per row) following the table above.
//
// Views returned by Keys, Values and PendingRows point into the cache: they
// stay valid until the cache is destroyed, moved from or replaced by Create,
// whatever is appended or truncated meanwhile.
//
// Ring mode (config.ring, for sliding-window attention): the capacity rows of
// a sequence become a ring, so that a sequence can grow without end while the
// cache holds its last capacity - n_sink_tokens positions (a window of W keys
// needs capacity >= W + n_sink_tokens). length(seq) counts positions (it may
// exceed capacity); position p lives in row Slot(p):
//   p < n_sink_tokens:  p                      (pinned: StreamingLLM's sinks)
//   otherwise:          n_sink_tokens + (p - n_sink_tokens) mod
//                       (capacity - n_sink_tokens)
// so appending position p overwrites position p - (capacity - n_sink_tokens).
// The positions held are [0, min(length, n_sink_tokens)) and
// [ring_begin(seq), length). Append keeps the last rows of a call longer than
// the ring; Truncate rolls back to any length >= ring_begin (a row that was
// overwritten cannot come back); CopySequence copies the held rows and
// ring_begin; Reset empties the ring. Keys and Values give the rows in slot
// order ([min(length, capacity)] rows; a row that holds no position is stale
// data); PendingRows gives the rows of positions [length, length + n_new),
// which must not wrap: at most ContiguousRows(seq) at once. bytes() is the
// capacity rows: W + n_sink_tokens rows per sequence for a window of W.
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

// Bytes per element of dtype: 4, 2, 2, 1; 0 for an unknown dtype.
HEADWAY_API size_t KvDtypeSize(KvDtype dtype);

// Rows of stored K or V (one KV head's, or a whole buffer) in their stored
// type. Element (r, c) is at (const char*)data + (r * stride + c) *
// KvDtypeSize(dtype); for kInt8 it stands for scales[r] * q, other dtypes
// have scales == nullptr.
struct KvView {
  KvDtype dtype = KvDtype::kFloat32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;             // elements from one row to the next, >= cols
  const float* scales = nullptr;  // [rows] for kInt8, else null
};

// The same, writable (PendingRows).
struct KvMutableView {
  KvDtype dtype = KvDtype::kFloat32;
  void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  float* scales = nullptr;   // [rows] for kInt8, else null
  operator KvView() const {  // NOLINT: implicit by design, as MatrixView's
    return KvView{dtype, data, rows, cols, stride, scales};
  }
};

// Converts src [rows, cols] to dst's stored type (the table at the top): each
// row of dst and, for kInt8, its scale. Rows == 0 on both sides does nothing.
// Errors (dst unchanged): kInvalidArgument for an unknown dst.dtype, a bad
// view (null data, cols < 1, rows < 0, stride < cols), null dst.scales for
// kInt8 or non-null for another dtype, shapes that differ, src overlapping
// dst's elements or scales; kResourceExhausted for a byte span that overflows.
HEADWAY_API Status StoreKvRows(MatrixView<const float> src,
                               const KvMutableView& dst);

// Reads src back as floats into dst [rows, cols] (scale * q for kInt8).
// Errors (dst unchanged): as StoreKvRows with the roles swapped.
HEADWAY_API Status LoadKvRows(const KvView& src, MatrixView<float> dst);

struct KvCacheConfig {
  int64_t n_sequences = 1;  // sequence slots, 0 .. n_sequences - 1
  int64_t n_kv_heads = 1;   // K/V heads (n_heads for MHA, 1 for MQA)
  int64_t head_dim = 0;     // elements per head
  int64_t capacity = 0;     // rows per sequence (tokens, unless ring)
  KvDtype dtype = KvDtype::kFloat32;
  // Ring mode (see Ring mode above): the rows are a ring over the positions;
  // false: position p is row p and length <= capacity.
  bool ring = false;
  // Ring mode: positions [0, n_sink_tokens) keep their rows forever; in [0,
  // capacity). Must be 0 without ring.
  int64_t n_sink_tokens = 0;
};

// ABI: KvCache and AttentionLayer keep their state behind a pointer to an
// Impl, so that they can grow (a dtype, scales) without changing their size or
// layout for a host compiled against an older header.
class HEADWAY_API KvCache {
 public:
  // Allocates a cache (all sequences empty, every element 0) into *out,
  // replacing what it held. Cost: writes bytes() bytes once, which also commits
  // the memory up front (the first decode steps take no page faults); from 4
  // MiB up the threads of the calling arena write it, each a contiguous share,
  // so that on a NUMA machine its pages spread over their nodes (a 256 MiB
  // cache: 20 ms on one thread, 11 ms on two). From 4 MiB up the buffers are
  // advised as transparent huge pages (Linux), which decode reads 10-20%
  // faster; where the kernel gives none they are 4 KiB.
  // Errors (*out unchanged): kInvalidArgument for a null out, any size < 1, an
  // unknown dtype, n_sink_tokens < 0, n_sink_tokens >= capacity with ring,
  // n_sink_tokens != 0 without ring; kResourceExhausted for a byte count that
  // overflows (n_sequences * n_kv_heads * capacity * (row_stride *
  // KvDtypeSize(dtype) + 4 for an int8 scale), times 2 for K and V), or no
  // memory.
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

  // Geometry of both buffers, in elements of the stored type: the one place
  // the layout's strides are defined.
  // From one row of a head to the next: head_dim rounded up to 16.
  int64_t row_stride() const;
  // From one KV head's rows to the next head's of the same sequence:
  // capacity * row_stride, so Keys(seq, g).data == Keys(seq, 0).data +
  // g * head_stride() elements (likewise Values and PendingRows).
  int64_t head_stride() const;
  // Floats from one KV head's scales to the next head's of the same sequence:
  // capacity for kInt8 (Keys(seq, g).scales == Keys(seq, 0).scales + g *
  // scale_head_stride()), else 0.
  int64_t scale_head_stride() const;

  // Tokens cached for sequence seq (0 for a bad seq); in ring mode the
  // positions appended, held or not.
  int64_t length(int64_t seq) const;
  // The oldest position held past the sinks: positions [ring_begin(seq),
  // length(seq)) are held (with [0, min(length, n_sink_tokens)) in ring mode).
  // 0 without ring; n_sink_tokens for an empty ring; 0 for a bad seq.
  int64_t ring_begin(int64_t seq) const;
  // The row of position p (>= 0): p without ring, the ring's Slot rule (Ring
  // mode above) with it; the one home of that rule.
  int64_t Slot(int64_t position) const;
  // Rows PendingRows can give sequence seq at once: capacity - length without
  // ring, the rows up to the ring's end (where it wraps) with it; 0 for a bad
  // seq.
  int64_t ContiguousRows(int64_t seq) const;

  // Bytes of the K and V buffers together, padding and int8 scales included.
  size_t bytes() const;
  // Bytes one token of one sequence takes: 2 * n_kv_heads * (row_stride *
  // KvDtypeSize(dtype) + 4 for an int8 scale).
  size_t bytes_per_token() const;

  // Appends n_new tokens to sequence seq: k and v are [n_new, n_kv_heads *
  // head_dim] (head g in columns [g * head_dim, (g + 1) * head_dim)), any
  // stride >= cols, converted to the stored type (the table at the top). Only
  // columns [0, head_dim) of the cache rows (and their int8 scales) are
  // written. k and v may point into a float32 cache (Keys/Values of another
  // sequence, say), but not into the rows being written. (A view constructed
  // with stride 0 is dense: view.h.) Ring mode: any n_new; only the positions
  // still held afterwards are written (the sinks among them, and the last
  // capacity - n_sink_tokens), each in row Slot(p).
  // Errors (cache unchanged): kInvalidArgument for a bad seq, a bad view (null
  // data, rows or cols < 1, stride < cols), k and v of different shapes,
  // cols != n_kv_heads * head_dim; kOutOfRange if length + n_new > capacity
  // (ring mode: > 2^62); kResourceExhausted for a view whose byte span
  // overflows.
  Status Append(int64_t seq, MatrixView<const float> k,
                MatrixView<const float> v);

  // Direct writes, for a producer that computes K and V straight into the
  // cache (the layer's QKV projection): rows [length, length + n_new) of head
  // kv_head, [n_new, head_dim] of the stored type, stride row_stride(), and
  // for kInt8 their n_new scales. Write them with StoreKvRows or with the
  // rounding of the table at the top. Writing them does not change the
  // length; CommitAppend does. Write columns [0, head_dim) only: the padding
  // must stay zero. Until written, the rows hold zeros or tokens dropped by an
  // earlier Truncate or Reset (ring mode: or overwritten). Ring mode: the rows
  // of positions [length, length + n_new), from row Slot(length).
  // Errors (*k, *v and the cache unchanged): kInvalidArgument for a null k or
  // v, a bad seq or kv_head, n_new < 1; kOutOfRange if n_new >
  // ContiguousRows(seq) (without ring: length + n_new > capacity; with it:
  // the rows would wrap, so write ContiguousRows(seq) rows, CommitAppend
  // them, then the rest).
  Status PendingRows(int64_t seq, int64_t kv_head, int64_t n_new,
                     KvMutableView* k, KvMutableView* v);
  // Makes n_new rows written through PendingRows part of the sequence:
  // length += n_new for every kv_head at once (write all heads' rows first);
  // ring mode: ring_begin follows, to length - (capacity - n_sink_tokens) if
  // that is later.
  // Errors (cache unchanged): kInvalidArgument for a bad seq or n_new < 1;
  // kOutOfRange if length + n_new > capacity (ring mode: > 2^62).
  Status CommitAppend(int64_t seq, int64_t n_new);

  // Keeps the first new_length tokens (rolls back rejected speculative
  // tokens). O(1): the rows past new_length are not cleared. Ring mode:
  // ring_begin stays.
  // Errors (cache unchanged): kInvalidArgument for a bad seq; kOutOfRange if
  // new_length < 0 or > length, or, once the ring has dropped a position
  // (ring_begin > n_sink_tokens), new_length < ring_begin.
  Status Truncate(int64_t seq, int64_t new_length);

  // Makes sequence `to` a copy of sequence `from` (its length, ring_begin and
  // rows): forks a shared prompt for beam search or parallel sampling. from ==
  // to is a no-op. Cost: copies min(length(from), capacity) rows of every
  // head, K and V, and their int8 scales.
  // Errors (cache unchanged): kInvalidArgument for a bad from or to.
  Status CopySequence(int64_t from, int64_t to);

  // Empties sequence seq (length 0, ring_begin n_sink_tokens; O(1), the rows
  // are not cleared).
  // Error (cache unchanged): kInvalidArgument for a bad seq.
  Status Reset(int64_t seq);
  // Empties every sequence.
  void ResetAll();

  // The cached rows of one head, [length, head_dim] with stride row_stride(),
  // data aligned to 16 elements (the rows' alignment: see Layout), dtype
  // config().dtype, scales [length] for kInt8; 0
  // rows (data and int8 scales not null) for an empty sequence; empty (null
  // data and scales, 0 rows, 0 cols) for a bad seq or kv_head. Ring mode:
  // min(length, capacity) rows in slot order (position p in row Slot(p)).
  KvView Keys(int64_t seq, int64_t kv_head) const;
  KvView Values(int64_t seq, int64_t kv_head) const;

  // The whole K (or V) buffer, padding included: [n_sequences * n_kv_heads *
  // capacity, row_stride], data 64-byte aligned, scales the whole scale
  // buffer [n_sequences * n_kv_heads * capacity] for kInt8; empty for an
  // empty cache. For base addresses and overlap checks: unlike Keys and
  // Values it reads no sequence's length, so it may run while other threads
  // change any sequence.
  KvView KeyBuffer() const;
  KvView ValueBuffer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace headway

#endif  // HEADWAY_KV_CACHE_H_

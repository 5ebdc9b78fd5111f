// Attention core: the per-target kernels (fused flash attention and the
// materialised path).
//
// Two tile kernels share one online softmax (Milakov & Gimelshein 2018; Dao et
// al. 2022), OnlineSoftmaxStep:
//
// - Lanes along queries ("wide"), when a tile has at least one vector of query
//   rows (prefill, and decode of MQA and large GQA groups). A tile holds R
//   query rows: the G heads of one KV head for nt consecutive tokens, lane
//   r = t * G + h. Everything is kept transposed so that the queries run along
//   the lanes (RP = R rounded up to a vector):
//     QT [d, RP]   scale * q, loaded once per tile
//     ST [bk, RP]  scores of a key block: ST[s] += K[s, p] * QT[p]
//     OT [d, RP]   output: OT[p] = OT[p] * alpha + sum_s V[s, p] * PT[s]
//   Both products are the same register-blocked outer-product kernel
//   (OuterProduct, outer_product-inl.h), the softmax's max and sum run down the
//   columns (no horizontal reductions) and the rescaling factor alpha is one
//   vector per lane group. K and V are read in their cache layout, as float
//   rows: a narrower stored type is converted once per key block for the
//   group's 4 tiles (KvRows::Block).
// - Lanes along head_dim ("narrow"), when the tile has fewer query rows than
//   lanes (decode of MHA and small GQA groups): scores are dot products of q
//   rows with K rows (vectors along d), and O rows accumulate V rows
//   (ScoreRows, AccumulateRows: decode.h), on the stored rows converted on
//   the fly. Decode is bound by reading K and V, which this streams once.
//
// Every path is a template on the stored type T of K and V (float, bf16, f16,
// int8 with a float scale per row) and accumulates in float32; the entry
// points switch on the cache's KvDtype once per call (VisitKvDtype).
//
// One home per rule, which every path asks: VisibleKeys (which keys a query
// sees: causal, sliding window), ScoreRules (with which bias: soft-capping and
// ALiBi), MaskedScore (the additive mask), KvRows (how stored K and V rows are
// read), OnlineSoftmaxStep (the softmax update), RowNormalizer and MergedRow
// (the result of a row, with the sink logits in its denominator; zeros for a
// row that saw no key).
//
// Work items are (sequence, KV head, group of up to 4 consecutive query tiles,
// key chunk); a group runs key block by key block over all its tiles, so that
// each K and V block is fetched once for 4 tiles. The tile, group and chunk
// sizes depend on the shapes (and the vector width) only, chunks are merged by
// log-sum-exp in a fixed order, so results are bit-identical for any number of
// threads.

// Non-SIMD part: normal include guard.
#ifndef HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_PLAN_
#define HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_PLAN_

#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "lib/attention/attention_call.h"
#include "lib/core/blocks.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace headway {

// Keys per block: 128 is better than 64 (causal prefill 5-15% faster: half the
// per-block softmax and rescaling work). A tile's block of scores is 128 x 32
// floats = 16 KiB on AVX-512.
inline constexpr int64_t kAttentionKeyBlock = 128;
// Chunking aims at this many work items in a call, so that up to 64 threads
// have work however few (sequence, KV head) pairs there are (it depends on
// shapes only, never on threads).
inline constexpr int64_t kAttentionMinItems = 64;
// A wide work item runs up to this many consecutive query tiles of one KV head
// (128 query rows on AVX-512) over each key block in turn, so that a K and V
// block (128 KiB at head_dim 128) comes from memory once per 4 tiles: with one
// tile per item, MHA prefill at 2048 tokens waits on memory.
inline constexpr int64_t kAttentionGroupTiles = 4;
// A chunk has at least this many keys: shorter ones cost more in merging than
// they gain.
inline constexpr int64_t kAttentionMinChunk = 512;
// Query rows per wide tile on bf16 pairs (WidePairProducts): one 32 x 32 AMX
// C block's columns, two vectors of vdpbf16ps sums.
inline constexpr int64_t kAttentionPairRows = 32;

// Key positions [begin, end).
struct KeyRange {
  int64_t begin;
  int64_t end;
  // Whether [first, last_end) lies inside this range.
  bool Contains(int64_t first, int64_t last_end) const {
    return begin <= first && last_end <= end;
  }
};

// The keys of segment `work` that its query token t (at position p = q_pos0 +
// t) sees before the additive mask: the one home of the causal rule (keys <=
// p), of the sliding window (keys > p - window) and of the sink tokens (a
// segment that is not windowed). Within [key_begin, kv_len); both ends are
// nondecreasing in t and the ranges of consecutive tokens overlap or touch,
// which KeysSeenByAny and KeysSeenByAll rely on.
inline KeyRange VisibleKeys(const AttentionDims& dims,
                            const AttentionWork& work, int64_t t) {
  const int64_t p = work.q_pos0 + t;
  const int64_t last = dims.causal ? std::min(work.kv_len, p + 1) : work.kv_len;
  const int64_t first =
      dims.window > 0 && work.windowed ? p - dims.window + 1 : 0;
  const int64_t end = std::max(work.key_begin, last);
  return {std::clamp(first, work.key_begin, end), end};
}

// The union of the visible ranges of tokens [t0, t0 + nt), nt >= 1: the keys
// a tile of them reads.
inline KeyRange KeysSeenByAny(const AttentionDims& dims,
                              const AttentionWork& work, int64_t t0,
                              int64_t nt) {
  return {VisibleKeys(dims, work, t0).begin,
          VisibleKeys(dims, work, t0 + nt - 1).end};
}

// The intersection of the visible ranges of tokens [t0, t0 + nt), nt >= 1: a
// key block inside it needs no per-row cut.
inline KeyRange KeysSeenByAll(const AttentionDims& dims,
                              const AttentionWork& work, int64_t t0,
                              int64_t nt) {
  return {VisibleKeys(dims, work, t0 + nt - 1).begin,
          VisibleKeys(dims, work, t0).end};
}

// Whether some token in [t0, t0 + nt) does not see some key in [k0, k0 + n):
// the blocks that need the per-row cut of VisibleKeys.
inline bool SomeTokenMissesBlock(const AttentionDims& dims,
                                 const AttentionWork& work, int64_t t0,
                                 int64_t nt, int64_t k0, int64_t n) {
  return !KeysSeenByAll(dims, work, t0, nt).Contains(k0, k0 + n);
}

// A wide tile's operands on bf16 pairs (pair_tiles-inl.h) for one key block:
// the engine (amx: AMX tiles, else vdpbf16ps), the stored K rows k (the
// cache's row stride), q's pairs qt, the scratch for the block's last keys on
// AMX k_tail, V^T vt (null: the float32 product on the converted V rows, for a
// block whose hidden keys hold a NaN or inf in V), and the weights' pairs pt.
struct WidePairs {
  bool amx;
  const hwy::bfloat16_t* k;
  const hwy::bfloat16_t* qt;
  hwy::bfloat16_t* k_tail;
  const hwy::bfloat16_t* vt;
  hwy::bfloat16_t* pt;
};

// The fused path's tiles (QT, ST, OT or their narrow forms): the calling
// thread's slots, one buffer per thread of the arena.
inline ThreadScratchSlots& AttentionTileSlots() {
  thread_local ThreadScratchSlots slots;
  return slots;
}

}  // namespace headway

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_PLAN_

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_
#undef HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_
#else
#define HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_
#endif

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "lib/attention/decode.h"
#include "lib/attention/outer_product-inl.h"
#include "lib/attention/pair_tiles-inl.h"
#include "lib/core/kernels-inl.h"
#include "lib/core/storage-inl.h"
#include "lib/core/transpose-inl.h"
#include "lib/softmax/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using AttnD = hn::ScalableTag<float>;

// C [n_i, n_vec vectors] (+)= A B with OuterProduct tiles of 4 rows x 2 vectors
// and their edges.
HWY_INLINE void OuterProductBlock(const float* a, size_t a_si, size_t a_sk,
                                  const float* b, size_t b_stride, size_t n_k,
                                  float* c, size_t c_stride, size_t n_i,
                                  size_t n_vec, bool accumulate) {
  const size_t N = hn::Lanes(AttnD());
  size_t j = 0;
  for (; j + 2 <= n_vec; j += 2) {
    size_t i = 0;
#if HWY_TARGET <= HWY_AVX3
    // 32 vector registers: 16 accumulators, 2 rows of B and a broadcast. Per k:
    // 10 loads for 16 FMAs, so the two FMA pipes set the pace rather than the
    // two 512-bit load ports.
    for (; i + 8 <= n_i; i += 8) {
      OuterProduct<8, 2>(a + i * a_si, a_si, a_sk, b + j * N, b_stride, n_k,
                         c + i * c_stride + j * N, c_stride, accumulate);
    }
#endif
    // 16 registers: 8 accumulators (two FMA pipes x 4 cycles of latency).
    for (; i + 4 <= n_i; i += 4) {
      OuterProduct<4, 2>(a + i * a_si, a_si, a_sk, b + j * N, b_stride, n_k,
                         c + i * c_stride + j * N, c_stride, accumulate);
    }
    for (; i < n_i; ++i) {
      OuterProduct<1, 2>(a + i * a_si, a_si, a_sk, b + j * N, b_stride, n_k,
                         c + i * c_stride + j * N, c_stride, accumulate);
    }
  }
  if (j < n_vec) {
    size_t i = 0;
    for (; i + 8 <= n_i; i += 8) {
      OuterProduct<8, 1>(a + i * a_si, a_si, a_sk, b + j * N, b_stride, n_k,
                         c + i * c_stride + j * N, c_stride, accumulate);
    }
    for (; i < n_i; ++i) {
      OuterProduct<1, 1>(a + i * a_si, a_si, a_sk, b + j * N, b_stride, n_k,
                         c + i * c_stride + j * N, c_stride, accumulate);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Exponentials.

// Scores are in base 2 (q carries scale * log2(e), so exp(s - m) = exp2(s2 -
// m2)) where they can be: exp2 needs no range reduction by ln(2), and
// Exp2NonPositive is about half the operations of hn::Exp (the softmax step is
// 13% of causal prefill time with hn::Exp).
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

// 2^x for x <= 0 (or -inf; NaN gives NaN), with a relative error below
// 1.1e-7 (about one ulp; measured over [-0.5, 0.5] against float64): x = n +
// f, n an integer nearest x, f in [-0.5, 0.5]; 2^f by a degree-6 polynomial
// (a Chebyshev fit of 2^f on [-0.5, 0.5], Horner form); 2^n built in the
// exponent bits. Below -127 the result is 0 instead of a subnormal (< 2^-126:
// nothing next to the row's maximum, whose term is 1). n comes from the
// float sum t = x + 1.5 * 2^23 + 127, whose low bits are n + 127, with no
// rounding or conversion instructions: the softmax step 1.3x faster than with
// Round and ConvertTo (wide tile, 128 keys x 32 rows, AVX3_DL, the same bits
// but for ties x = k + 1/2, where n is the odd neighbour).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2NonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  // x86's maxps returns its second operand where one is NaN: a NaN x stays
  // NaN (other targets' Max, SCALAR's and EMU128's among them, may return -127;
  // the NaN is put back below).
  const V xc = hn::Max(hn::Set(d, -127.0f), x);
  const V magic = hn::Set(d, 12583039.0f);  // 1.5 * 2^23 + 127, exact
  const V t = hn::Add(xc, magic);           // bits 0x4B400000 + n + 127
  const V f = hn::Sub(xc, hn::Sub(t, magic));
  V p = hn::Set(d, 1.5469732170458883e-4f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.3400432653725147e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.61802527308464e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.550327152013779e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.24022650718688965f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931471824645996f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  // n + 127 in [0, 127] shifted into the exponent field: 2^n (0 gives +0.0).
  const V e = hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t))));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  return e;
#else
  return hn::IfThenElse(hn::IsNaN(x), x, e);
#endif
}

// ---------------------------------------------------------------------------------------------
// The rules every path asks: visible keys, the additive mask, K/V reads.

// The additive mask's rule, for every path: a -inf entry hides the key
// (whatever its score, NaN included); any other entry is added to the score in
// natural units, where every finite float is representable.
HWY_INLINE float MaskedScore(float score, float mask) {
  return mask == -std::numeric_limits<float>::infinity() ? mask : score + mask;
}

// The rules that turn a score into the one the softmax sees, before the
// additive mask (AttentionOptions): soft-capping, then ALiBi's bias. `unit` is
// the scores' unit per natural one (log2(e) for base-2 scores, else 1).
struct ScoreRules {
  float cap;            // softcap * unit; 0: none
  float inv_cap;        // 1 / cap
  const float* slopes;  // [n_heads] in natural units; null: no ALiBi
  float unit;
  bool any() const { return cap != 0.0f || slopes != nullptr; }
  // Query head h's slope in the scores' units (0 without ALiBi).
  float Slope(int64_t h) const {
    return slopes != nullptr ? slopes[h] * unit : 0.0f;
  }
};
HWY_INLINE ScoreRules MakeScoreRules(const AttentionDims& dims, float unit) {
  ScoreRules rules;
  rules.cap = dims.softcap * unit;
  rules.inv_cap = dims.softcap != 0.0f ? 1.0f / rules.cap : 0.0f;
  rules.slopes = dims.alibi_slopes;
  rules.unit = unit;
  return rules;
}

// The one home of "with which bias": scores s (in the rules' units) of the
// (query, key) pairs in the lanes, slope the query head's slope (Slope) and
// dist the key's position minus the query's: cap * tanh(s / cap), then +
// slope * dist. A NaN stays NaN; +-inf becomes +-cap.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V RuledScores(D d, const ScoreRules& rules, V s, V slope, V dist) {
  if (rules.cap != 0.0f) {
    // tanh |y| = (1 - e) / (1 + e), e = exp(-2 |y|) <= 1 (Exp2NonPositive,
    // half the work of hn::Tanh's Expm1): e's 1.1e-7 moves it by 2e / (1 +
    // e)^2 * 1.1e-7 <= 5.5e-8, the three roundings by 3 u |tanh|: under 2^-22
    // absolute, so cap * tanh within cap 2^-22, inside the bound's softcap
    // term (attention.h).
    // A NaN s makes e, and so the result, NaN.
    const V y = hn::Mul(s, hn::Set(d, rules.inv_cap));
    const V sign = hn::And(hn::SignBit(d), y);
    const V e = Exp2NonPositive(
        d, hn::Mul(hn::Xor(y, sign), hn::Set(d, -2.0f * kLog2e)));
    const V one = hn::Set(d, 1.0f);
    const V tanh = hn::Xor(hn::Div(hn::Sub(one, e), hn::Add(one, e)), sign);
    s = hn::Mul(hn::Set(d, rules.cap), tanh);
  }
  if (rules.slopes != nullptr) s = hn::MulAdd(slope, dist, s);
  return s;
}

// RuledScores over row[0, n): the scores of one query (head h, position
// q_pos) against keys k0, k0 + 1, ... (keys along the lanes).
HWY_INLINE void RuleScoreRow(const ScoreRules& rules, int64_t h, int64_t q_pos,
                             int64_t k0, float* HWY_RESTRICT row, size_t n) {
  const AttnD d;
  const hn::CappedTag<float, 1> d1;
  const size_t N = hn::Lanes(d);
  const float slope = rules.Slope(h);
  // Distances are exact below 2^24.
  const float dist0 = static_cast<float>(k0 - q_pos);
  size_t s = 0;
  for (; s + N <= n; s += N) {
    const auto dist =
        hn::Add(hn::Iota(d, 0.0f), hn::Set(d, dist0 + static_cast<float>(s)));
    hn::StoreU(
        RuledScores(d, rules, hn::LoadU(d, row + s), hn::Set(d, slope), dist),
        d, row + s);
  }
  for (; s < n; ++s) {
    const auto dist = hn::Set(d1, dist0 + static_cast<float>(s));
    hn::StoreU(RuledScores(d1, rules, hn::LoadU(d1, row + s),
                           hn::Set(d1, slope), dist),
               d1, row + s);
  }
}

// Whether the query token t of `work` must not see key `key`: outside its
// VisibleKeys or hidden by a -inf mask entry. A hidden key contributes nothing
// to the query, not even a NaN of its K or V row.
HWY_INLINE bool KeyHidden(const AttentionDims& dims, const AttentionWork& work,
                          int64_t t, int64_t key) {
  const KeyRange visible = VisibleKeys(dims, work, t);
  return key < visible.begin || key >= visible.end ||
         (work.mask != nullptr && work.mask[t * work.mask_stride + key] ==
                                      -std::numeric_limits<float>::infinity());
}

// Whether some query token in [t0, t0 + nt) cannot see some key in [k0, k0 +
// n_keys): the blocks where P V must not let 0 * NaN through.
HWY_INLINE bool BlockMayHide(const AttentionDims& dims,
                             const AttentionWork& work, int64_t t0, int64_t nt,
                             int64_t k0, int64_t n_keys) {
  return work.mask != nullptr ||
         SomeTokenMissesBlock(dims, work, t0, nt, k0, n_keys);
}

// Sets row[s], the score of key k0 + s for s in [0, n), to -inf for the keys
// outside `visible`.
HWY_INLINE void HideOutside(KeyRange visible, int64_t k0, size_t n,
                            float* HWY_RESTRICT row) {
  const int64_t n_keys = static_cast<int64_t>(n);
  const int64_t begin = std::clamp<int64_t>(visible.begin - k0, 0, n_keys);
  const int64_t end = std::clamp<int64_t>(visible.end - k0, begin, n_keys);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill(row, row + begin, neg_inf);
  std::fill(row + end, row + n_keys, neg_inf);
}

// Converts n stored rows of T (src [n][row_stride], int8 with one scale per
// row) into floats, dst [n][row_stride]: the floats LoadRow (storage.h) gives,
// padding included (an int8 row with a NaN scale is NaN throughout).
template <class T>
HWY_INLINE void ConvertRows(const T* HWY_RESTRICT src,
                            const float* HWY_RESTRICT scales, size_t n,
                            size_t row_stride, float* HWY_RESTRICT dst) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  for (size_t s = 0; s < n; ++s) {
    const T* row = src + s * row_stride;
    float* out = dst + s * row_stride;
    if constexpr (internal::kKvScaled<T>) {
      const auto scale = hn::Set(d, scales[s]);
      for (size_t p = 0; p < row_stride; p += N) {
        hn::Store(hn::Mul(LoadStored(d, row + p), scale), d, out + p);
      }
    } else {
      for (size_t p = 0; p < row_stride; p += N) {
        hn::Store(LoadStored(d, row + p), d, out + p);
      }
    }
  }
}

// Whether rows [0, n_rows) of v (row stride `stride`, a multiple of the vector
// length; columns past the head's are zero) are all finite. Not inlined:
// inlined into a work item, GCC 12 reloads a pointer from the stack in its loop
// (25% more instructions on AVX2).
template <class T>
HWY_NOINLINE bool RowsFinite(const T* HWY_RESTRICT v, size_t n_rows,
                             size_t stride) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  // x * 0 is 0 for finite x and NaN for +-inf and NaN.
  auto acc = hn::Zero(d);
  const T* end = v + n_rows * stride;
  for (; v < end; v += N) acc = hn::MulAdd(LoadStored(d, v), hn::Zero(d), acc);
  return hn::AllTrue(d, hn::Eq(acc, hn::Zero(d)));
}

// Read access to the stored K or V rows of one KV head of one sequence,
// [capacity][row_stride] elements of T (int8: times one float scale per row):
// every kernel reads K and V through this, so that a new storage type needs
// only its LoadStored (storage-inl.h). Narrow tiles read the stored rows
// (Stored, Scales) and convert on the fly; Block hands out float rows:
// float32 storage pointers into the cache (no copy), the other types the rows
// converted into the reader's scratch, once per key block of a wide group.
template <class T>
class KvRows {
 public:
  // Whether Block converts (and needs scratch).
  static constexpr bool kConverts = !hwy::IsSame<T, float>();
  // The scratch Block needs for up to `rows` rows: [rows][row_stride] floats,
  // none for float.
  static size_t ScratchFloats(size_t rows, size_t row_stride) {
    return kConverts ? rows * row_stride : 0;
  }

  // head: the row of the key at position `origin`; scales: its scale and
  // the next rows' for int8, else null. scratch: ScratchFloats(n_max,
  // row_stride) floats, vector-aligned, for Block calls of up to n_max rows.
  KvRows(const T* head, const float* scales, int64_t origin, int64_t row_stride,
         float* scratch)
      : head_(head),
        scales_(scales),
        scratch_(scratch),
        origin_(origin),
        row_stride_(static_cast<size_t>(row_stride)) {}

  size_t row_stride() const { return row_stride_; }
  // The stored row of the key at position k >= origin (k + 1's is row_stride
  // elements on).
  const T* Stored(int64_t k) const {
    return head_ + static_cast<size_t>(k - origin_) * row_stride_;
  }
  // The scales of keys k, k + 1, ... (int8), or null.
  const float* Scales(int64_t k) const {
    return internal::kKvScaled<T> ? scales_ + (k - origin_) : nullptr;
  }
  // Rows [k0, k0 + n) as floats: [n][row_stride], the padding zero (NaN for
  // an int8 row with a NaN scale). Converted rows stay valid until the next
  // Block call on this reader.
  const float* Block(int64_t k0, size_t n) const {
    if constexpr (kConverts) {
      ConvertRows(Stored(k0), Scales(k0), n, row_stride_, scratch_);
      return scratch_;
    } else {
      (void)n;
      return Stored(k0);
    }
  }
  // Hints the int8 scales of keys [k, k + n) into L2 (prefetcht1 on x86),
  // a 64-byte line per prefetch; nothing for the other types. The keys may
  // lie past the cache: the addresses are integers, and prefetches never
  // fault.
  void PrefetchScales(int64_t k, size_t n) const {
    if constexpr (internal::kKvScaled<T>) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(scales_) +
                              static_cast<size_t>(k - origin_) * sizeof(float);
      for (size_t b = 0; b < n * sizeof(float); b += 64) {
        __builtin_prefetch(reinterpret_cast<const void*>(begin + b), /*rw=*/0,
                           /*locality=*/2);
      }
    } else {
      (void)k;
      (void)n;
    }
  }
  // Whether rows [k0, k0 + n) read back finite (int8: their scales are).
  bool Finite(int64_t k0, size_t n) const {
    if constexpr (internal::kKvScaled<T>) {
      const float* scales = Scales(k0);
      for (size_t s = 0; s < n; ++s) {
        if (!std::isfinite(scales[s])) return false;
      }
      return true;
    } else {
      return RowsFinite(Stored(k0), n, row_stride_);
    }
  }

 private:
  const T* head_;
  const float* scales_;
  float* scratch_;
  int64_t origin_;
  size_t row_stride_;
};

// The K (kv == kKeys) or V rows of KV head kv_head of segment `work`, by
// key position, with Block scratch for converting types
// (KvRows::ScratchFloats; null for float).
enum class KvSide { kKeys, kValues };
template <class T>
HWY_INLINE KvRows<T> HeadRows(const AttentionDims& dims,
                              const AttentionWork& work, KvSide kv,
                              int64_t kv_head, float* scratch) {
  const bool keys = kv == KvSide::kKeys;
  const float* scales = keys ? work.key_scales : work.value_scales;
  return KvRows<T>(static_cast<const T*>(keys ? work.keys : work.values) +
                       kv_head * work.head_stride,
                   internal::kKvScaled<T>
                       ? scales + kv_head * work.scale_head_stride
                       : nullptr,
                   work.key_begin, dims.row_stride, scratch);
}

// ---------------------------------------------------------------------------------------------
// The online softmax, shared by both tile kinds.

// A call with an additive mask keeps natural units (q carries scale only, the
// mask is added, exp2 takes (s - m) * log2(e)): a mask of -FLT_MAX times
// log2(e) would overflow to -inf and hide a key that the mask leaves visible.
HWY_INLINE bool ScoresInBase2(const AttentionWork& work) {
  return work.mask == nullptr;
}
// The factor on q: scale, times log2(e) for base-2 scores.
HWY_INLINE float QueryScale(const AttentionDims& dims,
                            const AttentionWork& work) {
  return ScoresInBase2(work) ? dims.scale * kLog2e : dims.scale;
}
// The factor that turns a running max into natural units.
HWY_INLINE float MaxToNatural(const AttentionWork& work) {
  return ScoresInBase2(work) ? kLn2 : 1.0f;
}
// The call's ScoreRules in the units of the work's scores.
HWY_INLINE ScoreRules WorkScoreRules(const AttentionDims& dims,
                                     const AttentionWork& work) {
  return MakeScoreRules(dims, ScoresInBase2(work) ? kLog2e : 1.0f);
}

// Running statistics of the online softmax for one query row (lane).
struct OnlineSoftmaxState {
  float* max;  // m: the largest score so far (-inf: none), in the scores' units
  float* sum;  // l: sum of exp(score - m)
};

// One online-softmax step for the query rows in the lanes of m_old (their
// running max before a key block) and m_new (after it, m_old included); the
// wide tile has a row per lane, the narrow one a row broadcast. Scores are
// base 2 (kBase2) or natural units; -inf scores are hidden keys.
template <bool kBase2, class D, class V = hn::Vec<D>>
struct OnlineSoftmaxStep {
  HWY_INLINE OnlineSoftmaxStep(D d, V m_old, V m_new)
      // -inf - (-inf) would be NaN: a row with no score yet subtracts 0.
      : m_use(hn::IfThenZeroElse(
            hn::Eq(m_new, hn::Set(d, -std::numeric_limits<float>::infinity())),
            m_new)),
        alpha(Weight(d, m_old)) {}

  // exp(score - m_new): 0 for -inf, NaN where score - m_new is NaN (a NaN
  // score, or +inf - +inf), so that a NaN reaches the output.
  HWY_INLINE V Weight(D d, V score) const {
    const V x = hn::Sub(score, m_use);
    return Exp2NonPositive(d, kBase2 ? x : hn::Mul(x, hn::Set(d, kLog2e)));
  }
  // The running sum after the block: sum_old * alpha + the block's weights.
  HWY_INLINE V Sum(V sum_old, V block_sum) const {
    return hn::MulAdd(sum_old, alpha, block_sum);
  }

  V m_use;  // m_new, or 0 for a row with no score yet
  V alpha;  // exp(m_old - m_new): rescales the old sum and output
};

// The result of a query row from its unnormalised output o and softmax sum l,
// for the rows in the lanes of l, the one rule of every tile and chunk: o / (l
// + sink) (as o * (1 / (l + sink))), sink the share of a sink logit in the
// denominator (SinkWeight; 0 without); zeros for a row that saw no key (l ==
// 0), whatever o holds; NaN for a NaN l (the row saw a NaN or a +inf score).
// MergedRow is the same rule for merged chunks.
template <class D, class V = hn::Vec<D>>
struct RowNormalizer {
  HWY_INLINE RowNormalizer(D d, V l, V sink)
      : keep(hn::Or(hn::Gt(l, hn::Zero(d)), hn::IsNaN(l))),
        inv(hn::Div(hn::Set(d, 1.0f), hn::Add(l, sink))) {}
  HWY_INLINE V operator()(V o) const {
    return hn::IfThenElseZero(keep, hn::Mul(o, inv));
  }

  hn::Mask<D> keep;
  V inv;
};

// RowNormalizer's rule after a merge: acc / (total + sink), where total sums
// the weights of the chunks that saw keys and sink is SinkWeight's at their
// common max; zeros when none did (total == 0); NaN when one saw a NaN (nan).
HWY_INLINE float MergedRow(double acc, double total, double sink, bool nan) {
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return total > 0.0 ? static_cast<float>(acc / (total + sink)) : 0.0f;
}

// The sink logit's term of query head h's softmax denominator,
// exp(sink_logits[h] - m), for a row whose largest score is m in natural
// units (-inf: none, giving +inf, which RowNormalizer's zero row ignores); 0
// without sink logits.
HWY_INLINE double SinkWeight(const AttentionDims& dims, int64_t h, double m) {
  if (dims.sink_logits == nullptr) return 0.0;
  return std::exp(static_cast<double>(dims.sink_logits[h]) - m);
}

// ---------------------------------------------------------------------------------------------
// Tiles.

// The geometry of one query tile: rows r = t * group + h for tokens t in [t0,
// t0 + nt), and the keys it reads in its work item's chunk.
struct AttentionTile {
  const AttentionWork* work;
  int64_t kv_head;
  int64_t t0;
  int64_t nt;
  int64_t rows;  // nt * group
  // [key_begin, key_end): the union of the rows' VisibleKeys within the chunk,
  // key_begin on the chunk's block grid (empty: key_begin == key_end).
  int64_t key_begin, key_end;
};

// A finished tile's unnormalised output o(r, p) = o[r * row_step + p *
// col_step] (wide: OT, row_step 1; narrow: O, col_step 1) and softmax state.
struct TileResult {
  float* o;
  size_t row_step;
  size_t col_step;
  OnlineSoftmaxState state;
};

// Row r of a tile is query head kv_head * group + r % group of token t0 + r /
// group: its head_dim floats in q and in out.
HWY_INLINE int64_t TileRowOffset(const AttentionTile& tile, int64_t group,
                                 int64_t head_dim, int64_t r, int64_t stride) {
  return (tile.t0 + r / group) * stride +
         (tile.kv_head * group + r % group) * head_dim;
}
HWY_INLINE const float* TileQRow(const AttentionDims& dims,
                                 const AttentionTile& tile, int64_t r) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  return tile.work->q +
         TileRowOffset(tile, group, dims.head_dim, r, tile.work->q_stride);
}
HWY_INLINE float* TileOutRow(const AttentionDims& dims,
                             const AttentionTile& tile, int64_t r) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  return tile.work->out +
         TileRowOffset(tile, group, dims.head_dim, r, tile.work->out_stride);
}

// The VisibleKeys of the tile's row r (none for padding rows, r >= rows).
HWY_INLINE KeyRange RowVisibleKeys(const AttentionDims& dims,
                                   const AttentionTile& tile, int64_t group,
                                   int64_t r) {
  return r < tile.rows ? VisibleKeys(dims, *tile.work, tile.t0 + r / group)
                       : KeyRange{0, 0};
}

// ---------------------------------------------------------------------------------------------
// Wide tiles: queries along the lanes.

// How wide tiles over stored type T take their two products: on bf16 pairs
// (pair_tiles-inl.h) for AttentionCompute::kBFloat16 on a bf16 cache, head_dim
// a multiple of 32 and at most 32 query heads per KV head (a tile's rows, 32
// on AVX-512, are then one pair tile's columns, its lanes padded to 32): on
// AMX tiles where AmxBFloat16Active(), else by vdpbf16ps where
// NativeBFloat16Active() (both asked once per call, on targets with the
// code). Elsewhere the mode's wide tiles take float32 products.
enum class WideProducts { kFloat32, kAmx, kNative };

template <class T>
HWY_INLINE WideProducts WidePairProducts(const AttentionDims& dims) {
#if HEADWAY_NATIVE_BF16
  static_assert(kAttentionPairRows == kPairCols, "a tile is a pair tile wide");
  if (!hwy::IsSame<T, hwy::bfloat16_t>() ||
      dims.head_dim % kAttentionPairRows != 0 ||
      dims.n_heads / dims.n_kv_heads > kAttentionPairRows ||
      2 * static_cast<int64_t>(hn::Lanes(AttnD())) != kAttentionPairRows) {
    return WideProducts::kFloat32;
  }
#if HEADWAY_NATIVE_AMX
  if (dims.amx_bf16) return WideProducts::kAmx;
#endif
  return dims.native_bf16 ? WideProducts::kNative : WideProducts::kFloat32;
#else
  (void)dims;
  return WideProducts::kFloat32;
#endif
}

// The online-softmax step on a block of scores st [n_keys, rp] (lanes = query
// rows, hidden keys -inf): replaces st by P = exp(st - m_new), rescales ot
// [d, rp] by alpha and updates m, l.
template <bool kBase2>
HWY_INLINE void WideSoftmaxStep(float* HWY_RESTRICT st, size_t n_keys,
                                size_t rp, float* HWY_RESTRICT ot, size_t dim,
                                OnlineSoftmaxState state) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  for (size_t j = 0; j < rp; j += N) {
    const auto m_old = hn::Load(d, state.max + j);
    // Four maxima in flight (Max's latency, not its rate, bounds one chain):
    // the step 1.3x faster, 128 keys x 32 rows on AVX3_DL.
    auto m0 = m_old, m1 = m_old, m2 = m_old, m3 = m_old;
    size_t k = 0;
    for (; k + 4 <= n_keys; k += 4) {
      m0 = hn::Max(m0, hn::Load(d, st + k * rp + j));
      m1 = hn::Max(m1, hn::Load(d, st + (k + 1) * rp + j));
      m2 = hn::Max(m2, hn::Load(d, st + (k + 2) * rp + j));
      m3 = hn::Max(m3, hn::Load(d, st + (k + 3) * rp + j));
    }
    for (; k < n_keys; ++k) m0 = hn::Max(m0, hn::Load(d, st + k * rp + j));
    const auto m_new = hn::Max(hn::Max(m0, m1), hn::Max(m2, m3));
    const OnlineSoftmaxStep<kBase2, AttnD> step(d, m_old, m_new);
    auto sum = hn::Zero(d);
    for (size_t s = 0; s < n_keys; ++s) {
      const auto p = step.Weight(d, hn::Load(d, st + s * rp + j));
      hn::Store(p, d, st + s * rp + j);
      sum = hn::Add(sum, p);
    }
    hn::Store(step.Sum(hn::Load(d, state.sum + j), sum), d, state.sum + j);
    hn::Store(m_new, d, state.max + j);
    for (size_t p = 0; p < dim; ++p) {
      hn::Store(hn::Mul(hn::Load(d, ot + p * rp + j), step.alpha), d,
                ot + p * rp + j);
    }
  }
}

// Per lane of a wide tile, what ALiBi's bias needs: the row's slope in the
// scores' units (0 for padding rows) and its query position, [rp] each.
struct WideLanes {
  float* slope;
  float* pos;
};

// Starts a wide tile: QT [d, rp] = QueryScale * q (0 for padding rows), OT
// [d, rp] = 0, m = -inf, l = 0 per lane, and its lanes' slopes and positions.
HWY_INLINE void WideTileBegin(const AttentionDims& dims,
                              const AttentionTile& tile, float* HWY_RESTRICT qt,
                              float* HWY_RESTRICT ot, size_t rp,
                              OnlineSoftmaxState state, WideLanes lanes) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const ScoreRules rules = WorkScoreRules(dims, *tile.work);
  for (size_t lane = 0; lane < rp; ++lane) {
    const int64_t r = static_cast<int64_t>(lane);
    lanes.slope[lane] =
        r < tile.rows ? rules.Slope(tile.kv_head * group + r % group) : 0.0f;
    // Distances are exact below 2^24.
    lanes.pos[lane] =
        static_cast<float>(tile.work->q_pos0 + tile.t0 + r / group);
  }
  const size_t dim = static_cast<size_t>(dims.head_dim);
  const float qscale = QueryScale(dims, *tile.work);
  // QT[p, r] = qscale * q row r (TileQRow) [p]; 0 for padding.
  const auto q_row = [&](size_t r) {
    return TileQRow(dims, tile, static_cast<int64_t>(r));
  };
  const size_t rows = static_cast<size_t>(tile.rows);
  size_t r = 0;
#if HWY_TARGET != HWY_SCALAR
  // 4 x 4 blocks: the q rows are often 16 KiB apart (one token's heads).
  for (; r + 4 <= rows; r += 4) {
    const float* q0 = q_row(r);
    const float* q1 = q_row(r + 1);
    const float* q2 = q_row(r + 2);
    const float* q3 = q_row(r + 3);
    size_t p = 0;
    for (; p + 4 <= dim; p += 4) {
      float* out = qt + p * rp + r;
      Transpose4x4(q0 + p, q1 + p, q2 + p, q3 + p, qscale, out, out + rp,
                   out + 2 * rp, out + 3 * rp);
    }
    for (; p < dim; ++p) {
      qt[p * rp + r] = qscale * q0[p];
      qt[p * rp + r + 1] = qscale * q1[p];
      qt[p * rp + r + 2] = qscale * q2[p];
      qt[p * rp + r + 3] = qscale * q3[p];
    }
  }
#endif
  for (; r < rows; ++r) {
    const float* q = q_row(r);
    for (size_t p = 0; p < dim; ++p) qt[p * rp + r] = qscale * q[p];
  }
  for (; r < rp; ++r) {
    for (size_t p = 0; p < dim; ++p) qt[p * rp + r] = 0.0f;
  }
  std::fill(ot, ot + dim * rp, 0.0f);
  std::fill(state.max, state.max + rp, -std::numeric_limits<float>::infinity());
  std::fill(state.sum, state.sum + rp, 0.0f);
}

// One key block [k0, k0 + n_keys) of the tile's KV head on a wide tile, its K
// and V rows k_block and v_block [n_keys, row_stride] (KvRows::Block): scores
// into st [n_keys, rp], masks, online softmax, OT += V^T P. With pairs (not
// null; rp = 32), the products on its bf16 pairs instead (pair_tiles-inl.h;
// v_block is read only where pairs->vt is null; k_block not at all). Not
// inlined: one copy for every stored type (a call per tile and key block).
HWY_NOINLINE void WideTileBlock(
    const AttentionDims& dims, const AttentionTile& tile, int64_t k0,
    size_t n_keys, const float* HWY_RESTRICT k_block,
    const float* HWY_RESTRICT v_block, const float* HWY_RESTRICT qt,
    float* HWY_RESTRICT st, float* HWY_RESTRICT ot, size_t rp,
    OnlineSoftmaxState state, WideLanes lanes, const WidePairs* pairs) {
  const AttnD d;
  const hn::RebindToSigned<AttnD> di;
  const size_t N = hn::Lanes(d);
  const size_t dim = static_cast<size_t>(dims.head_dim);
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const AttentionWork& work = *tile.work;
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());

  // ST [n_keys, rp] = K[k0 .. k0 + n_keys) QT.
  if (pairs != nullptr) {
#if HEADWAY_NATIVE_BF16
    PairScoresT(pairs->amx, pairs->k, row_stride, n_keys, dim, pairs->qt,
                pairs->k_tail, st);
#endif
  } else {
    OuterProductBlock(k_block, row_stride, 1, qt, rp, dim, st, rp, n_keys,
                      rp / N, /*accumulate=*/false);
  }
  // Soft-capping and ALiBi, a query row per lane (WideLanes).
  const ScoreRules rules = WorkScoreRules(dims, work);
  if (rules.any()) {
    for (size_t j = 0; j < rp; j += N) {
      const auto vslope = hn::Load(d, lanes.slope + j);
      const auto vq_pos = hn::Load(d, lanes.pos + j);
      for (size_t s = 0; s < n_keys; ++s) {
        float* row = st + s * rp + j;
        const auto dist = hn::Sub(
            hn::Set(d, static_cast<float>(k0 + static_cast<int64_t>(s))),
            vq_pos);
        hn::Store(RuledScores(d, rules, hn::Load(d, row), vslope, dist), d,
                  row);
      }
    }
  }
  // Each lane's VisibleKeys, only on blocks that some row does not wholly see.
  const bool crossing = SomeTokenMissesBlock(dims, work, tile.t0, tile.nt, k0,
                                             static_cast<int64_t>(n_keys));
  if (crossing) {
    for (size_t j = 0; j < rp; j += N) {
      HWY_ALIGN int32_t first[hn::MaxLanes(di)];
      HWY_ALIGN int32_t last[hn::MaxLanes(di)];
      for (size_t lane = 0; lane < N; ++lane) {
        const KeyRange visible =
            RowVisibleKeys(dims, tile, group, static_cast<int64_t>(j + lane));
        first[lane] = static_cast<int32_t>(visible.begin);
        last[lane] = static_cast<int32_t>(visible.end - 1);
      }
      const auto vfirst = hn::Load(di, first);
      const auto vlast = hn::Load(di, last);
      for (size_t s = 0; s < n_keys; ++s) {
        const auto key = hn::Set(di, static_cast<int32_t>(k0 + s));
        const auto hidden =
            hn::RebindMask(d, hn::Or(hn::Gt(vfirst, key), hn::Gt(key, vlast)));
        float* row = st + s * rp + j;
        hn::Store(hn::IfThenElse(hidden, neg_inf, hn::Load(d, row)), d, row);
      }
    }
  }
  if (work.mask != nullptr) {
    for (size_t r = 0; r < static_cast<size_t>(tile.rows); ++r) {
      const float* mask_row =
          work.mask +
          (tile.t0 + static_cast<int64_t>(r) / group) * work.mask_stride + k0;
      for (size_t s = 0; s < n_keys; ++s)
        st[s * rp + r] = MaskedScore(st[s * rp + r], mask_row[s]);
    }
  }
  if (ScoresInBase2(work)) {
    WideSoftmaxStep<true>(st, n_keys, rp, ot, dim, state);
  } else {
    WideSoftmaxStep<false>(st, n_keys, rp, ot, dim, state);
  }
  // OT [d, rp] += V[k0 .. k0 + n_keys)^T PT: A(i = p, k = s) = V[s, p].
  if (pairs != nullptr && pairs->vt != nullptr) {
#if HEADWAY_NATIVE_BF16
    PairRows(st, rp, n_keys, RoundUp(n_keys, kPairCols) / 2, pairs->pt);
    PairAccumulateT(pairs->amx, pairs->vt, n_keys, dim, pairs->pt, ot);
#endif
    return;
  }
  if (!BlockMayHide(dims, work, tile.t0, tile.nt, k0,
                    static_cast<int64_t>(n_keys)) ||
      RowsFinite(v_block, n_keys, row_stride)) {
    OuterProductBlock(v_block, 1, row_stride, st, rp, n_keys, ot, rp, dim,
                      rp / N, /*accumulate=*/true);
    return;
  }
  // A NaN or inf in V where some lane must not see it: the same FMAs key by
  // key, with V zeroed in the lanes that do not see the key (0 * 0 adds
  // nothing), so the other lanes get the bits of the path above.
  for (size_t s = 0; s < n_keys; ++s) {
    const int64_t key = k0 + static_cast<int64_t>(s);
    for (size_t j = 0; j < rp; j += N) {
      HWY_ALIGN int32_t seen[hn::MaxLanes(di)];
      for (size_t lane = 0; lane < N; ++lane) {
        const int64_t r = static_cast<int64_t>(j + lane);
        seen[lane] =
            r < tile.rows && !KeyHidden(dims, work, tile.t0 + r / group, key)
                ? -1
                : 0;
      }
      const auto visible =
          hn::RebindMask(d, hn::Ne(hn::Load(di, seen), hn::Zero(di)));
      const auto p = hn::Load(d, st + s * rp + j);
      for (size_t c = 0; c < dim; ++c) {
        const auto v = hn::IfThenElseZero(
            visible, hn::Set(d, v_block[s * row_stride + c]));
        float* o = ot + c * rp + j;
        hn::Store(hn::MulAdd(v, p, hn::Load(d, o)), d, o);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Narrow tiles: fewer query rows than lanes; vectors along head_dim.

// The online-softmax step on the scores sc [rows, bkp] of a key block (along
// each row; hidden keys and padding -inf): replaces sc by P = exp(sc - m_new),
// rescales o [rows, row_stride] by alpha and updates m, l.
template <bool kBase2>
HWY_INLINE void NarrowSoftmaxStep(float* HWY_RESTRICT sc, size_t rows,
                                  size_t bkp, float* HWY_RESTRICT o,
                                  size_t row_stride, OnlineSoftmaxState state) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    float* sc_row = sc + r * bkp;
    const auto m_old = hn::Set(d, state.max[r]);
    auto vmax = m_old;
    for (size_t s = 0; s < bkp; s += N)
      vmax = hn::Max(vmax, hn::Load(d, sc_row + s));
    const auto m_new = hn::Set(d, MaxLane(d, vmax));
    const OnlineSoftmaxStep<kBase2, AttnD> step(d, m_old, m_new);
    auto sum = hn::Zero(d);
    for (size_t s = 0; s < bkp; s += N) {
      const auto p = step.Weight(d, hn::Load(d, sc_row + s));
      hn::Store(p, d, sc_row + s);
      sum = hn::Add(sum, p);
    }
    state.sum[r] =
        hn::GetLane(step.Sum(hn::Set(d, state.sum[r]), hn::SumOfLanes(d, sum)));
    state.max[r] = hn::GetLane(m_new);
    // o[r] *= alpha; the sum over this block's keys comes after the step for
    // all rows at once.
    float* o_row = o + r * row_stride;
    for (size_t p = 0; p < row_stride; p += N) {
      hn::Store(hn::Mul(hn::Load(d, o_row + p), step.alpha), d, o_row + p);
    }
  }
}

// x[0, n) (n a multiple of the vector length) replaced by its bf16 roundings
// (AttentionCompute::kBFloat16's q and P).
HWY_INLINE void RoundRowToBF16(float* HWY_RESTRICT x, size_t n) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  for (size_t i = 0; i < n; i += N) {
    hn::Store(RoundToBF16(d, hn::Load(d, x + i)), d, x + i);
  }
}

// Whether narrow tiles of `rows` query rows over stored type T take bf16
// products (ScoreRowsBF16, AccumulateRowsBF16): AttentionCompute::kBFloat16
// (which needs a bf16 cache) and several rows per KV head. One row (MHA
// decode) ran 0.8-1.05x as fast in bf16 products as in float32 products
// (Zen 4 and Zen 5, AVX3_DL, one and two threads, 16384 keys), where GQA-8
// ran 1.15x faster.
template <class T>
HWY_INLINE bool BF16Products(const AttentionDims& dims, size_t rows) {
  if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
    return dims.bf16_products && rows > 1;
  } else {
    (void)dims;
    (void)rows;
    return false;
  }
}

// Whether narrow tiles over stored type T quantize q to int8 and score by
// ScoreRowsInt8: AttentionCompute::kInt8 (which needs an int8 cache), every
// row count (one row too: the scores are a third of one-row int8 decode's
// work in float32 products).
template <class T>
HWY_INLINE bool Int8Products(const AttentionDims& dims) {
  return hwy::IsSame<T, int8_t>() && dims.int8_products;
}

// x[0, n) (n a multiple of the vector length) replaced by its int8 levels
// under the cache's rule (Int8RowScale, Int8Levels), as floats; returns the
// scale (AttentionCompute::kInt8's q). A zero row stays zero (scale 0); a NaN
// or inf gives a NaN scale, so NaN scores, as in float32 products.
HWY_INLINE float QuantizeRowToInt8(float* HWY_RESTRICT x, size_t n) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  const float scale = Int8RowScale(d, x, n);
  if (!(scale > 0.0f)) {
    std::fill(x, x + n, 0.0f);
    return scale;
  }
  const auto scale_vec = hn::Set(d, scale);
  for (size_t i = 0; i < n; i += N) {
    hn::Store(Int8Levels(d, hn::Load(d, x + i), scale_vec), d, x + i);
  }
  return scale;
}

// A narrow tile's buffers: qs [rows, row_stride]: QueryScale * q,
// zero-padded (int8 products: its int8 levels, and q_scale [rows] their
// scales); sc [rows, bkp] scores (bkp: the key block rounded up to vectors);
// o [rows, row_stride] unnormalised output; m and l.
struct NarrowBuffers {
  float* qs;
  float* q_scale;
  float* sc;
  float* o;
  OnlineSoftmaxState state;
};

// A work item on n_tiles narrow tiles (1, or on a float32 cache a pair: one
// row each, the same key range, two KV heads; DecodeInPairs), reading the
// stored K and V rows directly: ScoreRows and AccumulateRows, or for a pair
// ScoreRowPair and AccumulateRowPair, whose results are the same.
template <class T>
HWY_INLINE void NarrowTiles(const AttentionDims& dims,
                            const AttentionTile* tiles, size_t n_tiles,
                            const NarrowBuffers* bufs) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const AttentionTile& tile = tiles[0];  // what the tiles share
  const size_t rows = static_cast<size_t>(tile.rows);
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const AttentionWork& work = *tile.work;
  const size_t bkp = RoundUp(static_cast<size_t>(kAttentionKeyBlock), N);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool pair = hwy::IsSame<T, float>() && n_tiles == 2;

  const float qscale = QueryScale(dims, work);
  KvRows<T> keys[2] = {
      HeadRows<T>(dims, work, KvSide::kKeys, tile.kv_head, nullptr),
      HeadRows<T>(dims, work, KvSide::kKeys, tiles[n_tiles - 1].kv_head,
                  nullptr)};
  KvRows<T> values[2] = {
      HeadRows<T>(dims, work, KvSide::kValues, tile.kv_head, nullptr),
      HeadRows<T>(dims, work, KvSide::kValues, tiles[n_tiles - 1].kv_head,
                  nullptr)};
  for (size_t i = 0; i < n_tiles; ++i) {
    const NarrowBuffers& b = bufs[i];
    for (size_t r = 0; r < rows; ++r) {
      const float* q_row = TileQRow(dims, tiles[i], static_cast<int64_t>(r));
      float* qs_row = b.qs + r * row_stride;
      for (int64_t p = 0; p < dims.head_dim; ++p) qs_row[p] = qscale * q_row[p];
      std::fill(qs_row + dims.head_dim, qs_row + row_stride, 0.0f);
      if (BF16Products<T>(dims, rows)) RoundRowToBF16(qs_row, row_stride);
      if (Int8Products<T>(dims)) {
        b.q_scale[r] = QuantizeRowToInt8(qs_row, row_stride);
      }
    }
    std::fill(b.o, b.o + rows * row_stride, 0.0f);
    std::fill(b.state.max, b.state.max + rows, neg_inf);
    std::fill(b.state.sum, b.state.sum + rows, 0.0f);
  }

  const ScoreRules rules = WorkScoreRules(dims, work);
  const DecodePrefetch prefetch = DecodePrefetchFor<T>(rows);
  for (int64_t k0 = tile.key_begin; k0 < tile.key_end;
       k0 += kAttentionKeyBlock) {
    const size_t n_keys =
        static_cast<size_t>(std::min(kAttentionKeyBlock, tile.key_end - k0));
    // int8: the K and V scales two blocks ahead, a line per 16 keys, which
    // the hardware prefetchers follow poorly (MHA decode at 16384 keys
    // 1.02-1.06x at one and two threads, AVX3_DL, Zen 5).
    for (size_t i = 0; i < n_tiles; ++i) {
      keys[i].PrefetchScales(k0 + 2 * kAttentionKeyBlock, kAttentionKeyBlock);
      values[i].PrefetchScales(k0 + 2 * kAttentionKeyBlock, kAttentionKeyBlock);
    }
    // Scores key by key: a K row comes from memory once and serves every query
    // row while it is in L1. The block's V rows may be prefetched as the keys
    // go by, and the next block's K rows as V is summed (DecodePrefetchFor).
    if (pair) {
      if constexpr (hwy::IsSame<T, float>()) {
        const float* const qs[2] = {bufs[0].qs, bufs[1].qs};
        const float* const k[2] = {keys[0].Stored(k0), keys[1].Stored(k0)};
        float* const sc[2] = {bufs[0].sc, bufs[1].sc};
        ScoreRowPair(qs, k, row_stride, n_keys, row_stride, sc);
      }
    } else if (BF16Products<T>(dims, rows)) {
      if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
        ScoreRowsBF16(bufs[0].qs, row_stride, rows, keys[0].Stored(k0),
                      row_stride, n_keys, row_stride,
                      prefetch.values ? values[0].Stored(k0) : nullptr,
                      row_stride, bufs[0].sc, bkp, dims.native_bf16);
      }
    } else if (Int8Products<T>(dims)) {
      if constexpr (hwy::IsSame<T, int8_t>()) {
        ScoreRowsInt8(bufs[0].qs, row_stride, rows, keys[0].Stored(k0),
                      row_stride, keys[0].Scales(k0), n_keys, row_stride,
                      prefetch.values ? values[0].Stored(k0) : nullptr,
                      row_stride, bufs[0].sc, bkp);
      }
    } else {
      ScoreRows(bufs[0].qs, row_stride, rows, keys[0].Stored(k0), row_stride,
                keys[0].Scales(k0), n_keys, row_stride,
                prefetch.values ? values[0].Stored(k0) : nullptr, row_stride,
                bufs[0].sc, bkp);
    }
    // int8 products: q's scale; soft-capping and ALiBi, the additive mask,
    // each row's VisibleKeys, -inf for the padding.
    const bool crossing = SomeTokenMissesBlock(dims, work, tile.t0, tile.nt, k0,
                                               static_cast<int64_t>(n_keys));
    for (size_t i = 0; i < n_tiles; ++i) {
      const NarrowBuffers& b = bufs[i];
      for (size_t r = 0; r < rows; ++r) {
        const int64_t t = tile.t0 + static_cast<int64_t>(r) / group;
        float* sc_row = b.sc + r * bkp;
        if (Int8Products<T>(dims)) {
          const auto q_scale = hn::Set(d, b.q_scale[r]);
          for (size_t s = 0; s < bkp; s += N) {
            hn::Store(hn::Mul(hn::Load(d, sc_row + s), q_scale), d, sc_row + s);
          }
        }
        if (rules.any()) {
          RuleScoreRow(
              rules, tiles[i].kv_head * group + static_cast<int64_t>(r) % group,
              work.q_pos0 + t, k0, sc_row, n_keys);
        }
        if (work.mask) {
          const float* mask_row = work.mask + t * work.mask_stride + k0;
          for (size_t s = 0; s < n_keys; ++s)
            sc_row[s] = MaskedScore(sc_row[s], mask_row[s]);
        }
        if (crossing) {
          HideOutside(VisibleKeys(dims, work, t), k0, n_keys, sc_row);
        }
        std::fill(sc_row + n_keys, sc_row + bkp, neg_inf);
      }
      if (ScoresInBase2(work)) {
        NarrowSoftmaxStep<true>(b.sc, rows, bkp, b.o, row_stride, b.state);
      } else {
        NarrowSoftmaxStep<false>(b.sc, rows, bkp, b.o, row_stride, b.state);
      }
      // bf16 products: P rounded, the sums l kept unrounded.
      if (BF16Products<T>(dims, rows)) RoundRowToBF16(b.sc, rows * bkp);
    }
    // O [rows, row_stride] += P [rows, n_keys] V [n_keys, row_stride]: at once
    // where no key that a row must not see holds a NaN or inf in V.
    const bool may_hide = BlockMayHide(dims, work, tile.t0, tile.nt, k0,
                                       static_cast<int64_t>(n_keys));
    bool fast[2] = {false, false};
    for (size_t i = 0; i < n_tiles; ++i) {
      fast[i] = !may_hide || values[i].Finite(k0, n_keys);
    }
    if (pair && fast[0] && fast[1]) {
      if constexpr (hwy::IsSame<T, float>()) {
        const float* const w[2] = {bufs[0].sc, bufs[1].sc};
        const float* const v[2] = {values[0].Stored(k0), values[1].Stored(k0)};
        float* const o[2] = {bufs[0].o, bufs[1].o};
        AccumulateRowPair(w, v, row_stride, n_keys, row_stride, o);
      }
      continue;
    }
    for (size_t i = 0; i < n_tiles; ++i) {
      const NarrowBuffers& b = bufs[i];
      const KvRows<T>& vals = values[i];
      if (fast[i]) {
        const int64_t k1 = k0 + kAttentionKeyBlock;
        const size_t next_n = !pair && prefetch.next_keys && k1 < tile.key_end
                                  ? static_cast<size_t>(std::min(
                                        kAttentionKeyBlock, tile.key_end - k1))
                                  : 0;
        if (BF16Products<T>(dims, rows)) {
          if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
            AccumulateRowsBF16(b.sc, bkp, rows, vals.Stored(k0), row_stride,
                               n_keys, row_stride, b.o, row_stride,
                               next_n ? keys[i].Stored(k1) : nullptr,
                               row_stride, next_n, dims.native_bf16);
          }
        } else if (Int8Products<T>(dims)) {
          if constexpr (hwy::IsSame<T, int8_t>()) {
            AccumulateRowsInt8(
                b.sc, bkp, rows, vals.Stored(k0), row_stride, vals.Scales(k0),
                n_keys, row_stride, b.o, row_stride,
                next_n ? keys[i].Stored(k1) : nullptr, row_stride, next_n);
          }
        } else {
          AccumulateRows(b.sc, bkp, rows, vals.Stored(k0), row_stride,
                         vals.Scales(k0), n_keys, row_stride, b.o, row_stride,
                         next_n ? keys[i].Stored(k1) : nullptr, row_stride,
                         next_n);
        }
        continue;
      }
      // A NaN or inf in V where some row must not see it: row by row, over
      // the runs of keys it sees (a hidden key's 0 * V would add a NaN).
      for (size_t r = 0; r < rows; ++r) {
        const int64_t t = tile.t0 + static_cast<int64_t>(r) / group;
        const auto hidden = [&](size_t s) {
          return KeyHidden(dims, work, t, k0 + static_cast<int64_t>(s));
        };
        for (size_t s = 0; s < n_keys;) {
          if (hidden(s)) {
            ++s;
            continue;
          }
          const size_t begin = s;
          while (s < n_keys && !hidden(s)) ++s;
          const int64_t key = k0 + static_cast<int64_t>(begin);
          AccumulateRows(b.sc + r * bkp + begin, bkp, 1, vals.Stored(key),
                         row_stride, vals.Scales(key), s - begin, row_stride,
                         b.o + r * row_stride, row_stride,
                         static_cast<T*>(nullptr), 0, 0);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Planning.

HWY_INLINE AttentionSplit SplitSequence(const AttentionDims& dims,
                                        const AttentionWork& work,
                                        int64_t items_without_chunks) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(AttnD()));
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  AttentionSplit split;
  split.wide = group * work.n_tokens >= N;
  if (split.wide) {
    // Two vectors of query rows: 32 on AVX-512 (a 128 x 32 score block is
    // 16 KiB), as many as the outer-product kernel's tiles span.
    split.tile_tokens = std::max<int64_t>(1, 2 * N / group);
  } else {
    split.tile_tokens = work.n_tokens;
  }
  split.tile_tokens = std::min(split.tile_tokens, work.n_tokens);
  split.n_tiles = (work.n_tokens + split.tile_tokens - 1) / split.tile_tokens;
  split.group_tiles = split.wide ? kAttentionGroupTiles : 1;
  split.n_groups = (split.n_tiles + split.group_tiles - 1) / split.group_tiles;
  // Narrow tiles of one row (MHA decode) may go in pairs of KV heads.
  split.head_pair =
      !split.wide && DecodeInPairs(dims.dtype, static_cast<size_t>(
                                                   split.tile_tokens * group))
          ? 2
          : 1;
  // Chunks cut the keys that some token sees (a window's, not the cache's),
  // from the key block that holds the first, on the segment's block grid.
  const KeyRange seen = KeysSeenByAny(dims, work, 0, work.n_tokens);
  split.key0 = work.key_begin + (seen.begin - work.key_begin) /
                                    kAttentionKeyBlock * kAttentionKeyBlock;
  const int64_t n_keys = std::max<int64_t>(seen.end - split.key0, 1);
  split.chunk = RoundUp(n_keys, kAttentionKeyBlock);
  if (items_without_chunks < kAttentionMinItems) {
    const int64_t want =
        (kAttentionMinItems + items_without_chunks - 1) / items_without_chunks;
    const int64_t chunk =
        RoundUp(std::max(kAttentionMinChunk, (n_keys + want - 1) / want),
                kAttentionKeyBlock);
    split.chunk = std::min(split.chunk, chunk);
  }
  split.n_chunks = (n_keys + split.chunk - 1) / split.chunk;
  split.merged = work.n_segments > 1 || split.n_chunks > 1;
  return split;
}

// Work items per tile group and chunk of a sequence: its KV heads in
// split.head_pair's.
HWY_INLINE int64_t HeadItems(const AttentionDims& dims,
                             const AttentionSplit& split) {
  return (dims.n_kv_heads + split.head_pair - 1) / split.head_pair;
}

// Fills plan: each sequence's split (chunked so that the call has about
// kAttentionMinItems items; shapes only), the item and partial index ranges
// per sequence, and the partials' buffer.
HWY_INLINE void PlanAttention(const AttentionWork* works, size_t n_works,
                              const AttentionDims& dims, AttentionPlan* plan) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  std::vector<AttentionSplit>& splits = plan->splits;
  splits.resize(n_works);
  int64_t items = 0;
  for (size_t i = 0; i < n_works; ++i) {
    splits[i] = SplitSequence(dims, works[i], kAttentionMinItems);
    items += HeadItems(dims, splits[i]) * splits[i].n_groups;
  }
  for (size_t i = 0; i < n_works; ++i) {
    splits[i] = SplitSequence(dims, works[i], items);
  }
  plan->first_item.assign(n_works + 1, 0);
  plan->first_partial.assign(n_works + 1, 0);
  plan->merge_first.assign(n_works + 1, 0);
  plan->partial_rows = 1;
  for (size_t i = 0; i < n_works; ++i) {
    const AttentionSplit& sp = splits[i];
    const int64_t tiles = dims.n_kv_heads * sp.n_tiles;
    plan->first_item[i + 1] =
        plan->first_item[i] + HeadItems(dims, sp) * sp.n_groups * sp.n_chunks;
    plan->first_partial[i + 1] =
        plan->first_partial[i] + (sp.merged ? tiles * sp.n_chunks : 0);
    // A sequence's segments have the same tiles (the same queries).
    plan->merge_first[i + 1] =
        plan->merge_first[i] + (sp.merged && works[i].segment == 0 ? tiles : 0);
    plan->partial_rows = std::max(plan->partial_rows, sp.tile_tokens * group);
  }
  // Whole cache lines per partial: the items that write neighbouring
  // partials run on different threads (decode: 1 x (2 + 128) floats, 520
  // bytes, would share a line with the next).
  plan->partial_floats = RoundUp(static_cast<size_t>(plan->partial_rows) *
                                     (2 + static_cast<size_t>(dims.head_dim)),
                                 size_t{16});
  if (plan->first_partial[n_works] > 0) {
    plan->partials.Get(static_cast<size_t>(plan->first_partial[n_works]) *
                       plan->partial_floats);
  }
}

// One work item: tiles [tile_begin, tile_begin + n_tiles) of KV heads
// [kv_head, kv_head + n_heads) (one head, or a pair of one-tile heads) of
// sequence `work`, over key chunk `chunk`.
struct AttentionItem {
  size_t work;
  int64_t kv_head;
  int64_t n_heads;
  int64_t tile_begin;
  int64_t n_tiles;
  int64_t chunk;
};

HWY_INLINE AttentionItem LocateItem(const AttentionDims& dims,
                                    const AttentionPlan& plan, int64_t item) {
  AttentionItem it;
  it.work = static_cast<size_t>(
      std::upper_bound(plan.first_item.begin(), plan.first_item.end(), item) -
      plan.first_item.begin() - 1);
  const AttentionSplit& sp = plan.splits[it.work];
  const int64_t local = item - plan.first_item[it.work];
  it.chunk = local % sp.n_chunks;
  const int64_t group_index = local / sp.n_chunks;
  it.kv_head = group_index / sp.n_groups * sp.head_pair;
  it.n_heads = std::min(sp.head_pair, dims.n_kv_heads - it.kv_head);
  it.tile_begin = (group_index % sp.n_groups) * sp.group_tiles;
  it.n_tiles = std::min(sp.group_tiles, sp.n_tiles - it.tile_begin);
  return it;
}

// Query tile `index` of a sequence's KV head, reading key chunk `chunk`.
HWY_INLINE AttentionTile MakeTile(const AttentionDims& dims,
                                  const AttentionWork& work,
                                  const AttentionSplit& split, int64_t kv_head,
                                  int64_t index, int64_t chunk) {
  AttentionTile tile;
  tile.work = &work;
  tile.kv_head = kv_head;
  tile.t0 = index * split.tile_tokens;
  tile.nt = std::min(split.tile_tokens, work.n_tokens - tile.t0);
  tile.rows = tile.nt * (dims.n_heads / dims.n_kv_heads);
  const int64_t chunk_begin = split.key0 + chunk * split.chunk;
  const int64_t chunk_end = std::min(work.kv_len, chunk_begin + split.chunk);
  const KeyRange seen = KeysSeenByAny(dims, work, tile.t0, tile.nt);
  tile.key_begin =
      chunk_begin + std::max<int64_t>(0, seen.begin - chunk_begin) /
                        kAttentionKeyBlock * kAttentionKeyBlock;
  tile.key_end = std::max(tile.key_begin, std::min(chunk_end, seen.end));
  return tile;
}

// The partial result of chunk `chunk` of tile `tile_index` (kv_head * n_tiles
// + tile) of sequence w: m, l and the normalised output [rows, d].
struct AttentionPartial {
  float* max;
  float* sum;
  float* out;
};
HWY_INLINE AttentionPartial PartialAt(AttentionPlan& plan, size_t w,
                                      int64_t tile_index, int64_t chunk) {
  const int64_t index =
      plan.first_partial[w] + tile_index * plan.splits[w].n_chunks + chunk;
  float* base = plan.partials.buffer.get() +
                static_cast<size_t>(index) * plan.partial_floats;
  return {base, base + plan.partial_rows, base + 2 * plan.partial_rows};
}

// ---------------------------------------------------------------------------------------------
// Running a work item.

// A wide group: tiles[0, n) over their key ranges, key block by key block
// with the tiles inside, so that each K and V block is read (KvRows::Block,
// which converts a narrower type here; on bf16 pairs the stored K rows in
// place and V^T, PairValuesT) once and serves all the tiles while it is in
// cache (every tile sees the same blocks as it would alone). The layout of
// RunWideGroup's scratch for tiles of `rows` rows: [tile][QT, OT, m, l,
// WideLanes] (tile_floats each), then ST shared by the tiles, then the K and V
// blocks' scratch (kv_floats each; converting types). On bf16 pairs
// (WidePairProducts): per tile also q's pairs [d / 2][32] words, and after the
// K and V scratch the operands the tiles share: k_tail [32][d] (AMX) and vt
// [d][key block] bf16, pt [key block / 2][32] words.
template <class T>
struct WideGroupLayout {
  WideProducts products;
  bool pairs;  // products on bf16 pairs
  size_t rp;   // rows rounded up to vectors (pairs: to 32)
  size_t tile_floats;
  size_t kv_floats;
  size_t pair_floats;  // the shared pair operands
  WideGroupLayout(const AttentionDims& dims, size_t rows)
      : products(WidePairProducts<T>(dims)),
        pairs(products != WideProducts::kFloat32),
        rp(RoundUp(rows, pairs ? static_cast<size_t>(kAttentionPairRows)
                               : hn::Lanes(AttnD()))),
        tile_floats(2 * static_cast<size_t>(dims.head_dim) * rp + 4 * rp +
                    (pairs ? static_cast<size_t>(dims.head_dim) * rp / 2 : 0)),
        kv_floats(
            KvRows<T>::ScratchFloats(static_cast<size_t>(kAttentionKeyBlock),
                                     static_cast<size_t>(dims.row_stride))),
        pair_floats(pairs ? static_cast<size_t>(kAttentionPairRows +
                                                kAttentionKeyBlock) *
                                    static_cast<size_t>(dims.head_dim) / 2 +
                                static_cast<size_t>(kAttentionKeyBlock) * rp / 2
                          : 0) {}
  // Floats for n tiles.
  size_t Floats(size_t n) const {
    return n * tile_floats + kAttentionKeyBlock * rp + 2 * kv_floats +
           pair_floats;
  }
};

template <class T>
HWY_INLINE void RunWideGroup(const AttentionDims& dims,
                             const AttentionTile* tiles, int64_t n,
                             ScratchBuffer& scratch, TileResult* results) {
  const WideGroupLayout<T> layout(dims, static_cast<size_t>(tiles[0].rows));
  const size_t rp = layout.rp;
  const size_t dim = static_cast<size_t>(dims.head_dim);
  float* buf = scratch.Get(layout.Floats(static_cast<size_t>(n)));
  float* st = buf + static_cast<size_t>(n) * layout.tile_floats;
  float* kv_scratch = st + kAttentionKeyBlock * rp;
  float* qt[kAttentionGroupTiles];
  WideLanes lanes[kAttentionGroupTiles];
  // bf16 pairs: the tiles' q pairs and the shared operands
  // (WideGroupLayout).
  hwy::bfloat16_t* qt_pairs[kAttentionGroupTiles] = {};
  WidePairs pairs{};
  pairs.amx = layout.products == WideProducts::kAmx;
  hwy::bfloat16_t* vt_buffer = nullptr;
  if (layout.pairs) {
    pairs.k_tail =
        reinterpret_cast<hwy::bfloat16_t*>(kv_scratch + 2 * layout.kv_floats);
    vt_buffer = pairs.k_tail + kAttentionPairRows * dims.head_dim;
    pairs.pt = vt_buffer + kAttentionKeyBlock * dims.head_dim;
  }
  int64_t key_begin = tiles[0].key_begin, key_end = tiles[0].key_end;
  for (int64_t i = 0; i < n; ++i) {
    qt[i] = buf + static_cast<size_t>(i) * layout.tile_floats;
    float* ot = qt[i] + dim * rp;
    float* stats = ot + dim * rp;  // m, l, then WideLanes
    results[i] = {ot, 1, rp, {stats, stats + rp}};
    lanes[i] = {stats + 2 * rp, stats + 3 * rp};
    WideTileBegin(dims, tiles[i], qt[i], ot, rp, results[i].state, lanes[i]);
#if HEADWAY_NATIVE_BF16
    if (layout.pairs) {
      qt_pairs[i] = reinterpret_cast<hwy::bfloat16_t*>(stats + 4 * rp);
      PairRows(qt[i], rp, dim, dim / 2, qt_pairs[i]);
    }
#endif
    key_begin = std::min(key_begin, tiles[i].key_begin);
    key_end = std::max(key_end, tiles[i].key_end);
  }
  const KvRows<T> keys = HeadRows<T>(dims, *tiles[0].work, KvSide::kKeys,
                                     tiles[0].kv_head, kv_scratch);
  const KvRows<T> values =
      HeadRows<T>(dims, *tiles[0].work, KvSide::kValues, tiles[0].kv_head,
                  kv_scratch + layout.kv_floats);
#if HEADWAY_NATIVE_AMX
  if (pairs.amx) AmxLoadConfig(AmxBlockConfig());
#endif
  for (int64_t k0 = key_begin; k0 < key_end; k0 += kAttentionKeyBlock) {
    const size_t n_block =
        static_cast<size_t>(std::min(kAttentionKeyBlock, key_end - k0));
    const float* k_block = nullptr;
    const float* v_block = nullptr;
    if (!layout.pairs) {
      k_block = keys.Block(k0, n_block);
      v_block = values.Block(k0, n_block);
    } else {
#if HEADWAY_NATIVE_BF16
      if constexpr (hwy::IsSame<T, hwy::bfloat16_t>()) {
        pairs.k = keys.Stored(k0);
        // V^T for every tile, unless a NaN or inf in V may sit at a key
        // that some tile hides (0 times it would reach the tile's sums):
        // then the float32 product, which skips hidden keys.
        bool may_hide = false;
        for (int64_t i = 0; i < n; ++i) {
          may_hide = may_hide || BlockMayHide(dims, *tiles[i].work, tiles[i].t0,
                                              tiles[i].nt, k0,
                                              static_cast<int64_t>(n_block));
        }
        if (!may_hide || values.Finite(k0, n_block)) {
          PairValuesT(values.Stored(k0), static_cast<size_t>(dims.row_stride),
                      n_block, dim, vt_buffer);
          pairs.vt = vt_buffer;
        } else {
          v_block = values.Block(k0, n_block);
          pairs.vt = nullptr;
        }
      }
#endif
    }
    for (int64_t i = 0; i < n; ++i) {
      if (k0 < tiles[i].key_begin || k0 >= tiles[i].key_end) continue;
      const size_t n_keys = static_cast<size_t>(
          std::min(kAttentionKeyBlock, tiles[i].key_end - k0));
      pairs.qt = qt_pairs[i];
      WideTileBlock(dims, tiles[i], k0, n_keys, k_block, v_block, qt[i], st,
                    results[i].o, rp, results[i].state, lanes[i],
                    layout.pairs ? &pairs : nullptr);
    }
  }
#if HEADWAY_NATIVE_AMX
  if (pairs.amx) AmxRelease();
#endif
}

// Floats of RunNarrowTiles' scratch per tile of `rows` rows: [qs, o, sc, m,
// l, q_scale] (a multiple of the vector length).
HWY_INLINE size_t NarrowTileFloats(const AttentionDims& dims, size_t rows) {
  const size_t N = hn::Lanes(AttnD());
  const size_t bkp = RoundUp(static_cast<size_t>(kAttentionKeyBlock), N);
  return 2 * rows * static_cast<size_t>(dims.row_stride) + rows * bkp +
         3 * RoundUp(rows, N);
}

// n narrow tiles (NarrowTiles), in the thread's scratch.
template <class T>
HWY_INLINE void RunNarrowTiles(const AttentionDims& dims,
                               const AttentionTile* tiles, int64_t n,
                               ScratchBuffer& scratch, TileResult* results) {
  const size_t N = hn::Lanes(AttnD());
  const size_t rows = static_cast<size_t>(tiles[0].rows);
  const size_t rp = RoundUp(rows, N);
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const size_t bkp = RoundUp(static_cast<size_t>(kAttentionKeyBlock), N);
  const size_t tile_floats = NarrowTileFloats(dims, rows);
  float* buf = scratch.Get(static_cast<size_t>(n) * tile_floats);
  NarrowBuffers bufs[2];
  for (int64_t i = 0; i < n; ++i) {
    float* qs = buf + static_cast<size_t>(i) * tile_floats;
    float* o = qs + rows * row_stride;
    float* sc = o + rows * row_stride;
    float* m = sc + rows * bkp;
    results[i] = {o, row_stride, 1, {m, m + rp}};
    bufs[i] = {qs, m + 2 * rp, sc, o, results[i].state};
  }
  NarrowTiles<T>(dims, tiles, static_cast<size_t>(n), bufs);
}

// Applies RowNormalizer to a finished tile's output, in place; with_sinks:
// the tile saw all of its rows' keys (no chunks to merge), so the sink
// logits join here.
HWY_INLINE void NormalizeTile(const AttentionDims& dims,
                              const AttentionTile& tile,
                              const TileResult& result, bool with_sinks) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const double to_natural = MaxToNatural(*tile.work);
  // Row r's SinkWeight (0 for padding rows, or without sinks).
  const auto sink = [&](int64_t r) {
    return with_sinks && r < tile.rows
               ? static_cast<float>(
                     SinkWeight(dims, tile.kv_head * group + r % group,
                                to_natural * result.state.max[r]))
               : 0.0f;
  };
  if (result.row_step == 1) {
    // Wide: OT [d, rp], a row per lane.
    const size_t rp = RoundUp(static_cast<size_t>(tile.rows), N);
    for (size_t j = 0; j < rp; j += N) {
      HWY_ALIGN float sinks[hn::MaxLanes(d)];
      for (size_t lane = 0; lane < N; ++lane) {
        sinks[lane] = sink(static_cast<int64_t>(j + lane));
      }
      const RowNormalizer<AttnD> normalize(d, hn::Load(d, result.state.sum + j),
                                           hn::Load(d, sinks));
      for (int64_t p = 0; p < dims.head_dim; ++p) {
        float* o = result.o + static_cast<size_t>(p) * result.col_step + j;
        hn::Store(normalize(hn::Load(d, o)), d, o);
      }
    }
    return;
  }
  // Narrow: O [rows, row_stride], a row broadcast.
  for (int64_t r = 0; r < tile.rows; ++r) {
    const RowNormalizer<AttnD> normalize(d, hn::Set(d, result.state.sum[r]),
                                         hn::Set(d, sink(r)));
    float* o_row = result.o + static_cast<size_t>(r) * result.row_step;
    for (size_t p = 0; p < result.row_step; p += N) {
      hn::Store(normalize(hn::Load(d, o_row + p)), d, o_row + p);
    }
  }
}

// Copies the rows of a normalised tile to row(r) (head_dim floats each); a
// wide tile (o transposed) in 4 x 4 blocks.
template <class RowPointer>
HWY_INLINE void CopyTileRows(const AttentionDims& dims, int64_t rows,
                             const TileResult& result, const RowPointer& row) {
  const size_t dim = static_cast<size_t>(dims.head_dim);
  int64_t r = 0;
#if HWY_TARGET != HWY_SCALAR
  if (result.row_step == 1) {
    const size_t rp = result.col_step;
    for (; r + 4 <= rows; r += 4) {
      float* out0 = row(r);
      float* out1 = row(r + 1);
      float* out2 = row(r + 2);
      float* out3 = row(r + 3);
      const float* col = result.o + r;
      size_t p = 0;
      for (; p + 4 <= dim; p += 4) {
        Transpose4x4(col + p * rp, col + (p + 1) * rp, col + (p + 2) * rp,
                     col + (p + 3) * rp, 1.0f, out0 + p, out1 + p, out2 + p,
                     out3 + p);
      }
      for (; p < dim; ++p) {
        out0[p] = col[p * rp];
        out1[p] = col[p * rp + 1];
        out2[p] = col[p * rp + 2];
        out3[p] = col[p * rp + 3];
      }
    }
  }
#endif
  for (; r < rows; ++r) {
    float* out = row(r);
    const float* o = result.o + static_cast<size_t>(r) * result.row_step;
    for (size_t p = 0; p < dim; ++p) out[p] = o[p * result.col_step];
  }
}

// Writes a normalised tile to its rows of out.
HWY_INLINE void WriteTileOutput(const AttentionDims& dims,
                                const AttentionTile& tile,
                                const TileResult& result) {
  CopyTileRows(dims, tile.rows, result,
               [&](int64_t r) { return TileOutRow(dims, tile, r); });
}

// Keeps a normalised tile's chunk for MergePartials, with m in natural units.
HWY_INLINE void SavePartial(const AttentionDims& dims,
                            const AttentionTile& tile, const TileResult& result,
                            AttentionPartial partial) {
  const float max_scale = MaxToNatural(*tile.work);
  for (int64_t r = 0; r < tile.rows; ++r) {
    partial.max[r] = max_scale * result.state.max[r];
    partial.sum[r] = result.state.sum[r];
  }
  CopyTileRows(dims, tile.rows, result,
               [&](int64_t r) { return partial.out + r * dims.head_dim; });
}

// Runs work item `item`: its wide group or narrow tile, then writes each
// tile's output, or saves it as a partial when the sequence is chunked.
template <class T>
HWY_INLINE void RunWorkItem(const AttentionWork* works,
                            const AttentionDims& dims, AttentionPlan& plan,
                            int64_t item, ScratchBuffer& scratch) {
  const AttentionItem it = LocateItem(dims, plan, item);
  const AttentionSplit& sp = plan.splits[it.work];
  // Up to kAttentionGroupTiles tiles of one head, or one tile of each head.
  AttentionTile tiles[kAttentionGroupTiles];
  const int64_t n = it.n_tiles * it.n_heads;
  for (int64_t i = 0; i < n; ++i) {
    tiles[i] = MakeTile(dims, works[it.work], sp, it.kv_head + i / it.n_tiles,
                        it.tile_begin + i % it.n_tiles, it.chunk);
  }
  TileResult results[kAttentionGroupTiles];
  if (sp.wide) {
    RunWideGroup<T>(dims, tiles, n, scratch, results);
  } else {
    RunNarrowTiles<T>(dims, tiles, n, scratch, results);
  }
  for (int64_t i = 0; i < n; ++i) {
    NormalizeTile(dims, tiles[i], results[i], !sp.merged);
    if (!sp.merged) {
      WriteTileOutput(dims, tiles[i], results[i]);
    } else {
      const int64_t tile_index =
          tiles[i].kv_head * sp.n_tiles + it.tile_begin + i % it.n_tiles;
      SavePartial(dims, tiles[i], results[i],
                  PartialAt(plan, it.work, tile_index, it.chunk));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Merging chunks.

// A tile's partial results: each chunk of each segment of its sequence (at
// most kAttentionMinItems chunks a segment: SplitSequence never cuts more).
inline constexpr int64_t kMaxPartials = kMaxKeySegments * kAttentionMinItems;

// Merges a tile's partials in segment and chunk order by log-sum-exp and
// writes the output.
HWY_INLINE void MergePartials(const AttentionDims& dims,
                              const AttentionTile& tile,
                              const AttentionPartial* partials,
                              int64_t n_chunks) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  for (int64_t r = 0; r < tile.rows; ++r) {
    float* out_row = TileOutRow(dims, tile, r);
    double m = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < n_chunks; ++c) {
      nan |= std::isnan(partials[c].sum[r]);
      if (partials[c].sum[r] > 0.0f)
        m = std::max<double>(m, partials[c].max[r]);
    }
    double weights[kMaxPartials];
    double total = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      weights[c] = partials[c].sum[r] > 0.0f
                       ? partials[c].sum[r] * std::exp(partials[c].max[r] - m)
                       : 0.0;
      total += weights[c];
    }
    const double sink =
        total > 0.0 ? SinkWeight(dims, tile.kv_head * group + r % group, m)
                    : 0.0;
    for (int64_t p = 0; p < dims.head_dim; ++p) {
      double acc = 0.0;
      for (int64_t c = 0; c < n_chunks; ++c) {
        if (weights[c] > 0.0)
          acc += weights[c] * partials[c].out[r * dims.head_dim + p];
      }
      out_row[p] = MergedRow(acc, total, sink, nan);
    }
  }
}

// Merges the chunks of every chunked tile of the call, tiles in parallel.
HWY_INLINE void MergeChunks(const AttentionWork* works, size_t n_works,
                            const AttentionDims& dims, AttentionPlan& plan) {
  const std::vector<int64_t>& merge_first = plan.merge_first;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, merge_first[n_works], 1),
      [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
        AttentionPartial partials[kMaxPartials];
        for (int64_t m = range.begin(); m < range.end(); ++m) {
          // The sequence's first segment (the last work whose merge_first is
          // <= m: later segments add no merged tiles).
          const size_t w = static_cast<size_t>(
              std::upper_bound(merge_first.begin(), merge_first.end(), m) -
              merge_first.begin() - 1);
          const AttentionSplit& sp = plan.splits[w];
          const int64_t tile_index = m - merge_first[w];
          const AttentionTile tile =
              MakeTile(dims, works[w], sp, tile_index / sp.n_tiles,
                       tile_index % sp.n_tiles, /*chunk=*/0);
          int64_t n = 0;
          for (int64_t seg = 0; seg < works[w].n_segments; ++seg) {
            const size_t ws = w + static_cast<size_t>(seg);
            for (int64_t c = 0; c < plan.splits[ws].n_chunks; ++c) {
              partials[n++] = PartialAt(plan, ws, tile_index, c);
            }
          }
          MergePartials(dims, tile, partials, n);
        }
      });
}

// The fused attention over all sequences of a call: plan, run every work item
// (sequence, KV head, tile group, key chunk), merge the chunked tiles. T: the
// stored type of K and V (dims.dtype).
template <class T>
HWY_INLINE void FusedAttention(const AttentionWork* works, size_t n_works,
                               const AttentionDims& dims, AttentionPlan* plan) {
  PlanAttention(works, n_works, dims, plan);
  // Every thread's tiles, for the call's largest item.
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  size_t tile_floats = 0;
  for (size_t i = 0; i < n_works; ++i) {
    const AttentionSplit& sp = plan->splits[i];
    const size_t rows = static_cast<size_t>(sp.tile_tokens * group);
    tile_floats = std::max(
        tile_floats, sp.wide ? WideGroupLayout<T>(dims, rows)
                                   .Floats(static_cast<size_t>(sp.group_tiles))
                             : static_cast<size_t>(sp.head_pair) *
                                   NarrowTileFloats(dims, rows));
  }
  // FusedAttentionT runs this under isolate() (ThreadSlots).
  ThreadSlots& thread_tiles = AttentionTileSlots();
  thread_tiles.Reserve(tile_floats);
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, plan->first_item[n_works], 1),
      [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
        ScratchBuffer& scratch = thread_tiles.Mine();
        for (int64_t item = range.begin(); item < range.end(); ++item) {
          RunWorkItem<T>(works, dims, *plan, item, scratch);
        }
      });
  if (plan->merge_first[n_works] > 0) MergeChunks(works, n_works, dims, *plan);
}

// The segments of one sequence of a plain cache, segs[0, n_segs): positions
// [0, kv_len) in rows contiguous from segs[0]'s (the sink tokens' segment and
// the windowed one of AttentionOptions::n_sink_tokens).
struct SequenceSegments {
  const AttentionWork* segs;
  int64_t n_segs;
  const AttentionWork& first() const { return segs[0]; }
  int64_t kv_len() const { return segs[n_segs - 1].kv_len; }
  // Whether query token t does not see key `key` (KeyHidden in its segment).
  bool KeyHidden(const AttentionDims& dims, int64_t t, int64_t key) const {
    int64_t i = n_segs - 1;
    while (i > 0 && segs[i].key_begin > key) --i;
    return HWY_NAMESPACE::KeyHidden(dims, segs[i], t, key);
  }
  // Whether some query token does not see some key (may_hide).
  bool MayHide(const AttentionDims& dims) const {
    for (int64_t i = 0; i < n_segs; ++i) {
      if (BlockMayHide(dims, segs[i], 0, segs[i].n_tokens, segs[i].key_begin,
                       segs[i].kv_len - segs[i].key_begin)) {
        return true;
      }
    }
    return false;
  }
  // Sets row[k] to -inf for the keys k in [0, kv_len) that query token t sees
  // in no segment (VisibleKeys of each: ranges in position order).
  void HideOutside(const AttentionDims& dims, int64_t t,
                   float* HWY_RESTRICT row) const {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    int64_t next = 0;  // keys before it are done
    for (int64_t i = 0; i < n_segs; ++i) {
      const KeyRange visible = VisibleKeys(dims, segs[i], t);
      std::fill(row + next, row + visible.begin, neg_inf);
      next = visible.end;
    }
    std::fill(row + next, row + kv_len(), neg_inf);
  }
};

// The materialised path for the heads of KV head g of one sequence, as the
// seed's numpy code does it with a BLAS, head by head: weights_h [n_tokens,
// kv_len] (row stride w_stride) = scale * Q_h K_g^T (matmul), masks, softmax
// (rows in parallel), out_h = weights_h V_g (matmul). keys and values: K_g and
// V_g [kv_len, row_stride] as floats. The weights are [n_heads * n_tokens,
// kv_len]: head h's rows start at h * n_tokens. Not inlined: one copy of the
// GEMMs for every stored type.
HWY_NOINLINE void MaterializedGroup(const AttentionDims& dims,
                                    const SequenceSegments& seq, int64_t g,
                                    const float* keys, const float* values,
                                    float* weights, int64_t w_stride) {
  const AttentionWork& work = seq.first();
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const size_t n_tokens = static_cast<size_t>(work.n_tokens);
  const int64_t n_keys = seq.kv_len();
  const size_t kv_len = static_cast<size_t>(n_keys);
  const size_t dim = static_cast<size_t>(dims.head_dim);
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const bool may_hide = seq.MayHide(dims);
  // The rows of V_g with a NaN or inf, where some query must not see them.
  std::vector<int64_t> bad_keys;
  if (may_hide) {
    for (int64_t s = 0; s < n_keys; ++s) {
      if (!RowsFinite(values + s * dims.row_stride, 1, row_stride)) {
        bad_keys.push_back(s);
      }
    }
  }
  // Scores in natural units here.
  const ScoreRules rules = MakeScoreRules(dims, 1.0f);
  const bool sinks = dims.sink_logits != nullptr;
  // sinks: each row's largest score (before the softmax).
  std::vector<float> row_max(sinks ? n_tokens : 0);
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    float* w = weights + h * work.n_tokens * w_stride;
    MatmulUnpackedT(
        work.q + h * dims.head_dim, static_cast<size_t>(work.q_stride),
        /*trans_a=*/false, keys, row_stride, /*trans_b=*/true, n_tokens, kv_len,
        dim, w, static_cast<size_t>(w_stride), dims.scale, 0.0f);
    if (may_hide || rules.any() || sinks) {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, work.n_tokens),
          [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
            for (int64_t t = range.begin(); t < range.end(); ++t) {
              float* row = w + t * w_stride;
              if (rules.any()) {
                RuleScoreRow(rules, h, work.q_pos0 + t, 0, row, kv_len);
              }
              if (work.mask != nullptr) {
                const float* mask_row = work.mask + t * work.mask_stride;
                for (int64_t s = 0; s < n_keys; ++s)
                  row[s] = MaskedScore(row[s], mask_row[s]);
              }
              if (may_hide) seq.HideOutside(dims, t, row);
              if (sinks) {
                bool special = false;  // NaN or +inf: the softmax's NaN row
                row_max[static_cast<size_t>(t)] =
                    SoftmaxBlockMax(row, kv_len, 1.0f, &special);
              }
            }
          });
    }
    SoftmaxRows(w, static_cast<size_t>(w_stride), w,
                static_cast<size_t>(w_stride), n_tokens, kv_len, 1.0f);
    if (sinks) {
      // softmax w_s = exp(z_s - M) / S, and 1 / S is the largest weight: with
      // the sink, w_s * S / (S + exp(sink - M)) = w_s / (1 + exp(sink - M) /
      // S).
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, work.n_tokens),
          [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
            for (int64_t t = range.begin(); t < range.end(); ++t) {
              const float m = row_max[static_cast<size_t>(t)];
              if (!std::isfinite(m)) continue;  // zeros or NaN already
              float* row = w + t * w_stride;
              const float inv_s = *std::max_element(row, row + kv_len);
              const double factor =
                  1.0 / (1.0 + SinkWeight(dims, h, m) * inv_s);
              for (size_t s = 0; s < kv_len; ++s) {
                row[s] = static_cast<float>(row[s] * factor);
              }
            }
          });
    }
    float* out = work.out + h * dims.head_dim;
    MatmulUnpackedT(w, static_cast<size_t>(w_stride), /*trans_a=*/false, values,
                    row_stride, /*trans_b=*/false, n_tokens, dim, kv_len, out,
                    static_cast<size_t>(work.out_stride), 1.0f, 0.0f);
    // A query that does not see one of the bad rows: its row again, over the
    // keys it sees (the GEMM's 0 * NaN would have reached it).
    for (int64_t t = 0; t < work.n_tokens && !bad_keys.empty(); ++t) {
      const bool hides_bad =
          std::any_of(bad_keys.begin(), bad_keys.end(),
                      [&](int64_t s) { return seq.KeyHidden(dims, t, s); });
      if (!hides_bad) continue;
      for (size_t p = 0; p < dim; ++p) {
        double acc = 0.0;
        for (int64_t s = 0; s < n_keys; ++s) {
          if (seq.KeyHidden(dims, t, s)) continue;
          acc += static_cast<double>(w[t * w_stride + s]) *
                 values[s * dims.row_stride + static_cast<int64_t>(p)];
        }
        out[t * work.out_stride + static_cast<int64_t>(p)] =
            static_cast<float>(acc);
      }
    }
  }
}

// The materialised path for one sequence: MaterializedGroup per KV head. T:
// the stored type of K and V; a narrower one is converted per KV head into K_g
// and V_g [kv_len, row_stride] floats (scratch of 2 * kv_len * row_stride
// floats).
template <class T>
HWY_INLINE void MaterializedAttention(const AttentionDims& dims,
                                      const SequenceSegments& seq,
                                      float* weights, int64_t w_stride) {
  const AttentionWork& work = seq.first();
  const size_t kv_len = static_cast<size_t>(seq.kv_len());
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const size_t kv_floats = KvRows<T>::ScratchFloats(kv_len, row_stride);
  hwy::AlignedFreeUniquePtr<float[]> kv_scratch;
  if (kv_floats > 0) {
    kv_scratch = hwy::AllocateAligned<float>(2 * kv_floats);
    if (!kv_scratch) throw std::bad_alloc();
  }
  for (int64_t g = 0; g < dims.n_kv_heads; ++g) {
    const float* keys =
        HeadRows<T>(dims, work, KvSide::kKeys, g, kv_scratch.get())
            .Block(0, kv_len);
    const float* values = HeadRows<T>(dims, work, KvSide::kValues, g,
                                      kv_scratch.get() + kv_floats)
                              .Block(0, kv_len);
    MaterializedGroup(dims, seq, g, keys, values, weights, w_stride);
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_

// Attention core: the per-target kernels (fused flash attention and the
// materialised path).
//
// Two tile kernels share one online softmax (Milakov & Gimelshein 2018; Dao et
// al. 2022):
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
//   (OuterProduct below), the softmax's max and sum run down the columns (no
//   horizontal reductions) and the rescaling factor alpha is one vector per
//   lane group. K and V are read in their cache layout.
// - Lanes along head_dim ("narrow"), when the tile has fewer query rows than
//   lanes (decode of MHA and small GQA groups): scores are dot products of q
//   rows with K rows (vectors along d), and O rows accumulate V rows. Decode is
//   bound by reading K and V, which this streams once.
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
#include <vector>

#include "hwy/aligned_allocator.h"
#include "lib/attention/attention_call.h"
#include "lib/core/blocks.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace headway {

// Keys per block: the scores of a block for a tile are 128 x 32 floats = 16 KiB
// on AVX-512. 128 rather than 64 halves the per-block costs (softmax
// bookkeeping, rescaling the output tile): causal prefill 5-15% faster in an
// A/B run here (noisy machine).
inline constexpr int64_t kAttentionKeyBlock = 128;
// Chunking aims at this many work items in a call, so that up to 64 threads
// have work however few (sequence, KV head) pairs there are (it depends on
// shapes only, never on threads).
inline constexpr int64_t kAttentionMinItems = 64;
// A wide work item runs up to this many consecutive query tiles of one KV head
// (128 query rows on AVX-512) over each key block in turn: the K and V block
// (128 KiB at head_dim 128) comes from memory once for all of them and from L2
// for the others. One tile per item read all of K and V for every 32 rows:
// MHA prefill at 2048 tokens (64 MiB of K and V) then waited on memory.
inline constexpr int64_t kAttentionGroupTiles = 4;
// A chunk has at least this many keys: shorter ones cost more in merging than
// they gain.
inline constexpr int64_t kAttentionMinChunk = 512;

// The fused path's per-thread tiles: QT, ST, OT or their narrow forms.
inline ScratchBuffer& ThreadAttentionScratch() {
  thread_local ThreadScratchBuffer scratch;
  return scratch;
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

#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "lib/core/kernels-inl.h"
#include "lib/core/transpose-inl.h"
#include "lib/softmax/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using AttnD = hn::ScalableTag<float>;

// C[i][j] (+)= sum_{k < n_k} A(i, k) * B[k][j] for kI rows i and kJ vectors j:
//   A(i, k) = a[i * a_si + k * a_sk] (broadcast), B[k][j] = b + k * b_stride +
//   j * N, C[i][j] = c + i * c_stride + j * N.
// kI * kJ accumulators stay in registers for the whole k loop (8 of them cover
// the FMA latency of two pipes x 4 cycles).
template <size_t kI, size_t kJ>
HWY_INLINE void OuterProduct(const float* HWY_RESTRICT a, size_t a_si,
                             size_t a_sk, const float* HWY_RESTRICT b,
                             size_t b_stride, size_t n_k, float* HWY_RESTRICT c,
                             size_t c_stride, bool accumulate) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  hn::Vec<AttnD> acc[kI][kJ];
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      acc[i][j] =
          accumulate ? hn::Load(d, c + i * c_stride + j * N) : hn::Zero(d);
    }
  }
  for (size_t k = 0; k < n_k; ++k) {
    hn::Vec<AttnD> bk[kJ];
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      bk[j] = hn::Load(d, b + k * b_stride + j * N);
    }
    HWY_UNROLL(8)
    for (size_t i = 0; i < kI; ++i) {
      const auto ai = hn::Set(d, a[i * a_si + k * a_sk]);
      HWY_UNROLL(8)
      for (size_t j = 0; j < kJ; ++j)
        acc[i][j] = hn::MulAdd(ai, bk[j], acc[i][j]);
    }
  }
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      hn::Store(acc[i][j], d, c + i * c_stride + j * N);
    }
  }
}

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

// C [n_i, n_vec vectors] += A B as OuterProductBlock, for few rows (n_i <
// lanes): the tiles span up to 8 vectors of C, so that B is walked row by row
// in long runs (the V rows of decode, streamed from memory) instead of in many
// narrow column passes.
template <size_t kJ>
HWY_INLINE void NarrowAccumulateColumns(const float* a, size_t a_si,
                                        size_t a_sk, const float* b,
                                        size_t b_stride, size_t n_k, float* c,
                                        size_t c_stride, size_t n_i) {
  size_t i = 0;
#if HWY_TARGET <= HWY_AVX3
  for (; i + 2 <= n_i; i += 2) {
    OuterProduct<2, kJ>(a + i * a_si, a_si, a_sk, b, b_stride, n_k,
                        c + i * c_stride, c_stride, /*accumulate=*/true);
  }
#endif
  for (; i < n_i; ++i) {
    OuterProduct<1, kJ>(a + i * a_si, a_si, a_sk, b, b_stride, n_k,
                        c + i * c_stride, c_stride, /*accumulate=*/true);
  }
}

HWY_INLINE void NarrowAccumulate(const float* a, size_t a_si, size_t a_sk,
                                 const float* b, size_t b_stride, size_t n_k,
                                 float* c, size_t c_stride, size_t n_i,
                                 size_t n_vec) {
  const size_t N = hn::Lanes(AttnD());
  size_t j = 0;
  for (; j + 8 <= n_vec; j += 8) {
    NarrowAccumulateColumns<8>(a, a_si, a_sk, b + j * N, b_stride, n_k,
                               c + j * N, c_stride, n_i);
  }
  for (; j + 4 <= n_vec; j += 4) {
    NarrowAccumulateColumns<4>(a, a_si, a_sk, b + j * N, b_stride, n_k,
                               c + j * N, c_stride, n_i);
  }
  for (; j < n_vec; ++j) {
    NarrowAccumulateColumns<1>(a, a_si, a_sk, b + j * N, b_stride, n_k,
                               c + j * N, c_stride, n_i);
  }
}

// Running statistics of the online softmax for one query row (lane).
struct OnlineSoftmaxState {
  float* max;  // m: the largest score so far (-inf: none)
  float* sum;  // l: sum of exp(score - m)
};

// The geometry of one query tile: rows r = t * group + h for tokens t in [t0,
// t0 + nt).
struct AttentionTile {
  const AttentionWork* work;
  int64_t kv_head;
  int64_t t0;
  int64_t nt;
  int64_t rows;  // nt * group
  int64_t key_begin,
      key_end;  // this item's key chunk, already cut at the causal limit
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

// Position of the tile's row r (or -1 for padding rows, which then see no key).
HWY_INLINE int64_t RowPosition(const AttentionTile& tile, int64_t group,
                               int64_t r) {
  return r < tile.rows ? tile.work->q_pos0 + tile.t0 + r / group : -1;
}

// The additive mask's rule, for every path: a -inf entry hides the key
// (whatever its score, NaN included); any other entry is added to the score in
// natural units, where every finite float is representable.
HWY_INLINE float MaskedScore(float score, float mask) {
  return mask == -std::numeric_limits<float>::infinity() ? mask : score + mask;
}

// Whether the query token t of `work` must not see key `key`: past its
// position (causal) or hidden by a -inf mask entry. A hidden key contributes
// nothing to the query, not even a NaN of its K or V row.
HWY_INLINE bool KeyHidden(const AttentionDims& dims, const AttentionWork& work,
                          int64_t t, int64_t key) {
  return (dims.causal && key > work.q_pos0 + t) ||
         (work.mask != nullptr && work.mask[t * work.mask_stride + key] ==
                                      -std::numeric_limits<float>::infinity());
}

// Whether some query token in [t0, t0 + nt) cannot see some key in [k0, k0 +
// n_keys): the blocks where P V must not let 0 * NaN through.
HWY_INLINE bool BlockMayHide(const AttentionDims& dims,
                             const AttentionWork& work, int64_t t0, int64_t k0,
                             int64_t n_keys) {
  return work.mask != nullptr ||
         (dims.causal && k0 + n_keys - 1 > work.q_pos0 + t0);
}

// Whether rows [0, n_rows) of v (row stride `stride`, a multiple of the vector
// length; columns past the head's are zero) are all finite.
HWY_INLINE bool RowsFinite(const float* HWY_RESTRICT v, size_t n_rows,
                           size_t stride) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  // x * 0 is 0 for finite x and NaN for +-inf and NaN.
  auto acc = hn::Zero(d);
  for (size_t i = 0; i < n_rows * stride; i += N) {
    acc = hn::MulAdd(hn::Load(d, v + i), hn::Zero(d), acc);
  }
  return hn::AllTrue(d, hn::Eq(acc, hn::Zero(d)));
}

// ---------------------------------------------------------------------------------------------
// Wide tiles: queries along the lanes.

// Wide tiles keep their scores in base 2: QT carries scale * log2(e), so a
// score s2 = s * log2(e) and exp(s - m) = exp2(s2 - m2). exp2 then needs no
// range reduction by ln(2), and Exp2NonPositive below is about half the
// operations of hn::Exp: the softmax step was 13% of causal prefill time.
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2 = 0.693147180559945309f;

// A tile with an additive mask keeps natural units instead (QT carries scale
// only, the mask is added, exp2 takes (s - m) * log2(e)): a mask of -FLT_MAX
// times log2(e) would overflow to -inf and hide a row that the mask leaves
// visible.
HWY_INLINE bool WideScoresInBase2(const AttentionWork& work) {
  return work.mask == nullptr;
}

// 2^x for x <= 0 (or -inf), with a relative error below 1.1e-7 (about one ulp;
// measured over [-0.5, 0.5] against float64): x = n + f, n = round(x),
// f in [-0.5, 0.5]; 2^f by a degree-6 polynomial (a Chebyshev fit of 2^f on
// [-0.5, 0.5], Horner form); 2^n built in the exponent bits. Below -127 the
// result is 0 instead of a subnormal (< 2^-126: nothing next to the row's
// maximum, whose term is 1). NaN is not preserved (the caller keeps it).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2NonPositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  x = hn::Max(x, hn::Set(d, -127.0f));
  const V n = hn::Round(x);
  const V f = hn::Sub(x, n);
  V p = hn::Set(d, 1.5469732170458883e-4f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.3400432653725147e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.61802527308464e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.550327152013779e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.24022650718688965f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931471824645996f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  // n in [-127, 0]: biased exponent n + 127 in [0, 127]; 0 gives +0.0.
  const auto bits =
      hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(d, bits));
}

// Online-softmax step on a block of scores st [n_keys, rp] (lanes = query
// rows; base 2, or natural units when !kBase2): masks applied already (-inf).
// Replaces st by P = exp(st - m_new), rescales ot [d, rp] by alpha and updates
// m, l (m in the scores' units). A lane whose scores are all -inf so far keeps
// m = -inf and P = 0.
template <bool kBase2>
HWY_INLINE void WideSoftmaxStep(float* HWY_RESTRICT st, size_t n_keys,
                                size_t rp, float* HWY_RESTRICT ot, size_t dim,
                                OnlineSoftmaxState state) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto to_base2 = hn::Set(d, kLog2e);
  // exp(a - b), NaN where a - b is NaN (a NaN score, or +inf - +inf).
  const auto exp_of_difference = [&](auto a, auto b) HWY_ATTR {
    const auto x = hn::Sub(a, b);
    const auto e = Exp2NonPositive(d, kBase2 ? x : hn::Mul(x, to_base2));
    return hn::IfThenElse(hn::IsNaN(x), x, e);
  };
  for (size_t j = 0; j < rp; j += N) {
    const auto m_old = hn::Load(d, state.max + j);
    auto m_new = m_old;
    for (size_t s = 0; s < n_keys; ++s) {
      m_new = hn::Max(m_new, hn::Load(d, st + s * rp + j));
    }
    // -inf - (-inf) would be NaN: a lane with no score yet subtracts 0
    // instead.
    const auto m_use = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
    const auto alpha = exp_of_difference(m_old, m_use);
    auto sum = hn::Zero(d);
    for (size_t s = 0; s < n_keys; ++s) {
      const auto score = hn::Load(d, st + s * rp + j);
      // A NaN score stays NaN so that it reaches the output.
      const auto p = exp_of_difference(score, m_use);
      hn::Store(p, d, st + s * rp + j);
      sum = hn::Add(sum, p);
    }
    hn::Store(hn::MulAdd(hn::Load(d, state.sum + j), alpha, sum), d,
              state.sum + j);
    hn::Store(m_new, d, state.max + j);
    for (size_t p = 0; p < dim; ++p) {
      hn::Store(hn::Mul(hn::Load(d, ot + p * rp + j), alpha), d,
                ot + p * rp + j);
    }
  }
}

// Starts a wide tile: QT [d, rp] from the queries (scale * log2(e) * q, or
// scale * q in natural units), OT
// [d, rp] = 0, m = -inf, l = 0 per lane.
HWY_INLINE void WideTileBegin(const AttentionDims& dims,
                              const AttentionTile& tile, float* HWY_RESTRICT qt,
                              float* HWY_RESTRICT ot, size_t rp,
                              OnlineSoftmaxState state) {
  const size_t dim = static_cast<size_t>(dims.head_dim);
  const float qscale =
      WideScoresInBase2(*tile.work) ? dims.scale * kLog2e : dims.scale;
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

// One key block [k0, k0 + n_keys) of the tile's KV head on a wide tile:
// scores into st [n_keys, rp], masks, online softmax, OT += V^T P.
HWY_INLINE void WideTileBlock(const AttentionDims& dims,
                              const AttentionTile& tile, int64_t k0,
                              size_t n_keys, const float* HWY_RESTRICT qt,
                              float* HWY_RESTRICT st, float* HWY_RESTRICT ot,
                              size_t rp, OnlineSoftmaxState state) {
  const AttnD d;
  const hn::RebindToSigned<AttnD> di;
  const size_t N = hn::Lanes(d);
  const size_t dim = static_cast<size_t>(dims.head_dim);
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const AttentionWork& work = *tile.work;
  const int64_t first_pos = work.q_pos0 + tile.t0;
  const float* keys = work.keys + tile.kv_head * dims.head_stride;
  const float* values = work.values + tile.kv_head * dims.head_stride;
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());

  // ST [n_keys, rp] = K[k0 .. k0 + n_keys) QT.
  OuterProductBlock(keys + k0 * dims.row_stride, row_stride, 1, qt, rp, dim, st,
                    rp, n_keys, rp / N, /*accumulate=*/false);
  // Causal mask, only on blocks that cross the diagonal of some lane.
  const bool crossing =
      dims.causal && k0 + static_cast<int64_t>(n_keys) - 1 > first_pos;
  if (crossing) {
    for (size_t j = 0; j < rp; j += N) {
      // Positions of the lanes (-1 for padding rows, which see no key).
      HWY_ALIGN int32_t pos[hn::MaxLanes(di)];
      for (size_t lane = 0; lane < N; ++lane) {
        pos[lane] = static_cast<int32_t>(
            RowPosition(tile, group, static_cast<int64_t>(j + lane)));
      }
      const auto vpos = hn::Load(di, pos);
      for (size_t s = 0; s < n_keys; ++s) {
        const auto key = hn::Set(di, static_cast<int32_t>(k0 + s));
        const auto hidden = hn::RebindMask(d, hn::Gt(key, vpos));
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
  if (WideScoresInBase2(work)) {
    WideSoftmaxStep<true>(st, n_keys, rp, ot, dim, state);
  } else {
    WideSoftmaxStep<false>(st, n_keys, rp, ot, dim, state);
  }
  // OT [d, rp] += V[k0 .. k0 + n_keys)^T PT: A(i = p, k = s) = V[s, p].
  const float* v_block = values + k0 * dims.row_stride;
  if (!BlockMayHide(dims, work, tile.t0, k0, static_cast<int64_t>(n_keys)) ||
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

// Dot product of two rows of n floats, n a multiple of the vector length (rows
// zero-padded).
HWY_INLINE float DotPadded(const float* HWY_RESTRICT a,
                           const float* HWY_RESTRICT b, size_t n) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::Load(d, a + i), hn::Load(d, b + i), acc0);
    acc1 = hn::MulAdd(hn::Load(d, a + i + N), hn::Load(d, b + i + N), acc1);
  }
  if (i < n) acc0 = hn::MulAdd(hn::Load(d, a + i), hn::Load(d, b + i), acc0);
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
}

// Scores sc[r * bkp + s] = qs_r . K[k0 + s] of a key block, key by key. With
// kPrefetch (several query rows: the dot products take long enough per key
// that the hardware prefetchers fall behind), K rows 16 keys ahead and the
// block's V rows are prefetched as the keys go by. Measured on Zen 5, decode at
// 16384 keys: GQA-8 (4 rows) 67/73% -> 82/100% of the read bandwidth (1/2
// threads); for MHA (1 row) it cost 6-9%, so one row does without.
template <bool kPrefetch>
HWY_INLINE void NarrowScores(const float* HWY_RESTRICT keys,
                             const float* HWY_RESTRICT values, int64_t k0,
                             size_t n_keys, const float* HWY_RESTRICT qs,
                             size_t rows, size_t row_stride,
                             float* HWY_RESTRICT sc, size_t bkp) {
  for (size_t s = 0; s < n_keys; ++s) {
    const float* k_row = keys + (static_cast<size_t>(k0) + s) * row_stride;
    if constexpr (kPrefetch) {
      const float* v_row = values + (static_cast<size_t>(k0) + s) * row_stride;
      for (size_t p = 0; p < row_stride; p += 16) {
        hwy::Prefetch(k_row + 16 * row_stride + p);
        hwy::Prefetch(v_row + p);
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      sc[r * bkp + s] = DotPadded(qs + r * row_stride, k_row, row_stride);
    }
  }
}

// One work item on a narrow tile. qs [rows, row_stride]: scale * q,
// zero-padded; sc [rows, bkp] scores (bkp: the key block rounded up to
// vectors); o [rows, row_stride] unnormalised output.
HWY_INLINE void NarrowTile(const AttentionDims& dims, const AttentionTile& tile,
                           float* HWY_RESTRICT qs, float* HWY_RESTRICT sc,
                           float* HWY_RESTRICT o, OnlineSoftmaxState state) {
  const AttnD d;
  const size_t N = hn::Lanes(d);
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  const size_t rows = static_cast<size_t>(tile.rows);
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const AttentionWork& work = *tile.work;
  const size_t bkp = RoundUp(static_cast<size_t>(kAttentionKeyBlock), N);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  for (size_t r = 0; r < rows; ++r) {
    const float* q_row = TileQRow(dims, tile, static_cast<int64_t>(r));
    float* qs_row = qs + r * row_stride;
    for (int64_t p = 0; p < dims.head_dim; ++p)
      qs_row[p] = dims.scale * q_row[p];
    std::fill(qs_row + dims.head_dim, qs_row + row_stride, 0.0f);
  }
  std::fill(o, o + rows * row_stride, 0.0f);
  std::fill(state.max, state.max + rows, neg_inf);
  std::fill(state.sum, state.sum + rows, 0.0f);

  const float* keys = work.keys + tile.kv_head * dims.head_stride;
  const float* values = work.values + tile.kv_head * dims.head_stride;
  for (int64_t k0 = tile.key_begin; k0 < tile.key_end;
       k0 += kAttentionKeyBlock) {
    const size_t n_keys =
        static_cast<size_t>(std::min(kAttentionKeyBlock, tile.key_end - k0));
    // Scores key by key: a K row comes from memory once and serves every query
    // row while it is in L1 (row by row, the first row would stream K and the
    // others re-read it).
    if (rows > 1) {
      NarrowScores<true>(keys, values, k0, n_keys, qs, rows, row_stride, sc,
                         bkp);
    } else {
      NarrowScores<false>(keys, values, k0, n_keys, qs, rows, row_stride, sc,
                          bkp);
    }
    // Masks: the additive one, then -inf past each row's position (causal).
    for (size_t r = 0; r < rows; ++r) {
      const int64_t t = tile.t0 + static_cast<int64_t>(r) / group;
      float* sc_row = sc + r * bkp;
      if (work.mask) {
        const float* mask_row = work.mask + t * work.mask_stride + k0;
        for (size_t s = 0; s < n_keys; ++s)
          sc_row[s] = MaskedScore(sc_row[s], mask_row[s]);
      }
      if (dims.causal) {
        const int64_t visible_end = std::max<int64_t>(
            0, std::min<int64_t>(n_keys, work.q_pos0 + t + 1 - k0));
        std::fill(sc_row + visible_end, sc_row + n_keys, neg_inf);
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      float* sc_row = sc + r * bkp;
      std::fill(sc_row + n_keys, sc_row + bkp, neg_inf);

      // Online softmax along the row (vectors along keys).
      auto vmax = hn::Set(d, neg_inf);
      for (size_t s = 0; s < bkp; s += N)
        vmax = hn::Max(vmax, hn::Load(d, sc_row + s));
      const float m_old = state.max[r];
      const float m_new = std::max(m_old, MaxLane(d, vmax));
      const float m_use = m_new == neg_inf ? 0.0f : m_new;
      const auto vm_use = hn::Set(d, m_use);
      auto vsum = hn::Zero(d);
      for (size_t s = 0; s < bkp; s += N) {
        // NaN where score - m is NaN (a NaN score, or +inf - +inf).
        const auto x = hn::Sub(hn::Load(d, sc_row + s), vm_use);
        const auto p = hn::IfThenElse(hn::IsNaN(x), x, ExpNaNToZero(d, x));
        hn::Store(p, d, sc_row + s);
        vsum = hn::Add(vsum, p);
      }
      const float alpha = m_old == neg_inf ? 0.0f : std::exp(m_old - m_use);
      state.sum[r] =
          state.sum[r] * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
      state.max[r] = m_new;

      // o[r] *= alpha; the sum over this block's keys comes below for all rows
      // at once.
      float* o_row = o + r * row_stride;
      const auto valpha = hn::Set(d, alpha);
      for (size_t p = 0; p < row_stride; p += N) {
        hn::Store(hn::Mul(hn::Load(d, o_row + p), valpha), d, o_row + p);
      }
    }
    // O [rows, row_stride] += P [rows, n_keys] V [n_keys, row_stride].
    const float* v_block = values + k0 * dims.row_stride;
    if (!BlockMayHide(dims, work, tile.t0, k0, static_cast<int64_t>(n_keys)) ||
        RowsFinite(v_block, n_keys, row_stride)) {
      NarrowAccumulate(sc, bkp, 1, v_block, row_stride, n_keys, o, row_stride,
                       rows, row_stride / N);
      continue;
    }
    // A NaN or inf in V where some row must not see it: the same FMAs key by
    // key, skipping the keys a row does not see (their 0 * V adds nothing).
    for (size_t r = 0; r < rows; ++r) {
      const int64_t t = tile.t0 + static_cast<int64_t>(r) / group;
      for (size_t s = 0; s < n_keys; ++s) {
        if (KeyHidden(dims, work, t, k0 + static_cast<int64_t>(s))) continue;
        const auto p = hn::Set(d, sc[r * bkp + s]);
        for (size_t c = 0; c < row_stride; c += N) {
          float* o_at = o + r * row_stride + c;
          hn::Store(hn::MulAdd(p, hn::Load(d, v_block + s * row_stride + c),
                               hn::Load(d, o_at)),
                    d, o_at);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Planning and the parallel loop.

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
  split.chunk = RoundUp(std::max<int64_t>(work.kv_len, 1), kAttentionKeyBlock);
  if (items_without_chunks < kAttentionMinItems) {
    const int64_t want =
        (kAttentionMinItems + items_without_chunks - 1) / items_without_chunks;
    const int64_t chunk =
        RoundUp(std::max(kAttentionMinChunk, (work.kv_len + want - 1) / want),
                kAttentionKeyBlock);
    split.chunk = std::min(split.chunk, chunk);
  }
  split.n_chunks = (work.kv_len + split.chunk - 1) / split.chunk;
  return split;
}

// Query tile `index` of a sequence's KV head (its key range left to the
// caller).
HWY_INLINE AttentionTile MakeTile(const AttentionDims& dims,
                                  const AttentionWork& work,
                                  const AttentionSplit& split, int64_t kv_head,
                                  int64_t index) {
  AttentionTile tile;
  tile.work = &work;
  tile.kv_head = kv_head;
  tile.t0 = index * split.tile_tokens;
  tile.nt = std::min(split.tile_tokens, work.n_tokens - tile.t0);
  tile.rows = tile.nt * (dims.n_heads / dims.n_kv_heads);
  tile.key_begin = tile.key_end = 0;
  return tile;
}

// Writes the normalised output of a finished tile (one chunk) to out, or zeros
// for rows that saw no key. o(r, p) = o[r * o_rs + p * o_ps].
HWY_INLINE void WriteTileOutput(const AttentionDims& dims,
                                const AttentionTile& tile, const float* o,
                                size_t o_rs, size_t o_ps, const float* sum) {
  const auto out_row = [&](int64_t r) { return TileOutRow(dims, tile, r); };
  for (int64_t r = 0; r < tile.rows; ++r) {
    float* out = out_row(r);
    const float l = sum[r];
    const float inv = l > 0.0f || std::isnan(l) ? 1.0f / l : 0.0f;
    for (int64_t p = 0; p < dims.head_dim; ++p) {
      out[p] = l > 0.0f || std::isnan(l) ? o[r * o_rs + p * o_ps] * inv : 0.0f;
    }
  }
}

// WriteTileOutput for a wide tile, OT [d, rp] (o(r, p) = ot[p * rp + r]):
// normalises OT in place, by lanes, then transposes it into the output rows
// in 4 x 4 blocks. Same values as WriteTileOutput.
HWY_INLINE void WriteWideTileOutput(const AttentionDims& dims,
                                    const AttentionTile& tile,
                                    float* HWY_RESTRICT ot, size_t rp,
                                    const float* sum) {
#if HWY_TARGET == HWY_SCALAR
  WriteTileOutput(dims, tile, ot, 1, rp, sum);
#else
  const AttnD d;
  const size_t N = hn::Lanes(d);
  const size_t dim = static_cast<size_t>(dims.head_dim);
  for (size_t j = 0; j < rp; j += N) {
    const auto l = hn::Load(d, sum + j);
    // Rows that saw no key (l == 0) are zeros; a NaN sum stays NaN.
    const auto keep = hn::Or(hn::Gt(l, hn::Zero(d)), hn::IsNaN(l));
    const auto inv = hn::Div(hn::Set(d, 1.0f), l);
    for (size_t p = 0; p < dim; ++p) {
      float* row = ot + p * rp + j;
      hn::Store(hn::IfThenElseZero(keep, hn::Mul(hn::Load(d, row), inv)), d,
                row);
    }
  }
  const auto out_row = [&](int64_t r) { return TileOutRow(dims, tile, r); };
  int64_t r = 0;
  for (; r + 4 <= tile.rows; r += 4) {
    float* out0 = out_row(r);
    float* out1 = out_row(r + 1);
    float* out2 = out_row(r + 2);
    float* out3 = out_row(r + 3);
    const float* col = ot + r;
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
  for (; r < tile.rows; ++r) {
    float* out = out_row(r);
    for (size_t p = 0; p < dim; ++p) out[p] = ot[p * rp + r];
  }
#endif
}

// A chunk's result kept for merging: m, l and the normalised output [rows, d].
struct AttentionPartial {
  float* max;
  float* sum;
  float* out;
};

// max_scale converts the tile's m to natural units (kLn2 for the base-2 wide
// tiles, 1 for narrow ones).
HWY_INLINE void SavePartial(const AttentionDims& dims,
                            const AttentionTile& tile, const float* o,
                            size_t o_rs, size_t o_ps, OnlineSoftmaxState state,
                            float max_scale, AttentionPartial partial) {
  for (int64_t r = 0; r < tile.rows; ++r) {
    partial.max[r] = max_scale * state.max[r];
    partial.sum[r] = state.sum[r];
    const float l = state.sum[r];
    const float inv = l > 0.0f || std::isnan(l) ? 1.0f / l : 0.0f;
    for (int64_t p = 0; p < dims.head_dim; ++p) {
      partial.out[r * dims.head_dim + p] = o[r * o_rs + p * o_ps] * inv;
    }
  }
}

// Merges a tile's chunks in chunk order by log-sum-exp and writes the output.
HWY_INLINE void MergePartials(const AttentionDims& dims,
                              const AttentionTile& tile,
                              const AttentionPartial* partials,
                              int64_t n_chunks) {
  for (int64_t r = 0; r < tile.rows; ++r) {
    float* out_row = TileOutRow(dims, tile, r);
    double m = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < n_chunks; ++c) {
      nan |= std::isnan(partials[c].sum[r]);
      if (partials[c].sum[r] > 0.0f)
        m = std::max<double>(m, partials[c].max[r]);
    }
    // At most kAttentionMinItems chunks (SplitSequence never cuts more).
    double weights[kAttentionMinItems];
    double total = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      weights[c] = partials[c].sum[r] > 0.0f
                       ? partials[c].sum[r] * std::exp(partials[c].max[r] - m)
                       : 0.0;
      total += weights[c];
    }
    for (int64_t p = 0; p < dims.head_dim; ++p) {
      double acc = 0.0;
      for (int64_t c = 0; c < n_chunks; ++c) {
        if (weights[c] > 0.0)
          acc += weights[c] * partials[c].out[r * dims.head_dim + p];
      }
      out_row[p] = nan ? std::numeric_limits<float>::quiet_NaN()
                       : (total > 0.0 ? static_cast<float>(acc / total) : 0.0f);
    }
  }
}

// The fused attention over all sequences of a call.
HWY_INLINE void FusedAttention(const AttentionWork* works, size_t n_works,
                               const AttentionDims& dims, AttentionPlan* plan) {
  const size_t N = hn::Lanes(AttnD());
  const int64_t group = dims.n_heads / dims.n_kv_heads;

  // Count items before chunking (depends on shapes only), then split each
  // sequence.
  std::vector<AttentionSplit>& splits = plan->splits;
  splits.resize(n_works);
  int64_t items = 0;
  for (size_t i = 0; i < n_works; ++i) {
    splits[i] = SplitSequence(dims, works[i], kAttentionMinItems);
    items += dims.n_kv_heads * splits[i].n_groups;
  }
  for (size_t i = 0; i < n_works; ++i) {
    splits[i] = SplitSequence(dims, works[i], items);
  }
  // Item index ranges per sequence, and partial buffers for chunked tiles.
  std::vector<int64_t>& first_item = plan->first_item;
  std::vector<int64_t>& first_partial = plan->first_partial;
  first_item.assign(n_works + 1, 0);
  first_partial.assign(n_works + 1, 0);
  for (size_t i = 0; i < n_works; ++i) {
    const AttentionSplit& sp = splits[i];
    const int64_t tiles = dims.n_kv_heads * sp.n_tiles;
    first_item[i + 1] =
        first_item[i] + dims.n_kv_heads * sp.n_groups * sp.n_chunks;
    first_partial[i + 1] =
        first_partial[i] + (sp.n_chunks > 1 ? tiles * sp.n_chunks : 0);
  }
  const int64_t max_rows = [&] {
    int64_t rows = 1;
    for (size_t i = 0; i < n_works; ++i) {
      rows = std::max(rows, splits[i].tile_tokens * group);
    }
    return rows;
  }();
  const size_t partial_floats =
      static_cast<size_t>(max_rows) * (2 + static_cast<size_t>(dims.head_dim));
  float* partial_buffer =
      first_partial[n_works] > 0
          ? plan->partials.Get(static_cast<size_t>(first_partial[n_works]) *
                               partial_floats)
          : nullptr;
  const auto partial_at = [&](int64_t index) {
    float* base = partial_buffer + static_cast<size_t>(index) * partial_floats;
    return AttentionPartial{base, base + max_rows, base + 2 * max_rows};
  };

  // Phase 1: every (sequence, KV head, tile, chunk).
  const int64_t n_items = first_item[n_works];
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, n_items, 1),
      [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
        for (int64_t item = range.begin(); item < range.end(); ++item) {
          const size_t w = static_cast<size_t>(
              std::upper_bound(first_item.begin(), first_item.end(), item) -
              first_item.begin() - 1);
          const AttentionSplit& sp = splits[w];
          const int64_t local = item - first_item[w];
          const int64_t chunk = local % sp.n_chunks;
          const int64_t group_index = local / sp.n_chunks;
          const int64_t kv_head = group_index / sp.n_groups;
          const int64_t tile_begin =
              (group_index % sp.n_groups) * sp.group_tiles;
          const int64_t n_group =
              std::min(sp.group_tiles, sp.n_tiles - tile_begin);
          AttentionTile tiles[kAttentionGroupTiles];
          int64_t key_end = 0;
          for (int64_t i = 0; i < n_group; ++i) {
            AttentionTile& tile = tiles[i];
            tile = MakeTile(dims, works[w], sp, kv_head, tile_begin + i);
            tile.key_begin = chunk * sp.chunk;
            tile.key_end = std::min(works[w].kv_len, tile.key_begin + sp.chunk);
            if (dims.causal) {
              // Keys after the tile's last position are skipped entirely.
              tile.key_end =
                  std::min(tile.key_end, works[w].q_pos0 + tile.t0 + tile.nt);
            }
            key_end = std::max(key_end, tile.key_end);
          }
          const int64_t key_begin = chunk * sp.chunk;
          const size_t rows = static_cast<size_t>(tiles[0].rows);
          const size_t rp = RoundUp(rows, N);
          const size_t dim = static_cast<size_t>(dims.head_dim);
          const size_t row_stride = static_cast<size_t>(dims.row_stride);
          const size_t bkp =
              RoundUp(static_cast<size_t>(kAttentionKeyBlock), N);
          ScratchBuffer& scratch = ThreadAttentionScratch();
          // Per tile: its output o, the layout of o and its softmax state.
          float* o[kAttentionGroupTiles];
          OnlineSoftmaxState state[kAttentionGroupTiles];
          size_t o_rs, o_ps;
          if (sp.wide) {
            // [tile][QT, OT, m, l], then ST shared by the tiles.
            const size_t tile_floats = 2 * dim * rp + 2 * rp;
            float* buf =
                scratch.Get(static_cast<size_t>(n_group) * tile_floats +
                            kAttentionKeyBlock * rp);
            float* st = buf + static_cast<size_t>(n_group) * tile_floats;
            float* qt[kAttentionGroupTiles];
            for (int64_t i = 0; i < n_group; ++i) {
              qt[i] = buf + static_cast<size_t>(i) * tile_floats;
              o[i] = qt[i] + dim * rp;
              state[i] = {o[i] + dim * rp, o[i] + dim * rp + rp};
              WideTileBegin(dims, tiles[i], qt[i], o[i], rp, state[i]);
            }
            // Key blocks outside, tiles inside: each K and V block serves all
            // the tiles while it is in cache. Every tile sees the same blocks
            // as it would alone.
            for (int64_t k0 = key_begin; k0 < key_end;
                 k0 += kAttentionKeyBlock) {
              for (int64_t i = 0; i < n_group; ++i) {
                if (k0 >= tiles[i].key_end) continue;
                const size_t n_keys = static_cast<size_t>(
                    std::min(kAttentionKeyBlock, tiles[i].key_end - k0));
                WideTileBlock(dims, tiles[i], k0, n_keys, qt[i], st, o[i], rp,
                              state[i]);
              }
            }
            o_rs = 1;
            o_ps = rp;
          } else {
            float* buf =
                scratch.Get(2 * rows * row_stride + rows * bkp + 2 * rp);
            float* qs = buf;
            o[0] = qs + rows * row_stride;
            float* sc = o[0] + rows * row_stride;
            state[0] = {sc + rows * bkp, sc + rows * bkp + rp};
            if (tiles[0].key_begin < tiles[0].key_end) {
              NarrowTile(dims, tiles[0], qs, sc, o[0], state[0]);
            } else {
              std::fill(state[0].max, state[0].max + rows, -INFINITY);
              std::fill(state[0].sum, state[0].sum + rows, 0.0f);
            }
            o_rs = row_stride;
            o_ps = 1;
          }
          for (int64_t i = 0; i < n_group; ++i) {
            if (sp.n_chunks == 1 && sp.wide) {
              WriteWideTileOutput(dims, tiles[i], o[i], o_ps, state[i].sum);
            } else if (sp.n_chunks == 1) {
              WriteTileOutput(dims, tiles[i], o[i], o_rs, o_ps, state[i].sum);
            } else {
              const int64_t tile_index = kv_head * sp.n_tiles + tile_begin + i;
              SavePartial(dims, tiles[i], o[i], o_rs, o_ps, state[i],
                          sp.wide && WideScoresInBase2(works[w]) ? kLn2 : 1.0f,
                          partial_at(first_partial[w] +
                                     tile_index * sp.n_chunks + chunk));
            }
          }
        }
      });

  // Phase 2: merge the chunks of chunked tiles, in chunk order.
  if (first_partial[n_works] == 0) return;
  std::vector<int64_t>& merge_first = plan->merge_first;
  merge_first.assign(n_works + 1, 0);
  for (size_t i = 0; i < n_works; ++i) {
    merge_first[i + 1] =
        merge_first[i] +
        (splits[i].n_chunks > 1 ? dims.n_kv_heads * splits[i].n_tiles : 0);
  }
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, merge_first[n_works], 1),
      [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
        // At most kAttentionMinItems chunks (SplitSequence never cuts more).
        AttentionPartial partials[kAttentionMinItems];
        for (int64_t m = range.begin(); m < range.end(); ++m) {
          const size_t w = static_cast<size_t>(
              std::upper_bound(merge_first.begin(), merge_first.end(), m) -
              merge_first.begin() - 1);
          const AttentionSplit& sp = splits[w];
          const int64_t tile_index = m - merge_first[w];
          const AttentionTile tile =
              MakeTile(dims, works[w], sp, tile_index / sp.n_tiles,
                       tile_index % sp.n_tiles);
          for (int64_t c = 0; c < sp.n_chunks; ++c) {
            partials[c] =
                partial_at(first_partial[w] + tile_index * sp.n_chunks + c);
          }
          MergePartials(dims, tile, partials, sp.n_chunks);
        }
      });
}

// The materialised path for one sequence, as the seed's numpy code does it with
// a BLAS, head by head: weights_h [n_tokens, kv_len] (row stride w_stride) =
// scale * Q_h K_g^T (matmul), masks, softmax (rows in parallel), out_h =
// weights_h V_g (matmul). The weights are [n_heads * n_tokens, kv_len]: head
// h's rows start at h * n_tokens.
HWY_INLINE void MaterializedAttention(const AttentionDims& dims,
                                      const AttentionWork& work, float* weights,
                                      int64_t w_stride) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const size_t n_tokens = static_cast<size_t>(work.n_tokens);
  const size_t kv_len = static_cast<size_t>(work.kv_len);
  const size_t dim = static_cast<size_t>(dims.head_dim);
  const size_t row_stride = static_cast<size_t>(dims.row_stride);
  std::vector<int64_t> bad_keys;
  for (int64_t h = 0; h < dims.n_heads; ++h) {
    const int64_t g = h / group;
    const float* keys = work.keys + g * dims.head_stride;
    const float* values = work.values + g * dims.head_stride;
    float* w = weights + h * work.n_tokens * w_stride;
    MatmulUnpackedT(
        work.q + h * dims.head_dim, static_cast<size_t>(work.q_stride),
        /*trans_a=*/false, keys, row_stride, /*trans_b=*/true, n_tokens, kv_len,
        dim, w, static_cast<size_t>(w_stride), dims.scale, 0.0f);
    if (dims.causal || work.mask != nullptr) {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, work.n_tokens),
          [&](const tbb::blocked_range<int64_t>& range) HWY_ATTR {
            for (int64_t t = range.begin(); t < range.end(); ++t) {
              float* row = w + t * w_stride;
              if (work.mask != nullptr) {
                const float* mask_row = work.mask + t * work.mask_stride;
                for (int64_t s = 0; s < work.kv_len; ++s)
                  row[s] = MaskedScore(row[s], mask_row[s]);
              }
              if (dims.causal) {
                for (int64_t s = work.q_pos0 + t + 1; s < work.kv_len; ++s) {
                  row[s] = -std::numeric_limits<float>::infinity();
                }
              }
            }
          });
    }
    SoftmaxRows(w, static_cast<size_t>(w_stride), w,
                static_cast<size_t>(w_stride), n_tokens, kv_len, 1.0f);
    float* out = work.out + h * dims.head_dim;
    MatmulUnpackedT(w, static_cast<size_t>(w_stride), /*trans_a=*/false, values,
                    row_stride, /*trans_b=*/false, n_tokens, dim, kv_len, out,
                    static_cast<size_t>(work.out_stride), 1.0f, 0.0f);
    if (h % group == 0) {
      // The rows of V_g with a NaN or inf, where some query must not see them.
      bad_keys.clear();
      if (BlockMayHide(dims, work, 0, 0, work.kv_len)) {
        for (int64_t s = 0; s < work.kv_len; ++s) {
          if (!RowsFinite(values + s * dims.row_stride, 1, row_stride)) {
            bad_keys.push_back(s);
          }
        }
      }
    }
    // A query that does not see one of them: its row again, over the keys it
    // sees (the GEMM's 0 * NaN would have reached it).
    for (int64_t t = 0; t < work.n_tokens && !bad_keys.empty(); ++t) {
      const bool hides_bad =
          std::any_of(bad_keys.begin(), bad_keys.end(),
                      [&](int64_t s) { return KeyHidden(dims, work, t, s); });
      if (!hides_bad) continue;
      for (size_t p = 0; p < dim; ++p) {
        double acc = 0.0;
        for (int64_t s = 0; s < work.kv_len; ++s) {
          if (KeyHidden(dims, work, t, s)) continue;
          acc += static_cast<double>(w[t * w_stride + s]) *
                 values[s * dims.row_stride + static_cast<int64_t>(p)];
        }
        out[t * work.out_stride + static_cast<int64_t>(p)] =
            static_cast<float>(acc);
      }
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_ATTENTION_INL_H_

// The wide attention tiles' two products on bf16 pairs
// (AttentionCompute::kBFloat16 on a bf16 cache, head_dim a multiple of 32; the
// rule: attention-inl.h's WidePairProducts): prefill, in the wide tiles'
// transposed layout (attention-inl.h):
//
//   ST [keys, 32]  = K [keys, d] (the stored rows, read in place)
//                    x QT (q's pairs: PairRows of QT, once per tile)
//   OT [d, 32]    += V^T (PairValuesT: V's pairs transposed, once per key
//                    block for the group's tiles)
//                    x PT (the softmax weights' pairs: PairRows of ST)
//
// on AMX tiles where AmxBFloat16Active() (AmxScoresT, AmxAccumulateT: 32 x 32
// blocks of AmxBlockSteps, native_dot-inl.h), else by vdpbf16ps where
// NativeBFloat16Active() (DotScoresT, DotAccumulateT: the float32 tiles'
// OuterProduct on PairProducts, two products per lane and instruction,
// outer_product-inl.h). q times the scale and P are rounded to bf16 as they are
// paired (nearest even; denormals to 0), K and V are stored bf16, so every
// product is exact; tdpbf16ps and vdpbf16ps round each addition to nearest even
// and read and write denormals as 0 (AttentionCompute::kBFloat16's bound).
// Included by attention-inl.h alone, whose RunWideGroup calls them.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_ATTENTION_PAIR_TILES_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ATTENTION_PAIR_TILES_INL_H_
#undef HEADWAY_LIB_ATTENTION_PAIR_TILES_INL_H_
#else
#define HEADWAY_LIB_ATTENTION_PAIR_TILES_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include <algorithm>

#include "hwy/highway.h"
#include "lib/attention/outer_product-inl.h"
#include "lib/core/native_dot-inl.h"
#include "lib/core/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

#if HEADWAY_NATIVE_BF16

// Keys per block (attention-inl.h's kAttentionKeyBlock) and a pair tile's
// rows, the columns of the operands below (kAttentionPairRows).
inline constexpr size_t kPairKeys = static_cast<size_t>(kAttentionKeyBlock);
inline constexpr size_t kPairCols = static_cast<size_t>(kAttentionPairRows);

// 16 floats; 16 words (pairs of bf16); 16 bf16 bit patterns.
using PairF32 = hn::Full512<float>;
using PairU32 = hn::Full512<uint32_t>;
using PairU16x16 = hn::Full256<uint16_t>;

// The words of 16 pairs (a[c], b[c]), a's in the low half: 16 bf16 of two
// rows' columns made pairs.
HWY_INLINE hn::Vec<PairU32> PairWords(hn::Vec<PairU16x16> a,
                                      hn::Vec<PairU16x16> b) {
  const PairU32 du;
  return hn::Or(hn::PromoteTo(du, a), hn::ShiftLeft<16>(hn::PromoteTo(du, b)));
}

// out [pairs][32] words = pairs of x's rows (x [rows][stride] floats, 32
// columns each): out[i][c] = (bf16(x[2 i][c]), bf16(x[2 i + 1][c])), rounded to
// nearest even (BF16PairsFromFloats), the rows past `rows` zeros: the B
// operand of a product whose k runs along x's rows (QT's d, ST's keys).
HWY_INLINE void PairRows(const float* HWY_RESTRICT x, size_t stride,
                         size_t rows, size_t pairs,
                         hwy::bfloat16_t* HWY_RESTRICT out) {
  const PairF32 df;
  const hn::Full512<uint16_t> d16;
  const PairU16x16 dh;
  constexpr size_t N = 16;
  uint32_t* words = reinterpret_cast<uint32_t*>(out);
  for (size_t i = 0; i < pairs; ++i) {
    for (size_t c = 0; c < kPairCols; c += N) {
      const auto row = [&](size_t r) {
        return r < rows ? hn::Load(df, x + r * stride + c) : hn::Zero(df);
      };
      // [bf16 of row 2i's 16 columns | row 2i + 1's].
      const auto both =
          hn::BitCast(d16, BF16PairsFromFloats(row(2 * i), row(2 * i + 1)));
      hn::Store(PairWords(hn::LowerHalf(dh, both), hn::UpperHalf(dh, both)),
                PairU32(), words + i * kPairCols + c);
    }
  }
}

// vt [dim][kPairKeys] bf16 = V^T for the n <= kPairKeys
// stored rows v (stride v_stride, dim on each), keys up to RoundUp(n, 32),
// those past n zeros: row p holds V(0, p), V(1, p), ... (the A operand of
// OT's product). Pairs of V rows as words, 16 x 16 of them transposed at a
// time (TransposeSquare).
HWY_INLINE void PairValuesT(const hwy::bfloat16_t* HWY_RESTRICT v,
                            size_t v_stride, size_t n, size_t dim,
                            hwy::bfloat16_t* HWY_RESTRICT vt) {
  const PairU32 du;
  const PairU16x16 dh;
  constexpr size_t N = 16;
  constexpr size_t kRowWords = kPairKeys / 2;
  uint32_t* words = reinterpret_cast<uint32_t*>(vt);
  const auto row = [&](size_t s, size_t p) {
    return s < n ? hn::LoadU(dh, reinterpret_cast<const uint16_t*>(
                                     v + s * v_stride + p))
                 : hn::Zero(dh);
  };
  for (size_t i0 = 0; i0 < RoundUp(n, kPairCols) / 2; i0 += N) {
    for (size_t p0 = 0; p0 < dim; p0 += N) {
      hn::Vec<PairU32> w[N];
      for (size_t i = 0; i < N; ++i) {
        w[i] = PairWords(row(2 * (i0 + i), p0), row(2 * (i0 + i) + 1, p0));
      }
      TransposeSquare(du, w);
      for (size_t p = 0; p < N; ++p) {
        hn::StoreU(w[p], du, words + (p0 + p) * kRowWords + i0);
      }
    }
  }
}

// Rows [0, n_i) of C [n_i][32] (+)= A B by vdpbf16ps (OuterProduct on
// PairProducts): A(i, t) the pair of bf16 at a + i * a_si + 2 t, B [n_k][32]
// words; 8 rows at a time (16 accumulators, 2 B vectors and a broadcast of 32
// registers), then one.
HWY_INLINE void PairOuterProductRows(const hwy::bfloat16_t* HWY_RESTRICT a,
                                     size_t a_si, size_t n_i,
                                     const hwy::bfloat16_t* HWY_RESTRICT b,
                                     size_t n_k, float* HWY_RESTRICT c,
                                     bool accumulate) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n_i; i += 8) {
    OuterProduct<8, 2, PairProducts>(a + i * a_si, a_si, 2, words, kPairCols,
                                     n_k, c + i * kPairCols, kPairCols,
                                     accumulate);
  }
  for (; i < n_i; ++i) {
    OuterProduct<1, 2, PairProducts>(a + i * a_si, a_si, 2, words, kPairCols,
                                     n_k, c + i * kPairCols, kPairCols,
                                     accumulate);
  }
}

// ST [n][32] = K QT by vdpbf16ps for the n stored K rows k (stride k_stride,
// even; dim on each, read in place) and q's pairs qt [dim / 2][32] (PairRows
// of QT).
HWY_INLINE void DotScoresT(const hwy::bfloat16_t* HWY_RESTRICT k,
                           size_t k_stride, size_t n, size_t dim,
                           const hwy::bfloat16_t* HWY_RESTRICT qt,
                           float* HWY_RESTRICT st) {
  PairOuterProductRows(k, k_stride, n, qt, dim / 2, st, /*accumulate=*/false);
}

// OT [dim][32] += V^T PT by vdpbf16ps over the n keys' pairs (an odd n's last
// pair with the zero key past it): vt from PairValuesT, pt [RoundUp(n, 32) /
// 2][32] the weights' pairs (PairRows of ST).
HWY_INLINE void DotAccumulateT(const hwy::bfloat16_t* HWY_RESTRICT vt, size_t n,
                               size_t dim,
                               const hwy::bfloat16_t* HWY_RESTRICT pt,
                               float* HWY_RESTRICT ot) {
  PairOuterProductRows(vt, kPairKeys, dim, pt, (n + 1) / 2, ot,
                       /*accumulate=*/true);
}

#if HEADWAY_NATIVE_AMX
static_assert(kAmxBlock == kPairCols, "an AMX C block is a pair tile wide");

// ST [RoundUp(n, 32)][32] = K QT for the n stored K rows k (stride k_stride,
// dim on each) and q's pairs qt [dim / 2][32] (PairRows of QT): a 32-key
// block at a time, the last keys through k_tail [32][dim] (zero past n: the
// rows past the cache's are not read).
HWY_INLINE void AmxScoresT(const hwy::bfloat16_t* HWY_RESTRICT k,
                           size_t k_stride, size_t n, size_t dim,
                           const hwy::bfloat16_t* HWY_RESTRICT qt,
                           hwy::bfloat16_t* HWY_RESTRICT k_tail,
                           float* HWY_RESTRICT st) {
  for (size_t s0 = 0; s0 < n; s0 += kAmxBlock) {
    const hwy::bfloat16_t* a = k + s0 * k_stride;
    size_t a_stride = k_stride;
    if (s0 + kAmxBlock > n) {
      hwy::bfloat16_t zero;
      zero.bits = 0;
      for (size_t s = 0; s < kAmxBlock; ++s) {
        hwy::bfloat16_t* row = k_tail + s * dim;
        if (s0 + s < n) {
          std::copy(a + s * k_stride, a + s * k_stride + dim, row);
        } else {
          std::fill(row, row + dim, zero);
        }
      }
      a = k_tail;
      a_stride = dim;
    }
    AmxZeroBlock();
    AmxBlockSteps</*kStreamA=*/false>(
        reinterpret_cast<const char*>(a), a_stride * sizeof(hwy::bfloat16_t),
        dim / kAmxBlock, [&](size_t s) { return qt + s * 2 * 16 * kAmxBlock; });
    AmxStoreBlock(st + s0 * kAmxBlock, kAmxBlock);
  }
}

// OT [dim][32] += V^T PT over keys up to RoundUp(n, 32): vt from PairValuesT,
// pt [RoundUp(n, 32) / 2][32] the weights' pairs (PairRows of ST).
HWY_INLINE void AmxAccumulateT(const hwy::bfloat16_t* HWY_RESTRICT vt, size_t n,
                               size_t dim,
                               const hwy::bfloat16_t* HWY_RESTRICT pt,
                               float* HWY_RESTRICT ot) {
  const size_t steps = RoundUp(n, kAmxBlock) / kAmxBlock;
  for (size_t p0 = 0; p0 < dim; p0 += kAmxBlock) {
    float* c = ot + p0 * kAmxBlock;
    AmxLoadBlock(c, kAmxBlock);
    AmxBlockSteps</*kStreamA=*/false>(
        reinterpret_cast<const char*>(vt + p0 * kPairKeys),
        kPairKeys * sizeof(hwy::bfloat16_t), steps,
        [&](size_t s) { return pt + s * 2 * 16 * kAmxBlock; });
    AmxStoreBlock(c, kAmxBlock);
  }
}

#endif  // HEADWAY_NATIVE_AMX

// ST = K QT (AmxScoresT's operands) on AMX tiles (amx), else by vdpbf16ps.
HWY_INLINE void PairScoresT(bool amx, const hwy::bfloat16_t* HWY_RESTRICT k,
                            size_t k_stride, size_t n, size_t dim,
                            const hwy::bfloat16_t* HWY_RESTRICT qt,
                            hwy::bfloat16_t* HWY_RESTRICT k_tail,
                            float* HWY_RESTRICT st) {
#if HEADWAY_NATIVE_AMX
  if (amx) {
    AmxScoresT(k, k_stride, n, dim, qt, k_tail, st);
    return;
  }
#else
  (void)amx, (void)k_tail;
#endif
  DotScoresT(k, k_stride, n, dim, qt, st);
}

// OT += V^T PT (AmxAccumulateT's operands) on AMX tiles (amx), else by
// vdpbf16ps.
HWY_INLINE void PairAccumulateT(bool amx,
                                const hwy::bfloat16_t* HWY_RESTRICT vt,
                                size_t n, size_t dim,
                                const hwy::bfloat16_t* HWY_RESTRICT pt,
                                float* HWY_RESTRICT ot) {
#if HEADWAY_NATIVE_AMX
  if (amx) {
    AmxAccumulateT(vt, n, dim, pt, ot);
    return;
  }
#else
  (void)amx;
#endif
  DotAccumulateT(vt, n, dim, pt, ot);
}
#endif  // HEADWAY_NATIVE_BF16

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_PAIR_TILES_INL_H_

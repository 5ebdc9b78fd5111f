// Transpose4x4: a 4 x 4 block transpose with 128-bit vectors, for the packing
// of matmul's B^T and the attention kernels' transposed tiles; and
// TransposeSquare, a whole-vector square of 32-bit lanes, for the attention
// tiles on AMX.

// Per-target part: toggle guard, included once per target by foreach_target.h.
#if defined(HEADWAY_LIB_CORE_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_CORE_TRANSPOSE_INL_H_
#undef HEADWAY_LIB_CORE_TRANSPOSE_INL_H_
#else
#define HEADWAY_LIB_CORE_TRANSPOSE_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// Transposes a 4 x 4 block of floats, times scale: d_j[i] = scale * s_i[j]
// for i, j < 4 (s_i: four floats of source row i; d_j: of destination row j).
// Not on HWY_SCALAR (no 128-bit vectors).
#if HWY_TARGET != HWY_SCALAR
HWY_INLINE void Transpose4x4(const float* s0, const float* s1, const float* s2,
                             const float* s3, float scale, float* d0, float* d1,
                             float* d2, float* d3) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::Full128<float> d4;
  const hn::Repartition<uint64_t, decltype(d4)> d64;
  const auto r0 = hn::LoadU(d4, s0);
  const auto r1 = hn::LoadU(d4, s1);
  const auto r2 = hn::LoadU(d4, s2);
  const auto r3 = hn::LoadU(d4, s3);
  // t0 = r0[0] r1[0] r0[1] r1[1], t1 = r2[0] r3[0] r2[1] r3[1], t2/t3: lanes 2
  // and 3.
  const auto t0 = hn::BitCast(d64, hn::InterleaveLower(d4, r0, r1));
  const auto t1 = hn::BitCast(d64, hn::InterleaveLower(d4, r2, r3));
  const auto t2 = hn::BitCast(d64, hn::InterleaveUpper(d4, r0, r1));
  const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(d4, r2, r3));
  const auto vscale = hn::Set(d4, scale);
  hn::StoreU(hn::Mul(vscale, hn::BitCast(d4, hn::InterleaveLower(d64, t0, t1))),
             d4, d0);
  hn::StoreU(hn::Mul(vscale, hn::BitCast(d4, hn::InterleaveUpper(d64, t0, t1))),
             d4, d1);
  hn::StoreU(hn::Mul(vscale, hn::BitCast(d4, hn::InterleaveLower(d64, t2, t3))),
             d4, d2);
  hn::StoreU(hn::Mul(vscale, hn::BitCast(d4, hn::InterleaveUpper(d64, t2, t3))),
             d4, d3);
}
#endif

// Transposes the kN x kN block of 32-bit lanes held in rows[0, kN) (kN =
// Lanes(d), a power of two): row i, lane j becomes row j, lane i. log2(kN)
// rounds, each taking rows 2i and 2i + 1 to ConcatEven (row i) and ConcatOdd
// (row kN / 2 + i), which rotates the bits of a lane's (row, lane) index by
// one: kN log2(kN) two-table shuffles (64 for 16 x 16 on AVX-512). Not on
// HWY_SCALAR (no ConcatEven).
#if HWY_TARGET != HWY_SCALAR
template <class D, size_t kN>
HWY_INLINE void TransposeSquare(D d, hwy::HWY_NAMESPACE::Vec<D> (&rows)[kN]) {
  namespace hn = hwy::HWY_NAMESPACE;
  static_assert((kN & (kN - 1)) == 0 && sizeof(hn::TFromD<D>) == 4,
                "a power of two of 32-bit lanes");
  for (size_t round = 1; round < kN; round *= 2) {
    hn::Vec<D> next[kN];
    for (size_t i = 0; i < kN / 2; ++i) {
      next[i] = hn::ConcatEven(d, rows[2 * i + 1], rows[2 * i]);
      next[kN / 2 + i] = hn::ConcatOdd(d, rows[2 * i + 1], rows[2 * i]);
    }
    for (size_t i = 0; i < kN; ++i) rows[i] = next[i];
  }
}
#endif

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_CORE_TRANSPOSE_INL_H_

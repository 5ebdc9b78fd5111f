// Per-target reads and writes of stored K and V (the storage types:
// storage.h).
// - LoadStored: one vector of floats from a stored row, the same floats as
//   storage.h's FloatFrom. Every kernel that reads the cache loads through
//   LoadStored; the int8 row scale is the caller's (kernels fold it into a
//   score or a weight). p must be aligned to the stored vector (N elements of
//   T): cache rows are, as row_stride is a multiple of 16 elements and
//   N <= 16. LoadStoredU: the same from any address (bf16: a caller's
//   matrix, Matmul's bf16 A), and WidenRowU a whole row of them.
// - LoadStoredPair, StoreInPairOrder, StoreRowInPairOrder: two vectors at a
//   time, in an order that may permute the elements (bf16: even and odd
//   elements), for the kernels that put the floats they meet in the same
//   order.
// - StoreRowVec: a whole row, the same bits (and int8 scale) as storage.h's
//   StoreRow, any alignment; what KvCache::Append and StoreKvRows run.
// - Int8RowScale, Int8Levels: int8's rule (a row's scale, the integers),
//   which StoreRowVec and AttentionCompute::kInt8's quantized q share.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_CORE_STORAGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_CORE_STORAGE_INL_H_
#undef HEADWAY_LIB_CORE_STORAGE_INL_H_
#else
#define HEADWAY_LIB_CORE_STORAGE_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <limits>

#include "hwy/highway.h"
#include "lib/core/storage.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(d) floats from p[0, Lanes(d)), aligned.
template <class D>
HWY_INLINE hn::Vec<D> LoadStored(D d, const float* HWY_RESTRICT p) {
  return hn::Load(d, p);
}

// bf16 bits (uint16 lanes, as many as d has) as floats: each at the top of its
// float.
template <class D, class V16>
HWY_INLINE hn::Vec<D> FloatsFromBF16Bits(D d, V16 bits) {
  const hn::RebindToUnsigned<D> du32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, bits)));
}

template <class D>
HWY_INLINE hn::Vec<D> LoadStored(D d, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, D> du16;
  return FloatsFromBF16Bits(
      d, hn::Load(du16, reinterpret_cast<const uint16_t*>(p)));
}
template <class D>
HWY_INLINE hn::Vec<D> LoadStoredU(D d, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, D> du16;
  return FloatsFromBF16Bits(
      d, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
}

// The floats of src[0, n) into dst[0, n) (exact), both at any address: what a
// caller's bf16 matrix is widened by, row by row.
template <class D>
HWY_INLINE void WidenRowU(D d, const hwy::bfloat16_t* HWY_RESTRICT src,
                          size_t n, float* HWY_RESTRICT dst) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadStoredU(d, src + i), d, dst + i);
  for (; i < n; ++i) dst[i] = internal::FloatFrom(src[i]);
}

template <class D>
HWY_INLINE hn::Vec<D> LoadStored(D d, const hwy::float16_t* HWY_RESTRICT p) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  // Without F16C, Highway 1.0.3's PromoteTo reads inf and NaN as 65536 * x:
  // the integer form of FloatFromF16.
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToUnsigned<D> du32;
  const hn::RebindToSigned<D> di32;
  const auto h =
      hn::PromoteTo(du32, hn::Load(du16, reinterpret_cast<const uint16_t*>(p)));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du32, 0x8000u)));
  const auto exp = hn::And(h, hn::Set(du32, 0x7C00u));
  const auto em = hn::ShiftLeft<13>(hn::And(h, hn::Set(du32, 0x7FFFu)));
  // Normal: rebias 15 -> 127; inf and NaN: exponent 255, NaN made quiet (as
  // F16C does: FloatFromF16).
  const auto is_special = hn::Eq(exp, hn::Set(du32, 0x7C00u));
  const auto is_nan = hn::RebindMask(
      du32, hn::Gt(hn::BitCast(di32, hn::And(h, hn::Set(du32, 0x7FFFu))),
                   hn::Set(di32, 0x7C00)));
  const auto normal =
      hn::Or(hn::Add(em, hn::IfThenElse(is_special, hn::Set(du32, 0x70000000u),
                                        hn::Set(du32, 0x38000000u))),
             hn::IfThenElseZero(is_nan, hn::Set(du32, 0x400000u)));
  // Subnormal (and zero): mantissa * 2^-24.
  const auto sub = hn::Mul(
      hn::ConvertTo(d, hn::BitCast(di32, hn::And(h, hn::Set(du32, 0x3FFu)))),
      hn::Set(d, 1.0f / 16777216.0f));
  const auto mag =
      hn::IfThenElse(hn::RebindMask(d, hn::Eq(exp, hn::Zero(du32))), sub,
                     hn::BitCast(d, normal));
  return hn::Or(mag, hn::BitCast(d, sign));
#else
  const hn::Rebind<hwy::float16_t, D> df16;
  return hn::PromoteTo(d, hn::Load(df16, p));
#endif
}

// int8: the integer q as a float; the row's scale is the caller's.
template <class D>
HWY_INLINE hn::Vec<D> LoadStored(D d, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int8_t, D> di8;
  const hn::RebindToSigned<D> di32;
  return hn::ConvertTo(d, hn::PromoteTo(di32, hn::Load(di8, p)));
}

// ---------------------------------------------------------------------------
// Pair order: LoadStoredPair(d, p, a, b) reads the 2N stored elements at p as
// two vectors of floats. Where kPairOrderPermutes<T, D> (bf16 in 512-bit
// vectors), lane m of a holds element 2m and lane m of b element 2m + 1: one
// 64-byte load, a shift and an and, where LoadStored(p) and LoadStored(p + N)
// take two widening loads and two shifts (one-row bf16 decode, decode-inl.h's
// OneRowKeyDot: 0.99-1.08x as fast as those, call by call). Elsewhere a =
// LoadStored(p) and b = LoadStored(p + N), the natural order. StoreInPairOrder
// puts 2N floats (the vectors that meet those of LoadStoredPair) in the same
// order. p is aligned to N elements of T.
template <class T, class D>
inline constexpr bool kPairOrderPermutes =
    (HWY_TARGET <= HWY_AVX3) && hwy::IsSame<T, hwy::bfloat16_t>() &&
    hn::MaxLanes(D()) == 16;

template <class D, class T>
HWY_INLINE void LoadStoredPair(D d, const T* HWY_RESTRICT p, hn::Vec<D>& a,
                               hn::Vec<D>& b) {
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kPairOrderPermutes<T, D>) {
    const hn::RebindToUnsigned<D> du;
    const auto bits = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
    a = hn::BitCast(d, hn::ShiftLeft<16>(bits));
    b = hn::BitCast(d, hn::And(bits, hn::Set(du, 0xFFFF0000u)));
    return;
  }
#endif
  a = LoadStored(d, p);
  b = LoadStored(d, p + hn::Lanes(d));
}

// dst[0, 2N) = src[0, 2N) in T's pair order (src and dst aligned).
template <class T, class D>
HWY_INLINE void StoreInPairOrder(D d, const float* HWY_RESTRICT src,
                                 float* HWY_RESTRICT dst) {
  const size_t N = hn::Lanes(d);
  auto a = hn::Load(d, src), b = hn::Load(d, src + N);
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kPairOrderPermutes<T, D>) {
    const auto even = hn::ConcatEven(d, b, a);
    b = hn::ConcatOdd(d, b, a);
    a = even;
  }
#endif
  hn::Store(a, d, dst);
  hn::Store(b, d, dst + N);
}

// dst[0, n) = a row src[0, n) (n a multiple of N, both aligned) as the
// kernels that read a stored row by LoadStoredPair meet it: each whole 2N
// chunk in T's pair order (StoreInPairOrder), a last N floats as they are.
template <class T, class D>
HWY_INLINE void StoreRowInPairOrder(D d, const float* HWY_RESTRICT src,
                                    size_t n, float* HWY_RESTRICT dst) {
  const size_t N = hn::Lanes(d);
  size_t p = 0;
  for (; p + 2 * N <= n; p += 2 * N) StoreInPairOrder<T>(d, src + p, dst + p);
  if (p < n) hn::Store(hn::Load(d, src + p), d, dst + p);
}

// ---------------------------------------------------------------------------
// Stores: StoreRowVec<T>(d, src, n, dst, scale) writes src [n] as a row of T
// into dst[0, n) (and *scale for int8), bit-identical to storage.h's
// StoreRow<T> (storage_test checks every target): full vectors of d, then the
// scalar conversions for the last n % Lanes(d) elements.

// The low 16 bits of each lane: the u32 lanes hold values <= 0xFFFF, so the
// saturating i32 -> u16 demotion keeps them.
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, D>> Low16(D d, hn::Vec<D> bits) {
  const hn::RebindToSigned<D> di32;
  (void)d;
  return hn::DemoteTo(hn::Rebind<uint16_t, D>(), hn::BitCast(di32, bits));
}

// bf16 bits of v: storage.h's BF16FromFloat per lane.
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, D>> BF16Bits(D d, hn::Vec<D> v) {
  (void)d;
  const hn::RebindToUnsigned<D> du32;
  const auto u = hn::BitCast(du32, v);
  const auto high = hn::ShiftRight<16>(u);
  const auto rounded = hn::ShiftRight<16>(hn::Add(
      u, hn::Add(hn::Set(du32, 0x7FFFu), hn::And(high, hn::Set(du32, 1u)))));
  const auto quiet_nan = hn::Or(high, hn::Set(du32, 0x0040u));
  // NaN: |bits| > inf's, compared as int32 (not Ne(v, v): Highway 1.0.3's
  // AVX2 and AVX-512 Ne is ordered, false for NaN).
  const hn::RebindToSigned<D> di32;
  const auto is_nan = hn::RebindMask(
      du32, hn::Gt(hn::BitCast(di32, hn::And(u, hn::Set(du32, 0x7FFFFFFFu))),
                   hn::Set(di32, 0x7F800000)));
  return Low16(du32, hn::IfThenElse(is_nan, quiet_nan, rounded));
}

// The floats of v's bf16 roundings: storage.h's FloatFromBF16(BF16FromFloat)
// per lane.
template <class D>
HWY_INLINE hn::Vec<D> RoundToBF16(D d, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du32;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, BF16Bits(d, v))));
}

// f16 bits of v: storage.h's F16FromFloat per lane.
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, D>> F16Bits(D d, hn::Vec<D> v) {
#if HWY_TARGET >= HWY_SSE4 || defined(HWY_DISABLE_F16C)
  const hn::RebindToUnsigned<D> du32;
  const hn::RebindToSigned<D> di32;
  const auto u = hn::BitCast(du32, v);
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 0x8000u));
  const auto a = hn::And(u, hn::Set(du32, 0x7FFFFFFFu));
  // a <= 0x7FFFFFFF: signed compares order it.
  const auto ai = hn::BitCast(di32, a);
  const auto is_nan =
      hn::RebindMask(du32, hn::Gt(ai, hn::Set(di32, 0x7F800000)));
  const auto is_inf =
      hn::RebindMask(du32, hn::Gt(ai, hn::Set(di32, 0x477FF000 - 1)));
  const auto is_normal =
      hn::RebindMask(du32, hn::Gt(ai, hn::Set(di32, 0x38800000 - 1)));
  const auto nan_bits =
      hn::Or(hn::Set(du32, 0x7E00u),
             hn::And(hn::ShiftRight<13>(a), hn::Set(du32, 0x3FFu)));
  const auto normal_bits = hn::ShiftRight<13>(hn::Sub(
      hn::Add(a, hn::Add(hn::Set(du32, 0xFFFu),
                         hn::And(hn::ShiftRight<13>(a), hn::Set(du32, 1u)))),
      hn::Set(du32, 0x38000000u)));
  const auto subnormal_bits =
      hn::Sub(hn::BitCast(du32, hn::Add(hn::BitCast(d, a), hn::Set(d, 0.5f))),
              hn::Set(du32, 0x3F000000u));
  const auto bits = hn::IfThenElse(
      is_nan, nan_bits,
      hn::IfThenElse(is_inf, hn::Set(du32, 0x7C00u),
                     hn::IfThenElse(is_normal, normal_bits, subnormal_bits)));
  return Low16(du32, hn::Or(sign, bits));
#else
  // F16C rounds to nearest even and quiets NaN as F16FromFloat does.
  (void)d;
  const hn::Rebind<hwy::float16_t, D> df16;
  return hn::BitCast(hn::Rebind<uint16_t, D>(), hn::DemoteTo(df16, v));
#endif
}

template <class D>
HWY_INLINE void StoreRowVec(D d, const float* HWY_RESTRICT src, size_t n,
                            float* HWY_RESTRICT dst, float* /*scale*/) {
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::LoadU(d, src + i), d, dst + i);
  }
  for (; i < n; ++i) dst[i] = src[i];
}

// The bits of a 16-bit stored type: BF16Bits or F16Bits.
template <class D>
HWY_INLINE auto StoredBits(D d, hn::Vec<D> v, hwy::bfloat16_t /*tag*/) {
  return BF16Bits(d, v);
}
template <class D>
HWY_INLINE auto StoredBits(D d, hn::Vec<D> v, hwy::float16_t /*tag*/) {
  return F16Bits(d, v);
}

// bf16 and f16.
template <class D, class T, hwy::EnableIf<sizeof(T) == 2>* = nullptr>
HWY_INLINE void StoreRowVec(D d, const float* HWY_RESTRICT src, size_t n,
                            T* HWY_RESTRICT dst, float* /*scale*/) {
  const hn::Rebind<uint16_t, D> du16;
  uint16_t* HWY_RESTRICT out = reinterpret_cast<uint16_t*>(dst);
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(StoredBits(d, hn::LoadU(d, src + i), T{}), du16, out + i);
  }
  for (; i < n; ++i) dst[i] = internal::StoredFrom(src[i], T{});
}

// v rounded to the nearest integer, ties to even, for |v| < 2^23.
template <class D>
HWY_INLINE hn::Vec<D> RoundToEven(D d, hn::Vec<D> v) {
#if HWY_TARGET == HWY_SCALAR
  // Highway 1.0.3's scalar Round adds 0.5, which rounds 0.49999997 up to 1:
  // adding and subtracting 2^23 rounds once, in the FPU's nearest-even mode.
  const auto magic = hn::Set(d, 8388608.0f);
  return hn::CopySignToAbs(hn::Sub(hn::Add(hn::Abs(v), magic), magic), v);
#else
  (void)d;
  return hn::Round(v);
#endif
}

// The int8 scale of src [n]: Int8Scale of max|x|, NaN for a NaN or inf.
template <class D>
HWY_INLINE float Int8RowScale(D d, const float* HWY_RESTRICT src, size_t n) {
  const size_t lanes = hn::Lanes(d);
  const auto finite_max = hn::Set(d, std::numeric_limits<float>::max());
  auto max_vec = hn::Zero(d);
  bool special = false;
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto a = hn::Abs(hn::LoadU(d, src + i));
    special = special || !hn::AllTrue(d, hn::Le(a, finite_max));
    max_vec = hn::Max(max_vec, a);
  }
  float max_abs = hn::GetLane(hn::MaxOfLanes(d, max_vec));
  for (size_t j = i; j < n; ++j) {
    const float a = std::fabs(src[j]);
    special = special || !(a <= std::numeric_limits<float>::max());
    max_abs = std::fmax(max_abs, a);
  }
  return internal::Int8Scale(special ? std::numeric_limits<float>::quiet_NaN()
                                     : max_abs);
}

// x / scale rounded to even and clamped to [-127, 127] (Int8FromFloat's
// integers, as floats), for a scale > 0.
template <class D>
HWY_INLINE hn::Vec<D> Int8Levels(D d, hn::Vec<D> x, hn::Vec<D> scale) {
  const auto q = RoundToEven(d, hn::Div(x, scale));
  return hn::Min(hn::Max(q, hn::Set(d, -127.0f)), hn::Set(d, 127.0f));
}

// int8: one pass for the scale (Int8RowScale), one dividing by it (IEEE
// division and round-to-even: Int8FromFloat's).
template <class D>
HWY_INLINE void StoreRowVec(D d, const float* HWY_RESTRICT src, size_t n,
                            int8_t* HWY_RESTRICT dst,
                            float* HWY_RESTRICT scale) {
  const float s = Int8RowScale(d, src, n);
  *scale = s;
  if (!(s > 0.0f)) {  // zero or tiny row, or NaN scale: q = 0
    for (size_t j = 0; j < n; ++j) dst[j] = 0;
    return;
  }
  const size_t lanes = hn::Lanes(d);
  const hn::RebindToSigned<D> di32;
  const hn::Rebind<int8_t, D> di8;
  const auto scale_vec = hn::Set(d, s);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto q = Int8Levels(d, hn::LoadU(d, src + i), scale_vec);
    hn::StoreU(hn::DemoteTo(di8, hn::ConvertTo(di32, q)), di8, dst + i);
  }
  for (; i < n; ++i) dst[i] = internal::Int8FromFloat(src[i], s);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_CORE_STORAGE_INL_H_

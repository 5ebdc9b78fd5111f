// Per-target reads of stored K and V (the storage types: storage.h): one
// vector of floats from a stored row, the same floats as storage.h's
// FloatFrom. Every kernel that reads the cache loads through LoadStored; the
// int8 row scale is the caller's (kernels fold it into a score or a weight).
//
// Alignment: p must be aligned to the stored vector (N elements of T): cache
// rows are, as row_stride is a multiple of 16 elements and N <= 16.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_CORE_STORAGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_CORE_STORAGE_INL_H_
#undef HEADWAY_LIB_CORE_STORAGE_INL_H_
#else
#define HEADWAY_LIB_CORE_STORAGE_INL_H_
#endif

#include <stdint.h>

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

template <class D>
HWY_INLINE hn::Vec<D> LoadStored(D d, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, D> du16;
  const hn::RebindToUnsigned<D> du32;
  const auto bits =
      hn::PromoteTo(du32, hn::Load(du16, reinterpret_cast<const uint16_t*>(p)));
  return hn::BitCast(d, hn::ShiftLeft<16>(bits));
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

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_CORE_STORAGE_INL_H_

// The KV cache's storage types, plain C++ (no SIMD): what each KvDtype stores,
// its size, and the one rounding rule that writes it. Every writer of stored K
// and V (KvCache::Append, the layer's projection, tests building references)
// goes through StoreRow; every reader goes through LoadStored
// (storage-inl.h, per target) or LoadRow, which give the same floats.
//
//   kFloat32   float                as is
//   kBFloat16  hwy::bfloat16_t      round to nearest even (Highway 1.0.3's
//                                   DemoteTo truncates); NaN stays a quiet NaN,
//                                   +-inf stays +-inf
//   kFloat16   hwy::float16_t       IEEE round to nearest even: |x| >= 65520
//                                   becomes +-inf, below 2^-14 subnormal
//   kInt8      int8_t + one float   symmetric per row: scale = max|x| / 127,
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
#ifndef HEADWAY_LIB_CORE_STORAGE_H_
#define HEADWAY_LIB_CORE_STORAGE_H_

#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "headway/kv_cache.h"
#include "hwy/base.h"

namespace headway {
namespace internal {

// ---------------------------------------------------------------------------
// Types.

// The element type of each KvDtype: KvStored<KvDtype::kInt8>::type is int8_t.
template <KvDtype kDtype>
struct KvStored;
template <>
struct KvStored<KvDtype::kFloat32> {
  using type = float;
};
template <>
struct KvStored<KvDtype::kBFloat16> {
  using type = hwy::bfloat16_t;
};
template <>
struct KvStored<KvDtype::kFloat16> {
  using type = hwy::float16_t;
};
template <>
struct KvStored<KvDtype::kInt8> {
  using type = int8_t;
};

// The KvDtype that stores T, KvStored's inverse: kKvDtypeOf<int8_t> is
// KvDtype::kInt8.
template <class T>
inline constexpr KvDtype kKvDtypeOf = hwy::IsSame<T, float>()
                                          ? KvDtype::kFloat32
                                      : hwy::IsSame<T, hwy::bfloat16_t>()
                                          ? KvDtype::kBFloat16
                                      : hwy::IsSame<T, hwy::float16_t>()
                                          ? KvDtype::kFloat16
                                          : KvDtype::kInt8;

// Whether rows of T carry one float scale each (int8).
template <class T>
inline constexpr bool kKvScaled = sizeof(T) == 1;

inline bool KvDtypeKnown(KvDtype dtype) {
  return dtype == KvDtype::kFloat32 || dtype == KvDtype::kBFloat16 ||
         dtype == KvDtype::kFloat16 || dtype == KvDtype::kInt8;
}
// Bytes per element: 4, 2, 2, 1 (0 for an unknown dtype).
inline size_t KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return 4;
    case KvDtype::kBFloat16:
    case KvDtype::kFloat16:
      return 2;
    case KvDtype::kInt8:
      return 1;
  }
  return 0;
}
inline bool KvDtypeScaled(KvDtype dtype) { return dtype == KvDtype::kInt8; }
inline const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return "float32";
    case KvDtype::kBFloat16:
      return "bfloat16";
    case KvDtype::kFloat16:
      return "float16";
    case KvDtype::kInt8:
      return "int8";
  }
  return "unknown";
}

// Calls f(T{}) with T the stored type of dtype (a known one): the one switch
// from a runtime dtype to the templates.
template <class F>
decltype(auto) VisitKvDtype(KvDtype dtype, F&& f) {
  switch (dtype) {
    case KvDtype::kBFloat16:
      return f(hwy::bfloat16_t{});
    case KvDtype::kFloat16:
      return f(hwy::float16_t{});
    case KvDtype::kInt8:
      return f(int8_t{});
    case KvDtype::kFloat32:
      break;
  }
  return f(float{});
}

// ---------------------------------------------------------------------------
// Scalar conversions: the reference every vector path must match bit for bit.

inline uint32_t FloatBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline float BitsFloat(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

inline hwy::bfloat16_t BF16FromFloat(float x) {
  uint32_t u = FloatBits(x);
  hwy::bfloat16_t out;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    out.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    return out;
  }
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even; may carry to inf
  out.bits = static_cast<uint16_t>(u >> 16);
  return out;
}
inline float FloatFromBF16(hwy::bfloat16_t x) {
  return BitsFloat(static_cast<uint32_t>(x.bits) << 16);
}

inline hwy::float16_t F16FromFloat(float x) {
  uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  uint32_t bits;
  if (u > 0x7F800000u) {
    bits = 0x7E00u | ((u >> 13) & 0x3FFu);  // quiet NaN, payload's top bits
  } else if (u >= 0x477FF000u) {
    bits = 0x7C00u;  // >= 65520 (and inf): inf
  } else if (u >= 0x38800000u) {
    // Normal (>= 2^-14): round the mantissa to 10 bits, rebias 127 -> 15.
    u += 0xFFFu + ((u >> 13) & 1u);
    bits = (u - 0x38000000u) >> 13;
  } else {
    // Subnormal or zero: |x| + 0.5 has an ulp of 2^-24, the subnormal step,
    // so the float addition rounds to nearest even.
    bits = FloatBits(BitsFloat(u) + 0.5f) - 0x3F000000u;
  }
  hwy::float16_t out;
  out.bits = static_cast<uint16_t>(sign | bits);
  return out;
}
inline float FloatFromF16(hwy::float16_t x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t exp = x.bits & 0x7C00u;
  const uint32_t mant = x.bits & 0x3FFu;
  float mag;
  if (exp == 0x7C00u) {
    // inf, or a NaN made quiet (as F16C's vcvtph2ps does).
    mag = BitsFloat(0x7F800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
  } else {
    mag = BitsFloat(((static_cast<uint32_t>(x.bits) & 0x7FFFu) << 13) +
                    0x38000000u);
  }
  return BitsFloat(FloatBits(mag) | sign);
}

// int8 rows: the scale of a row whose largest |x| is max_abs (NaN if the row
// has a NaN or inf), and one element.
inline float Int8Scale(float max_abs) {
  constexpr float kMinMax = 127.0f * std::numeric_limits<float>::min();
  if (max_abs < kMinMax) return 0.0f;  // the scale would be subnormal
  const float scale = max_abs / 127.0f;
  // 127 * scale must stay finite: for max_abs within 2^-23 of FLT_MAX it
  // rounds to inf, and one ulp less (2^-23 relative) is finite.
  if (std::isinf(scale * 127.0f)) return std::nextafter(scale, 0.0f);
  return scale;
}
inline int8_t Int8FromFloat(float x, float scale) {
  if (!(scale > 0.0f)) return 0;  // zero row, or NaN scale
  const float q = std::nearbyint(x / scale);
  return static_cast<int8_t>(std::fmin(std::fmax(q, -127.0f), 127.0f));
}

// One element, stored and read back (T = float, bf16, f16; int8 needs a
// scale: see StoreRow and LoadRow).
inline float StoredFrom(float x, float /*tag*/) { return x; }
inline hwy::bfloat16_t StoredFrom(float x, hwy::bfloat16_t /*tag*/) {
  return BF16FromFloat(x);
}
inline hwy::float16_t StoredFrom(float x, hwy::float16_t /*tag*/) {
  return F16FromFloat(x);
}
inline float FloatFrom(float x) { return x; }
inline float FloatFrom(hwy::bfloat16_t x) { return FloatFromBF16(x); }
inline float FloatFrom(hwy::float16_t x) { return FloatFromF16(x); }
inline float FloatFrom(int8_t x) { return static_cast<float>(x); }

// Stores src [n] as a row of T: dst[0, n) and, for int8, *scale. NaN and inf
// follow the table at the top; dst past n is not written.
template <class T>
void StoreRow(const float* src, size_t n, T* dst, float* scale) {
  if constexpr (kKvScaled<T>) {
    float max_abs = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const float a = std::fabs(src[i]);
      // NaN and inf make the scale NaN: the whole row reads back as NaN.
      if (!(a <= std::numeric_limits<float>::max())) {
        max_abs = std::numeric_limits<float>::quiet_NaN();
        break;
      }
      max_abs = std::fmax(max_abs, a);
    }
    *scale = Int8Scale(max_abs);
    for (size_t i = 0; i < n; ++i) dst[i] = Int8FromFloat(src[i], *scale);
  } else {
    (void)scale;
    for (size_t i = 0; i < n; ++i) dst[i] = StoredFrom(src[i], T{});
  }
}

// Reads a stored row back: dst[i] = the float element i stands for (times
// scale for int8; scale is ignored otherwise).
template <class T>
void LoadRow(const T* src, size_t n, float scale, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = kKvScaled<T> ? scale * FloatFrom(src[i]) : FloatFrom(src[i]);
  }
}

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_CORE_STORAGE_H_

// Per-target access to the native dot products that Highway 1.0.3 has no op
// for, as inline assembly: this is the one place Headway emits them (they need
// no target attribute).
// - AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16), for the kernels that offer a
//   bf16 compute mode (Matmul's MatmulCompute::kBFloat16, attention decode's
//   AttentionCompute::kBFloat16). Callers run them only where
//   NativeBFloat16Active() (targets.h) said so once per call.
//   HEADWAY_NATIVE_BF16 is 1 on the targets that can (x86 AVX3 and AVX3_DL),
//   else 0.
// - AMX-BF16 (tdpbf16ps on tiles), for Matmul's bf16 compute mode and
//   attention prefill's AttentionCompute::kBFloat16 where
//   AmxBFloat16Active() (targets.h), through one block kernel
//   (AmxBlockSteps). HEADWAY_NATIVE_AMX is 1 on the targets
//   that can (x86-64 AVX3 and AVX3_DL), else 0.
// - AVX512_VNNI (vpdpbusd, vpdpwssd), for attention decode's
//   AttentionCompute::kInt8.
//   Highway selects AVX3_DL only on CPUs that have it, so
//   HEADWAY_NATIVE_INT8 is 1 on AVX3_DL (else 0) and needs no runtime check.

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_CORE_NATIVE_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_CORE_NATIVE_DOT_INL_H_
#undef HEADWAY_LIB_CORE_NATIVE_DOT_INL_H_
#else
#define HEADWAY_LIB_CORE_NATIVE_DOT_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include "hwy/highway.h"

#undef HEADWAY_NATIVE_BF16
#undef HEADWAY_NATIVE_AMX
#undef HEADWAY_NATIVE_INT8
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define HEADWAY_NATIVE_BF16 1
#else
#define HEADWAY_NATIVE_BF16 0
#endif
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
#define HEADWAY_NATIVE_AMX 1
#else
#define HEADWAY_NATIVE_AMX 0
#endif
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX3_DL
#define HEADWAY_NATIVE_INT8 1
#else
#define HEADWAY_NATIVE_INT8 0
#endif

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HEADWAY_NATIVE_BF16
// 16 floats, and 16 pairs of bf16 (element 2i in the low half of lane i).
using NativeF32 = hn::ScalableTag<float>;
using NativePairs = hn::RebindToUnsigned<NativeF32>;

// acc + a.lo * b.lo + a.hi * b.hi per float lane, a and b pairs of bf16:
// vdpbf16ps. The products are exact; each addition rounds to nearest even,
// and denormal inputs and results are read and written as 0.
HWY_INLINE hn::Vec<NativeF32> DotBF16Pairs(hn::Vec<NativeF32> acc,
                                           hn::Vec<NativePairs> a,
                                           hn::Vec<NativePairs> b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc.raw) : "v"(a.raw), "v"(b.raw));
  return acc;
}

// The floats lo (elements 0 .. N - 1) and hi (the next N) as N pairs of bf16,
// in order (lane i holds elements 2i and 2i + 1): vcvtne2ps2bf16, storage.h's
// rounding (nearest even) except that a denormal float becomes 0, which
// DotBF16Pairs reads a denormal bf16 as anyway, so the products are the same.
HWY_INLINE hn::Vec<NativePairs> BF16PairsFromFloats(hn::Vec<NativeF32> lo,
                                                    hn::Vec<NativeF32> hi) {
  hn::Vec<NativePairs> pairs;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(pairs.raw) : "v"(hi.raw), "v"(lo.raw));
  return pairs;
}
#endif  // HEADWAY_NATIVE_BF16

#if HEADWAY_NATIVE_AMX
// AMX's tile configuration (palette 1): tile t has rows[t] rows of colsb[t]
// bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the calling thread's tile configuration (all tiles then read 0).
HWY_INLINE void AmxLoadConfig(const AmxTileConfig& config) {
  asm volatile("ldtilecfg %0" : : "m"(config));
}

// Gives the tiles back (the thread's tile state returns to its initial one).
HWY_INLINE void AmxRelease() { asm volatile("tilerelease" ::: "memory"); }

// Tile kTile = 0.
template <int kTile>
HWY_INLINE void AmxZero() {
  asm volatile("tilezero %%tmm%c0" : : "i"(kTile));
}

// Tile kTile = its rows from p, stride bytes apart.
template <int kTile>
HWY_INLINE void AmxLoad(const void* p, size_t stride) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2"
               :
               : "r"(p), "r"(stride), "i"(kTile)
               : "memory");
}

// AmxLoad with the hint that the rows need not stay in L1 (tileloaddt1).
template <int kTile>
HWY_INLINE void AmxLoadStreamed(const void* p, size_t stride) {
  asm volatile("tileloaddt1 (%0,%1,1), %%tmm%c2"
               :
               : "r"(p), "r"(stride), "i"(kTile)
               : "memory");
}

// Tile kTile's rows to p, stride bytes apart.
template <int kTile>
HWY_INLINE void AmxStore(void* p, size_t stride) {
  asm volatile("tilestored %%tmm%c0, (%1,%2,1)"
               :
               : "i"(kTile), "r"(p), "r"(stride)
               : "memory");
}

// C += A B, C [M][N] floats, A [M][K] bf16 (K = 2 x its pairs), B [K / 2][N]
// pairs of bf16 (pair t of row r: B's rows 2r and 2r + 1 of column t):
// tdpbf16ps. As DotBF16Pairs, each addition rounds to nearest even, and
// denormal inputs and results are read and written as 0.
template <int kC, int kA, int kB>
HWY_INLINE void AmxDotBF16() {
  asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0"
               :
               : "i"(kC), "i"(kA), "i"(kB));
}

// The one AMX kernel, which Matmul's and attention's bf16 products on tiles
// share: a C block of 32 x 32 floats in tmm0-3 (tmm0 rows 0-15 x columns
// 0-15, tmm1 rows 0-15 x 16-31, tmm2 and tmm3 rows 16-31), summed over k 32
// at a time from A's two tiles (tmm4, 5: 16 rows x 32 bf16 each) and B's two
// (tmm6, 7: 16 pairs of k x 16 columns each).
inline constexpr size_t kAmxBlock = 32;

// Every tile 16 rows of 64 bytes (the block's shapes).
HWY_INLINE const AmxTileConfig& AmxBlockConfig() {
  static const AmxTileConfig config = [] {
    AmxTileConfig c;
    for (size_t t = 0; t < 8; ++t) {
      c.rows[t] = 16;
      c.colsb[t] = 64;
    }
    return c;
  }();
  return config;
}

// The C block = 0, or from / to c [32][ldc] floats.
HWY_INLINE void AmxZeroBlock() {
  AmxZero<0>();
  AmxZero<1>();
  AmxZero<2>();
  AmxZero<3>();
}
HWY_INLINE void AmxLoadBlock(const float* c, size_t ldc) {
  const size_t stride = ldc * sizeof(float);
  AmxLoad<0>(c, stride);
  AmxLoad<1>(c + 16, stride);
  AmxLoad<2>(c + 16 * ldc, stride);
  AmxLoad<3>(c + 16 * ldc + 16, stride);
}
HWY_INLINE void AmxStoreBlock(float* c, size_t ldc) {
  const size_t stride = ldc * sizeof(float);
  AmxStore<0>(c, stride);
  AmxStore<1>(c + 16, stride);
  AmxStore<2>(c + 16 * ldc, stride);
  AmxStore<3>(c + 16 * ldc + 16, stride);
}

// The C block += A's 32 rows times `steps` B tiles of 32 k: A's k at a_k
// (rows `stride` bytes apart, k on; 32 bf16 per row and step), B's step s
// at b(s) ([16][32][2] bf16: pair t of row r holds k 2r and 2r + 1 of
// column t). kStreamA: A's tiles are loaded first and hinted not to stay in
// L1 (tileloaddt1), for an A that streams past a B that stays.
template <bool kStreamA, class BFn>
HWY_INLINE void AmxBlockSteps(const char* HWY_RESTRICT a_k, size_t stride,
                              size_t steps, const BFn& b) {
  // Bytes between B's pairs of rows, and from A's first tile to its second.
  constexpr size_t kBStride = kAmxBlock * 2 * sizeof(hwy::bfloat16_t);
  const size_t a_second = 16 * stride;
  for (size_t s = 0; s < steps; ++s) {
    const char* a_s = a_k + s * kAmxBlock * sizeof(hwy::bfloat16_t);
    const hwy::bfloat16_t* b_s = b(s);
    if constexpr (kStreamA) {
      AmxLoadStreamed<4>(a_s, stride);
      AmxLoadStreamed<5>(a_s + a_second, stride);
    } else {
      AmxLoad<4>(a_s, stride);
      AmxLoad<5>(a_s + a_second, stride);
    }
    AmxLoad<6>(b_s, kBStride);
    AmxLoad<7>(b_s + 32, kBStride);
    AmxDotBF16<0, 4, 6>();
    AmxDotBF16<1, 4, 7>();
    AmxDotBF16<2, 5, 6>();
    AmxDotBF16<3, 5, 7>();
  }
}
#endif  // HEADWAY_NATIVE_AMX

#if HEADWAY_NATIVE_INT8
// 16 int32 lanes, and 64 bytes (4 per lane).
using NativeI32 = hn::ScalableTag<int32_t>;
using NativeU8 = hn::Repartition<uint8_t, NativeI32>;
using NativeI8 = hn::Repartition<int8_t, NativeI32>;
using NativeI16 = hn::Repartition<int16_t, NativeI32>;

// acc + the 4 products a[4i + t] * b[4i + t] (t < 4) per int32 lane i, a
// unsigned bytes, b signed ones: vpdpbusd. Exact while the sums stay within
// int32 (a lane of 4 products moves by less than 2^17).
HWY_INLINE hn::Vec<NativeI32> DotU8I8Quads(hn::Vec<NativeI32> acc,
                                           hn::Vec<NativeU8> a,
                                           hn::Vec<NativeI8> b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc.raw) : "v"(a.raw), "v"(b.raw));
  return acc;
}

// acc + a.lo * b.lo + a.hi * b.hi per int32 lane, a and b pairs of int16:
// vpdpwssd. Exact while the sums stay within int32.
HWY_INLINE hn::Vec<NativeI32> DotI16Pairs(hn::Vec<NativeI32> acc,
                                          hn::Vec<NativeI16> a,
                                          hn::Vec<NativeI16> b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc.raw) : "v"(a.raw), "v"(b.raw));
  return acc;
}
#endif  // HEADWAY_NATIVE_INT8

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_CORE_NATIVE_DOT_INL_H_

// The wide attention tiles' register-tiled outer product (OuterProduct), one
// kernel for both element types that reach it (its Ops): float32 FMAs on floats
// (FloatProducts: attention-inl.h's float32 tiles) and vdpbf16ps on pairs of
// bf16 (PairProducts: pair_tiles-inl.h's products where AVX512_BF16 runs
// them, two products per lane and instruction).

// Per-target part: toggle guard.
#if defined(HEADWAY_LIB_ATTENTION_OUTER_PRODUCT_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_ATTENTION_OUTER_PRODUCT_INL_H_
#undef HEADWAY_LIB_ATTENTION_OUTER_PRODUCT_INL_H_
#else
#define HEADWAY_LIB_ATTENTION_OUTER_PRODUCT_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>

#include "hwy/highway.h"
#include "lib/core/native_dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// OuterProduct's elements: A's broadcast, B's vectors and the multiply-add
// into float32 sums, on floats.
struct FloatProducts {
  using A = float;
  using B = float;
  using D = hn::ScalableTag<float>;
  static HWY_INLINE hn::Vec<D> Broadcast(const float* HWY_RESTRICT p) {
    return hn::Set(D(), *p);
  }
  static HWY_INLINE hn::Vec<D> LoadB(const float* HWY_RESTRICT p) {
    return hn::Load(D(), p);
  }
  static HWY_INLINE hn::Vec<D> MulAdd(hn::Vec<D> acc, hn::Vec<D> a,
                                      hn::Vec<D> b) {
    return hn::MulAdd(a, b, acc);
  }
};

#if HEADWAY_NATIVE_BF16
// The same on pairs of bf16 by vdpbf16ps: an element of A is the pair at its
// address (a word, broadcast), B's vectors are words, each lane's sum gains
// both products of its pair.
struct PairProducts {
  using A = hwy::bfloat16_t;
  using B = uint32_t;
  using D = NativePairs;
  static HWY_INLINE hn::Vec<D> Broadcast(
      const hwy::bfloat16_t* HWY_RESTRICT p) {
    uint32_t word;
    hwy::CopyBytes<sizeof(word)>(p, &word);
    return hn::Set(D(), word);
  }
  static HWY_INLINE hn::Vec<D> LoadB(const uint32_t* HWY_RESTRICT p) {
    return hn::Load(D(), p);
  }
  static HWY_INLINE hn::Vec<NativeF32> MulAdd(hn::Vec<NativeF32> acc,
                                              hn::Vec<D> a, hn::Vec<D> b) {
    return DotBF16Pairs(acc, a, b);
  }
};
#endif  // HEADWAY_NATIVE_BF16

// C[i][j] (+)= sum_{k < n_k} A(i, k) * B[k][j] for kI rows i and kJ vectors j
// of float32 sums, the elements as Ops has them:
//   A(i, k) = Ops::Broadcast(a + i * a_si + k * a_sk), B[k][j] =
//   Ops::LoadB(b + k * b_stride + j * N), C[i][j] = c + i * c_stride + j * N.
// kI * kJ accumulators stay in registers for the whole k loop (8 of them cover
// the FMA latency of two pipes x 4 cycles); each sum runs over k in order.
template <size_t kI, size_t kJ, class Ops = FloatProducts>
HWY_INLINE void OuterProduct(const typename Ops::A* HWY_RESTRICT a, size_t a_si,
                             size_t a_sk, const typename Ops::B* HWY_RESTRICT b,
                             size_t b_stride, size_t n_k, float* HWY_RESTRICT c,
                             size_t c_stride, bool accumulate) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  hn::Vec<decltype(d)> acc[kI][kJ];
  HWY_UNROLL(8)
  for (size_t i = 0; i < kI; ++i) {
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      acc[i][j] =
          accumulate ? hn::Load(d, c + i * c_stride + j * N) : hn::Zero(d);
    }
  }
  for (size_t k = 0; k < n_k; ++k) {
    hn::Vec<typename Ops::D> bk[kJ];
    HWY_UNROLL(8)
    for (size_t j = 0; j < kJ; ++j) {
      bk[j] = Ops::LoadB(b + k * b_stride + j * N);
    }
    HWY_UNROLL(8)
    for (size_t i = 0; i < kI; ++i) {
      const auto ai = Ops::Broadcast(a + i * a_si + k * a_sk);
      HWY_UNROLL(8)
      for (size_t j = 0; j < kJ; ++j) {
        acc[i][j] = Ops::MulAdd(acc[i][j], ai, bk[j]);
      }
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

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_ATTENTION_OUTER_PRODUCT_INL_H_

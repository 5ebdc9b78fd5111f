// The per-target entry points of the kernels that other translation units'
// per-target code calls: the layer's step (layer.cc) and the materialised
// attention path (attention-inl.h). Each kernel is compiled once per target,
// in its own module's translation unit; these are direct calls within one
// target, not a second dynamic dispatch.

// Non-SIMD part: normal include guard.
#ifndef HEADWAY_LIB_CORE_KERNELS_INL_H_TYPES_
#define HEADWAY_LIB_CORE_KERNELS_INL_H_TYPES_

#include <stddef.h>

#include "lib/attention/attention_call.h"
#include "lib/matmul/matmul_call.h"

#endif  // HEADWAY_LIB_CORE_KERNELS_INL_H_TYPES_

// Per-target part: toggle guard, included once per target by foreach_target.h.
#if defined(HEADWAY_LIB_CORE_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_CORE_KERNELS_INL_H_
#undef HEADWAY_LIB_CORE_KERNELS_INL_H_
#else
#define HEADWAY_LIB_CORE_KERNELS_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// matmul.cc. Columns per panel of this target's packed B (PackedB's
// panel_width()).
size_t MatmulPanelWidthT();

// matmul.cc. out [m, n] = alpha * op(A) [m, k] * B + beta * out, B [k, n]
// packed for this target (PackedB's data, dtype and scales). alpha != 0.
void MatmulPackedOutT(const float* a, size_t lda, bool trans_a,
                      const MatmulPackedWeights& b, size_t m, size_t n,
                      size_t k, const MatmulOut& out, float alpha, float beta);

// matmul.cc. c [m, n] (row stride ldc) = a [m, k] * B's columns [first_panel *
// NR, first_panel * NR + n), B [k, b_n] packed for this target, NR its panel
// width; first_panel * NR + n <= b_n. a_prepared: null, or a's rows as
// MatmulPrepareAT left them, where MatmulPreparedAElementsT(b, m, k) > 0.
void MatmulPackedPanelsT(const float* a, size_t lda,
                         const MatmulPackedWeights& b, size_t b_n,
                         size_t first_panel, size_t m, size_t n, size_t k,
                         float* c, size_t ldc,
                         const hwy::bfloat16_t* a_prepared = nullptr);

// matmul.cc. The bf16 elements of m rows of A [m, k] prepared for
// MatmulPackedPanelsT over b (MatmulPrepareAT): where the products run on AMX
// tiles, which then read them in place instead of converting A in every call;
// 0 elsewhere.
size_t MatmulPreparedAElementsT(const MatmulPackedWeights& b, size_t m,
                                size_t k);

// matmul.cc. a [m, k] (row stride lda) into prepared
// (MatmulPreparedAElementsT's elements, > 0): the AMX tiles' bf16 layout.
void MatmulPrepareAT(const float* a, size_t lda, size_t m, size_t k,
                     hwy::bfloat16_t* prepared);

// matmul.cc. C = alpha * op(A) [m, k] * op(B) [k, n] + beta * C, B packed
// during the call.
void MatmulUnpackedT(const float* a, size_t lda, bool trans_a, const float* b,
                     size_t ldb, bool trans_b, size_t m, size_t n, size_t k,
                     float* c, size_t ldc, float alpha, float beta);

// attention.cc. The fused attention of checked works, planned into *plan (kept
// by the caller between calls), or into the calling thread's plan when plan is
// null.
void FusedAttentionT(const AttentionWork* works, size_t n_works,
                     const AttentionDims& dims, AttentionPlan* plan);

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_CORE_KERNELS_INL_H_

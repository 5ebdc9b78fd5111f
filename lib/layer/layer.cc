// AttentionLayer: config and weight checks, packing, and Forward's one dynamic
// dispatch per call. The per-target step runs the fused QKV projection (K and
// V straight into the cache rows), the bias, QK-norm and RoPE of each head
// (FinishHead), the fused attention and the output projection with the matmul
// and attention kernels' per-target entry points (lib/core/kernels-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/layer/layer.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/attention/attention_call.h"
#include "lib/core/blocks.h"
#include "lib/core/kernels-inl.h"
#include "lib/core/storage-inl.h"
#include "lib/core/storage.h"
#include "lib/matmul/matmul_call.h"
#include "lib/norm/norm-inl.h"
#include "lib/rope/rope-inl.h"

#ifndef HEADWAY_LIB_LAYER_STEP_
#define HEADWAY_LIB_LAYER_STEP_
namespace headway {

// One Forward call, checked and planned: T new tokens of several sequences.
struct LayerStep {
  // QKV = x [T, d_model] * W_QKV [d_model, n_qkv] + b_qkv, into qkv_out (Q to
  // the Q buffer, K and V to the cache rows).
  const float* x;
  size_t ldx;
  size_t tokens;
  size_t d_model;
  MatmulPackedWeights packed_qkv;
  size_t panel_width;  // of both packed matrices
  size_t n_qkv;
  const float* b_qkv;  // [n_qkv] or null
  MatmulOut qkv_out;
  size_t head_dim;
  // After the bias, each Q and K head of token t: RMSNorm with q_norm or
  // k_norm [head_dim] (null: no QK-norm), then RoPE by the cos and sin in
  // rope_table [T, 2 * rope_half] (filled by the step from rope_freq
  // [rope_half] at positions [T]; rope_half 0: no RoPE).
  const float* q_norm;
  const float* k_norm;
  double qk_norm_eps;
  const double* rope_freq;
  size_t rope_half;
  RopeLayout rope_layout;
  const int64_t* positions;
  float* rope_table;
  // A cache of a stored type other than float32 (ProjectStoredKv): Q [T,
  // ld_q] into q, K and V in chunks through the scratch into the cache.
  KvDtype kv_dtype;
  float* q;
  size_t ld_q;
  size_t q_cols;
  size_t kv_heads;
  char* const* kv_rows;      // [2][T]: K, then V rows of KV head 0
  float* const* kv_scales;   // [2][T]: their int8 scales, else null
  size_t kv_head_bytes;      // from one KV head's rows to the next's
  size_t scale_head_stride;  // floats, likewise for the scales
  size_t chunk_rows;         // tokens per chunk
  size_t chunk_segments;     // K or V heads per chunk
  float* scratch;            // [chunk_rows, scratch_cols]
  size_t scratch_cols;
  ScratchBuffer* chunk_a;  // a chunk's rows of x for its GEMMs (AMX)
  // Attention of the new tokens, into the attention buffer.
  const AttentionWork* works;
  size_t n_works;
  AttentionDims dims;
  AttentionPlan* plan;
  // y [T, d_model] = attn [T, k_o] * W_O [k_o, d_model] + b_o.
  const float* attn;
  size_t ld_attn;
  size_t k_o;
  MatmulPackedWeights packed_o;
  float* y;
  size_t ldy;
  const float* b_o;  // [d_model] or null
};

}  // namespace headway
#endif  // HEADWAY_LIB_LAYER_STEP_

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The cos and sin of every token's RoPE angles, rope_table [T, 2 *
// rope_half], once per call for all its Q and K heads.
void FillRopeTable(const LayerStep& step) {
  if (step.rope_half == 0) return;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, step.tokens),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t i = range.begin(); i < range.end(); ++i) {
                        RopeCosSin(step.rope_freq, step.rope_half,
                                   step.positions[i],
                                   step.rope_table + i * 2 * step.rope_half);
                      }
                    });
}

// The one home of what happens to a projected head of token `token` before
// attention reads it: segment s of the fused QKV columns (Q heads, then K,
// then V; head_dim each) gets its bias, and a Q or K head then QK-norm and
// RoPE.
HWY_INLINE void FinishHead(const LayerStep& step, size_t token, size_t segment,
                           float* HWY_RESTRICT head) {
  const size_t hd = step.head_dim;
  if (step.b_qkv != nullptr) {
    const float* bias = step.b_qkv + segment * hd;
    for (size_t c = 0; c < hd; ++c) head[c] += bias[c];
  }
  const size_t q_segments = step.q_cols / hd;
  if (segment >= q_segments + step.kv_heads) return;  // V
  const float* norm = segment < q_segments ? step.q_norm : step.k_norm;
  if (norm != nullptr) RmsNormHead(head, hd, norm, step.qk_norm_eps);
  if (step.rope_half != 0) {
    RopeRotate(step.rope_layout, step.rope_table + token * 2 * step.rope_half,
               step.rope_half, head, 1, hd);
  }
}

// FinishHead on the first n_segments head-sized segments of qkv_out [T,
// n_segments * head_dim] (each segment's columns are contiguous wherever they
// went), tokens in parallel.
void FinishHeads(const LayerStep& step, size_t n_segments) {
  if (step.b_qkv == nullptr && step.q_norm == nullptr && step.rope_half == 0) {
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, step.tokens),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t i = range.begin(); i < range.end(); ++i) {
                        for (size_t s = 0; s < n_segments; ++s) {
                          FinishHead(step, i, s,
                                     step.qkv_out.At(i, s * step.head_dim));
                        }
                      }
                    });
}

// The QKV projection for a cache of stored type T (not float): Q in one GEMM
// over its panels into q (row stride ld_q, padded to whole panels); K and V in
// chunks of chunk_rows tokens x chunk_segments head-sized segments (a K or V
// row of one KV head each), each a GEMM over the panels that hold it into the
// scratch (which stays in L2: LayerChunks), then FinishHead + StoreRowVec (the
// bits of storage.h's StoreRow, Append's rounding) into the cache rows. Each
// segment is converted whole, as int8's per-row scale needs. Where the GEMMs
// run on AMX tiles, a chunk's rows of x are converted to the tiles' bf16 once
// for all its GEMMs (MatmulPrepareAT into chunk_a), not in every one.
template <class T>
void ProjectStoredKv(const LayerStep& step, T /*tag*/) {
  const size_t nr = step.panel_width;
  const size_t hd = step.head_dim;
  const size_t q_n = std::min(step.n_qkv, (step.q_cols + nr - 1) / nr * nr);
  MatmulPackedPanelsT(step.x, step.ldx, step.packed_qkv, step.n_qkv, 0,
                      step.tokens, q_n, step.d_model, step.q, step.ld_q);
  FinishHeads(step, step.q_cols / hd);
  const size_t segments = 2 * step.kv_heads;
  for (size_t r0 = 0; r0 < step.tokens; r0 += step.chunk_rows) {
    const size_t rows = std::min(step.chunk_rows, step.tokens - r0);
    const size_t prepared =
        MatmulPreparedAElementsT(step.packed_qkv, rows, step.d_model);
    hwy::bfloat16_t* a_rows = nullptr;
    if (prepared > 0) {
      a_rows = reinterpret_cast<hwy::bfloat16_t*>(
          step.chunk_a->Get((prepared + 1) / 2));
      MatmulPrepareAT(step.x + r0 * step.ldx, step.ldx, rows, step.d_model,
                      a_rows);
    }
    for (size_t s0 = 0; s0 < segments; s0 += step.chunk_segments) {
      const size_t s1 = std::min(segments, s0 + step.chunk_segments);
      // Columns [c0, c1) of QKV, computed as panels [p0, p1).
      const size_t c0 = step.q_cols + s0 * hd, c1 = step.q_cols + s1 * hd;
      const size_t p0 = c0 / nr;
      const size_t n = std::min(step.n_qkv, (c1 + nr - 1) / nr * nr) - p0 * nr;
      MatmulPackedPanelsT(step.x + r0 * step.ldx, step.ldx, step.packed_qkv,
                          step.n_qkv, p0, rows, n, step.d_model, step.scratch,
                          n, a_rows);
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, rows),
          [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
            for (size_t i = range.begin(); i < range.end(); ++i) {
              const size_t token = r0 + i;
              for (size_t s = s0; s < s1; ++s) {
                float* src =
                    step.scratch + i * n + (c0 - p0 * nr) + (s - s0) * hd;
                FinishHead(step, token, step.q_cols / hd + s, src);
                const size_t kind = s / step.kv_heads;  // 0: K, 1: V
                const size_t g = s - kind * step.kv_heads;
                T* dst = reinterpret_cast<T*>(
                    step.kv_rows[kind * step.tokens + token] +
                    g * step.kv_head_bytes);
                float unused_scale;
                float* scale =
                    step.kv_scales == nullptr
                        ? &unused_scale
                        : step.kv_scales[kind * step.tokens + token] +
                              g * step.scale_head_stride;
                StoreRowVec(hn::ScalableTag<float>(), src, hd, dst, scale);
              }
            }
          });
    }
  }
}

// Runs a checked step. Returns 0, or this target's panel width when the
// weights were packed for another one (nothing written).
size_t LayerForwardT(const LayerStep& step) {
  const size_t panel_width = MatmulPanelWidthT();
  if (step.panel_width != panel_width) return panel_width;
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    FillRopeTable(step);
    if (step.kv_dtype == KvDtype::kFloat32) {
      // Q, K and V straight into their rows, then FinishHead.
      MatmulPackedOutT(step.x, step.ldx, /*trans_a=*/false, step.packed_qkv,
                       step.tokens, step.n_qkv, step.d_model, step.qkv_out,
                       1.0f, 0.0f);
      FinishHeads(step, step.n_qkv / step.head_dim);
    } else {
      internal::VisitKvDtype(step.kv_dtype, [&](auto tag) HWY_ATTR {
        ProjectStoredKv(step, tag);
      });
    }
    FusedAttentionT(step.works, step.n_works, step.dims, step.plan);
    MatmulOut y;
    y.c = step.y;
    y.ldc = step.ldy;
    MatmulPackedOutT(step.attn, step.ld_attn, /*trans_a=*/false, step.packed_o,
                     step.tokens, step.d_model, step.k_o, y, 1.0f, 0.0f);
    if (step.b_o != nullptr) {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, step.tokens),
                        [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                          for (size_t i = range.begin(); i < range.end(); ++i) {
                            float* row = step.y + i * step.ldy;
                            for (size_t c = 0; c < step.d_model; ++c)
                              row[c] += step.b_o[c];
                          }
                        });
    }
  });
  return 0;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "headway/layer.h"
#include "headway/matmul.h"
#include "lib/attention/attention_build.h"
#include "lib/core/init.h"
#include "lib/core/message.h"
#include "lib/core/validate.h"
#include "lib/norm/norm_call.h"
#include "lib/rope/rope_call.h"

namespace headway {

HWY_EXPORT(LayerForwardT);

namespace {

using internal::Fail;
using internal::Shape;
using internal::SpanOf;

// ------------------------------------------------------------ Create's steps

// config.weight_dtype and projection_compute: values of their enums, and the
// bf16 compute mode only over bf16 or int8 weights (matmul.h's
// MatmulCompute).
Status CheckWeightFormat(const char* fn, const AttentionLayerConfig& c) {
  if (WeightDtypeSize(c.weight_dtype) == 0) {
    return Fail(StatusCode::kInvalidArgument, fn, "config.weight_dtype (",
                static_cast<int>(c.weight_dtype),
                ") is not a WeightDtype (0 float32, 1 bf16, 2 int8)");
  }
  if (c.projection_compute != MatmulCompute::kFloat32 &&
      c.projection_compute != MatmulCompute::kBFloat16) {
    return Fail(StatusCode::kInvalidArgument, fn, "config.projection_compute (",
                static_cast<int>(c.projection_compute),
                ") is not a MatmulCompute (0 float32, 1 bf16)");
  }
  if (c.projection_compute == MatmulCompute::kBFloat16 &&
      c.weight_dtype == WeightDtype::kFloat32) {
    return Fail(StatusCode::kInvalidArgument, fn,
                "config.projection_compute (1, bf16) needs bf16 or int8 "
                "weights, config.weight_dtype 1 or 2 (got ",
                static_cast<int>(c.weight_dtype), ")");
  }
  return Status::Ok();
}

// Checks config and fills in its defaults (n_kv_heads, head_dim,
// attention.scale, head_end).
Status ResolveConfig(const char* fn, AttentionLayerConfig* config) {
  AttentionLayerConfig& c = *config;
  Status status = internal::CheckPositive(fn, "config.d_model", c.d_model);
  if (status.ok())
    status = internal::CheckPositive(fn, "config.n_heads", c.n_heads);
  if (!status.ok()) return status;
  if (c.n_kv_heads < 0) {
    return Fail(StatusCode::kInvalidArgument, fn,
                "config.n_kv_heads must be >= 0 (got ", c.n_kv_heads, ")");
  }
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  if (c.n_heads % c.n_kv_heads != 0) {
    return Fail(StatusCode::kInvalidArgument, fn, "config.n_heads (", c.n_heads,
                ") is not a multiple of config.n_kv_heads (", c.n_kv_heads,
                ")");
  }
  if (c.head_dim < 0) {
    return Fail(StatusCode::kInvalidArgument, fn,
                "config.head_dim must be >= 0 (got ", c.head_dim, ")");
  }
  if (c.head_dim == 0) {
    if (c.d_model % c.n_heads != 0) {
      return Fail(StatusCode::kInvalidArgument, fn,
                  "config.head_dim is 0 but config.d_model (", c.d_model,
                  ") is not a multiple of config.n_heads (", c.n_heads,
                  "): give head_dim");
    }
    c.head_dim = c.d_model / c.n_heads;
  }
  status =
      CheckAttentionOptions(fn, "config.attention", c.attention, c.n_heads);
  if (status.ok() && c.rope.rotary_dim != 0) {
    status = internal::CheckRope(fn, "config.rope", c.rope, c.head_dim);
  }
  if (status.ok() && c.qk_norm) {
    status = internal::CheckNormEps(fn, "config.qk_norm_eps", c.qk_norm_eps);
  }
  if (status.ok()) status = CheckWeightFormat(fn, c);
  if (!status.ok()) return status;
  c.attention.scale = AttentionScale(c.attention, c.head_dim);
  const int64_t group = c.n_heads / c.n_kv_heads;
  if (c.head_begin == 0 && c.head_end == 0) c.head_end = c.n_heads;
  if (c.head_begin < 0 || c.head_end > c.n_heads ||
      c.head_begin >= c.head_end || c.head_begin % group != 0 ||
      c.head_end % group != 0) {
    return Fail(StatusCode::kInvalidArgument, fn,
                "config.head_begin, head_end [", c.head_begin, ", ", c.head_end,
                ") must be a non-empty range in [0, n_heads = ", c.n_heads,
                "] on KV-group boundaries (multiples of ", group, ")");
  }
  return Status::Ok();
}

// A checked weight view of the expected shape.
Status CheckWeight(const char* fn, const char* name, MatrixView<const float> w,
                   int64_t rows, int64_t cols) {
  Status status = internal::CheckMatrix(fn, name, w);
  if (!status.ok()) return status;
  if (w.rows != rows || w.cols != cols) {
    return Fail(StatusCode::kInvalidArgument, fn, "weights.", name, " is ",
                Shape(w.rows, w.cols), " but must be ", Shape(rows, cols));
  }
  return Status::Ok();
}

// The whole model's weights for a resolved config c: sizes whose byte count
// fits, and views of the right shapes.
Status CheckWeights(const char* fn, const AttentionLayerConfig& c,
                    const AttentionLayerWeights& weights) {
  int64_t q_cols = 0, kv_cols = 0, qkv_cols = 0, elems = 0;
  if (!internal::CheckedMul(c.n_heads, c.head_dim, &q_cols) ||
      !internal::CheckedMul(c.n_kv_heads, c.head_dim, &kv_cols) ||
      !internal::CheckedMul(kv_cols, 2, &qkv_cols) ||
      !internal::CheckedAdd(qkv_cols, q_cols, &qkv_cols) ||
      !internal::CheckedProduct({c.d_model, qkv_cols, 64}, &elems)) {
    return Fail(StatusCode::kResourceExhausted, fn, "config.d_model (",
                c.d_model, ") x (config.n_heads (", c.n_heads,
                ") + 2 x config.n_kv_heads (", c.n_kv_heads,
                ")) x config.head_dim (", c.head_dim,
                "): the weights' byte count overflows");
  }
  Status status = CheckWeight(fn, "w_q", weights.w_q, c.d_model, q_cols);
  if (status.ok()) {
    status = CheckWeight(fn, "w_k", weights.w_k, c.d_model, kv_cols);
  }
  if (status.ok()) {
    status = CheckWeight(fn, "w_v", weights.w_v, c.d_model, kv_cols);
  }
  if (status.ok()) {
    status = CheckWeight(fn, "w_o", weights.w_o, q_cols, c.d_model);
  }
  if (status.ok() && c.qk_norm) {
    status = internal::CheckNormWeight(fn, "weights.q_norm", weights.q_norm,
                                       c.head_dim);
  }
  if (status.ok() && c.qk_norm) {
    status = internal::CheckNormWeight(fn, "weights.k_norm", weights.k_norm,
                                       c.head_dim);
  }
  return status;
}

// A part of the weights that a shard packs: its view of the host's matrix,
// whose element [0, 0] is element [row0, col0] of weight `name`.
struct WeightPart {
  const char* name;
  MatrixView<const float> view;
  int64_t row0;
  int64_t col0;
};

// For int8 weights: part holds no NaN or inf, which PackedB cannot store in
// int8 (and would report as a column of the fused matrix); the message names
// the host's element.
Status CheckInt8Storable(const char* fn, const WeightPart& part) {
  const MatrixView<const float>& w = part.view;
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t j = 0; j < w.cols; ++j) {
      const float value = w.data[r * w.stride + j];
      if (std::isfinite(value)) continue;
      return Fail(StatusCode::kInvalidArgument, fn, part.name, "[",
                  part.row0 + r, ", ", part.col0 + j, "] is ", value,
                  ", which int8 weights (config.weight_dtype 2) cannot store");
    }
  }
  return Status::Ok();
}

}  // namespace

// What Forward reuses from call to call: grown to the largest call, freed by
// ReleaseScratch.
struct LayerScratch {
  ScratchBuffer q, attn;             // grow-only (lib/core/blocks.h)
  ScratchBuffer kv_chunk;            // stored K/V: [chunk_rows, scratch_cols]
  ScratchBuffer kv_a;                // stored K/V on AMX: a chunk's x rows
  std::vector<float*> rows;          // [3][T]
  std::vector<char*> kv_rows;        // stored K/V: [2][T]
  std::vector<float*> kv_scales;     // int8: [2][T]
  std::vector<int64_t> positions;    // RoPE: [T]
  ScratchBuffer rope_table;          // RoPE: [T, rotary_dim]
  std::vector<AttentionWork> works;  // up to kMaxKeySegments per sequence
  std::vector<uint8_t> seen;         // [cache sequences]
  // A ring cache: the new tokens' K and V, sequence i of the call in row
  // i, until attention has read them with the ring's rows (before they
  // overwrite the oldest) and CommitRing moves them into the ring.
  KvCache fresh;
  AttentionPlan plan;

  size_t Bytes() const {
    return (q.capacity + attn.capacity + kv_chunk.capacity + kv_a.capacity +
            rope_table.capacity) *
               sizeof(float) +
           VectorBytes(rows) + VectorBytes(kv_rows) + VectorBytes(kv_scales) +
           VectorBytes(positions) + VectorBytes(works) + VectorBytes(seen) +
           fresh.bytes() + plan.Bytes();
  }
  template <typename T>
  static size_t VectorBytes(const std::vector<T>& v) {
    return v.capacity() * sizeof(T);
  }
};

struct AttentionLayer::Impl : LayerScratch {
  // Packs this shard's part of checked weights for a resolved config, as
  // config.weight_dtype (errors named as fn's).
  Status Pack(const char* fn, const AttentionLayerConfig& c,
              const AttentionLayerWeights& weights);

  // Forward's steps.
  Status CheckSequences(const char* fn, const KvCache& cache,
                        const LayerSequence* sequences, int64_t n_sequences,
                        int64_t* tokens);
  Status Plan(KvCache* cache, const LayerSequence* sequences,
              int64_t n_sequences, int64_t tokens, MatrixView<const float> x,
              MatrixView<float> y, LayerStep* step);
  // A fresh cache for n_sequences of up to max_tokens new tokens like cache.
  Status PrepareFresh(const KvCache& cache, int64_t n_sequences,
                      int64_t max_tokens);
  // Moves fresh's n_new rows of sequence i into the ring cache's seq.
  void CommitRing(KvCache* cache, int64_t seq, int64_t i, int64_t n_new);

  AttentionLayerConfig config;  // resolved
  int64_t local_heads = 0;
  int64_t local_kv_heads = 0;
  int64_t n_weights = 0;
  PackedB qkv;  // [d_model, (local_heads + 2 local_kv_heads) * head_dim]
  PackedB o;    // [local_heads * head_dim, d_model]
  std::vector<float> b_qkv;           // empty: no bias
  std::vector<float> b_o;             // empty: none (or not the first shard)
  std::vector<float> q_norm, k_norm;  // [head_dim]; empty: no QK-norm
  std::vector<double> rope_freq;      // [rotary_dim / 2]; empty: no RoPE
  // Copies of config.attention's per-head arrays, [n_heads] (the whole
  // model's, as config() reports them); empty: none.
  std::vector<float> alibi_slopes, sink_logits;
};

Status AttentionLayer::Impl::Pack(const char* fn, const AttentionLayerConfig& c,
                                  const AttentionLayerWeights& weights) {
  config = c;
  const int64_t group = c.n_heads / c.n_kv_heads;
  const int64_t hd = c.head_dim;
  const int64_t h0 = c.head_begin, h1 = c.head_end;
  const int64_t g0 = h0 / group, g1 = h1 / group;
  local_heads = h1 - h0;
  local_kv_heads = g1 - g0;
  const int64_t lq = local_heads * hd;
  const int64_t lkv = local_kv_heads * hd;
  const int64_t n_qkv = lq + 2 * lkv;
  // This shard's columns of W_Q, W_K and W_V, and its rows of W_O.
  const WeightPart parts[4] = {
      {"weights.w_q",
       {weights.w_q.data + h0 * hd, c.d_model, lq, weights.w_q.stride},
       0,
       h0 * hd},
      {"weights.w_k",
       {weights.w_k.data + g0 * hd, c.d_model, lkv, weights.w_k.stride},
       0,
       g0 * hd},
      {"weights.w_v",
       {weights.w_v.data + g0 * hd, c.d_model, lkv, weights.w_v.stride},
       0,
       g0 * hd},
      {"weights.w_o",
       {weights.w_o.data + h0 * hd * weights.w_o.stride, lq, c.d_model,
        weights.w_o.stride},
       h0 * hd,
       0}};
  if (c.weight_dtype == WeightDtype::kInt8) {
    for (const WeightPart& part : parts) {
      const Status status = CheckInt8Storable(fn, part);
      if (!status.ok()) return status;
    }
  }
  // The fused weight [W_Q | W_K | W_V], packed straight from the host's
  // matrices; then W_O.
  const MatrixView<const float> qkv_parts[3] = {parts[0].view, parts[1].view,
                                                parts[2].view};
  Status status = PackedB::PackColumns(qkv_parts, 3, &qkv, c.weight_dtype);
  if (!status.ok()) return status;
  status = PackedB::Pack(parts[3].view, Transpose::kNo, &o, c.weight_dtype);
  if (!status.ok()) return status;
  n_weights = c.d_model * n_qkv + lq * c.d_model;
  if (weights.b_q != nullptr || weights.b_k != nullptr ||
      weights.b_v != nullptr) {
    b_qkv.assign(static_cast<size_t>(n_qkv), 0.0f);
    if (weights.b_q != nullptr) {
      std::copy(weights.b_q + h0 * hd, weights.b_q + h1 * hd, b_qkv.begin());
      n_weights += lq;
    }
    if (weights.b_k != nullptr) {
      std::copy(weights.b_k + g0 * hd, weights.b_k + g1 * hd,
                b_qkv.begin() + lq);
      n_weights += lkv;
    }
    if (weights.b_v != nullptr) {
      std::copy(weights.b_v + g0 * hd, weights.b_v + g1 * hd,
                b_qkv.begin() + lq + lkv);
      n_weights += lkv;
    }
  }
  if (weights.b_o != nullptr && h0 == 0) {
    b_o.assign(weights.b_o, weights.b_o + c.d_model);
    n_weights += c.d_model;
  }
  if (c.qk_norm) {
    q_norm.assign(weights.q_norm, weights.q_norm + hd);
    k_norm.assign(weights.k_norm, weights.k_norm + hd);
    if (h0 == 0) n_weights += 2 * hd;  // every shard has them; one counts
  }
  // Sink logits are learned, one per head: a shard counts its heads'.
  if (c.attention.sink_logits != nullptr) n_weights += h1 - h0;
  if (c.rope.rotary_dim != 0) {
    rope_freq.resize(static_cast<size_t>(c.rope.rotary_dim / 2));
    internal::RopeFrequencies(c.rope, rope_freq.data());
  }
  // The per-head arrays: the layer's own copies, which config() points to.
  const auto keep = [&](const float* from, std::vector<float>* to) {
    if (from == nullptr) return static_cast<const float*>(nullptr);
    to->assign(from, from + c.n_heads);
    return static_cast<const float*>(to->data());
  };
  config.attention.alibi_slopes = keep(c.attention.alibi_slopes, &alibi_slopes);
  config.attention.sink_logits = keep(c.attention.sink_logits, &sink_logits);
  return Status::Ok();
}

AttentionLayer::AttentionLayer() = default;
AttentionLayer::~AttentionLayer() = default;
AttentionLayer::AttentionLayer(AttentionLayer&& other) noexcept = default;
AttentionLayer& AttentionLayer::operator=(AttentionLayer&& other) noexcept =
    default;

Status AttentionLayer::Create(const AttentionLayerConfig& config,
                              const AttentionLayerWeights& weights,
                              AttentionLayer* out) {
  constexpr const char* kFn = "AttentionLayer::Create";
  if (out == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "out is null");
  }
  AttentionLayerConfig c = config;
  Status status = ResolveConfig(kFn, &c);
  if (status.ok()) status = CheckWeights(kFn, c, weights);
  if (!status.ok()) return status;
  internal::InitOnce();
  try {
    auto impl = std::make_unique<Impl>();
    status = impl->Pack(kFn, c, weights);
    if (!status.ok()) return status;
    out->impl_ = std::move(impl);
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kResourceExhausted, kFn, "out of memory");
  }
  return Status::Ok();
}

const AttentionLayerConfig& AttentionLayer::config() const {
  static const AttentionLayerConfig kEmpty = [] {
    AttentionLayerConfig empty;
    empty.attention.mask = AttentionMask::kNone;
    empty.qk_norm_eps = 0.0f;
    return empty;
  }();
  return impl_ ? impl_->config : kEmpty;
}
const float* AttentionLayer::q_norm() const {
  return impl_ && !impl_->q_norm.empty() ? impl_->q_norm.data() : nullptr;
}
const float* AttentionLayer::k_norm() const {
  return impl_ && !impl_->k_norm.empty() ? impl_->k_norm.data() : nullptr;
}
int64_t AttentionLayer::local_heads() const {
  return impl_ ? impl_->local_heads : 0;
}
int64_t AttentionLayer::local_kv_heads() const {
  return impl_ ? impl_->local_kv_heads : 0;
}
int64_t AttentionLayer::n_weights() const {
  return impl_ ? impl_->n_weights : 0;
}
size_t AttentionLayer::packed_bytes() const {
  return impl_ ? impl_->qkv.bytes() + impl_->o.bytes() : 0;
}
size_t AttentionLayer::scratch_bytes() const {
  return impl_ ? impl_->LayerScratch::Bytes() : 0;
}
size_t AttentionLayer::ReleaseScratch() {
  if (!impl_) return 0;
  const size_t bytes = scratch_bytes();
  static_cast<LayerScratch&>(*impl_) = LayerScratch();
  return bytes;
}
KvCacheConfig AttentionLayer::CacheConfig(int64_t n_sequences, int64_t capacity,
                                          KvDtype dtype) const {
  KvCacheConfig cache;
  cache.n_sequences = n_sequences;
  cache.n_kv_heads = local_kv_heads();
  cache.head_dim = config().head_dim;
  cache.capacity = capacity;
  cache.dtype = dtype;
  return cache;
}
KvCacheConfig AttentionLayer::RingCacheConfig(int64_t n_sequences,
                                              KvDtype dtype) const {
  const AttentionOptions& attention = config().attention;
  KvCacheConfig cache = CacheConfig(n_sequences, 0, dtype);
  cache.ring = true;
  cache.n_sink_tokens = attention.n_sink_tokens;
  // A sum past int64_t saturates: KvCache::Create reports its byte count.
  if (attention.window > 0 &&
      !internal::CheckedAdd(attention.window, attention.n_sink_tokens,
                            &cache.capacity)) {
    cache.capacity = std::numeric_limits<int64_t>::max();
  }
  return cache;
}
size_t AttentionLayer::cache_bytes_per_token(KvDtype dtype) const {
  return impl_ ? KvCache::BytesPerToken(CacheConfig(1, 1, dtype)) : 0;
}

// ----------------------------------------------------------- Forward's steps

// Checks the sequences of a call against cache (which matches the layer) and
// sums their tokens. Messages are built on error only: no allocation on the
// hot path.
Status AttentionLayer::Impl::CheckSequences(const char* fn,
                                            const KvCache& cache,
                                            const LayerSequence* sequences,
                                            int64_t n_sequences,
                                            int64_t* tokens) {
  const int64_t slots = cache.n_sequences(), capacity = cache.capacity();
  const bool ring = cache.config().ring;
  constexpr int64_t kMaxPosition = int64_t{1} << 62;
  seen.assign(static_cast<size_t>(slots), 0);
  *tokens = 0;
  for (int64_t i = 0; i < n_sequences; ++i) {
    const LayerSequence& s = sequences[i];
    const auto name = [i] { return internal::Cat("sequences[", i, "]"); };
    if (s.seq < 0 || s.seq >= slots) {
      return Fail(StatusCode::kInvalidArgument, fn, name(), ".seq (", s.seq,
                  ") is not in [0, ", slots, ")");
    }
    if (seen[static_cast<size_t>(s.seq)]) {
      return Fail(StatusCode::kInvalidArgument, fn, name(), ".seq (", s.seq,
                  ") is listed twice");
    }
    seen[static_cast<size_t>(s.seq)] = 1;
    if (s.n_tokens < 1) {
      return Fail(StatusCode::kInvalidArgument, fn, name(),
                  ".n_tokens must be >= 1 (got ", s.n_tokens, ")");
    }
    const int64_t length = cache.length(s.seq);
    if (ring) {
      // Positions and the call's token count stay far from overflowing.
      if (s.n_tokens > kMaxPosition - length ||
          s.n_tokens > kMaxPosition - *tokens) {
        return Fail(StatusCode::kOutOfRange, fn, name(), ": length ", length,
                    " + ", s.n_tokens, " new tokens exceeds 2^62 positions");
      }
      *tokens += s.n_tokens;
      continue;
    }
    if (length > capacity - s.n_tokens) {
      return Fail(StatusCode::kOutOfRange, fn, name(), ": length ", length,
                  " + ", s.n_tokens, " new tokens exceeds the cache capacity ",
                  capacity);
    }
    *tokens += s.n_tokens;  // <= n_sequences * capacity: no overflow
  }
  return Status::Ok();
}

namespace {

// x and y: [tokens, d_model] views, y disjoint from x, neither in the cache
// (the projection writes cache rows while it reads x). The cache's buffers,
// not Keys(0, 0): other threads may be changing other sequences.
Status CheckInOut(const char* fn, const KvCache& cache, int64_t tokens,
                  int64_t d_model, MatrixView<const float> x,
                  MatrixView<float> y) {
  Status status = internal::CheckMatrix(fn, "x", x);
  if (status.ok()) status = internal::CheckMatrix(fn, "y", y);
  if (!status.ok()) return status;
  if (x.rows != tokens || x.cols != d_model) {
    return Fail(StatusCode::kInvalidArgument, fn, "x is ",
                Shape(x.rows, x.cols), " but must be ", Shape(tokens, d_model),
                " (tokens of all sequences, d_model)");
  }
  if (y.rows != tokens || y.cols != d_model) {
    return Fail(StatusCode::kInvalidArgument, fn, "y is ",
                Shape(y.rows, y.cols), " but must be ", Shape(tokens, d_model));
  }
  const internal::Span x_span = SpanOf(x), y_span = SpanOf(y);
  const internal::Span keys = SpanOf(cache.KeyBuffer());
  const internal::Span values = SpanOf(cache.ValueBuffer());
  status = internal::CheckDisjoint(fn, y_span, "y", x_span, "x");
  if (status.ok()) {
    status = internal::CheckDisjoint(fn, x_span, "x", keys, "the cache");
  }
  if (status.ok()) {
    status = internal::CheckDisjoint(fn, x_span, "x", values, "the cache");
  }
  if (status.ok()) {
    status = internal::CheckDisjoint(fn, y_span, "y", keys, "the cache");
  }
  if (status.ok()) {
    status = internal::CheckDisjoint(fn, y_span, "y", values, "the cache");
  }
  return status;
}

// Stored K/V chunks: up to 256 tokens (B is read once per chunk: 256 rows
// give 128 flops per byte of B) times as many K or V heads as keep the float
// scratch within 512 KiB, half of the 1 MiB L2 (at least one head).
constexpr size_t kLayerChunkRows = 256;
constexpr size_t kLayerScratchFloats = size_t{128} << 10;

// Chunk geometry for `tokens` rows and `segments` K and V heads of head_dim
// columns, panels of panel_width: *cols, the scratch's row length, covers
// the panels of any chunk's segments. Returns the floats to reserve for the
// scratch: at least rows * cols, and never less for fewer tokens (so that a
// smaller Forward call allocates nothing), at most 512 KiB + 2 panels a row
// (or one head and 2 panels a row for a head wider than 512 KiB / rows).
size_t LayerChunks(size_t tokens, size_t head_dim, size_t segments,
                   size_t panel_width, size_t* rows, size_t* chunk_segments,
                   size_t* cols) {
  *rows = std::min(tokens, kLayerChunkRows);
  const size_t per_row = kLayerScratchFloats / *rows;
  *chunk_segments =
      per_row > 2 * panel_width + head_dim
          ? std::max<size_t>(1, (per_row - 2 * panel_width) / head_dim)
          : 1;
  *chunk_segments = std::min(*chunk_segments, segments);
  *cols = (*chunk_segments * head_dim + 2 * panel_width - 2) / panel_width *
          panel_width;
  // rows * cols <= both bounds, each growing with rows.
  const size_t margin = 2 * panel_width * *rows;
  return std::min(*rows * segments * head_dim,
                  std::max(*rows * head_dim, kLayerScratchFloats)) +
         margin;
}

}  // namespace

Status AttentionLayer::Impl::PrepareFresh(const KvCache& cache,
                                          int64_t n_sequences,
                                          int64_t max_tokens) {
  const KvCacheConfig& have = fresh.config();
  if (have.n_sequences < n_sequences || have.capacity < max_tokens ||
      have.dtype != cache.config().dtype) {
    KvCacheConfig want = cache.config();
    want.ring = false;
    want.n_sink_tokens = 0;
    want.n_sequences = std::max(n_sequences, have.n_sequences);
    want.capacity = std::max(max_tokens, have.capacity);
    Status status = KvCache::Create(want, &fresh);
    if (!status.ok()) return status;
  }
  fresh.ResetAll();
  return Status::Ok();
}

void AttentionLayer::Impl::CommitRing(KvCache* cache, int64_t seq, int64_t i,
                                      int64_t n_new) {
  const KvCacheConfig& config = cache->config();
  const size_t row_bytes =
      static_cast<size_t>(cache->row_stride()) * KvDtypeSize(config.dtype);
  int64_t done = 0;
  // Past the sink tokens, rows that later rows of this call overwrite are
  // committed unwritten.
  if (cache->length(seq) >= config.n_sink_tokens) {
    done =
        std::max<int64_t>(0, n_new - (config.capacity - config.n_sink_tokens));
    if (done > 0) (void)cache->CommitAppend(seq, done);
  }
  while (done < n_new) {
    const int64_t n = std::min(n_new - done, cache->ContiguousRows(seq));
    for (int64_t g = 0; g < config.n_kv_heads; ++g) {
      KvMutableView from_k, from_v, to_k, to_v;
      // Checked sizes: cannot fail.
      (void)fresh.PendingRows(i, g, n_new, &from_k, &from_v);
      (void)cache->PendingRows(seq, g, n, &to_k, &to_v);
      const size_t offset = static_cast<size_t>(done) * row_bytes;
      std::memcpy(to_k.data, static_cast<const char*>(from_k.data) + offset,
                  static_cast<size_t>(n) * row_bytes);
      std::memcpy(to_v.data, static_cast<const char*>(from_v.data) + offset,
                  static_cast<size_t>(n) * row_bytes);
      if (to_k.scales != nullptr) {
        std::memcpy(to_k.scales, from_k.scales + done,
                    static_cast<size_t>(n) * sizeof(float));
        std::memcpy(to_v.scales, from_v.scales + done,
                    static_cast<size_t>(n) * sizeof(float));
      }
    }
    (void)cache->CommitAppend(seq, n);
    done += n;
  }
}

// Fills step for checked arguments: Q and attention buffers [T, local_heads *
// head_dim], the row pointers of Q and of the new K and V rows in the cache,
// one AttentionWork per sequence.
Status AttentionLayer::Impl::Plan(KvCache* cache,
                                  const LayerSequence* sequences,
                                  int64_t n_sequences, int64_t tokens,
                                  MatrixView<const float> x,
                                  MatrixView<float> y, LayerStep* step) {
  const AttentionLayerConfig& c = config;
  const size_t t_rows = static_cast<size_t>(tokens);
  const size_t hd = static_cast<size_t>(c.head_dim);
  const size_t lq = static_cast<size_t>(local_heads) * hd;
  const size_t lkv = static_cast<size_t>(local_kv_heads) * hd;
  const KvDtype dtype = cache->config().dtype;
  const bool stored = dtype != KvDtype::kFloat32;
  const size_t panel_width = static_cast<size_t>(qkv.panel_width());
  // Stored K/V: Q's GEMM writes whole panels, so its rows are padded to them.
  const size_t ld_q =
      stored ? (lq + panel_width - 1) / panel_width * panel_width : lq;
  float* q_buf = q.Get(t_rows * ld_q);
  float* attn_buf = attn.Get(t_rows * lq);
  rows.resize(3 * t_rows);
  kv_rows.resize(2 * t_rows);
  kv_scales.resize(internal::KvDtypeScaled(dtype) ? 2 * t_rows : 0);
  positions.resize(rope_freq.empty() ? 0 : t_rows);
  works.clear();
  step->dims =
      MakeAttentionDims(*cache, local_heads, c.attention, c.head_begin);
  // The new rows go to the cache, or for a ring to fresh (PrepareFresh).
  const bool ring = cache->config().ring;
  if (ring) {
    int64_t max_tokens = 1;
    for (int64_t i = 0; i < n_sequences; ++i) {
      max_tokens = std::max(max_tokens, sequences[i].n_tokens);
    }
    Status status = PrepareFresh(*cache, n_sequences, max_tokens);
    if (!status.ok()) return status;
  }
  KvCache& target = ring ? fresh : *cache;
  float** q_rows = rows.data();  // rows: [3][T], Q, then K, then V
  float** k_rows = q_rows + t_rows;
  float** v_rows = k_rows + t_rows;
  size_t row0 = 0;
  for (int64_t i = 0; i < n_sequences; ++i) {
    const LayerSequence& s = sequences[i];
    KvMutableView k_new, v_new;  // head 0's new rows
    Status status =
        target.PendingRows(ring ? i : s.seq, 0, s.n_tokens, &k_new, &v_new);
    if (!status.ok()) return status;  // checked: cannot happen
    const size_t row_bytes =
        static_cast<size_t>(k_new.stride) * KvDtypeSize(dtype);
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const size_t r = row0 + static_cast<size_t>(t);
      q_rows[r] = q_buf + r * ld_q;
      kv_rows[r] = static_cast<char*>(k_new.data) + t * row_bytes;
      kv_rows[t_rows + r] = static_cast<char*>(v_new.data) + t * row_bytes;
      k_rows[r] = reinterpret_cast<float*>(kv_rows[r]);
      v_rows[r] = reinterpret_cast<float*>(kv_rows[t_rows + r]);
      if (!kv_scales.empty()) {
        kv_scales[r] = k_new.scales + t;
        kv_scales[t_rows + r] = v_new.scales + t;
      }
    }
    const int64_t length = cache->length(s.seq);
    for (int64_t t = 0; t < s.n_tokens && !positions.empty(); ++t) {
      positions[row0 + static_cast<size_t>(t)] = length + t;
    }
    // The keys: a plain cache's rows [0, length + n_tokens); a ring's held
    // rows, then fresh's.
    KeyRun runs[kMaxKeySegments];
    int64_t n_runs = 0;
    if (ring) {
      n_runs = CacheKeyRuns(*cache, s.seq, runs);
      runs[n_runs++] = RowsRun(length, k_new, v_new, fresh.head_stride(),
                               fresh.scale_head_stride());
    } else {
      KvView k_all = cache->Keys(s.seq, 0), v_all = cache->Values(s.seq, 0);
      k_all.rows = v_all.rows = length + s.n_tokens;
      runs[n_runs++] = RowsRun(0, k_all, v_all, cache->head_stride(),
                               cache->scale_head_stride());
    }
    AddSequenceWorks(
        step->dims,
        SequenceQueries(length,
                        MatrixView<const float>(q_buf + row0 * ld_q, s.n_tokens,
                                                static_cast<int64_t>(lq),
                                                static_cast<int64_t>(ld_q)),
                        MatrixView<float>(attn_buf + row0 * lq, s.n_tokens,
                                          static_cast<int64_t>(lq)),
                        MatrixView<const float>()),
        runs, n_runs, &works);
    row0 += static_cast<size_t>(s.n_tokens);
  }

  step->x = x.data;
  step->ldx = static_cast<size_t>(x.stride);
  step->tokens = t_rows;
  step->d_model = static_cast<size_t>(c.d_model);
  step->packed_qkv = PackedWeights(qkv, c.projection_compute);
  step->panel_width = static_cast<size_t>(qkv.panel_width());
  step->n_qkv = lq + 2 * lkv;
  step->b_qkv = b_qkv.empty() ? nullptr : b_qkv.data();
  step->head_dim = hd;
  step->q_norm = q_norm.empty() ? nullptr : q_norm.data();
  step->k_norm = k_norm.empty() ? nullptr : k_norm.data();
  step->qk_norm_eps = c.qk_norm_eps;
  step->rope_freq = rope_freq.data();
  step->rope_half = rope_freq.size();
  step->rope_layout = c.rope.layout;
  step->positions = positions.data();
  step->rope_table = rope_freq.empty()
                         ? nullptr
                         : rope_table.Get(t_rows * 2 * rope_freq.size());
  step->kv_dtype = dtype;
  step->q = q_buf;
  step->ld_q = ld_q;
  step->q_cols = lq;
  step->kv_heads = static_cast<size_t>(local_kv_heads);
  step->kv_rows = kv_rows.data();
  step->kv_scales = kv_scales.empty() ? nullptr : kv_scales.data();
  step->kv_head_bytes =
      static_cast<size_t>(target.head_stride()) * KvDtypeSize(dtype);
  step->scale_head_stride = static_cast<size_t>(target.scale_head_stride());
  const size_t scratch_floats = LayerChunks(
      t_rows, hd, 2 * static_cast<size_t>(local_kv_heads), panel_width,
      &step->chunk_rows, &step->chunk_segments, &step->scratch_cols);
  step->scratch = stored ? kv_chunk.Get(scratch_floats) : nullptr;
  step->chunk_a = stored ? &kv_a : nullptr;
  MatmulOut& out = step->qkv_out;
  if (stored) {  // Q only, plain (AddBias)
    out.c = q_buf;
    out.ldc = ld_q;
  } else {
    out.rows = rows.data();
  }
  out.m = t_rows;
  out.seg_cols = hd;
  out.n_kinds = 3;
  out.kind_first[0] = 0;
  out.kind_first[1] = static_cast<size_t>(local_heads);
  out.kind_first[2] = static_cast<size_t>(local_heads + local_kv_heads);
  out.kind_stride[0] = hd;
  out.kind_stride[1] = out.kind_stride[2] =
      static_cast<size_t>(target.head_stride());
  step->works = works.data();
  step->n_works = works.size();
  step->plan = &plan;
  step->attn = attn_buf;
  step->ld_attn = lq;
  step->k_o = lq;
  step->packed_o = PackedWeights(o, c.projection_compute);
  step->y = y.data;
  step->ldy = static_cast<size_t>(y.stride);
  step->b_o = b_o.empty() ? nullptr : b_o.data();
  return Status::Ok();
}

Status AttentionLayer::Forward(KvCache* cache, const LayerSequence* sequences,
                               int64_t n_sequences, MatrixView<const float> x,
                               MatrixView<float> y) {
  constexpr const char* kFn = "AttentionLayer::Forward";
  // Checks.
  if (!impl_) {
    return Fail(StatusCode::kFailedPrecondition, kFn,
                "the layer is empty (create it with AttentionLayer::Create)");
  }
  Impl& impl = *impl_;
  const AttentionLayerConfig& c = impl.config;
  if (cache == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "cache is null");
  }
  if (sequences == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "sequences is null");
  }
  Status status = internal::CheckPositive(kFn, "n_sequences", n_sequences);
  if (!status.ok()) return status;
  if (cache->n_kv_heads() != impl.local_kv_heads ||
      cache->head_dim() != c.head_dim) {
    return Fail(StatusCode::kInvalidArgument, kFn, "cache has n_kv_heads ",
                cache->n_kv_heads(), " and head_dim ", cache->head_dim(),
                " but the layer needs n_kv_heads ", impl.local_kv_heads,
                " and head_dim ", c.head_dim, " (see CacheConfig)");
  }
  status = CheckCacheOptions(kFn, "config.attention", *cache, c.attention);
  if (!status.ok()) return status;
  try {
    int64_t tokens = 0;
    status = impl.CheckSequences(kFn, *cache, sequences, n_sequences, &tokens);
    if (status.ok()) status = CheckInOut(kFn, *cache, tokens, c.d_model, x, y);
    if (!status.ok()) return status;

    // Planning, then the one dispatch.
    LayerStep step;
    status = impl.Plan(cache, sequences, n_sequences, tokens, x, y, &step);
    if (!status.ok()) return status;
    const size_t want = HWY_DYNAMIC_DISPATCH(LayerForwardT)(step);
    if (want != 0) {
      return Fail(StatusCode::kFailedPrecondition, kFn,
                  "the weights were packed for ", impl.qkv.target_name(),
                  " (panels of ", impl.qkv.panel_width(),
                  " columns) but dispatch now picks panels of ", want,
                  ": create the layer again");
    }

    // Commit: the new rows become part of their sequences.
    for (int64_t i = 0; i < n_sequences; ++i) {
      if (cache->config().ring) {
        impl.CommitRing(cache, sequences[i].seq, i, sequences[i].n_tokens);
        continue;
      }
      status = cache->CommitAppend(sequences[i].seq, sequences[i].n_tokens);
      if (!status.ok()) return status;  // checked: cannot happen
    }
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kResourceExhausted, kFn,
                "out of memory for scratch");
  }
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

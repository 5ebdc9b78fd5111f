// AttentionLayer: config and weight checks, packing, and Forward's one dynamic
// dispatch per call. The per-target step runs the fused QKV projection (K and
// V straight into the cache rows), the fused attention and the output
// projection with the matmul and attention kernels' per-target entry points
// (lib/core/kernels-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
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
#include "lib/matmul/matmul_call.h"

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
  const float* packed_qkv;
  size_t panel_width;  // of both packed matrices
  size_t n_qkv;
  const float* b_qkv;  // [n_qkv] or null
  MatmulOut qkv_out;
  size_t head_dim;
  // Attention of the new tokens, into the attention buffer.
  const AttentionWork* works;
  size_t n_works;
  AttentionDims dims;
  AttentionPlan* plan;
  // y [T, d_model] = attn [T, k_o] * W_O [k_o, d_model] + b_o.
  const float* attn;
  size_t ld_attn;
  size_t k_o;
  const float* packed_o;
  float* y;
  size_t ldy;
  const float* b_o;  // [d_model] or null
};

}  // namespace headway
#endif  // HEADWAY_LIB_LAYER_STEP_

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// Runs a checked step. Returns 0, or this target's panel width when the
// weights were packed for another one (nothing written).
size_t LayerForwardT(const LayerStep& step) {
  const size_t panel_width = MatmulPanelWidthT();
  if (step.panel_width != panel_width) return panel_width;
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    MatmulPackedOutT(step.x, step.ldx, /*trans_a=*/false, step.packed_qkv,
                     step.tokens, step.n_qkv, step.d_model, step.qkv_out, 1.0f,
                     0.0f);
    if (step.b_qkv != nullptr) {
      // Segment by segment (one head of Q, K or V): its columns are
      // contiguous wherever they went.
      const size_t segments = step.n_qkv / step.head_dim;
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, step.tokens),
          [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
            for (size_t i = range.begin(); i < range.end(); ++i) {
              for (size_t s = 0; s < segments; ++s) {
                float* row = step.qkv_out.At(i, s * step.head_dim);
                const float* bias = step.b_qkv + s * step.head_dim;
                for (size_t c = 0; c < step.head_dim; ++c) row[c] += bias[c];
              }
            }
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
#include "lib/core/init.h"
#include "lib/core/validate.h"

namespace headway {

HWY_EXPORT(LayerForwardT);

namespace {

std::string Str(int64_t value) { return std::to_string(value); }

std::string Shape(int64_t rows, int64_t cols) {
  return "[" + Str(rows) + ", " + Str(cols) + "]";
}

// A checked weight view of the expected shape.
Status CheckWeight(const char* fn, const char* name, MatrixView<const float> w,
                   int64_t rows, int64_t cols) {
  Status status = internal::CheckMatrix(fn, name, w);
  if (!status.ok()) return status;
  if (w.rows != rows || w.cols != cols) {
    return Status::InvalidArgument(std::string(fn) + ": weights." + name +
                                   " is " + Shape(w.rows, w.cols) +
                                   " but must be " + Shape(rows, cols));
  }
  return Status::Ok();
}

// Bytes spanned by a checked view.
int64_t SpanOf(int64_t rows, int64_t cols, int64_t stride) {
  int64_t bytes = 0;
  internal::SpanBytes(rows, cols, stride, sizeof(float), &bytes);
  return bytes;
}

}  // namespace

struct AttentionLayer::Impl {
  AttentionLayerConfig config;  // resolved
  int64_t local_heads = 0;
  int64_t local_kv_heads = 0;
  int64_t n_weights = 0;
  PackedB qkv;  // [d_model, (local_heads + 2 local_kv_heads) * head_dim]
  PackedB o;    // [local_heads * head_dim, d_model]
  std::vector<float> b_qkv;  // empty: no bias
  std::vector<float> b_o;    // empty: none (or not the first shard)
  // Reused by Forward.
  ScratchBuffer q, attn;     // grow-only (lib/core/blocks.h)
  std::vector<float*> rows;  // [3][T]
  std::vector<AttentionWork> works;
  std::vector<uint8_t> seen;  // [cache sequences]
  AttentionPlan plan;
};

AttentionLayer::AttentionLayer() = default;
AttentionLayer::~AttentionLayer() = default;
AttentionLayer::AttentionLayer(AttentionLayer&& other) noexcept = default;
AttentionLayer& AttentionLayer::operator=(AttentionLayer&& other) noexcept =
    default;

Status AttentionLayer::Create(const AttentionLayerConfig& config,
                              const AttentionLayerWeights& weights,
                              AttentionLayer* out) {
  constexpr const char* kFn = "AttentionLayer::Create";
  if (out == nullptr)
    return Status::InvalidArgument(std::string(kFn) + ": " + "out is null");
  AttentionLayerConfig c = config;
  if (c.d_model < 1) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "config.d_model must be >= 1 (got " +
                                   Str(c.d_model) + ")");
  }
  if (c.n_heads < 1) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "config.n_heads must be >= 1 (got " +
                                   Str(c.n_heads) + ")");
  }
  if (c.n_kv_heads < 0) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "config.n_kv_heads must be >= 0 (got " +
                                   Str(c.n_kv_heads) + ")");
  }
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  if (c.n_heads % c.n_kv_heads != 0) {
    return Status::InvalidArgument(
        std::string(kFn) + ": " + "config.n_heads (" + Str(c.n_heads) +
        ") is not a multiple of config.n_kv_heads (" + Str(c.n_kv_heads) + ")");
  }
  if (c.head_dim < 0) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "config.head_dim must be >= 0 (got " +
                                   Str(c.head_dim) + ")");
  }
  if (c.head_dim == 0) {
    if (c.d_model % c.n_heads != 0) {
      return Status::InvalidArgument(
          std::string(kFn) + ": " +
          "config.head_dim is 0 but config.d_model (" + Str(c.d_model) +
          ") is not a multiple of config.n_heads (" + Str(c.n_heads) +
          "): give head_dim");
    }
    c.head_dim = c.d_model / c.n_heads;
  }
  if (c.mask != AttentionMask::kNone && c.mask != AttentionMask::kCausal) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "config.mask is not an AttentionMask (got " +
                                   Str(static_cast<int>(c.mask)) + ")");
  }
  if (!std::isfinite(c.scale) || c.scale < 0.0f) {
    return Status::InvalidArgument(
        std::string(kFn) + ": " + "config.scale must be finite and >= 0 (got " +
        std::to_string(c.scale) + ")");
  }
  if (c.scale == 0.0f) {
    c.scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  }
  const int64_t group = c.n_heads / c.n_kv_heads;
  if (c.head_begin == 0 && c.head_end == 0) c.head_end = c.n_heads;
  if (c.head_begin < 0 || c.head_end > c.n_heads ||
      c.head_begin >= c.head_end || c.head_begin % group != 0 ||
      c.head_end % group != 0) {
    return Status::InvalidArgument(
        std::string(kFn) + ": " + "config.head_begin, head_end [" +
        Str(c.head_begin) + ", " + Str(c.head_end) +
        ") must be a non-empty range in [0, n_heads = " + Str(c.n_heads) +
        "] on KV-group boundaries (multiples of " + Str(group) + ")");
  }
  // Sizes: every weight matrix's element count must fit easily.
  int64_t q_cols = 0, kv_cols = 0, qkv_cols = 0, elems = 0;
  if (!internal::CheckedMul(c.n_heads, c.head_dim, &q_cols) ||
      !internal::CheckedMul(c.n_kv_heads, c.head_dim, &kv_cols) ||
      !internal::CheckedMul(kv_cols, 2, &qkv_cols) ||
      !internal::CheckedAdd(qkv_cols, q_cols, &qkv_cols) ||
      !internal::CheckedProduct({c.d_model, qkv_cols, 64}, &elems)) {
    return Status::ResourceExhausted(
        std::string(kFn) + ": config.d_model (" + Str(c.d_model) +
        ") x (config.n_heads (" + Str(c.n_heads) +
        ") + 2 x config.n_kv_heads (" + Str(c.n_kv_heads) +
        ")) x config.head_dim (" + Str(c.head_dim) +
        "): the weights' byte count overflows");
  }
  Status status = CheckWeight(kFn, "w_q", weights.w_q, c.d_model, q_cols);
  if (status.ok()) {
    status = CheckWeight(kFn, "w_k", weights.w_k, c.d_model, kv_cols);
  }
  if (status.ok()) {
    status = CheckWeight(kFn, "w_v", weights.w_v, c.d_model, kv_cols);
  }
  if (status.ok()) {
    status = CheckWeight(kFn, "w_o", weights.w_o, q_cols, c.d_model);
  }
  if (!status.ok()) return status;

  internal::InitOnce();
  try {
    auto impl = std::make_unique<Impl>();
    impl->config = c;
    const int64_t hd = c.head_dim;
    const int64_t h0 = c.head_begin, h1 = c.head_end;
    const int64_t g0 = h0 / group, g1 = h1 / group;
    impl->local_heads = h1 - h0;
    impl->local_kv_heads = g1 - g0;
    const int64_t lq = impl->local_heads * hd;
    const int64_t lkv = impl->local_kv_heads * hd;
    const int64_t n_qkv = lq + 2 * lkv;
    // The fused weight: this shard's columns of W_Q, then W_K, then W_V,
    // packed straight from the host's matrices.
    const MatrixView<const float> qkv_parts[3] = {
        {weights.w_q.data + h0 * hd, c.d_model, lq, weights.w_q.stride},
        {weights.w_k.data + g0 * hd, c.d_model, lkv, weights.w_k.stride},
        {weights.w_v.data + g0 * hd, c.d_model, lkv, weights.w_v.stride}};
    status = PackedB::PackColumns(qkv_parts, 3, &impl->qkv);
    if (!status.ok()) return status;
    // This shard's rows of W_O.
    status = PackedB::Pack(
        MatrixView<const float>(weights.w_o.data + h0 * hd * weights.w_o.stride,
                                lq, c.d_model, weights.w_o.stride),
        Transpose::kNo, &impl->o);
    if (!status.ok()) return status;
    impl->n_weights = c.d_model * n_qkv + lq * c.d_model;
    if (weights.b_q != nullptr || weights.b_k != nullptr ||
        weights.b_v != nullptr) {
      impl->b_qkv.assign(static_cast<size_t>(n_qkv), 0.0f);
      if (weights.b_q != nullptr) {
        std::copy(weights.b_q + h0 * hd, weights.b_q + h1 * hd,
                  impl->b_qkv.begin());
        impl->n_weights += lq;
      }
      if (weights.b_k != nullptr) {
        std::copy(weights.b_k + g0 * hd, weights.b_k + g1 * hd,
                  impl->b_qkv.begin() + lq);
        impl->n_weights += lkv;
      }
      if (weights.b_v != nullptr) {
        std::copy(weights.b_v + g0 * hd, weights.b_v + g1 * hd,
                  impl->b_qkv.begin() + lq + lkv);
        impl->n_weights += lkv;
      }
    }
    if (weights.b_o != nullptr && h0 == 0) {
      impl->b_o.assign(weights.b_o, weights.b_o + c.d_model);
      impl->n_weights += c.d_model;
    }
    out->impl_ = std::move(impl);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(std::string(kFn) + ": " + "out of memory");
  }
  return Status::Ok();
}

const AttentionLayerConfig& AttentionLayer::config() const {
  static const AttentionLayerConfig kEmpty{0,    0, 0, 0, AttentionMask::kNone,
                                           0.0f, 0, 0};
  return impl_ ? impl_->config : kEmpty;
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
KvCacheConfig AttentionLayer::CacheConfig(int64_t n_sequences,
                                          int64_t capacity) const {
  KvCacheConfig cache;
  cache.n_sequences = n_sequences;
  cache.n_kv_heads = local_kv_heads();
  cache.head_dim = config().head_dim;
  cache.capacity = capacity;
  return cache;
}
size_t AttentionLayer::cache_bytes_per_token() const {
  if (!impl_) return 0;
  // KvCache's row stride: head_dim rounded up to 16 floats.
  const size_t row_stride =
      RoundUp(static_cast<size_t>(impl_->config.head_dim), size_t{16});
  return 2 * static_cast<size_t>(impl_->local_kv_heads) * row_stride *
         sizeof(float);
}

Status AttentionLayer::Forward(KvCache* cache, const LayerSequence* sequences,
                               int64_t n_sequences, MatrixView<const float> x,
                               MatrixView<float> y) {
  constexpr const char* kFn = "AttentionLayer::Forward";
  if (!impl_) {
    return Status::FailedPrecondition(
        std::string(kFn) + ": " +
        "the layer is empty (create it with AttentionLayer::Create)");
  }
  Impl& impl = *impl_;
  const AttentionLayerConfig& c = impl.config;
  if (cache == nullptr)
    return Status::InvalidArgument(std::string(kFn) + ": " + "cache is null");
  if (sequences == nullptr) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "sequences is null");
  }
  if (n_sequences < 1) {
    return Status::InvalidArgument(std::string(kFn) + ": " +
                                   "n_sequences must be >= 1 (got " +
                                   Str(n_sequences) + ")");
  }
  if (cache->n_kv_heads() != impl.local_kv_heads ||
      cache->head_dim() != c.head_dim) {
    return Status::InvalidArgument(
        std::string(kFn) + ": " + "cache has n_kv_heads " +
        Str(cache->n_kv_heads()) + " and head_dim " + Str(cache->head_dim()) +
        " but the layer needs n_kv_heads " + Str(impl.local_kv_heads) +
        " and head_dim " + Str(c.head_dim) + " (see CacheConfig)");
  }
  try {
    impl.seen.assign(static_cast<size_t>(cache->n_sequences()), 0);
    int64_t tokens = 0;
    for (int64_t i = 0; i < n_sequences; ++i) {
      const LayerSequence& s = sequences[i];
      // Messages are built on error only: no allocation on the hot path.
      const auto name = [i] { return "sequences[" + Str(i) + "]"; };
      if (s.seq < 0 || s.seq >= cache->n_sequences()) {
        return Status::InvalidArgument(
            std::string(kFn) + ": " + name() + ".seq (" + Str(s.seq) +
            ") is not in [0, " + Str(cache->n_sequences()) + ")");
      }
      if (impl.seen[static_cast<size_t>(s.seq)]) {
        return Status::InvalidArgument(std::string(kFn) + ": " + name() +
                                       ".seq (" + Str(s.seq) +
                                       ") is listed twice");
      }
      impl.seen[static_cast<size_t>(s.seq)] = 1;
      if (s.n_tokens < 1) {
        return Status::InvalidArgument(std::string(kFn) + ": " + name() +
                                       ".n_tokens must be >= 1 (got " +
                                       Str(s.n_tokens) + ")");
      }
      if (cache->length(s.seq) > cache->capacity() - s.n_tokens) {
        return Status::OutOfRange(
            std::string(kFn) + ": " + name() + ": length " +
            Str(cache->length(s.seq)) + " + " + Str(s.n_tokens) +
            " new tokens exceeds the cache capacity " + Str(cache->capacity()));
      }
      tokens += s.n_tokens;  // <= n_sequences * capacity: no overflow
    }
    Status status = internal::CheckMatrix(kFn, "x", x);
    if (status.ok()) status = internal::CheckMatrix(kFn, "y", y);
    if (!status.ok()) return status;
    if (x.rows != tokens || x.cols != c.d_model) {
      return Status::InvalidArgument(std::string(kFn) + ": " + "x is " +
                                     Shape(x.rows, x.cols) + " but must be " +
                                     Shape(tokens, c.d_model) +
                                     " (tokens of all sequences, d_model)");
    }
    if (y.rows != tokens || y.cols != c.d_model) {
      return Status::InvalidArgument(std::string(kFn) + ": " + "y is " +
                                     Shape(y.rows, y.cols) + " but must be " +
                                     Shape(tokens, c.d_model));
    }
    const int64_t y_bytes = SpanOf(y.rows, y.cols, y.stride);
    if (internal::Overlaps(x.data, SpanOf(x.rows, x.cols, x.stride), y.data,
                           y_bytes)) {
      return Status::InvalidArgument(std::string(kFn) + ": " + "y overlaps x");
    }
    // x must not be in the cache either: the projection writes cache rows
    // while it reads x. The buffers, not Keys(0, 0): other threads may be
    // changing other sequences.
    const MatrixView<const float> cache_buffers[2] = {cache->KeyBuffer(),
                                                      cache->ValueBuffer()};
    const MatrixView<const float> views[2] = {x, y};
    for (int v = 0; v < 2; ++v) {
      const int64_t bytes =
          SpanOf(views[v].rows, views[v].cols, views[v].stride);
      for (const MatrixView<const float>& buffer : cache_buffers) {
        if (internal::Overlaps(buffer.data,
                               SpanOf(buffer.rows, buffer.cols, buffer.stride),
                               views[v].data, bytes)) {
          return Status::InvalidArgument(std::string(kFn) + ": " +
                                         (v == 0 ? "x" : "y") +
                                         " overlaps the cache");
        }
      }
    }

    // Plan: Q and attention buffers [T, local_heads * head_dim], row pointers
    // of Q and of the new K and V rows, one AttentionWork per sequence.
    const size_t t_rows = static_cast<size_t>(tokens);
    const size_t hd = static_cast<size_t>(c.head_dim);
    const size_t lq = static_cast<size_t>(impl.local_heads) * hd;
    const size_t lkv = static_cast<size_t>(impl.local_kv_heads) * hd;
    float* q_buf = impl.q.Get(t_rows * lq);
    float* attn_buf = impl.attn.Get(t_rows * lq);
    impl.rows.resize(3 * t_rows);
    impl.works.resize(static_cast<size_t>(n_sequences));
    const int64_t row_stride = cache->row_stride();
    const int64_t head_stride = cache->capacity() * row_stride;
    size_t row0 = 0;
    for (int64_t i = 0; i < n_sequences; ++i) {
      const LayerSequence& s = sequences[i];
      MatrixView<float> k_rows, v_rows;
      status = cache->PendingRows(s.seq, 0, s.n_tokens, &k_rows, &v_rows);
      if (!status.ok()) return status;  // checked above: cannot happen
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        impl.rows[row0 + t] = q_buf + (row0 + t) * lq;
        impl.rows[t_rows + row0 + t] = k_rows.data + t * row_stride;
        impl.rows[2 * t_rows + row0 + t] = v_rows.data + t * row_stride;
      }
      AttentionWork& work = impl.works[static_cast<size_t>(i)];
      work.q = q_buf + row0 * lq;
      work.q_stride = static_cast<int64_t>(lq);
      work.out = attn_buf + row0 * lq;
      work.out_stride = static_cast<int64_t>(lq);
      work.mask = nullptr;
      work.mask_stride = 0;
      work.n_tokens = s.n_tokens;
      work.q_pos0 = cache->length(s.seq);
      work.kv_len = work.q_pos0 + s.n_tokens;
      work.keys = cache->Keys(s.seq, 0).data;
      work.values = cache->Values(s.seq, 0).data;
      row0 += static_cast<size_t>(s.n_tokens);
    }

    LayerStep step;
    step.x = x.data;
    step.ldx = static_cast<size_t>(x.stride);
    step.tokens = t_rows;
    step.d_model = static_cast<size_t>(c.d_model);
    step.packed_qkv = impl.qkv.data();
    step.panel_width = static_cast<size_t>(impl.qkv.panel_width());
    step.n_qkv = lq + 2 * lkv;
    step.b_qkv = impl.b_qkv.empty() ? nullptr : impl.b_qkv.data();
    step.head_dim = hd;
    MatmulOut& out = step.qkv_out;
    out.rows = impl.rows.data();
    out.m = t_rows;
    out.seg_cols = hd;
    out.n_kinds = 3;
    out.kind_first[0] = 0;
    out.kind_first[1] = static_cast<size_t>(impl.local_heads);
    out.kind_first[2] =
        static_cast<size_t>(impl.local_heads + impl.local_kv_heads);
    out.kind_stride[0] = hd;
    out.kind_stride[1] = out.kind_stride[2] = static_cast<size_t>(head_stride);
    step.works = impl.works.data();
    step.n_works = impl.works.size();
    step.dims.n_heads = impl.local_heads;
    step.dims.n_kv_heads = impl.local_kv_heads;
    step.dims.head_dim = c.head_dim;
    step.dims.row_stride = row_stride;
    step.dims.head_stride = head_stride;
    step.dims.scale = c.scale;
    step.dims.causal = c.mask == AttentionMask::kCausal;
    step.plan = &impl.plan;
    step.attn = attn_buf;
    step.ld_attn = lq;
    step.k_o = lq;
    step.packed_o = impl.o.data();
    step.y = y.data;
    step.ldy = static_cast<size_t>(y.stride);
    step.b_o = impl.b_o.empty() ? nullptr : impl.b_o.data();

    const size_t want = HWY_DYNAMIC_DISPATCH(LayerForwardT)(step);
    if (want != 0) {
      return Status::FailedPrecondition(
          std::string(kFn) + ": " + "the weights were packed for " +
          impl.qkv.target_name() + " (panels of " +
          Str(impl.qkv.panel_width()) +
          " columns) but dispatch now picks panels of " +
          Str(static_cast<int64_t>(want)) + ": create the layer again");
    }
    for (int64_t i = 0; i < n_sequences; ++i) {
      status = cache->CommitAppend(sequences[i].seq, sequences[i].n_tokens);
      if (!status.ok()) return status;  // checked above: cannot happen
    }
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(std::string(kFn) + ": " +
                                     "out of memory for scratch");
  }
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

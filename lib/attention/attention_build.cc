#include "lib/attention/attention_build.h"

#include <cmath>
#include <utility>

#include "lib/core/message.h"

namespace headway {

Status CheckAttentionOptions(const char* fn, const char* name,
                             const AttentionOptions& options, int64_t n_heads) {
  if (options.mask != AttentionMask::kNone &&
      options.mask != AttentionMask::kCausal) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".mask is not an AttentionMask (got ",
                          static_cast<int>(options.mask), ")");
  }
  if (!std::isfinite(options.scale) || options.scale < 0.0f) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".scale must be finite and >= 0 (got ", options.scale,
                          ")");
  }
  if (options.window < 0) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".window must be >= 0 (got ", options.window, ")");
  }
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".softcap must be finite and >= 0 (got ",
                          options.softcap, ")");
  }
  const std::pair<const char*, const float*> arrays[] = {
      {".alibi_slopes", options.alibi_slopes},
      {".sink_logits", options.sink_logits}};
  for (const auto& [field, values] : arrays) {
    for (int64_t h = 0; values != nullptr && h < n_heads; ++h) {
      if (!std::isfinite(values[h])) {
        return internal::Fail(StatusCode::kInvalidArgument, fn, name, field,
                              "[", h, "] is not finite (got ", values[h], ")");
      }
    }
  }
  return Status::Ok();
}

Status AlibiSlopes(int64_t n_heads, float* slopes) {
  constexpr const char* kFn = "AlibiSlopes";
  Status status = internal::CheckPositive(kFn, "n_heads", n_heads);
  if (!status.ok()) return status;
  if (slopes == nullptr) {
    return internal::Fail(StatusCode::kInvalidArgument, kFn, "slopes is null");
  }
  // n' = the largest power of two <= n_heads.
  int64_t n2 = 1;
  while (n2 <= n_heads / 2) n2 *= 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    // Heads past n' take the odd slopes of 2 n': 2^(-8 (2 i + 1) / (2 n')).
    const double exponent =
        h < n2 ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(n2)
               : -8.0 * static_cast<double>(2 * (h - n2) + 1) /
                     static_cast<double>(2 * n2);
    slopes[h] = static_cast<float>(std::exp2(exponent));
  }
  return Status::Ok();
}

float AttentionScale(const AttentionOptions& options, int64_t head_dim) {
  if (options.scale != 0.0f) return options.scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

AttentionDims MakeAttentionDims(const KvCache& cache, int64_t n_heads,
                                const AttentionOptions& options,
                                int64_t head0) {
  AttentionDims dims;
  dims.n_heads = n_heads;
  dims.n_kv_heads = cache.n_kv_heads();
  dims.head_dim = cache.head_dim();
  dims.row_stride = cache.row_stride();
  dims.head_stride = cache.head_stride();
  dims.dtype = cache.config().dtype;
  dims.scale_head_stride = cache.scale_head_stride();
  dims.scale = AttentionScale(options, cache.head_dim());
  dims.causal = options.mask == AttentionMask::kCausal;
  dims.window = options.window;
  dims.softcap = options.softcap;
  dims.alibi_slopes =
      options.alibi_slopes != nullptr ? options.alibi_slopes + head0 : nullptr;
  dims.sink_logits =
      options.sink_logits != nullptr ? options.sink_logits + head0 : nullptr;
  return dims;
}

AttentionWork MakeAttentionWork(const KvCache& cache, int64_t seq,
                                int64_t q_pos0, int64_t kv_len,
                                MatrixView<const float> q,
                                MatrixView<float> out,
                                MatrixView<const float> mask) {
  AttentionWork work;
  work.q = q.data;
  work.q_stride = q.stride;
  work.out = out.data;
  work.out_stride = out.stride;
  work.mask = mask.data;
  work.mask_stride = mask.stride;
  work.n_tokens = q.rows;
  work.q_pos0 = q_pos0;
  work.kv_len = kv_len;
  // Head 0 of seq; head g is g * dims.head_stride further.
  const KvView keys = cache.Keys(seq, 0);
  const KvView values = cache.Values(seq, 0);
  work.keys = keys.data;
  work.values = values.data;
  work.key_scales = keys.scales;  // int8; else null
  work.value_scales = values.scales;
  return work;
}

}  // namespace headway

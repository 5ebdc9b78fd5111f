#include "lib/attention/attention_build.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "headway/targets.h"
#include "lib/core/message.h"
#include "lib/core/storage.h"

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
  if (options.n_sink_tokens < 0) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".n_sink_tokens must be >= 0 (got ",
                          options.n_sink_tokens, ")");
  }
  if (options.n_sink_tokens > 0 && options.n_sink_tokens > options.window) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".n_sink_tokens (", options.n_sink_tokens,
                          ") must be <= ", name, ".window (", options.window,
                          "): sink tokens stay visible beside a window");
  }
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".softcap must be finite and >= 0 (got ",
                          options.softcap, ")");
  }
  if (options.compute != AttentionCompute::kFloat32 &&
      options.compute != AttentionCompute::kBFloat16 &&
      options.compute != AttentionCompute::kInt8) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".compute is not an AttentionCompute (got ",
                          static_cast<int>(options.compute), ")");
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
  dims.dtype = cache.config().dtype;
  dims.scale = AttentionScale(options, cache.head_dim());
  dims.causal = options.mask == AttentionMask::kCausal;
  dims.window = options.window;
  dims.n_sink_tokens = options.n_sink_tokens;
  dims.softcap = options.softcap;
  dims.alibi_slopes =
      options.alibi_slopes != nullptr ? options.alibi_slopes + head0 : nullptr;
  dims.sink_logits =
      options.sink_logits != nullptr ? options.sink_logits + head0 : nullptr;
  dims.bf16_products = options.compute == AttentionCompute::kBFloat16;
  dims.native_bf16 = dims.bf16_products && NativeBFloat16Active();
  dims.amx_bf16 = dims.bf16_products && AmxBFloat16Active();
  dims.int8_products = options.compute == AttentionCompute::kInt8;
  return dims;
}

Status CheckCacheOptions(const char* fn, const char* name, const KvCache& cache,
                         const AttentionOptions& options) {
  const KvCacheConfig& config = cache.config();
  // The cache type each compute mode multiplies with.
  const struct {
    AttentionCompute compute;
    const char* compute_name;
    KvDtype dtype;
    const char* cache_name;
  } kNeeds[] = {{AttentionCompute::kBFloat16, "kBFloat16", KvDtype::kBFloat16,
                 "a bfloat16"},
                {AttentionCompute::kInt8, "kInt8", KvDtype::kInt8, "an int8"}};
  for (const auto& need : kNeeds) {
    if (options.compute == need.compute && config.dtype != need.dtype) {
      return internal::Fail(StatusCode::kInvalidArgument, fn, name, ".compute ",
                            need.compute_name, " needs ", need.cache_name,
                            " cache (got ", internal::KvDtypeName(config.dtype),
                            ")");
    }
  }
  if (!config.ring) return Status::Ok();
  const int64_t ring_rows = config.capacity - config.n_sink_tokens;
  if (options.window < 1 || options.window > ring_rows) {
    return internal::Fail(
        StatusCode::kInvalidArgument, fn, name, ".window (", options.window,
        ") must be in [1, capacity - n_sink_tokens = ", ring_rows,
        "] with a ring cache (it holds the last ", ring_rows, " positions)");
  }
  if (options.n_sink_tokens != config.n_sink_tokens) {
    return internal::Fail(StatusCode::kInvalidArgument, fn, name,
                          ".n_sink_tokens (", options.n_sink_tokens,
                          ") must equal the ring cache's n_sink_tokens (",
                          config.n_sink_tokens, ")");
  }
  return Status::Ok();
}

KeyRun RowsRun(int64_t begin, const KvView& k, const KvView& v,
               int64_t head_stride, int64_t scale_head_stride) {
  KeyRun run;
  run.begin = begin;
  run.end = begin + k.rows;
  run.keys = k.data;
  run.values = v.data;
  run.head_stride = head_stride;
  run.key_scales = k.scales;
  run.value_scales = v.scales;
  run.scale_head_stride = k.scales != nullptr ? scale_head_stride : 0;
  return run;
}

int64_t CacheKeyRuns(const KvCache& cache, int64_t seq,
                     KeyRun runs[kMaxKeySegments]) {
  const KvView keys = cache.Keys(seq, 0), values = cache.Values(seq, 0);
  const size_t row_bytes =
      static_cast<size_t>(cache.row_stride()) * KvDtypeSize(keys.dtype);
  // The run of positions [begin, end) from row Slot(begin).
  const auto run = [&](int64_t begin, int64_t end) {
    const int64_t row = cache.Slot(begin);
    KvView k = keys, v = values;
    k.data = static_cast<const char*>(keys.data) +
             static_cast<size_t>(row) * row_bytes;
    v.data = static_cast<const char*>(values.data) +
             static_cast<size_t>(row) * row_bytes;
    k.rows = v.rows = end - begin;
    if (keys.scales != nullptr) {
      k.scales = keys.scales + row;
      v.scales = values.scales + row;
    }
    return RowsRun(begin, k, v, cache.head_stride(), cache.scale_head_stride());
  };
  const int64_t length = cache.length(seq);
  const KvCacheConfig& config = cache.config();
  if (!config.ring) {
    runs[0] = run(0, length);
    return 1;
  }
  int64_t n = 0;
  const int64_t sinks = std::min(length, config.n_sink_tokens);
  if (sinks > 0) runs[n++] = run(0, sinks);
  const int64_t begin = cache.ring_begin(seq);
  if (begin < length) {
    // The ring's rows from Slot(begin) to its end, then from its start.
    const int64_t first =
        std::min(length, begin + config.capacity - cache.Slot(begin));
    runs[n++] = run(begin, first);
    if (first < length) runs[n++] = run(first, length);
  }
  return n;
}

AttentionWork SequenceQueries(int64_t q_pos0, MatrixView<const float> q,
                              MatrixView<float> out,
                              MatrixView<const float> mask) {
  AttentionWork work{};
  work.q = q.data;
  work.q_stride = q.stride;
  work.out = out.data;
  work.out_stride = out.stride;
  work.mask = mask.data;
  work.mask_stride = mask.stride;
  work.n_tokens = q.rows;
  work.q_pos0 = q_pos0;
  return work;
}

void AddSequenceWorks(const AttentionDims& dims, const AttentionWork& queries,
                      const KeyRun* runs, int64_t n_runs,
                      std::vector<AttentionWork>* works) {
  const size_t first = works->size();
  // Positions below `sinks` are seen whatever the window.
  const int64_t sinks = dims.window > 0 ? dims.n_sink_tokens : 0;
  const int64_t row_bytes =
      dims.row_stride * static_cast<int64_t>(KvDtypeSize(dims.dtype));
  const auto add = [&](const KeyRun& run, int64_t begin, int64_t end) {
    AttentionWork work = queries;
    work.key_begin = begin;
    work.kv_len = end;
    work.windowed = begin >= sinks;
    const int64_t skip = begin - run.begin;
    work.keys = static_cast<const char*>(run.keys) + skip * row_bytes;
    work.values = static_cast<const char*>(run.values) + skip * row_bytes;
    work.head_stride = run.head_stride;
    work.key_scales =
        run.key_scales != nullptr ? run.key_scales + skip : nullptr;
    work.value_scales =
        run.value_scales != nullptr ? run.value_scales + skip : nullptr;
    work.scale_head_stride = run.scale_head_stride;
    works->push_back(work);
  };
  for (int64_t i = 0; i < n_runs; ++i) {
    const KeyRun& run = runs[i];
    if (run.begin < sinks && sinks < run.end) {
      add(run, run.begin, sinks);
      add(run, sinks, run.end);
    } else {
      add(run, run.begin, run.end);
    }
  }
  const int64_t n = static_cast<int64_t>(works->size() - first);
  for (int64_t i = 0; i < n; ++i) {
    (*works)[first + static_cast<size_t>(i)].segment = i;
    (*works)[first + static_cast<size_t>(i)].n_segments = n;
  }
}

}  // namespace headway

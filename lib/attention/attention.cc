// Attention: argument checks and the one dynamic dispatch per call (kernels:
// attention-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <new>
#include <string>
#include <vector>

#include "tbb/task_arena.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/attention/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/attention/attention-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// The calling thread's AttentionPlan, freed by ReleaseThreadScratch.
struct ThreadAttentionPlan final : ThreadScratch {
  size_t Bytes() const override {
    return plan.splits.capacity() * sizeof(AttentionSplit) +
           (plan.first_item.capacity() + plan.first_partial.capacity() +
            plan.merge_first.capacity()) *
               sizeof(int64_t) +
           plan.partials.capacity * sizeof(float);
  }
  void Release() override { plan = AttentionPlan(); }

  AttentionPlan plan;
};

void FusedAttentionT(const AttentionWork* works, size_t n_works,
                     const AttentionDims& dims, AttentionPlan* plan) {
  // Reused across calls. isolate(): while this thread waits in the parallel
  // loops it must not pick up another task of the host that calls Attention
  // and reuses the same plan.
  thread_local ThreadAttentionPlan thread_plan;
  if (plan == nullptr) plan = &thread_plan.plan;
  tbb::this_task_arena::isolate(
      [&]() HWY_ATTR { FusedAttention(works, n_works, dims, plan); });
}

void MaterializedAttentionT(const AttentionWork& work,
                            const AttentionDims& dims, float* weights,
                            int64_t w_stride) {
  MaterializedAttention(dims, work, weights, w_stride);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "headway/attention.h"
#include "lib/core/init.h"
#include "lib/core/validate.h"

namespace headway {

HWY_EXPORT(FusedAttentionT);
HWY_EXPORT(MaterializedAttentionT);

namespace {

std::string Str(int64_t value) { return std::to_string(value); }

// Byte span of a checked view.
struct Span {
  const void* data;
  int64_t bytes;
};
template <typename T>
Span SpanOf(MatrixView<T> view) {
  Span span{view.data, 0};
  internal::SpanBytes(view.rows, view.cols, view.stride, sizeof(float),
                      &span.bytes);
  return span;
}

// Checks the call-wide arguments and fills dims and *width (the columns of q
// and out: n_heads * head_dim).
Status CheckCall(const char* fn, const KvCache& cache, int64_t n_heads,
                 const AttentionOptions& options, AttentionDims* dims,
                 int64_t* width) {
  const std::string prefix = std::string(fn) + ": ";
  if (cache.n_sequences() == 0) {
    return Status::InvalidArgument(prefix + "cache is empty (not created)");
  }
  if (n_heads < 1) {
    return Status::InvalidArgument(prefix + "n_heads must be >= 1 (got " +
                                   Str(n_heads) + ")");
  }
  if (n_heads % cache.n_kv_heads() != 0) {
    return Status::InvalidArgument(
        prefix + "n_heads (" + Str(n_heads) +
        ") is not a multiple of the cache's n_kv_heads (" +
        Str(cache.n_kv_heads()) + ")");
  }
  if (!internal::CheckedMul(n_heads, cache.head_dim(), width)) {
    return Status::InvalidArgument(
        prefix + "n_heads * head_dim (" + Str(n_heads) + " * " +
        Str(cache.head_dim()) + ") overflows int64_t");
  }
  if (options.mask != AttentionMask::kNone &&
      options.mask != AttentionMask::kCausal) {
    return Status::InvalidArgument(
        prefix + "options.mask is not an AttentionMask (got " +
        Str(static_cast<int>(options.mask)) + ")");
  }
  if (!std::isfinite(options.scale) || options.scale < 0.0f) {
    return Status::InvalidArgument(
        prefix + "options.scale must be finite and >= 0 (got " +
        std::to_string(options.scale) + ")");
  }
  dims->n_heads = n_heads;
  dims->n_kv_heads = cache.n_kv_heads();
  dims->head_dim = cache.head_dim();
  dims->row_stride = cache.row_stride();
  dims->head_stride = cache.capacity() * cache.row_stride();
  dims->scale =
      options.scale != 0.0f
          ? options.scale
          : static_cast<float>(
                1.0 / std::sqrt(static_cast<double>(cache.head_dim())));
  dims->causal = options.mask == AttentionMask::kCausal;
  return Status::Ok();
}

// Checks one query (width: n_heads * head_dim, checked) and fills its work
// description.
Status CheckQuery(const char* fn, const KvCache& cache, int64_t n_heads,
                  int64_t width, const AttentionQuery& query,
                  const std::string& name, AttentionWork* work) {
  const std::string prefix = std::string(fn) + ": " + name;
  if (query.seq < 0 || query.seq >= cache.n_sequences()) {
    return Status::InvalidArgument(prefix + ".seq (" + Str(query.seq) +
                                   ") is out of range [0, " +
                                   Str(cache.n_sequences()) + ")");
  }
  const std::string q_name = name + ".q", out_name = name + ".out";
  Status status = internal::CheckMatrix(fn, q_name.c_str(), query.q);
  if (status.ok())
    status = internal::CheckMatrix(fn, out_name.c_str(), query.out);
  if (!status.ok()) return status;
  if (query.q.cols != width) {
    return Status::InvalidArgument(prefix + ".q.cols (" + Str(query.q.cols) +
                                   ") != n_heads * head_dim (" + Str(n_heads) +
                                   " * " + Str(cache.head_dim()) + ")");
  }
  status = internal::CheckSameShape(fn, q_name.c_str(), query.q.rows,
                                    query.q.cols, out_name.c_str(),
                                    query.out.rows, query.out.cols);
  if (!status.ok()) return status;
  if (query.q_pos0 < 0) {
    return Status::InvalidArgument(prefix + ".q_pos0 must be >= 0 (got " +
                                   Str(query.q_pos0) + ")");
  }
  const int64_t length = cache.length(query.seq);
  if (query.q_pos0 > length - query.q.rows) {
    return Status::OutOfRange(prefix + ": q_pos0 + n_tokens (" +
                              Str(query.q_pos0) + " + " + Str(query.q.rows) +
                              ") exceeds the " + Str(length) +
                              " cached rows of sequence " + Str(query.seq) +
                              " (append the new tokens' K and V first)");
  }
  if (query.mask.data != nullptr) {
    const std::string mask_name = name + ".mask";
    status = internal::CheckMatrix(fn, mask_name.c_str(), query.mask);
    if (status.ok() &&
        (query.mask.rows != query.q.rows || query.mask.cols != length)) {
      status = Status::InvalidArgument(
          prefix + ".mask is [" + Str(query.mask.rows) + ", " +
          Str(query.mask.cols) + "] but must be [n_tokens, length] = [" +
          Str(query.q.rows) + ", " + Str(length) + "]");
    }
    if (!status.ok()) return status;
  }
  const MatrixView<const float> keys = cache.Keys(query.seq, 0);
  const MatrixView<const float> values = cache.Values(query.seq, 0);
  *work = AttentionWork{query.q.data,     query.q.stride,  query.out.data,
                        query.out.stride, query.mask.data, query.mask.stride,
                        query.q.rows,     query.q_pos0,    length,
                        keys.data,        values.data};
  return Status::Ok();
}

// No written view may overlap a read view or another written view.
Status CheckOverlaps(const char* fn, const std::vector<Span>& written,
                     const std::vector<std::string>& written_names,
                     const std::vector<Span>& read,
                     const std::vector<std::string>& read_names) {
  for (size_t i = 0; i < written.size(); ++i) {
    for (size_t j = 0; j < read.size(); ++j) {
      if (internal::Overlaps(written[i].data, written[i].bytes, read[j].data,
                             read[j].bytes)) {
        return Status::InvalidArgument(std::string(fn) + ": " +
                                       written_names[i] + " overlaps " +
                                       read_names[j]);
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (internal::Overlaps(written[i].data, written[i].bytes, written[j].data,
                             written[j].bytes)) {
        return Status::InvalidArgument(std::string(fn) + ": " +
                                       written_names[i] + " overlaps " +
                                       written_names[j]);
      }
    }
  }
  return Status::Ok();
}

// The cache's K and V buffers, as read spans (no sequence's state is read:
// other threads may be changing other sequences).
void AddCacheSpans(const KvCache& cache, std::vector<Span>* read,
                   std::vector<std::string>* names) {
  read->push_back(SpanOf(cache.KeyBuffer()));
  names->push_back("the cache's keys");
  read->push_back(SpanOf(cache.ValueBuffer()));
  names->push_back("the cache's values");
}

}  // namespace

Status Attention(const KvCache& cache, int64_t n_heads,
                 const AttentionQuery* queries, int64_t n_queries,
                 const AttentionOptions& options) {
  constexpr const char* kFn = "Attention";
  AttentionDims dims;
  int64_t width = 0;
  Status status = CheckCall(kFn, cache, n_heads, options, &dims, &width);
  if (!status.ok()) return status;
  if (queries == nullptr)
    return Status::InvalidArgument("Attention: queries is null");
  if (n_queries < 1) {
    return Status::InvalidArgument("Attention: n_queries must be >= 1 (got " +
                                   Str(n_queries) + ")");
  }
  try {
    std::vector<AttentionWork> works(static_cast<size_t>(n_queries));
    std::vector<Span> written, read;
    std::vector<std::string> written_names, read_names;
    for (int64_t i = 0; i < n_queries; ++i) {
      const std::string name = "queries[" + Str(i) + "]";
      status =
          CheckQuery(kFn, cache, n_heads, width, queries[i], name, &works[i]);
      if (!status.ok()) return status;
      written.push_back(SpanOf(queries[i].out));
      written_names.push_back(name + ".out");
      read.push_back(SpanOf(queries[i].q));
      read_names.push_back(name + ".q");
      if (queries[i].mask.data != nullptr) {
        read.push_back(SpanOf(queries[i].mask));
        read_names.push_back(name + ".mask");
      }
    }
    AddCacheSpans(cache, &read, &read_names);
    status = CheckOverlaps(kFn, written, written_names, read, read_names);
    if (!status.ok()) return status;
    internal::InitOnce();
    HWY_DYNAMIC_DISPATCH(FusedAttentionT)
    (works.data(), works.size(), dims,
     /*plan=*/nullptr);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("Attention: out of memory for scratch");
  }
  return Status::Ok();
}

Status AttentionWithWeights(const KvCache& cache, int64_t n_heads,
                            const AttentionQuery& query,
                            MatrixView<float> weights,
                            const AttentionOptions& options) {
  constexpr const char* kFn = "AttentionWithWeights";
  AttentionDims dims;
  int64_t width = 0;
  Status status = CheckCall(kFn, cache, n_heads, options, &dims, &width);
  if (!status.ok()) return status;
  AttentionWork work;
  status = CheckQuery(kFn, cache, n_heads, width, query, "query", &work);
  if (!status.ok()) return status;
  status = internal::CheckMatrix(kFn, "weights", weights);
  if (!status.ok()) return status;
  // Fits: n_heads <= q.cols, and q's span fits.
  int64_t rows = 0;
  internal::CheckedMul(n_heads, query.q.rows, &rows);
  if (weights.rows != rows || weights.cols != work.kv_len) {
    return Status::InvalidArgument(
        "AttentionWithWeights: weights is [" + Str(weights.rows) + ", " +
        Str(weights.cols) + "] but must be [n_heads * n_tokens, length] = [" +
        Str(rows) + ", " + Str(work.kv_len) + "]");
  }
  try {
    std::vector<Span> written{SpanOf(query.out), SpanOf(weights)};
    std::vector<std::string> written_names{"query.out", "weights"};
    std::vector<Span> read{SpanOf(query.q)};
    std::vector<std::string> read_names{"query.q"};
    if (query.mask.data != nullptr) {
      read.push_back(SpanOf(query.mask));
      read_names.push_back("query.mask");
    }
    AddCacheSpans(cache, &read, &read_names);
    status = CheckOverlaps(kFn, written, written_names, read, read_names);
    if (!status.ok()) return status;
    internal::InitOnce();
    HWY_DYNAMIC_DISPATCH(MaterializedAttentionT)
    (work, dims, weights.data, weights.stride);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(
        "AttentionWithWeights: out of memory for scratch");
  }
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

// Attention: argument checks and the one dynamic dispatch per call (kernels:
// attention-inl.h).
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
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
  size_t Bytes() const override { return plan.Bytes(); }
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
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    internal::VisitKvDtype(dims.dtype, [&](auto stored) HWY_ATTR {
      FusedAttention<decltype(stored)>(works, n_works, dims, plan);
    });
  });
}

void MaterializedAttentionT(const AttentionWork* segs, int64_t n_segs,
                            const AttentionDims& dims, float* weights,
                            int64_t w_stride) {
  internal::VisitKvDtype(dims.dtype, [&](auto stored) HWY_ATTR {
    MaterializedAttention<decltype(stored)>(dims, {segs, n_segs}, weights,
                                            w_stride);
  });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "headway/attention.h"
#include "lib/attention/attention_build.h"
#include "lib/core/init.h"
#include "lib/core/message.h"
#include "lib/core/validate.h"

namespace headway {

HWY_EXPORT(FusedAttentionT);
HWY_EXPORT(MaterializedAttentionT);

namespace {

using internal::Fail;
using internal::Span;
using internal::SpanOf;

// Checks the call-wide arguments; *width: the columns of q and out, n_heads *
// head_dim.
Status CheckCall(const char* fn, const KvCache& cache, int64_t n_heads,
                 const AttentionOptions& options, int64_t* width) {
  if (cache.n_sequences() == 0) {
    return Fail(StatusCode::kInvalidArgument, fn,
                "cache is empty (not created)");
  }
  Status status = internal::CheckPositive(fn, "n_heads", n_heads);
  if (!status.ok()) return status;
  if (n_heads % cache.n_kv_heads() != 0) {
    return Fail(StatusCode::kInvalidArgument, fn, "n_heads (", n_heads,
                ") is not a multiple of the cache's n_kv_heads (",
                cache.n_kv_heads(), ")");
  }
  if (!internal::CheckedMul(n_heads, cache.head_dim(), width)) {
    return Fail(StatusCode::kInvalidArgument, fn, "n_heads * head_dim (",
                n_heads, " * ", cache.head_dim(), ") overflows int64_t");
  }
  status = CheckAttentionOptions(fn, "options", options, n_heads);
  if (status.ok()) status = CheckCacheOptions(fn, "options", cache, options);
  return status;
}

// Checks one query (width: n_heads * head_dim, checked; options checked) and
// appends its segments to works.
Status CheckQuery(const char* fn, const KvCache& cache, int64_t n_heads,
                  int64_t width, const AttentionOptions& options,
                  const AttentionDims& dims, const AttentionQuery& query,
                  const std::string& name, std::vector<AttentionWork>* works) {
  Status status =
      internal::CheckIndex(fn, name + ".seq", query.seq, cache.n_sequences());
  if (!status.ok()) return status;
  const std::string q_name = name + ".q", out_name = name + ".out";
  status = internal::CheckMatrix(fn, q_name.c_str(), query.q);
  if (status.ok())
    status = internal::CheckMatrix(fn, out_name.c_str(), query.out);
  if (!status.ok()) return status;
  if (query.q.cols != width) {
    return Fail(StatusCode::kInvalidArgument, fn, name, ".q.cols (",
                query.q.cols, ") != n_heads * head_dim (", n_heads, " * ",
                cache.head_dim(), ")");
  }
  status = internal::CheckSameShape(fn, q_name.c_str(), query.q.rows,
                                    query.q.cols, out_name.c_str(),
                                    query.out.rows, query.out.cols);
  if (!status.ok()) return status;
  if (query.q_pos0 < 0) {
    return Fail(StatusCode::kInvalidArgument, fn, name,
                ".q_pos0 must be >= 0 (got ", query.q_pos0, ")");
  }
  const int64_t length = cache.length(query.seq);
  if (query.q_pos0 > length - query.q.rows) {
    return Fail(StatusCode::kOutOfRange, fn, name, ": q_pos0 + n_tokens (",
                query.q_pos0, " + ", query.q.rows, ") exceeds the ", length,
                " cached rows of sequence ", query.seq,
                " (append the new tokens' K and V first)");
  }
  const KvCacheConfig& config = cache.config();
  if (config.ring && query.mask.data != nullptr) {
    return Fail(StatusCode::kInvalidArgument, fn, name,
                ".mask must be null with a ring cache");
  }
  if (config.ring) {
    // The first query's window, past the sink tokens, must still be held.
    const int64_t ring_begin = cache.ring_begin(query.seq);
    const int64_t first =
        std::max(config.n_sink_tokens, query.q_pos0 - options.window + 1);
    if (first < ring_begin) {
      return Fail(StatusCode::kOutOfRange, fn, name, ": the query at position ",
                  query.q_pos0, " sees keys from position ", first,
                  " on, but the ring of sequence ", query.seq,
                  " holds them from ", ring_begin,
                  " on (append at most capacity - n_sink_tokens - window + 1 "
                  "tokens before attending)");
    }
  }
  if (query.mask.data != nullptr) {
    status = internal::CheckMatrix(fn, (name + ".mask").c_str(), query.mask);
    if (!status.ok()) return status;
    if (query.mask.rows != query.q.rows || query.mask.cols != length) {
      return Fail(StatusCode::kInvalidArgument, fn, name, ".mask is ",
                  internal::Shape(query.mask.rows, query.mask.cols),
                  " but must be [n_tokens, length] = ",
                  internal::Shape(query.q.rows, length));
    }
  }
  KeyRun runs[kMaxKeySegments];
  const int64_t n_runs = CacheKeyRuns(cache, query.seq, runs);
  AddSequenceWorks(
      dims, SequenceQueries(query.q_pos0, query.q, query.out, query.mask), runs,
      n_runs, works);
  return Status::Ok();
}

// The views of a call: no written view may overlap a read view or another
// written view.
struct CallSpans {
  std::vector<Span> written, read;
  std::vector<std::string> written_names, read_names;

  void AddQuery(const AttentionQuery& query, const std::string& name) {
    written.push_back(SpanOf(query.out));
    written_names.push_back(name + ".out");
    read.push_back(SpanOf(query.q));
    read_names.push_back(name + ".q");
    if (query.mask.data != nullptr) {
      read.push_back(SpanOf(query.mask));
      read_names.push_back(name + ".mask");
    }
  }

  // The cache's K and V buffers and their int8 scales (no sequence's state is
  // read: other threads may be changing other sequences).
  void AddCache(const KvCache& cache) {
    const KvView keys = cache.KeyBuffer(), values = cache.ValueBuffer();
    read.push_back(SpanOf(keys));
    read_names.push_back("the cache's keys");
    read.push_back(SpanOf(values));
    read_names.push_back("the cache's values");
    if (keys.scales != nullptr) {
      read.push_back(internal::ScaleSpanOf(keys));
      read_names.push_back("the cache's key scales");
      read.push_back(internal::ScaleSpanOf(values));
      read_names.push_back("the cache's value scales");
    }
  }

  Status Check(const char* fn) const {
    for (size_t i = 0; i < written.size(); ++i) {
      for (size_t j = 0; j < read.size(); ++j) {
        Status status = internal::CheckDisjoint(
            fn, written[i], written_names[i], read[j], read_names[j]);
        if (!status.ok()) return status;
      }
      for (size_t j = 0; j < i; ++j) {
        Status status = internal::CheckDisjoint(
            fn, written[i], written_names[i], written[j], written_names[j]);
        if (!status.ok()) return status;
      }
    }
    return Status::Ok();
  }
};

}  // namespace

Status Attention(const KvCache& cache, int64_t n_heads,
                 const AttentionQuery* queries, int64_t n_queries,
                 const AttentionOptions& options) {
  constexpr const char* kFn = "Attention";
  int64_t width = 0;
  Status status = CheckCall(kFn, cache, n_heads, options, &width);
  if (!status.ok()) return status;
  if (queries == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "queries is null");
  }
  status = internal::CheckPositive(kFn, "n_queries", n_queries);
  if (!status.ok()) return status;
  try {
    const AttentionDims dims = MakeAttentionDims(cache, n_heads, options);
    std::vector<AttentionWork> works;
    works.reserve(static_cast<size_t>(n_queries));
    CallSpans spans;
    for (int64_t i = 0; i < n_queries; ++i) {
      const std::string name = internal::Cat("queries[", i, "]");
      status = CheckQuery(kFn, cache, n_heads, width, options, dims, queries[i],
                          name, &works);
      if (!status.ok()) return status;
      spans.AddQuery(queries[i], name);
    }
    spans.AddCache(cache);
    status = spans.Check(kFn);
    if (!status.ok()) return status;
    internal::InitOnce();
    HWY_DYNAMIC_DISPATCH(FusedAttentionT)
    (works.data(), works.size(), dims,
     /*plan=*/nullptr);
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kResourceExhausted, kFn,
                "out of memory for scratch");
  }
  return Status::Ok();
}

Status AttentionWithWeights(const KvCache& cache, int64_t n_heads,
                            const AttentionQuery& query,
                            MatrixView<float> weights,
                            const AttentionOptions& options) {
  constexpr const char* kFn = "AttentionWithWeights";
  int64_t width = 0;
  Status status = CheckCall(kFn, cache, n_heads, options, &width);
  if (!status.ok()) return status;
  if (cache.config().ring) {
    return Fail(StatusCode::kInvalidArgument, kFn,
                "cache is a ring cache, whose weights would span positions it "
                "no longer holds: use Attention");
  }
  const AttentionDims dims = MakeAttentionDims(cache, n_heads, options);
  try {
    std::vector<AttentionWork> segs;
    status = CheckQuery(kFn, cache, n_heads, width, options, dims, query,
                        "query", &segs);
    if (!status.ok()) return status;
    status = internal::CheckMatrix(kFn, "weights", weights);
    if (!status.ok()) return status;
    // Fits: n_heads <= q.cols, and q's span fits.
    const int64_t rows = n_heads * query.q.rows;
    const int64_t length = cache.length(query.seq);
    if (weights.rows != rows || weights.cols != length) {
      return Fail(StatusCode::kInvalidArgument, kFn, "weights is ",
                  internal::Shape(weights.rows, weights.cols),
                  " but must be [n_heads * n_tokens, length] = ",
                  internal::Shape(rows, length));
    }
    CallSpans spans;
    spans.AddQuery(query, "query");
    spans.written.push_back(SpanOf(weights));
    spans.written_names.push_back("weights");
    spans.AddCache(cache);
    status = spans.Check(kFn);
    if (!status.ok()) return status;
    internal::InitOnce();
    HWY_DYNAMIC_DISPATCH(MaterializedAttentionT)
    (segs.data(), static_cast<int64_t>(segs.size()), dims, weights.data,
     weights.stride);
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kResourceExhausted, kFn,
                "out of memory for scratch");
  }
  return Status::Ok();
}

}  // namespace headway
#endif  // HWY_ONCE

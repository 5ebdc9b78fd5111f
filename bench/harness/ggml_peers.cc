#include "bench/harness/ggml_peers.h"

#ifdef HEADWAY_BENCH_GGML

#include <stddef.h>
#include <stdint.h>

#include <algorithm>

#include "bench/harness/harness.h"

namespace headway {
namespace bench {

ggml_type GgmlCacheType(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBFloat16:
      return GGML_TYPE_BF16;
    case KvDtype::kFloat16:
      return GGML_TYPE_F16;
    case KvDtype::kInt8:
      return GGML_TYPE_Q8_0;
    default:
      return GGML_TYPE_F32;
  }
}

bool TimeGgmlGraphs(benchmark::State& state,
                    const std::vector<ggml_cgraph*>& graphs, int threads) {
  ggml_cpu_init();  // its tables, on the first call only
  std::vector<ggml_cplan> plans;
  size_t work_size = 0;
  for (ggml_cgraph* graph : graphs) {
    plans.push_back(ggml_graph_plan(graph, threads, nullptr));
    work_size = std::max(work_size, plans.back().work_size);
  }
  std::vector<uint8_t> work(work_size);
  for (ggml_cplan& plan : plans) plan.work_data = work.data();
  size_t next = 0;
  bool ok = true;
  const auto run_once = [&] {
    ok = ok &&
         ggml_graph_compute(graphs[next], &plans[next]) == GGML_STATUS_SUCCESS;
    next = next + 1 == graphs.size() ? 0 : next + 1;
    benchmark::ClobberMemory();
  };
  PinnedIfOneThread(threads, [&] {
    run_once();  // untimed, as for Headway's rows
    for (auto _ : state) run_once();
  });
  if (!ok) state.SkipWithError("ggml_graph_compute failed");
  return ok;
}

}  // namespace bench
}  // namespace headway

#endif  // HEADWAY_BENCH_GGML

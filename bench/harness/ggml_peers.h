// What the ggml peers share (llama.cpp's kernels; bench/meson.build defines
// HEADWAY_BENCH_GGML where it found ggml): the type that stands for each KV
// cache type, and the timing of their graphs. The rows themselves are in
// attention_bench.cc (attention_decode_ggml), matmul_bench.cc (matmul_ggml)
// and layer_bench.cc (layer_decode_ggml, layer_weights_decode_ggml).
#ifndef HEADWAY_BENCH_HARNESS_GGML_PEERS_H_
#define HEADWAY_BENCH_HARNESS_GGML_PEERS_H_

#ifdef HEADWAY_BENCH_GGML

#include <vector>

#include "benchmark/benchmark.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "headway/kv_cache.h"

namespace headway {
namespace bench {

// llama.cpp's cache type for a KvDtype: f32, bf16, f16, and q8_0 (blocks of 32
// int8 with an f16 scale) for int8.
ggml_type GgmlCacheType(KvDtype dtype);

// Times ggml_graph_compute on `threads` threads (pinned at 1, as Headway's
// rows), one graph per iteration in turn (several: B's rotating copies), after
// one untimed call. False after skipping the benchmark if a call fails.
bool TimeGgmlGraphs(benchmark::State& state,
                    const std::vector<ggml_cgraph*>& graphs, int threads);

}  // namespace bench
}  // namespace headway

#endif  // HEADWAY_BENCH_GGML
#endif  // HEADWAY_BENCH_HARNESS_GGML_PEERS_H_

#!/bin/sh
# meson test bench_smoke: headway_bench in a tiny mode, then tools/report.py on its JSON.
#
#   bench/smoke_test.sh <headway_bench> <tools/report.py> <output folder>
#
# Tiny mode: 1 ms per ceiling measurement, 1 ms per benchmark, 1 thread, the best target and the
# fallback (SCALAR, EMU128 with clang), and one small row of each kernel family and of its peers
# (the prefills, seconds long on the fallback, on the best target only), plus three rows on
# stored KV types (GQA-8 decode on an int8 cache, MHA prefill on a bf16 cache, MHA decode at
# head_dim 64 on a bf16 cache) and matmul 512^3 in bf16 compute with its peer, oneDNN's bf16
# matmul; where the build found ggml, its rows of those shapes too (llama.cpp's peers). Checks that the progress line and the summary
# table appear (with "in run" figures: the ceiling rows fma_peak and read_peak run too, and
# read_fma_peak at 4 flops per byte) and that
# the JSON has rows with both GFLOP/s and GB/s, and that a thread count above the CPUs is
# refused with a message. The charts are drawn only where matplotlib is installed; the test
# passes without it.
set -eu
bench=$1
report=$2
out=$3
mkdir -p "$out"
rm -f "$out/bench.json" "$out/roofline.svg" "$out/roofline.png" "$out/speedup.svg" \
  "$out/speedup.png"

# Targets other than the fallback (SCALAR or EMU128): ([^SE]|S[^C]|E[^M])[^/]*
not_scalar='([^SE]|S[^C]|E[^M])[^/]*'
filter="^(softmax/[^/]+/rows:32/cols:2048/"
filter="$filter|matmul(_openblas|_onednn|_ggml)?/[^/]+/m:512/n:512/k:512/batch:1/tb:0/packed:[0-4]/"
filter="$filter|matmul_kernel/[^/]+/kc:512/"
filter="$filter|(fma|read)_peak/[^/]+/"
filter="$filter|read_fma_peak/[^/]+/flops_per_byte:4/"
filter="$filter|attention_decode(_materialized)?/[^/]+/kv_heads:1/"
filter="$filter|attention_decode(_ggml)?/[^/]+/kv_heads:8/dtype:3/"
filter="$filter|attention_decode_head_dim(_ggml/fa)?/[^/]+/head_dim:64/dtype:1/"
filter="$filter|attention_prefill/$not_scalar/kv_heads:(1/|32/dtype:1/)"
filter="$filter|layer_(seed_)?decode/[^/]+/kv_heads:1/"
filter="$filter|layer_prefill/$not_scalar/kv_heads:1/)"

"$bench" --headway_ceiling_ms=1 --benchmark_min_time=0.001 --headway_targets=best,fallback \
  --headway_threads=1 "--benchmark_filter=$filter" \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json >"$out/stdout.txt" \
  2>"$out/stderr.txt" || { cat "$out/stdout.txt" "$out/stderr.txt"; exit 1; }
cat "$out/stdout.txt" "$out/stderr.txt"

fail() {
  echo "bench_smoke: $1" >&2
  exit 1
}
grep -q '^\[1/[0-9]* ' "$out/stderr.txt" || fail "no progress line on stderr"
grep -q '^Summary' "$out/stdout.txt" || fail "no summary table on stdout"
# A bound followed by the "in run" percentage (of the run's fma_peak or read_peak row).
grep -Eq '% (FMA|read) +[0-9]+%' "$out/stdout.txt" || fail "no \"in run\" figure in the summary"
grep -q '"GFLOP/s"' "$out/bench.json" || fail "no GFLOP/s in the JSON"
grep -q '"GB/s"' "$out/bench.json" || fail "no GB/s in the JSON"
if grep -q '"error_occurred": true' "$out/bench.json"; then
  fail "a benchmark failed"
fi

# More threads than CPUs (4096, the largest count the flag parses): an error before any
# measurement, not rows that run on fewer threads than their label says.
if "$bench" --headway_threads=1,4096 --benchmark_list_tests >"$out/threads.txt" 2>&1; then
  fail "--headway_threads=1,4096 was accepted"
fi
grep -q 'is more than the [0-9]* CPUs this process may use' "$out/threads.txt" ||
  fail "no message for --headway_threads=1,4096: $(cat "$out/threads.txt")"

python3 "$report" "$out/bench.json" --out-dir "$out" || fail "tools/report.py failed"

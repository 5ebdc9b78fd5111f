// headway::Matmul per target and thread count, against OpenBLAS (cblas_sgemm)
// and oneDNN (dnnl_sgemm; its bf16 matmul primitive for the bf16 compute mode)
// in the same binary when bench/meson.build found them.
//
// Shapes (M x N x K; C [M, N] = A [M, K] * op(B) [K, N]):
//   decode:    1 x 4096 x 4096 and 8 x 4096 x 4096, B pre-packed (PackedB; the
//   peers get plain
//              B): bound by reading B (64 MiB, twice the L3), so they also
//              report the GB/s of reading B and "%read" of the measured
//              streaming-read ceiling.
//   prefill:   128 x 4096 x 4096, 512 x 512 x 512, 2048 x 2048 x 2048, B packed
//   by each call
//              (what cblas_sgemm does too); packed:1 rows show the pre-packed
//              variant.
//   per head:  32 x (1024 x 1024 x 128, B^T) (scores Q K^T) and 32 x (1024 x
//   128 x 1024)
//              (values P V): one call per head, 32 heads per iteration.
//   weights:   1 x 4096 x 4096 and 1 x 4096 x 14336 (GEMV, decode) with B
//              packed as float32, bf16 and int8 (packed:1, 2, 3: 1 +
//              WeightDtype), %read over the bytes stored.
//   bf16 compute: 512^3, 2048^3, 512 x 4096 x 4096 (a d_model-4096 layer's
//              projection at prefill 512) and 1 x 4096 x 4096 with bf16 weights
//              in MatmulCompute::kBFloat16, with the kernel a host gets by
//              default (packed:4: AMX tiles where AmxBFloat16Active, else
//              the native one on the AVX3 targets where
//              CpuPrefersNativeBFloat16) and with the fallback kernel
//              (packed:5), and with A given as bf16 (packed:6: the default
//              kernel; AMX tiles take A as it is), and over int8 weights
//              (packed:7: the default kernel); %peak of the float32 FMA
//              peak (so 200% is the bf16 dot product's peak).
// Every row counts 2 * m * n * k * batch flops and the bytes it must move, 4 *
// batch * (m * k + m * n) (2 per element of A for packed:6) plus B's stored
// bytes (A and B read, C written),
// and reports the
// percentage of the ceiling that bounds it at that arithmetic intensity: the
// DRAM read bandwidth for the decode shapes (about 0.5 and 4 flops per byte),
// the target's FMA peak for the others (the peers: the best target's, since
// they run their own AVX-512 kernels here). The first two shapes run on every
// target, the others on the key targets (harness.h).
//
// The peers (bench/harness/peers.h) run the same shapes, one row per peer:
// matmul_openblas/<OpenBLAS core name>/... and matmul_onednn/sgemm/... on the
// float32 shapes (plain B, packed:0), and matmul_onednn/bf16/.../packed:4 on
// the three bf16 compute shapes: oneDNN's matmul primitive with src bf16 [M,
// K], weights bf16 [K, N] in the layout it picks and dst float32 [M, N], the
// peer of Headway's packed:4 rows (and packed:5's). Its B is reordered into
// that layout once and its A rounded to bf16 once, both untimed, which favours
// it: Headway's packed:4 rows round A inside every call. The rows
// matmul_onednn/bf16_convert_a/... round A in every call too (a oneDNN
// reorder, timed): the same inputs and outputs as Headway's. The row's label,
// and the context's onednn_bf16_matmul_impl, is oneDNN's implementation
// ("brg:avx512_core_bf16" where it runs its AVX512_BF16 kernel). The peers
// count the flops and bytes of the Headway rows they pair with (bf16 B: 2 bytes
// per weight), so their percentages compare directly. Where bench/meson.build
// found ggml, matmul_ggml/cpu/.../packed:P runs llama.cpp's projections
// (ggml_mul_mat) on weights stored as f32, bf16 and q8_0 (BM_GgmlMatmul), the
// peer of Headway's rows that store that type.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/ggml_peers.h"
#include "bench/harness/harness.h"
#include "bench/harness/peers.h"
#include "benchmark/benchmark.h"
#include "headway/matmul.h"
#include "headway/targets.h"
#include "headway/view.h"
#include "lib/core/storage.h"

namespace headway {
namespace bench {
namespace {

// Arguments of every matmul benchmark.
struct Shape {
  int64_t m, n, k;
  int64_t batch;      // independent products per iteration (attention heads)
  bool trans_b;       // B given as [N, K]
  bool packed;        // B pre-packed (Headway only)
  WeightDtype dtype;  // how pre-packed B stores its weights
  MatmulCompute compute = MatmulCompute::kFloat32;
  // bf16 compute: where the native kernel runs, and whether AMX may.
  NativeBFloat16 native = NativeBFloat16::kWhereFaster;
  bool amx = true;
  bool bf16_a = false;  // A given as bf16 (Matmul's BFloat16 overload)
  // packed: 0 plain B; 1 + WeightDtype: pre-packed, float32 compute; 4 to 6:
  // bf16 weights in bf16 compute, the kernel a host gets by default (4: AMX
  // where AmxBFloat16Active, else the native one where
  // CpuPrefersNativeBFloat16), the fallback (5), or the default with A given
  // as bf16 (6); 7: int8 weights in bf16 compute, the default kernel.
  static constexpr int64_t kBF16Default = 4, kBF16Fallback = 5, kBF16A = 6,
                           kBF16Int8 = 7;
  static Shape From(const benchmark::State& state) {
    const int64_t packed = state.range(5);
    const bool bf16_compute = packed >= kBF16Default;
    Shape s{state.range(0),
            state.range(1),
            state.range(2),
            state.range(3),
            state.range(4) != 0,
            packed != 0,
            packed == kBF16Int8 ? WeightDtype::kInt8
            : bf16_compute
                ? WeightDtype::kBFloat16
                : static_cast<WeightDtype>(packed == 0 ? 0 : packed - 1)};
    if (bf16_compute) s.compute = MatmulCompute::kBFloat16;
    s.bf16_a = packed == kBF16A;
    if (packed == kBF16Fallback) {
      s.native = NativeBFloat16::kNever;
      s.amx = false;
    }
    return s;
  }
  double Flops() const { return 2.0 * m * n * k * batch; }
  // A and B read, C written (beta is 0); B's bytes as stored (int8: one float
  // scale per column).
  double Bytes() const {
    const double b_bytes =
        packed ? static_cast<double>(WeightDtypeSize(dtype)) * k * n +
                     (dtype == WeightDtype::kInt8 ? 4.0 * n : 0.0)
               : 4.0 * k * n;
    return batch * ((bf16_a ? 2.0 : 4.0) * m * k + 4.0 * m * n + b_bytes);
  }
  // Decode shapes: bound by reading B, which rotates through copies.
  bool MemoryBound() const { return m <= 16; }
};

const std::vector<std::string> kArgNames = {"m",     "n",  "k",
                                            "batch", "tb", "packed"};

// The shapes of the bf16 compute mode, with `packed` 4 (the default kernel), 5
// (the fallback kernel), 6 (A given as bf16) or 7 (int8 weights); oneDNN's
// bf16 matmul runs them as packed:4.
std::vector<std::vector<int64_t>> BF16ComputeShapes(int64_t packed) {
  return {{512, 512, 512, 1, 0, packed},
          {2048, 2048, 2048, 1, 0, packed},
          {512, 4096, 4096, 1, 0, packed},
          {1, 4096, 4096, 1, 0, packed}};
}

// A decode and a prefill shape first: they run on every target.
std::vector<std::vector<int64_t>> Shapes(bool with_packed) {
  // Peers have no pre-packed B: they run the decode shapes on plain B.
  const int64_t packed = with_packed ? 1 : 0;
  std::vector<std::vector<int64_t>> shapes = {
      {1, 4096, 4096, 1, 0, packed}, {512, 512, 512, 1, 0, 0},
      {8, 4096, 4096, 1, 0, packed}, {128, 4096, 4096, 1, 0, 0},
      {2048, 2048, 2048, 1, 0, 0},   {1024, 1024, 128, 32, 1, 0},
      {1024, 128, 1024, 32, 0, 0},
  };
  if (with_packed) {
    shapes.push_back({128, 4096, 4096, 1, 0, 1});
    shapes.push_back({512, 512, 512, 1, 0, 1});
    shapes.push_back({2048, 2048, 2048, 1, 0, 1});
    // GEMV over weights stored as float32, bf16 and int8 (packed = 1 +
    // WeightDtype); 1 x 4096 x 4096 in float32 is the first shape.
    for (const int64_t k : {int64_t{4096}, int64_t{14336}}) {
      for (const WeightDtype dtype :
           {WeightDtype::kFloat32, WeightDtype::kBFloat16,
            WeightDtype::kInt8}) {
        if (k == 4096 && dtype == WeightDtype::kFloat32) continue;
        shapes.push_back({1, 4096, k, 1, 0, 1 + static_cast<int64_t>(dtype)});
      }
    }
    for (const int64_t packed : {Shape::kBF16Default, Shape::kBF16Fallback,
                                 Shape::kBF16A, Shape::kBF16Int8}) {
      for (const std::vector<int64_t>& shape : BF16ComputeShapes(packed)) {
        shapes.push_back(shape);
      }
    }
  }
  return shapes;
}

// Inputs of one shape, allocated once per process (filling 64 MiB per benchmark
// run would dominate), A [batch][M, K], B [batch][K, N] or [batch][N, K], C
// [batch][M, N]. Decode shapes rotate through `copies` copies of B (kColdBytes
// in all), so that every iteration reads B from memory, not from the 32 MiB L3.
struct Operands {
  BufferPtr<float> a, b, c;
  BufferPtr<BFloat16> a16;  // A rounded to bf16 (nearest even), on first use
  size_t copies = 1;
  size_t b_size = 0;  // floats of one copy
  size_t next = 0;
  // The copy of B for this iteration.
  size_t NextCopy() {
    const size_t copy = next;
    next = next + 1 == copies ? 0 : next + 1;
    return copy;
  }
};
Operands& SharedOperands(const Shape& s) {
  static std::vector<std::pair<std::vector<int64_t>, Operands>> cache;
  const std::vector<int64_t> key = {s.m, s.n, s.k, s.batch};
  for (auto& entry : cache) {
    if (entry.first == key) return entry.second;
  }
  // One set of operands at a time: the big shapes take 200 MiB.
  cache.clear();
  Operands ops;
  const size_t a_size = static_cast<size_t>(s.m * s.k * s.batch);
  const size_t b_size = static_cast<size_t>(s.k * s.n * s.batch);
  const size_t c_size = static_cast<size_t>(s.m * s.n * s.batch);
  ops.copies = s.MemoryBound() ? kColdBytes / (b_size * sizeof(float)) + 1 : 1;
  ops.b_size = b_size;
  ops.a = AllocateBuffer<float>(a_size);
  ops.b = AllocateBuffer<float>(b_size * ops.copies);
  ops.c = AllocateBuffer<float>(c_size);
  FillUniform(ops.a.get(), a_size, -1.0f, 1.0f, 1);
  for (size_t copy = 0; copy < ops.copies; ++copy) {
    FillUniform(ops.b.get() + copy * b_size, b_size, -1.0f, 1.0f, 2);
  }
  FillUniform(ops.c.get(), c_size, -1.0f, 1.0f, 3);
  cache.emplace_back(key, std::move(ops));
  return cache.back().second;
}

void Report(benchmark::State& state, const Shape& s, const Target& target,
            int threads) {
  ReportRoofline(state, s.Flops(), s.Bytes(), MemoryCeiling::kRead, target,
                 threads);
}

// B of `ops`, [copy][head], packed for `target` (the current cap), kept while
// the next benchmark runs the same shape on the same target: Google Benchmark
// calls a benchmark several times as it sizes the iteration count, and packing
// the decode shapes' copies of B (320 MiB) each time would take longer than
// measuring them. One shape at a time; a shape without packing frees it. Null
// after skipping the benchmark if packing fails.
const std::vector<PackedB>* SharedPacked(benchmark::State& state,
                                         const Shape& s, const Operands& ops,
                                         const Target& target) {
  static std::vector<int64_t> key;
  static std::vector<PackedB> packed;
  const std::vector<int64_t> wanted = {
      s.m,
      s.n,
      s.k,
      s.batch,
      s.trans_b,
      target.bits,
      s.packed ? 1 + static_cast<int64_t>(s.dtype) : 0,
      static_cast<int64_t>(s.compute)};
  if (s.packed && key == wanted) return &packed;
  key.clear();
  packed.clear();
  packed.shrink_to_fit();
  if (!s.packed) return &packed;
  packed.resize(ops.copies * s.batch);
  const Transpose tb = s.trans_b ? Transpose::kYes : Transpose::kNo;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  for (size_t i = 0; i < packed.size(); ++i) {
    const float* b =
        ops.b.get() + (i / s.batch) * ops.b_size + (i % s.batch) * s.k * s.n;
    if (!Check(state, PackedB::Pack(MatrixView<const float>(b, b_rows, b_cols),
                                    tb, &packed[i], s.dtype))) {
      packed.clear();
      return nullptr;
    }
  }
  key = wanted;
  return &packed;
}

void BM_Matmul(benchmark::State& state, const RunConfig& run) {
  const Shape s = Shape::From(state);
  Operands& ops = SharedOperands(s);
  const Transpose tb = s.trans_b ? Transpose::kYes : Transpose::kNo;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  const std::vector<PackedB>* shared = SharedPacked(state, s, ops, run.target);
  if (shared == nullptr) return;
  const std::vector<PackedB>& packed = *shared;
  const size_t a_size = static_cast<size_t>(s.m * s.k * s.batch);
  if (s.bf16_a && ops.a16 == nullptr) {
    ops.a16 = AllocateBuffer<BFloat16>(a_size);
    for (size_t i = 0; i < a_size; ++i) {
      ops.a16[i].bits = internal::BF16FromFloat(ops.a[i]).bits;
    }
  }
  float alpha = 1.0f;
  // One iteration's products; false after an error.
  const auto run_once = [&]() {
    const size_t copy = ops.NextCopy();
    for (int64_t h = 0; h < s.batch; ++h) {
      const MatrixView<const float> a(ops.a.get() + h * s.m * s.k, s.m, s.k);
      const MatrixView<float> c(ops.c.get() + h * s.m * s.n, s.m, s.n);
      Status status;
      if (s.bf16_a) {
        const MatrixView<const BFloat16> a16(ops.a16.get() + h * s.m * s.k, s.m,
                                             s.k);
        status = Matmul(a16, Transpose::kNo, packed[copy * s.batch + h], c,
                        alpha, 0.0f, s.compute);
      } else if (s.packed) {
        status = Matmul(a, Transpose::kNo, packed[copy * s.batch + h], c, alpha,
                        0.0f, s.compute);
      } else {
        status = Matmul(a, Transpose::kNo,
                        MatrixView<const float>(
                            ops.b.get() + copy * ops.b_size + h * s.k * s.n,
                            b_rows, b_cols),
                        tb, c, alpha, 0.0f);
      }
      if (!Check(state, status)) return false;
    }
    benchmark::ClobberMemory();
    alpha = 1.5f - alpha;  // no two consecutive iterations do the same work
    return true;
  };
  // Untimed: the first call of a shape allocates the packing scratch (64 MiB
  // for an unpacked 4096 x 4096 B) and faults its pages in, once per process;
  // with a short --benchmark_min_time that call was often the only one timed.
  // The bf16 kernel the row asks for, the default again on every return.
  const NativeBFloat16Scope native(s.native);
  const AmxBFloat16Scope amx(s.amx && GetOptions().amx);
  if (!run_once()) return;
  for (auto _ : state) {
    if (!run_once()) return;
  }
  Report(state, s, run.target, run.threads);
}

void RegisterMatmul() {
  RegisterPerTarget("matmul", BM_Matmul, kArgNames, Shapes(true),
                    /*every_target_sets=*/2);
}
HEADWAY_REGISTER_BENCHMARKS(RegisterMatmul);

// -----------------------------------------------------------------------------------------
// Peers.

// Registers matmul_<library>/<kernel>/args.../threads:N for every shape and
// thread count: the peer's row-major sgemm, C = alpha * A * op(B).
void RegisterPeer(const PeerGemm& peer) {
  std::vector<std::string> names = kArgNames;
  names.push_back("threads");
  const std::string name = "matmul_" + peer.library + "/" + peer.kernel;
  const PeerSgemm sgemm = peer.sgemm;
  benchmark::internal::Benchmark* bench = benchmark::RegisterBenchmark(
      name.c_str(), [sgemm](benchmark::State& state) {
        const Shape s = Shape::From(state);
        const int threads = static_cast<int>(state.range(6));
        Operands& ops = SharedOperands(s);
        float alpha = 1.0f;
        const auto run_once = [&]() {
          const float* b = ops.b.get() + ops.NextCopy() * ops.b_size;
          for (int64_t h = 0; h < s.batch; ++h) {
            sgemm(threads, s.trans_b, s.m, s.n, s.k, alpha,
                  ops.a.get() + h * s.m * s.k, s.k, b + h * s.k * s.n,
                  s.trans_b ? s.k : s.n, 0.0f, ops.c.get() + h * s.m * s.n,
                  s.n);
          }
          benchmark::ClobberMemory();
          alpha = 1.5f - alpha;
        };
        // Pinned at 1 thread to the CPU of Headway's rows and the ceilings.
        PinnedIfOneThread(threads, [&] {
          run_once();  // untimed, as for Headway above (the peers' buffers)
          for (auto _ : state) run_once();
        });
        Report(state, s, SupportedTargets().front(), threads);
      });
  bench->ArgNames(names)->UseRealTime();
  for (std::vector<int64_t> args : Shapes(false)) {
    for (int threads : ThreadCounts()) {
      std::vector<int64_t> with_threads = args;
      with_threads.push_back(threads);
      bench->Args(with_threads);
    }
  }
}

// oneDNN's bf16 matmul of `ops` on `threads` threads (peers.h: primitive
// created, B reordered into its layout and A converted to bf16, all untimed),
// kept while the next benchmark runs the same shape and thread count, as
// SharedPacked keeps Headway's packed B. Null after skipping the benchmark if
// oneDNN fails.
PeerBF16Matmul* SharedOneDnnBF16(benchmark::State& state, const Shape& s,
                                 const Operands& ops, int threads) {
  static std::vector<int64_t> key;
  static std::unique_ptr<PeerBF16Matmul> peer;
  const std::vector<int64_t> wanted = {s.m, s.n, s.k, threads};
  if (peer != nullptr && key == wanted) return peer.get();
  key.clear();
  peer.reset();
  std::string error;
  // The alphas that BM_OneDnnBF16Matmul alternates.
  peer = NewOneDnnBF16Matmul(threads, s.m, s.n, s.k, ops.a.get(), ops.b.get(),
                             ops.copies, ops.b_size, {1.0f, 0.5f}, &error);
  if (peer == nullptr) {
    state.SkipWithError(error.c_str());
    return nullptr;
  }
  key = wanted;
  return peer.get();
}

// matmul_onednn/bf16/<the bf16 compute shape, packed:4>/threads:N: C = alpha *
// bf16(A) * bf16(B), float32 C, on oneDNN's matmul primitive, A rounded to
// bf16 once before the timing; matmul_onednn/bf16_convert_a/...: the same with
// A rounded in every call (a oneDNN reorder before the product), as Headway's
// packed:4 rows round it: the same inputs and outputs as Headway's call. The
// row's label is oneDNN's implementation ("brg:avx512_core_bf16": its
// AVX512_BF16 kernel).
void BM_OneDnnBF16Matmul(benchmark::State& state, bool convert_a) {
  const Shape s = Shape::From(state);
  const int threads = static_cast<int>(state.range(6));
  Operands& ops = SharedOperands(s);
  PeerBF16Matmul* peer = SharedOneDnnBF16(state, s, ops, threads);
  if (peer == nullptr) return;
  float alpha = 1.0f;
  const auto run_once = [&]() {
    peer->Run(alpha, ops.NextCopy(), ops.c.get(), convert_a);
    benchmark::ClobberMemory();
    alpha = 1.5f - alpha;
  };
  PinnedIfOneThread(threads, [&] {
    run_once();  // untimed, as for the other rows
    for (auto _ : state) run_once();
  });
  state.SetLabel(peer->Impl());
  Report(state, s, SupportedTargets().front(), threads);
}

// Registers BM_OneDnnBF16Matmul (both rows) on the bf16 compute shapes and
// every thread count, and puts oneDNN's implementations in the context
// ("onednn_bf16_matmul_impl").
void RegisterOneDnnBF16() {
  if (!HasOneDnnBF16Matmul()) return;
  std::vector<std::string> names = kArgNames;
  names.push_back("threads");
  std::vector<benchmark::internal::Benchmark*> benches;
  for (const bool convert_a : {false, true}) {
    benches.push_back(benchmark::RegisterBenchmark(
        convert_a ? "matmul_onednn/bf16_convert_a" : "matmul_onednn/bf16",
        [convert_a](benchmark::State& state) {
          BM_OneDnnBF16Matmul(state, convert_a);
        }));
    benches.back()->ArgNames(names)->UseRealTime();
  }
  // "impl" if every row has the same one, else "m:1/n:4096/k:4096/threads:1
  // impl; ..." for each row.
  std::string impls, first_impl;
  bool same = true;
  for (const std::vector<int64_t>& args :
       BF16ComputeShapes(Shape::kBF16Default)) {
    for (int threads : ThreadCounts()) {
      const std::string impl =
          OneDnnBF16MatmulImpl(threads, args[0], args[1], args[2]);
      if (impls.empty()) first_impl = impl;
      same = same && impl == first_impl;
      impls += std::string(impls.empty() ? "" : "; ") +
               "m:" + std::to_string(args[0]) +
               "/n:" + std::to_string(args[1]) +
               "/k:" + std::to_string(args[2]) +
               "/threads:" + std::to_string(threads) + " " + impl;
      std::vector<int64_t> with_threads = args;
      with_threads.push_back(threads);
      for (benchmark::internal::Benchmark* bench : benches) {
        bench->Args(with_threads);
      }
    }
  }
  benchmark::AddCustomContext("onednn_bf16_matmul_impl",
                              same ? first_impl : impls);
}

#ifdef HEADWAY_BENCH_GGML
// matmul_ggml/cpu/m:M/n:N/k:K/batch:1/tb:0/packed:P/threads:T: ggml's
// ggml_mul_mat (llama.cpp's projections), C = A * B with B stored ahead of the
// call as ggml stores weights, [N] rows of K, in the type of Headway's
// packed:P rows: 1 f32, 2 bf16, 3 q8_0 (blocks of 32 int8 with an f16 scale:
// llama.cpp's int8 weights), converted once from their float B, untimed. ggml
// converts A to the weights' type (bf16; q8_0 quantized by blocks of 32) and
// multiplies in it. The GEMV shapes rotate through copies of B as Headway's do;
// bytes are B as ggml stores it (34 per 32 weights for q8_0) plus A and C.
struct GgmlWeights {
  ggml_context* ctx = nullptr;  // the weights' tensors and memory
  std::vector<ggml_tensor*> b;  // one per copy
  std::vector<int64_t> key;
  ~GgmlWeights() {
    if (ctx != nullptr) ggml_free(ctx);
  }
};

ggml_type GgmlWeightType(int64_t packed) {
  return packed == 2   ? GGML_TYPE_BF16
         : packed == 3 ? GGML_TYPE_Q8_0
                       : GGML_TYPE_F32;
}

// The weights of shape s stored as `type`, kept while the next benchmark runs
// the same shape and type.
const GgmlWeights& SharedGgmlWeights(const Shape& s, ggml_type type,
                                     const Operands& ops) {
  static GgmlWeights weights;
  const std::vector<int64_t> wanted = {s.m, s.n, s.k, type};
  if (weights.key == wanted) return weights;
  if (weights.ctx != nullptr) ggml_free(weights.ctx);
  weights.b.clear();
  weights.key = wanted;
  const size_t stored = ggml_row_size(type, s.k) * s.n;
  const size_t copies = s.MemoryBound() ? kColdBytes / stored + 1 : 1;
  weights.ctx = ggml_init(
      {copies * (stored + ggml_tensor_overhead() + 64), nullptr, false});
  std::vector<float> row_major(static_cast<size_t>(s.k * s.n));  // [N][K]
  for (size_t copy = 0; copy < copies; ++copy) {
    // Headway's copy of B ([K][N]), or its first copy for the extra ones.
    const float* b = ops.b.get() + std::min(copy, ops.copies - 1) * ops.b_size;
    for (int64_t i = 0; i < s.k; ++i) {
      for (int64_t j = 0; j < s.n; ++j) row_major[j * s.k + i] = b[i * s.n + j];
    }
    ggml_tensor* tensor = ggml_new_tensor_2d(weights.ctx, type, s.k, s.n);
    ggml_quantize_chunk(type, row_major.data(), tensor->data, 0, s.n, s.k,
                        nullptr);
    weights.b.push_back(tensor);
  }
  return weights;
}

void BM_GgmlMatmul(benchmark::State& state) {
  const int64_t packed = state.range(5);
  const int threads = static_cast<int>(state.range(6));
  // Headway's row of the same stored type: packed:1 + WeightDtype.
  Shape s = Shape::From(state);
  s.packed = true;
  s.dtype = static_cast<WeightDtype>(packed - 1);
  const ggml_type type = GgmlWeightType(packed);
  Operands& ops = SharedOperands(s);
  const GgmlWeights& weights = SharedGgmlWeights(s, type, ops);
  // One graph per copy of B over the same A; C in each graph's context.
  const size_t copies = weights.b.size();
  ggml_context* ctx = ggml_init(
      {copies * (ggml_graph_overhead() + 3 * ggml_tensor_overhead() +
                 sizeof(float) * static_cast<size_t>(s.m * s.n) + 256),
       nullptr, false});
  ggml_context* a_ctx = ggml_init({ggml_tensor_overhead(), nullptr, true});
  ggml_tensor* a = ggml_new_tensor_2d(a_ctx, GGML_TYPE_F32, s.k, s.m);
  a->data = ops.a.get();
  std::vector<ggml_cgraph*> graphs;
  for (ggml_tensor* b : weights.b) {
    graphs.push_back(ggml_new_graph(ctx));
    ggml_build_forward_expand(graphs.back(), ggml_mul_mat(ctx, b, a));
  }
  const bool ok = TimeGgmlGraphs(state, graphs, threads);
  ggml_free(ctx);
  ggml_free(a_ctx);
  if (!ok) return;
  // B's bytes as ggml stores them: Shape counts WeightDtypeSize per weight.
  const double b_bytes = static_cast<double>(ggml_row_size(type, s.k) * s.n);
  ReportRoofline(state, s.Flops(), 4.0 * (s.m * s.k + s.m * s.n) + b_bytes,
                 MemoryCeiling::kRead, SupportedTargets().front(), threads);
}

// The GEMV shapes of Headway's weight types, and 512^3 and 2048^3, in f32,
// bf16 and q8_0, on every thread count.
void RegisterGgml() {
  benchmark::internal::Benchmark* bench =
      benchmark::RegisterBenchmark("matmul_ggml/cpu", BM_GgmlMatmul);
  bench->ArgNames({"m", "n", "k", "batch", "tb", "packed", "threads"})
      ->UseRealTime();
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 4096, 4096}, {1, 4096, 14336}, {512, 512, 512}, {2048, 2048, 2048}};
  for (const std::vector<int64_t>& shape : shapes) {
    for (const int64_t packed : {1, 2, 3}) {
      for (int threads : ThreadCounts()) {
        bench->Args({shape[0], shape[1], shape[2], 1, 0, packed, threads});
      }
    }
  }
}
#endif  // HEADWAY_BENCH_GGML

void RegisterPeers() {
  for (const PeerGemm& peer : PeerGemms()) RegisterPeer(peer);
  RegisterOneDnnBF16();
#ifdef HEADWAY_BENCH_GGML
  RegisterGgml();
#endif
}
HEADWAY_REGISTER_BENCHMARKS(RegisterPeers);

}  // namespace
}  // namespace bench
}  // namespace headway

// The peer sgemm libraries that bench/meson.build found (optional
// dependencies): OpenBLAS (cblas_sgemm) and oneDNN (dnnl_sgemm). The matmul
// benchmark compares Headway's GEMM with them shape by shape; the layer
// benchmark runs the seed's composition with its projections on them.
//
// OpenBLAS: this environment sets OPENBLAS_CORETYPE=Haswell, which holds
// OpenBLAS to its AVX2 kernel. OpenBLAS reads the variable once, when the
// library initialises, so the benchmark is not linked with it: PeerGemms()
// unsets the variable (HEADWAY_BENCH_OPENBLAS_CORETYPE, if set, is put in its
// place) and then dlopen()s libopenblas, which then detects the CPU. The kernel
// that runs (openblas_get_corename()) is the peer's `kernel` and is in the JSON
// context. oneDNN (Debian's build) threads with OpenMP: omp_set_num_threads
// sets its thread count.
#ifndef HEADWAY_BENCH_HARNESS_PEERS_H_
#define HEADWAY_BENCH_HARNESS_PEERS_H_

#include <stdint.h>

#include <string>
#include <vector>

namespace headway {
namespace bench {

// Row-major C [m, n] = alpha * A [m, k] * op(B) + beta * C on `threads`
// threads: A with row stride lda; op(B) = B [k, n] or, with trans_b, B^T for B
// [n, k], row stride ldb; C with row stride ldc.
using PeerSgemm = void (*)(int threads, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float* a, int64_t lda,
                           const float* b, int64_t ldb, float beta, float* c,
                           int64_t ldc);

struct PeerGemm {
  std::string library;  // "openblas", "onednn": a peer word (IsPeerFamily)
  std::string kernel;   // OpenBLAS's core name ("Cooperlake"), or "sgemm"
  PeerSgemm sgemm;
};

// The peers of this build, loaded on the first call (which also adds their
// versions and kernels to the benchmark context). Call it from a registrar.
const std::vector<PeerGemm>& PeerGemms();

}  // namespace bench
}  // namespace headway

#endif  // HEADWAY_BENCH_HARNESS_PEERS_H_

// The peer sgemm libraries that bench/meson.build found (optional
// dependencies): OpenBLAS (cblas_sgemm) and oneDNN (dnnl_sgemm). The matmul
// benchmark compares Headway's GEMM with them shape by shape; the layer
// benchmark runs the seed's composition with its projections on them. oneDNN's
// bf16 matmul primitive (PeerBF16Matmul) is the peer of Headway's bf16 compute
// mode (MatmulCompute::kBFloat16).
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

#include <stddef.h>
#include <stdint.h>

#include <memory>
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

// oneDNN's matmul primitive in bf16, set up for one shape and thread count:
// C [m, n] (float32, row-major) = alpha * bf16(A) [m, k] * bf16(B) [k, n], with
// float32 accumulation. Setting it up (NewOneDnnBF16Matmul) creates the
// primitive with the weights in the layout oneDNN picks (format_tag::any) and
// converts, untimed, both operands: B is reordered into that layout once (as
// Headway's PackedB is packed once), and A is rounded to bf16 once, which
// favours the peer: Headway rounds A inside every call. alpha is a constant
// output scale, one primitive per alpha of the set-up: oneDNN 2.6's
// AVX512_BF16 kernel (brg:avx512_core_bf16) takes no run-time scale, and with
// one it runs gemm:jit instead. Run() is the product alone, or with convert_a
// the conversion of A too, as a caller with float32 activations runs it.
class PeerBF16Matmul {
 public:
  virtual ~PeerBF16Matmul() = default;
  // C = alpha * A * B[copy] on the thread count of the set-up; alpha one of
  // the set-up's (aborts otherwise). convert_a: first rounds the float32 A to
  // bf16 again (oneDNN's reorder into the product's source).
  virtual void Run(float alpha, size_t copy, float* c, bool convert_a) = 0;
  // The implementation that oneDNN chose (primitive_desc::impl_info_str()),
  // e.g. "brg:avx512_core_bf16"; comma-separated if the alphas' differ.
  virtual const std::string& Impl() const = 0;
};

// True if this build has oneDNN, so that NewOneDnnBF16Matmul can succeed.
bool HasOneDnnBF16Matmul();

// oneDNN's bf16 matmul of the row-major float32 A [m, k] (row stride k) and
// `copies` copies of B [k, n], b_stride floats apart (row stride n), on
// `threads` threads, for each of `alphas`; null with *error set if oneDNN is
// missing or fails.
std::unique_ptr<PeerBF16Matmul> NewOneDnnBF16Matmul(
    int threads, int64_t m, int64_t n, int64_t k, const float* a,
    const float* b, size_t copies, size_t b_stride,
    const std::vector<float>& alphas, std::string* error);

// oneDNN's implementation for that shape on `threads` threads, from the
// primitive descriptor alone (nothing allocated or converted); "" without
// oneDNN, or the error.
std::string OneDnnBF16MatmulImpl(int threads, int64_t m, int64_t n, int64_t k);

}  // namespace bench
}  // namespace headway

#endif  // HEADWAY_BENCH_HARNESS_PEERS_H_

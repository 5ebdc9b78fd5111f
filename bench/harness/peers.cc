#include "bench/harness/peers.h"

#include <stdint.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "benchmark/benchmark.h"

#ifdef HEADWAY_BENCH_OPENBLAS
#include <dlfcn.h>
#endif
#ifdef HEADWAY_BENCH_DNNL
#include "dnnl.h"
#endif
#ifdef HEADWAY_BENCH_OPENMP
#include <omp.h>
#endif

namespace headway {
namespace bench {
namespace {

#ifdef HEADWAY_BENCH_OPENBLAS
enum CblasOrder { kCblasRowMajor = 101 };
enum CblasTranspose { kCblasNoTrans = 111, kCblasTrans = 112 };
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*,
                            int, const float*, int, float, float*, int);
CblasSgemm openblas_sgemm = nullptr;
void (*openblas_set_num_threads)(int) = nullptr;

void OpenBlasSgemm(int threads, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc) {
  openblas_set_num_threads(threads);
  openblas_sgemm(kCblasRowMajor, kCblasNoTrans,
                 trans_b ? kCblasTrans : kCblasNoTrans, static_cast<int>(m),
                 static_cast<int>(n), static_cast<int>(k), alpha, a,
                 static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
                 static_cast<int>(ldc));
}

// Loads OpenBLAS (see peers.h for OPENBLAS_CORETYPE); false if it is missing.
bool LoadOpenBlas(PeerGemm* peer) {
  // Before dlopen: OpenBLAS picks its kernel when it initialises.
  const char* from_env = getenv("OPENBLAS_CORETYPE");
  const std::string previous = from_env != nullptr ? from_env : "";
  const char* wanted = getenv("HEADWAY_BENCH_OPENBLAS_CORETYPE");
  if (wanted != nullptr && wanted[0] != '\0') {
    setenv("OPENBLAS_CORETYPE", wanted, 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  void* lib = dlopen(HEADWAY_BENCH_OPENBLAS, RTLD_NOW | RTLD_LOCAL);
  if (!previous.empty()) setenv("OPENBLAS_CORETYPE", previous.c_str(), 1);
  if (lib == nullptr) return false;
  openblas_sgemm = reinterpret_cast<CblasSgemm>(dlsym(lib, "cblas_sgemm"));
  openblas_set_num_threads =
      reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
  auto corename =
      reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
  if (openblas_sgemm == nullptr || openblas_set_num_threads == nullptr) {
    return false;
  }
  const std::string core = corename != nullptr ? corename() : "unknown";
  benchmark::AddCustomContext("openblas_corename", core);
  benchmark::AddCustomContext("openblas_coretype_env_was",
                              previous.empty() ? "(unset)" : previous);
  *peer = PeerGemm{"openblas", core, OpenBlasSgemm};
  return true;
}
#endif  // HEADWAY_BENCH_OPENBLAS

#ifdef HEADWAY_BENCH_DNNL
void DnnlSgemm(int threads, bool trans_b, int64_t m, int64_t n, int64_t k,
               float alpha, const float* a, int64_t lda, const float* b,
               int64_t ldb, float beta, float* c, int64_t ldc) {
#ifdef HEADWAY_BENCH_OPENMP
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
  (void)dnnl_sgemm('N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                   beta, c, ldc);
}

PeerGemm LoadDnnl() {
  const dnnl_version_t* version = dnnl_version();
  benchmark::AddCustomContext(
      "onednn_version", std::to_string(version->major) + "." +
                            std::to_string(version->minor) + "." +
                            std::to_string(version->patch) + " cpu_runtime " +
                            std::to_string(version->cpu_runtime));
  return PeerGemm{"onednn", "sgemm", DnnlSgemm};
}
#endif  // HEADWAY_BENCH_DNNL

}  // namespace

const std::vector<PeerGemm>& PeerGemms() {
  static const std::vector<PeerGemm> peers = [] {
    std::vector<PeerGemm> found;
#ifdef HEADWAY_BENCH_OPENBLAS
    PeerGemm openblas;
    if (LoadOpenBlas(&openblas)) found.push_back(openblas);
#endif
#ifdef HEADWAY_BENCH_DNNL
    found.push_back(LoadDnnl());
#endif
    return found;
  }();
  return peers;
}

}  // namespace bench
}  // namespace headway

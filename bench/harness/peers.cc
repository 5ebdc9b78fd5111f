#include "bench/harness/peers.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness/harness.h"
#include "benchmark/benchmark.h"

#ifdef HEADWAY_BENCH_OPENBLAS
#include <dlfcn.h>
#endif
#ifdef HEADWAY_BENCH_DNNL
#include "dnnl.h"
#include "dnnl.hpp"
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

void SetOmpThreads(int threads) {
#ifdef HEADWAY_BENCH_OPENMP
  omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

// Never destroyed: the benchmark's static peers outlive any static engine.
dnnl::engine& CpuEngine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// The primitive descriptor of C = alpha * A * B: src bf16 [m, k] and dst f32
// [m, n] row-major, weights bf16 [k, n] in the layout oneDNN picks, alpha a
// constant output scale (none for 1). oneDNN may choose by the thread count:
// set it first.
dnnl::matmul::primitive_desc BF16MatmulDesc(int64_t m, int64_t n, int64_t k,
                                            float alpha) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc src({m, k}, dt::bf16, tag::ab);
  const dnnl::memory::desc weights({k, n}, dt::bf16, tag::any);
  const dnnl::memory::desc dst({m, n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst),
                                      attr, CpuEngine());
}

class OneDnnBF16Matmul : public PeerBF16Matmul {
 public:
  OneDnnBF16Matmul(int threads, int64_t m, int64_t n, int64_t k, const float* a,
                   const float* b, size_t copies, size_t b_stride,
                   const std::vector<float>& alphas)
      : threads_(threads), alphas_(alphas), stream_(CpuEngine()) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    SetOmpThreads(threads);
    std::vector<dnnl::matmul::primitive_desc> pds;
    for (const float alpha : alphas) {
      pds.push_back(BF16MatmulDesc(m, n, k, alpha));
      const std::string impl = pds.back().impl_info_str();
      if (impl_.find(impl) == std::string::npos) {
        impl_ += (impl_.empty() ? "" : ",") + impl;
      }
      // One B for all: the weights' layout must not depend on alpha.
      if (pds.back().weights_desc() != pds.front().weights_desc()) {
        throw dnnl::error(dnnl_unimplemented,
                          "the weights layout depends on alpha");
      }
      matmuls_.emplace_back(pds.back());
    }
    const dnnl::matmul::primitive_desc& pd = pds.front();
    // Every buffer from the harness's allocator, as Headway's (harness.h).
    a_bf16_ = AllocateBuffer<uint8_t>(pd.src_desc().get_size());
    src_ = dnnl::memory(pd.src_desc(), CpuEngine(), a_bf16_.get());
    a_f32_ = dnnl::memory(dnnl::memory::desc({m, k}, dt::f32, tag::ab),
                          CpuEngine(), const_cast<float*>(a));
    convert_a_ = dnnl::reorder(a_f32_, src_);
    convert_a_.execute(stream_, a_f32_, src_);
    stream_.wait();
    const size_t weights_bytes = pd.weights_desc().get_size();
    weights_bytes_ = AllocateBuffer<uint8_t>(weights_bytes * copies);
    const dnnl::memory::desc b_f32({k, n}, dt::f32, tag::ab);
    for (size_t copy = 0; copy < copies; ++copy) {
      weights_.emplace_back(pd.weights_desc(), CpuEngine(),
                            weights_bytes_.get() + copy * weights_bytes);
      Reorder(dnnl::memory(b_f32, CpuEngine(),
                           const_cast<float*>(b + copy * b_stride)),
              weights_.back());
    }
    dst_ = dnnl::memory(pd.dst_desc(), CpuEngine(), DNNL_MEMORY_NONE);
  }

  void Run(float alpha, size_t copy, float* c, bool convert_a) override {
    size_t which = 0;
    while (alphas_[which] != alpha) {
      if (++which == alphas_.size()) std::abort();  // an alpha not set up
    }
    SetOmpThreads(threads_);
    // The stream runs in order: the product reads the converted A.
    if (convert_a) convert_a_.execute(stream_, a_f32_, src_);
    dst_.set_data_handle(c);
    matmuls_[which].execute(stream_, {{DNNL_ARG_SRC, src_},
                                      {DNNL_ARG_WEIGHTS, weights_[copy]},
                                      {DNNL_ARG_DST, dst_}});
    stream_.wait();
  }

  const std::string& Impl() const override { return impl_; }

 private:
  void Reorder(dnnl::memory from, dnnl::memory to) {
    dnnl::reorder(from, to).execute(stream_, from, to);
    stream_.wait();
  }

  int threads_;
  std::vector<float> alphas_;
  dnnl::stream stream_;
  std::string impl_;
  std::vector<dnnl::matmul> matmuls_;  // one per alpha
  BufferPtr<uint8_t> a_bf16_, weights_bytes_;
  dnnl::memory a_f32_, src_, dst_;
  dnnl::reorder convert_a_;  // a_f32_ into src_
  std::vector<dnnl::memory> weights_;
};
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

bool HasOneDnnBF16Matmul() {
#ifdef HEADWAY_BENCH_DNNL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<PeerBF16Matmul> NewOneDnnBF16Matmul(
    int threads, int64_t m, int64_t n, int64_t k, const float* a,
    const float* b, size_t copies, size_t b_stride,
    const std::vector<float>& alphas, std::string* error) {
#ifdef HEADWAY_BENCH_DNNL
  try {
    return std::make_unique<OneDnnBF16Matmul>(threads, m, n, k, a, b, copies,
                                              b_stride, alphas);
  } catch (const dnnl::error& e) {
    *error = std::string("oneDNN bf16 matmul: ") + e.what();
    return nullptr;
  }
#else
  (void)threads, (void)m, (void)n, (void)k, (void)a, (void)b, (void)copies,
      (void)b_stride, (void)alphas;
  *error = "no oneDNN in this build";
  return nullptr;
#endif
}

std::string OneDnnBF16MatmulImpl(int threads, int64_t m, int64_t n, int64_t k) {
#ifdef HEADWAY_BENCH_DNNL
  try {
    SetOmpThreads(threads);
    return BF16MatmulDesc(m, n, k, 1.0f).impl_info_str();
  } catch (const dnnl::error& e) {
    return std::string("error: ") + e.what();
  }
#else
  (void)threads, (void)m, (void)n, (void)k;
  return "";
#endif
}

}  // namespace bench
}  // namespace headway

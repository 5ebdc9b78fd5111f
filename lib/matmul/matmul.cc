// Matmul: argument checks and the one dynamic dispatch per call (kernels:
// matmul-inl.h).
#include "headway/matmul.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <new>

#include "hwy/aligned_allocator.h"
#include "lib/core/memory.h"
#include "tbb/task_arena.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/matmul/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "lib/core/kernels-inl.h"
#include "lib/matmul/matmul-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// Packs op(B) [k, n] = [op(parts[0]) | op(parts[1]) | ...] for this target,
// elements of dtype (a valid WeightDtype), into a new aligned buffer of
// *bytes bytes: the panels, then for int8 the scales [panels * NR] at byte
// *scales_offset (64-byte aligned). Null when out of memory (*bytes says how
// much was asked), or for int8 when column *bad_column (else -1) holds a NaN
// or inf. *panel_width and *target describe the layout.
void* PackBT(const MatmulBPart* parts, size_t n_parts, size_t k, size_t n,
             int dtype, size_t* bytes, size_t* scales_offset,
             size_t* panel_width, int64_t* target, int64_t* bad_column) {
  const WeightDtype weight_dtype = static_cast<WeightDtype>(dtype);
  const MatmulPackedLayout layout(k, n);
  const size_t floats = layout.Floats();
  const bool int8 = weight_dtype == WeightDtype::kInt8;
  const size_t data_bytes =
      (floats * WeightDtypeSize(weight_dtype) + 63) / 64 * 64;
  *panel_width = kMatmulNR;
  *target = HWY_TARGET;
  *bad_column = -1;
  *scales_offset = int8 ? data_bytes : 0;
  *bytes = data_bytes +
           (int8 ? layout.panels * kMatmulNR * sizeof(float) : size_t{0});
  void* packed = internal::AllocateLarge(*bytes);
  if (packed == nullptr) return nullptr;
  // Zeros up to the scales: the buffer's bytes are all defined.
  const size_t panel_bytes = floats * WeightDtypeSize(weight_dtype);
  memset(static_cast<char*>(packed) + panel_bytes, 0, data_bytes - panel_bytes);
  try {
    if (weight_dtype == WeightDtype::kFloat32) {
      PackBPanelsParts(parts, n_parts, k, n, static_cast<float*>(packed));
      return packed;
    }
    if (int8) {
      *bad_column = PackBStored(
          parts, n_parts, k, n, static_cast<int8_t*>(packed),
          reinterpret_cast<float*>(static_cast<char*>(packed) + data_bytes));
    } else {
      PackBStored(parts, n_parts, k, n, static_cast<hwy::bfloat16_t*>(packed),
                  nullptr);
    }
  } catch (...) {
    internal::FreeLarge(packed);
    throw;
  }
  if (*bad_column >= 0) {
    internal::FreeLarge(packed);
    return nullptr;
  }
  return packed;
}

size_t MatmulPanelWidthT() { return kMatmulNR; }

// Whether a call runs on AMX tiles: bf16 compute (w.amx: AmxBFloat16Active()
// at the call), more than kMatmulSmallM rows of A.
HWY_INLINE bool MatmulOnAmx(const MatmulPackedWeights& w, size_t m) {
  return w.amx && m > kMatmulSmallM;
}

// f(a32, cols): a bf16 op(A) (a [m, k], or a^T with a [k, m]) widened to
// floats (exact) into a buffer of the calling thread, a32 [rows, cols] dense.
template <class F>
HWY_INLINE void WithWidenedA(const hwy::bfloat16_t* a, size_t lda, bool trans_a,
                             size_t m, size_t k, const F& f) {
  const size_t rows = trans_a ? k : m, cols = trans_a ? m : k;
  // Reused across calls; isolate(): as MatmulUnpacked's b_scratch.
  thread_local ThreadScratchBuffer widened;
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    float* a32 = widened.Get(rows * cols);
    const hn::ScalableTag<float> d;
    for (size_t r = 0; r < rows; ++r) {
      WidenRowU(d, a + r * lda, cols, a32 + r * cols);
    }
    f(a32, cols);
  });
}

// out = alpha * op(A) * B + beta * out with the kernels for w's stored type
// and compute mode, B's panels as `b` gives them (w's data); A of float or
// bf16 (TA). bf16 compute (bf16 or int8 weights) runs on AMX tiles
// (MatmulOnAmx), the native kernel (w.native) or the fallback, each taking a
// bf16 A as it is; float32 compute takes it widened (WithWidenedA). Either
// way a bf16 A gives what a float A holding the same values gives. int8
// weights reach the tiles and the native kernel as bf16, converted per task
// (MatmulPackedAmx, MatmulB::Int8AsBF16), which more than kMatmulSmallM rows
// amortize; fewer rows read them as int8 in the fallback, at the rate of
// their bytes. a_prepared (not null): A's rows in the AMX tiles' layout
// (MatmulAmxPrepareA), read in place where the call runs on them.
template <class TA>
HWY_INLINE void MatmulStoredOut(const TA* a, size_t lda, bool trans_a,
                                const MatmulPackedWeights& w, const MatmulB& b,
                                size_t m, size_t n, size_t k,
                                const MatmulOut& out, float alpha, float beta,
                                const hwy::bfloat16_t* a_prepared = nullptr) {
#if !HEADWAY_NATIVE_AMX
  (void)a_prepared;
#endif
  const WeightDtype dtype = static_cast<WeightDtype>(w.dtype);
  if (w.bf16_compute) {
    const bool int8 = dtype == WeightDtype::kInt8;
#if HEADWAY_NATIVE_AMX
    if (MatmulOnAmx(w, m)) {
      if (int8) {
        MatmulPackedAmx<int8_t>(a, lda, trans_a, b, m, n, k, out, alpha, beta,
                                a_prepared);
      } else {
        MatmulPackedAmx<hwy::bfloat16_t>(a, lda, trans_a, b, m, n, k, out,
                                         alpha, beta, a_prepared);
      }
      return;
    }
#endif
#if HEADWAY_NATIVE_BF16
    if (w.native && (!int8 || m > kMatmulSmallM)) {
      MatmulPackedOut<hwy::bfloat16_t, kMatmulBF16Native>(
          a, lda, trans_a, int8 ? MatmulB::Int8AsBF16(b) : b, m, n, k, out,
          alpha, beta);
      return;
    }
#endif
    if (int8) {
      MatmulPackedOut<int8_t, kMatmulBF16Fallback>(a, lda, trans_a, b, m, n, k,
                                                   out, alpha, beta);
    } else {
      MatmulPackedOut<hwy::bfloat16_t, kMatmulBF16Fallback>(
          a, lda, trans_a, b, m, n, k, out, alpha, beta);
    }
    return;
  }
  if constexpr (!hwy::IsSame<TA, float>()) {
    WithWidenedA(a, lda, trans_a, m, k, [&](const float* a32, size_t cols) {
      MatmulStoredOut(a32, cols, trans_a, w, b, m, n, k, out, alpha, beta);
    });
  } else {
    switch (dtype) {
      case WeightDtype::kBFloat16:
        MatmulPackedOut<hwy::bfloat16_t>(a, lda, trans_a, b, m, n, k, out,
                                         alpha, beta);
        break;
      case WeightDtype::kInt8:
        MatmulPackedOut<int8_t>(a, lda, trans_a, b, m, n, k, out, alpha, beta);
        break;
      default:
        MatmulPackedOut<float>(a, lda, trans_a, b, m, n, k, out, alpha, beta);
    }
  }
}

void MatmulPackedOutT(const float* a, size_t lda, bool trans_a,
                      const MatmulPackedWeights& b, size_t m, size_t n,
                      size_t k, const MatmulOut& out, float alpha, float beta) {
  MatmulStoredOut(a, lda, trans_a, b, MatmulB::Packed(b.data, b.scales), m, n,
                  k, out, alpha, beta);
}

void MatmulPackedPanelsT(const float* a, size_t lda,
                         const MatmulPackedWeights& b, size_t b_n,
                         size_t first_panel, size_t m, size_t n, size_t k,
                         float* c, size_t ldc,
                         const hwy::bfloat16_t* a_prepared) {
  MatmulOut out;
  out.c = c;
  out.ldc = ldc;
  MatmulStoredOut(
      a, lda, /*trans_a=*/false, b,
      MatmulB::PackedPanels(b.data, b.scales, (b_n + kMatmulNR - 1) / kMatmulNR,
                            first_panel),
      m, n, k, out, 1.0f, 0.0f, a_prepared);
}

size_t MatmulPreparedAElementsT(const MatmulPackedWeights& b, size_t m,
                                size_t k) {
#if HEADWAY_NATIVE_AMX
  if (MatmulOnAmx(b, m))
    return RoundUp(m, kMatmulAmxRows) * MatmulAmxAStride(k);
#else
  (void)b, (void)m, (void)k;
#endif
  return 0;
}

void MatmulPrepareAT(const float* a, size_t lda, size_t m, size_t k,
                     hwy::bfloat16_t* prepared) {
#if HEADWAY_NATIVE_AMX
  MatmulAmxPrepareA(a, lda, m, k, prepared);
#else
  (void)a, (void)lda, (void)m, (void)k, (void)prepared;
#endif
}

// B packed into a buffer of the calling thread (MatmulUnpacked).
void MatmulUnpackedT(const float* a, size_t lda, bool trans_a, const float* b,
                     size_t ldb, bool trans_b, size_t m, size_t n, size_t k,
                     float* c, size_t ldc, float alpha, float beta) {
  MatmulUnpacked(a, lda, trans_a, b, ldb, trans_b, m, n, k, c, ldc, alpha,
                 beta);
}

// The same with B packed by PackBT (w), A of float or bf16 (TA). Returns 0,
// or this target's panel width when it differs from panel_width (nothing
// written).
template <class TA>
HWY_INLINE size_t MatmulPackedCall(const TA* a, size_t lda, bool trans_a,
                                   const MatmulPackedWeights& w,
                                   size_t panel_width, size_t m, size_t n,
                                   size_t k, float* c, size_t ldc, float alpha,
                                   float beta) {
  if (panel_width != kMatmulNR) return kMatmulNR;
  if (alpha == 0.0f) {
    MatmulScaleC(c, ldc, m, n, beta);
    return 0;
  }
  MatmulOut out;
  out.c = c;
  out.ldc = ldc;
  MatmulStoredOut(a, lda, trans_a, w, MatmulB::Packed(w.data, w.scales), m, n,
                  k, out, alpha, beta);
  return 0;
}

size_t MatmulPackedT(const float* a, size_t lda, bool trans_a,
                     const MatmulPackedWeights& w, size_t panel_width, size_t m,
                     size_t n, size_t k, float* c, size_t ldc, float alpha,
                     float beta) {
  return MatmulPackedCall(a, lda, trans_a, w, panel_width, m, n, k, c, ldc,
                          alpha, beta);
}

// A's bf16 as their bits (BFloat16::bits).
size_t MatmulPackedBF16T(const uint16_t* a, size_t lda, bool trans_a,
                         const MatmulPackedWeights& w, size_t panel_width,
                         size_t m, size_t n, size_t k, float* c, size_t ldc,
                         float alpha, float beta) {
  return MatmulPackedCall(reinterpret_cast<const hwy::bfloat16_t*>(a), lda,
                          trans_a, w, panel_width, m, n, k, c, ldc, alpha,
                          beta);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "headway/matmul.h"
#include "headway/targets.h"
#include "hwy/targets.h"
#include "lib/core/init.h"
#include "lib/core/message.h"
#include "lib/core/storage.h"
#include "lib/core/validate.h"

namespace headway {

HWY_EXPORT(PackBT);
HWY_EXPORT(MatmulUnpackedT);
HWY_EXPORT(MatmulPackedT);
HWY_EXPORT(MatmulPackedBF16T);

namespace {

using internal::Fail;
using internal::Shape;

// Widest panel of any target (AVX-512: 2 vectors of 16 floats): bounds the
// packed size.
constexpr int64_t kMaxPanelWidth = 64;

Status CheckTranspose(const char* fn, const char* name, Transpose t) {
  if (t == Transpose::kNo || t == Transpose::kYes) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, name,
              " is not Transpose::kNo or kYes (got ", static_cast<int>(t), ")");
}

int64_t ViewBytes(int64_t rows, int64_t cols, int64_t stride,
                  size_t elem_size = sizeof(float)) {
  int64_t bytes = 0;
  internal::SpanBytes(rows, cols, stride, elem_size, &bytes);
  return bytes;
}

// Checks everything but B's own view: a (float or BFloat16), ta, c, alpha,
// beta against op(B) [k_b, n].
template <class E>
Status CheckMatmul(const char* fn, MatrixView<const E> a, Transpose ta,
                   int64_t k_b, int64_t n, MatrixView<float> c, float alpha,
                   float beta) {
  Status status = internal::CheckMatrix(fn, "a", a);
  if (status.ok()) status = CheckTranspose(fn, "ta", ta);
  if (status.ok()) status = internal::CheckMatrix(fn, "c", c);
  if (!status.ok()) return status;
  const bool trans_a = ta == Transpose::kYes;
  const int64_t m = trans_a ? a.cols : a.rows;
  const int64_t k = trans_a ? a.rows : a.cols;
  if (k != k_b) {
    return Fail(StatusCode::kInvalidArgument, fn, "op(a) is ", Shape(m, k),
                " but op(b) is ", Shape(k_b, n), " (inner dimensions differ)");
  }
  if (c.rows != m || c.cols != n) {
    return Fail(StatusCode::kInvalidArgument, fn, "c is ",
                Shape(c.rows, c.cols), " but op(a) * op(b) is ", Shape(m, n));
  }
  if (internal::Overlaps(a.data, ViewBytes(a.rows, a.cols, a.stride, sizeof(E)),
                         c.data, ViewBytes(c.rows, c.cols, c.stride))) {
    return Fail(StatusCode::kInvalidArgument, fn, "c overlaps a");
  }
  status = internal::CheckFinite(fn, "alpha", alpha);
  if (status.ok()) status = internal::CheckFinite(fn, "beta", beta);
  return status;
}

// Checks b and tb; *k, *n = the shape of op(b).
Status CheckOpB(const char* fn, MatrixView<const float> b, Transpose tb,
                int64_t* k, int64_t* n) {
  Status status = internal::CheckMatrix(fn, "b", b);
  if (status.ok()) status = CheckTranspose(fn, "tb", tb);
  if (!status.ok()) return status;
  const bool trans_b = tb == Transpose::kYes;
  *k = trans_b ? b.cols : b.rows;
  *n = trans_b ? b.rows : b.cols;
  return Status::Ok();
}

Status CheckPackedSize(const char* fn, int64_t k, int64_t n) {
  int64_t padded_n = 0, bytes = 0;
  if (!internal::CheckedAdd(n, kMaxPanelWidth - 1, &padded_n) ||
      !internal::CheckedProduct({padded_n / kMaxPanelWidth * kMaxPanelWidth, k,
                                 static_cast<int64_t>(sizeof(float))},
                                &bytes)) {
    return Fail(StatusCode::kResourceExhausted, fn, "packing op(b) ",
                Shape(k, n), " overflows the byte count");
  }
  return Status::Ok();
}

// Runs a dispatched call; no exception escapes.
template <class Body>
Status Guarded(const char* fn, const Body& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kResourceExhausted, fn, "out of memory");
  } catch (...) {
    return Fail(StatusCode::kInternal, fn, "unexpected exception");
  }
}

void FreePacked(void* data) { internal::FreeLarge(data); }

Status CheckWeightDtype(const char* fn, WeightDtype dtype) {
  if (WeightDtypeSize(dtype) != 0) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn,
              "dtype is not WeightDtype::kFloat32, kBFloat16 or kInt8 (got ",
              static_cast<int>(dtype), ")");
}

// Packs op(B) [k, n] from its parts (validated by the caller) as dtype and
// hands the buffer to adopt(data, bytes, scales, panel_width, target_name),
// which owns it.
template <class Adopt>
Status PackParts(const char* fn, const MatmulBPart* parts, size_t n_parts,
                 int64_t k, int64_t n, WeightDtype dtype, const Adopt& adopt) {
  Status status = CheckPackedSize(fn, k, n);
  if (status.ok()) status = CheckWeightDtype(fn, dtype);
  if (!status.ok()) return status;
  internal::InitOnce();
  return Guarded(fn, [&]() -> Status {
    size_t bytes = 0, scales_offset = 0, panel_width = 0;
    int64_t target = 0, bad_column = -1;
    void* packed = HWY_DYNAMIC_DISPATCH(PackBT)(
        parts, n_parts, static_cast<size_t>(k), static_cast<size_t>(n),
        static_cast<int>(dtype), &bytes, &scales_offset, &panel_width, &target,
        &bad_column);
    if (bad_column >= 0) {
      return Fail(StatusCode::kInvalidArgument, fn, "column ", bad_column,
                  " of op(b) holds a NaN or inf, which int8 cannot store");
    }
    if (packed == nullptr) {
      return Fail(StatusCode::kResourceExhausted, fn, "no memory for ", bytes,
                  " bytes");
    }
    const float* scales = dtype == WeightDtype::kInt8
                              ? reinterpret_cast<const float*>(
                                    static_cast<char*>(packed) + scales_offset)
                              : nullptr;
    adopt(packed, bytes, scales, static_cast<int64_t>(panel_width),
          hwy::TargetName(target));
    return Status::Ok();
  });
}

}  // namespace

size_t WeightDtypeSize(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kFloat32:
      return 4;
    case WeightDtype::kBFloat16:
      return 2;
    case WeightDtype::kInt8:
      return 1;
  }
  return 0;
}

PackedB::PackedB() = default;
PackedB::~PackedB() = default;
PackedB::PackedB(PackedB&& other) noexcept
    : data_(std::move(other.data_)),
      bytes_(std::exchange(other.bytes_, 0)),
      scales_(std::exchange(other.scales_, nullptr)),
      dtype_(std::exchange(other.dtype_, WeightDtype::kFloat32)),
      rows_(std::exchange(other.rows_, 0)),
      cols_(std::exchange(other.cols_, 0)),
      panel_width_(std::exchange(other.panel_width_, 0)),
      target_name_(std::exchange(other.target_name_, "")) {}
PackedB& PackedB::operator=(PackedB&& other) noexcept {
  if (this != &other) {
    data_ = std::move(other.data_);
    bytes_ = std::exchange(other.bytes_, 0);
    scales_ = std::exchange(other.scales_, nullptr);
    dtype_ = std::exchange(other.dtype_, WeightDtype::kFloat32);
    rows_ = std::exchange(other.rows_, 0);
    cols_ = std::exchange(other.cols_, 0);
    panel_width_ = std::exchange(other.panel_width_, 0);
    target_name_ = std::exchange(other.target_name_, "");
  }
  return *this;
}

void PackedB::Reset(void* data, size_t bytes, const float* scales,
                    WeightDtype dtype, int64_t rows, int64_t cols,
                    int64_t panel_width, const char* target_name) {
  data_ = std::unique_ptr<void, void (*)(void*)>(data, &FreePacked);
  bytes_ = bytes;
  scales_ = scales;
  dtype_ = dtype;
  rows_ = rows;
  cols_ = cols;
  panel_width_ = panel_width;
  target_name_ = target_name;
}

namespace {

// The part of op(b) [k, n] = b or b^T (validated) for PackParts: the whole of
// b, of float or of BFloat16.
MatmulBPart WholePart(MatrixView<const float> b, bool trans, size_t begin,
                      int64_t n) {
  return {b.data, static_cast<size_t>(b.stride), trans, begin,
          static_cast<size_t>(n)};
}
MatmulBPart WholePart(MatrixView<const BFloat16> b, bool trans, size_t begin,
                      int64_t n) {
  MatmulBPart part{nullptr, static_cast<size_t>(b.stride), trans, begin,
                   static_cast<size_t>(n)};
  part.b16 = &b.data->bits;
  return part;
}

// PackedB::Pack of b, float or BFloat16; adopt(data, bytes, scales, k, n,
// panel_width, target_name) takes the packed buffer.
template <class E, class Adopt>
Status PackWhole(MatrixView<const E> b, Transpose tb, const PackedB* out,
                 WeightDtype dtype, const Adopt& adopt) {
  constexpr const char* kFn = "PackedB::Pack";
  if (out == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "out is null");
  }
  Status status = internal::CheckMatrix(kFn, "b", b);
  if (status.ok()) status = CheckTranspose(kFn, "tb", tb);
  if (!status.ok()) return status;
  const bool trans = tb == Transpose::kYes;
  const int64_t k = trans ? b.cols : b.rows, n = trans ? b.rows : b.cols;
  const MatmulBPart whole = WholePart(b, trans, 0, n);
  return PackParts(kFn, &whole, 1, k, n, dtype,
                   [&](void* data, size_t bytes, const float* scales,
                       int64_t panel_width, const char* target_name) {
                     adopt(data, bytes, scales, k, n, panel_width, target_name);
                   });
}

// PackedB::PackColumns of parts of float or BFloat16.
template <class E, class Adopt>
Status PackColumnsOf(const MatrixView<const E>* parts, int64_t n_parts,
                     const PackedB* out, WeightDtype dtype,
                     const Adopt& adopt) {
  constexpr const char* kFn = "PackedB::PackColumns";
  if (out == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "out is null");
  }
  if (parts == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn, "parts is null");
  }
  if (n_parts < 1 || n_parts > PackedB::kMaxColumnParts) {
    return Fail(StatusCode::kInvalidArgument, kFn, "n_parts is ", n_parts,
                ", not in [1, ", PackedB::kMaxColumnParts, "]");
  }
  MatmulBPart pieces[PackedB::kMaxColumnParts];
  int64_t n = 0;
  for (int64_t i = 0; i < n_parts; ++i) {
    const std::string name = internal::Cat("parts[", i, "]");
    Status status = internal::CheckMatrix(kFn, name.c_str(), parts[i]);
    if (!status.ok()) return status;
    if (parts[i].rows != parts[0].rows) {
      return Fail(StatusCode::kInvalidArgument, kFn, name, " has ",
                  parts[i].rows, " rows but parts[0] has ", parts[0].rows);
    }
    const size_t begin = static_cast<size_t>(n);
    if (!internal::CheckedAdd(n, parts[i].cols, &n)) {
      return Fail(StatusCode::kResourceExhausted, kFn,
                  "the column count overflows");
    }
    pieces[i] = WholePart(parts[i], false, begin, parts[i].cols);
  }
  const int64_t k = parts[0].rows;
  return PackParts(kFn, pieces, static_cast<size_t>(n_parts), k, n, dtype,
                   [&](void* data, size_t bytes, const float* scales,
                       int64_t panel_width, const char* target_name) {
                     adopt(data, bytes, scales, k, n, panel_width, target_name);
                   });
}

}  // namespace

// Adopt for PackWhole and PackColumnsOf: *out takes the buffer.
#define HEADWAY_PACKED_B_ADOPT(out, dtype)                                  \
  [out, dtype](void* data, size_t bytes, const float* scales, int64_t k,    \
               int64_t n, int64_t panel_width, const char* target_name) {   \
    out->Reset(data, bytes, scales, dtype, k, n, panel_width, target_name); \
  }

Status PackedB::Pack(MatrixView<const float> b, Transpose tb, PackedB* out,
                     WeightDtype dtype) {
  return PackWhole(b, tb, out, dtype, HEADWAY_PACKED_B_ADOPT(out, dtype));
}

Status PackedB::Pack(MatrixView<const BFloat16> b, Transpose tb, PackedB* out,
                     WeightDtype dtype) {
  return PackWhole(b, tb, out, dtype, HEADWAY_PACKED_B_ADOPT(out, dtype));
}

Status PackedB::PackColumns(const MatrixView<const float>* parts,
                            int64_t n_parts, PackedB* out, WeightDtype dtype) {
  return PackColumnsOf(parts, n_parts, out, dtype,
                       HEADWAY_PACKED_B_ADOPT(out, dtype));
}

Status PackedB::PackColumns(const MatrixView<const BFloat16>* parts,
                            int64_t n_parts, PackedB* out, WeightDtype dtype) {
  return PackColumnsOf(parts, n_parts, out, dtype,
                       HEADWAY_PACKED_B_ADOPT(out, dtype));
}

#undef HEADWAY_PACKED_B_ADOPT

Status Matmul(MatrixView<const float> a, Transpose ta,
              MatrixView<const float> b, Transpose tb, MatrixView<float> c,
              float alpha, float beta) {
  constexpr const char* kFn = "Matmul";
  int64_t k = 0, n = 0;
  Status status = CheckOpB(kFn, b, tb, &k, &n);
  if (!status.ok()) return status;
  const bool trans_b = tb == Transpose::kYes;
  status = CheckMatmul(kFn, a, ta, k, n, c, alpha, beta);
  if (status.ok() &&
      internal::Overlaps(b.data, ViewBytes(b.rows, b.cols, b.stride), c.data,
                         ViewBytes(c.rows, c.cols, c.stride))) {
    status = Fail(StatusCode::kInvalidArgument, kFn, "c overlaps b");
  }
  if (status.ok()) status = CheckPackedSize(kFn, k, n);
  if (!status.ok()) return status;
  internal::InitOnce();
  const bool trans_a = ta == Transpose::kYes;
  return Guarded(kFn, [&]() -> Status {
    HWY_DYNAMIC_DISPATCH(MatmulUnpackedT)
    (a.data, static_cast<size_t>(a.stride), trans_a, b.data,
     static_cast<size_t>(b.stride), trans_b, static_cast<size_t>(c.rows),
     static_cast<size_t>(c.cols), static_cast<size_t>(k), c.data,
     static_cast<size_t>(c.stride), alpha, beta);
    return Status::Ok();
  });
}

namespace {

// Matmul with a PackedB, A of float or BFloat16 (E).
template <class E>
Status MatmulPacked(MatrixView<const E> a, Transpose ta, const PackedB& b,
                    MatrixView<float> c, float alpha, float beta,
                    MatmulCompute compute) {
  constexpr const char* kFn = "Matmul";
  if (b.data() == nullptr) {
    return Fail(StatusCode::kInvalidArgument, kFn,
                "b is empty (PackedB::Pack it first)");
  }
  if (compute != MatmulCompute::kFloat32 &&
      compute != MatmulCompute::kBFloat16) {
    return Fail(StatusCode::kInvalidArgument, kFn,
                "compute is not MatmulCompute::kFloat32 or kBFloat16 (got ",
                static_cast<int>(compute), ")");
  }
  if (compute == MatmulCompute::kBFloat16 &&
      b.dtype() == WeightDtype::kFloat32) {
    return Fail(StatusCode::kInvalidArgument, kFn,
                "compute MatmulCompute::kBFloat16 needs b stored as "
                "WeightDtype::kBFloat16 or kInt8 (b.dtype() is ",
                static_cast<int>(b.dtype()), ")");
  }
  Status status = CheckMatmul(kFn, a, ta, b.rows(), b.cols(), c, alpha, beta);
  if (status.ok() &&
      internal::Overlaps(b.data(), static_cast<int64_t>(b.bytes()), c.data,
                         ViewBytes(c.rows, c.cols, c.stride))) {
    status = Fail(StatusCode::kInvalidArgument, kFn, "c overlaps b");
  }
  if (!status.ok()) return status;
  internal::InitOnce();
  const bool trans_a = ta == Transpose::kYes;
  return Guarded(kFn, [&]() -> Status {
    const MatmulPackedWeights w = PackedWeights(b, compute);
    const auto call = [&](auto dispatched, const auto* a_data) {
      return dispatched(
          a_data, static_cast<size_t>(a.stride), trans_a, w,
          static_cast<size_t>(b.panel_width()), static_cast<size_t>(c.rows),
          static_cast<size_t>(c.cols), static_cast<size_t>(b.rows()), c.data,
          static_cast<size_t>(c.stride), alpha, beta);
    };
    size_t want = 0;
    if constexpr (std::is_same_v<E, float>) {
      want = call(HWY_DYNAMIC_DISPATCH(MatmulPackedT), a.data);
    } else {
      want = call(HWY_DYNAMIC_DISPATCH(MatmulPackedBF16T), &a.data->bits);
    }
    if (want != 0) {
      return Fail(StatusCode::kFailedPrecondition, kFn, "b was packed for ",
                  b.target_name(), " (panels of ", b.panel_width(),
                  " columns) but this call runs on ", ActiveTarget().name,
                  " (panels of ", want,
                  "): pack b again after changing the target");
    }
    return Status::Ok();
  });
}

}  // namespace

Status Matmul(MatrixView<const float> a, Transpose ta, const PackedB& b,
              MatrixView<float> c, float alpha, float beta,
              MatmulCompute compute) {
  return MatmulPacked(a, ta, b, c, alpha, beta, compute);
}

Status Matmul(MatrixView<const BFloat16> a, Transpose ta, const PackedB& b,
              MatrixView<float> c, float alpha, float beta,
              MatmulCompute compute) {
  return MatmulPacked(a, ta, b, c, alpha, beta, compute);
}

}  // namespace headway
#endif  // HWY_ONCE

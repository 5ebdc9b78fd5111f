// AttentionLayer tests: every target, against the float64 reference of the
// seed's whole layer (ref::MultiHeadAttention in test/support/reference.h),
// plus the layer's own contracts: prefill equals prefill then decode, a batch
// equals its sequences run alone, tensor-parallel shards sum to the layer,
// sizes, argument errors (nothing written) and no allocation once warm.
//
// Tolerance against the reference, per output element (u = 2^-24): the
// rounding errors of the layer's three steps carried to y to first order, with
// magnitudes that the reference computes alongside (abs_c of ref::Matmul).
// A float32 sum of n terms is off by at most about lambda sqrt(n) u times the
// sum of the terms' magnitudes, rounding errors being independent and growing
// like a random walk (Higham and Mary, "A new approach to probabilistic
// rounding error analysis", SISC 2019; Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., sec. 2.8), lambda = 4 here; independent
// errors from different sums combine as a root sum of squares (rss) for the
// same reason.
//   1. Projections: an entry of Q, K or V sums d_model products and a bias:
//      error <= e_p |.|, e_p = 4 u (sqrt(d_model) + 1), |.| = sum |x w| + |b|.
//   2. Attention, query row t, head h (KV head g), over the L keys it sees:
//      the errors of q and k move a score by at most
//        E = e_p scale max_s rss_p(|q|_p k_sp, q_p |k|_sp),
//      which changes each softmax weight w_s by at most 2 E w_s, so output
//      column p moves by 2 E o_mag_p, o_mag_p = sum_s w_s |v_sp|. V's own
//      errors add e_p sum_s w_s |v|_sp, and the attention kernel's rounding
//      4 u (sqrt(head_dim) S + sqrt(L) + 8) o_mag_p, S = scale max_s sum_p
//      |q_p k_sp| (the bound of test/attention_test.cc).
//   3. Output projection over P = n_heads * head_dim terms: y_j moves by
//      rss_p(err_o_p W_o[p, j]) from o's errors and by 4 u (sqrt(P) + 1)
//      (sum_p |o_p W_o[p, j]| + |b_o[j]|) from its own rounding.
// K and V in the cache are held to step 1's bound. The bound is the same on
// every target; the observed errors are at least 30 times smaller, and a
// mistake as small as a scale off by 3e-4 fails these tests.
//
// Weights stored as bf16 or int8 (config.weight_dtype): the reference
// multiplies by the weights as stored (ref::StoredWeights: bf16 rounded to
// nearest even, int8 s_j q exact in double), which is what the kernels read,
// so the bounds above hold as they are, plus for int8 u per K block of 512 in
// steps 1 and 3 (the multiply by the column's scale, matmul.h). Storage's own
// error is not in the bound: reading the float weights or other scales would
// be off by up to 2^-8 (bf16) or 1/254 of a column's max (int8), relative,
// hundreds of times more. The bf16 compute mode (config.projection_compute)
// rounds the projections' inputs to bf16, 8 significant bits, so by at most
// 2^-8 relative: the reference rounds x the same way (step 1 holds as it is),
// and y's bound gains 2^-8 sum_p |o_p W_o[p, j]| for o's rounding before W_O.
//
// Two runs that must agree (one-shot prefill and prefill then decode, a batch
// and its sequences alone, shards and the whole layer) do the same float32
// operations grouped differently: GEMM tiles depend on the rows M of a call
// (one row takes the decode path), attention tiles on its queries, so
// bitwise equality is not promised. Their outputs are held to kTight = 1/4
// of the bound above, i.e. the same model with lambda = 1: both are within
// the bound of the exact value, and a regrouping stays near the typical
// rounding error, not its bound (observed: under 0.03 of the bound). Their
// cache rows are held to step 1's bound: the decode path's K differs from the
// prefill's by up to 0.12 of it (the rows are single sums of d_model
// products, nothing to gain from propagation there).
#include "headway/layer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "headway/attention.h"
#include "headway/kv_cache.h"
#include "headway/matmul.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/threads.h"
#include "headway/view.h"
#include "lib/core/storage.h"
#include "tbb/task_arena.h"
#include "test/support/alloc_counter.h"
#include "test/support/cache.h"
#include "test/support/lanes.h"
#include "test/support/random.h"
#include "test/support/reference.h"
#include "test/support/status_matchers.h"
#include "test/support/target_test.h"

namespace headway {
namespace {

namespace ref = test::ref;
using test::FloatRows;
using test::MakeCache;

constexpr double kU = 1.0 / (1 << 24);
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -7.0f;
// Two runs that must agree: this fraction of the reference bound (see top).
constexpr double kTight = 0.25;
// The cache's stored types.
constexpr KvDtype kAllDtypes[] = {KvDtype::kFloat32, KvDtype::kBFloat16,
                                  KvDtype::kFloat16, KvDtype::kInt8};

// ---------------------------------------------------------------------------
// Models, references and checks.

// A layer's sizes with the defaults resolved.
struct Shape {
  int64_t d_model;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t q_cols() const { return n_heads * head_dim; }
  int64_t kv_cols() const { return n_kv_heads * head_dim; }
  int64_t group() const { return n_heads / n_kv_heads; }
};

AttentionLayerConfig Config(int64_t d_model, int64_t n_heads,
                            int64_t n_kv_heads = 0, int64_t head_dim = 0) {
  AttentionLayerConfig config;
  config.d_model = d_model;
  config.n_heads = n_heads;
  config.n_kv_heads = n_kv_heads;
  config.head_dim = head_dim;
  return config;
}

// config with QK-norm (eps 1e-5) if qk_norm, and RoPE of rotary_dim (0:
// none) with the layout and scaling given (theta 10000; Llama 3.1's scaling
// with factor 8 over an original context of 8 tokens, so that the tests'
// lengths cross its bands).
AttentionLayerConfig WithVariants(AttentionLayerConfig config, bool qk_norm,
                                  int64_t rotary_dim,
                                  RopeLayout layout = RopeLayout::kHalves,
                                  RopeScaling scaling = RopeScaling::kNone) {
  config.qk_norm = qk_norm;
  config.qk_norm_eps = 1e-5f;
  config.rope.rotary_dim = rotary_dim;
  config.rope.layout = layout;
  config.rope.scaling = scaling;
  config.rope.factor = scaling == RopeScaling::kLinear ? 2.0 : 8.0;
  config.rope.original_max_position = 8;
  return config;
}

// config with attention variants (AttentionOptions): a window, soft-capping,
// ALiBi (the paper's slopes) and sink logits (in [-1, 3]) for up to 16 heads.
AttentionLayerConfig WithAttentionVariants(AttentionLayerConfig config,
                                           int64_t window, float softcap,
                                           bool alibi, bool sinks) {
  static const std::vector<float> kSlopes = [] {
    std::vector<float> slopes(16);
    EXPECT_TRUE(AlibiSlopes(16, slopes.data()).ok());
    return slopes;
  }();
  static const std::vector<float> kSinks =
      test::RandomVector(16, 77, -1.0f, 3.0f);
  config.attention.window = window;
  config.attention.softcap = softcap;
  config.attention.alibi_slopes = alibi ? kSlopes.data() : nullptr;
  config.attention.sink_logits = sinks ? kSinks.data() : nullptr;
  return config;
}

Shape ShapeOf(const AttentionLayerConfig& config) {
  return {
      config.d_model, config.n_heads,
      config.n_kv_heads == 0 ? config.n_heads : config.n_kv_heads,
      config.head_dim == 0 ? config.d_model / config.n_heads : config.head_dim};
}

double ScaleOf(const AttentionLayerConfig& config) {
  return config.attention.scale != 0.0f
             ? static_cast<double>(config.attention.scale)
             : 1.0 / std::sqrt(static_cast<double>(ShapeOf(config).head_dim));
}

std::string Describe(const AttentionLayerConfig& config) {
  const Shape s = ShapeOf(config);
  std::string text = "d_model " + std::to_string(s.d_model) + ", heads " +
                     std::to_string(s.n_heads) + "/" +
                     std::to_string(s.n_kv_heads) + ", head_dim " +
                     std::to_string(s.head_dim);
  if (config.attention.scale != 0.0f)
    text += ", scale " + std::to_string(config.attention.scale);
  if (config.head_begin != 0 || config.head_end != 0) {
    text += ", heads [" + std::to_string(config.head_begin) + ", " +
            std::to_string(config.head_end) + ")";
  }
  if (config.qk_norm) text += ", QK-norm";
  const AttentionOptions& a = config.attention;
  if (a.window != 0) text += ", window " + std::to_string(a.window);
  if (a.n_sink_tokens != 0) {
    text += ", " + std::to_string(a.n_sink_tokens) + " sink tokens";
  }
  if (a.softcap != 0.0f) text += ", softcap " + std::to_string(a.softcap);
  if (a.alibi_slopes != nullptr) text += ", ALiBi";
  if (a.sink_logits != nullptr) text += ", sink logits";
  if (config.rope.rotary_dim != 0) {
    text += ", RoPE " + std::to_string(config.rope.rotary_dim) +
            (config.rope.layout == RopeLayout::kHalves ? " halves"
                                                       : " interleaved") +
            " scaling " + std::to_string(static_cast<int>(config.rope.scaling));
  }
  if (config.weight_dtype != WeightDtype::kFloat32) {
    text += config.weight_dtype == WeightDtype::kBFloat16 ? ", bf16 weights"
                                                          : ", int8 weights";
  }
  if (config.projection_compute == MatmulCompute::kBFloat16) {
    text += ", bf16 compute";
  }
  return text + (config.attention.mask == AttentionMask::kCausal ? ", causal"
                                                                 : ", no mask");
}

// A model layer's weights as its host holds them: dense float32, uniform in
// +-2 / sqrt(rows) so that a projection keeps the scale of its input (|x| <= 1
// gives Q, K, V entries of about 0.7), biases in [-0.5, 0.5]. Never zero.
// `biases` names those it has: "qkvo" all, "" none, "kv" b_k and b_v only.
struct Model {
  Model(const Shape& shape_in, const std::string& biases, uint64_t seed)
      : shape(shape_in), seed_(seed) {
    const int64_t d = shape.d_model, q = shape.q_cols(), kv = shape.kv_cols();
    const float wa = static_cast<float>(2.0 / std::sqrt(d));
    const float wo = static_cast<float>(2.0 / std::sqrt(q));
    w_q = test::RandomVector(d * q, seed, -wa, wa);
    w_k = test::RandomVector(d * kv, seed + 1, -wa, wa);
    w_v = test::RandomVector(d * kv, seed + 2, -wa, wa);
    w_o = test::RandomVector(q * d, seed + 3, -wo, wo);
    auto bias = [&](char name, int64_t n, uint64_t bias_seed) {
      return biases.find(name) == std::string::npos
                 ? std::vector<float>()
                 : test::RandomVector(n, bias_seed, -0.5f, 0.5f);
    };
    b_q = bias('q', q, seed + 4);
    b_k = bias('k', kv, seed + 5);
    b_v = bias('v', kv, seed + 6);
    b_o = bias('o', d, seed + 7);
  }

  static const float* Ptr(const std::vector<float>& b) {
    return b.empty() ? nullptr : b.data();
  }

  ref::LayerWeights Ref() const {
    ref::LayerWeights w;
    w.w_q = w_q.data();
    w.w_k = w_k.data();
    w.w_v = w_v.data();
    w.w_o = w_o.data();
    w.b_q = Ptr(b_q);
    w.b_k = Ptr(b_k);
    w.b_v = Ptr(b_v);
    w.b_o = Ptr(b_o);
    return w;
  }

  // Creates *layer from copies of the weights in strided views (`pad` NaN
  // floats after each row), then overwrites the copies with NaN: the layer
  // must have packed its own (the host may free them). without_b_o leaves
  // b_o null. The model takes config's QK-norm (with weights of its own in
  // [0.5, 1.5]) and RoPE, which Reference then applies.
  Status Create(const AttentionLayerConfig& config, AttentionLayer* layer,
                bool without_b_o = false) {
    const int64_t d = shape.d_model, q = shape.q_cols(), kv = shape.kv_cols();
    const int64_t hd = shape.head_dim;
    rope = config.rope;
    qk_norm_eps = config.qk_norm_eps;
    weight_dtype = config.weight_dtype;
    compute = config.projection_compute;
    // The attention variants, with copies of the per-head arrays.
    const AttentionOptions& a = config.attention;
    slopes.assign(a.alibi_slopes, a.alibi_slopes == nullptr
                                      ? a.alibi_slopes
                                      : a.alibi_slopes + shape.n_heads);
    sinks.assign(a.sink_logits, a.sink_logits == nullptr
                                    ? a.sink_logits
                                    : a.sink_logits + shape.n_heads);
    variants.window = a.window;
    variants.n_sink_tokens = a.n_sink_tokens;
    variants.softcap = a.softcap;
    variants.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    variants.sink_logits = sinks.empty() ? nullptr : sinks.data();
    q_norm.clear();
    k_norm.clear();
    if (config.qk_norm) {
      q_norm = test::RandomVector(hd, seed_ + 8, 0.5f, 1.5f);
      k_norm = test::RandomVector(hd, seed_ + 9, 0.5f, 1.5f);
    }
    const int64_t pad = 3;
    AttentionLayerWeights views;
    views.w_q = Copy(0, w_q, d, q, pad);
    views.w_k = Copy(1, w_k, d, kv, pad);
    views.w_v = Copy(2, w_v, d, kv, pad);
    views.w_o = Copy(3, w_o, q, d, pad);
    if (!b_q.empty()) views.b_q = Copy(4, b_q, 1, q, 0).data;
    if (!b_k.empty()) views.b_k = Copy(5, b_k, 1, kv, 0).data;
    if (!b_v.empty()) views.b_v = Copy(6, b_v, 1, kv, 0).data;
    if (!b_o.empty() && !without_b_o) views.b_o = Copy(7, b_o, 1, d, 0).data;
    if (!q_norm.empty()) {
      views.q_norm = Copy(8, q_norm, 1, hd, 0).data;
      views.k_norm = Copy(9, k_norm, 1, hd, 0).data;
    }
    const Status status = AttentionLayer::Create(config, views, layer);
    for (std::vector<float>& copy : copies_) {
      std::fill(copy.begin(), copy.end(), kNaN);
    }
    return status;
  }

  // The weights the layer multiplies by for w [rows, cols] (w_q, w_k, w_v or
  // w_o): stored as weight_dtype and read back, exact in double. The whole
  // layer's: an int8 shard scales its W_O columns by its own rows (layer.h).
  std::vector<double> Stored(const std::vector<float>& w, int64_t rows,
                             int64_t cols) const {
    return ref::StoredWeights(w.data(), rows, cols, cols, weight_dtype);
  }

  // Whether the layer is more than the seed's (ref::MultiHeadAttention): Q
  // and K change after the bias (QK-norm, RoPE) or attention has variants.
  bool HasVariants() const {
    return !q_norm.empty() || rope.rotary_dim != 0 || variants.window != 0 ||
           variants.softcap != 0.0 || !slopes.empty() || !sinks.empty();
  }

  // QK-norm with `norm` (if the model has it), then RoPE (if any), of y [n,
  // heads * head_dim] (a projection with its bias, tokens at positions 0 ..
  // n - 1), carrying the error magnitudes y_abs (errors <= e_p y_abs: see the
  // top of this file) through both to first order and adding their own
  // rounding (norm.h's and rope.h's bounds) as e_p multiples.
  void Finish(int64_t n, int64_t heads, const std::vector<float>& norm,
              double e_p, std::vector<double>* y,
              std::vector<double>* y_abs) const {
    const int64_t hd = shape.head_dim, cols = heads * hd;
    if (!norm.empty()) {
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          double* v = &(*y)[t * cols + h * hd];
          double* a = &(*y_abs)[t * cols + h * hd];
          double sum = 0, carried = 0;
          for (int64_t i = 0; i < hd; ++i) {
            sum += v[i] * v[i];
            carried += std::fabs(v[i]) * a[i];
          }
          const double f = 1 / std::sqrt(sum / hd + qk_norm_eps);
          for (int64_t i = 0; i < hd; ++i) {
            const double w = norm[i], out = v[i] * f * w;
            a[i] = std::fabs(w) * f * a[i] +
                   std::fabs(w * v[i]) * f * f * f * carried / hd +
                   std::fabs(out) * 0x1.0p-23 / e_p;
            v[i] = out;
          }
        }
      }
    }
    if (rope.rotary_dim == 0) return;
    const std::vector<long double> freq = ref::RopeFrequencies(rope);
    const int64_t half = rope.rotary_dim / 2;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const long double angle = t * freq[i];
        const double c = static_cast<double>(cosl(angle));
        const double sn = static_cast<double>(sinl(angle));
        for (int64_t h = 0; h < heads; ++h) {
          int64_t ia = 0, ib = 0;
          ref::RopePair(rope.layout, half, i, &ia, &ib);
          double* v = &(*y)[t * cols + h * hd];
          double* a = &(*y_abs)[t * cols + h * hd];
          const double rounding =
              (4 * kU + 0x1.0p-52 * static_cast<double>(angle)) *
              (std::fabs(v[ia]) + std::fabs(v[ib])) / e_p;
          const double va = v[ia] * c - v[ib] * sn;
          const double vb = v[ib] * c + v[ia] * sn;
          const double aa = std::fabs(c) * a[ia] + std::fabs(sn) * a[ib];
          const double ab = std::fabs(c) * a[ib] + std::fabs(sn) * a[ia];
          v[ia] = va;
          v[ib] = vb;
          a[ia] = aa + rounding;
          a[ib] = ab + rounding;
        }
      }
    }
  }

  Shape shape;
  std::vector<float> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;
  // Set by Create from its config.
  std::vector<float> q_norm, k_norm;  // empty: no QK-norm
  WeightDtype weight_dtype = WeightDtype::kFloat32;
  MatmulCompute compute = MatmulCompute::kFloat32;
  float qk_norm_eps = 0;
  RopeConfig rope;
  ref::Variants variants;  // of attention, pointing into slopes and sinks
  std::vector<float> slopes, sinks;

 private:
  MatrixView<const float> Copy(int i, const std::vector<float>& from,
                               int64_t rows, int64_t cols, int64_t pad) {
    std::vector<float>& to = copies_[i];
    to.assign(rows * (cols + pad), kNaN);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(from.begin() + r * cols, from.begin() + (r + 1) * cols,
                to.begin() + r * (cols + pad));
    }
    return MatrixView<const float>(to.data(), rows, cols, cols + pad);
  }

  uint64_t seed_;
  // Kept until the model dies, so the NaN written after Create stays there
  // while the layer runs.
  std::vector<float> copies_[10];
};

// The whole layer's output for one sequence from position 0, with the bound
// from the top of this file for every element, and the K and V rows it
// caches with theirs.
struct Expected {
  int64_t n = 0;
  std::vector<double> y, y_tol;  // [n, d_model]
  std::vector<double> k, v;      // [n, kv_cols]
  std::vector<double> k_tol, v_tol;
};

// With k_attn and v_attn ([n, kv_cols], the dequantized rows a cache of a
// stored type holds), attention reads those instead of the projection's K
// and V (which e.k and e.v still give), and y is o W_o + b_o of that
// attention. kv_only: e.k and e.v with their bounds alone (no y), what a
// cache must hold.
Expected Reference(const Model& m, const std::vector<float>& x, bool causal,
                   double scale, const std::vector<double>* k_attn = nullptr,
                   const std::vector<double>* v_attn = nullptr,
                   bool kv_only = false) {
  const Shape& s = m.shape;
  const int64_t d = s.d_model, qc = s.q_cols(), kvc = s.kv_cols();
  const int64_t hd = s.head_dim;
  Expected e;
  e.n = static_cast<int64_t>(x.size()) / d;
  const int64_t n = e.n;
  std::vector<double> q(n * qc), q_abs(n * qc);
  e.k.resize(n * kvc);
  e.v.resize(n * kvc);
  std::vector<double> k_abs(n * kvc), v_abs(n * kvc);
  // The projections' input: x, rounded to bf16 by the bf16 compute mode.
  const bool bf16_compute = m.compute == MatmulCompute::kBFloat16;
  std::vector<double> x_in = ref::ToDouble(x.data(), n, d, d);
  if (bf16_compute) {
    for (size_t i = 0; i < x.size(); ++i) x_in[i] = ref::RoundToBFloat16(x[i]);
  }
  const std::vector<double> w_k = m.Stored(m.w_k, d, kvc);
  const std::vector<double> w_v = m.Stored(m.w_v, d, kvc);
  ref::Matmul(n, kvc, d, 1.0, x_in.data(), d, false, w_k.data(), kvc, false,
              0.0, e.k.data(), k_abs.data());
  ref::Matmul(n, kvc, d, 1.0, x_in.data(), d, false, w_v.data(), kvc, false,
              0.0, e.v.data(), v_abs.data());
  // Adds bias b (if any) to rows [n, cols] of y and its magnitude to y_abs.
  auto add_bias = [n](const std::vector<float>& b, int64_t cols,
                      std::vector<double>* y, std::vector<double>* y_abs) {
    if (b.empty()) return;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < cols; ++c) {
        (*y)[t * cols + c] += b[c];
        (*y_abs)[t * cols + c] += std::fabs(b[c]);
      }
    }
  };
  add_bias(m.b_k, kvc, &e.k, &k_abs);
  add_bias(m.b_v, kvc, &e.v, &v_abs);
  // Error per unit of magnitude of a projection over k terms (step 1), plus
  // for int8 weights one rounding per K block of 512: the multiply by the
  // column's scale (matmul.h).
  const auto projection_error = [&m](int64_t k) {
    const double blocks = m.weight_dtype == WeightDtype::kInt8
                              ? static_cast<double>((k + 511) / 512)
                              : 0.0;
    return 4 * kU * (std::sqrt(static_cast<double>(k)) + 1) + blocks * kU;
  };
  const double e_p = projection_error(d);
  m.Finish(n, s.n_kv_heads, m.k_norm, e_p, &e.k, &k_abs);
  e.k_tol.resize(n * kvc);
  e.v_tol.resize(n * kvc);
  for (int64_t i = 0; i < n * kvc; ++i) {
    e.k_tol[i] = e_p * k_abs[i];
    e.v_tol[i] = e_p * v_abs[i];
  }
  if (kv_only) return e;
  const std::vector<double> w_q = m.Stored(m.w_q, d, qc);
  ref::Matmul(n, qc, d, 1.0, x_in.data(), d, false, w_q.data(), qc, false, 0.0,
              q.data(), q_abs.data());
  add_bias(m.b_q, qc, &q, &q_abs);
  m.Finish(n, s.n_heads, m.q_norm, e_p, &q, &q_abs);

  // o, and the same weights applied to |v| and to v's magnitudes: o_mag_p =
  // sum_s w_s |v_sp| and o_vabs_p = sum_s w_s |v|_sp.
  const std::vector<double>& keys = k_attn != nullptr ? *k_attn : e.k;
  auto attend = [&](const std::vector<double>& values) {
    return ref::AttentionCore(q.data(), qc, n, keys.data(), kvc, values.data(),
                              kvc, n, s.n_heads, s.n_kv_heads, hd,
                              /*q_pos0=*/0, causal, nullptr, 0, scale,
                              m.variants);
  };
  std::vector<double> v_plain_abs(v_attn != nullptr ? *v_attn : e.v);
  for (double& value : v_plain_abs) value = std::fabs(value);
  const std::vector<double> o = attend(v_attn != nullptr ? *v_attn : e.v);
  const std::vector<double> o_mag = attend(v_plain_abs);
  const std::vector<double> o_vabs = attend(v_abs);
  std::vector<double> o_err(n * qc);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t end = causal ? t + 1 : n;
    const ref::VisibleSpan visible = ref::VisibleKeys(m.variants, t, end);
    const int64_t seen = visible.count();
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t g = h / s.group();
      double score_err = 0.0, s_max = 0.0;
      for (int64_t j = 0; j < end; ++j) {
        if (!visible.Contains(j)) continue;
        double carried = 0.0, dot = 0.0;
        for (int64_t p = 0; p < hd; ++p) {
          const size_t qi = static_cast<size_t>(t * qc + h * hd + p);
          const size_t ki = static_cast<size_t>(j * kvc + g * hd + p);
          const double dq = q_abs[qi] * keys[ki], dk = q[qi] * k_abs[ki];
          carried += dq * dq + dk * dk;
          dot += std::fabs(q[qi] * keys[ki]);
        }
        score_err = std::max(score_err, e_p * scale * std::sqrt(carried));
        // Soft-capping and ALiBi's bias count in the kernel's S_t
        // (attention.h).
        const double bias =
            m.variants.softcap +
            (m.slopes.empty() ? 0.0 : std::fabs(m.slopes[h] * (j - t)));
        s_max = std::max(s_max, scale * dot + bias);
      }
      const double kernel = 4 * kU *
                            (std::sqrt(static_cast<double>(hd)) * s_max +
                             std::sqrt(static_cast<double>(seen)) + 8);
      for (int64_t p = 0; p < hd; ++p) {
        const size_t i = static_cast<size_t>(t * qc + h * hd + p);
        o_err[i] = (2 * score_err + kernel) * o_mag[i] + e_p * o_vabs[i];
      }
    }
  }

  const std::vector<double> w_o = m.Stored(m.w_o, qc, d);
  std::vector<double> y_plain(n * d), y_abs(n * d);
  ref::Matmul(n, d, qc, 1.0, o.data(), qc, false, w_o.data(), d, false, 0.0,
              y_plain.data(), y_abs.data());
  // The seed's layer (float32 weights and compute, no variants, K and V as
  // projected) is ref::MultiHeadAttention itself.
  const bool seed_layer = k_attn == nullptr && !m.HasVariants() &&
                          m.weight_dtype == WeightDtype::kFloat32 &&
                          !bf16_compute;
  if (seed_layer) {
    e.y = ref::MultiHeadAttention({d, s.n_heads, s.n_kv_heads, hd}, m.Ref(),
                                  x.data(), n, causal, nullptr, 0, scale);
  } else {
    e.y = y_plain;
    for (int64_t t = 0; t < n && !m.b_o.empty(); ++t) {
      for (int64_t j = 0; j < d; ++j) e.y[t * d + j] += m.b_o[j];
    }
  }
  e.y_tol.resize(n * d);
  const double e_o = projection_error(qc);
  // The bf16 compute mode rounds o to bf16 before W_O: each o_p moves by at
  // most 2^-8 |o_p|, so y_j by 2^-8 sum_p |o_p W_o[p, j]|.
  const double o_rounding = bf16_compute ? 0x1.0p-8 : 0.0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < d; ++j) {
      double carried = 0.0;
      for (int64_t p = 0; p < qc; ++p) {
        const double term = o_err[t * qc + p] * w_o[p * d + j];
        carried += term * term;
      }
      carried = std::sqrt(carried);
      const double magnitude =
          y_abs[t * d + j] + (m.b_o.empty() ? 0.0 : std::fabs(m.b_o[j]));
      e.y_tol[t * d + j] =
          carried + e_o * magnitude + o_rounding * y_abs[t * d + j];
    }
  }
  return e;
}

// Checks y rows [0, rows) (row stride `stride`) against rows [row0, row0 +
// rows) of e, to their bounds.
void ExpectRowsMatch(const float* y, int64_t rows, int64_t stride,
                     int64_t d_model, const Expected& e, int64_t row0,
                     const std::string& what) {
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < d_model; ++j) {
      const size_t i = static_cast<size_t>((row0 + t) * d_model + j);
      const double got = y[t * stride + j];
      ASSERT_LE(std::fabs(got - e.y[i]), e.y_tol[i])
          << what << ": row " << row0 + t << " col " << j << ": got " << got
          << ", want " << e.y[i];
    }
  }
}

// Two outputs of the layer that must agree: a and b [rows, d_model] with row
// strides, rows [row0, row0 + rows) of e giving the bound.
void ExpectAgree(const float* a, int64_t a_stride, const float* b,
                 int64_t b_stride, int64_t rows, int64_t d_model,
                 const Expected& e, int64_t row0, const std::string& what) {
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t j = 0; j < d_model; ++j) {
      const double tol =
          kTight * e.y_tol[static_cast<size_t>((row0 + t) * d_model + j)];
      const double x = a[t * a_stride + j], y = b[t * b_stride + j];
      ASSERT_LE(std::fabs(x - y), tol)
          << what << ": row " << row0 + t << " col " << j << ": " << x << " vs "
          << y;
    }
  }
}

// The cache's rows of `seq` hold e's K and V for KV heads [g0, g0 +
// cache.n_kv_heads()) of the model (to their bounds), and the padding of
// every row is still zero.
void ExpectCacheHolds(const KvCache& cache, int64_t seq, const Expected& e,
                      int64_t kv_cols, int64_t g0, const std::string& what) {
  const int64_t hd = cache.head_dim();
  ASSERT_EQ(cache.length(seq), e.n) << what;
  for (int64_t g = 0; g < cache.n_kv_heads(); ++g) {
    const MatrixView<const float> keys = FloatRows(cache.Keys(seq, g));
    const MatrixView<const float> values = FloatRows(cache.Values(seq, g));
    for (int64_t s = 0; s < e.n; ++s) {
      for (int64_t p = 0; p < hd; ++p) {
        const size_t i = static_cast<size_t>(s * kv_cols + (g0 + g) * hd + p);
        ASSERT_LE(std::fabs(keys.data[s * keys.stride + p] - e.k[i]),
                  e.k_tol[i])
            << what << ": K of seq " << seq << " head " << g << " row " << s
            << " col " << p;
        ASSERT_LE(std::fabs(values.data[s * values.stride + p] - e.v[i]),
                  e.v_tol[i])
            << what << ": V of seq " << seq << " head " << g << " row " << s
            << " col " << p;
      }
      for (int64_t p = hd; p < cache.row_stride(); ++p) {
        ASSERT_EQ(keys.data[s * keys.stride + p], 0.0f)
            << what << ": K padding of seq " << seq << " head " << g << " row "
            << s;
        ASSERT_EQ(values.data[s * values.stride + p], 0.0f)
            << what << ": V padding of seq " << seq << " head " << g << " row "
            << s;
      }
    }
  }
}

// Forward over dense x and y of sum(n_tokens) rows (y filled with kSentinel
// first).
Status RunLayer(AttentionLayer* layer, KvCache* cache,
                const std::vector<LayerSequence>& sequences,
                const std::vector<float>& x, std::vector<float>* y) {
  int64_t rows = 0;
  for (const LayerSequence& s : sequences) rows += s.n_tokens;
  const int64_t d = static_cast<int64_t>(x.size()) / rows;
  y->assign(x.size(), kSentinel);
  return layer->Forward(cache, sequences.data(),
                        static_cast<int64_t>(sequences.size()),
                        MatrixView<const float>(x.data(), rows, d),
                        MatrixView<float>(y->data(), rows, d));
}

class AttentionLayerTest : public test::TargetTest {};

// ---------------------------------------------------------------------------
// Against the reference.

// One sequence of n tokens through a fresh layer and a cache of capacity n,
// x and y strided (NaN padding in x, sentinel padding in y that must stay):
// y matches ref::MultiHeadAttention, the cache its K and V.
void RunParity(const AttentionLayerConfig& config, const char* biases,
               int64_t n, uint64_t seed) {
  const std::string what =
      Describe(config) + ", biases \"" + biases + "\", n " + std::to_string(n);
  Model model(ShapeOf(config), biases, seed);
  AttentionLayer layer;
  const Status created = model.Create(config, &layer);
  ASSERT_TRUE(created.ok()) << what << ": " << created.ToString();
  KvCache cache = MakeCache(layer.CacheConfig(1, n));
  const int64_t d = config.d_model, x_stride = d + 5, y_stride = d + 3;
  std::vector<float> x_strided((n - 1) * x_stride + d);
  test::FillRandomMatrix(x_strided.data(), n, d, x_stride, seed + 10);
  std::vector<float> x(n * d);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(&x_strided[t * x_stride], d, &x[t * d]);
  }
  std::vector<float> y(n * y_stride, kSentinel);
  const LayerSequence sequence{0, n};
  const Status status =
      layer.Forward(&cache, &sequence, 1,
                    MatrixView<const float>(x_strided.data(), n, d, x_stride),
                    MatrixView<float>(y.data(), n, d, y_stride));
  ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
  const bool causal = config.attention.mask == AttentionMask::kCausal;
  const Expected e = Reference(model, x, causal, ScaleOf(config));
  ASSERT_NO_FATAL_FAILURE(
      ExpectRowsMatch(y.data(), n, y_stride, d, e, 0, what));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = d; j < y_stride; ++j) {
      ASSERT_EQ(y[t * y_stride + j], kSentinel) << what << ": y padding";
    }
  }
  ASSERT_NO_FATAL_FAILURE(
      ExpectCacheHolds(cache, 0, e, model.shape.kv_cols(), 0, what));
}

// RunParity for every config, both masks, no bias and all four, and each n;
// each run gets its own seed.
void ParitySweep(std::vector<AttentionLayerConfig> configs,
                 std::initializer_list<int64_t> ns, uint64_t seed) {
  for (AttentionLayerConfig& config : configs) {
    for (const AttentionMask mask :
         {AttentionMask::kCausal, AttentionMask::kNone}) {
      config.attention.mask = mask;
      for (const char* biases : {"", "qkvo"}) {
        for (const int64_t n : ns) {
          ASSERT_NO_FATAL_FAILURE(RunParity(config, biases, n, seed));
          seed += 16;
        }
      }
    }
  }
}

// The seed's layer: MHA, with and without the causal mask and biases,
// head_dim * n_heads == d_model (head_dim 0) and != d_model (explicit).
TEST_P(AttentionLayerTest, MhaMatchesSeedLayer) {
  std::vector<AttentionLayerConfig> configs = {
      Config(64, 4),        Config(96, 3), Config(72, 6),
      Config(64, 4, 4, 24),  // n_heads * head_dim = 96 > d_model
      Config(80, 2, 0, 20),  // 40 < d_model
  };
  AttentionLayerConfig sharp = Config(64, 2);
  // Scores 4 times the default: a peakier softmax.
  sharp.attention.scale = 1.0f;
  configs.push_back(sharp);
  ParitySweep(configs, {1, 7, 33}, /*seed=*/1);
}

// QK-norm and RoPE (alone and together; both layouts, partial rotation, the
// three scalings) for MHA, GQA and MQA: Q and K are normalised and rotated at
// positions 0 .. n - 1 before attention, and the cache holds K rotated.
TEST_P(AttentionLayerTest, QkNormAndRopeMatchReference) {
  const std::vector<AttentionLayerConfig> configs = {
      WithVariants(Config(64, 4), true, 0),
      WithVariants(Config(64, 4), false, 16),
      WithVariants(Config(96, 6, 2, 16), true, 16, RopeLayout::kInterleaved),
      WithVariants(Config(64, 4, 1, 24), true, 10, RopeLayout::kHalves,
                   RopeScaling::kLlama3),
      WithVariants(Config(60, 3, 3, 20), true, 20, RopeLayout::kInterleaved,
                   RopeScaling::kLinear),
  };
  ParitySweep(configs, {1, 7, 33}, /*seed=*/900);
}

// The attention variants through the layer, alone and with RoPE and QK-norm
// (a Gemma-2- or gpt-oss-shaped layer).
TEST_P(AttentionLayerTest, AttentionVariantsMatchReference) {
  const std::vector<AttentionLayerConfig> configs = {
      WithAttentionVariants(Config(64, 4), 5, 0.0f, false, false),
      WithAttentionVariants(Config(64, 4), 0, 2.0f, false, false),
      WithAttentionVariants(Config(96, 6, 2, 16), 0, 0.0f, true, false),
      WithAttentionVariants(Config(64, 4, 1, 24), 0, 0.0f, false, true),
      WithAttentionVariants(WithVariants(Config(64, 8, 2, 16), true, 16), 9,
                            3.0f, true, true),
  };
  ParitySweep(configs, {1, 7, 33}, /*seed=*/1900);
}

// GQA and MQA: query head h reads KV head h / (n_heads / n_kv_heads).
TEST_P(AttentionLayerTest, GqaAndMqaMatchReference) {
  const std::vector<AttentionLayerConfig> configs = {
      Config(64, 8, 4),     Config(64, 8, 2, 16), Config(64, 8, 1),
      Config(96, 6, 3, 20), Config(64, 4, 1, 24),
  };
  ParitySweep(configs, {1, 9, 40}, /*seed=*/1000);
}

// Each bias may be given alone (the others null).
TEST_P(AttentionLayerTest, PartialBiasesMatchReference) {
  uint64_t seed = 1500;
  for (const AttentionLayerConfig& config :
       {Config(64, 4), Config(64, 8, 2, 16)}) {
    for (const char* biases : {"q", "k", "v", "o", "kv", "qo"}) {
      ASSERT_NO_FATAL_FAILURE(RunParity(config, biases, 7, seed));
      seed += 16;
    }
  }
}

// One bigger case: more heads, a longer prefill (150 tokens: two key blocks of
// at most 128).
TEST_P(AttentionLayerTest, LongerPrefillMatchesReference) {
  ASSERT_NO_FATAL_FAILURE(RunParity(Config(128, 8, 2), "qkvo", 150, 2000));
}

// ---------------------------------------------------------------------------
// Prefill, decode and batches.

// The chunk sizes of `split` followed by one-token steps up to total tokens.
std::vector<int64_t> WithDecodeSteps(std::vector<int64_t> split,
                                     int64_t total) {
  int64_t covered = 0;
  for (const int64_t n : split) covered += n;
  split.insert(split.end(), static_cast<size_t>(total - covered), 1);
  return split;
}

// Splits of 30 tokens: one-shot prefill against prefill of k tokens then
// 30 - k one-token decode steps (and a chunked prefill): every split gives the
// one-shot outputs (to kTight) and cache contents, and the reference.
void CheckPrefillThenDecode(const AttentionLayerConfig& config,
                            const char* biases, uint64_t seed) {
  const int64_t total = 30;
  const std::vector<std::vector<int64_t>> splits = {
      {17}, {1}, {10, 7, 4}};  // then one-token steps up to total
  const std::string what = Describe(config) + ", biases " + biases;
  Model model(ShapeOf(config), biases, seed);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(config, &layer).ok()) << what;
  const int64_t d = config.d_model;
  const std::vector<float> x = test::RandomVector(total * d, seed + 10);
  const Expected e = Reference(model, x, true, ScaleOf(config));
  KvCache one_shot = MakeCache(layer.CacheConfig(1, total));
  std::vector<float> want;
  ASSERT_TRUE(RunLayer(&layer, &one_shot, {{0, total}}, x, &want).ok()) << what;
  ASSERT_NO_FATAL_FAILURE(
      ExpectRowsMatch(want.data(), total, d, d, e, 0, what));
  for (std::vector<int64_t> split : splits) {
    split = WithDecodeSteps(split, total);
    const std::string how = what + ", first chunk " + std::to_string(split[0]);
    KvCache stepped = MakeCache(layer.CacheConfig(1, total));
    std::vector<float> got(total * d, kSentinel), y;
    int64_t t0 = 0;
    for (const int64_t n : split) {
      const std::vector<float> x_step(x.begin() + t0 * d,
                                      x.begin() + (t0 + n) * d);
      const Status status = RunLayer(&layer, &stepped, {{0, n}}, x_step, &y);
      ASSERT_TRUE(status.ok()) << how << ": " << status.ToString();
      std::copy(y.begin(), y.end(), got.begin() + t0 * d);
      t0 += n;
      ASSERT_EQ(stepped.length(0), t0) << how;
    }
    ASSERT_NO_FATAL_FAILURE(
        ExpectAgree(got.data(), d, want.data(), d, total, d, e, 0, how));
    ASSERT_NO_FATAL_FAILURE(
        ExpectRowsMatch(got.data(), total, d, d, e, 0, how));
    ASSERT_NO_FATAL_FAILURE(
        ExpectCacheHolds(stepped, 0, e, model.shape.kv_cols(), 0, how));
    // The two caches, row by row, to the projection bound.
    for (int64_t g = 0; g < model.shape.n_kv_heads; ++g) {
      const MatrixView<const float> k1 = FloatRows(one_shot.Keys(0, g));
      const MatrixView<const float> k2 = FloatRows(stepped.Keys(0, g));
      const MatrixView<const float> v1 = FloatRows(one_shot.Values(0, g));
      const MatrixView<const float> v2 = FloatRows(stepped.Values(0, g));
      const int64_t hd = model.shape.head_dim;
      for (int64_t s = 0; s < total; ++s) {
        for (int64_t p = 0; p < hd; ++p) {
          const size_t i =
              static_cast<size_t>(s * model.shape.kv_cols() + g * hd + p);
          ASSERT_LE(std::fabs(k1.data[s * k1.stride + p] -
                              k2.data[s * k2.stride + p]),
                    e.k_tol[i])
              << how << ": K head " << g << " row " << s;
          ASSERT_LE(std::fabs(v1.data[s * v1.stride + p] -
                              v2.data[s * v2.stride + p]),
                    e.v_tol[i])
              << how << ": V head " << g << " row " << s;
        }
      }
    }
  }
}

// CheckPrefillThenDecode for MHA, GQA, MQA and QK-norm with RoPE, with and
// without biases.
TEST_P(AttentionLayerTest, PrefillThenDecodeEqualsOneShot) {
  const AttentionLayerConfig configs[] = {
      Config(64, 4), Config(64, 8, 2, 16), Config(64, 8, 1, 24),
      WithVariants(Config(64, 8, 2, 16), true, 16, RopeLayout::kInterleaved,
                   RopeScaling::kLlama3)};
  uint64_t seed = 3000;
  for (const AttentionLayerConfig& config : configs) {
    for (const char* biases : {"", "qkvo"}) {
      ASSERT_NO_FATAL_FAILURE(CheckPrefillThenDecode(config, biases, seed));
      seed += 16;
    }
  }
}

// A sliding-window layer on a ring cache of window + n_sink_tokens rows
// (RingCacheConfig): a one-shot prefill 5 times longer than the ring, and
// prefills of k tokens then decode steps across several wraps, give what the
// same steps give on a plain cache (to kTight) and, in float32, the
// reference's outputs; the ring's bytes are those of its rows.
TEST_P(AttentionLayerTest, RingCacheEqualsPlainCache) {
  const int64_t total = 45;
  const std::vector<std::vector<int64_t>> splits = {
      {total}, {13}, {1}, {5, 9, 3}};  // then one-token steps up to total
  struct RingConfig {
    AttentionLayerConfig config;
    int64_t n_sink_tokens;
    KvDtype dtype;
  };
  const RingConfig configs[] = {
      {WithAttentionVariants(Config(64, 4), 6, 0.0f, false, false), 2,
       KvDtype::kFloat32},
      {WithAttentionVariants(WithVariants(Config(64, 8, 2, 16), true, 16), 9,
                             0.0f, false, true),
       0, KvDtype::kFloat32},
      {WithAttentionVariants(Config(64, 4, 1, 24), 5, 2.0f, true, false), 1,
       KvDtype::kFloat32},
      {WithAttentionVariants(Config(64, 8, 2, 16), 7, 0.0f, false, false), 3,
       KvDtype::kInt8},
      {WithAttentionVariants(Config(64, 4), 4, 0.0f, false, false), 1,
       KvDtype::kBFloat16},
      // Everything at once: QK-norm, RoPE, window, sink tokens, soft-capping,
      // ALiBi and sink logits.
      {WithAttentionVariants(
           WithVariants(Config(64, 8, 2, 16), true, 16,
                        RopeLayout::kInterleaved, RopeScaling::kLlama3),
           7, 2.0f, true, true),
       2, KvDtype::kFloat32},
  };
  uint64_t seed = 8000;
  for (RingConfig c : configs) {
    c.config.attention.n_sink_tokens = c.n_sink_tokens;
    const std::string what = Describe(c.config) + ", " +
                             internal::KvDtypeName(c.dtype) + " ring cache";
    Model model(ShapeOf(c.config), "qkvo", seed);
    AttentionLayer layer;
    ASSERT_TRUE(model.Create(c.config, &layer).ok()) << what;
    const KvCacheConfig ring_config = layer.RingCacheConfig(1, c.dtype);
    ASSERT_TRUE(ring_config.ring) << what;
    ASSERT_EQ(ring_config.capacity, c.config.attention.window + c.n_sink_tokens)
        << what;
    ASSERT_EQ(ring_config.n_sink_tokens, c.n_sink_tokens) << what;
    const int64_t d = c.config.d_model;
    const std::vector<float> x = test::RandomVector(total * d, seed + 10);
    const Expected e = Reference(model, x, true, ScaleOf(c.config));
    for (std::vector<int64_t> split : splits) {
      split = WithDecodeSteps(split, total);
      const std::string how =
          what + ", first chunk " + std::to_string(split[0]);
      KvCache ring = MakeCache(ring_config);
      KvCache plain = MakeCache(layer.CacheConfig(1, total, c.dtype));
      ASSERT_EQ(ring.bytes(), static_cast<size_t>(ring_config.capacity) *
                                  layer.cache_bytes_per_token(c.dtype))
          << how;
      std::vector<float> got(total * d), want(total * d), y;
      int64_t t0 = 0;
      for (const int64_t n : split) {
        const std::vector<float> x_step(x.begin() + t0 * d,
                                        x.begin() + (t0 + n) * d);
        Status status = RunLayer(&layer, &ring, {{0, n}}, x_step, &y);
        ASSERT_TRUE(status.ok()) << how << ": " << status.ToString();
        std::copy(y.begin(), y.end(), got.begin() + t0 * d);
        status = RunLayer(&layer, &plain, {{0, n}}, x_step, &y);
        ASSERT_TRUE(status.ok()) << how << ": " << status.ToString();
        std::copy(y.begin(), y.end(), want.begin() + t0 * d);
        t0 += n;
        ASSERT_EQ(ring.length(0), t0) << how;
      }
      ASSERT_NO_FATAL_FAILURE(
          ExpectAgree(got.data(), d, want.data(), d, total, d, e, 0, how));
      if (c.dtype == KvDtype::kFloat32) {
        ASSERT_NO_FATAL_FAILURE(
            ExpectRowsMatch(got.data(), total, d, d, e, 0, how));
      }
      // The ring holds the sink tokens' and the last positions' rows as the
      // plain cache does, bit for bit.
      const int64_t row_bytes =
          ring.row_stride() * static_cast<int64_t>(KvDtypeSize(c.dtype));
      for (int64_t g = 0; g < ring.n_kv_heads(); ++g) {
        const KvView rk = ring.Keys(0, g), pk = plain.Keys(0, g);
        const KvView rv = ring.Values(0, g), pv = plain.Values(0, g);
        for (int64_t p = 0; p < total; ++p) {
          if (p >= c.n_sink_tokens && p < ring.ring_begin(0)) continue;
          const int64_t slot = ring.Slot(p);
          ASSERT_EQ(
              std::memcmp(static_cast<const char*>(rk.data) + slot * row_bytes,
                          static_cast<const char*>(pk.data) + p * row_bytes,
                          static_cast<size_t>(row_bytes)),
              0)
              << how << ": K of position " << p;
          ASSERT_EQ(
              std::memcmp(static_cast<const char*>(rv.data) + slot * row_bytes,
                          static_cast<const char*>(pv.data) + p * row_bytes,
                          static_cast<size_t>(row_bytes)),
              0)
              << how << ": V of position " << p;
          if (rk.scales != nullptr) {
            ASSERT_EQ(rk.scales[slot], pk.scales[p]) << how;
            ASSERT_EQ(rv.scales[slot], pv.scales[p]) << how;
          }
        }
      }
    }
    seed += 16;
  }
}

// Runs `steps` (each one Forward call of several sequences, x random from
// seed on) through the layer into cache, appending each sequence's rows of x
// and of the output to xs[seq] and ys[seq]; each_sequence(s, x_s), if given,
// runs after each call for each of its sequences (x_s: that sequence's rows).
template <class EachSequence>
void RunSteps(AttentionLayer& layer, KvCache& cache,
              const std::vector<std::vector<LayerSequence>>& steps, int64_t d,
              uint64_t seed, const std::string& what,
              std::vector<std::vector<float>>* xs,
              std::vector<std::vector<float>>* ys,
              const EachSequence& each_sequence) {
  for (const std::vector<LayerSequence>& step : steps) {
    int64_t rows = 0;
    for (const LayerSequence& s : step) rows += s.n_tokens;
    const std::vector<float> x = test::RandomVector(rows * d, seed++);
    std::vector<float> y;
    const Status status = RunLayer(&layer, &cache, step, x, &y);
    ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
    int64_t row = 0;
    for (const LayerSequence& s : step) {
      const auto begin = static_cast<std::ptrdiff_t>(row * d);
      const auto end = static_cast<std::ptrdiff_t>((row + s.n_tokens) * d);
      std::vector<float>& x_seq = (*xs)[s.seq];
      x_seq.insert(x_seq.end(), x.begin() + begin, x.begin() + end);
      (*ys)[s.seq].insert((*ys)[s.seq].end(), y.begin() + begin,
                          y.begin() + end);
      ASSERT_NO_FATAL_FAILURE(each_sequence(
          s, std::vector<float>(x.begin() + begin, x.begin() + end)));
      row += s.n_tokens;
    }
  }
}

// Several sequences per Forward call, of different lengths, in any slot
// order: prefills of different lengths, decode of every sequence at once,
// mixed chunked prefill and decode. The batched run must equal each entry
// run alone (one Forward per sequence, same steps) and the reference of
// each sequence's whole history.
TEST_P(AttentionLayerTest, BatchEqualsSequencesAlone) {
  // Steps of {seq, n_tokens}; slot 4 is never used and must stay empty.
  const std::vector<std::vector<LayerSequence>> steps = {
      {{2, 11}, {0, 1}, {3, 6}},         // prefills of 11, 1 and 6
      {{0, 1}, {2, 1}, {3, 1}, {1, 4}},  // decode x3 plus a new prefill
      {{3, 1}, {1, 1}, {0, 1}, {2, 1}},  // decode of all four
      {{1, 5}, {2, 1}},                  // chunked prefill and decode
      {{0, 1}},
      {{2, 1}, {0, 1}, {1, 1}, {3, 1}},
  };
  const int64_t n_slots = 5, capacity = 20;
  const AttentionLayerConfig configs[] = {Config(64, 4), Config(64, 8, 2, 16),
                                          Config(96, 6, 1)};
  uint64_t seed = 4000;
  for (const AttentionLayerConfig& config : configs) {
    const std::string what = Describe(config);
    Model model(ShapeOf(config), "qkvo", seed);
    AttentionLayer layer;
    ASSERT_TRUE(model.Create(config, &layer).ok()) << what;
    const int64_t d = config.d_model;
    KvCache batched = MakeCache(layer.CacheConfig(n_slots, capacity));
    KvCache alone = MakeCache(layer.CacheConfig(n_slots, capacity));
    // Per slot: every token's x and the batched and alone outputs.
    std::vector<std::vector<float>> xs(n_slots), ys_batched(n_slots),
        ys_alone(n_slots);
    ASSERT_NO_FATAL_FAILURE(RunSteps(
        layer, batched, steps, d, seed + 100, what, &xs, &ys_batched,
        [&](const LayerSequence& s, const std::vector<float>& x_one) {
          std::vector<float> y_one;
          const Status one = RunLayer(&layer, &alone, {s}, x_one, &y_one);
          ASSERT_TRUE(one.ok()) << what << ": " << one.ToString();
          ys_alone[s.seq].insert(ys_alone[s.seq].end(), y_one.begin(),
                                 y_one.end());
        }));
    EXPECT_EQ(batched.length(4), 0) << what;
    for (int64_t seq = 0; seq < 4; ++seq) {
      const std::string how = what + ", seq " + std::to_string(seq);
      const Expected e = Reference(model, xs[seq], true, ScaleOf(config));
      ASSERT_EQ(batched.length(seq), e.n) << how;
      ASSERT_NO_FATAL_FAILURE(ExpectAgree(ys_batched[seq].data(), d,
                                          ys_alone[seq].data(), d, e.n, d, e, 0,
                                          how));
      ASSERT_NO_FATAL_FAILURE(
          ExpectRowsMatch(ys_batched[seq].data(), e.n, d, d, e, 0, how));
      ASSERT_NO_FATAL_FAILURE(ExpectCacheHolds(
          batched, seq, e, model.shape.kv_cols(), 0, how + ", batched"));
      ASSERT_NO_FATAL_FAILURE(ExpectCacheHolds(
          alone, seq, e, model.shape.kv_cols(), 0, how + ", alone"));
    }
    seed += 16;
  }
}

// ---------------------------------------------------------------------------
// Tensor parallelism.

// Shards [0, a), [a, b), [b, n_heads) on KV-group boundaries, each with its
// own cache: the sum of their outputs is the whole layer's, over a prefill
// and two decode steps; each shard caches its own KV heads; only shard 0 adds
// b_o (the others give the same bits with b_o null).
TEST_P(AttentionLayerTest, ShardsSumToWholeLayer) {
  struct Split {
    AttentionLayerConfig config;
    std::vector<int64_t> bounds;  // 0, a, ..., n_heads
  };
  const Split splits[] = {
      {Config(64, 4), {0, 1, 3, 4}},          // MHA, groups of 1
      {Config(96, 6, 3, 16), {0, 2, 4, 6}},   // GQA, groups of 2
      {Config(64, 12, 4, 8), {0, 3, 9, 12}},  // GQA, groups of 3
      {Config(64, 8, 2, 16), {0, 4, 8}},      // GQA, two shards
      {Config(64, 4, 1, 16), {0, 4}},         // MQA: one shard only
      {WithVariants(Config(96, 6, 3, 16), true, 16), {0, 2, 4, 6}},
      // Per-head ALiBi slopes and sink logits: each shard reads its heads'.
      {WithAttentionVariants(Config(64, 8, 4, 8), 6, 2.0f, true, true),
       {0, 2, 6, 8}},
  };
  uint64_t seed = 5000;
  for (const Split& split : splits) {
    const std::string what = Describe(split.config);
    const Shape shape = ShapeOf(split.config);
    Model model(shape, "qkvo", seed);
    AttentionLayer whole;
    ASSERT_TRUE(model.Create(split.config, &whole).ok()) << what;
    const size_t n_shards = split.bounds.size() - 1;
    std::vector<AttentionLayer> shards(n_shards), shards_no_b_o(n_shards);
    std::vector<KvCache> caches, caches_no_b_o;
    int64_t shard_weights = 0;
    for (size_t i = 0; i < n_shards; ++i) {
      AttentionLayerConfig config = split.config;
      config.head_begin = split.bounds[i];
      config.head_end = split.bounds[i + 1];
      const Status status = model.Create(config, &shards[i]);
      ASSERT_TRUE(status.ok()) << Describe(config) << ": " << status.ToString();
      ASSERT_TRUE(model.Create(config, &shards_no_b_o[i], true).ok());
      EXPECT_EQ(shards[i].config().head_begin, config.head_begin);
      EXPECT_EQ(shards[i].config().head_end, config.head_end);
      EXPECT_EQ(shards[i].local_heads(), config.head_end - config.head_begin);
      EXPECT_EQ(shards[i].local_kv_heads(),
                (config.head_end - config.head_begin) / shape.group());
      shard_weights += shards[i].n_weights();
      caches.push_back(MakeCache(shards[i].CacheConfig(1, 16)));
      caches_no_b_o.push_back(MakeCache(shards_no_b_o[i].CacheConfig(1, 16)));
      EXPECT_EQ(caches.back().n_kv_heads(), shards[i].local_kv_heads());
    }
    // Every parameter is in exactly one shard (b_o in shard 0's).
    EXPECT_EQ(shard_weights, whole.n_weights()) << what;
    KvCache whole_cache = MakeCache(whole.CacheConfig(1, 16));
    std::vector<float> history;
    for (const int64_t n : {9, 1, 1}) {
      const std::vector<float> x = test::RandomVector(
          n * shape.d_model, seed + 100 + n + history.size());
      history.insert(history.end(), x.begin(), x.end());
      const Expected e = Reference(model, history, true, ScaleOf(split.config));
      const int64_t row0 = e.n - n;
      std::vector<float> whole_y, sum(x.size(), 0.0f), y;
      ASSERT_TRUE(RunLayer(&whole, &whole_cache, {{0, n}}, x, &whole_y).ok());
      for (size_t i = 0; i < n_shards; ++i) {
        const Status status = RunLayer(&shards[i], &caches[i], {{0, n}}, x, &y);
        ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
        for (size_t j = 0; j < y.size(); ++j) sum[j] += y[j];
        std::vector<float> y_no_b_o;
        ASSERT_TRUE(RunLayer(&shards_no_b_o[i], &caches_no_b_o[i], {{0, n}}, x,
                             &y_no_b_o)
                        .ok());
        if (i > 0) {
          EXPECT_EQ(y, y_no_b_o) << what << ": shard " << i << " added b_o";
        } else {
          // Shard 0 adds b_o: with and without differ by it (to kTight of
          // the bound, as the two may round differently).
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t j = 0; j < shape.d_model; ++j) {
              const size_t k = static_cast<size_t>(t * shape.d_model + j);
              ASSERT_LE(std::fabs(static_cast<double>(y[k]) - y_no_b_o[k] -
                                  model.b_o[j]),
                        kTight * e.y_tol[(row0 + t) * shape.d_model + j])
                  << what << ": shard 0 must add b_o, row " << t;
            }
          }
        }
      }
      ASSERT_NO_FATAL_FAILURE(ExpectAgree(sum.data(), shape.d_model,
                                          whole_y.data(), shape.d_model, n,
                                          shape.d_model, e, row0, what));
      ASSERT_NO_FATAL_FAILURE(ExpectRowsMatch(sum.data(), n, shape.d_model,
                                              shape.d_model, e, row0,
                                              what + ", shard sum"));
      // Each shard caches its own KV heads.
      for (size_t i = 0; i < n_shards; ++i) {
        ASSERT_NO_FATAL_FAILURE(ExpectCacheHolds(
            caches[i], 0, e, shape.kv_cols(), split.bounds[i] / shape.group(),
            what + ", shard " + std::to_string(i)));
      }
    }
    seed += 16;
  }
}

// ---------------------------------------------------------------------------
// Sizes.

// PackedB::bytes() of op(B) [k, n] stored as dtype on the active target, from
// the rule of matmul.h: k rows of whole panels of the stored type, rounded up
// to 64 bytes, plus for int8 a float scale per column of the panels.
size_t PackedBytes(int64_t k, int64_t n, WeightDtype dtype) {
  const float one = 1.0f;
  PackedB probe;  // for the active target's panel width
  EXPECT_TRUE(
      PackedB::Pack(MatrixView<const float>(&one, 1, 1), Transpose::kNo, &probe)
          .ok());
  const int64_t panel = probe.panel_width();
  const size_t cols = static_cast<size_t>((n + panel - 1) / panel * panel);
  const size_t bytes =
      (static_cast<size_t>(k) * cols * WeightDtypeSize(dtype) + 63) / 64 * 64;
  return bytes + (dtype == WeightDtype::kInt8 ? cols * sizeof(float) : 0);
}

TEST_P(AttentionLayerTest, SizesAndConfig) {
  struct Case {
    AttentionLayerConfig config;
    const char* biases;
  };
  AttentionLayerConfig shard = Config(96, 6, 3, 20);
  shard.head_begin = 2;
  shard.head_end = 6;
  AttentionLayerConfig shard0 = shard;
  shard0.head_begin = 0;
  shard0.head_end = 2;
  const Case cases[] = {
      {Config(64, 4), ""},
      {Config(64, 4), "qkvo"},
      {Config(96, 3), ""},
      {Config(64, 8, 2), ""},
      {Config(64, 8, 1), "qkvo"},
      {Config(64, 4, 4, 24), ""},
      {Config(80, 2, 0, 20), "kv"},
      {Config(64, 8, 2), "qo"},
      {shard, "qkvo"},
      {shard0, "qkvo"},
      {shard, "o"},
  };
  uint64_t seed = 6000;
  for (const Case& c : cases) {
    const std::string biases = c.biases;
    const std::string what = Describe(c.config) + ", biases " + biases;
    const Shape s = ShapeOf(c.config);
    Model model(s, biases, seed++);
    AttentionLayer layer;
    ASSERT_TRUE(model.Create(c.config, &layer).ok()) << what;
    const int64_t begin = c.config.head_begin;
    const int64_t end = c.config.head_end == 0 ? s.n_heads : c.config.head_end;
    const int64_t lq = (end - begin) * s.head_dim;
    const int64_t lkv = (end - begin) / s.group() * s.head_dim;
    // The resolved config.
    const AttentionLayerConfig& got = layer.config();
    EXPECT_EQ(got.d_model, s.d_model) << what;
    EXPECT_EQ(got.n_heads, s.n_heads) << what;
    EXPECT_EQ(got.n_kv_heads, s.n_kv_heads) << what;
    EXPECT_EQ(got.head_dim, s.head_dim) << what;
    EXPECT_EQ(got.attention.mask, c.config.attention.mask) << what;
    EXPECT_FLOAT_EQ(got.attention.scale, static_cast<float>(ScaleOf(c.config)))
        << what;
    EXPECT_EQ(got.head_begin, begin) << what;
    EXPECT_EQ(got.head_end, end) << what;
    EXPECT_EQ(layer.local_heads(), end - begin) << what;
    EXPECT_EQ(layer.local_kv_heads(), (end - begin) / s.group()) << what;
    // Weights: W_Q, W_K, W_V columns and W_O rows of this shard, plus its
    // parts of the biases given (b_o only where it is added, shard 0).
    int64_t n_weights = s.d_model * (lq + 2 * lkv) + lq * s.d_model;
    if (!model.b_q.empty()) n_weights += lq;
    if (!model.b_k.empty()) n_weights += lkv;
    if (!model.b_v.empty()) n_weights += lkv;
    if (!model.b_o.empty() && begin == 0) n_weights += s.d_model;
    EXPECT_EQ(layer.n_weights(), n_weights) << what;
    if (s.n_heads == s.n_kv_heads && s.q_cols() == s.d_model &&
        biases.empty() && end - begin == s.n_heads) {
      EXPECT_EQ(layer.n_weights(), 4 * s.d_model * s.d_model) << what;
    }
    // The weights' bytes as stored, for each WeightDtype (bf16 with the bf16
    // compute mode); config() says how.
    for (const WeightDtype dtype :
         {WeightDtype::kFloat32, WeightDtype::kBFloat16, WeightDtype::kInt8}) {
      AttentionLayerConfig stored = c.config;
      stored.weight_dtype = dtype;
      if (dtype == WeightDtype::kBFloat16) {
        stored.projection_compute = MatmulCompute::kBFloat16;
      }
      AttentionLayer stored_layer;
      ASSERT_TRUE(model.Create(stored, &stored_layer).ok()) << what;
      EXPECT_EQ(stored_layer.config().weight_dtype, dtype) << what;
      EXPECT_EQ(stored_layer.config().projection_compute,
                stored.projection_compute)
          << what;
      EXPECT_EQ(stored_layer.packed_bytes(),
                PackedBytes(s.d_model, lq + 2 * lkv, dtype) +
                    PackedBytes(lq, s.d_model, dtype))
          << what << ", dtype " << static_cast<int>(dtype);
    }
    // The cache: local KV heads, head_dim, rows padded to 16 floats.
    const KvCacheConfig cache_config = layer.CacheConfig(3, 17);
    EXPECT_EQ(cache_config.n_sequences, 3) << what;
    EXPECT_EQ(cache_config.n_kv_heads, layer.local_kv_heads()) << what;
    EXPECT_EQ(cache_config.head_dim, s.head_dim) << what;
    EXPECT_EQ(cache_config.capacity, 17) << what;
    EXPECT_EQ(cache_config.dtype, KvDtype::kFloat32) << what;
    const int64_t row_stride = (s.head_dim + 15) / 16 * 16;
    EXPECT_EQ(layer.cache_bytes_per_token(),
              static_cast<size_t>(2 * layer.local_kv_heads() * row_stride) *
                  sizeof(float))
        << what;
    const KvCache cache = MakeCache(layer.CacheConfig(3, 17));
    EXPECT_EQ(layer.cache_bytes_per_token(), cache.bytes_per_token()) << what;
  }
  // GQA and MQA hold fewer weights than MHA of the same d_model and heads.
  AttentionLayer mha, gqa, mqa;
  Model mha_model(ShapeOf(Config(64, 8)), "", 1);
  Model gqa_model(ShapeOf(Config(64, 8, 2)), "", 2);
  Model mqa_model(ShapeOf(Config(64, 8, 1)), "", 3);
  ASSERT_TRUE(mha_model.Create(Config(64, 8), &mha).ok());
  ASSERT_TRUE(gqa_model.Create(Config(64, 8, 2), &gqa).ok());
  ASSERT_TRUE(mqa_model.Create(Config(64, 8, 1), &mqa).ok());
  EXPECT_EQ(mha.n_weights(), 4 * 64 * 64);
  EXPECT_EQ(gqa.n_weights(), 64 * (64 + 2 * 16) + 64 * 64);
  EXPECT_EQ(mqa.n_weights(), 64 * (64 + 2 * 8) + 64 * 64);
  // Sink logits are parameters too, one per head, each in its head's shard.
  std::vector<float> sinks(8, 0.5f);
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 8}, {4, 8}}) {
    AttentionLayerConfig plain = Config(64, 8, 2);
    plain.head_begin = begin;
    plain.head_end = end;
    AttentionLayerConfig with_sinks = plain;
    with_sinks.attention.sink_logits = sinks.data();
    AttentionLayer plain_layer, sinks_layer;
    ASSERT_TRUE(gqa_model.Create(plain, &plain_layer).ok());
    ASSERT_TRUE(gqa_model.Create(with_sinks, &sinks_layer).ok());
    EXPECT_EQ(sinks_layer.n_weights(), plain_layer.n_weights() + end - begin)
        << "heads [" << begin << ", " << end << ")";
  }
  EXPECT_LT(mqa.cache_bytes_per_token(), gqa.cache_bytes_per_token());
  EXPECT_LT(gqa.cache_bytes_per_token(), mha.cache_bytes_per_token());
}

// ---------------------------------------------------------------------------
// Allocation.

using test::AllocationCount;
using test::Allocations;

// Calls Forward and returns how many allocations it made.
AllocationCount CountForward(AttentionLayer* layer, KvCache* cache,
                             const std::vector<LayerSequence>& sequences,
                             const std::vector<float>& x, std::vector<float>* y,
                             Status* status) {
  const int64_t d = layer->config().d_model;
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  const MatrixView<const float> x_view(x.data(), rows, d);
  const MatrixView<float> y_view(y->data(), rows, d);
  const AllocationCount before = Allocations();
  *status =
      layer->Forward(cache, sequences.data(),
                     static_cast<int64_t>(sequences.size()), x_view, y_view);
  return Allocations() - before;
}

// One cache dtype of DecodeAllocatesNothingWhenWarm.
void DecodeAllocatesNothing(KvDtype dtype) {
  const AttentionLayerConfig config = Config(64, 8, 2, 16);
  Model model(ShapeOf(config), "qkvo", 7000);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(config, &layer).ok());
  KvCache cache = MakeCache(layer.CacheConfig(4, 64, dtype));
  const int64_t d = config.d_model;
  // Warm-up: prefills of the four sequences in one call (20 rows), then a
  // first decode step of all four.
  const std::vector<LayerSequence> prefill = {{0, 3}, {1, 9}, {2, 1}, {3, 7}};
  const std::vector<LayerSequence> decode = {{0, 1}, {1, 1}, {2, 1}, {3, 1}};
  std::vector<float> x = test::RandomVector(20 * d, 7001);
  std::vector<float> y(20 * d, kSentinel);
  test::StartAllThreads();
  Status status;
  CountForward(&layer, &cache, prefill, x, &y, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  std::vector<float> x1 = test::RandomVector(4 * d, 7002);
  std::vector<float> y1(4 * d, kSentinel);
  CountForward(&layer, &cache, decode, x1, &y1, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  // The second identical decode step.
  x1 = test::RandomVector(4 * d, 7003);
  AllocationCount count =
      CountForward(&layer, &cache, decode, x1, &y1, &status);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(count.operator_new, 0) << "operator new calls in a warm decode";
#if defined(HEADWAY_TEST_COUNTS_MALLOC)
  EXPECT_EQ(count.malloc, 0) << "malloc calls in a warm decode (operator "
                                "new above counts its own too)";
#endif
  // Smaller calls: decode of two sequences, a chunked prefill of 8 rows.
  const std::vector<LayerSequence> smaller[] = {{{3, 1}, {1, 1}},
                                                {{0, 5}, {2, 3}}};
  for (const std::vector<LayerSequence>& sequences : smaller) {
    int64_t rows = 0;
    for (const LayerSequence& s : sequences) rows += s.n_tokens;
    const std::vector<float> xs = test::RandomVector(rows * d, 7004 + rows);
    std::vector<float> ys(rows * d);
    count = CountForward(&layer, &cache, sequences, xs, &ys, &status);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(count.operator_new, 0) << rows << " rows";
#if defined(HEADWAY_TEST_COUNTS_MALLOC)
    EXPECT_EQ(count.malloc, 0) << rows << " rows";
#endif
  }
}

// After a first call of a given size, decode (and any call no bigger) makes
// no allocation at all, with a cache of any dtype: no operator new, and on
// glibc no malloc either (which catches hwy::AllocateAligned and std::vector
// growth alike). TBB's task memory is pooled per thread, so a warm parallel_for
// allocates nothing either once TBB has created its worker threads (the
// warm-up's StartAllThreads): both counters read zero on every target. Should
// TBB ever allocate there, the malloc count (not the operator new one) would
// show it, and the operator new count alone would still hold the
// implementation to account.
TEST_P(AttentionLayerTest, DecodeAllocatesNothingWhenWarm) {
  {
    // The counters see allocations (volatile: none may be optimised away).
    const AllocationCount before = Allocations();
    int* volatile counted = new int(1);
    delete counted;
    EXPECT_GT(Allocations().operator_new, before.operator_new);
#if defined(HEADWAY_TEST_COUNTS_MALLOC)
    void* volatile block = std::malloc(64);
    std::free(block);
    EXPECT_GT(Allocations().malloc, before.malloc);
#endif
  }
  for (const KvDtype dtype : kAllDtypes) {
    SCOPED_TRACE(internal::KvDtypeName(dtype));
    ASSERT_NO_FATAL_FAILURE(DecodeAllocatesNothing(dtype));
  }
}

// ReleaseScratch frees what scratch_bytes() reports, and later calls give
// the same bits as on a layer that kept its scratch (plain and ring caches).
TEST_P(AttentionLayerTest, ReleaseScratchFreesIt) {
  AttentionLayer empty;
  EXPECT_EQ(empty.scratch_bytes(), 0u);
  EXPECT_EQ(empty.ReleaseScratch(), 0u);
  for (const int64_t window : {0, 8}) {
    AttentionLayerConfig config = Config(64, 8, 2, 16);
    config.attention.window = window;
    const std::string what = Describe(config);
    Model model(ShapeOf(config), "qkvo", 7100);
    AttentionLayer kept, released;
    ASSERT_TRUE(model.Create(config, &kept).ok()) << what;
    ASSERT_TRUE(model.Create(config, &released).ok()) << what;
    const KvCacheConfig cache_config =
        window > 0 ? kept.RingCacheConfig(1) : kept.CacheConfig(1, 64);
    KvCache kept_cache = MakeCache(cache_config);
    KvCache released_cache = MakeCache(cache_config);
    const int64_t d = config.d_model;
    // A prefill of 40 tokens, then decode steps, releasing before each.
    for (const int64_t n : {40, 1, 1}) {
      const std::vector<LayerSequence> seqs = {{0, n}};
      const std::vector<float> x = test::RandomVector(n * d, 7101 + n);
      std::vector<float> y_kept(n * d), y_released(n * d);
      Status status;
      const size_t held = released.scratch_bytes();
      EXPECT_EQ(released.ReleaseScratch(), held) << what;
      EXPECT_EQ(released.scratch_bytes(), 0u) << what;
      CountForward(&kept, &kept_cache, seqs, x, &y_kept, &status);
      ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
      CountForward(&released, &released_cache, seqs, x, &y_released, &status);
      ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
      EXPECT_GT(released.scratch_bytes(), 0u) << what;
      EXPECT_EQ(0, std::memcmp(y_kept.data(), y_released.data(),
                               y_kept.size() * sizeof(float)))
          << what << ", " << n << " tokens";
    }
    // After the 40-token prefill the kept layer holds more than a decode's.
    EXPECT_GT(kept.scratch_bytes(), released.scratch_bytes()) << what;
  }
}

// A NaN in the last token's x gives NaN in its Q, K and V rows: under the
// causal mask no earlier token sees that key, so their rows are those of a
// prefill without it, and only the last row is NaN (wide and narrow tiles).
TEST_P(AttentionLayerTest, NaNTokenHiddenFromEarlierTokens) {
  for (const AttentionLayerConfig& config :
       {Config(64, 4), Config(64, 8, 2), Config(16, 1, 1, 4)}) {
    for (const int64_t n : {6, 40}) {
      const std::string what = Describe(config) + ", n " + std::to_string(n);
      Model model(ShapeOf(config), "qkvo", 77);
      AttentionLayer layer;
      ASSERT_TRUE(model.Create(config, &layer).ok()) << what;
      KvCache cache = MakeCache(layer.CacheConfig(1, n));
      const int64_t d = config.d_model;
      std::vector<float> x = test::RandomVector(n * d, 78);
      x[(n - 1) * d + d / 2] = kNaN;
      std::vector<float> y(n * d, kSentinel);
      const LayerSequence sequence{0, n};
      ASSERT_TRUE(layer
                      .Forward(&cache, &sequence, 1,
                               MatrixView<const float>(x.data(), n, d),
                               MatrixView<float>(y.data(), n, d))
                      .ok())
          << what;
      const std::vector<float> before(x.begin(), x.end() - d);
      const Expected e = Reference(model, before, true, ScaleOf(config));
      ASSERT_NO_FATAL_FAILURE(
          ExpectRowsMatch(y.data(), n - 1, d, d, e, 0, what));
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_TRUE(std::isnan(y[(n - 1) * d + j])) << what << ", col " << j;
      }
    }
  }
}

// Every seq's rows of every head (their stored bytes and int8 scales),
// capacity and padding included (rows past the length read through
// PendingRows, which writes nothing), and lengths.
struct CacheSnapshot {
  std::vector<int64_t> lengths;
  std::vector<char> bytes;

  bool operator==(const CacheSnapshot& other) const {
    return lengths == other.lengths && bytes == other.bytes;
  }
};

CacheSnapshot Snapshot(KvCache* cache) {
  CacheSnapshot snap;
  const size_t element = KvDtypeSize(cache->config().dtype);
  const size_t width = static_cast<size_t>(cache->row_stride()) * element;
  auto add = [&](const KvView& view) {
    const char* data = static_cast<const char*>(view.data);
    for (int64_t r = 0; r < view.rows; ++r) {
      const char* row = data + static_cast<size_t>(r * view.stride) * element;
      snap.bytes.insert(snap.bytes.end(), row, row + width);
    }
    if (view.scales != nullptr) {
      const char* scales = reinterpret_cast<const char*>(view.scales);
      snap.bytes.insert(snap.bytes.end(), scales,
                        scales + view.rows * sizeof(float));
    }
  };
  for (int64_t seq = 0; seq < cache->n_sequences(); ++seq) {
    const int64_t length = cache->length(seq);
    snap.lengths.push_back(length);
    for (int64_t g = 0; g < cache->n_kv_heads(); ++g) {
      add(cache->Keys(seq, g));
      add(cache->Values(seq, g));
      if (length < cache->capacity()) {
        KvMutableView k, v;
        EXPECT_TRUE(
            cache->PendingRows(seq, g, cache->capacity() - length, &k, &v)
                .ok());
        add(k);
        add(v);
      }
    }
  }
  return snap;
}

// ---------------------------------------------------------------------------
// Caches of stored types: bf16, f16 and int8 K and V.
//
// The layer rounds its float32 projection (bias added first) with StoreRow;
// that projection is within step 1's bound tol of the float64 one, want. So
// a stored element must be the rounding of some value in [want - tol, want +
// tol] (plus the reference's own float32 rounding, u |want|): rounding is
// monotone, so it lies between the roundings of the two ends. Where tol is
// below half a stored step (tol <= 2^-17 of the terms' magnitudes, a bf16
// step 2^-8 of the value) that allows the rounding of want itself, or one
// step off where a rounding boundary lies within tol of want; only values
// that cancel to far below their terms' magnitudes get a wider range.

// Checks stored row `got` (scale: its int8 scale) against the float64
// projection want [hd] with bounds tol [hd], as above.
template <class T>
void ExpectStoredRow(const T* got, float scale, const double* want,
                     const double* tol, int64_t hd, const std::string& what) {
  if constexpr (std::is_same_v<T, float>) {
    (void)scale;
    for (int64_t p = 0; p < hd; ++p) {
      ASSERT_LE(std::fabs(got[p] - want[p]), tol[p]) << what << " col " << p;
    }
  } else if constexpr (internal::kKvScaled<T>) {
    // The scale: max |.| / 127 of the row, whose max moves by at most the
    // largest tol.
    double max_abs = 0.0, max_tol = 0.0;
    for (int64_t p = 0; p < hd; ++p) {
      max_abs = std::max(max_abs, std::fabs(want[p]));
      max_tol = std::max(max_tol, tol[p] + kU * std::fabs(want[p]));
    }
    ASSERT_LE(std::fabs(scale - max_abs / 127), max_tol / 127 + kU * scale)
        << what << ": scale";
    // q = want / scale rounded to even and clamped, for the quotients the
    // layer may have divided (its division adds at most 127 u).
    auto quantize = [](double ratio) {
      return std::fmin(std::fmax(std::nearbyint(ratio), -127.0), 127.0);
    };
    for (int64_t p = 0; p < hd; ++p) {
      const double reach =
          (tol[p] + kU * std::fabs(want[p])) / scale + 127 * kU;
      const double ratio = want[p] / scale;
      ASSERT_GE(got[p], quantize(ratio - reach)) << what << " col " << p;
      ASSERT_LE(got[p], quantize(ratio + reach)) << what << " col " << p;
    }
  } else {
    (void)scale;
    auto rounded = [](double x) {
      return static_cast<double>(internal::FloatFrom(
          internal::StoredFrom(static_cast<float>(x), T{})));
    };
    for (int64_t p = 0; p < hd; ++p) {
      const double reach = tol[p] + kU * std::fabs(want[p]);
      const double value = internal::FloatFrom(got[p]);
      ASSERT_GE(value, rounded(want[p] - reach))
          << what << " col " << p << ": want " << want[p] << " +- " << reach;
      ASSERT_LE(value, rounded(want[p] + reach))
          << what << " col " << p << ": want " << want[p] << " +- " << reach;
    }
  }
}

// The stored rows of `seq` match e's K and V (ExpectStoredRow) for KV heads
// [g0, g0 + cache.n_kv_heads()), their padding is zero, and *k and *v get
// their dequantized values [length, kv_cols] (LoadKvRows).
void ExpectStoredCache(const KvCache& cache, int64_t seq, const Expected& e,
                       int64_t kv_cols, int64_t g0, const std::string& what,
                       std::vector<double>* k, std::vector<double>* v) {
  const int64_t hd = cache.head_dim();
  const KvDtype dtype = cache.config().dtype;
  const size_t bytes = KvDtypeSize(dtype);
  ASSERT_EQ(cache.length(seq), e.n) << what;
  k->assign(static_cast<size_t>(e.n * kv_cols), 0.0);
  v->assign(static_cast<size_t>(e.n * kv_cols), 0.0);
  for (int64_t g = 0; g < cache.n_kv_heads(); ++g) {
    for (const bool is_k : {true, false}) {
      const KvView view = is_k ? cache.Keys(seq, g) : cache.Values(seq, g);
      ASSERT_EQ(view.dtype, dtype) << what;
      const std::string name = what + (is_k ? ": K" : ": V") + " of seq " +
                               std::to_string(seq) + " head " +
                               std::to_string(g);
      const std::vector<double>& want = is_k ? e.k : e.v;
      const std::vector<double>& tol = is_k ? e.k_tol : e.v_tol;
      for (int64_t s = 0; s < e.n; ++s) {
        const char* row = static_cast<const char*>(view.data) +
                          static_cast<size_t>(s * view.stride) * bytes;
        const size_t i = static_cast<size_t>(s * kv_cols + (g0 + g) * hd);
        const float scale = view.scales != nullptr ? view.scales[s] : 0.0f;
        internal::VisitKvDtype(dtype, [&](auto tag) {
          using T = decltype(tag);
          ExpectStoredRow(reinterpret_cast<const T*>(row), scale, &want[i],
                          &tol[i], hd, name + " row " + std::to_string(s));
        });
        if (::testing::Test::HasFatalFailure()) return;
        for (size_t b = static_cast<size_t>(hd) * bytes;
             b < static_cast<size_t>(view.stride) * bytes; ++b) {
          ASSERT_EQ(row[b], 0) << name << " row " << s << ": padding";
        }
      }
      std::vector<float> rows(static_cast<size_t>(e.n * hd));
      const Status loaded =
          LoadKvRows(view, MatrixView<float>(rows.data(), e.n, hd));
      ASSERT_TRUE(loaded.ok()) << name << ": " << loaded.ToString();
      std::vector<double>& out = is_k ? *k : *v;
      for (int64_t s = 0; s < e.n; ++s) {
        for (int64_t p = 0; p < hd; ++p) {
          out[s * kv_cols + (g0 + g) * hd + p] = rows[s * hd + p];
        }
      }
    }
  }
}

// Steps of several sequences (prefills, chunked prefill, decode, mixed) into
// a cache of each dtype: every sequence's stored K and V rows match the
// rounded reference projection (ExpectStoredCache), and its outputs the
// float64 layer over its dequantized K and V to the usual bound. Causal
// masks only: a token's output then depends on no later step.
void RunStoredSteps(const AttentionLayerConfig& config,
                    const std::vector<std::vector<LayerSequence>>& steps,
                    int64_t n_slots, int64_t capacity, uint64_t seed,
                    std::initializer_list<const char*> bias_sets = {"", "qkvo"},
                    std::vector<KvDtype> dtypes = {std::begin(kAllDtypes),
                                                   std::end(kAllDtypes)}) {
  for (const KvDtype dtype : dtypes) {
    for (const char* biases : bias_sets) {
      const std::string what = Describe(config) + ", " +
                               internal::KvDtypeName(dtype) + ", biases \"" +
                               biases + "\"";
      Model model(ShapeOf(config), biases, seed);
      AttentionLayer layer;
      ASSERT_TRUE(model.Create(config, &layer).ok()) << what;
      const int64_t d = config.d_model;
      KvCache cache = MakeCache(layer.CacheConfig(n_slots, capacity, dtype));
      ASSERT_EQ(cache.config().dtype, dtype) << what;
      std::vector<std::vector<float>> xs(n_slots), ys(n_slots);
      ASSERT_NO_FATAL_FAILURE(
          RunSteps(layer, cache, steps, d, seed + 100, what, &xs, &ys,
                   [](const LayerSequence&, const std::vector<float>&) {}));
      const bool causal = config.attention.mask == AttentionMask::kCausal;
      for (int64_t seq = 0; seq < n_slots; ++seq) {
        if (xs[seq].empty()) continue;
        const std::string how = what + ", seq " + std::to_string(seq);
        const Expected e = Reference(model, xs[seq], causal, ScaleOf(config),
                                     nullptr, nullptr, /*kv_only=*/true);
        std::vector<double> k, v;
        ASSERT_NO_FATAL_FAILURE(ExpectStoredCache(
            cache, seq, e, model.shape.kv_cols(), 0, how, &k, &v));
        const Expected stored =
            Reference(model, xs[seq], causal, ScaleOf(config), &k, &v);
        ASSERT_NO_FATAL_FAILURE(
            ExpectRowsMatch(ys[seq].data(), e.n, d, d, stored, 0, how));
      }
      seed += 16;
    }
  }
}

// The same calls on 1, 2 and 7 threads (task arenas of that size) give the
// same bits, outputs and stored K, V and scales, for every dtype: a prefill
// of several chunks (300 tokens of two sequences), then decode.
TEST_P(AttentionLayerTest, StoredKvBitIdenticalOnAnyThreadCount) {
  const AttentionLayerConfig config = Config(64, 8, 4, 72);
  Model model(ShapeOf(config), "qkvo", 7500);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(config, &layer).ok());
  const std::vector<std::vector<LayerSequence>> steps = {{{1, 200}, {0, 100}},
                                                         {{0, 1}, {1, 1}}};
  for (const KvDtype dtype : kAllDtypes) {
    std::vector<float> first_y;
    CacheSnapshot first_cache;
    for (const int threads : {1, 2, 7}) {
      const std::string what = std::string(internal::KvDtypeName(dtype)) +
                               ", " + std::to_string(threads) + " threads";
      KvCache cache = MakeCache(layer.CacheConfig(2, 301, dtype));
      std::vector<float> ys;
      uint64_t seed = 7600;
      for (const std::vector<LayerSequence>& step : steps) {
        int64_t rows = 0;
        for (const LayerSequence& s : step) rows += s.n_tokens;
        const std::vector<float> x =
            test::RandomVector(rows * config.d_model, seed++);
        std::vector<float> y;
        Status status;
        tbb::task_arena arena(threads);
        arena.execute([&] { status = RunLayer(&layer, &cache, step, x, &y); });
        ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
        ys.insert(ys.end(), y.begin(), y.end());
      }
      const CacheSnapshot snap = Snapshot(&cache);
      if (threads == 1) {
        first_y = ys;
        first_cache = snap;
        continue;
      }
      EXPECT_EQ(
          0, std::memcmp(ys.data(), first_y.data(), ys.size() * sizeof(float)))
          << what << ": outputs";
      EXPECT_TRUE(snap == first_cache) << what << ": cache";
    }
  }
}

// Steps of {seq, n_tokens} over 4 slots of capacity 16: prefill, chunked
// prefill, decode and several sequences per call.
std::vector<std::vector<LayerSequence>> MixedSteps() {
  return {
      {{2, 11}, {0, 1}, {3, 6}},         // prefills of 11, 1 and 6
      {{0, 1}, {2, 1}, {3, 1}, {1, 4}},  // decode x3 plus a new prefill
      {{1, 5}, {2, 1}},                  // chunked prefill and decode
      {{2, 1}, {0, 1}, {1, 1}, {3, 1}},
  };
}

// MHA, GQA, MQA and an odd head_dim, MixedSteps.
TEST_P(AttentionLayerTest, StoredKvMatchesReference) {
  const AttentionLayerConfig configs[] = {
      Config(64, 4),
      Config(64, 8, 2, 16),
      Config(96, 6, 1),
      Config(60, 3, 3, 20),
      WithVariants(Config(64, 8, 2, 16), true, 12, RopeLayout::kHalves,
                   RopeScaling::kLlama3),
      WithAttentionVariants(Config(64, 8, 4, 16), 4, 2.0f, true, true)};
  uint64_t seed = 5000;
  for (const AttentionLayerConfig& config : configs) {
    ASSERT_NO_FATAL_FAILURE(RunStoredSteps(config, MixedSteps(), 4, 16, seed));
    seed += 1000;
  }
}

// Several chunks of the stored projection (LayerChunks): a prefill of 300
// tokens (256 + 44), K and V wider than one chunk's columns, head_dim 72 (not
// a multiple of any panel width), d_model 520 (two K blocks), then decode.
// The types that convert (float32 projects straight into the cache). Then
// bf16 weights in the bf16 compute mode into bf16 and int8 caches: on AMX
// tiles where they run, each chunk's rows of x prepared once for all its
// GEMMs (8 and 2 blocks of 32 rows, the last of 12).
TEST_P(AttentionLayerTest, StoredKvInChunks) {
  AttentionLayerConfig config = Config(520, 8, 4, 72);
  ASSERT_NO_FATAL_FAILURE(
      RunStoredSteps(config, {{{0, 300}}, {{0, 1}}}, 1, 301, 7000, {"qkvo"},
                     {KvDtype::kBFloat16, KvDtype::kFloat16, KvDtype::kInt8}));
  config.weight_dtype = WeightDtype::kBFloat16;
  config.projection_compute = MatmulCompute::kBFloat16;
  ASSERT_NO_FATAL_FAILURE(RunStoredSteps(config, {{{0, 300}}, {{0, 1}}}, 1, 301,
                                         7100, {"qkvo"},
                                         {KvDtype::kBFloat16, KvDtype::kInt8}));
}

// ---------------------------------------------------------------------------
// Weights stored as bf16 or int8, and the bf16 compute mode.

// Layers whose config has weight_dtype and projection_compute, against the
// float64 layer over the weights as stored (the top of this file): MHA, GQA,
// and GQA with QK-norm and RoPE, through one-shot prefills (ParitySweep),
// prefill then decode steps (CheckPrefillThenDecode), and MixedSteps into
// bf16 and int8 caches (whose projection reads the weights' panels in chunks:
// ProjectStoredKv).
void StoredWeightsSweep(WeightDtype dtype, MatmulCompute compute,
                        uint64_t seed) {
  std::vector<AttentionLayerConfig> configs = {
      Config(64, 4), Config(64, 8, 2, 16),
      WithVariants(Config(96, 6, 2, 16), true, 16)};
  for (AttentionLayerConfig& config : configs) {
    config.weight_dtype = dtype;
    config.projection_compute = compute;
  }
  ASSERT_NO_FATAL_FAILURE(ParitySweep(configs, {1, 7, 33}, seed));
  for (const AttentionLayerConfig& config : configs) {
    seed += 100;
    ASSERT_NO_FATAL_FAILURE(CheckPrefillThenDecode(config, "qkvo", seed));
  }
  ASSERT_NO_FATAL_FAILURE(RunStoredSteps(configs[1], MixedSteps(), 4, 16,
                                         seed + 100, {"qkvo"},
                                         {KvDtype::kBFloat16, KvDtype::kInt8}));
}

// StoredWeightsSweep of bf16 and int8 weights in float32 compute.
TEST_P(AttentionLayerTest, StoredWeightsMatchReference) {
  ASSERT_NO_FATAL_FAILURE(StoredWeightsSweep(
      WeightDtype::kBFloat16, MatmulCompute::kFloat32, /*seed=*/10000));
  ASSERT_NO_FATAL_FAILURE(StoredWeightsSweep(
      WeightDtype::kInt8, MatmulCompute::kFloat32, /*seed=*/11000));
}

// bf16 and int8 weights in the bf16 compute mode (AMX tiles for 33 tokens
// where AmxBFloat16Active, else the kernel NativeBFloat16Active picks): the
// reference rounds x to bf16 too, and y's bound has o's rounding (the top of
// this file).
TEST_P(AttentionLayerTest, Bf16ComputeMatchesReference) {
  ASSERT_NO_FATAL_FAILURE(StoredWeightsSweep(
      WeightDtype::kBFloat16, MatmulCompute::kBFloat16, /*seed=*/12000));
  ASSERT_NO_FATAL_FAILURE(StoredWeightsSweep(
      WeightDtype::kInt8, MatmulCompute::kBFloat16, /*seed=*/13000));
}

HEADWAY_INSTANTIATE_TARGET_TEST(AttentionLayerTest);

// ---------------------------------------------------------------------------
// Errors.

TEST(AttentionLayerErrors, CreateRejectsBadConfigAndWeights) {
  const AttentionLayerConfig good = Config(32, 4, 2);  // head_dim 8
  Model model(ShapeOf(good), "qkvo", 8000);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(good, &layer).ok());
  // The layer's output for one input, to show that failed Creates into it
  // leave it as it was.
  const std::vector<float> x = test::RandomVector(3 * 32, 8001);
  std::vector<float> y_before;
  {
    KvCache cache = MakeCache(layer.CacheConfig(1, 3));
    ASSERT_TRUE(RunLayer(&layer, &cache, {{0, 3}}, x, &y_before).ok());
  }

  struct Bad {
    std::vector<std::string> expect;  // substrings of the message
    StatusCode code;
    AttentionLayerConfig config;
    AttentionLayerWeights weights;
    bool null_out = false;
  };
  AttentionLayerWeights weights;
  weights.w_q = MatrixView<const float>(model.w_q.data(), 32, 32);
  weights.w_k = MatrixView<const float>(model.w_k.data(), 32, 16);
  weights.w_v = MatrixView<const float>(model.w_v.data(), 32, 16);
  weights.w_o = MatrixView<const float>(model.w_o.data(), 32, 32);
  weights.b_q = model.b_q.data();
  weights.b_k = model.b_k.data();
  weights.b_v = model.b_v.data();
  weights.b_o = model.b_o.data();
  std::vector<Bad> cases;
  auto add = [&](std::vector<std::string> expect, StatusCode code, auto edit) {
    Bad bad{std::move(expect), code, good, weights};
    edit(bad);
    cases.push_back(bad);
  };
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  add({"out"}, kInvalid, [](Bad& b) { b.null_out = true; });
  add({"d_model"}, kInvalid, [](Bad& b) { b.config.d_model = 0; });
  add({"n_heads"}, kInvalid, [](Bad& b) { b.config.n_heads = 0; });
  add({"n_kv_heads"}, kInvalid, [](Bad& b) { b.config.n_kv_heads = -1; });
  add({"n_kv_heads", "3"}, kInvalid, [](Bad& b) { b.config.n_kv_heads = 3; });
  add({"n_kv_heads", "8"}, kInvalid, [](Bad& b) { b.config.n_kv_heads = 8; });
  add({"head_dim"}, kInvalid, [](Bad& b) { b.config.head_dim = -1; });
  add({"d_model", "30"}, kInvalid, [](Bad& b) { b.config.d_model = 30; });
  add({"head_begin"}, kInvalid, [](Bad& b) {
    b.config.head_begin = 1;  // not a multiple of the group (2)
    b.config.head_end = 4;
  });
  add({"head_end"}, kInvalid, [](Bad& b) {
    b.config.head_begin = 0;
    b.config.head_end = 3;
  });
  add({"head_begin"}, kInvalid, [](Bad& b) {
    b.config.head_begin = -2;
    b.config.head_end = 2;
  });
  add({"head_end"}, kInvalid, [](Bad& b) {
    b.config.head_begin = 2;
    b.config.head_end = 6;
  });
  add({"head_"}, kInvalid, [](Bad& b) {  // empty
    b.config.head_begin = 2;
    b.config.head_end = 2;
  });
  add({"head_"}, kInvalid, [](Bad& b) {  // reversed
    b.config.head_begin = 4;
    b.config.head_end = 2;
  });
  add({"scale"}, kInvalid, [](Bad& b) { b.config.attention.scale = -1.0f; });
  add({"scale"}, kInvalid, [](Bad& b) { b.config.attention.scale = kNaN; });
  add({"scale"}, kInvalid, [](Bad& b) {
    b.config.attention.scale = std::numeric_limits<float>::infinity();
  });
  add({"mask"}, kInvalid,
      [](Bad& b) { b.config.attention.mask = static_cast<AttentionMask>(7); });
  add({"w_q"}, kInvalid, [](Bad& b) { b.weights.w_q.data = nullptr; });
  add({"w_q", "[32, 31]", "[32, 32]"}, kInvalid,
      [](Bad& b) { b.weights.w_q.cols = 31; });
  add({"w_k", "[31, 16]", "[32, 16]"}, kInvalid,
      [](Bad& b) { b.weights.w_k.rows = 31; });
  add({"w_v", "[32, 8]", "[32, 16]"}, kInvalid, [](Bad& b) {
    b.weights.w_v.cols = 8;
    b.weights.w_v.stride = 16;
  });
  add({"w_o", "[31, 32]", "[32, 32]"}, kInvalid,
      [](Bad& b) { b.weights.w_o.rows = 31; });
  add({"w_k.stride"}, kInvalid, [](Bad& b) { b.weights.w_k.stride = 15; });
  add({"w_o"}, kInvalid, [](Bad& b) { b.weights.w_o.data = nullptr; });
  // Sizes whose byte count overflows (nothing may be read or allocated).
  add({}, StatusCode::kResourceExhausted, [](Bad& b) {
    b.config = Config(int64_t{1} << 32, 1, 1, int64_t{1} << 32);
    const int64_t huge = int64_t{1} << 32;
    b.weights.w_q = MatrixView<const float>(b.weights.w_q.data, huge, huge);
    b.weights.w_k = MatrixView<const float>(b.weights.w_k.data, huge, huge);
    b.weights.w_v = MatrixView<const float>(b.weights.w_v.data, huge, huge);
    b.weights.w_o = MatrixView<const float>(b.weights.w_o.data, huge, huge);
    b.weights.b_q = b.weights.b_k = b.weights.b_v = b.weights.b_o = nullptr;
  });
  // head_dim so large that (n_heads + 2 n_kv_heads) * head_dim overflows.
  add({}, StatusCode::kResourceExhausted, [](Bad& b) {
    b.config = Config(1, 1, 1, int64_t{1} << 62);
    const int64_t huge = int64_t{1} << 62;
    b.weights.w_q = MatrixView<const float>(b.weights.w_q.data, 1, huge);
    b.weights.w_k = MatrixView<const float>(b.weights.w_k.data, 1, huge);
    b.weights.w_v = MatrixView<const float>(b.weights.w_v.data, 1, huge);
    b.weights.w_o = MatrixView<const float>(b.weights.w_o.data, huge, 1);
    b.weights.b_q = b.weights.b_k = b.weights.b_v = b.weights.b_o = nullptr;
  });
  // Near INT64_MAX: products that overflow by far, (n_heads + 2 n_kv_heads)
  // * head_dim * d_model * 64 overflowing by a little, then just fitting (the
  // weights' shapes are then wrong), and a huge head range.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const AttentionLayerConfig& config :
       {Config(kMax, kMax), Config(int64_t{1} << 62, int64_t{1} << 62, 1, 1),
        Config(1, 1, 1, kMax / 192 + 1), Config(kMax, 1, 1, 1)}) {
    add({"overflows"}, StatusCode::kResourceExhausted,
        [&](Bad& b) { b.config = config; });
  }
  add({"w_q", "[32, 32]", "[1, " + std::to_string(kMax / 192) + "]"}, kInvalid,
      [](Bad& b) { b.config = Config(1, 1, 1, kMax / 192); });
  add({"head_begin, head_end"}, kInvalid, [](Bad& b) {
    b.config.head_begin = kMax - 1;
    b.config.head_end = kMax;
  });
  // QK-norm and RoPE (head_dim 8).
  const std::vector<float> norm = test::RandomVector(8, 8002, 0.5f, 1.5f);
  std::vector<float> bad_norm = norm;
  bad_norm[6] = kNaN;
  const auto qk = [&](Bad& b) {
    b.config.qk_norm = true;
    b.weights.q_norm = norm.data();
    b.weights.k_norm = norm.data();
  };
  add({"config.rope.rotary_dim (7)"}, kInvalid,
      [](Bad& b) { b.config.rope.rotary_dim = 7; });
  add({"config.rope.rotary_dim (10)", "head_dim (8)"}, kInvalid,
      [](Bad& b) { b.config.rope.rotary_dim = 10; });
  add({"config.rope.rotary_dim (-2)"}, kInvalid,
      [](Bad& b) { b.config.rope.rotary_dim = -2; });
  add({"config.rope.theta"}, kInvalid, [](Bad& b) {
    b.config.rope.rotary_dim = 8;
    b.config.rope.theta = -1;
  });
  add({"config.rope.factor"}, kInvalid, [](Bad& b) {
    b.config.rope.rotary_dim = 8;
    b.config.rope.scaling = RopeScaling::kLinear;
    b.config.rope.factor = kNaN;
  });
  add({"config.rope.high_freq_factor"}, kInvalid, [](Bad& b) {
    b.config.rope.rotary_dim = 8;
    b.config.rope.scaling = RopeScaling::kLlama3;
    b.config.rope.high_freq_factor = 0.5;
  });
  add({"weights.q_norm is null"}, kInvalid, [&](Bad& b) {
    qk(b);
    b.weights.q_norm = nullptr;
  });
  add({"weights.k_norm is null"}, kInvalid, [&](Bad& b) {
    qk(b);
    b.weights.k_norm = nullptr;
  });
  add({"weights.k_norm[6]"}, kInvalid, [&](Bad& b) {
    qk(b);
    b.weights.k_norm = bad_norm.data();
  });
  add({"config.qk_norm_eps"}, kInvalid, [&](Bad& b) {
    qk(b);
    b.config.qk_norm_eps = -1e-6f;
  });
  // Attention variants: the per-head arrays are the whole model's [n_heads].
  static const float kBadSinks[4] = {0.0f, 1.0f, 2.0f, kNaN};
  add({"config.attention.window"}, kInvalid,
      [](Bad& b) { b.config.attention.window = -3; });
  add({"config.attention.n_sink_tokens (5) must be <= "
       "config.attention.window (4)"},
      kInvalid, [](Bad& b) {
        b.config.attention.window = 4;
        b.config.attention.n_sink_tokens = 5;
      });
  add({"config.attention.softcap"}, kInvalid,
      [](Bad& b) { b.config.attention.softcap = kNaN; });
  add({"config.attention.sink_logits[3]"}, kInvalid,
      [](Bad& b) { b.config.attention.sink_logits = kBadSinks; });
  // How the weights are stored and multiplied.
  for (const int value : {-1, 3}) {
    add({"config.weight_dtype (" + std::to_string(value) + ")"}, kInvalid,
        [value](Bad& b) {
          b.config.weight_dtype = static_cast<WeightDtype>(value);
        });
  }
  for (const int value : {-1, 2}) {
    add({"config.projection_compute (" + std::to_string(value) + ")"}, kInvalid,
        [value](Bad& b) {
          b.config.projection_compute = static_cast<MatmulCompute>(value);
        });
  }
  add({"config.projection_compute", "bf16 or int8 weights", "(got 0)"},
      kInvalid, [](Bad& b) {
        b.config.weight_dtype = WeightDtype::kFloat32;
        b.config.projection_compute = MatmulCompute::kBFloat16;
      });
  // int8 cannot store NaN or inf: the message names the weight's element.
  std::vector<float> w_k_nan = model.w_k, w_o_inf = model.w_o;
  w_k_nan[3 * 16 + 5] = kNaN;
  w_o_inf[30 * 32 + 1] = -std::numeric_limits<float>::infinity();
  add({"weights.w_k[3, 5] is nan", "int8"}, kInvalid, [&](Bad& b) {
    b.config.weight_dtype = WeightDtype::kInt8;
    b.weights.w_k.data = w_k_nan.data();
  });
  add({"weights.w_o[30, 1] is -inf", "int8"}, kInvalid, [&](Bad& b) {
    b.config.weight_dtype = WeightDtype::kInt8;
    b.weights.w_o.data = w_o_inf.data();
  });
  for (const Bad& bad : cases) {
    const Status status = AttentionLayer::Create(
        bad.config, bad.weights, bad.null_out ? nullptr : &layer);
    EXPECT_TRUE(test::IsError(status, bad.code, bad.expect,
                              "AttentionLayer::Create: "));
    EXPECT_EQ(layer.config().d_model, 32) << status.ToString();
    EXPECT_EQ(layer.config().n_kv_heads, 2) << status.ToString();
  }
  // The layer is the one created first, bit for bit.
  KvCache cache = MakeCache(layer.CacheConfig(1, 3));
  std::vector<float> y_after;
  ASSERT_TRUE(RunLayer(&layer, &cache, {{0, 3}}, x, &y_after).ok());
  EXPECT_EQ(0, std::memcmp(y_before.data(), y_after.data(),
                           y_before.size() * sizeof(float)));
}

// NaN and inf in the weights: float32 and bf16 layers take them (they
// propagate as IEEE arithmetic says); an int8 layer refuses those in the
// columns and rows it packs, naming the element of the whole model's weight
// (past the views' NaN padding, which it never reads), and takes those that
// only other shards pack.
TEST(AttentionLayerErrors, NonFiniteWeights) {
  AttentionLayerConfig config = Config(32, 4, 2);  // head_dim 8, groups of 2
  Model model(ShapeOf(config), "", 9600);
  model.w_q[1 * 32 + 20] = kNaN;  // a column of heads [2, 4)
  model.w_o[3 * 32 + 7] = std::numeric_limits<float>::infinity();  // [0, 2)
  AttentionLayer layer;
  for (const WeightDtype dtype :
       {WeightDtype::kFloat32, WeightDtype::kBFloat16}) {
    config.weight_dtype = dtype;
    EXPECT_TRUE(model.Create(config, &layer).ok());
  }
  config.weight_dtype = WeightDtype::kInt8;
  config.head_begin = 0;
  config.head_end = 2;
  EXPECT_TRUE(
      test::IsError(model.Create(config, &layer), StatusCode::kInvalidArgument,
                    {"weights.w_o[3, 7] is inf"}, "AttentionLayer::Create: "));
  config.head_begin = 2;
  config.head_end = 4;
  EXPECT_TRUE(
      test::IsError(model.Create(config, &layer), StatusCode::kInvalidArgument,
                    {"weights.w_q[1, 20] is nan"}, "AttentionLayer::Create: "));
  model.w_q[1 * 32 + 20] = 0.5f;
  EXPECT_TRUE(model.Create(config, &layer).ok());
}

TEST(AttentionLayerErrors, ForwardRejectsBadArgumentsWritingNothing) {
  const AttentionLayerConfig config = Config(32, 4, 2);  // head_dim 8
  Model model(ShapeOf(config), "qkvo", 9000);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(config, &layer).ok());
  // Slots 0 (3 tokens) and 1 (7 of 8, one row left); 2 empty.
  KvCache cache = MakeCache(layer.CacheConfig(3, 8));
  std::vector<float> y;
  ASSERT_TRUE(RunLayer(&layer, &cache, {{0, 3}, {1, 7}},
                       test::RandomVector(10 * 32, 9001), &y)
                  .ok());
  KvCacheConfig other_heads = layer.CacheConfig(3, 8);
  other_heads.n_kv_heads = 4;
  KvCacheConfig other_dim = layer.CacheConfig(3, 8);
  other_dim.head_dim = 16;
  KvCache cache_heads, cache_dim;
  ASSERT_TRUE(KvCache::Create(other_heads, &cache_heads).ok());
  ASSERT_TRUE(KvCache::Create(other_dim, &cache_dim).ok());

  // x is the first 4 of 8 rows, so that a y overlapping x stays in memory.
  const std::vector<float> x = test::RandomVector(8 * 32, 9002);
  std::vector<float> out(4 * 32 + 64, kSentinel);
  const std::vector<float> x_before = x, out_before = out;
  // A view of y inside the cache's K buffer.
  float* in_cache = const_cast<float*>(FloatRows(cache.Keys(2, 0)).data);

  struct Bad {
    std::vector<std::string> expect;
    StatusCode code;
    KvCache* cache;
    std::vector<LayerSequence> sequences;
    bool null_sequences = false;
    int64_t n_sequences = -1;  // -1: sequences.size()
    MatrixView<const float> x;
    MatrixView<float> y;
    AttentionLayer* layer = nullptr;
  };
  AttentionLayer empty;
  const Bad good{{},
                 StatusCode::kOk,
                 &cache,
                 {{0, 2}, {2, 2}},
                 false,
                 -1,
                 MatrixView<const float>(x.data(), 4, 32),
                 MatrixView<float>(out.data(), 4, 32),
                 &layer};
  std::vector<Bad> cases;
  auto add = [&](std::vector<std::string> expect, StatusCode code, auto edit) {
    Bad bad = good;
    bad.expect = std::move(expect);
    bad.code = code;
    edit(bad);
    cases.push_back(bad);
  };
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  add({}, StatusCode::kFailedPrecondition, [&](Bad& b) { b.layer = &empty; });
  add({"cache"}, kInvalid, [](Bad& b) { b.cache = nullptr; });
  add({"sequences"}, kInvalid, [](Bad& b) { b.null_sequences = true; });
  add({"n_sequences"}, kInvalid, [](Bad& b) { b.n_sequences = 0; });
  add({"n_kv_heads", "4", "2"}, kInvalid,
      [&](Bad& b) { b.cache = &cache_heads; });
  add({"head_dim", "16", "8"}, kInvalid, [&](Bad& b) { b.cache = &cache_dim; });
  add({"seq", "3"}, kInvalid, [](Bad& b) { b.sequences[1].seq = 3; });
  add({"seq", "-1"}, kInvalid, [](Bad& b) { b.sequences[0].seq = -1; });
  add({"seq", "twice"}, kInvalid, [](Bad& b) { b.sequences[1].seq = 0; });
  add({"n_tokens"}, kInvalid, [](Bad& b) {
    b.sequences[1].n_tokens = 0;
    b.x.rows = b.y.rows = 2;
  });
  add({"n_tokens"}, kInvalid, [](Bad& b) {
    b.sequences = {{0, 5}, {2, -1}};
    b.x.rows = b.y.rows = 4;
  });
  add({"x.data"}, kInvalid, [](Bad& b) { b.x.data = nullptr; });
  add({"x", "[3, 32]"}, kInvalid, [](Bad& b) { b.x.rows = 3; });
  add({"x", "[4, 31]"}, kInvalid, [](Bad& b) {
    b.x.cols = 31;
    b.x.stride = 32;
  });
  add({"x.stride"}, kInvalid, [](Bad& b) { b.x.stride = 31; });
  add({"y.data"}, kInvalid, [](Bad& b) { b.y.data = nullptr; });
  add({"y", "[4, 33]"}, kInvalid, [](Bad& b) {
    b.y.cols = 33;
    b.y.stride = 33;
  });
  add({"y", "[5, 32]"}, kInvalid, [](Bad& b) { b.y.rows = 5; });
  add({"y", "overlaps", "x"}, kInvalid,
      [&](Bad& b) { b.y.data = const_cast<float*>(x.data()) + 2 * 32; });
  add({"y", "overlaps", "cache"}, kInvalid,
      [&](Bad& b) { b.y.data = in_cache; });
  // Capacity: slot 1 holds 7 of 8.
  add({"capacity"}, StatusCode::kOutOfRange, [](Bad& b) {
    b.sequences = {{0, 2}, {1, 2}};
  });
  // Near INT64_MAX: token counts (their sum would overflow), views.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  add({"capacity"}, StatusCode::kOutOfRange, [](Bad& b) {
    b.sequences = {{0, 2}, {2, kMax}};
  });
  add({"capacity"}, StatusCode::kOutOfRange, [](Bad& b) {
    b.sequences = {{0, kMax}, {2, kMax}};
  });
  add({"x: rows (" + std::to_string(kMax)}, StatusCode::kResourceExhausted,
      [](Bad& b) { b.x.rows = kMax; });
  add({"y: rows (4) x stride (" + std::to_string(kMax)},
      StatusCode::kResourceExhausted, [](Bad& b) { b.y.stride = kMax; });

  for (const Bad& bad : cases) {
    const CacheSnapshot before = Snapshot(&cache);
    const int64_t n_sequences =
        bad.n_sequences >= 0 ? bad.n_sequences
                             : static_cast<int64_t>(bad.sequences.size());
    const Status status = bad.layer->Forward(
        bad.cache, bad.null_sequences ? nullptr : bad.sequences.data(),
        n_sequences, bad.x, bad.y);
    EXPECT_TRUE(test::IsError(status, bad.code, bad.expect,
                              "AttentionLayer::Forward: "));
    EXPECT_EQ(out, out_before) << "y written: " << status.ToString();
    EXPECT_EQ(x, x_before) << "x written: " << status.ToString();
    EXPECT_TRUE(Snapshot(&cache) == before)
        << "cache changed: " << status.ToString();
    EXPECT_EQ(cache_heads.length(0), 0);
    EXPECT_EQ(cache_dim.length(0), 0);
  }
  // The good call works (and only then are y and the cache written).
  const Status status =
      layer.Forward(&cache, good.sequences.data(), 2, good.x, good.y);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(cache.length(0), 5);
  EXPECT_EQ(cache.length(2), 2);
}

// Moves leave the source empty (Forward: kFailedPrecondition) and the target
// working; an empty layer's config is all zeros.
// CacheConfig and cache_bytes_per_token for every dtype; an unknown dtype
// gives a cache config that Create rejects naming it, and 0 bytes per token;
// a cache of a stored type but another head_dim is rejected by Forward,
// nothing written.
// A ring cache needs a layer with a window it holds and its sink tokens:
// otherwise a clear error and nothing written; with them, a prefill longer
// than the ring works, and a layer without a window gets a RingCacheConfig
// that KvCache::Create rejects.
TEST(AttentionLayerErrors, RingCacheNeedsItsWindow) {
  AttentionLayerConfig windowed = Config(32, 4, 2);  // head_dim 8
  windowed.attention.window = 6;
  windowed.attention.n_sink_tokens = 2;
  Model model(ShapeOf(windowed), "qkvo", 9100);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(windowed, &layer).ok());
  KvCache ring = MakeCache(layer.RingCacheConfig(2));
  ASSERT_EQ(ring.capacity(), 8);
  const std::vector<float> x = test::RandomVector(20 * 32, 9101);
  std::vector<float> y;
  ASSERT_TRUE(RunLayer(&layer, &ring, {{0, 20}}, x, &y).ok());

  struct Bad {
    std::string expect;
    AttentionLayerConfig config;
  };
  std::vector<Bad> cases;
  AttentionLayerConfig config = windowed;
  config.attention.window = 0;
  config.attention.n_sink_tokens = 0;
  cases.push_back(
      {"config.attention.window (0) must be in [1, capacity - "
       "n_sink_tokens = 6] with a ring cache",
       config});
  config.attention.window = 7;
  config.attention.n_sink_tokens = 2;
  cases.push_back({"config.attention.window (7) must be in [1, ", config});
  config = windowed;
  config.attention.n_sink_tokens = 0;
  cases.push_back(
      {"config.attention.n_sink_tokens (0) must equal the ring "
       "cache's n_sink_tokens (2)",
       config});
  for (const Bad& bad : cases) {
    AttentionLayer other;
    ASSERT_TRUE(model.Create(bad.config, &other).ok()) << bad.expect;
    const CacheSnapshot before = Snapshot(&ring);
    const std::vector<float> x1(x.begin(), x.begin() + 32);
    std::vector<float> out;
    EXPECT_TRUE(test::IsError(RunLayer(&other, &ring, {{0, 1}}, x1, &out),
                              StatusCode::kInvalidArgument, {bad.expect},
                              "AttentionLayer::Forward: "));
    EXPECT_TRUE(Snapshot(&ring) == before) << bad.expect;
    EXPECT_EQ(out, std::vector<float>(x1.size(), kSentinel)) << bad.expect;
  }
  AttentionLayer global;
  ASSERT_TRUE(model.Create(Config(32, 4, 2), &global).ok());
  KvCache none;
  EXPECT_TRUE(test::IsError(KvCache::Create(global.RingCacheConfig(1), &none),
                            StatusCode::kInvalidArgument, {"capacity"},
                            "KvCache::Create: "));
  // A window + sink tokens past int64_t: the largest capacity, whose bytes
  // Create cannot count.
  AttentionLayerConfig huge = windowed;
  huge.attention.window = std::numeric_limits<int64_t>::max();
  AttentionLayer huge_layer;
  ASSERT_TRUE(model.Create(huge, &huge_layer).ok());
  EXPECT_EQ(huge_layer.RingCacheConfig(1).capacity,
            std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(test::IsError(
      KvCache::Create(huge_layer.RingCacheConfig(1), &none),
      StatusCode::kResourceExhausted, {"overflows"}, "KvCache::Create: "));
}

TEST(AttentionLayerErrors, StoredDtypes) {
  const AttentionLayerConfig config = Config(64, 8, 2, 16);  // row_stride 16
  Model model(ShapeOf(config), "qkvo", 9500);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(config, &layer).ok());
  for (const KvDtype dtype : kAllDtypes) {
    const KvCacheConfig cache_config = layer.CacheConfig(3, 5, dtype);
    EXPECT_EQ(cache_config.dtype, dtype);
    EXPECT_EQ(cache_config.n_kv_heads, 2);
    const size_t row_bytes =
        16 * KvDtypeSize(dtype) + (dtype == KvDtype::kInt8 ? 4 : 0);
    EXPECT_EQ(layer.cache_bytes_per_token(dtype), 2 * 2 * row_bytes)
        << internal::KvDtypeName(dtype);
    const KvCache cache = MakeCache(cache_config);
    EXPECT_EQ(layer.cache_bytes_per_token(dtype), cache.bytes_per_token());
  }
  EXPECT_EQ(layer.CacheConfig(1, 1).dtype, KvDtype::kFloat32);
  EXPECT_EQ(layer.cache_bytes_per_token(),
            layer.cache_bytes_per_token(KvDtype::kFloat32));
  EXPECT_EQ(AttentionLayer().cache_bytes_per_token(KvDtype::kInt8), 0u);
  const KvDtype unknown = static_cast<KvDtype>(9);
  EXPECT_EQ(layer.cache_bytes_per_token(unknown), 0u);
  KvCache cache;
  EXPECT_TRUE(
      test::IsError(KvCache::Create(layer.CacheConfig(1, 4, unknown), &cache),
                    StatusCode::kInvalidArgument, {"dtype"}));

  AttentionLayerConfig other = config;
  other.head_dim = 8;
  Model other_model(ShapeOf(other), "", 9501);
  AttentionLayer other_layer;
  ASSERT_TRUE(other_model.Create(other, &other_layer).ok());
  KvCache bf16 = MakeCache(other_layer.CacheConfig(1, 4, KvDtype::kBFloat16));
  std::vector<float> y;
  const CacheSnapshot before = Snapshot(&bf16);
  EXPECT_TRUE(test::IsError(
      RunLayer(&layer, &bf16, {{0, 2}}, test::RandomVector(2 * 64, 9502), &y),
      StatusCode::kInvalidArgument, {"head_dim 8", "head_dim 16"},
      "AttentionLayer::Forward: "));
  EXPECT_TRUE(Snapshot(&bf16) == before);
}

TEST(AttentionLayerErrors, EmptyAndMovedFromLayers) {
  AttentionLayer empty;
  EXPECT_EQ(empty.config().d_model, 0);
  EXPECT_EQ(empty.config().n_heads, 0);
  EXPECT_EQ(empty.config().n_kv_heads, 0);
  EXPECT_EQ(empty.config().head_dim, 0);
  EXPECT_EQ(empty.config().head_end, 0);
  const AttentionLayerConfig config = Config(32, 4);
  Model model(ShapeOf(config), "", 9500);
  AttentionLayer a;
  ASSERT_TRUE(model.Create(config, &a).ok());
  KvCache cache = MakeCache(a.CacheConfig(1, 4));
  const std::vector<float> x = test::RandomVector(32, 9501);
  std::vector<float> y;
  AttentionLayer b(std::move(a));
  Status status =
      RunLayer(&a, &cache, {{0, 1}}, x, &y);  // NOLINT: use after move
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition)
      << status.ToString();
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_EQ(a.config().d_model, 0);  // NOLINT: use after move
  ASSERT_TRUE(RunLayer(&b, &cache, {{0, 1}}, x, &y).ok());
  AttentionLayer c;
  c = std::move(b);
  status = RunLayer(&b, &cache, {{0, 1}}, x, &y);  // NOLINT: use after move
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(RunLayer(&c, &cache, {{0, 1}}, x, &y).ok());
  EXPECT_EQ(cache.length(0), 2);
}

// q_norm() and k_norm() are the layer's own copies of QK-norm's weights (the
// caller's arrays are NaN after Create), null without QK-norm.
TEST(AttentionLayerAccessors, QkNormWeightsAreTheLayersCopies) {
  const AttentionLayerConfig config = WithVariants(Config(64, 4), true, 0);
  Model model(ShapeOf(config), "", 9600);
  AttentionLayer layer;
  ASSERT_TRUE(model.Create(config, &layer).ok());
  ASSERT_NE(layer.q_norm(), nullptr);
  ASSERT_NE(layer.k_norm(), nullptr);
  for (size_t p = 0; p < model.q_norm.size(); ++p) {
    EXPECT_EQ(layer.q_norm()[p], model.q_norm[p]) << p;
    EXPECT_EQ(layer.k_norm()[p], model.k_norm[p]) << p;
  }
  AttentionLayer plain;
  ASSERT_TRUE(model.Create(Config(64, 4), &plain).ok());
  EXPECT_EQ(plain.q_norm(), nullptr);
  EXPECT_EQ(plain.k_norm(), nullptr);
  EXPECT_EQ(AttentionLayer().q_norm(), nullptr);
  EXPECT_EQ(AttentionLayer().k_norm(), nullptr);
}

// The packing is for the vector width at Create: Forward under a target of
// another width fails (kFailedPrecondition, nothing written), under one of
// the same width (AVX3_DL and AVX3, SSE4 and SSSE3) it works.
TEST(AttentionLayerTargets, ForwardNeedsTheVectorWidthOfCreate) {
  struct ResetOnExit {
    ~ResetOnExit() { ResetMaxTarget(); }
  } reset_on_exit;
  const std::vector<Target> targets = SupportedTargets();
  const AttentionLayerConfig config = Config(32, 4, 2);
  Model model(ShapeOf(config), "qkvo", 9800);
  const std::vector<float> x = test::RandomVector(5 * 32, 9801);
  const Expected e = Reference(model, x, true, ScaleOf(config));
  for (const Target& at_create : targets) {
    ASSERT_TRUE(SetMaxTarget(at_create.name).ok());
    const size_t lanes = test::ActiveFloatLanes();
    AttentionLayer layer;
    ASSERT_TRUE(model.Create(config, &layer).ok());
    for (const Target& at_forward : targets) {
      ASSERT_TRUE(SetMaxTarget(at_forward.name).ok());
      const bool same = test::ActiveFloatLanes() == lanes;
      const std::string what = std::string("created on ") + at_create.name +
                               ", run on " + at_forward.name;
      KvCache cache = MakeCache(layer.CacheConfig(1, 5));
      std::vector<float> y;
      const Status status = RunLayer(&layer, &cache, {{0, 5}}, x, &y);
      if (same) {
        ASSERT_TRUE(status.ok()) << what << ": " << status.ToString();
        ASSERT_NO_FATAL_FAILURE(
            ExpectRowsMatch(y.data(), 5, 32, 32, e, 0, what));
      } else {
        EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition)
            << what << ": " << status.ToString();
        EXPECT_EQ(cache.length(0), 0) << what;
        for (const float v : y) ASSERT_EQ(v, kSentinel) << what;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Threads.

// Two layers sharing one cache, each on its own sequences ({0, 1} and {2, 3}),
// in two threads: what the threading rules of kv_cache.h and layer.h allow.
// Each thread's outputs and cache rows equal those of the same steps run one
// after the other in one thread, bit for bit. Under ThreadSanitizer this is
// the race check: a Forward must not read the other thread's sequences (their
// lengths change as it commits).
TEST(AttentionLayerThreads, TwoLayersOnDisjointSequencesOfOneCache) {
#if defined(__SANITIZE_THREAD__)
#define HEADWAY_LAYER_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HEADWAY_LAYER_TEST_TSAN 1
#endif
#endif
#if defined(HEADWAY_LAYER_TEST_TSAN)
  // libtbb is not instrumented: ThreadSanitizer cannot see how its workers
  // synchronise and reports their tasks' writes. One thread per call (no
  // workers) keeps the check on what this test is about: the two calling
  // threads' reads and writes of the cache.
  ASSERT_TRUE(SetMaxThreads(1).ok());
#endif
  const AttentionLayerConfig config = Config(64, 4, 2, 16);
  Model models[2] = {Model(ShapeOf(config), "qkvo", 9500),
                     Model(ShapeOf(config), "qkvo", 9600)};
  AttentionLayer layers[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(models[i].Create(config, &layers[i]).ok());
  }
  const int64_t d = config.d_model, n_steps = 24, capacity = 40;
  // Thread i: a prefill of its two sequences, then decode steps of both.
  const std::vector<LayerSequence> prefill[2] = {{{0, 5}, {1, 3}},
                                                 {{3, 6}, {2, 4}}};
  auto step_of = [&](int i, int64_t step) {
    if (step == 0) return prefill[i];
    return std::vector<LayerSequence>{{prefill[i][0].seq, 1},
                                      {prefill[i][1].seq, 1}};
  };
  // xs[i][step], and the outputs of a run.
  std::vector<std::vector<float>> xs[2];
  for (int i = 0; i < 2; ++i) {
    for (int64_t step = 0; step < n_steps; ++step) {
      int64_t rows = 0;
      for (const LayerSequence& s : step_of(i, step)) rows += s.n_tokens;
      xs[i].push_back(test::RandomVector(
          rows * d, static_cast<uint64_t>(9700 + 100 * i + step)));
    }
  }
  using Outputs = std::vector<std::vector<float>>;
  auto run = [&](int i, KvCache* cache, Outputs* ys, Status* status) {
    for (int64_t step = 0; step < n_steps && status->ok(); ++step) {
      ys->emplace_back();
      *status = RunLayer(&layers[i], cache, step_of(i, step), xs[i][step],
                         &ys->back());
    }
  };
  KvCache serial = MakeCache(layers[0].CacheConfig(4, capacity));
  KvCache shared = MakeCache(layers[0].CacheConfig(4, capacity));
  Outputs serial_ys[2], shared_ys[2];
  Status serial_status[2], shared_status[2];
  for (int i = 0; i < 2; ++i) {
    run(i, &serial, &serial_ys[i], &serial_status[i]);
    ASSERT_TRUE(serial_status[i].ok()) << serial_status[i].ToString();
  }
  std::thread threads[2];
  for (int i = 0; i < 2; ++i) {
    threads[i] = std::thread(run, i, &shared, &shared_ys[i], &shared_status[i]);
  }
  for (std::thread& thread : threads) thread.join();
#if defined(HEADWAY_LAYER_TEST_TSAN)
  ASSERT_TRUE(SetMaxThreads(0).ok());
#endif
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(shared_status[i].ok()) << shared_status[i].ToString();
    ASSERT_EQ(shared_ys[i].size(), serial_ys[i].size());
    for (size_t step = 0; step < serial_ys[i].size(); ++step) {
      const std::vector<float>& a = serial_ys[i][step];
      const std::vector<float>& b = shared_ys[i][step];
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "thread " << i << ", step " << step;
    }
  }
  for (int64_t seq = 0; seq < 4; ++seq) {
    ASSERT_EQ(shared.length(seq), serial.length(seq)) << "seq " << seq;
    for (int64_t g = 0; g < shared.n_kv_heads(); ++g) {
      const MatrixView<const float> views[2][2] = {
          {FloatRows(serial.Keys(seq, g)), FloatRows(shared.Keys(seq, g))},
          {FloatRows(serial.Values(seq, g)), FloatRows(shared.Values(seq, g))}};
      for (const auto& pair : views) {
        const size_t floats =
            static_cast<size_t>(pair[0].rows * pair[0].stride);
        EXPECT_EQ(
            0, std::memcmp(pair[0].data, pair[1].data, floats * sizeof(float)))
            << "seq " << seq << ", kv head " << g;
      }
    }
  }
}

}  // namespace
}  // namespace headway

// libFuzzer target over the C API (headway.h): the input bytes become a
// sequence of calls on small shapes and strides, each checked against a shadow
// model that predicts its status code, the cache lengths and contents it
// leaves, and (for small outputs) a float64 reference. Any mismatch aborts.
//
//   meson setup build-fuzz -Dfuzz=enabled -Db_sanitize=address,undefined
//   ninja -C build-fuzz fuzz/capi_fuzz
//   build-fuzz/fuzz/capi_fuzz -max_total_time=60 -max_len=4096 -len_control=0 \
//       new/ fuzz/corpus
//
// Without -max_len libFuzzer caps inputs at the longest seed; with
// -len_control=0 they may reach -max_len at once.
//
// One op is one function below (Op...), chosen by a byte of the input; add an
// op by writing its function and its line in kOps.
//
// KV dtypes: caches are made in every hw_kv_dtype (and invalid values). The
// model holds the rows as the cache should store them read back as float32:
// what hw_kv_store_rows then hw_kv_load_rows make of the appended floats,
// which is checked against the rounding bound of the type (OpKvRows and
// ModelRow); the cache is compared with it bit for bit, and attention against
// float64 over these dequantized rows with float32's tolerance.
//
// Ring caches (hw_kv_cache_create_ring, hw_attention_layer_create_ring_cache):
// the cache ops run on them too, the model keeping rows by slot and each
// sequence's ring_begin. The attention and layer ops run on them mostly with
// the window and n_sink_tokens a ring needs, sometimes with wrong ones (a
// window of 0 or past the ring, other sink tokens, a mask, the with_weights
// calls): the model predicts the errors (and HW_OUT_OF_RANGE for a query
// whose window the ring no longer holds) and checks results against float64
// over the positions the ring holds, which are all a valid call sees. A
// layer's token whose keys a longer call overwrote in the ring is checked to
// be finite only.
//
// Attention variants: the core calls and layers run sometimes with random
// sliding windows, sink tokens, soft-capping, ALiBi slopes and sink logits
// (Variants), bad ones included, and struct_size values of older, newer and
// bad callers; the float64 references apply them as headway.h's
// hw_attention_variants says.
//
// Weight storage: layers created with a version 3 hw_attention_layer_variants
// store their weights in a random hw_weight_dtype (bad values, int8 weights
// with a NaN, and the bf16 compute mode over float32 weights included); the
// model multiplies by the weights as stored (test/support/reference.h's
// StoredWeights), with int8's one more rounding per K block. Layers in the
// bf16 compute mode round x to bfloat16 (each product moves by 2^-8 at most:
// the K and V rows' bound grows by that) and the attention output: their y is
// checked finite only (AttentionLayer's tests hold it to a bound).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "headway/headway.h"
#include "headway/matmul.h"
#include "test/support/reference.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff

[[noreturn]] void Fail(const char* what, double a = 0, double b = 0) {
  std::fprintf(stderr, "capi_fuzz: %s (%g, %g) on %s; last error: \"%s\"\n",
               what, a, b, hw_active_target(), hw_last_error());
  std::abort();
}

void Check(bool ok, const char* what, double a = 0, double b = 0) {
  if (!ok) Fail(what, a, b);
}

// `also`: a second status the contract allows (headway.h does not order the
// checks of a call with two errors); -1 if none.
void ExpectStatus(int got, int want, const char* fn, int also = -1) {
  if (got != want && got != also) {
    std::fprintf(stderr, "capi_fuzz: %s returned %s, the model says %s\n", fn,
                 hw_status_name(got), hw_status_name(want));
    Fail("status mismatch");
  }
  // The message is "" exactly after HW_OK.
  Check((got == HW_OK) == (hw_last_error()[0] == '\0'), "hw_last_error");
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// ---------------------------------------------------------------- Inputs

// A float of one of a few kinds: mostly moderate values, sometimes the
// specials. `specials` false keeps it finite and within [-mag, mag].
float ConsumeFloat(FuzzedDataProvider& in, bool specials, float mag = 4.0f) {
  switch (in.ConsumeIntegralInRange(0, specials ? 11 : 5)) {
    case 0:
      return 0.0f;
    case 1:
      return static_cast<float>(in.ConsumeIntegralInRange(-4, 4));
    case 6:
      return kNaN;
    case 7:
      return kInf;
    case 8:
    case 9:
      return -kInf;
    case 10:
      return -std::numeric_limits<float>::max();  // Hugging Face mask value
    case 11: {
      const uint32_t bits = in.ConsumeIntegral<uint32_t>();
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    }
    default:
      return mag * (2.0f * in.ConsumeProbability<float>() - 1.0f);
  }
}

// A row stride for rows of `cols`: 0 or cols (dense), cols plus a little, or
// one short (invalid).
int64_t ConsumeStride(FuzzedDataProvider& in, int64_t cols) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 7:
      return cols - 1;
    case 4:
      return cols;
    case 5:
    case 6:
      return cols + in.ConsumeIntegralInRange(1, 5);
    default:
      return 0;
  }
}

bool StrideOk(int64_t stride, int64_t cols) {
  return stride == 0 || stride >= cols;
}
int64_t Dense(int64_t stride, int64_t cols) {
  return stride == 0 ? cols : stride;
}

// A buffer holding [rows, cols] at row stride `stride` (0: dense), exactly as
// long as the last row needs, so that ASan sees any read past it. Padding is
// NaN so that a kernel reading it shows.
std::vector<float> MakeMatrix(FuzzedDataProvider& in, int64_t rows,
                              int64_t cols, int64_t stride, bool specials,
                              float mag = 4.0f) {
  const int64_t s = std::max<int64_t>(Dense(stride, cols), 1);
  std::vector<float> m(static_cast<size_t>((rows - 1) * s + cols), kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[r * s + c] = ConsumeFloat(in, specials, mag);
  return m;
}

// ---------------------------------------------------- Attention variants

// The attention variants of a call or a layer: hw_attention_variants' fields,
// which hw_attention_layer_variants shares, with their per-head arrays.
struct Variants {
  int64_t window = 0;
  int64_t n_sinks = 0;  // n_sink_tokens
  float softcap = 0.0f;
  std::vector<float> slopes, sinks;  // [n_heads] each; empty: none

  const float* Slopes() const {
    return slopes.empty() ? nullptr : slopes.data();
  }
  const float* Sinks() const { return sinks.empty() ? nullptr : sinks.data(); }
  // The ALiBi bias of head h at position pos for the key at position r.
  double Bias(int64_t h, int64_t r, int64_t pos) const {
    return slopes.empty() ? 0.0 : slopes[h] * static_cast<double>(r - pos);
  }
  // The score of head h at position pos for the key at position r, from
  // scale * q . k = scaled: soft-capped, then plus the ALiBi bias.
  double Score(double scaled, int64_t h, int64_t r, int64_t pos) const {
    double z = scaled;
    if (softcap != 0.0f) z = softcap * std::tanh(z / softcap);
    return z + Bias(h, r, pos);
  }
  // Whether a key at position r is outside the window of a query at pos (and
  // not a sink token).
  bool OutsideWindow(int64_t r, int64_t pos) const {
    return window > 0 && r <= pos - window && r >= n_sinks;
  }
};

// Whether v has more sink tokens than its window allows (attention.h:
// n_sink_tokens <= window).
bool SinksOverWindow(const Variants& v) {
  return v.n_sinks > 0 && v.n_sinks > v.window;
}

// Random variants for n_heads heads (arrays of max(n_heads, 1) elements):
// each on or off, of the sizes models use; sometimes a bad one (*invalid is
// then set): a negative window or n_sink_tokens, a softcap < 0 or not finite,
// a slope or sink logit that is not finite. For a ring cache of ring_rows
// (capacity - n_sink_tokens) rows past ring_sinks sink tokens (ring_rows 0:
// no ring), mostly a window that fits it and its n_sink_tokens.
Variants ConsumeVariants(FuzzedDataProvider& in, int64_t n_heads, bool* invalid,
                         int64_t ring_rows = 0, int64_t ring_sinks = 0) {
  Variants v;
  const int64_t heads = std::max<int64_t>(n_heads, 1);
  // A ring's fitting choices come first: a spent input (zeros) picks them.
  switch (in.ConsumeIntegralInRange(0, ring_rows > 0 ? 5 : 3)) {
    case 1:
      v.window = in.ConsumeIntegralInRange<int64_t>(1, 3);
      break;
    case 2:
      v.window = in.ConsumeIntegralInRange<int64_t>(1, 12);
      break;
    case 0:
    case 4:
      // A window of at least the sink tokens (attention.h), where it fits.
      if (ring_rows > 0) {
        v.window = in.ConsumeIntegralInRange<int64_t>(
            std::min(std::max<int64_t>(ring_sinks, 1), ring_rows), ring_rows);
      }
      break;
    default:
      break;
  }
  if (ring_rows > 0 && in.ConsumeIntegralInRange(0, 7) != 7) {
    v.n_sinks = ring_sinks;
  } else if (in.ConsumeIntegralInRange(0, 3) == 3) {
    v.n_sinks = in.ConsumeIntegralInRange<int64_t>(1, 4);
  }
  if (in.ConsumeBool()) {
    v.softcap = 0.25f + 8.0f * in.ConsumeProbability<float>();
  }
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 1:
      v.slopes.resize(heads);
      ExpectStatus(hw_alibi_slopes(heads, v.slopes.data()), HW_OK,
                   "hw_alibi_slopes");
      break;
    case 2:
      v.slopes.resize(heads);
      for (float& x : v.slopes) x = ConsumeFloat(in, false, 1.0f);
      break;
    default:
      break;
  }
  if (in.ConsumeBool()) {
    v.sinks.resize(heads);
    for (float& x : v.sinks) x = ConsumeFloat(in, false, 4.0f);
  }
  const auto at = [&]() {
    return in.ConsumeIntegralInRange<size_t>(0, static_cast<size_t>(heads) - 1);
  };
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 11:
      v.n_sinks = -1;
      *invalid = true;
      break;
    case 12:
      v.window = -1;
      *invalid = true;
      break;
    case 13:
      v.softcap = in.PickValueInArray({-1.0f, kNaN, kInf});
      *invalid = true;
      break;
    case 14:
      if (v.slopes.empty()) v.slopes.assign(heads, 0.5f);
      v.slopes[at()] = in.ConsumeBool() ? kNaN : -kInf;
      *invalid = true;
      break;
    case 15:
      if (v.sinks.empty()) v.sinks.assign(heads, 0.0f);
      v.sinks[at()] = in.ConsumeBool() ? kNaN : kInf;
      *invalid = true;
      break;
    default:
      break;
  }
  // More sink tokens than the window (or sink tokens without one).
  if (SinksOverWindow(v)) *invalid = true;
  return v;
}

// A struct that grows (hw_attention_variants, hw_attention_layer_variants)
// followed by room for a newer header's fields, all zero.
template <typename T>
struct Growing {
  T v{};
  unsigned char tail[16] = {};
};

// The variants' fields of a C struct.
template <typename T>
void SetVariantFields(const Variants& v, T* c) {
  c->window = v.window;
  c->n_sink_tokens = v.n_sinks;
  c->softcap = v.softcap;
  c->alibi_slopes = v.Slopes();
  c->sink_logits = v.Sinks();
}

// g.v.struct_size: mostly sizeof; sometimes version 1's (v1: the library
// then reads no n_sink_tokens, so var->n_sinks becomes 0), a newer header's
// longer struct whose tail is zero (valid) or not (*invalid), or a size out of
// range (*invalid). Never one past the room, which the library would read.
template <typename T>
void ConsumeStructSize(FuzzedDataProvider& in, size_t v1, Growing<T>* g,
                       Variants* var, bool* invalid) {
  static_assert(offsetof(Growing<T>, tail) == sizeof(T), "tail follows v");
  size_t size = sizeof(T);
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 11:
      // Not for a bad n_sinks, whose error would go unread.
      if (var->n_sinks >= 0 && !SinksOverWindow(*var)) {
        size = v1;
        var->n_sinks = 0;
      }
      break;
    case 12:
      size = sizeof(Growing<T>);
      break;
    case 13:
      size = sizeof(Growing<T>);
      g->tail[in.ConsumeIntegralInRange<size_t>(0, sizeof(g->tail) - 1)] = 1;
      *invalid = true;
      break;
    case 14:
      size = in.ConsumeBool() ? 0 : v1 - 1;
      *invalid = true;
      break;
    case 15:
      size = 4097;
      *invalid = true;
      break;
    default:
      break;
  }
  g->v.struct_size = size;
}

// ---------------------------------------------------------- Shadow model

// The state the model predicts: one cache (or none), one layer (or none).
struct Shadow {
  hw_kv_cache* cache = nullptr;
  int64_t n_sequences = 0, n_kv_heads = 0, head_dim = 0, capacity = 0;
  int dtype = HW_KV_FLOAT32;
  bool ring = false;
  int64_t sinks = 0;                // n_sink_tokens (0 without ring)
  std::vector<int64_t> length;      // positions appended
  std::vector<int64_t> ring_begin;  // oldest held position past the sinks
  // Per sequence: [capacity, n_kv_heads * head_dim] keys and values as the
  // cache stores them, read back as float32, row Slot(p) for position p.
  std::vector<std::vector<float>> k, v;

  hw_attention_layer* layer = nullptr;
  hw_attention_layer_config config{};  // resolved
  // Dense; the weights as the layer stores them (W_O: this shard's rows).
  std::vector<double> w_q, w_k, w_v, w_o;
  std::vector<float> b_q, b_k, b_v, b_o;
  Variants variants;  // the layer's; arrays of the whole model's n_heads
  int weight_dtype = HW_WEIGHT_FLOAT32;
  bool bf16_compute = false;

  int64_t Width() const { return n_kv_heads * head_dim; }
  // headway.h's hw_kv_cache_slot.
  int64_t Slot(int64_t p) const {
    return !ring || p < sinks ? p : sinks + (p - sinks) % (capacity - sinks);
  }
  // Whether sequence seq holds position p (< its length).
  bool Held(int64_t seq, int64_t p) const {
    return p < sinks || p >= ring_begin[seq];
  }

  void DestroyCache() {
    hw_kv_cache_destroy(cache);
    cache = nullptr;
  }
  void AdoptCache(hw_kv_cache* c, int64_t seqs, int64_t heads, int64_t dim,
                  int64_t cap, int type, bool is_ring = false,
                  int64_t n_sinks = 0) {
    DestroyCache();
    cache = c;
    dtype = type;
    ring = is_ring;
    sinks = n_sinks;
    n_sequences = seqs;
    n_kv_heads = heads;
    head_dim = dim;
    capacity = cap;
    length.assign(seqs, 0);
    ring_begin.assign(seqs, n_sinks);
    k.assign(seqs, std::vector<float>(cap * Width()));
    v = k;
  }
  ~Shadow() {
    DestroyCache();
    hw_attention_layer_destroy(layer);
  }
};

// ------------------------------------------------------------ KV dtypes

bool DtypeOk(int dtype) {
  return dtype >= HW_KV_FLOAT32 && dtype <= HW_KV_INT8;
}

// A dtype: mostly valid, sometimes one outside [0, 3].
int ConsumeDtype(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange(-1, 4);
}

// The largest |read back - x| that the dtype's rounding allows for a finite x
// (headway/kv_cache.h's table) in a row whose largest |x| is row_max: half an
// ulp (at most bfloat16 2^-8 |x|, float16 2^-11 |x| or half its subnormal step
// 2^-25),
// int8 half a step, row_max / 254, each plus float32's rounding.
double RoundingBound(int dtype, double x, double row_max) {
  const double f32 = 2.0 * kU * std::fabs(x);
  switch (dtype) {
    case HW_KV_BFLOAT16:
      return std::fabs(x) * 0x1p-8 + f32 + 0x1p-134;  // + bf16's subnormal step
    case HW_KV_FLOAT16:
      return std::fabs(x) * 0x1p-11 + 0x1p-25 + f32;
    case HW_KV_INT8:
      return row_max / 254.0 * (1.0 + 4 * kU) + f32;
    default:
      return 0.0;
  }
}

// src [n] stored as a row of `dtype` and read back (hw_kv_store_rows, then
// hw_kv_load_rows) into dst [n], and checked against the rounding bound:
// what a cache of that dtype holds for these floats.
void ModelRow(int dtype, const float* src, int64_t n, float* dst) {
  std::vector<unsigned char> stored(static_cast<size_t>(n) * 4);
  float scale = kNaN;
  ExpectStatus(hw_kv_store_rows(dtype, 1, n, src, 0, stored.data(), 0,
                                dtype == HW_KV_INT8 ? &scale : nullptr),
               HW_OK, "hw_kv_store_rows");
  ExpectStatus(hw_kv_load_rows(dtype, 1, n, stored.data(), 0,
                               dtype == HW_KV_INT8 ? &scale : nullptr, dst, 0),
               HW_OK, "hw_kv_load_rows");
  double row_max = 0.0;
  bool finite = true;
  for (int64_t c = 0; c < n; ++c) {
    finite &= std::isfinite(src[c]);
    row_max = std::max(row_max, static_cast<double>(std::fabs(src[c])));
  }
  for (int64_t c = 0; c < n; ++c) {
    const float x = src[c], got = dst[c];
    if (dtype == HW_KV_INT8 && !finite) {
      Check(std::isnan(got), "int8 row with NaN or inf: not NaN", x, got);
    } else if (std::isnan(x)) {
      Check(std::isnan(got), "NaN not kept", x, got);
    } else if (std::isinf(x)) {
      Check(got == x, "inf not kept", x, got);
    } else if (dtype == HW_KV_FLOAT16 && std::fabs(x) >= 65520.0f) {
      Check(got == (x > 0 ? kInf : -kInf), "float16 overflow not inf", x, got);
    } else if (dtype == HW_KV_BFLOAT16 && std::isinf(got)) {
      // Rounds up past FLT_MAX: within half a bfloat16 ulp of it.
      Check(std::fabs(x) >= 0x1.fefffep127f && (got > 0) == (x > 0),
            "bfloat16 inf", x, got);
    } else if (dtype == HW_KV_INT8 && row_max < 127 * 0x1p-126) {
      // A row below 127 * FLT_MIN has scale 0 (kv_cache.h): every element
      // reads back as 0.
      Check(got == 0.0f, "int8 row below 127 * FLT_MIN: not 0", x, got);
    } else if (dtype == HW_KV_INT8 && std::isinf(got)) {
      // scale * q overflows: scale = row_max / 127 rounded up, times 127, for
      // a row_max within float32's rounding of FLT_MAX.
      Check(std::fabs(x) * (1.0 + 4 * kU) >= row_max &&
                row_max >= 0x1.fffffcp127 && (got > 0) == (x > 0),
            "int8 inf", x, got);
    } else {
      Check(std::fabs(got - x) <= RoundingBound(dtype, x, row_max),
            "stored value beyond the rounding bound", x, got);
    }
  }
}

// Rows of one head of one sequence as stored, read back as float32: dense
// [*rows, head_dim], after checking type, size, stride, alignment (16
// elements) and scales.
std::vector<float> StoredRows(const Shadow& s, int64_t seq, int64_t g,
                              bool keys, int64_t* rows) {
  int dtype = -1;
  size_t size = 0;
  const void* data = nullptr;
  const float* scales = nullptr;
  int64_t stride = -1, row_stride = -1;
  *rows = -1;
  ExpectStatus(keys ? hw_kv_cache_stored_keys(s.cache, seq, g, &dtype, &size,
                                              &data, rows, &stride, &scales)
                    : hw_kv_cache_stored_values(s.cache, seq, g, &dtype, &size,
                                                &data, rows, &stride, &scales),
               HW_OK, "hw_kv_cache_stored_keys/values");
  ExpectStatus(hw_kv_cache_shape(s.cache, nullptr, nullptr, nullptr, nullptr,
                                 &row_stride),
               HW_OK, "hw_kv_cache_shape");
  Check(dtype == s.dtype && size == hw_kv_dtype_size(s.dtype), "stored type",
        dtype, static_cast<double>(size));
  Check(stride == row_stride && data != nullptr &&
            reinterpret_cast<uintptr_t>(data) % (16 * size) == 0,
        "stored rows' stride or alignment", stride);
  Check((scales != nullptr) == (s.dtype == HW_KV_INT8), "scales");
  std::vector<float> out(
      static_cast<size_t>(std::max<int64_t>(*rows, 0) * s.head_dim));
  if (*rows > 0) {
    ExpectStatus(hw_kv_load_rows(dtype, *rows, s.head_dim, data, stride, scales,
                                 out.data(), 0),
                 HW_OK, "hw_kv_load_rows");
  }
  return out;
}

// The cache agrees with the model: shape, lengths and every cached row.
void CheckCache(const Shadow& s) {
  if (s.cache == nullptr) return;
  int64_t seqs, heads, dim, cap, row_stride;
  ExpectStatus(
      hw_kv_cache_shape(s.cache, &seqs, &heads, &dim, &cap, &row_stride), HW_OK,
      "hw_kv_cache_shape");
  Check(seqs == s.n_sequences && heads == s.n_kv_heads && dim == s.head_dim &&
            cap == s.capacity,
        "cache shape");
  Check(row_stride >= dim && row_stride % 16 == 0, "row stride", row_stride);
  for (int64_t seq = 0; seq < seqs; ++seq) {
    int64_t length = -1;
    ExpectStatus(hw_kv_cache_length(s.cache, seq, &length), HW_OK,
                 "hw_kv_cache_length");
    Check(length == s.length[seq], "cache length", length, s.length[seq]);
    int64_t ring_begin = -1, sinks = -1;
    int ring = -1;
    ExpectStatus(
        hw_kv_cache_ring_state(s.cache, seq, &ring_begin, &sinks, &ring), HW_OK,
        "hw_kv_cache_ring_state");
    Check(ring == (s.ring ? 1 : 0) && sinks == s.sinks &&
              ring_begin == s.ring_begin[seq],
          "ring state", ring_begin, s.ring_begin[seq]);
    const int64_t held_rows = std::min(length, cap);
    for (int64_t g = 0; g < heads; ++g) {
      for (int which = 0; which < 2; ++which) {
        int64_t rows = -1;
        const std::vector<float> got = StoredRows(s, seq, g, which == 0, &rows);
        Check(rows == held_rows, "cache view", rows, held_rows);
        const std::vector<float>& want = which == 0 ? s.k[seq] : s.v[seq];
        for (int64_t p = 0; p < length; ++p) {
          if (!s.Held(seq, p)) continue;
          int64_t slot = -1;
          ExpectStatus(hw_kv_cache_slot(s.cache, p, &slot), HW_OK,
                       "hw_kv_cache_slot");
          Check(slot == s.Slot(p) && slot < rows, "slot", slot, s.Slot(p));
          Check(std::memcmp(&got[slot * dim], &want[slot * s.Width() + g * dim],
                            dim * sizeof(float)) == 0,
                "cached row differs from the model", p, g);
        }
        // The float32 view: the same rows for a float32 cache, an error
        // naming the type for the others.
        const float* data = nullptr;
        int64_t f32_rows = -1, stride = -1;
        const int status =
            which == 0
                ? hw_kv_cache_keys(s.cache, seq, g, &data, &f32_rows, &stride)
                : hw_kv_cache_values(s.cache, seq, g, &data, &f32_rows,
                                     &stride);
        if (s.dtype != HW_KV_FLOAT32) {
          ExpectStatus(status, HW_INVALID_ARGUMENT, "hw_kv_cache_keys/values");
          Check(data == nullptr && f32_rows == -1, "written on error");
          continue;
        }
        ExpectStatus(status, HW_OK, "hw_kv_cache_keys/values");
        Check(f32_rows == held_rows && stride == row_stride, "float32 view");
        for (int64_t r = 0; r < f32_rows; ++r) {
          Check(std::memcmp(data + r * stride, &got[r * dim],
                            dim * sizeof(float)) == 0,
                "float32 view differs from the stored rows", r, g);
        }
      }
    }
  }
}

// A sequence index: mostly valid, sometimes one past either end.
int64_t ConsumeSeq(FuzzedDataProvider& in, const Shadow& s) {
  return in.ConsumeIntegralInRange<int64_t>(
      -1, std::max<int64_t>(s.n_sequences, 1));
}
bool SeqOk(const Shadow& s, int64_t seq) {
  return seq >= 0 && seq < s.n_sequences;
}

// ----------------------------------------------------------- Cache ops

void OpCacheCreate(FuzzedDataProvider& in, Shadow& s) {
  const int64_t seqs = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t heads = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t dim = in.ConsumeIntegralInRange<int64_t>(0, 20);
  const int64_t cap = in.ConsumeIntegralInRange<int64_t>(0, 9);
  const int dtype = ConsumeDtype(in);
  // hw_kv_cache_create is the float32 one.
  const bool typed = dtype != HW_KV_FLOAT32 || in.ConsumeBool();
  hw_kv_cache* cache = nullptr;
  const int want =
      seqs < 1 || heads < 1 || dim < 1 || cap < 1 || !DtypeOk(dtype)
          ? HW_INVALID_ARGUMENT
          : HW_OK;
  ExpectStatus(
      typed ? hw_kv_cache_create_typed(seqs, heads, dim, cap, dtype, &cache)
            : hw_kv_cache_create(seqs, heads, dim, cap, &cache),
      want, "hw_kv_cache_create");
  if (want != HW_OK) {
    Check(cache == nullptr, "*out written on error");
    return;
  }
  int got = -1;
  size_t size = 0;
  ExpectStatus(hw_kv_cache_dtype(cache, &got, &size), HW_OK,
               "hw_kv_cache_dtype");
  Check(got == dtype && size == hw_kv_dtype_size(dtype), "hw_kv_cache_dtype");
  s.AdoptCache(cache, seqs, heads, dim, cap, dtype);
}

// hw_kv_cache_create_ring, n_sink_tokens in [-1, capacity].
void OpCacheCreateRing(FuzzedDataProvider& in, Shadow& s) {
  const int64_t seqs = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t heads = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t dim = in.ConsumeIntegralInRange<int64_t>(0, 20);
  const int64_t cap = in.ConsumeIntegralInRange<int64_t>(0, 9);
  const int64_t sinks = in.ConsumeIntegralInRange<int64_t>(-1, cap);
  const int dtype = ConsumeDtype(in);
  hw_kv_cache* cache = nullptr;
  const int want = seqs < 1 || heads < 1 || dim < 1 || cap < 1 ||
                           !DtypeOk(dtype) || sinks < 0 || sinks >= cap
                       ? HW_INVALID_ARGUMENT
                       : HW_OK;
  ExpectStatus(
      hw_kv_cache_create_ring(seqs, heads, dim, cap, sinks, dtype, &cache),
      want, "hw_kv_cache_create_ring");
  if (want != HW_OK) {
    Check(cache == nullptr, "*out written on error");
    return;
  }
  s.AdoptCache(cache, seqs, heads, dim, cap, dtype, true, sinks);
}

void OpCacheAppend(FuzzedDataProvider& in, Shadow& s) {
  const int64_t seq = ConsumeSeq(in, s);
  const int64_t width = s.Width();
  // A ring takes any n_new: up to three times around it.
  const int64_t room = !SeqOk(s, seq) ? 0
                       : s.ring       ? 3 * s.capacity
                                      : s.capacity - s.length[seq];
  int64_t n_new = in.ConsumeIntegralInRange<int64_t>(-1, room + 2);
  if (in.ConsumeIntegralInRange(0, 15) == 15) n_new = INT64_MAX;
  const int64_t k_stride = ConsumeStride(in, width);
  const int64_t v_stride = ConsumeStride(in, width);
  // Rows for every valid n_new (up to room + 2: a layer's ring of window +
  // sinks <= 24 rows takes 74), but not for INT64_MAX: a call the model
  // rejects must not read them (ASan would see it).
  const int64_t rows =
      std::clamp<int64_t>(n_new, 1, std::max<int64_t>(32, room + 2));
  const std::vector<float> k = MakeMatrix(in, rows, width, k_stride, true);
  const std::vector<float> v = MakeMatrix(in, rows, width, v_stride, true);
  const bool null_k = in.ConsumeIntegralInRange(0, 31) == 31;
  // headway.h: n_new rows at their stride that overflow the address space
  // (n_new = INT64_MAX) are RESOURCE_EXHAUSTED, checked before the capacity.
  const bool huge = n_new == INT64_MAX;
  const bool fits = s.ring || n_new <= room;  // a ring has no capacity limit
  int want = HW_OK, also = -1;
  if (s.cache == nullptr || !SeqOk(s, seq) || n_new < 1 || null_k ||
      !StrideOk(k_stride, width) || !StrideOk(v_stride, width)) {
    want = HW_INVALID_ARGUMENT;
    if (s.cache != nullptr && SeqOk(s, seq) && (huge || !fits))
      also = huge ? HW_RESOURCE_EXHAUSTED : HW_OUT_OF_RANGE;
  } else if (huge) {
    want = HW_RESOURCE_EXHAUSTED;
  } else if (!fits) {
    want = HW_OUT_OF_RANGE;
  }
  ExpectStatus(
      hw_kv_cache_append(s.cache, seq, n_new, null_k ? nullptr : k.data(),
                         k_stride, v.data(), v_stride),
      want, "hw_kv_cache_append", also);
  if (want != HW_OK) return;
  const int64_t new_length = s.length[seq] + n_new;
  for (int64_t r = 0; r < n_new; ++r) {
    // A ring keeps the sinks and its last capacity - sinks positions.
    const int64_t p = s.length[seq] + r;
    if (s.ring && p >= s.sinks && p < new_length - (s.capacity - s.sinks)) {
      continue;
    }
    const int64_t at = s.Slot(p) * width;
    for (int64_t g = 0; g < s.n_kv_heads; ++g) {
      const int64_t col = g * s.head_dim;
      ModelRow(s.dtype, &k[r * Dense(k_stride, width) + col], s.head_dim,
               &s.k[seq][at + col]);
      ModelRow(s.dtype, &v[r * Dense(v_stride, width) + col], s.head_dim,
               &s.v[seq][at + col]);
    }
  }
  s.length[seq] = new_length;
  if (s.ring) {
    s.ring_begin[seq] =
        std::max(s.ring_begin[seq], new_length - (s.capacity - s.sinks));
  }
}

void OpCacheTruncate(FuzzedDataProvider& in, Shadow& s) {
  const int64_t seq = ConsumeSeq(in, s);
  const int64_t length = SeqOk(s, seq) ? s.length[seq] : 0;
  const int64_t new_length = in.ConsumeIntegralInRange<int64_t>(-1, length + 1);
  int want = HW_OK;
  if (s.cache == nullptr || !SeqOk(s, seq)) {
    want = HW_INVALID_ARGUMENT;
  } else if (new_length < 0 || new_length > length) {
    want = HW_OUT_OF_RANGE;
  } else if (s.ring_begin[seq] > s.sinks && new_length < s.ring_begin[seq]) {
    want = HW_OUT_OF_RANGE;  // the ring has overwritten those positions
  }
  ExpectStatus(hw_kv_cache_truncate(s.cache, seq, new_length), want,
               "hw_kv_cache_truncate");
  if (want == HW_OK) s.length[seq] = new_length;
}

void OpCacheCopy(FuzzedDataProvider& in, Shadow& s) {
  const int64_t from = ConsumeSeq(in, s), to = ConsumeSeq(in, s);
  const int want = s.cache == nullptr || !SeqOk(s, from) || !SeqOk(s, to)
                       ? HW_INVALID_ARGUMENT
                       : HW_OK;
  ExpectStatus(hw_kv_cache_copy_sequence(s.cache, from, to), want,
               "hw_kv_cache_copy_sequence");
  if (want != HW_OK || from == to) return;
  // Rows past the length are not part of the contract: copy only the rows
  // that hold data.
  const int64_t n = std::min(s.length[from], s.capacity) * s.Width();
  std::copy(s.k[from].begin(), s.k[from].begin() + n, s.k[to].begin());
  std::copy(s.v[from].begin(), s.v[from].begin() + n, s.v[to].begin());
  s.length[to] = s.length[from];
  s.ring_begin[to] = s.ring_begin[from];
}

void OpCacheReset(FuzzedDataProvider& in, Shadow& s) {
  if (in.ConsumeBool()) {
    const int want = s.cache == nullptr ? HW_INVALID_ARGUMENT : HW_OK;
    ExpectStatus(hw_kv_cache_reset_all(s.cache), want, "hw_kv_cache_reset_all");
    if (want == HW_OK) {
      std::fill(s.length.begin(), s.length.end(), 0);
      std::fill(s.ring_begin.begin(), s.ring_begin.end(), s.sinks);
    }
    return;
  }
  const int64_t seq = ConsumeSeq(in, s);
  const int want =
      s.cache == nullptr || !SeqOk(s, seq) ? HW_INVALID_ARGUMENT : HW_OK;
  ExpectStatus(hw_kv_cache_reset(s.cache, seq), want, "hw_kv_cache_reset");
  if (want == HW_OK) {
    s.length[seq] = 0;
    s.ring_begin[seq] = s.sinks;
  }
}

void OpCacheCheck(FuzzedDataProvider&, Shadow& s) { CheckCache(s); }

// ------------------------------------------------------------- Kernels

// Softmax rows against float64, with NaN and +-inf inputs (the contract says
// what they give).
void OpSoftmax(FuzzedDataProvider& in, Shadow&) {
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 4);
  // Mostly short rows (tails on every target); sometimes rows of several
  // 2048-element blocks.
  const int64_t cols = in.ConsumeIntegralInRange(0, 15) == 15
                           ? in.ConsumeIntegralInRange<int64_t>(2040, 4200)
                           : in.ConsumeIntegralInRange<int64_t>(0, 40);
  const int64_t x_stride = ConsumeStride(in, cols);
  // 0: separate y; 1: in place; 2: y one element after x (a partial overlap).
  int placement = in.ConsumeIntegralInRange(0, 5) % 3;
  // With rows of one element, y = x + 1 may interleave with x or meet it:
  // keep that case out of the model.
  if (placement == 2 && cols < 2) placement = 1;
  const int64_t y_stride = placement == 0 ? ConsumeStride(in, cols) : x_stride;
  float scale = in.ConsumeBool() ? 1.0f : ConsumeFloat(in, false, 3.0f);
  if (in.ConsumeIntegralInRange(0, 31) == 31)
    scale = in.ConsumeBool() ? kNaN : kInf;
  const float mag = in.PickValueInArray({1.0f, 30.0f, 1e30f});
  const int64_t r_alloc = std::max<int64_t>(rows, 1);
  const int64_t c_alloc = std::max<int64_t>(cols, 1);
  std::vector<float> x = MakeMatrix(in, r_alloc, c_alloc, x_stride, true, mag);
  std::vector<float> y;
  if (placement == 0) y = MakeMatrix(in, r_alloc, c_alloc, y_stride, false);
  if (placement == 2) x.push_back(kNaN);  // room for y = x + 1
  const std::vector<float> x_before = x, y_before = y;
  float* yp = placement == 0 ? y.data() : x.data() + (placement == 2 ? 1 : 0);

  bool invalid = rows < 1 || cols < 1 || !StrideOk(x_stride, cols) ||
                 !StrideOk(y_stride, cols) || !std::isfinite(scale);
  // y = x + 1 with rows of two or more elements shares elements with x.
  if (placement == 2) invalid = true;
  const int want = invalid ? HW_INVALID_ARGUMENT : HW_OK;
  ExpectStatus(
      hw_softmax_rows(rows, cols, x.data(), x_stride, yp, y_stride, scale),
      want, "hw_softmax_rows");
  if (want != HW_OK || placement == 2) {
    if (want != HW_OK)
      Check(SameBits(x, x_before) && SameBits(y, y_before),
            "hw_softmax_rows wrote on error");
    return;
  }
  const int64_t xs = Dense(x_stride, cols), ys = Dense(y_stride, cols);
  std::vector<double> z(cols);
  for (int64_t r = 0; r < rows; ++r) {
    // z rounded to float, as the contract defines it; the reference is then
    // exact in double.
    bool poison = false;
    double m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) {
      const float zf = scale * x_before[r * xs + c];
      z[c] = zf;
      poison |= !(zf < kInf);
      m = std::max(m, z[c]);
    }
    double sum = 0.0;
    if (!poison && m != -INFINITY)
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(z[c] - m);
    for (int64_t c = 0; c < cols; ++c) {
      const float got = yp[r * ys + c];
      if (poison) {
        Check(std::isnan(got), "softmax: a NaN/+inf row must be NaN", r, c);
      } else if (m == -INFINITY) {
        Check(got == 0.0f, "softmax: an all -inf row must be zeros", r, got);
      } else {
        const double want_y = std::exp(z[c] - m) / sum;
        // softmax.h's bound for a z already rounded to float: (6 + |z - m|) u
        // relative; 2 more u for the exp of a z - m that itself rounds (|z -
        // m| u is in the bound), and 2^-126 absolute for outputs below the
        // normal range, where float32 has only absolute precision and
        // Highway's Exp flushes below e^-104.
        const double tol =
            (want_y > 0.0 ? (8.0 + std::fabs(z[c] - m)) * kU * want_y : 0.0) +
            0x1p-126;
        if (!(std::fabs(got - want_y) <= tol)) {
          std::fprintf(stderr, "row %lld col %lld of %lld, z %g, max %g\n",
                       static_cast<long long>(r), static_cast<long long>(c),
                       static_cast<long long>(cols), z[c], m);
          Fail("softmax differs from float64", got, want_y);
        }
      }
    }
    // Padding between rows is not the kernel's.
    if (r + 1 < rows && placement == 0) {
      for (int64_t c = cols; c < ys; ++c)
        Check(SameBits({y[r * ys + c]}, {y_before[r * ys + c]}),
              "softmax wrote into y's padding");
    }
  }
}

// C = alpha op(A) op(B) + beta C against float64 within matmul.h's bound.
void OpMatmul(FuzzedDataProvider& in, Shadow&) {
  const int64_t big = in.ConsumeIntegralInRange(0, 7) == 7 ? 70 : 9;
  const int64_t m = in.ConsumeIntegralInRange<int64_t>(0, big);
  const int64_t n = in.ConsumeIntegralInRange<int64_t>(0, big);
  const int64_t k = in.ConsumeIntegralInRange<int64_t>(0, big);
  const int ta = in.ConsumeIntegralInRange(0, 31) == 31 ? 2 : in.ConsumeBool();
  const int tb = in.ConsumeBool();
  // Stored shapes: a is [m, k] or [k, m]; b is [k, n] or [n, k].
  const int64_t ar = ta == 1 ? k : m, ac = ta == 1 ? m : k;
  const int64_t br = tb ? n : k, bc = tb ? k : n;
  const int64_t lda = ConsumeStride(in, ac), ldb = ConsumeStride(in, bc);
  const int64_t ldc = ConsumeStride(in, n);
  const float alpha = in.ConsumeBool() ? 1.0f : ConsumeFloat(in, false, 2.0f);
  float beta = in.ConsumeBool() ? 0.0f : ConsumeFloat(in, false, 2.0f);
  if (in.ConsumeIntegralInRange(0, 31) == 31) beta = kInf;
  auto alloc = [](int64_t v) { return std::max<int64_t>(v, 1); };
  const std::vector<float> a =
      MakeMatrix(in, alloc(ar), alloc(ac), lda, false, 2.0f);
  const std::vector<float> b =
      MakeMatrix(in, alloc(br), alloc(bc), ldb, false, 2.0f);
  std::vector<float> c = MakeMatrix(in, alloc(m), alloc(n), ldc, false, 2.0f);
  // beta == 0 must not read C: a NaN there does not survive.
  if (beta == 0.0f && !c.empty()) c[0] = kNaN;
  const std::vector<float> c_before = c;
  // c overlapping a is an error; point c into a's buffer sometimes.
  const bool overlap = in.ConsumeIntegralInRange(0, 31) == 31;
  const int want = m < 1 || n < 1 || k < 1 || ta > 1 || !StrideOk(lda, ac) ||
                           !StrideOk(ldb, bc) || !StrideOk(ldc, n) ||
                           !std::isfinite(alpha) || !std::isfinite(beta) ||
                           overlap
                       ? HW_INVALID_ARGUMENT
                       : HW_OK;
  float* cp = overlap ? const_cast<float*>(a.data()) : c.data();
  const std::vector<float> a_before = a;
  ExpectStatus(hw_matmul(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb,
                         beta, cp, ldc),
               want, "hw_matmul");
  if (want != HW_OK) {
    Check(SameBits(c, c_before) && SameBits(a, a_before),
          "hw_matmul wrote on error");
    return;
  }
  const int64_t sa = Dense(lda, ac), sb = Dense(ldb, bc), sc = Dense(ldc, n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * sa + i] : a[i * sa + p];
        const double bv = tb ? b[j * sb + p] : b[p * sb + j];
        dot += av * bv;
        mag += std::fabs(av * bv);
      }
      const double c_old = beta == 0.0f ? 0.0 : c_before[i * sc + j];
      const double want_c = alpha * dot + beta * c_old;
      // matmul.h's bound: (K + K / 512 + 3) u (|alpha| sum |a||b| + |beta|
      // |c_old|), plus the smallest normal for products that underflow.
      const double tol =
          (k + k / 512 + 3) * kU *
              (std::fabs(alpha) * mag + std::fabs(beta) * std::fabs(c_old)) +
          0x1p-126;
      Check(std::fabs(c[i * sc + j] - want_c) <= tol,
            "hw_matmul differs from float64", c[i * sc + j], want_c);
    }
    for (int64_t j = n; i + 1 < m && j < sc; ++j)
      Check(SameBits({c[i * sc + j]}, {c_before[i * sc + j]}),
            "hw_matmul wrote into c's padding");
  }
}

// ---------------------------------------------------- Attention layer ops

// Creates a layer of small random shape; one field is sometimes made invalid.
void OpLayerCreate(FuzzedDataProvider& in, Shadow& s) {
  hw_attention_layer_config cfg{};
  cfg.n_heads = in.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t group_choice = in.ConsumeIntegralInRange<int64_t>(0, 3);
  cfg.n_kv_heads = group_choice == 0 ? 0
                   : group_choice == 1
                       ? 1
                       : (cfg.n_heads % 2 == 0 ? cfg.n_heads / 2 : cfg.n_heads);
  cfg.head_dim = in.ConsumeIntegralInRange<int64_t>(0, 9);
  cfg.d_model = cfg.head_dim == 0
                    ? cfg.n_heads * in.ConsumeIntegralInRange<int64_t>(1, 3)
                    : in.ConsumeIntegralInRange<int64_t>(1, 12);
  cfg.mask = in.ConsumeBool() ? HW_MASK_CAUSAL : HW_MASK_NONE;
  cfg.scale = in.ConsumeBool() ? 0.0f : in.ConsumeProbability<float>() * 2.0f;
  const int64_t kvh = cfg.n_kv_heads == 0 ? cfg.n_heads : cfg.n_kv_heads;
  const int64_t group = cfg.n_heads / kvh;
  if (kvh > 1 && in.ConsumeBool()) {  // a shard on group boundaries
    const int64_t g0 = in.ConsumeIntegralInRange<int64_t>(0, kvh - 1);
    const int64_t g1 = in.ConsumeIntegralInRange<int64_t>(g0 + 1, kvh);
    cfg.head_begin = g0 * group;
    cfg.head_end = g1 * group;
  }
  bool invalid = false;
  switch (in.ConsumeIntegralInRange(0, 24)) {
    case 17:
      cfg.d_model = 0;
      invalid = true;
      break;
    case 18:
      cfg.n_heads = -1;
      invalid = true;
      break;
    case 19:
      cfg.n_kv_heads = cfg.n_heads + 1;
      invalid = true;
      break;
    case 20:
      cfg.head_dim = -1;
      invalid = true;
      break;
    case 21:
      cfg.scale = -1.0f;
      invalid = true;
      break;
    case 22:
      cfg.scale = kInf;
      invalid = true;
      break;
    case 23:
      cfg.mask = 2;
      invalid = true;
      break;
    case 24:
      cfg.head_begin = 0;
      cfg.head_end = cfg.n_heads + 1;
      invalid = true;
      break;
    default:
      break;
  }
  const int64_t hd = cfg.head_dim > 0 ? cfg.head_dim
                                      : std::max<int64_t>(cfg.d_model, 1) /
                                            std::max<int64_t>(cfg.n_heads, 1);
  const int64_t d = std::max<int64_t>(cfg.d_model, 1);
  const int64_t hq = std::max<int64_t>(cfg.n_heads, 1) * hd;
  const int64_t hkv = std::max<int64_t>(kvh, 1) * hd;
  // Weights in [-1, 1]; the invalid cases do not depend on them.
  hw_attention_layer_weights w{};
  std::vector<float> wq = MakeMatrix(in, d, std::max<int64_t>(hq, 1), 0, false,
                                     1.0f),
                     wk = MakeMatrix(in, d, std::max<int64_t>(hkv, 1), 0, false,
                                     1.0f),
                     wv = MakeMatrix(in, d, std::max<int64_t>(hkv, 1), 0, false,
                                     1.0f),
                     wo = MakeMatrix(in, std::max<int64_t>(hq, 1), d, 0, false,
                                     1.0f);
  w.w_q = {wq.data(), d, hq, 0};
  w.w_k = {wk.data(), d, hkv, 0};
  w.w_v = {wv.data(), d, hkv, 0};
  w.w_o = {wo.data(), hq, d, 0};
  const bool bias = in.ConsumeBool();
  std::vector<float> bq = MakeMatrix(in, 1, std::max<int64_t>(hq, 1), 0, false,
                                     1.0f),
                     bk = MakeMatrix(in, 1, std::max<int64_t>(hkv, 1), 0, false,
                                     1.0f),
                     bv = MakeMatrix(in, 1, std::max<int64_t>(hkv, 1), 0, false,
                                     1.0f),
                     bo = MakeMatrix(in, 1, d, 0, false, 1.0f);
  if (bias) {
    w.b_q = bq.data();
    w.b_k = bk.data();
    w.b_v = bv.data();
    w.b_o = bo.data();
  }
  if (!invalid && in.ConsumeIntegralInRange(0, 15) == 15) {
    w.w_k.cols += 1;  // the wrong shape
    invalid = true;
  }
  // 0: hw_attention_layer_create; 1: _with_variants(NULL); 2, 3: with the
  // attention variants (the whole model's arrays; QK-norm and RoPE are
  // capi_test's, not modelled here).
  const int kind = in.ConsumeIntegralInRange(0, 3);
  Variants var;
  Growing<hw_attention_layer_variants> lv;
  if (kind >= 2) {
    var = ConsumeVariants(in, cfg.n_heads, &invalid);
    SetVariantFields(var, &lv.v);
    ConsumeStructSize(in, HW_ATTENTION_LAYER_VARIANTS_V1_SIZE, &lv, &var,
                      &invalid);
  }
  // Weight storage, read from a version 3 struct_size on; an older one's
  // bytes there are garbage the library must not read (float32).
  int weight_dtype = HW_WEIGHT_FLOAT32, compute = HW_COMPUTE_FLOAT32;
  if (kind >= 2) {
    lv.v.weight_dtype = in.ConsumeIntegralInRange(-1, 3);
    lv.v.projection_compute = in.ConsumeIntegralInRange(-1, 2);
    if (lv.v.struct_size >= HW_ATTENTION_LAYER_VARIANTS_V3_SIZE) {
      weight_dtype =
          in.ConsumeIntegralInRange<int>(HW_WEIGHT_FLOAT32, HW_WEIGHT_INT8);
      switch (in.ConsumeIntegralInRange(0, 7)) {
        case 5:  // valid over bf16 and int8 weights
          compute = HW_COMPUTE_BFLOAT16;
          invalid |= weight_dtype == HW_WEIGHT_FLOAT32;
          break;
        case 6:
          weight_dtype = in.ConsumeBool() ? -1 : 3;
          invalid = true;
          break;
        case 7:
          compute = in.ConsumeBool() ? -1 : 2;
          invalid = true;
          break;
        default:
          break;
      }
      // int8 cannot store a NaN of the weights the layer packs (a column of
      // its first KV head).
      if (!invalid && weight_dtype == HW_WEIGHT_INT8 && in.ConsumeBool()) {
        wk[cfg.head_begin / group * hd] = kNaN;
        invalid = true;
      }
      lv.v.weight_dtype = weight_dtype;
      lv.v.projection_compute = compute;
    }
  }
  hw_attention_layer* layer = nullptr;
  ExpectStatus(kind == 0 ? hw_attention_layer_create(&cfg, &w, &layer)
                         : hw_attention_layer_create_with_variants(
                               &cfg, &w, kind >= 2 ? &lv.v : nullptr, &layer),
               invalid ? HW_INVALID_ARGUMENT : HW_OK,
               "hw_attention_layer_create");
  if (invalid) {
    Check(layer == nullptr, "*out written on error");
    return;
  }
  // The layer reports its variants, the arrays as its own copies.
  hw_attention_layer_variants got{};
  got.struct_size = sizeof(got);
  ExpectStatus(hw_attention_layer_get_variants(layer, &got), HW_OK,
               "hw_attention_layer_get_variants");
  Check(got.window == var.window && got.n_sink_tokens == var.n_sinks &&
            got.softcap == var.softcap && got.qk_norm == 0 &&
            got.rope.rotary_dim == 0 && got.weight_dtype == weight_dtype &&
            got.projection_compute == compute,
        "hw_attention_layer_get_variants", static_cast<double>(got.window),
        got.softcap);
  const size_t array_bytes = static_cast<size_t>(cfg.n_heads) * sizeof(float);
  Check(var.slopes.empty()
            ? got.alibi_slopes == nullptr
            : got.alibi_slopes != nullptr &&
                  got.alibi_slopes != var.slopes.data() &&
                  std::memcmp(got.alibi_slopes, var.slopes.data(),
                              array_bytes) == 0,
        "hw_attention_layer_get_variants: alibi_slopes");
  Check(var.sinks.empty() ? got.sink_logits == nullptr
                          : got.sink_logits != nullptr &&
                                got.sink_logits != var.sinks.data() &&
                                std::memcmp(got.sink_logits, var.sinks.data(),
                                            array_bytes) == 0,
        "hw_attention_layer_get_variants: sink_logits");
  hw_attention_layer_destroy(s.layer);
  s.layer = layer;
  ExpectStatus(hw_attention_layer_get_config(layer, &s.config), HW_OK,
               "hw_attention_layer_get_config");
  const hw_attention_layer_config& r = s.config;
  Check(r.n_kv_heads == kvh && r.head_dim == hd && r.d_model == cfg.d_model,
        "resolved config");
  Check(cfg.scale != 0.0f ? r.scale == cfg.scale
                          : std::fabs(r.scale - 1.0 / std::sqrt(hd)) < 1e-6,
        "resolved scale", r.scale);
  Check(cfg.head_end != 0
            ? r.head_begin == cfg.head_begin && r.head_end == cfg.head_end
            : r.head_begin == 0 && r.head_end == cfg.n_heads,
        "resolved head range");
  // The weights as stored: int8 scales are per column of what the layer
  // packs, its columns of W_Q, W_K and W_V and its rows of W_O.
  const headway::WeightDtype stored =
      static_cast<headway::WeightDtype>(weight_dtype);
  namespace ref = headway::test::ref;
  s.w_q = ref::StoredWeights(wq.data(), d, hq, hq, stored);
  s.w_k = ref::StoredWeights(wk.data(), d, hkv, hkv, stored);
  s.w_v = ref::StoredWeights(wv.data(), d, hkv, hkv, stored);
  const int64_t o_row0 = r.head_begin * hd;
  const int64_t o_rows = (r.head_end - r.head_begin) * hd;
  s.w_o.assign(wo.begin(), wo.end());
  const std::vector<double> o_part =
      ref::StoredWeights(wo.data() + o_row0 * d, o_rows, d, d, stored);
  std::copy(o_part.begin(), o_part.end(), s.w_o.begin() + o_row0 * d);
  s.weight_dtype = weight_dtype;
  s.bf16_compute = compute == HW_COMPUTE_BFLOAT16;
  s.b_q = bias ? bq : std::vector<float>(hq, 0.0f);
  s.b_k = bias ? bk : std::vector<float>(hkv, 0.0f);
  s.b_v = bias ? bv : std::vector<float>(hkv, 0.0f);
  s.b_o = bias ? bo : std::vector<float>(d, 0.0f);
  s.variants = var;
}

void OpLayerCreateCache(FuzzedDataProvider& in, Shadow& s) {
  const int64_t seqs = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t cap = in.ConsumeIntegralInRange<int64_t>(0, 8);
  const int dtype = ConsumeDtype(in);
  const bool typed = dtype != HW_KV_FLOAT32 || in.ConsumeBool();
  hw_kv_cache* cache = nullptr;
  const int want = s.layer == nullptr || seqs < 1 || cap < 1 || !DtypeOk(dtype)
                       ? HW_INVALID_ARGUMENT
                       : HW_OK;
  ExpectStatus(
      typed ? hw_attention_layer_create_cache_typed(s.layer, seqs, cap, dtype,
                                                    &cache)
            : hw_attention_layer_create_cache(s.layer, seqs, cap, &cache),
      want, "hw_attention_layer_create_cache");
  if (want != HW_OK) {
    Check(cache == nullptr, "*out written on error");
    return;
  }
  const hw_attention_layer_config& c = s.config;
  const int64_t group = c.n_heads / c.n_kv_heads;
  s.AdoptCache(cache, seqs, (c.head_end - c.head_begin) / group, c.head_dim,
               cap, dtype);
}

// hw_attention_layer_create_ring_cache: window + n_sink_tokens rows with the
// layer's n_sink_tokens; an error for a layer without a window.
void OpLayerCreateRingCache(FuzzedDataProvider& in, Shadow& s) {
  const int64_t seqs = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int dtype = ConsumeDtype(in);
  hw_kv_cache* cache = nullptr;
  const int want =
      s.layer == nullptr || s.variants.window < 1 || seqs < 1 || !DtypeOk(dtype)
          ? HW_INVALID_ARGUMENT
          : HW_OK;
  ExpectStatus(
      hw_attention_layer_create_ring_cache(s.layer, seqs, dtype, &cache), want,
      "hw_attention_layer_create_ring_cache");
  if (want != HW_OK) {
    Check(cache == nullptr, "*out written on error");
    return;
  }
  const hw_attention_layer_config& c = s.config;
  const int64_t group = c.n_heads / c.n_kv_heads;
  s.AdoptCache(cache, seqs, (c.head_end - c.head_begin) / group, c.head_dim,
               s.variants.window + s.variants.n_sinks, dtype, true,
               s.variants.n_sinks);
}

// One forward call: predicted status and lengths; on success the appended K
// and V rows and y against float64. On a ring cache, a token whose keys were
// overwritten by later tokens of the call is checked to be finite only.
void OpLayerForward(FuzzedDataProvider& in, Shadow& s) {
  const hw_attention_layer_config& c = s.config;
  const int64_t n_seq = in.ConsumeIntegralInRange<int64_t>(0, 3);
  std::vector<hw_layer_sequence> seqs(std::max<int64_t>(n_seq, 1));
  bool invalid = s.layer == nullptr || s.cache == nullptr || n_seq < 1;
  bool out_of_range = false;
  int64_t total = 0;
  for (int64_t i = 0; i < n_seq; ++i) {
    seqs[i].seq = ConsumeSeq(in, s);
    seqs[i].n_tokens = in.ConsumeIntegralInRange<int64_t>(0, 3);
    invalid |= !SeqOk(s, seqs[i].seq) || seqs[i].n_tokens < 1;
    for (int64_t j = 0; j < i; ++j) invalid |= seqs[j].seq == seqs[i].seq;
    // A ring takes any number of tokens.
    if (SeqOk(s, seqs[i].seq) && !s.ring)
      out_of_range |= s.length[seqs[i].seq] + seqs[i].n_tokens > s.capacity;
    total += std::max<int64_t>(seqs[i].n_tokens, 0);
  }
  const int64_t d = s.layer ? c.d_model : 1;
  if (s.layer && s.cache) {
    const int64_t group = c.n_heads / c.n_kv_heads;
    invalid |= s.n_kv_heads != (c.head_end - c.head_begin) / group ||
               s.head_dim != c.head_dim;
    // layer.h: a ring cache needs the layer's window to fit it and its
    // n_sink_tokens.
    invalid |= s.ring && (s.variants.window < 1 ||
                          s.variants.window > s.capacity - s.sinks ||
                          s.variants.n_sinks != s.sinks);
  }
  const int64_t x_stride = ConsumeStride(in, d),
                y_stride = ConsumeStride(in, d);
  invalid |= !StrideOk(x_stride, d) || !StrideOk(y_stride, d);
  const int64_t t_alloc = std::max<int64_t>(total, 1);
  const std::vector<float> x =
      MakeMatrix(in, t_alloc, d, x_stride, false, 1.0f);
  std::vector<float> y = MakeMatrix(in, t_alloc, d, y_stride, false);
  const std::vector<float> y_before = y;
  const std::vector<int64_t> length_before = s.length;
  // Per call sequence: whether the rows it held before the call are within
  // [-1e3, 1e3] (rows appended through hw_kv_cache_append may hold NaN, inf
  // or huge values, for which headway.h states no result); the new rows,
  // projections of x and weights in [-1, 1], always are.
  std::vector<bool> tame(static_cast<size_t>(std::max<int64_t>(n_seq, 1)));
  for (int64_t i = 0; i < n_seq && SeqOk(s, seqs[i].seq); ++i) {
    const int64_t seq = seqs[i].seq;
    bool ok = true;
    for (int64_t p = 0; p < s.length[seq]; ++p) {
      if (!s.Held(seq, p)) continue;
      for (int64_t e = s.Slot(p) * s.Width(); e < (s.Slot(p) + 1) * s.Width();
           ++e)
        ok &= std::fabs(s.k[seq][e]) <= 1e3f && std::fabs(s.v[seq][e]) <= 1e3f;
    }
    tame[i] = ok;
  }
  const int want = invalid        ? HW_INVALID_ARGUMENT
                   : out_of_range ? HW_OUT_OF_RANGE
                                  : HW_OK;
  ExpectStatus(
      hw_attention_layer_forward(s.layer, s.cache, seqs.data(), n_seq, x.data(),
                                 x_stride, y.data(), y_stride),
      want, "hw_attention_layer_forward",
      invalid && out_of_range ? HW_OUT_OF_RANGE : -1);
  if (want != HW_OK) {
    Check(SameBits(y, y_before), "hw_attention_layer_forward wrote on error");
    CheckCache(s);  // lengths and rows unchanged
    return;
  }
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const int64_t h0 = c.head_begin, n_local = c.head_end - c.head_begin;
  const int64_t g0 = h0 / group, kv_local = n_local / group;
  const int64_t hq = c.n_heads * hd, hkv = c.n_kv_heads * hd;
  const int64_t width = s.Width(), xs = Dense(x_stride, d);
  const int64_t ys = Dense(y_stride, d);
  // x W + b for output column `col` of W [d, cols], and the bound of a float32
  // dot product of length d (+1 for the bias; int8: +1 for the scale, d <=
  // 512 being one K block), plus in the bf16 compute mode x's rounding to
  // bfloat16 (2^-8 of each product at most).
  const double rounds = d + 4 + (s.weight_dtype == HW_WEIGHT_INT8 ? 1 : 0);
  const double x_rounding = s.bf16_compute ? 0x1p-8 : 0.0;
  auto project = [&](const std::vector<double>& w, const std::vector<float>& b,
                     int64_t cols, int64_t t, int64_t col, double* bound) {
    double sum = b[col], mag = std::fabs(b[col]);
    for (int64_t p = 0; p < d; ++p) {
      sum += static_cast<double>(x[t * xs + p]) * w[p * cols + col];
      mag += std::fabs(static_cast<double>(x[t * xs + p]) * w[p * cols + col]);
    }
    *bound = (rounds * kU + x_rounding) * mag;
    return sum;
  };
  int64_t t = 0;
  for (int64_t i = 0; i < n_seq; ++i) {
    const int64_t seq = seqs[i].seq, len0 = length_before[seq];
    const int64_t len1 = len0 + seqs[i].n_tokens;
    // The positions held after the call (a ring's last capacity - sinks and
    // its sinks).
    if (s.ring)
      s.ring_begin[seq] =
          std::max(s.ring_begin[seq], len1 - (s.capacity - s.sinks));
    for (int64_t j = 0; j < seqs[i].n_tokens; ++j, ++t) {
      // A row a later token of the call overwrote: gone.
      if (!s.Held(seq, len0 + j)) continue;
      const int64_t slot = s.Slot(len0 + j);
      // The new K and V rows, read back from the cache into the model:
      // float64's projection within the float32 dot product's bound plus the
      // storage rounding (int8's relative to the row's largest |value|).
      for (int64_t g = 0; g < kv_local; ++g) {
        int64_t rows = -1, v_rows = -1;
        const std::vector<float> kd = StoredRows(s, seq, g, true, &rows);
        const std::vector<float> vd = StoredRows(s, seq, g, false, &v_rows);
        Check(rows == std::min(len1, s.capacity) && v_rows == rows,
              "length after forward", rows);
        const float* k_row = &kd[slot * hd];
        const float* v_row = &vd[slot * hd];
        double k_max = 0.0, v_max = 0.0;
        for (int64_t p = 0; p < hd; ++p) {
          k_max = std::max(k_max, std::fabs(static_cast<double>(k_row[p])));
          v_max = std::max(v_max, std::fabs(static_cast<double>(v_row[p])));
        }
        // The stored row's largest |value| is within a step of the
        // projection's.
        k_max *= 1.0 + 1.0 / 64;
        v_max *= 1.0 + 1.0 / 64;
        for (int64_t p = 0; p < hd; ++p) {
          const int64_t col = (g0 + g) * hd + p;
          double bound;
          const double kw = project(s.w_k, s.b_k, hkv, t, col, &bound);
          Check(
              std::fabs(k_row[p] - kw) <= bound * (1.0 + 0x1p-7) + 0x1p-126 +
                                              RoundingBound(s.dtype, kw, k_max),
              "forward: K row", k_row[p], kw);
          const double vw = project(s.w_v, s.b_v, hkv, t, col, &bound);
          Check(
              std::fabs(v_row[p] - vw) <= bound * (1.0 + 0x1p-7) + 0x1p-126 +
                                              RoundingBound(s.dtype, vw, v_max),
              "forward: V row", v_row[p], vw);
          s.k[seq][slot * width + g * hd + p] = k_row[p];
          s.v[seq][slot * width + g * hd + p] = v_row[p];
        }
      }
    }
    s.length[seq] = len1;
  }
  // y = concat_h(softmax(scale q k^T) V) W_O (+ b_o on the first shard), from
  // the cached K and V (checked above) and q in float64, with the layer's
  // variants (window, softcap, ALiBi, sinks of the global head h). Rows
  // appended through hw_kv_cache_append may hold NaN, inf or huge values, for
  // which headway.h states no result: such a sequence's y is not checked.
  t = 0;
  for (int64_t i = 0; i < n_seq; ++i) {
    const int64_t seq = seqs[i].seq, len0 = length_before[seq];
    if (!tame[i]) {
      t += seqs[i].n_tokens;
      continue;
    }
    if (s.bf16_compute) {  // see the top of the file
      for (int64_t j = 0; j < seqs[i].n_tokens; ++j, ++t) {
        for (int64_t col = 0; col < d; ++col)
          Check(std::isfinite(y[t * ys + col]),
                "hw_attention_layer_forward: y not finite (bf16 compute)", col);
      }
      continue;
    }
    for (int64_t j = 0; j < seqs[i].n_tokens; ++j, ++t) {
      const Variants& var = s.variants;
      const int64_t pos = len0 + j;
      // Keys [0, seen) not outside the window: up to the token itself or to
      // every cached one; never empty (a token sees itself).
      const int64_t seen = c.mask == HW_MASK_CAUSAL ? pos + 1 : s.length[seq];
      // On a ring, the keys the token saw must still be held (later tokens
      // of the call may have overwritten them): otherwise y is only finite
      // (x, the weights and the rows it saw are).
      bool held = true;
      for (int64_t r = 0; r < seen; ++r)
        held &= var.OutsideWindow(r, pos) || s.Held(seq, r);
      if (!held) {
        for (int64_t col = 0; col < d; ++col)
          Check(std::isfinite(y[t * ys + col]),
                "hw_attention_layer_forward: y not finite on a ring", col);
        continue;
      }
      std::vector<double> o(hq, 0.0), o_abs(hq, 0.0);
      for (int64_t h = h0; h < c.head_end; ++h) {
        const int64_t g = h / group - g0;
        std::vector<double> q(hd), sc(seen);
        double bound;
        for (int64_t p = 0; p < hd; ++p)
          q[p] = project(s.w_q, s.b_q, hq, t, h * hd + p, &bound);
        double m = var.sinks.empty() ? -INFINITY : var.sinks[h], sum = 0.0;
        for (int64_t r = 0; r < seen; ++r) {
          if (var.OutsideWindow(r, pos)) continue;
          double dot = 0.0;
          for (int64_t p = 0; p < hd; ++p)
            dot += q[p] * s.k[seq][s.Slot(r) * width + g * hd + p];
          sc[r] = var.Score(c.scale * dot, h, r, pos);
          m = std::max(m, sc[r]);
        }
        for (int64_t r = 0; r < seen; ++r)
          if (!var.OutsideWindow(r, pos)) sum += std::exp(sc[r] - m);
        if (!var.sinks.empty()) sum += std::exp(var.sinks[h] - m);
        for (int64_t r = 0; r < seen; ++r) {
          if (var.OutsideWindow(r, pos)) continue;
          const double pr = std::exp(sc[r] - m) / sum;
          for (int64_t p = 0; p < hd; ++p) {
            const double vv = s.v[seq][s.Slot(r) * width + g * hd + p];
            o[h * hd + p] += pr * vv;
            o_abs[h * hd + p] += pr * std::fabs(vv);
          }
        }
      }
      for (int64_t col = 0; col < d; ++col) {
        double want_y = h0 == 0 ? s.b_o[col] : 0.0;
        double mag = std::fabs(want_y);
        for (int64_t e = h0 * hd; e < c.head_end * hd; ++e) {
          want_y += o[e] * s.w_o[e * d + col];
          mag += o_abs[e] * std::fabs(s.w_o[e * d + col]);
        }
        // attention.h states no bound yet: 1e-4 of the magnitudes involved is
        // ~100x the float32 roundings of these tiny shapes (weights and x in
        // [-1, 1]), while a wrong key, mask, head or row gives errors of the
        // order of the values themselves.
        const float got = y[t * ys + col];
        Check(std::fabs(got - want_y) <= 1e-4 * (mag + 1.0),
              "hw_attention_layer_forward: y differs from float64", got,
              want_y);
      }
    }
  }
}

void OpLayerDestroy(FuzzedDataProvider&, Shadow& s) {
  hw_attention_layer_destroy(s.layer);
  s.layer = nullptr;
}

// ------------------------------------------------------ Attention core ops

constexpr float kSentinel = -7777.0f;  // prefilled into every written matrix

// A buffer for [rows, cols] at `stride` (0: dense) as MakeMatrix sizes it
// (rows and cols at least 1), every element kSentinel.
std::vector<float> SentinelMatrix(int64_t rows, int64_t cols, int64_t stride) {
  const int64_t r = std::max<int64_t>(rows, 1), c = std::max<int64_t>(cols, 1);
  const int64_t st = std::max<int64_t>(Dense(stride, c), 1);
  return std::vector<float>(static_cast<size_t>((r - 1) * st + c), kSentinel);
}

// Every element of m outside [rows, cols] at `stride` still holds kSentinel:
// padding is not the call's.
void CheckPaddingKept(const std::vector<float>& m, int64_t rows, int64_t cols,
                      int64_t stride, const char* what) {
  const int64_t st = Dense(stride, cols);
  for (size_t e = 0; e < m.size(); ++e) {
    const int64_t r = static_cast<int64_t>(e) / st;
    const int64_t c = static_cast<int64_t>(e) % st;
    if (r >= rows || c >= cols) {
      Check(std::memcmp(&m[e], &kSentinel, sizeof(float)) == 0, what, r, c);
    }
  }
}

// The scale a call uses: options->scale, or 1 / sqrt(head_dim) for NULL
// options or a scale of 0 (as the kernel rounds it).
float ResolvedScale(const hw_attention_options* options, int64_t head_dim) {
  if (options != nullptr && options->scale != 0.0f) return options->scale;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

bool Tame(float x) { return std::fabs(x) <= 1e3f; }  // false for NaN

// n_heads for a call on s.cache: mostly a multiple of its n_kv_heads (MHA and
// GQA/MQA groups of 2 and 3), sometimes not one, 0 or -1.
int64_t ConsumeNHeads(FuzzedDataProvider& in, const Shadow& s) {
  const int64_t kvh = std::max<int64_t>(s.n_kv_heads, 1);
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 7:
      return kvh + 1;
    case 8:
      return 0;
    case 9:
      return -1;
    default:
      return kvh * in.ConsumeIntegralInRange<int64_t>(1, 3);
  }
}

// NULL (the default), or options with a mask value and a scale, sometimes bad
// ones (*invalid is then set).
const hw_attention_options* ConsumeOptions(FuzzedDataProvider& in,
                                           hw_attention_options* opts,
                                           bool* invalid) {
  if (in.ConsumeIntegralInRange(0, 2) == 0) return nullptr;
  opts->mask = in.ConsumeBool() ? HW_MASK_CAUSAL : HW_MASK_NONE;
  opts->scale = in.ConsumeBool() ? 0.0f : in.ConsumeProbability<float>() * 2.0f;
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 11:
      opts->mask = 2;
      *invalid = true;
      break;
    case 12:
      opts->mask = -1;
      *invalid = true;
      break;
    case 13:
      opts->scale = -1.0f;
      *invalid = true;
      break;
    case 14:
      opts->scale = kInf;
      *invalid = true;
      break;
    case 15:
      opts->scale = kNaN;
      *invalid = true;
      break;
    default:
      break;
  }
  return opts;
}

// One query with its buffers and what the model predicts of it.
struct AttnQuery {
  hw_attention_query query{};
  std::vector<float> q, out, mask;  // out prefilled with kSentinel
  int64_t length = 0;               // length(seq), 0 for a bad seq
  bool invalid = false, out_of_range = false;
};

// What both attention ops consume first: n_heads for s.cache, the options
// and the variants, with what follows from them. Not copyable: `options` and
// `variants` point into the object.
struct AttnCall {
  AttnCall(FuzzedDataProvider& in, const Shadow& s) {
    n_heads = ConsumeNHeads(in, s);
    invalid = s.cache == nullptr || n_heads < 1 ||
              n_heads % std::max<int64_t>(s.n_kv_heads, 1) != 0;
    options = ConsumeOptions(in, &opts, &invalid);
    width = std::max<int64_t>(n_heads, 1) * std::max<int64_t>(s.head_dim, 1);
    scale = ResolvedScale(options, s.head_dim);
    causal = options == nullptr || opts.mask == HW_MASK_CAUSAL;
    // 0: the plain call; 1: the _variants call with NULL; 2, 3: with random
    // variants.
    // A ring cache mostly gets variants (a window it needs).
    kind = s.ring && in.ConsumeIntegralInRange(0, 7) != 7
               ? in.ConsumeIntegralInRange(2, 3)
               : in.ConsumeIntegralInRange(0, 3);
    if (kind >= 2) {
      var = ConsumeVariants(in, n_heads, &invalid,
                            s.ring ? s.capacity - s.sinks : 0, s.sinks);
      SetVariantFields(var, &growing.v);
      ConsumeStructSize(in, HW_ATTENTION_VARIANTS_V1_SIZE, &growing, &var,
                        &invalid);
      // attention_compute, where struct_size covers it: now and then a value
      // that is not a hw_attention_compute, or bf16 or int8 products on a
      // cache of another type, all errors (valid products in a compute mode
      // are the tests': their bounds are wider than this model's tolerance).
      if (growing.v.struct_size >= HW_ATTENTION_VARIANTS_V3_SIZE &&
          in.ConsumeIntegralInRange(0, 15) == 15) {
        const bool bf16 = in.ConsumeBool();
        const int32_t mode = bf16 ? HW_ATTENTION_BFLOAT16 : HW_ATTENTION_INT8;
        const int32_t needs = bf16 ? HW_KV_BFLOAT16 : HW_KV_INT8;
        growing.v.attention_compute = s.dtype != needs && in.ConsumeBool()
                                          ? mode
                                          : (in.ConsumeBool() ? -1 : 3);
        invalid = true;
      }
    }
    variants = kind >= 2 ? &growing.v : nullptr;
    // attention.h: a ring needs a window of 1 .. capacity - n_sink_tokens
    // and its n_sink_tokens.
    invalid |= s.ring && (var.window < 1 || var.window > s.capacity - s.sinks ||
                          var.n_sinks != s.sinks);
  }
  AttnCall(const AttnCall&) = delete;
  AttnCall& operator=(const AttnCall&) = delete;

  int64_t n_heads;
  hw_attention_options opts{};
  const hw_attention_options* options;  // &opts or NULL
  bool invalid;   // n_heads, the options or the variants are bad
  int64_t width;  // of q and out: n_heads * head_dim
  float scale;    // as the call resolves it
  bool causal;
  int kind;
  Variants var;  // none unless kind >= 2
  Growing<hw_attention_variants> growing;
  const hw_attention_variants* variants;  // &growing.v or NULL
};

// A query on s.cache for `width` = n_heads * head_dim columns: mostly valid
// (the last tokens, or earlier ones), sometimes past the cached rows or with
// a bad seq, q_pos0, data, shape or stride.
void ConsumeQuery(FuzzedDataProvider& in, const Shadow& s, int64_t width,
                  AttnQuery* a) {
  hw_attention_query& qy = a->query;
  qy.seq = ConsumeSeq(in, s);
  const bool seq_ok = SeqOk(s, qy.seq);
  const int64_t len = seq_ok ? s.length[qy.seq] : 0;
  a->length = len;
  int64_t n = in.ConsumeIntegralInRange<int64_t>(1, std::max<int64_t>(len, 1));
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 14:
      n = 0;
      break;
    case 15:
      n = len + 1;
      break;
    default:
      break;
  }
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 4:
    case 5:
      qy.q_pos0 =
          in.ConsumeIntegralInRange<int64_t>(0, std::max<int64_t>(len - n, 0));
      break;
    case 6:
      qy.q_pos0 = std::max<int64_t>(len - n, 0) + 1;  // past the cached rows
      break;
    case 7:
      qy.q_pos0 = -1;
      break;
    default:
      qy.q_pos0 = std::max<int64_t>(len - n, 0);  // the newest tokens
      break;
  }
  const int64_t q_cols =
      in.ConsumeIntegralInRange(0, 15) == 15 ? width + 1 : width;
  const int64_t q_stride = ConsumeStride(in, q_cols);
  // q: mostly within [-4, 4]; sometimes with NaN, inf and huge values.
  a->q = MakeMatrix(in, std::max<int64_t>(n, 1), std::max<int64_t>(q_cols, 1),
                    q_stride, in.ConsumeIntegralInRange(0, 7) == 7);
  int64_t out_rows = n, out_cols = width;
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 14:
      out_rows = n + 1;
      break;
    case 15:
      out_cols = width - 1;
      break;
    default:
      break;
  }
  const int64_t out_stride = ConsumeStride(in, out_cols);
  a->out = SentinelMatrix(out_rows, out_cols, out_stride);
  const int null_choice = in.ConsumeIntegralInRange(0, 31);
  qy.q = {null_choice == 31 ? nullptr : a->q.data(), n, q_cols, q_stride};
  qy.out = {null_choice == 30 ? nullptr : a->out.data(), out_rows, out_cols,
            out_stride};
  // out over q itself: an overlap.
  const bool alias = null_choice == 29;
  if (alias) qy.out.data = a->q.data();
  bool invalid = !seq_ok || null_choice >= 29 || qy.q_pos0 < 0 || n < 1 ||
                 q_cols != width || width < 1 || !StrideOk(q_stride, q_cols) ||
                 out_rows != n || out_cols != width ||
                 !StrideOk(out_stride, out_cols);
  if (in.ConsumeBool()) {
    int64_t m_cols = len;
    if (in.ConsumeIntegralInRange(0, 15) == 15) m_cols = len + 1;
    const int64_t m_stride = ConsumeStride(in, m_cols);
    const int64_t mr = std::max<int64_t>(n, 1),
                  mc = std::max<int64_t>(m_cols, 1);
    a->mask = MakeMatrix(in, mr, mc, m_stride, false);
    const int64_t ms = std::max<int64_t>(Dense(m_stride, mc), 1);
    for (int64_t r = 0; r < mr; ++r) {
      const int row_kind = in.ConsumeIntegralInRange(0, 15);
      for (int64_t c = 0; c < mc; ++c) {
        float& e = a->mask[r * ms + c];
        if (row_kind == 15) {
          e = -std::numeric_limits<float>::max();  // a row of -FLT_MAX
        } else if (row_kind == 14 || in.ConsumeIntegralInRange(0, 3) == 3) {
          e = -kInf;
        }
      }
    }
    qy.mask = {a->mask.data(), n, m_cols, m_stride};
    invalid |= m_cols != len || m_cols < 1 || !StrideOk(m_stride, m_cols);
    invalid |= s.ring;  // a ring takes no mask
  }
  a->invalid = invalid;
  a->out_of_range = seq_ok && qy.q_pos0 >= 0 && n >= 1 && qy.q_pos0 + n > len;
}

// With a ring cache, whether a's first query sees keys (past the sinks) that
// the ring no longer holds (call's window valid for the ring): OUT_OF_RANGE.
bool RingOutOfRange(const Shadow& s, const Variants& var, const AttnQuery& a) {
  const hw_attention_query& qy = a.query;
  if (!s.ring || !SeqOk(s, qy.seq) || qy.q_pos0 < 0 || qy.q.rows < 1 ||
      a.out_of_range) {
    return false;
  }
  const int64_t first = std::max(s.sinks, qy.q_pos0 - var.window + 1);
  return first < s.ring_begin[qy.seq];
}

// Checks a successful call's out (and weights, if given: [n_heads * n_tokens,
// length] at w_stride) against float64 from the model's K and V.
void CheckAttention(const Shadow& s, const AttnCall& call, const AttnQuery& a,
                    const std::vector<float>* weights, int64_t w_stride) {
  const int64_t n_heads = call.n_heads;
  const float scale = call.scale;
  const bool causal = call.causal;
  const Variants& var = call.var;
  const hw_attention_query& qy = a.query;
  const int64_t n = qy.q.rows, hd = s.head_dim, len = a.length;
  const int64_t group = n_heads / s.n_kv_heads, width = s.Width();
  const int64_t qs = Dense(qy.q.stride, qy.q.cols);
  const int64_t os = Dense(qy.out.stride, qy.out.cols);
  const int64_t ms = qy.mask.data ? Dense(qy.mask.stride, len) : 0;
  const int64_t ws = Dense(w_stride, len);
  const std::vector<float>& K = s.k[qy.seq];
  const std::vector<float>& V = s.v[qy.seq];
  CheckPaddingKept(a.out, n, qy.out.cols, qy.out.stride,
                   "attention: out padding written");
  if (weights)
    CheckPaddingKept(*weights, n_heads * n, len, w_stride,
                     "attention: weights padding written");
  std::vector<double> w(len);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = qy.q_pos0 + t;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / group;
      const float* q = &a.q[t * qs + h * hd];
      const float* got = &a.out[t * os + h * hd];
      const float* got_w = weights ? &(*weights)[(h * n + t) * ws] : nullptr;
      bool q_finite = true, tame = true;
      for (int64_t p = 0; p < hd; ++p) {
        q_finite &= std::isfinite(q[p]);
        tame &= Tame(q[p]);
      }
      // The keys the row sees, and those it does not.
      std::vector<int64_t> seen, hidden;
      for (int64_t r = 0; r < len; ++r) {
        const float m = qy.mask.data ? a.mask[t * ms + r] : 0.0f;
        if ((causal && r > pos) || var.OutsideWindow(r, pos) || m == -kInf) {
          hidden.push_back(r);
          continue;
        }
        // A ring's model keeps position r in row Slot(r): it must hold it.
        Check(s.Held(qy.seq, r), "attention: a key the ring dropped is seen", r,
              pos);
        seen.push_back(r);
        for (int64_t p = 0; p < hd; ++p)
          tame &= Tame(K[s.Slot(r) * width + g * hd + p]);
        tame &= Tame(m) || m == -std::numeric_limits<float>::max();
      }
      // A hidden key's weight is exactly 0, except in a row that sees a NaN
      // or +inf score, which the softmax makes NaN whole (hidden entries
      // too): tame q, K and mask rule that out.
      for (int64_t r : hidden) {
        if (got_w)
          Check(got_w[r] == 0.0f || (!tame && std::isnan(got_w[r])),
                "attention: hidden key's weight", got_w[r]);
      }
      if (seen.empty()) {
        // Every key hidden: zeros (whatever the K and V rows hold).
        if (!q_finite) continue;
        for (int64_t p = 0; p < hd; ++p)
          Check(got[p] == 0.0f, "attention: all-masked row not 0", got[p]);
        continue;
      }
      // NaN, inf or huge scores: the contract says what only for NaN V below.
      if (!tame) continue;
      // Scores in float64. |scale q.k| < 1e8 here (|q|, |K| <= 1e3, head_dim
      // <= 20, scale <= 2) and the ALiBi bias |slope (k - p)| <= 4 * 9, far
      // below half an ulp of FLT_MAX in float or double, so a -FLT_MAX mask
      // entry gives a score of exactly -FLT_MAX, in the kernel and here: its
      // |mask| adds no rounding, and S counts 0. With sinks, exp(sink) joins
      // the denominator.
      const double sink = var.sinks.empty() ? -INFINITY : var.sinks[h];
      double m = sink, S = 0.0, sum = 0.0;
      for (int64_t r : seen) {
        double dot = 0.0, abs = 0.0;
        for (int64_t p = 0; p < hd; ++p) {
          const double x =
              static_cast<double>(q[p]) * K[s.Slot(r) * width + g * hd + p];
          dot += x;
          abs += std::fabs(x);
        }
        const float mk = qy.mask.data ? a.mask[t * ms + r] : 0.0f;
        w[r] = var.Score(scale * dot, h, r, pos) + mk;
        const bool flt_max = mk == -std::numeric_limits<float>::max();
        // attention.h's S_t: the softcap and |alibi bias| count as well.
        S = std::max(S, scale * abs + var.softcap +
                            std::fabs(var.Bias(h, r, pos)) +
                            (flt_max ? 0.0 : std::fabs(mk)));
        m = std::max(m, w[r]);
      }
      for (int64_t r : seen) sum += std::exp(w[r] - m);
      if (!var.sinks.empty()) sum += std::exp(sink - m);
      for (int64_t r : seen) w[r] = std::exp(w[r] - m) / sum;
      // attention.h's bound, 4 u |V|max (sqrt(d) S + sqrt(L) + 8), is a
      // random-walk estimate; it says worst-case inputs reach sqrt(d) or
      // sqrt(L) times more, at most sqrt(20) < 4.5 for these shapes (head_dim
      // <= 20, length <= 9), so a factor of 8 covers the worst case. The
      // weights are the same computation with V = I (|V|max = 1).
      const double kSafety = 8.0;
      const double unit = kSafety * 4.0 * kU *
                          (std::sqrt(static_cast<double>(hd)) * S +
                           std::sqrt(static_cast<double>(seen.size())) + 8.0);
      if (got_w) {
        // 1 without a sink; 1 minus the sink's share with one.
        double w_sum = 0.0, want_sum = 0.0;
        for (int64_t r : seen) {
          Check(std::fabs(got_w[r] - w[r]) <= unit + 0x1p-126,
                "attention: weight differs from float64", got_w[r], w[r]);
          w_sum += got_w[r];
          want_sum += w[r];
        }
        Check(std::fabs(w_sum - want_sum) <= seen.size() * (unit + 0x1p-126),
              "attention: weights do not sum to 1 - the sink's share", w_sum,
              want_sum);
      }
      double v_max = 0.0;
      bool v_tame = true;
      for (int64_t r : seen)
        for (int64_t p = 0; p < hd; ++p) {
          const float v = V[s.Slot(r) * width + g * hd + p];
          v_tame &= Tame(v);
          if (Tame(v)) v_max = std::max<double>(v_max, std::fabs(v));
        }
      for (int64_t p = 0; p < hd; ++p) {
        bool nan = false, col_tame = true;
        double want = 0.0;
        for (int64_t r : seen) {
          const float v = V[s.Slot(r) * width + g * hd + p];
          nan |= std::isnan(v);
          col_tame &= Tame(v);
          want += w[r] * v;
        }
        if (nan) {
          Check(std::isnan(got[p]), "attention: a row seeing NaN V not NaN",
                got[p]);
        } else if (col_tame) {
          Check(std::isfinite(got[p]), "attention: finite row not finite",
                got[p]);
          if (v_tame)
            Check(std::fabs(got[p] - want) <= v_max * unit + 0x1p-126,
                  "attention: out differs from float64", got[p], want);
        }
      }
    }
  }
}

// hw_attention over 0..3 queries (of distinct or repeated sequences).
void OpAttention(FuzzedDataProvider& in, Shadow& s) {
  const AttnCall call(in, s);
  bool invalid = call.invalid;
  const int64_t n_queries = in.ConsumeIntegralInRange<int64_t>(0, 3);
  invalid |= n_queries < 1;
  std::vector<AttnQuery> qs(std::max<int64_t>(n_queries, 1));
  std::vector<hw_attention_query> raw(qs.size());
  bool out_of_range = false;
  for (int64_t i = 0; i < n_queries; ++i) {
    ConsumeQuery(in, s, call.width, &qs[i]);
    invalid |= qs[i].invalid;
    out_of_range |= qs[i].out_of_range || RingOutOfRange(s, call.var, qs[i]);
    raw[i] = qs[i].query;
  }
  const bool null_queries = in.ConsumeIntegralInRange(0, 31) == 31;
  invalid |= null_queries;
  const int want = invalid        ? HW_INVALID_ARGUMENT
                   : out_of_range ? HW_OUT_OF_RANGE
                                  : HW_OK;
  std::vector<std::vector<float>> q_before, out_before;
  for (const AttnQuery& a : qs) {
    q_before.push_back(a.q);
    out_before.push_back(a.out);
  }
  const hw_attention_query* queries = null_queries ? nullptr : raw.data();
  ExpectStatus(call.kind == 0 ? hw_attention(s.cache, call.n_heads, queries,
                                             n_queries, call.options)
                              : hw_attention_with_variants(
                                    s.cache, call.n_heads, queries, n_queries,
                                    call.options, call.variants),
               want, "hw_attention(_with_variants)",
               invalid && out_of_range ? HW_OUT_OF_RANGE : -1);
  for (size_t i = 0; i < qs.size(); ++i)
    Check(SameBits(qs[i].q, q_before[i]), "hw_attention changed q");
  if (want != HW_OK) {
    for (size_t i = 0; i < qs.size(); ++i)
      Check(SameBits(qs[i].out, out_before[i]), "hw_attention wrote on error");
    return;
  }
  for (int64_t i = 0; i < n_queries; ++i)
    CheckAttention(s, call, qs[i], nullptr, 0);
}

// hw_attention_with_weights on one query, with weights valid or not.
void OpAttentionWithWeights(FuzzedDataProvider& in, Shadow& s) {
  const AttnCall call(in, s);
  AttnQuery a;
  ConsumeQuery(in, s, call.width, &a);
  // attention.h: the materialised path rejects a ring cache.
  bool invalid = call.invalid || a.invalid || s.ring;
  int64_t w_rows = std::max<int64_t>(call.n_heads, 1) * a.query.q.rows;
  int64_t w_cols = a.length;
  const int w_choice = in.ConsumeIntegralInRange(0, 31);
  if (w_choice == 31) w_rows += 1;
  if (w_choice == 30) w_cols += 1;
  const int64_t w_stride = ConsumeStride(in, w_cols);
  std::vector<float> weights = SentinelMatrix(w_rows, w_cols, w_stride);
  const hw_out_matrix wm{w_choice == 29 ? nullptr : weights.data(), w_rows,
                         w_cols, w_stride};
  invalid |= w_choice >= 29 || w_cols < 1 || !StrideOk(w_stride, w_cols);
  const bool null_query = in.ConsumeIntegralInRange(0, 31) == 31;
  invalid |= null_query;
  const int want = invalid          ? HW_INVALID_ARGUMENT
                   : a.out_of_range ? HW_OUT_OF_RANGE
                                    : HW_OK;
  const std::vector<float> q_before = a.q, out_before = a.out,
                           w_before = weights;
  const hw_attention_query* query = null_query ? nullptr : &a.query;
  ExpectStatus(
      call.kind == 0
          ? hw_attention_with_weights(s.cache, call.n_heads, query, wm,
                                      call.options)
          : hw_attention_with_weights_and_variants(
                s.cache, call.n_heads, query, wm, call.options, call.variants),
      want, "hw_attention_with_weights(_and_variants)",
      invalid && a.out_of_range ? HW_OUT_OF_RANGE : -1);
  Check(SameBits(a.q, q_before), "hw_attention_with_weights changed q");
  if (want != HW_OK) {
    Check(SameBits(a.out, out_before) && SameBits(weights, w_before),
          "hw_attention_with_weights wrote on error");
    return;
  }
  CheckAttention(s, call, a, &weights, w_stride);
}

void OpThreads(FuzzedDataProvider& in, Shadow&) {
  const int n = in.ConsumeIntegralInRange(-1, 3);
  ExpectStatus(hw_set_max_threads(n), n < 0 ? HW_INVALID_ARGUMENT : HW_OK,
               "hw_set_max_threads");
}

// hw_kv_store_rows and hw_kv_load_rows on their own: random dtypes, shapes,
// strides and values (NaN, inf, huge), against the model's status; a valid
// round trip within the rounding bound (ModelRow's checks, row by row), and
// nothing written on an error.
void OpKvRows(FuzzedDataProvider& in, Shadow&) {
  const int dtype = ConsumeDtype(in);
  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t cols = in.ConsumeIntegralInRange<int64_t>(0, 40);
  const int64_t src_stride = ConsumeStride(in, cols);
  const int64_t dst_stride = ConsumeStride(in, cols);
  const bool null_scales = in.ConsumeIntegralInRange(0, 7) == 7;
  const int64_t r_alloc = std::max<int64_t>(rows, 1);
  const int64_t c_alloc = std::max<int64_t>(cols, 1);
  const std::vector<float> src =
      MakeMatrix(in, r_alloc, c_alloc, src_stride, true, 300.0f);
  // Room for [rows, dst_stride] of 4-byte elements: every type fits.
  const int64_t ds = std::max<int64_t>(Dense(dst_stride, cols), 1);
  std::vector<float> dst(static_cast<size_t>(r_alloc * ds), kSentinel);
  std::vector<float> scales(static_cast<size_t>(r_alloc), kSentinel);
  const std::vector<float> dst_before = dst, scales_before = scales;
  float* scale_arg = null_scales ? nullptr : scales.data();
  const bool invalid =
      !DtypeOk(dtype) || rows < 1 || cols < 1 || !StrideOk(src_stride, cols) ||
      !StrideOk(dst_stride, cols) || (dtype == HW_KV_INT8 && null_scales);
  ExpectStatus(hw_kv_store_rows(dtype, rows, cols, src.data(), src_stride,
                                dst.data(), dst_stride, scale_arg),
               invalid ? HW_INVALID_ARGUMENT : HW_OK, "hw_kv_store_rows");
  if (invalid) {
    Check(SameBits(dst, dst_before) && SameBits(scales, scales_before),
          "hw_kv_store_rows wrote on error");
    // The same rows read back (dst as the source): the same checks but
    // src_stride's.
    const bool load_invalid = !DtypeOk(dtype) || rows < 1 || cols < 1 ||
                              !StrideOk(dst_stride, cols) ||
                              (dtype == HW_KV_INT8 && null_scales);
    std::vector<float> back(static_cast<size_t>(r_alloc * c_alloc), kSentinel);
    const std::vector<float> back_before = back;
    ExpectStatus(hw_kv_load_rows(dtype, rows, cols, dst.data(), dst_stride,
                                 scale_arg, back.data(), 0),
                 load_invalid ? HW_INVALID_ARGUMENT : HW_OK, "hw_kv_load_rows");
    if (load_invalid) {
      Check(SameBits(back, back_before), "hw_kv_load_rows wrote on error");
    }
    return;
  }
  // Each stored row reads back as the model's row (one row at a time, the
  // same function).
  const size_t size = hw_kv_dtype_size(dtype);
  std::vector<float> back(static_cast<size_t>(rows * cols), kSentinel);
  ExpectStatus(hw_kv_load_rows(dtype, rows, cols, dst.data(), dst_stride,
                               scale_arg, back.data(), 0),
               HW_OK, "hw_kv_load_rows");
  std::vector<float> want(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    ModelRow(dtype, &src[r * Dense(src_stride, cols)], cols, want.data());
    Check(std::memcmp(&back[r * cols], want.data(), cols * sizeof(float)) == 0,
          "hw_kv_load_rows differs from a one-row round trip", r);
    // Past cols, the destination row is not written.
    const unsigned char* row =
        reinterpret_cast<const unsigned char*>(dst.data()) +
        static_cast<size_t>(r * Dense(dst_stride, cols)) * size;
    const unsigned char* row_before =
        reinterpret_cast<const unsigned char*>(dst_before.data()) +
        static_cast<size_t>(r * Dense(dst_stride, cols)) * size;
    const size_t tail = (Dense(dst_stride, cols) - cols) * size;
    Check(std::memcmp(row + cols * size, row_before + cols * size, tail) == 0,
          "hw_kv_store_rows wrote past cols", r);
  }
  if (dtype != HW_KV_INT8) {
    Check(SameBits(scales, scales_before), "scales written for a float type");
  }
}

// Null handles: every entry answers HW_INVALID_ARGUMENT, never crashes.
void OpNullHandles(FuzzedDataProvider&, Shadow&) {
  int64_t i64 = 0;
  size_t bytes = 0;
  ExpectStatus(hw_kv_cache_length(nullptr, 0, &i64), HW_INVALID_ARGUMENT,
               "hw_kv_cache_length");
  ExpectStatus(hw_kv_cache_bytes(nullptr, &bytes), HW_INVALID_ARGUMENT,
               "hw_kv_cache_bytes");
  ExpectStatus(hw_attention_layer_n_weights(nullptr, &i64), HW_INVALID_ARGUMENT,
               "hw_attention_layer_n_weights");
  ExpectStatus(hw_kv_cache_create(1, 1, 1, 1, nullptr), HW_INVALID_ARGUMENT,
               "hw_kv_cache_create");
  ExpectStatus(hw_kv_cache_dtype(nullptr, nullptr, nullptr),
               HW_INVALID_ARGUMENT, "hw_kv_cache_dtype");
  ExpectStatus(hw_kv_cache_ring_state(nullptr, 0, &i64, nullptr, nullptr),
               HW_INVALID_ARGUMENT, "hw_kv_cache_ring_state");
  ExpectStatus(hw_kv_cache_slot(nullptr, 0, &i64), HW_INVALID_ARGUMENT,
               "hw_kv_cache_slot");
  ExpectStatus(hw_kv_cache_create_ring(1, 1, 1, 2, 1, 0, nullptr),
               HW_INVALID_ARGUMENT, "hw_kv_cache_create_ring");
  const void* data = nullptr;
  ExpectStatus(hw_kv_cache_stored_keys(nullptr, 0, 0, nullptr, nullptr, &data,
                                       nullptr, nullptr, nullptr),
               HW_INVALID_ARGUMENT, "hw_kv_cache_stored_keys");
  ExpectStatus(hw_attention_layer_create_cache_typed(nullptr, 1, 1, 0, nullptr),
               HW_INVALID_ARGUMENT, "hw_attention_layer_create_cache_typed");
  ExpectStatus(
      hw_attention_with_variants(nullptr, 1, nullptr, 1, nullptr, nullptr),
      HW_INVALID_ARGUMENT, "hw_attention_with_variants");
  ExpectStatus(hw_alibi_slopes(1, nullptr), HW_INVALID_ARGUMENT,
               "hw_alibi_slopes");
}

// The ops, chosen by one byte each.
using Op = void (*)(FuzzedDataProvider&, Shadow&);
constexpr Op kOps[] = {
    OpCacheCreate,      OpCacheAppend,     OpCacheAppend,
    OpCacheTruncate,    OpCacheCopy,       OpCacheReset,
    OpCacheCheck,       OpSoftmax,         OpSoftmax,
    OpMatmul,           OpMatmul,          OpLayerCreate,
    OpLayerForward,     OpLayerForward,    OpLayerDestroy,
    OpLayerCreateCache, OpThreads,         OpNullHandles,
    OpAttention,        OpAttention,       OpAttentionWithWeights,
    OpKvRows,           OpCacheCreateRing, OpLayerCreateRingCache,
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // One target per input (weights are packed for the target at create).
  const char* names[16];
  const int64_t n_targets = hw_supported_targets(names, 16);
  Check(n_targets >= 1 && n_targets <= 16, "hw_supported_targets", n_targets);
  const int64_t pick = in.ConsumeIntegralInRange<int64_t>(0, n_targets - 1);
  ExpectStatus(hw_set_max_target(names[pick]), HW_OK, "hw_set_max_target");
  {
    Shadow s;
    for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
      const size_t op = in.ConsumeIntegralInRange<size_t>(
          0, sizeof(kOps) / sizeof(kOps[0]) - 1);
      kOps[op](in, s);
    }
    CheckCache(s);
  }
  hw_reset_max_target();
  hw_set_max_threads(0);
  return 0;
}

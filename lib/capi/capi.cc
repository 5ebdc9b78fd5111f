// The C API (include/headway/headway.h): thin wrappers over the C++ API.
//
// Every function that returns a status runs its body in Guard, which catches
// every exception (none may cross into a C caller). Null handles and pointers
// that only exist in C (handles, out pointers, raw data pointers) are checked
// here, with messages naming the C argument; everything else is checked by the
// C++ function the wrapper calls, whose Status FromStatus turns into the code
// and the thread's last-error message, in the C caller's words: the C++
// function's name becomes the C function's, and the C++ names of arguments
// that have other names in C become those (the wrapper's Renames).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "headway/attention.h"
#include "headway/headway.h"
#include "headway/kv_cache.h"
#include "headway/layer.h"
#include "headway/matmul.h"
#include "headway/norm.h"
#include "headway/rope.h"
#include "headway/softmax.h"
#include "headway/status.h"
#include "headway/targets.h"
#include "headway/threads.h"
#include "headway/version.h"
#include "headway/view.h"
#include "lib/core/message.h"
#include "lib/core/storage.h"
#include "lib/core/validate.h"

using headway::StatusCode;

static_assert(HW_OK == static_cast<int>(StatusCode::kOk), "status codes");
static_assert(HW_INVALID_ARGUMENT ==
                  static_cast<int>(StatusCode::kInvalidArgument),
              "status codes");
static_assert(HW_OUT_OF_RANGE == static_cast<int>(StatusCode::kOutOfRange),
              "status codes");
static_assert(HW_RESOURCE_EXHAUSTED ==
                  static_cast<int>(StatusCode::kResourceExhausted),
              "status codes");
static_assert(HW_FAILED_PRECONDITION ==
                  static_cast<int>(StatusCode::kFailedPrecondition),
              "status codes");
static_assert(HW_INTERNAL == static_cast<int>(StatusCode::kInternal),
              "status codes");
static_assert(HW_NO_TRANS == static_cast<int>(headway::Transpose::kNo) &&
                  HW_TRANS == static_cast<int>(headway::Transpose::kYes),
              "transpose values");
// The wrappers pass a mask value through unchanged (static_cast): the C++
// checks reject any other value.
static_assert(HW_MASK_CAUSAL ==
                      static_cast<int>(headway::AttentionMask::kCausal) &&
                  HW_MASK_NONE ==
                      static_cast<int>(headway::AttentionMask::kNone),
              "mask values");
// A dtype value is passed on likewise (the C++ checks name a bad one).
static_assert(HW_KV_FLOAT32 == static_cast<int>(headway::KvDtype::kFloat32) &&
                  HW_KV_BFLOAT16 ==
                      static_cast<int>(headway::KvDtype::kBFloat16) &&
                  HW_KV_FLOAT16 ==
                      static_cast<int>(headway::KvDtype::kFloat16) &&
                  HW_KV_INT8 == static_cast<int>(headway::KvDtype::kInt8),
              "dtype values");
// RoPE's layout and scaling likewise (ApplyRope and Create name a bad one).
static_assert(HW_ROPE_HALVES ==
                      static_cast<int>(headway::RopeLayout::kHalves) &&
                  HW_ROPE_INTERLEAVED ==
                      static_cast<int>(headway::RopeLayout::kInterleaved),
              "rope layout values");
static_assert(HW_ROPE_SCALING_NONE ==
                      static_cast<int>(headway::RopeScaling::kNone) &&
                  HW_ROPE_SCALING_LINEAR ==
                      static_cast<int>(headway::RopeScaling::kLinear) &&
                  HW_ROPE_SCALING_LLAMA3 ==
                      static_cast<int>(headway::RopeScaling::kLlama3),
              "rope scaling values");

static_assert(HW_WEIGHT_FLOAT32 ==
                      static_cast<int>(headway::WeightDtype::kFloat32) &&
                  HW_WEIGHT_BFLOAT16 ==
                      static_cast<int>(headway::WeightDtype::kBFloat16) &&
                  HW_WEIGHT_INT8 ==
                      static_cast<int>(headway::WeightDtype::kInt8),
              "weight dtype values");
static_assert(HW_COMPUTE_FLOAT32 ==
                      static_cast<int>(headway::MatmulCompute::kFloat32) &&
                  HW_COMPUTE_BFLOAT16 ==
                      static_cast<int>(headway::MatmulCompute::kBFloat16),
              "matmul compute values");
static_assert(HW_ATTENTION_FLOAT32 ==
                      static_cast<int>(headway::AttentionCompute::kFloat32) &&
                  HW_ATTENTION_BFLOAT16 ==
                      static_cast<int>(headway::AttentionCompute::kBFloat16) &&
                  HW_ATTENTION_INT8 ==
                      static_cast<int>(headway::AttentionCompute::kInt8),
              "attention compute values");

struct hw_kv_cache {
  headway::KvCache cache;
};

struct hw_attention_layer {
  headway::AttentionLayer layer;
  // Forward's sequences converted to the C++ struct; kept so that a forward no
  // larger than an earlier one allocates nothing here either.
  std::vector<headway::LayerSequence> sequences;
};

namespace {

// The calling thread's last error. `fallback` replaces `message` when the
// message itself could not be stored (no memory).
thread_local std::string t_message;
thread_local const char* t_fallback = nullptr;

int Succeed() noexcept {
  t_message.clear();  // keeps the capacity: no allocation, cannot throw
  t_fallback = nullptr;
  return HW_OK;
}

// Records "<prefix><detail>" as the thread's last error and returns code.
int Record(int code, const char* prefix, const char* detail) noexcept {
  try {
    t_message.assign(prefix);
    t_message.append(detail);
    t_fallback = nullptr;
  } catch (...) {
    t_message.clear();
    t_fallback = "out of memory while recording an error message";
  }
  return code;
}

// Records "fn: " and the pieces (internal::Cat) as the thread's last error.
template <typename... Pieces>
int Fail(int code, const char* fn, const Pieces&... pieces) noexcept {
  try {
    return Record(code, "",
                  headway::internal::Cat(fn, ": ", pieces...).c_str());
  } catch (...) {
    return Record(code, fn, ": (no memory for the message)");
  }
}

// The last error of a call that a shorter wrapper made, in the wrapper's
// name: its prefix `from` becomes `to`.
void RenameLastError(const char* from, const char* to) noexcept {
  try {
    const size_t n = std::strlen(from);
    if (t_fallback == nullptr && t_message.compare(0, n, from) == 0) {
      t_message.replace(0, n, to);
    }
  } catch (...) {
  }
}

// A C++ name in a C++ message and what the C caller knows it as.
struct Rename {
  const char* cxx;  // e.g. "k.stride"
  const char* c;    // e.g. "k_stride"
};
using Renames = std::initializer_list<Rename>;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_';
}

// A C++ message ("KvCache::Append: k.stride (3) is ...") in the C caller's
// words: the prefix up to the first ": " becomes fn, and every whole
// occurrence of a renames[i].cxx (not part of a longer name such as
// "queries[0].q.stride") becomes renames[i].c.
std::string CMessage(const char* fn, const std::string& message,
                     Renames renames) {
  const size_t colon = message.find(": ");
  std::string out(fn);
  out += colon == std::string::npos ? ": " + message : message.substr(colon);
  for (const Rename& rename : renames) {
    const size_t n = std::strlen(rename.cxx);
    size_t pos = std::strlen(fn);
    while ((pos = out.find(rename.cxx, pos)) != std::string::npos) {
      const char before = out[pos - 1];
      const char after = pos + n < out.size() ? out[pos + n] : ' ';
      if (IsNameChar(before) || before == '.' || before == ']' ||
          IsNameChar(after)) {
        ++pos;
        continue;
      }
      out.replace(pos, n, rename.c);
      pos += std::strlen(rename.c);
    }
  }
  return out;
}

// The code of a C++ Status; its message, in the C caller's words (CMessage),
// becomes the thread's last error.
int FromStatus(const char* fn, const headway::Status& status,
               Renames renames = {}) noexcept {
  if (status.ok()) return Succeed();
  const int code = static_cast<int>(status.code());
  try {
    return Record(code, "", CMessage(fn, status.message(), renames).c_str());
  } catch (...) {
    return Record(code, "", status.message().c_str());
  }
}

// C++ names that several C functions show differently.
constexpr Rename kMaskEnum = {"AttentionMask", "hw_attention_mask"};
constexpr Renames kCacheConfig = {{"config.n_sequences", "n_sequences"},
                                  {"config.n_kv_heads", "n_kv_heads"},
                                  {"config.head_dim", "head_dim"},
                                  {"config.capacity", "capacity"},
                                  {"config.n_sink_tokens", "n_sink_tokens"},
                                  {"config.dtype", "dtype"},
                                  {"KvDtype", "hw_kv_dtype"}};

// Runs body (returning an int status) with every exception caught.
template <typename Body>
int Guard(const char* fn, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Record(HW_RESOURCE_EXHAUSTED, fn, ": out of memory");
  } catch (const std::length_error&) {  // a std::vector of a huge count
    return Record(HW_RESOURCE_EXHAUSTED, fn, ": out of memory");
  } catch (const std::exception& e) {
    Record(HW_INTERNAL, fn, ": unexpected exception: ");
    try {
      t_message.append(e.what());
    } catch (...) {
    }
    return HW_INTERNAL;
  } catch (...) {
    return Record(HW_INTERNAL, fn, ": unexpected exception");
  }
}

int Null(const char* fn, const char* name) noexcept {
  return Fail(HW_INVALID_ARGUMENT, fn, name, " is null");
}

// Views of C matrices. MatrixView's constructor reads a stride of 0 as dense,
// the rule both APIs share (view.h).
headway::MatrixView<const float> View(const hw_matrix& m) {
  return headway::MatrixView<const float>(m.data, m.rows, m.cols, m.stride);
}
headway::MatrixView<float> View(const hw_out_matrix& m) {
  return headway::MatrixView<float>(m.data, m.rows, m.cols, m.stride);
}

headway::AttentionQuery Query(const hw_attention_query& q) {
  headway::AttentionQuery result;
  result.seq = q.seq;
  result.q_pos0 = q.q_pos0;
  result.q = View(q.q);
  result.out = View(q.out);
  result.mask = View(q.mask);
  return result;
}

int CheckSeq(const char* fn, const char* name, int64_t seq,
             const headway::KvCache& cache) {
  if (seq >= 0 && seq < cache.n_sequences()) return HW_OK;
  return Fail(HW_INVALID_ARGUMENT, fn, name, " (", seq,
              ") is out of range [0, ", cache.n_sequences(), ")");
}

int CheckTranspose(const char* fn, const char* name, int value) {
  if (value == HW_NO_TRANS || value == HW_TRANS) return HW_OK;
  return Fail(HW_INVALID_ARGUMENT, fn, name, " (", value,
              ") is not HW_NO_TRANS (0) or HW_TRANS (1)");
}

// The rows of one head of one sequence (keys or values) after the checks
// that hw_kv_cache_keys and hw_kv_cache_stored_keys share; HW_OK or the
// error recorded.
int StoredRows(const char* fn, bool keys, const hw_kv_cache* cache, int64_t seq,
               int64_t kv_head, const void* data, headway::KvView* view) {
  if (cache == nullptr) return Null(fn, "cache");
  if (data == nullptr) return Null(fn, "data");
  if (CheckSeq(fn, "seq", seq, cache->cache) != HW_OK) {
    return HW_INVALID_ARGUMENT;
  }
  if (kv_head < 0 || kv_head >= cache->cache.n_kv_heads()) {
    return Fail(HW_INVALID_ARGUMENT, fn, "kv_head (", kv_head,
                ") is out of range [0, ", cache->cache.n_kv_heads(), ")");
  }
  *view = keys ? cache->cache.Keys(seq, kv_head)
               : cache->cache.Values(seq, kv_head);
  return HW_OK;
}

int KeysOrValues(const char* fn, bool keys, const hw_kv_cache* cache,
                 int64_t seq, int64_t kv_head, const float** data,
                 int64_t* rows, int64_t* stride) {
  return Guard(fn, [&]() -> int {
    headway::KvView view;
    const int code = StoredRows(fn, keys, cache, seq, kv_head, data, &view);
    if (code != HW_OK) return code;
    if (view.dtype != headway::KvDtype::kFloat32) {
      return Fail(
          HW_INVALID_ARGUMENT, fn, "cache stores ",
          headway::internal::KvDtypeName(view.dtype),
          ", not float32: read it with ",
          keys ? "hw_kv_cache_stored_keys" : "hw_kv_cache_stored_values");
    }
    *data = static_cast<const float*>(view.data);
    if (rows != nullptr) *rows = view.rows;
    if (stride != nullptr) *stride = view.stride;
    return Succeed();
  });
}

int StoredKeysOrValues(const char* fn, bool keys, const hw_kv_cache* cache,
                       int64_t seq, int64_t kv_head, int* dtype,
                       size_t* element_size, const void** data, int64_t* rows,
                       int64_t* stride, const float** scales) {
  return Guard(fn, [&]() -> int {
    headway::KvView view;
    const int code = StoredRows(fn, keys, cache, seq, kv_head, data, &view);
    if (code != HW_OK) return code;
    *data = view.data;
    if (dtype != nullptr) *dtype = static_cast<int>(view.dtype);
    if (element_size != nullptr)
      *element_size = headway::KvDtypeSize(view.dtype);
    if (rows != nullptr) *rows = view.rows;
    if (stride != nullptr) *stride = view.stride;
    if (scales != nullptr) *scales = view.scales;
    return Succeed();
  });
}

// The checks that exist in C alone for hw_kv_store_rows and hw_kv_load_rows
// (the dtype, null pointers, sizes of 0); the C++ call checks the strides,
// overlaps and byte counts.
int CheckKvRows(const char* fn, int dtype, int64_t rows, int64_t cols,
                const void* src, const void* dst, const float* scales) {
  if (!headway::internal::KvDtypeKnown(static_cast<headway::KvDtype>(dtype))) {
    return Fail(HW_INVALID_ARGUMENT, fn, "dtype (", dtype,
                ") is not a hw_kv_dtype (0 to 3)");
  }
  if (src == nullptr) return Null(fn, "src");
  if (dst == nullptr) return Null(fn, "dst");
  if (dtype == HW_KV_INT8 && scales == nullptr) {
    return Fail(HW_INVALID_ARGUMENT, fn, "scales is null (HW_KV_INT8 rows ",
                "have one scale each)");
  }
  // The C++ calls take rows == 0 as nothing to do; the C API's sizes are >= 1.
  if (rows < 1 || cols < 1) {
    return Fail(HW_INVALID_ARGUMENT, fn,
                "rows and cols must be >= 1 (got rows = ", rows,
                ", cols = ", cols, ")");
  }
  return HW_OK;
}

// The C++ names of hw_kv_store_rows' and hw_kv_load_rows' arguments.
constexpr Renames kKvRows = {
    {"src.rows", "rows"},         {"src.cols", "cols"},
    {"dst.rows", "rows"},         {"dst.cols", "cols"},
    {"src.stride", "src_stride"}, {"dst.stride", "dst_stride"},
    {"src.scales", "scales"},     {"dst.scales", "scales"},
    {"src.dtype", "dtype"},       {"dst.dtype", "dtype"},
    {"src.data", "src"},          {"dst.data", "dst"},
    {"KvDtype", "hw_kv_dtype"}};

// The view of stored rows that hw_kv_store_rows and hw_kv_load_rows pass on:
// stride 0 is dense, as in C++; int8 alone takes scales.
template <class View, class Data, class Scales>
View StoredRows(int dtype, Data* data, int64_t rows, int64_t cols,
                int64_t stride, Scales* scales) {
  View view;
  view.dtype = static_cast<headway::KvDtype>(dtype);
  view.data = data;
  view.rows = rows;
  view.cols = cols;
  view.stride = stride == 0 ? cols : stride;
  view.scales = dtype == HW_KV_INT8 ? scales : nullptr;
  return view;
}

// C++ names in the messages of ApplyRope and RmsNormHeads and what
// hw_apply_rope and hw_rms_norm_heads call them.
constexpr Renames kRowsInPlace = {{"x.rows", "rows"},
                                  {"x.cols", "cols"},
                                  {"x.stride", "stride"},
                                  {"RopeLayout", "hw_rope_layout"},
                                  {"RopeScaling", "hw_rope_scaling"}};

// A C RoPE config in C++: a field whose 0 means a default (headway.h) keeps
// RopeConfig's; any other value, and the enum values, are passed on as they
// are and checked by the C++ call.
headway::RopeConfig Rope(const hw_rope_config& rope) {
  headway::RopeConfig result;
  result.rotary_dim = rope.rotary_dim;
  result.layout = static_cast<headway::RopeLayout>(rope.layout);
  result.scaling = static_cast<headway::RopeScaling>(rope.scaling);
  if (rope.theta != 0.0) result.theta = rope.theta;
  if (rope.factor != 0.0) result.factor = rope.factor;
  if (rope.low_freq_factor != 0.0) {
    result.low_freq_factor = rope.low_freq_factor;
  }
  if (rope.high_freq_factor != 0.0) {
    result.high_freq_factor = rope.high_freq_factor;
  }
  if (rope.original_max_position != 0) {
    result.original_max_position = rope.original_max_position;
  }
  return result;
}

hw_rope_config CRope(const headway::RopeConfig& rope) {
  hw_rope_config result;
  std::memset(&result, 0, sizeof(result));
  result.rotary_dim = rope.rotary_dim;
  result.layout = static_cast<int32_t>(rope.layout);
  result.scaling = static_cast<int32_t>(rope.scaling);
  result.theta = rope.theta;
  result.factor = rope.factor;
  result.low_freq_factor = rope.low_freq_factor;
  result.high_freq_factor = rope.high_freq_factor;
  result.original_max_position = rope.original_max_position;
  return result;
}

// The largest struct_size accepted: bounds what a garbage struct_size makes
// the library read or write past the caller's struct.
constexpr size_t kMaxStructSize = 4096;

// The structs that grow (headway.h's Compatibility): their C name and the
// size of version 1, the smallest struct_size accepted. Every function takes
// one as its argument `variants`, which the messages name. A field of a later
// version is read (and written) only when struct_size covers it: ReadGrowing
// leaves it zero otherwise, WriteGrowing copies struct_size bytes.
template <typename T>
struct Growing;
template <>
struct Growing<hw_attention_variants> {
  static constexpr const char* kName = "hw_attention_variants";
  static constexpr size_t kV1Size = HW_ATTENTION_VARIANTS_V1_SIZE;
};
template <>
struct Growing<hw_attention_layer_variants> {
  static constexpr const char* kName = "hw_attention_layer_variants";
  static constexpr size_t kV1Size = HW_ATTENTION_LAYER_VARIANTS_V1_SIZE;
};
// The last version ends each struct (padding aside): a struct_size of an
// earlier one does not cover its fields, sizeof does. hw_attention_variants:
// version 3 (attention_compute); hw_attention_layer_variants: version 4
// (attention_compute).
static_assert(HW_ATTENTION_VARIANTS_V1_SIZE < HW_ATTENTION_VARIANTS_V2_SIZE &&
                  HW_ATTENTION_VARIANTS_V2_SIZE <
                      HW_ATTENTION_VARIANTS_V3_SIZE &&
                  HW_ATTENTION_VARIANTS_V3_SIZE <=
                      sizeof(hw_attention_variants),
              "hw_attention_variants' versions");
static_assert(HW_ATTENTION_LAYER_VARIANTS_V1_SIZE <
                      HW_ATTENTION_LAYER_VARIANTS_V2_SIZE &&
                  HW_ATTENTION_LAYER_VARIANTS_V2_SIZE <
                      HW_ATTENTION_LAYER_VARIANTS_V3_SIZE &&
                  HW_ATTENTION_LAYER_VARIANTS_V3_SIZE <
                      HW_ATTENTION_LAYER_VARIANTS_V4_SIZE &&
                  HW_ATTENTION_LAYER_VARIANTS_V4_SIZE <=
                      sizeof(hw_attention_layer_variants),
              "hw_attention_layer_variants' versions");

// A struct_size within [version 1's, kMaxStructSize]; HW_OK or the error
// recorded.
template <typename T>
int CheckStructSize(const char* fn, size_t size) {
  if (size < Growing<T>::kV1Size) {
    return Fail(HW_INVALID_ARGUMENT, fn, "variants.struct_size (", size,
                ") is smaller than version 1's (", Growing<T>::kV1Size,
                "): set it to sizeof(", Growing<T>::kName, ")");
  }
  if (size > kMaxStructSize) {
    return Fail(HW_INVALID_ARGUMENT, fn, "variants.struct_size (", size,
                ") is larger than ", kMaxStructSize, ": set it to sizeof(",
                Growing<T>::kName, ")");
  }
  return HW_OK;
}

// The caller's struct into *v: an older caller's shorter struct with the
// fields it lacks zero (off), a newer caller's longer one if the bytes past
// this library's struct are zero (the variants it does not know are off).
// HW_OK or the error recorded.
template <typename T>
int ReadGrowing(const char* fn, const T& variants, T* v) {
  const size_t size = variants.struct_size;
  if (CheckStructSize<T>(fn, size) != HW_OK) return HW_INVALID_ARGUMENT;
  const unsigned char* bytes =
      reinterpret_cast<const unsigned char*>(&variants);
  for (size_t i = sizeof(T); i < size; ++i) {
    if (bytes[i] != 0) {
      return Fail(HW_INVALID_ARGUMENT, fn, "variants.struct_size (", size,
                  ") is larger than this library's (", sizeof(T), ") and byte ",
                  i, " is not zero: a variant that Headway ",
                  HEADWAY_VERSION_STRING, " does not know");
    }
  }
  std::memset(v, 0, sizeof(*v));
  std::memcpy(v, &variants, std::min(size, sizeof(*v)));
  return HW_OK;
}

// `from` (struct_size already checked, and set to the caller's) into the
// caller's *to: the first struct_size bytes, those past this library's struct
// zero (the variants it does not know: off).
template <typename T>
void WriteGrowing(const T& from, T* to) {
  const size_t size = from.struct_size;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(to);
  std::memcpy(bytes, &from, std::min(size, sizeof(T)));
  if (size > sizeof(T)) std::memset(bytes + sizeof(T), 0, size - sizeof(T));
}

// The attention variants of a C struct (hw_attention_variants, or the same
// fields of hw_attention_layer_variants) into C++ options; checked by the C++
// call.
template <typename T>
void SetAttentionVariants(const T& v, headway::AttentionOptions* options) {
  options->window = v.window;
  options->n_sink_tokens = v.n_sink_tokens;  // 0 for a version 1 struct_size
  options->softcap = v.softcap;
  options->alibi_slopes = v.alibi_slopes;
  options->sink_logits = v.sink_logits;
  // 0 before the version that has it; checked by the C++ call.
  options->compute =
      static_cast<headway::AttentionCompute>(v.attention_compute);
}

// The variants (NULL: none) into the C++ config and weights. A variant that
// is off passes C++'s defaults, so that its other fields are ignored as
// headway.h says. HW_OK or the error recorded.
int SetVariants(const char* fn, const hw_attention_layer_variants* variants,
                headway::AttentionLayerConfig* config,
                headway::AttentionLayerWeights* weights) {
  if (variants == nullptr) return HW_OK;
  hw_attention_layer_variants v;
  if (ReadGrowing(fn, *variants, &v) != HW_OK) return HW_INVALID_ARGUMENT;
  if (v.qk_norm != 0 && v.qk_norm != 1) {
    return Fail(HW_INVALID_ARGUMENT, fn, "variants.qk_norm (", v.qk_norm,
                ") must be 0 or 1");
  }
  if (v.qk_norm == 1) {
    config->qk_norm = true;
    if (v.qk_norm_eps != 0.0f) config->qk_norm_eps = v.qk_norm_eps;
    weights->q_norm = v.q_norm;
    weights->k_norm = v.k_norm;
  }
  if (v.rope.rotary_dim != 0) config->rope = Rope(v.rope);
  SetAttentionVariants(v, &config->attention);
  // Passed on as they are (the values agree: see the static_asserts above)
  // and checked by Create; 0 for a struct_size before version 3.
  config->weight_dtype = static_cast<headway::WeightDtype>(v.weight_dtype);
  config->projection_compute =
      static_cast<headway::MatmulCompute>(v.projection_compute);
  return HW_OK;
}

// C++ names in Create's messages and what the C caller calls them.
constexpr Renames kLayerCreate = {
    kMaskEnum,
    {"config.attention.mask", "config.mask"},
    {"config.attention.scale", "config.scale"},
    {"config.qk_norm", "variants.qk_norm"},
    {"config.qk_norm_eps", "variants.qk_norm_eps"},
    {"config.rope", "variants.rope"},
    {"config.attention.window", "variants.window"},
    {"config.attention.n_sink_tokens", "variants.n_sink_tokens"},
    {"config.attention.softcap", "variants.softcap"},
    {"config.attention.alibi_slopes", "variants.alibi_slopes"},
    {"config.attention.sink_logits", "variants.sink_logits"},
    {"weights.q_norm", "variants.q_norm"},
    {"weights.k_norm", "variants.k_norm"},
    {"q_norm", "variants.q_norm"},
    {"k_norm", "variants.k_norm"},
    {"config.weight_dtype", "variants.weight_dtype"},
    {"config.projection_compute", "variants.projection_compute"},
    {"config.attention.compute", "variants.attention_compute"},
    {"RopeLayout", "hw_rope_layout"},
    {"RopeScaling", "hw_rope_scaling"},
    {"WeightDtype", "hw_weight_dtype"},
    {"MatmulCompute", "hw_matmul_compute"},
    {"AttentionCompute", "hw_attention_compute"}};

// hw_attention_layer_create and _create_with_variants, as fn.
int CreateLayer(const char* fn, const hw_attention_layer_config* config,
                const hw_attention_layer_weights* weights,
                const hw_attention_layer_variants* variants,
                hw_attention_layer** out) {
  if (config == nullptr) return Null(fn, "config");
  if (weights == nullptr) return Null(fn, "weights");
  if (out == nullptr) return Null(fn, "out");
  headway::AttentionLayerConfig c;
  c.d_model = config->d_model;
  c.n_heads = config->n_heads;
  c.n_kv_heads = config->n_kv_heads;
  c.head_dim = config->head_dim;
  c.attention.mask = static_cast<headway::AttentionMask>(config->mask);
  c.attention.scale = config->scale;
  c.head_begin = config->head_begin;
  c.head_end = config->head_end;

  headway::AttentionLayerWeights w;
  w.w_q = View(weights->w_q);
  w.w_k = View(weights->w_k);
  w.w_v = View(weights->w_v);
  w.w_o = View(weights->w_o);
  w.b_q = weights->b_q;
  w.b_k = weights->b_k;
  w.b_v = weights->b_v;
  w.b_o = weights->b_o;
  if (SetVariants(fn, variants, &c, &w) != HW_OK) return HW_INVALID_ARGUMENT;

  auto handle = std::make_unique<hw_attention_layer>();
  const int code = FromStatus(
      fn, headway::AttentionLayer::Create(c, w, &handle->layer), kLayerCreate);
  if (code != HW_OK) return code;
  *out = handle.release();
  return HW_OK;
}

// The options and variants (each NULL: the defaults, none) as C++ options.
// A mask value is passed on as it is (the values agree, see the static_assert
// above), like the variants' fields, and checked by the C++ call. HW_OK or
// the error recorded (a bad struct_size).
int AttentionOptionsOf(const char* fn, const hw_attention_options* options,
                       const hw_attention_variants* variants,
                       headway::AttentionOptions* result) {
  *result = headway::AttentionOptions();
  if (options != nullptr) {
    result->mask = static_cast<headway::AttentionMask>(options->mask);
    result->scale = options->scale;
  }
  if (variants != nullptr) {
    hw_attention_variants v;
    if (ReadGrowing(fn, *variants, &v) != HW_OK) return HW_INVALID_ARGUMENT;
    SetAttentionVariants(v, result);
  }
  return HW_OK;
}

// C++ names in Attention's and AttentionWithWeights' messages and what the C
// caller calls them: the variants are hw_attention_variants' fields.
constexpr Renames kAttention = {
    kMaskEnum,
    {"options.window", "variants.window"},
    {"options.n_sink_tokens", "variants.n_sink_tokens"},
    {"options.softcap", "variants.softcap"},
    {"options.alibi_slopes", "variants.alibi_slopes"},
    {"options.sink_logits", "variants.sink_logits"},
    {"options.compute kBFloat16",
     "variants.attention_compute HW_ATTENTION_BFLOAT16"},
    {"options.compute kInt8", "variants.attention_compute HW_ATTENTION_INT8"},
    {"options.compute", "variants.attention_compute"},
    {"AttentionCompute", "hw_attention_compute"}};

// hw_attention and hw_attention_with_variants (variants NULL: none), as fn.
int RunAttention(const char* fn, const hw_kv_cache* cache, int64_t n_heads,
                 const hw_attention_query* queries, int64_t n_queries,
                 const hw_attention_options* options,
                 const hw_attention_variants* variants) {
  if (cache == nullptr) return Null(fn, "cache");
  headway::AttentionOptions opts;
  if (AttentionOptionsOf(fn, options, variants, &opts) != HW_OK) {
    return HW_INVALID_ARGUMENT;
  }
  // queries == NULL and n_queries < 1 reach Attention, which reports them.
  std::vector<headway::AttentionQuery> converted;
  if (queries != nullptr && n_queries >= 1) {
    converted.resize(static_cast<size_t>(n_queries));
    for (int64_t i = 0; i < n_queries; ++i) {
      converted[static_cast<size_t>(i)] = Query(queries[i]);
    }
  }
  headway::AttentionQuery none;
  const headway::AttentionQuery* p =
      queries == nullptr ? nullptr
                         : (converted.empty() ? &none : converted.data());
  return FromStatus(
      fn, headway::Attention(cache->cache, n_heads, p, n_queries, opts),
      kAttention);
}

// hw_attention_with_weights and _with_weights_and_variants, as fn.
int RunAttentionWithWeights(const char* fn, const hw_kv_cache* cache,
                            int64_t n_heads, const hw_attention_query* query,
                            hw_out_matrix weights,
                            const hw_attention_options* options,
                            const hw_attention_variants* variants) {
  if (cache == nullptr) return Null(fn, "cache");
  if (query == nullptr) return Null(fn, "query");
  headway::AttentionOptions opts;
  if (AttentionOptionsOf(fn, options, variants, &opts) != HW_OK) {
    return HW_INVALID_ARGUMENT;
  }
  return FromStatus(
      fn,
      headway::AttentionWithWeights(cache->cache, n_heads, Query(*query),
                                    View(weights), opts),
      kAttention);
}

// hw_kv_cache_create_typed and hw_kv_cache_create_ring: a cache of config
// into *out, errors in fn's name.
int CreateCache(const char* fn, const headway::KvCacheConfig& config,
                hw_kv_cache** out) {
  return Guard(fn, [&]() -> int {
    if (out == nullptr) return Null(fn, "out");
    auto handle = std::make_unique<hw_kv_cache>();
    const int code = FromStatus(
        fn, headway::KvCache::Create(config, &handle->cache), kCacheConfig);
    if (code == HW_OK) *out = handle.release();
    return code;
  });
}

// The config of a plain (non-ring) cache.
headway::KvCacheConfig CacheConfig(int64_t n_sequences, int64_t n_kv_heads,
                                   int64_t head_dim, int64_t capacity,
                                   int dtype) {
  headway::KvCacheConfig config;
  config.n_sequences = n_sequences;
  config.n_kv_heads = n_kv_heads;
  config.head_dim = head_dim;
  config.capacity = capacity;
  config.dtype = static_cast<headway::KvDtype>(dtype);
  return config;
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ Status

const char* hw_last_error(void) {
  return t_fallback != nullptr ? t_fallback : t_message.c_str();
}

const char* hw_status_name(int code) {
  if (code < HW_OK || code > HW_INTERNAL) return "UNKNOWN";
  return headway::StatusCodeName(static_cast<StatusCode>(code));
}

// ------------------------------------------------ Version, targets, threads

const char* hw_version(void) { return HEADWAY_VERSION_STRING; }

const char* hw_active_target(void) {
  try {
    const char* name = headway::ActiveTarget().name;
    return name != nullptr ? name : "";
  } catch (...) {
    return "";
  }
}

int64_t hw_supported_targets(const char** names, int64_t capacity) {
  try {
    const std::vector<headway::Target> targets = headway::SupportedTargets();
    const int64_t n = static_cast<int64_t>(targets.size());
    for (int64_t i = 0; names != nullptr && i < n && i < capacity; ++i) {
      names[i] = targets[static_cast<size_t>(i)].name;
    }
    return n;
  } catch (...) {
    return 0;
  }
}

int hw_set_max_target(const char* name) {
  constexpr const char* kFn = "hw_set_max_target";
  return Guard(kFn, [&]() -> int {
    if (name == nullptr) return Null(kFn, "name");
    return FromStatus(kFn, headway::SetMaxTarget(name));
  });
}

void hw_reset_max_target(void) {
  try {
    headway::ResetMaxTarget();
  } catch (...) {
  }
}

int hw_set_max_threads(int n) {
  constexpr const char* kFn = "hw_set_max_threads";
  return Guard(
      kFn, [&]() -> int { return FromStatus(kFn, headway::SetMaxThreads(n)); });
}

int hw_max_threads(void) {
  try {
    return headway::MaxThreads();
  } catch (...) {
    return 1;
  }
}

int64_t hw_release_thread_scratch(void) {
  return headway::ReleaseThreadScratch();
}

// ---------------------------------------------------------------- KV cache

size_t hw_kv_dtype_size(int dtype) {
  return headway::KvDtypeSize(static_cast<headway::KvDtype>(dtype));
}

const char* hw_kv_dtype_name(int dtype) {
  return headway::internal::KvDtypeName(static_cast<headway::KvDtype>(dtype));
}

int hw_kv_cache_create_typed(int64_t n_sequences, int64_t n_kv_heads,
                             int64_t head_dim, int64_t capacity, int dtype,
                             hw_kv_cache** out) {
  return CreateCache(
      "hw_kv_cache_create_typed",
      CacheConfig(n_sequences, n_kv_heads, head_dim, capacity, dtype), out);
}

int hw_kv_cache_create_ring(int64_t n_sequences, int64_t n_kv_heads,
                            int64_t head_dim, int64_t capacity,
                            int64_t n_sink_tokens, int dtype,
                            hw_kv_cache** out) {
  headway::KvCacheConfig config =
      CacheConfig(n_sequences, n_kv_heads, head_dim, capacity, dtype);
  config.ring = true;
  config.n_sink_tokens = n_sink_tokens;
  return CreateCache("hw_kv_cache_create_ring", config, out);
}

int hw_kv_cache_create(int64_t n_sequences, int64_t n_kv_heads,
                       int64_t head_dim, int64_t capacity, hw_kv_cache** out) {
  const int code = hw_kv_cache_create_typed(n_sequences, n_kv_heads, head_dim,
                                            capacity, HW_KV_FLOAT32, out);
  if (code != HW_OK)
    RenameLastError("hw_kv_cache_create_typed", "hw_kv_cache_create");
  return code;
}

void hw_kv_cache_destroy(hw_kv_cache* cache) { delete cache; }

int hw_kv_cache_shape(const hw_kv_cache* cache, int64_t* n_sequences,
                      int64_t* n_kv_heads, int64_t* head_dim, int64_t* capacity,
                      int64_t* row_stride) {
  constexpr const char* kFn = "hw_kv_cache_shape";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    const headway::KvCache& c = cache->cache;
    if (n_sequences != nullptr) *n_sequences = c.n_sequences();
    if (n_kv_heads != nullptr) *n_kv_heads = c.n_kv_heads();
    if (head_dim != nullptr) *head_dim = c.head_dim();
    if (capacity != nullptr) *capacity = c.capacity();
    if (row_stride != nullptr) *row_stride = c.row_stride();
    return Succeed();
  });
}

int hw_kv_cache_dtype(const hw_kv_cache* cache, int* dtype,
                      size_t* element_size) {
  constexpr const char* kFn = "hw_kv_cache_dtype";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    const headway::KvDtype type = cache->cache.config().dtype;
    if (dtype != nullptr) *dtype = static_cast<int>(type);
    if (element_size != nullptr) *element_size = headway::KvDtypeSize(type);
    return Succeed();
  });
}

int hw_kv_cache_length(const hw_kv_cache* cache, int64_t seq, int64_t* length) {
  constexpr const char* kFn = "hw_kv_cache_length";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    if (length == nullptr) return Null(kFn, "length");
    if (CheckSeq(kFn, "seq", seq, cache->cache) != HW_OK) {
      return HW_INVALID_ARGUMENT;
    }
    *length = cache->cache.length(seq);
    return Succeed();
  });
}

int hw_kv_cache_ring_state(const hw_kv_cache* cache, int64_t seq,
                           int64_t* ring_begin, int64_t* n_sink_tokens,
                           int* ring) {
  constexpr const char* kFn = "hw_kv_cache_ring_state";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    if (CheckSeq(kFn, "seq", seq, cache->cache) != HW_OK) {
      return HW_INVALID_ARGUMENT;
    }
    const headway::KvCacheConfig& config = cache->cache.config();
    if (ring_begin != nullptr) *ring_begin = cache->cache.ring_begin(seq);
    if (n_sink_tokens != nullptr) *n_sink_tokens = config.n_sink_tokens;
    if (ring != nullptr) *ring = config.ring ? 1 : 0;
    return Succeed();
  });
}

int hw_kv_cache_slot(const hw_kv_cache* cache, int64_t position,
                     int64_t* slot) {
  constexpr const char* kFn = "hw_kv_cache_slot";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    if (slot == nullptr) return Null(kFn, "slot");
    if (position < 0) {
      return Fail(HW_INVALID_ARGUMENT, kFn, "position must be >= 0 (got ",
                  position, ")");
    }
    *slot = cache->cache.Slot(position);
    return Succeed();
  });
}

int hw_kv_cache_bytes(const hw_kv_cache* cache, size_t* bytes) {
  constexpr const char* kFn = "hw_kv_cache_bytes";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    if (bytes == nullptr) return Null(kFn, "bytes");
    *bytes = cache->cache.bytes();
    return Succeed();
  });
}

int hw_kv_cache_bytes_per_token(const hw_kv_cache* cache, size_t* bytes) {
  constexpr const char* kFn = "hw_kv_cache_bytes_per_token";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    if (bytes == nullptr) return Null(kFn, "bytes");
    *bytes = cache->cache.bytes_per_token();
    return Succeed();
  });
}

int hw_kv_cache_append(hw_kv_cache* cache, int64_t seq, int64_t n_new,
                       const float* k, int64_t k_stride, const float* v,
                       int64_t v_stride) {
  constexpr const char* kFn = "hw_kv_cache_append";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    if (k == nullptr) return Null(kFn, "k");
    if (v == nullptr) return Null(kFn, "v");
    if (n_new < 1) {
      return Fail(HW_INVALID_ARGUMENT, kFn, "n_new must be >= 1 (got ", n_new,
                  ")");
    }
    const int64_t cols = cache->cache.n_kv_heads() * cache->cache.head_dim();
    return FromStatus(
        kFn,
        cache->cache.Append(
            seq, headway::MatrixView<const float>(k, n_new, cols, k_stride),
            headway::MatrixView<const float>(v, n_new, cols, v_stride)),
        {{"k.rows", "n_new"},
         {"k.stride", "k_stride"},
         {"v.stride", "v_stride"},
         {"k.cols", "n_kv_heads * head_dim"},
         {"v.cols", "n_kv_heads * head_dim"},
         {"k: rows", "k: n_new"},
         {"v: rows", "v: n_new"}});
  });
}

int hw_kv_cache_keys(const hw_kv_cache* cache, int64_t seq, int64_t kv_head,
                     const float** data, int64_t* rows, int64_t* stride) {
  return KeysOrValues("hw_kv_cache_keys", true, cache, seq, kv_head, data, rows,
                      stride);
}

int hw_kv_cache_values(const hw_kv_cache* cache, int64_t seq, int64_t kv_head,
                       const float** data, int64_t* rows, int64_t* stride) {
  return KeysOrValues("hw_kv_cache_values", false, cache, seq, kv_head, data,
                      rows, stride);
}

int hw_kv_cache_stored_keys(const hw_kv_cache* cache, int64_t seq,
                            int64_t kv_head, int* dtype, size_t* element_size,
                            const void** data, int64_t* rows, int64_t* stride,
                            const float** scales) {
  return StoredKeysOrValues("hw_kv_cache_stored_keys", true, cache, seq,
                            kv_head, dtype, element_size, data, rows, stride,
                            scales);
}

int hw_kv_cache_stored_values(const hw_kv_cache* cache, int64_t seq,
                              int64_t kv_head, int* dtype, size_t* element_size,
                              const void** data, int64_t* rows, int64_t* stride,
                              const float** scales) {
  return StoredKeysOrValues("hw_kv_cache_stored_values", false, cache, seq,
                            kv_head, dtype, element_size, data, rows, stride,
                            scales);
}

int hw_kv_store_rows(int dtype, int64_t rows, int64_t cols, const float* src,
                     int64_t src_stride, void* dst, int64_t dst_stride,
                     float* scales) {
  constexpr const char* kFn = "hw_kv_store_rows";
  return Guard(kFn, [&]() -> int {
    const int code = CheckKvRows(kFn, dtype, rows, cols, src, dst, scales);
    if (code != HW_OK) return code;
    const auto view = StoredRows<headway::KvMutableView>(dtype, dst, rows, cols,
                                                         dst_stride, scales);
    return FromStatus(kFn,
                      headway::StoreKvRows(headway::MatrixView<const float>(
                                               src, rows, cols, src_stride),
                                           view),
                      kKvRows);
  });
}

int hw_kv_load_rows(int dtype, int64_t rows, int64_t cols, const void* src,
                    int64_t src_stride, const float* scales, float* dst,
                    int64_t dst_stride) {
  constexpr const char* kFn = "hw_kv_load_rows";
  return Guard(kFn, [&]() -> int {
    const int code = CheckKvRows(kFn, dtype, rows, cols, src, dst, scales);
    if (code != HW_OK) return code;
    const auto view =
        StoredRows<headway::KvView>(dtype, src, rows, cols, src_stride, scales);
    return FromStatus(
        kFn,
        headway::LoadKvRows(
            view, headway::MatrixView<float>(dst, rows, cols, dst_stride)),
        kKvRows);
  });
}

int hw_kv_cache_truncate(hw_kv_cache* cache, int64_t seq, int64_t new_length) {
  constexpr const char* kFn = "hw_kv_cache_truncate";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    return FromStatus(kFn, cache->cache.Truncate(seq, new_length));
  });
}

int hw_kv_cache_copy_sequence(hw_kv_cache* cache, int64_t from, int64_t to) {
  constexpr const char* kFn = "hw_kv_cache_copy_sequence";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    return FromStatus(kFn, cache->cache.CopySequence(from, to));
  });
}

int hw_kv_cache_reset(hw_kv_cache* cache, int64_t seq) {
  constexpr const char* kFn = "hw_kv_cache_reset";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    return FromStatus(kFn, cache->cache.Reset(seq));
  });
}

int hw_kv_cache_reset_all(hw_kv_cache* cache) {
  constexpr const char* kFn = "hw_kv_cache_reset_all";
  return Guard(kFn, [&]() -> int {
    if (cache == nullptr) return Null(kFn, "cache");
    cache->cache.ResetAll();
    return Succeed();
  });
}

// ------------------------------------------------------------ RoPE, RMSNorm

int hw_apply_rope(const hw_rope_config* rope, int64_t head_dim,
                  const int64_t* positions, float* x, int64_t rows,
                  int64_t cols, int64_t stride) {
  constexpr const char* kFn = "hw_apply_rope";
  return Guard(kFn, [&]() -> int {
    if (rope == nullptr) return Null(kFn, "rope");
    if (positions == nullptr) return Null(kFn, "positions");
    if (x == nullptr) return Null(kFn, "x");
    return FromStatus(
        kFn,
        headway::ApplyRope(Rope(*rope), head_dim, positions,
                           headway::MatrixView<float>(x, rows, cols, stride)),
        kRowsInPlace);
  });
}

int hw_rms_norm_heads(float* x, int64_t rows, int64_t cols, int64_t stride,
                      int64_t head_dim, const float* weight, float eps) {
  constexpr const char* kFn = "hw_rms_norm_heads";
  return Guard(kFn, [&]() -> int {
    if (x == nullptr) return Null(kFn, "x");
    if (weight == nullptr) return Null(kFn, "weight");
    return FromStatus(
        kFn,
        headway::RmsNormHeads(headway::MatrixView<float>(x, rows, cols, stride),
                              head_dim, weight, eps),
        kRowsInPlace);
  });
}

// --------------------------------------------------------- Attention layer

int hw_attention_layer_create(const hw_attention_layer_config* config,
                              const hw_attention_layer_weights* weights,
                              hw_attention_layer** out) {
  constexpr const char* kFn = "hw_attention_layer_create";
  return Guard(kFn, [&]() -> int {
    return CreateLayer(kFn, config, weights, nullptr, out);
  });
}

int hw_attention_layer_create_with_variants(
    const hw_attention_layer_config* config,
    const hw_attention_layer_weights* weights,
    const hw_attention_layer_variants* variants, hw_attention_layer** out) {
  constexpr const char* kFn = "hw_attention_layer_create_with_variants";
  return Guard(kFn, [&]() -> int {
    return CreateLayer(kFn, config, weights, variants, out);
  });
}

void hw_attention_layer_destroy(hw_attention_layer* layer) { delete layer; }

int hw_attention_layer_get_config(const hw_attention_layer* layer,
                                  hw_attention_layer_config* config) {
  constexpr const char* kFn = "hw_attention_layer_get_config";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (config == nullptr) return Null(kFn, "config");
    const headway::AttentionLayerConfig& c = layer->layer.config();
    hw_attention_layer_config result;
    result.d_model = c.d_model;
    result.n_heads = c.n_heads;
    result.n_kv_heads = c.n_kv_heads;
    result.head_dim = c.head_dim;
    result.mask = static_cast<int32_t>(c.attention.mask);
    result.scale = c.attention.scale;
    result.head_begin = c.head_begin;
    result.head_end = c.head_end;
    *config = result;
    return Succeed();
  });
}

int hw_attention_layer_get_variants(const hw_attention_layer* layer,
                                    hw_attention_layer_variants* variants) {
  constexpr const char* kFn = "hw_attention_layer_get_variants";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (variants == nullptr) return Null(kFn, "variants");
    const size_t size = variants->struct_size;
    if (CheckStructSize<hw_attention_layer_variants>(kFn, size) != HW_OK) {
      return HW_INVALID_ARGUMENT;
    }
    const headway::AttentionLayerConfig& c = layer->layer.config();
    hw_attention_layer_variants result;
    std::memset(&result, 0, sizeof(result));
    result.struct_size = size;
    result.qk_norm = c.qk_norm ? 1 : 0;
    result.qk_norm_eps = c.qk_norm_eps;
    result.q_norm = layer->layer.q_norm();
    result.k_norm = layer->layer.k_norm();
    result.rope = CRope(c.rope);
    // The attention variants; the per-head arrays are the C++ layer's copies
    // of the whole model's [n_heads].
    result.window = c.attention.window;
    result.n_sink_tokens = c.attention.n_sink_tokens;  // if size covers it
    result.softcap = c.attention.softcap;
    result.alibi_slopes = c.attention.alibi_slopes;
    result.sink_logits = c.attention.sink_logits;
    // Version 3, if size covers it.
    result.weight_dtype = static_cast<int32_t>(c.weight_dtype);
    result.projection_compute = static_cast<int32_t>(c.projection_compute);
    // Version 4, if size covers it.
    result.attention_compute = static_cast<int32_t>(c.attention.compute);
    WriteGrowing(result, variants);
    return Succeed();
  });
}

int hw_attention_layer_n_weights(const hw_attention_layer* layer, int64_t* n) {
  constexpr const char* kFn = "hw_attention_layer_n_weights";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (n == nullptr) return Null(kFn, "n");
    *n = layer->layer.n_weights();
    return Succeed();
  });
}

int hw_attention_layer_packed_bytes(const hw_attention_layer* layer,
                                    size_t* bytes) {
  constexpr const char* kFn = "hw_attention_layer_packed_bytes";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (bytes == nullptr) return Null(kFn, "bytes");
    *bytes = layer->layer.packed_bytes();
    return Succeed();
  });
}

int hw_attention_layer_scratch_bytes(const hw_attention_layer* layer,
                                     size_t* bytes) {
  constexpr const char* kFn = "hw_attention_layer_scratch_bytes";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (bytes == nullptr) return Null(kFn, "bytes");
    *bytes = layer->layer.scratch_bytes();
    return Succeed();
  });
}

int hw_attention_layer_release_scratch(hw_attention_layer* layer,
                                       size_t* released) {
  constexpr const char* kFn = "hw_attention_layer_release_scratch";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    const size_t bytes = layer->layer.ReleaseScratch();
    if (released != nullptr) *released = bytes;
    return Succeed();
  });
}

int hw_attention_layer_cache_bytes_per_token(const hw_attention_layer* layer,
                                             size_t* bytes) {
  constexpr const char* kFn = "hw_attention_layer_cache_bytes_per_token";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (bytes == nullptr) return Null(kFn, "bytes");
    *bytes = layer->layer.cache_bytes_per_token();
    return Succeed();
  });
}

int hw_attention_layer_create_cache_typed(const hw_attention_layer* layer,
                                          int64_t n_sequences, int64_t capacity,
                                          int dtype, hw_kv_cache** out) {
  constexpr const char* kFn = "hw_attention_layer_create_cache_typed";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (out == nullptr) return Null(kFn, "out");
    const headway::KvCacheConfig config = layer->layer.CacheConfig(
        n_sequences, capacity, static_cast<headway::KvDtype>(dtype));
    auto handle = std::make_unique<hw_kv_cache>();
    const int code = FromStatus(
        kFn, headway::KvCache::Create(config, &handle->cache), kCacheConfig);
    if (code == HW_OK) *out = handle.release();
    return code;
  });
}

int hw_attention_layer_create_cache(const hw_attention_layer* layer,
                                    int64_t n_sequences, int64_t capacity,
                                    hw_kv_cache** out) {
  const int code = hw_attention_layer_create_cache_typed(
      layer, n_sequences, capacity, HW_KV_FLOAT32, out);
  if (code != HW_OK) {
    RenameLastError("hw_attention_layer_create_cache_typed",
                    "hw_attention_layer_create_cache");
  }
  return code;
}

int hw_attention_layer_create_ring_cache(const hw_attention_layer* layer,
                                         int64_t n_sequences, int dtype,
                                         hw_kv_cache** out) {
  constexpr const char* kFn = "hw_attention_layer_create_ring_cache";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (out == nullptr) return Null(kFn, "out");
    // RingCacheConfig gives capacity 0 without a window, which
    // KvCache::Create would report as a capacity the caller never passed.
    const headway::AttentionOptions& attention =
        layer->layer.config().attention;
    if (attention.window < 1) {
      return Fail(HW_INVALID_ARGUMENT, kFn,
                  "the layer has no sliding window (variants.window is 0), "
                  "so a ring cache would drop keys it attends to: use "
                  "hw_attention_layer_create_cache");
    }
    // window + n_sink_tokens, which RingCacheConfig adds, must fit.
    if (attention.window >
        std::numeric_limits<int64_t>::max() - attention.n_sink_tokens) {
      return Fail(HW_RESOURCE_EXHAUSTED, kFn, "capacity variants.window (",
                  attention.window, ") + variants.n_sink_tokens (",
                  attention.n_sink_tokens, ") overflows int64_t");
    }
    const headway::KvCacheConfig config = layer->layer.RingCacheConfig(
        n_sequences, static_cast<headway::KvDtype>(dtype));
    auto handle = std::make_unique<hw_kv_cache>();
    const int code = FromStatus(
        kFn, headway::KvCache::Create(config, &handle->cache), kCacheConfig);
    if (code == HW_OK) *out = handle.release();
    return code;
  });
}

int hw_attention_layer_forward(hw_attention_layer* layer, hw_kv_cache* cache,
                               const hw_layer_sequence* sequences,
                               int64_t n_sequences, const float* x,
                               int64_t x_stride, float* y, int64_t y_stride) {
  constexpr const char* kFn = "hw_attention_layer_forward";
  return Guard(kFn, [&]() -> int {
    if (layer == nullptr) return Null(kFn, "layer");
    if (cache == nullptr) return Null(kFn, "cache");
    if (sequences == nullptr) return Null(kFn, "sequences");
    if (x == nullptr) return Null(kFn, "x");
    if (y == nullptr) return Null(kFn, "y");
    // The rows of x and y: the sum of n_tokens, saturated. Forward checks
    // the sequences (n_sequences, each seq and n_tokens, the capacity) before
    // x and y, and a sum that does not fit is always one of those errors
    // (distinct sequences within the capacity sum to at most the cache's
    // size), so only a valid sum reaches the views.
    std::vector<headway::LayerSequence>& seqs = layer->sequences;
    seqs.resize(static_cast<size_t>(n_sequences < 1 ? 1 : n_sequences));
    int64_t total = 0;
    for (int64_t i = 0; i < n_sequences; ++i) {
      const int64_t n = sequences[i].n_tokens;
      seqs[static_cast<size_t>(i)].seq = sequences[i].seq;
      seqs[static_cast<size_t>(i)].n_tokens = n;
      if (!headway::internal::CheckedAdd(total, n, &total)) {
        total = n > 0 ? std::numeric_limits<int64_t>::max()
                      : std::numeric_limits<int64_t>::min();
      }
    }
    const int64_t d_model = layer->layer.config().d_model;
    return FromStatus(
        kFn,
        layer->layer.Forward(
            &cache->cache, seqs.data(), n_sequences,
            headway::MatrixView<const float>(x, total, d_model, x_stride),
            headway::MatrixView<float>(y, total, d_model, y_stride)),
        {{"x.stride", "x_stride"},
         {"y.stride", "y_stride"},
         {"config.attention.window", "the layer's variants.window"},
         {"config.attention.n_sink_tokens",
          "the layer's variants.n_sink_tokens"},
         {"config.attention.compute kBFloat16",
          "the layer's variants.attention_compute HW_ATTENTION_BFLOAT16"},
         {"config.attention.compute kInt8",
          "the layer's variants.attention_compute HW_ATTENTION_INT8"},
         {"config.attention.compute", "the layer's variants.attention_compute"},
         {"CacheConfig", "hw_attention_layer_create_cache"}});
  });
}

// ----------------------------------------------------------- Attention core

int hw_alibi_slopes(int64_t n_heads, float* slopes) {
  constexpr const char* kFn = "hw_alibi_slopes";
  return Guard(kFn, [&]() -> int {
    return FromStatus(kFn, headway::AlibiSlopes(n_heads, slopes));
  });
}

int hw_attention(const hw_kv_cache* cache, int64_t n_heads,
                 const hw_attention_query* queries, int64_t n_queries,
                 const hw_attention_options* options) {
  constexpr const char* kFn = "hw_attention";
  return Guard(kFn, [&]() -> int {
    return RunAttention(kFn, cache, n_heads, queries, n_queries, options,
                        nullptr);
  });
}

int hw_attention_with_variants(const hw_kv_cache* cache, int64_t n_heads,
                               const hw_attention_query* queries,
                               int64_t n_queries,
                               const hw_attention_options* options,
                               const hw_attention_variants* variants) {
  constexpr const char* kFn = "hw_attention_with_variants";
  return Guard(kFn, [&]() -> int {
    return RunAttention(kFn, cache, n_heads, queries, n_queries, options,
                        variants);
  });
}

int hw_attention_with_weights(const hw_kv_cache* cache, int64_t n_heads,
                              const hw_attention_query* query,
                              hw_out_matrix weights,
                              const hw_attention_options* options) {
  constexpr const char* kFn = "hw_attention_with_weights";
  return Guard(kFn, [&]() -> int {
    return RunAttentionWithWeights(kFn, cache, n_heads, query, weights, options,
                                   nullptr);
  });
}

int hw_attention_with_weights_and_variants(
    const hw_kv_cache* cache, int64_t n_heads, const hw_attention_query* query,
    hw_out_matrix weights, const hw_attention_options* options,
    const hw_attention_variants* variants) {
  constexpr const char* kFn = "hw_attention_with_weights_and_variants";
  return Guard(kFn, [&]() -> int {
    return RunAttentionWithWeights(kFn, cache, n_heads, query, weights, options,
                                   variants);
  });
}

// ----------------------------------------------------------------- Kernels

int hw_matmul(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const float* a, int64_t lda, const float* b,
              int64_t ldb, float beta, float* c, int64_t ldc) {
  constexpr const char* kFn = "hw_matmul";
  return Guard(kFn, [&]() -> int {
    if (a == nullptr) return Null(kFn, "a");
    if (b == nullptr) return Null(kFn, "b");
    if (c == nullptr) return Null(kFn, "c");
    if (CheckTranspose(kFn, "trans_a", trans_a) != HW_OK ||
        CheckTranspose(kFn, "trans_b", trans_b) != HW_OK) {
      return HW_INVALID_ARGUMENT;
    }
    if (m < 1 || n < 1 || k < 1) {
      return Fail(HW_INVALID_ARGUMENT, kFn,
                  "m, n and k must be >= 1 (got m = ", m, ", n = ", n,
                  ", k = ", k, ")");
    }
    const bool ta = trans_a == HW_TRANS;
    const bool tb = trans_b == HW_TRANS;
    const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    return FromStatus(
        kFn,
        headway::Matmul(
            headway::MatrixView<const float>(a, a_rows, a_cols, lda),
            static_cast<headway::Transpose>(trans_a),
            headway::MatrixView<const float>(b, b_rows, b_cols, ldb),
            static_cast<headway::Transpose>(trans_b),
            headway::MatrixView<float>(c, m, n, ldc), alpha, beta),
        {{"a.stride", "lda"},
         {"b.stride", "ldb"},
         {"c.stride", "ldc"},
         {"a.cols", ta ? "m" : "k"},
         {"b.cols", tb ? "k" : "n"},
         {"c.cols", "n"}});
  });
}

int hw_softmax_rows(int64_t rows, int64_t cols, const float* x,
                    int64_t x_stride, float* y, int64_t y_stride, float scale) {
  constexpr const char* kFn = "hw_softmax_rows";
  return Guard(kFn, [&]() -> int {
    if (x == nullptr) return Null(kFn, "x");
    if (y == nullptr) return Null(kFn, "y");
    return FromStatus(
        kFn,
        headway::Softmax(
            headway::MatrixView<const float>(x, rows, cols, x_stride),
            headway::MatrixView<float>(y, rows, cols, y_stride), scale),
        {{"x.rows", "rows"},
         {"x.cols", "cols"},
         {"y.rows", "rows"},
         {"y.cols", "cols"},
         {"x.stride", "x_stride"},
         {"y.stride", "y_stride"}});
  });
}

}  // extern "C"

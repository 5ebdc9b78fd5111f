/* The C API (headway/headway.h) used from C, linked against the shared
 * library: every call below goes through an exported symbol. No test
 * framework: CHECK records a failure and goes on; the exit status is the
 * number of failures (capped), 0 when all pass.
 *
 * Numerical tolerance. The layer's outputs are compared (a) with a float64
 * reference and (b) with themselves computed another way (prefill of N tokens
 * against prefill of k plus N - k decode steps; a batch of two sequences
 * against each alone). The differences are rounding only: float32 dot
 * products of at most 64 terms (relative error up to about 64 * 2^-24 = 4e-6
 * of the sum of |terms|), a float32 softmax (about 1e-6) and, between the
 * paths, another blocking of the attention and matmul sums. With weights
 * scaled by 1 / sqrt(fan-in) that bounds the difference near 1e-5 of the
 * largest |output| (observed: below 3e-7 on every target). A wrong position,
 * head, bias or cached row changes outputs by O(1) of that scale. So every
 * comparison is normwise, max |got - want| <= 1e-4 * max |want|: ten times
 * the rounding bound, far below a real error. */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "headway/headway.h"

static int g_failures = 0;

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: \"%s\")\n", \
              __FILE__, __LINE__, #cond, hw_last_error());              \
      ++g_failures;                                                     \
    }                                                                   \
  } while (0)

/* The call returns HW_OK. */
#define CHECK_OK(call)                                                   \
  do {                                                                   \
    int rc_ = (call);                                                    \
    if (rc_ != HW_OK) {                                                  \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, \
              #call, hw_status_name(rc_), hw_last_error());              \
      ++g_failures;                                                      \
    }                                                                    \
  } while (0)

/* The call returns `code` and its message contains `needle`. */
#define CHECK_ERR(call, code, needle)                                          \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != (code) || strstr(hw_last_error(), (needle)) == NULL) {          \
      fprintf(stderr, "%s:%d: %s returned %s (\"%s\"), want %s with \"%s\"\n", \
              __FILE__, __LINE__, #call, hw_status_name(rc_), hw_last_error(), \
              hw_status_name(code), (needle));                                 \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------- Helpers */

/* Runs run(context) on every instruction set this CPU runs (dispatch capped
 * with hw_set_max_target; a layer packs its weights for the target active at
 * create), naming the target after any failure; then lifts the cap. */
static void OnEveryTarget(void (*run)(void*), void* context) {
  const char* targets[16];
  int64_t n_targets = hw_supported_targets(targets, 16);
  if (n_targets > 16) n_targets = 16;
  for (int64_t t = 0; t < n_targets; ++t) {
    CHECK_OK(hw_set_max_target(targets[t]));
    const int before = g_failures;
    run(context);
    if (g_failures != before) {
      fprintf(stderr, "  (the failures above are on target %s)\n", targets[t]);
    }
  }
  hw_reset_max_target();
}

static uint32_t g_seed = 12345u;

/* Uniform in [-0.5, 0.5), from a 32-bit LCG (Numerical Recipes). */
static float Rand(void) {
  g_seed = g_seed * 1664525u + 1013904223u;
  return (float)((double)(g_seed >> 8) / 16777216.0 - 0.5);
}

static float* RandomArray(int64_t n, float scale) {
  float* p = (float*)malloc((size_t)n * sizeof(float));
  if (p == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  for (int64_t i = 0; i < n; ++i) p[i] = scale * Rand();
  return p;
}

static float* FilledArray(int64_t n, float value) {
  float* p = RandomArray(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) p[i] = value;
  return p;
}

/* max |got - want| / max |want| over [rows, cols] of two strided matrices. */
static double NormwiseDiff(const float* got, int64_t got_stride,
                           const float* want, int64_t want_stride, int64_t rows,
                           int64_t cols) {
  double diff = 0.0, scale = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got[r * got_stride + c];
      const double w = want[r * want_stride + c];
      if (!(fabs(g - w) <= diff)) diff = fabs(g - w); /* NaN sticks */
      if (fabs(w) > scale) scale = fabs(w);
    }
  }
  return scale > 0.0 ? diff / scale : diff;
}

static const double kTolerance = 1e-4; /* see the top of the file */

/* ----------------------------------------------------- Status, version */

static void TestStatusAndVersion(void) {
  CHECK(strcmp(hw_status_name(HW_OK), "OK") == 0);
  CHECK(strcmp(hw_status_name(HW_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
  CHECK(strcmp(hw_status_name(HW_OUT_OF_RANGE), "OUT_OF_RANGE") == 0);
  CHECK(strcmp(hw_status_name(HW_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED") ==
        0);
  CHECK(strcmp(hw_status_name(HW_FAILED_PRECONDITION), "FAILED_PRECONDITION") ==
        0);
  CHECK(strcmp(hw_status_name(HW_INTERNAL), "INTERNAL") == 0);
  CHECK(strcmp(hw_status_name(42), "UNKNOWN") == 0);
  CHECK(strcmp(hw_status_name(-1), "UNKNOWN") == 0);

  const char* version = hw_version();
  int major = -1, minor = -1, patch = -1;
  char rest = 0;
  CHECK(version != NULL);
  CHECK(sscanf(version, "%d.%d.%d%c", &major, &minor, &patch, &rest) == 3);
  CHECK(major >= 0 && minor >= 0 && patch >= 0);

  /* An error sets the message; the next successful call clears it. */
  CHECK_ERR(hw_set_max_threads(-1), HW_INVALID_ARGUMENT, "n");
  CHECK(hw_last_error()[0] != '\0');
  CHECK_OK(hw_set_max_threads(0));
  CHECK(strcmp(hw_last_error(), "") == 0);
}

/* ------------------------------------------------------ Targets, threads */

static void TestTargetsAndThreads(void) {
  const char* names[16];
  const int64_t n = hw_supported_targets(names, 16);
  CHECK(n >= 1 && n <= 16);
  CHECK(hw_supported_targets(NULL, 0) == n);
  if (n < 1 || n > 16) return;
  /* The fallback: SCALAR with g++ < 12.3, EMU128 with clang. */
  const char* fallback = names[n - 1];
  CHECK(strcmp(fallback, "SCALAR") == 0 || strcmp(fallback, "EMU128") == 0);
  CHECK(strcmp(hw_active_target(), names[0]) == 0);

  for (int64_t i = 0; i < n; ++i) {
    char lower[32];
    size_t j = 0;
    for (; names[i][j] != '\0' && j + 1 < sizeof(lower); ++j) {
      lower[j] = (char)tolower((unsigned char)names[i][j]);
    }
    lower[j] = '\0';
    CHECK_OK(hw_set_max_target(lower));
    CHECK(strcmp(hw_active_target(), names[i]) == 0);
  }
  hw_reset_max_target();
  CHECK(strcmp(hw_active_target(), names[0]) == 0);

  CHECK_OK(hw_set_max_target(fallback));
  CHECK_ERR(hw_set_max_target("AVX9"), HW_INVALID_ARGUMENT, "AVX9");
  CHECK_ERR(hw_set_max_target(NULL), HW_INVALID_ARGUMENT, "name");
  CHECK(strcmp(hw_active_target(), fallback) == 0); /* cap kept on error */
  hw_reset_max_target();
  CHECK(strcmp(hw_active_target(), names[0]) == 0);

  CHECK_OK(hw_set_max_threads(2));
  CHECK(hw_max_threads() >= 1 && hw_max_threads() <= 2);
  CHECK_OK(hw_set_max_threads(0));
  CHECK(hw_max_threads() >= 1);
  /* A cap, not a request: more threads than the default arena has (one per
   * core) give one per core, as in C++ (threads.h). */
  {
    const int cores = hw_max_threads();
    CHECK_OK(hw_set_max_threads(cores + 5));
    CHECK(hw_max_threads() == cores);
    CHECK_OK(hw_set_max_threads(1));
    CHECK(hw_max_threads() == 1);
    CHECK_ERR(hw_set_max_threads(-3), HW_INVALID_ARGUMENT,
              "hw_set_max_threads: n must be >= 0 (got -3)");
    CHECK(hw_max_threads() == 1); /* cap kept on error */
    CHECK_OK(hw_set_max_threads(0));
    CHECK(hw_max_threads() == cores);
  }
}

/* -------------------------------------------------------------- KV cache */

static int64_t Length(const hw_kv_cache* cache, int64_t seq) {
  int64_t length = -1;
  CHECK_OK(hw_kv_cache_length(cache, seq, &length));
  return length;
}

static void TestKvCache(void) {
  enum { kSeqs = 2, kHeads = 2, kDim = 5, kCap = 4, kCols = kHeads * kDim };
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create(kSeqs, kHeads, kDim, kCap, &cache));
  if (cache == NULL) return;

  int64_t n_sequences = 0, n_kv_heads = 0, head_dim = 0, capacity = 0,
          row_stride = 0;
  CHECK_OK(hw_kv_cache_shape(cache, &n_sequences, &n_kv_heads, &head_dim,
                             &capacity, &row_stride));
  CHECK(n_sequences == kSeqs && n_kv_heads == kHeads && head_dim == kDim &&
        capacity == kCap && row_stride == 16);
  CHECK_OK(hw_kv_cache_shape(cache, NULL, NULL, NULL, NULL, NULL));
  size_t bytes = 0, per_token = 0;
  CHECK_OK(hw_kv_cache_bytes(cache, &bytes));
  CHECK_OK(hw_kv_cache_bytes_per_token(cache, &per_token));
  CHECK(per_token == 2u * kHeads * 16u * sizeof(float));
  CHECK(bytes == per_token * kSeqs * kCap);
  CHECK(Length(cache, 0) == 0 && Length(cache, 1) == 0);

  /* Three tokens, rows 12 floats apart (padded). */
  const int64_t stride = kCols + 2;
  float* k = RandomArray(3 * stride, 1.0f);
  float* v = RandomArray(3 * stride, 1.0f);
  CHECK_OK(hw_kv_cache_append(cache, 0, 3, k, stride, v, stride));
  CHECK(Length(cache, 0) == 3 && Length(cache, 1) == 0);
  for (int64_t g = 0; g < kHeads; ++g) {
    const float *keys = NULL, *values = NULL;
    int64_t rows = 0, kstride = 0, vstride = 0;
    CHECK_OK(hw_kv_cache_keys(cache, 0, g, &keys, &rows, &kstride));
    CHECK(rows == 3 && kstride == 16);
    CHECK_OK(hw_kv_cache_values(cache, 0, g, &values, NULL, &vstride));
    if (keys == NULL || values == NULL) continue;
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < kDim; ++c) {
        CHECK(keys[r * kstride + c] == k[r * stride + g * kDim + c]);
        CHECK(values[r * vstride + c] == v[r * stride + g * kDim + c]);
      }
    }
  }

  /* Past the capacity: an error, the length unchanged. */
  CHECK_ERR(hw_kv_cache_append(cache, 0, 2, k, stride, v, stride),
            HW_OUT_OF_RANGE, "capacity");
  CHECK(Length(cache, 0) == 3);
  /* Dense rows (stride 0), one token. */
  CHECK_OK(hw_kv_cache_append(cache, 0, 1, k, 0, v, 0));
  CHECK(Length(cache, 0) == 4);

  CHECK_OK(hw_kv_cache_truncate(cache, 0, 2));
  CHECK(Length(cache, 0) == 2);
  CHECK_ERR(hw_kv_cache_truncate(cache, 0, 3), HW_OUT_OF_RANGE, "3");
  CHECK_ERR(hw_kv_cache_truncate(cache, 0, -1), HW_OUT_OF_RANGE, "-1");
  CHECK(Length(cache, 0) == 2);

  CHECK_OK(hw_kv_cache_copy_sequence(cache, 0, 1));
  CHECK(Length(cache, 1) == 2);
  {
    const float *a = NULL, *b = NULL;
    int64_t rows = 0;
    CHECK_OK(hw_kv_cache_values(cache, 1, 1, &b, &rows, NULL));
    CHECK_OK(hw_kv_cache_values(cache, 0, 1, &a, NULL, NULL));
    CHECK(rows == 2);
    if (a != NULL && b != NULL) {
      CHECK(memcmp(a, b, 16 * sizeof(float)) == 0 && b[0] == v[kDim]);
    }
  }
  CHECK_ERR(hw_kv_cache_copy_sequence(cache, 0, 2), HW_INVALID_ARGUMENT, "to");

  CHECK_OK(hw_kv_cache_reset(cache, 0));
  CHECK(Length(cache, 0) == 0 && Length(cache, 1) == 2);
  CHECK_OK(hw_kv_cache_reset_all(cache));
  CHECK(Length(cache, 1) == 0);

  /* Bad arguments. */
  int64_t length = 77;
  CHECK_ERR(hw_kv_cache_length(cache, 2, &length), HW_INVALID_ARGUMENT, "seq");
  CHECK_ERR(hw_kv_cache_length(cache, -1, &length), HW_INVALID_ARGUMENT, "seq");
  CHECK(length == 77);
  CHECK_ERR(hw_kv_cache_length(NULL, 0, &length), HW_INVALID_ARGUMENT,
            "cache is null");
  CHECK_ERR(hw_kv_cache_length(cache, 0, NULL), HW_INVALID_ARGUMENT, "length");
  CHECK_ERR(hw_kv_cache_bytes(NULL, &bytes), HW_INVALID_ARGUMENT, "cache");
  CHECK_ERR(hw_kv_cache_append(cache, 0, 1, NULL, 0, v, 0), HW_INVALID_ARGUMENT,
            "k is null");
  CHECK_ERR(hw_kv_cache_append(cache, 0, 1, k, 0, NULL, 0), HW_INVALID_ARGUMENT,
            "v is null");
  CHECK_ERR(hw_kv_cache_append(cache, 0, 0, k, 0, v, 0), HW_INVALID_ARGUMENT,
            "n_new");
  CHECK_ERR(hw_kv_cache_append(cache, 0, 1, k, kCols - 1, v, 0),
            HW_INVALID_ARGUMENT,
            "hw_kv_cache_append: k_stride (9) is shorter than n_kv_heads * "
            "head_dim (10)");
  CHECK_ERR(hw_kv_cache_append(cache, 0, 1, k, 0, v, -1), HW_INVALID_ARGUMENT,
            "hw_kv_cache_append: v_stride (-1) is shorter");
  CHECK_ERR(hw_kv_cache_append(cache, 0, kCap + 1, k, 0, v, 0), HW_OUT_OF_RANGE,
            "hw_kv_cache_append: length (0) + n_new (5) exceeds capacity (4)");
  /* n_new rows at their stride overflow: RESOURCE_EXHAUSTED (checked before
   * the capacity), naming n_new. */
  CHECK_ERR(hw_kv_cache_append(cache, 0, INT64_MAX, k, 0, v, 0),
            HW_RESOURCE_EXHAUSTED, "hw_kv_cache_append: k: n_new (");
  CHECK_ERR(hw_kv_cache_append(cache, 0, 2, k, INT64_MAX / 2, v, 0),
            HW_RESOURCE_EXHAUSTED, "hw_kv_cache_append: k: n_new (2)");
  CHECK_ERR(hw_kv_cache_append(cache, 5, 1, k, 0, v, 0), HW_INVALID_ARGUMENT,
            "seq");
  CHECK_ERR(hw_kv_cache_append(NULL, 0, 1, k, 0, v, 0), HW_INVALID_ARGUMENT,
            "cache");
  {
    const float* data = NULL;
    int64_t rows = 77, kstride = 77;
    CHECK_ERR(hw_kv_cache_keys(cache, 0, 2, &data, &rows, &kstride),
              HW_INVALID_ARGUMENT, "hw_kv_cache_keys: kv_head (2)");
    CHECK_ERR(hw_kv_cache_keys(cache, 0, -1, &data, &rows, &kstride),
              HW_INVALID_ARGUMENT, "kv_head (-1)");
    CHECK_ERR(hw_kv_cache_values(cache, 2, 0, &data, &rows, &kstride),
              HW_INVALID_ARGUMENT, "hw_kv_cache_values: seq (2)");
    CHECK_ERR(hw_kv_cache_values(NULL, 0, 0, &data, &rows, &kstride),
              HW_INVALID_ARGUMENT, "cache is null");
    CHECK_ERR(hw_kv_cache_keys(cache, 0, 0, NULL, &rows, &kstride),
              HW_INVALID_ARGUMENT, "data is null");
    CHECK(data == NULL && rows == 77 && kstride == 77);
  }
  CHECK_ERR(hw_kv_cache_shape(NULL, NULL, NULL, NULL, NULL, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_cache_shape: cache is null");
  CHECK_ERR(hw_kv_cache_bytes(cache, NULL), HW_INVALID_ARGUMENT,
            "bytes is null");
  CHECK_ERR(hw_kv_cache_bytes_per_token(NULL, &bytes), HW_INVALID_ARGUMENT,
            "cache is null");
  CHECK_ERR(hw_kv_cache_bytes_per_token(cache, NULL), HW_INVALID_ARGUMENT,
            "bytes is null");
  CHECK_ERR(hw_kv_cache_truncate(NULL, 0, 0), HW_INVALID_ARGUMENT, "cache");
  CHECK_ERR(hw_kv_cache_truncate(cache, 2, 0), HW_INVALID_ARGUMENT,
            "hw_kv_cache_truncate: seq (2)");
  CHECK_ERR(hw_kv_cache_truncate(cache, 0, 1), HW_OUT_OF_RANGE,
            "hw_kv_cache_truncate: new_length (1)");
  CHECK_ERR(hw_kv_cache_copy_sequence(cache, -1, 0), HW_INVALID_ARGUMENT,
            "hw_kv_cache_copy_sequence: from (-1)");
  CHECK_ERR(hw_kv_cache_copy_sequence(NULL, 0, 1), HW_INVALID_ARGUMENT,
            "cache is null");
  CHECK_ERR(hw_kv_cache_reset(cache, 9), HW_INVALID_ARGUMENT,
            "hw_kv_cache_reset: seq (9)");
  CHECK_ERR(hw_kv_cache_reset(NULL, 0), HW_INVALID_ARGUMENT, "cache is null");
  CHECK_ERR(hw_kv_cache_reset_all(NULL), HW_INVALID_ARGUMENT, "cache");
  CHECK(Length(cache, 0) == 0);

  hw_kv_cache* other = NULL;
  CHECK_ERR(hw_kv_cache_create(1, 1, 0, 4, &other), HW_INVALID_ARGUMENT,
            "hw_kv_cache_create: head_dim must be >= 1 (got 0)");
  CHECK_ERR(hw_kv_cache_create(0, 1, 4, 4, &other), HW_INVALID_ARGUMENT,
            "hw_kv_cache_create: n_sequences must be >= 1");
  CHECK_ERR(hw_kv_cache_create(1, -2, 4, 4, &other), HW_INVALID_ARGUMENT,
            "hw_kv_cache_create: n_kv_heads must be >= 1");
  CHECK_ERR(hw_kv_cache_create(1, 1, 4, 0, &other), HW_INVALID_ARGUMENT,
            "hw_kv_cache_create: capacity must be >= 1");
  CHECK_ERR(hw_kv_cache_create(INT64_MAX / 4, 4, 16, 16, &other),
            HW_RESOURCE_EXHAUSTED, "n_sequences (2305843009213693951)");
  CHECK_ERR(hw_kv_cache_create(1, 1, INT64_MAX, 1, &other),
            HW_RESOURCE_EXHAUSTED, "head_dim (9223372036854775807)");
  CHECK_ERR(hw_kv_cache_create(1, 1, 4, 4, NULL), HW_INVALID_ARGUMENT, "out");
  CHECK(other == NULL);
  hw_kv_cache_destroy(NULL); /* a no-op */

  free(k);
  free(v);
  hw_kv_cache_destroy(cache);
}

/* ------------------------------------------------------------ KV dtypes */

static const int kDtypes[4] = {HW_KV_FLOAT32, HW_KV_BFLOAT16, HW_KV_FLOAT16,
                               HW_KV_INT8};

/* The largest |stored - x| that a dtype's rounding allows for x in a row whose
 * largest |x| is row_max (headway/kv_cache.h's table): half an ulp of x for the
 * floats (at most 2^-8 |x| for bfloat16's 8-bit significand, 2^-11 |x| for
 * float16's 11 bits, or half float16's subnormal step, 2^-25), half a step
 * for int8 (scale / 2 = row_max / 254), plus float32's own rounding of the
 * products. */
static double RoundingBound(int dtype, double x, double row_max) {
  const double f32 = 2.0 * fabs(x) / 16777216.0;
  switch (dtype) {
    case HW_KV_BFLOAT16:
      return fabs(x) / 256.0 + f32;
    case HW_KV_FLOAT16:
      return fabs(x) / 2048.0 + 1.0 / 33554432.0 + f32;
    case HW_KV_INT8:
      return row_max / 254.0 * (1.0 + 1e-6) + f32;
    default:
      return 0.0;
  }
}

/* The rows of one head of a sequence as float32, dense [rows, head_dim]
 * (malloc'ed), read through hw_kv_cache_stored_keys (values) and
 * hw_kv_load_rows. */
static float* LoadedRows(const hw_kv_cache* cache, int keys, int64_t seq,
                         int64_t g, int64_t head_dim, int64_t* rows_out) {
  int dtype = -1;
  size_t size = 0;
  const void* data = NULL;
  const float* scales = NULL;
  int64_t rows = 0, stride = 0;
  CHECK_OK(keys ? hw_kv_cache_stored_keys(cache, seq, g, &dtype, &size, &data,
                                          &rows, &stride, &scales)
                : hw_kv_cache_stored_values(cache, seq, g, &dtype, &size, &data,
                                            &rows, &stride, &scales));
  float* out = FilledArray(rows > 0 ? rows * head_dim : 1, NAN);
  if (rows > 0) {
    CHECK_OK(
        hw_kv_load_rows(dtype, rows, head_dim, data, stride, scales, out, 0));
  }
  *rows_out = rows;
  return out;
}

/* Every dtype: sizes, stored rows (type, element size, stride, alignment,
 * scales) bit for bit what hw_kv_store_rows makes of the appended floats, read
 * back within the rounding bound, and kept through truncate and copy. */
static void TestKvDtypeCache(int dtype) {
  enum { kSeqs = 2, kHeads = 2, kDim = 5, kCap = 6, kCols = kHeads * kDim };
  const size_t size = hw_kv_dtype_size(dtype);
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create_typed(kSeqs, kHeads, kDim, kCap, dtype, &cache));
  if (cache == NULL) return;
  int got_dtype = -1;
  size_t got_size = 0, bytes = 0, per_token = 0;
  CHECK_OK(hw_kv_cache_dtype(cache, &got_dtype, &got_size));
  CHECK(got_dtype == dtype && got_size == size);
  CHECK_OK(hw_kv_cache_dtype(cache, NULL, NULL));
  int64_t row_stride = 0;
  CHECK_OK(hw_kv_cache_shape(cache, NULL, NULL, NULL, NULL, &row_stride));
  CHECK(row_stride == 16);
  CHECK_OK(hw_kv_cache_bytes_per_token(cache, &per_token));
  CHECK(per_token ==
        2u * kHeads * (16u * size + (dtype == HW_KV_INT8 ? 4u : 0u)));
  CHECK_OK(hw_kv_cache_bytes(cache, &bytes));
  CHECK(bytes == per_token * kSeqs * kCap);

  /* Four tokens, rows padded to 13 floats; row 2 of K is all zero (int8:
   * scale 0). */
  const int64_t stride = kCols + 3, n = 4;
  float* k = RandomArray(n * stride, 3.0f);
  float* v = RandomArray(n * stride, 0.75f);
  for (int64_t c = 0; c < kCols; ++c) k[2 * stride + c] = 0.0f;
  CHECK_OK(hw_kv_cache_append(cache, 0, n, k, stride, v, stride));
  CHECK(Length(cache, 0) == n);
  unsigned char* want = (unsigned char*)calloc(16 * n, sizeof(float));
  float want_scales[4];
  for (int keys = 0; keys < 2; ++keys) {
    const float* src = keys ? k : v;
    for (int64_t g = 0; g < kHeads; ++g) {
      int d = -1;
      size_t es = 0;
      const void* data = NULL;
      const float* scales = (const float*)&d; /* overwritten */
      int64_t rows = 0, rs = 0;
      CHECK_OK(keys ? hw_kv_cache_stored_keys(cache, 0, g, &d, &es, &data,
                                              &rows, &rs, &scales)
                    : hw_kv_cache_stored_values(cache, 0, g, &d, &es, &data,
                                                &rows, &rs, &scales));
      CHECK(d == dtype && es == size && rows == n && rs == 16);
      CHECK(data != NULL && (uintptr_t)data % (16 * size) == 0);
      CHECK((scales != NULL) == (dtype == HW_KV_INT8));
      if (data == NULL || want == NULL) continue;
      /* The stored bits are what hw_kv_store_rows makes of the same floats
       * (dst rows 16 elements apart, as in the cache). */
      CHECK_OK(hw_kv_store_rows(dtype, n, kDim, src + g * kDim, stride, want,
                                16, dtype == HW_KV_INT8 ? want_scales : NULL));
      for (int64_t r = 0; r < n; ++r) {
        CHECK(memcmp((const char*)data + (size_t)(r * rs) * size,
                     want + (size_t)(r * 16) * size, kDim * size) == 0);
        if (dtype == HW_KV_INT8 && scales != NULL) {
          CHECK(scales[r] == want_scales[r]);
        }
      }
      if (dtype == HW_KV_INT8 && keys && scales != NULL) {
        CHECK(scales[2] == 0.0f); /* the all-zero row */
      }
      /* Read back within the rounding bound; float32 exactly. */
      int64_t got_rows = 0;
      float* loaded = LoadedRows(cache, keys, 0, g, kDim, &got_rows);
      CHECK(got_rows == n);
      for (int64_t r = 0; r < n; ++r) {
        double row_max = 0.0;
        for (int64_t c = 0; c < kDim; ++c) {
          const double x = fabs(src[r * stride + g * kDim + c]);
          if (x > row_max) row_max = x;
        }
        for (int64_t c = 0; c < kDim; ++c) {
          const double x = src[r * stride + g * kDim + c];
          CHECK(fabs(loaded[r * kDim + c] - x) <=
                RoundingBound(dtype, x, row_max));
        }
      }
      free(loaded);
    }
  }
  /* hw_kv_cache_keys is for float32 caches; others name their type. */
  {
    const float* data = NULL;
    int64_t rows = 77;
    if (dtype == HW_KV_FLOAT32) {
      CHECK_OK(hw_kv_cache_keys(cache, 0, 1, &data, &rows, NULL));
      CHECK(rows == n && data != NULL);
    } else {
      char needle[96];
      snprintf(needle, sizeof(needle),
               "hw_kv_cache_values: cache stores %s, not float32: read it "
               "with hw_kv_cache_stored_values",
               hw_kv_dtype_name(dtype));
      CHECK_ERR(hw_kv_cache_values(cache, 0, 1, &data, &rows, NULL),
                HW_INVALID_ARGUMENT, needle);
      CHECK(data == NULL && rows == 77);
    }
  }

  /* Truncate, copy and reset keep the stored rows and scales. */
  CHECK_OK(hw_kv_cache_truncate(cache, 0, 3));
  CHECK_OK(hw_kv_cache_copy_sequence(cache, 0, 1));
  CHECK(Length(cache, 1) == 3);
  for (int64_t g = 0; g < kHeads; ++g) {
    int64_t r0 = 0, r1 = 0;
    float* a = LoadedRows(cache, 1, 0, g, kDim, &r0);
    float* b = LoadedRows(cache, 1, 1, g, kDim, &r1);
    CHECK(r0 == 3 && r1 == 3 && memcmp(a, b, 3 * kDim * sizeof(float)) == 0);
    free(a);
    free(b);
  }
  /* Appending after a truncate overwrites the dropped row and its scale. */
  CHECK_OK(hw_kv_cache_append(cache, 0, 1, v, stride, k, stride));
  {
    int64_t rows = 0;
    float* loaded = LoadedRows(cache, 1, 0, 0, kDim, &rows);
    CHECK(rows == 4);
    for (int64_t c = 0; c < kDim; ++c) {
      CHECK(fabs(loaded[3 * kDim + c] - v[c]) <=
            RoundingBound(dtype, v[c], 1.0));
    }
    free(loaded);
  }

  /* NaN and inf are stored, not errors (headway/kv_cache.h's table): int8 makes
   * the row NaN, the float types keep them; other rows are untouched. */
  {
    float* bad = RandomArray(kCols, 1.0f);
    bad[1] = NAN;
    bad[kDim + 2] = INFINITY;
    CHECK_OK(hw_kv_cache_append(cache, 0, 1, bad, 0, bad, 0));
    for (int64_t g = 0; g < kHeads; ++g) {
      int64_t rows = 0;
      float* loaded = LoadedRows(cache, 1, 0, g, kDim, &rows);
      CHECK(rows == 5);
      for (int64_t c = 0; c < kDim; ++c) {
        const float x = bad[g * kDim + c], got = loaded[4 * kDim + c];
        if (dtype == HW_KV_INT8) {
          CHECK(isnan(got));
        } else if (isnan(x)) {
          CHECK(isnan(got));
        } else if (isinf(x)) {
          CHECK(got == x);
        } else {
          CHECK(isfinite(got));
        }
        CHECK(isfinite(loaded[3 * kDim + c]));
      }
      free(loaded);
    }
    free(bad);
  }
  free(want);
  free(k);
  free(v);
  hw_kv_cache_destroy(cache);
}

/* Known roundings: to nearest even (not truncation), float16's overflow to
 * inf, int8's scale; and hw_kv_load_rows of them. */
static void TestKvRounding(void) {
  /* Ties and above-ties: 1 + 2^-8 and 1 + 3 * 2^-8 for bfloat16 (ulp 2^-7),
   * 1 + 2^-11 and 1 + 3 * 2^-11 for float16 (ulp 2^-10). */
  const float bf_in[4] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.0f, 0.0f};
  const float bf_want[4] = {1.0f, 1.0f + 1.0f / 64, -2.0f, 0.0f};
  const float f16_in[4] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 70000.0f,
                           -65519.0f};
  const float f16_want[4] = {1.0f, 1.0f + 1.0f / 512, INFINITY, -65504.0f};
  uint16_t halves[4];
  float out[4], scale = -1.0f;
  CHECK_OK(hw_kv_store_rows(HW_KV_BFLOAT16, 1, 4, bf_in, 0, halves, 0, NULL));
  CHECK(halves[0] == 0x3F80 && halves[1] == 0x3F82 && halves[2] == 0xC000);
  CHECK_OK(hw_kv_load_rows(HW_KV_BFLOAT16, 1, 4, halves, 0, NULL, out, 0));
  for (int i = 0; i < 4; ++i) CHECK(out[i] == bf_want[i]);
  CHECK_OK(hw_kv_store_rows(HW_KV_FLOAT16, 1, 4, f16_in, 0, halves, 0, NULL));
  CHECK(halves[0] == 0x3C00 && halves[1] == 0x3C02 && halves[2] == 0x7C00);
  CHECK_OK(hw_kv_load_rows(HW_KV_FLOAT16, 1, 4, halves, 0, NULL, out, 0));
  for (int i = 0; i < 4; ++i) CHECK(out[i] == f16_want[i]);

  /* int8: max |x| 254 gives scale 2; -127 / 2 = -63.5 rounds to even. */
  const float i8_in[4] = {254.0f, -127.0f, 0.0f, 0.5f};
  int8_t q[4];
  CHECK_OK(hw_kv_store_rows(HW_KV_INT8, 1, 4, i8_in, 0, q, 0, &scale));
  CHECK(scale == 2.0f);
  CHECK(q[0] == 127 && q[1] == -64 && q[2] == 0 && q[3] == 0);
  CHECK_OK(hw_kv_load_rows(HW_KV_INT8, 1, 4, q, 0, &scale, out, 0));
  CHECK(out[0] == 254.0f && out[1] == -128.0f && out[3] == 0.0f);

  /* Two rows, strided both ways; float32 is a copy. */
  {
    const float src[2 * 7] = {1, 2, 3, 4, 5, -9, -9, 6, 7, 8, 9, 10, -9, -9};
    float dst[2 * 6], back[2 * 5];
    memset(dst, 0xFF, sizeof(dst));
    CHECK_OK(hw_kv_store_rows(HW_KV_FLOAT32, 2, 5, src, 7, dst, 6, NULL));
    CHECK(dst[0] == 1 && dst[4] == 5 && dst[6] == 6 && dst[10] == 10);
    CHECK(isnan(dst[5])); /* past cols: not written */
    CHECK_OK(hw_kv_load_rows(HW_KV_FLOAT32, 2, 5, dst, 6, NULL, back, 0));
    CHECK(back[5] == 6 && back[9] == 10);
  }
}

static void TestKvDtypeErrors(void) {
  CHECK(hw_kv_dtype_size(HW_KV_FLOAT32) == 4 &&
        hw_kv_dtype_size(HW_KV_BFLOAT16) == 2 &&
        hw_kv_dtype_size(HW_KV_FLOAT16) == 2 &&
        hw_kv_dtype_size(HW_KV_INT8) == 1);
  CHECK(hw_kv_dtype_size(4) == 0 && hw_kv_dtype_size(-1) == 0);
  CHECK(strcmp(hw_kv_dtype_name(HW_KV_FLOAT32), "float32") == 0);
  CHECK(strcmp(hw_kv_dtype_name(HW_KV_BFLOAT16), "bfloat16") == 0);
  CHECK(strcmp(hw_kv_dtype_name(HW_KV_FLOAT16), "float16") == 0);
  CHECK(strcmp(hw_kv_dtype_name(HW_KV_INT8), "int8") == 0);
  CHECK(strcmp(hw_kv_dtype_name(9), "unknown") == 0);

  hw_kv_cache* cache = NULL;
  CHECK_ERR(hw_kv_cache_create_typed(1, 1, 4, 4, 4, &cache),
            HW_INVALID_ARGUMENT, "hw_kv_cache_create_typed: dtype (4)");
  CHECK_ERR(hw_kv_cache_create_typed(1, 1, 4, 4, -1, &cache),
            HW_INVALID_ARGUMENT, "dtype (-1)");
  CHECK_ERR(hw_kv_cache_create_typed(1, 1, 0, 4, HW_KV_INT8, &cache),
            HW_INVALID_ARGUMENT,
            "hw_kv_cache_create_typed: head_dim must be >= 1");
  CHECK_ERR(hw_kv_cache_create_typed(1, 1, 4, 4, HW_KV_INT8, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_cache_create_typed: out is null");
  CHECK_ERR(
      hw_kv_cache_create_typed(INT64_MAX / 4, 4, 16, 16, HW_KV_INT8, &cache),
      HW_RESOURCE_EXHAUSTED, "hw_kv_cache_create_typed");
  CHECK(cache == NULL);
  CHECK_ERR(hw_kv_cache_dtype(NULL, NULL, NULL), HW_INVALID_ARGUMENT,
            "hw_kv_cache_dtype: cache is null");

  CHECK_OK(hw_kv_cache_create_typed(2, 2, 4, 4, HW_KV_INT8, &cache));
  if (cache == NULL) return;
  {
    int dtype = 77;
    size_t es = 77;
    const void* data = NULL;
    int64_t rows = 77, stride = 77;
    const float* scales = NULL;
    CHECK_ERR(hw_kv_cache_stored_keys(cache, 0, 2, &dtype, &es, &data, &rows,
                                      &stride, &scales),
              HW_INVALID_ARGUMENT, "hw_kv_cache_stored_keys: kv_head (2)");
    CHECK_ERR(hw_kv_cache_stored_values(cache, -1, 0, &dtype, &es, &data, &rows,
                                        &stride, &scales),
              HW_INVALID_ARGUMENT, "hw_kv_cache_stored_values: seq (-1)");
    CHECK_ERR(hw_kv_cache_stored_keys(NULL, 0, 0, &dtype, &es, &data, &rows,
                                      &stride, &scales),
              HW_INVALID_ARGUMENT, "hw_kv_cache_stored_keys: cache is null");
    CHECK_ERR(hw_kv_cache_stored_values(cache, 0, 0, &dtype, &es, NULL, &rows,
                                        &stride, &scales),
              HW_INVALID_ARGUMENT, "hw_kv_cache_stored_values: data is null");
    CHECK(dtype == 77 && es == 77 && data == NULL && rows == 77 &&
          stride == 77 && scales == NULL);
    /* Only data is required; an empty sequence has 0 rows. */
    CHECK_OK(hw_kv_cache_stored_keys(cache, 1, 1, NULL, NULL, &data, NULL, NULL,
                                     NULL));
    CHECK(data != NULL);
    CHECK_OK(hw_kv_cache_stored_keys(cache, 1, 1, NULL, NULL, &data, &rows,
                                     NULL, &scales));
    CHECK(rows == 0 && scales != NULL);
  }
  hw_kv_cache_destroy(cache);

  /* hw_kv_store_rows and hw_kv_load_rows: nothing written on an error. */
  float src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8], scales[2] = {-5, -5};
  int8_t q[8];
  memset(q, 0x55, sizeof(q));
  memset(dst, 0xFF, sizeof(dst));
  CHECK_ERR(hw_kv_store_rows(5, 2, 4, src, 0, q, 0, scales),
            HW_INVALID_ARGUMENT,
            "hw_kv_store_rows: dtype (5) is not a hw_kv_dtype");
  CHECK_ERR(hw_kv_load_rows(-2, 2, 4, q, 0, scales, dst, 0),
            HW_INVALID_ARGUMENT, "hw_kv_load_rows: dtype (-2)");
  CHECK_ERR(hw_kv_store_rows(HW_KV_INT8, 2, 4, NULL, 0, q, 0, scales),
            HW_INVALID_ARGUMENT, "hw_kv_store_rows: src is null");
  CHECK_ERR(hw_kv_store_rows(HW_KV_INT8, 2, 4, src, 0, NULL, 0, scales),
            HW_INVALID_ARGUMENT, "hw_kv_store_rows: dst is null");
  CHECK_ERR(hw_kv_store_rows(HW_KV_INT8, 2, 4, src, 0, q, 0, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_store_rows: scales is null");
  CHECK_ERR(hw_kv_load_rows(HW_KV_INT8, 2, 4, q, 0, NULL, dst, 0),
            HW_INVALID_ARGUMENT, "hw_kv_load_rows: scales is null");
  CHECK_ERR(hw_kv_store_rows(HW_KV_BFLOAT16, 0, 4, src, 0, q, 0, NULL),
            HW_INVALID_ARGUMENT,
            "hw_kv_store_rows: rows and cols must be >= 1 (got rows = 0, "
            "cols = 4)");
  CHECK_ERR(hw_kv_store_rows(HW_KV_BFLOAT16, 2, -1, src, 0, q, 0, NULL),
            HW_INVALID_ARGUMENT, "cols = -1)");
  CHECK_ERR(hw_kv_store_rows(HW_KV_FLOAT16, 2, 4, src, 3, q, 0, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_store_rows: src_stride (3)");
  CHECK_ERR(hw_kv_store_rows(HW_KV_INT8, 2, 4, src, 0, q, 2, scales),
            HW_INVALID_ARGUMENT, "hw_kv_store_rows: dst_stride (2)");
  CHECK_ERR(hw_kv_load_rows(HW_KV_FLOAT16, 2, 4, q, 0, NULL, dst, 1),
            HW_INVALID_ARGUMENT, "hw_kv_load_rows: dst_stride (1)");
  CHECK_ERR(hw_kv_load_rows(HW_KV_FLOAT16, 2, 4, q, 3, NULL, dst, 0),
            HW_INVALID_ARGUMENT, "hw_kv_load_rows: src_stride (3)");
  CHECK_ERR(hw_kv_store_rows(HW_KV_INT8, INT64_MAX, 4, src, 0, q, 0, scales),
            HW_RESOURCE_EXHAUSTED, "hw_kv_store_rows");
  for (int i = 0; i < 8; ++i) CHECK(q[i] == 0x55 && isnan(dst[i]));
  CHECK(scales[0] == -5 && scales[1] == -5);
}

/* A ring cache of every dtype (capacity 5, 1 sink, a ring of 4) appended
 * across several wraps: after each append every held position p reads back,
 * in row hw_kv_cache_slot(p), exactly what a plain cache of the same dtype
 * holds in row p; ring_begin, truncate, copy, reset and the errors. */
static void TestKvRingCache(int dtype) {
  enum { kSeqs = 2, kHeads = 2, kDim = 5, kCap = 5, kSinks = 1 };
  enum { kRing = kCap - kSinks, kCols = kHeads * kDim, kTotal = 40 };
  hw_kv_cache *ring = NULL, *plain = NULL, *same_size = NULL;
  CHECK_OK(
      hw_kv_cache_create_ring(kSeqs, kHeads, kDim, kCap, kSinks, dtype, &ring));
  CHECK_OK(hw_kv_cache_create_typed(1, kHeads, kDim, kTotal, dtype, &plain));
  CHECK_OK(
      hw_kv_cache_create_typed(kSeqs, kHeads, kDim, kCap, dtype, &same_size));
  if (ring == NULL || plain == NULL || same_size == NULL) return;
  size_t ring_bytes = 0, plain_bytes = 0;
  CHECK_OK(hw_kv_cache_bytes(ring, &ring_bytes));
  CHECK_OK(hw_kv_cache_bytes(same_size, &plain_bytes));
  CHECK(ring_bytes == plain_bytes);
  int is_ring = -1;
  int64_t ring_begin = -1, sinks = -1;
  CHECK_OK(hw_kv_cache_ring_state(ring, 1, &ring_begin, &sinks, &is_ring));
  CHECK(is_ring == 1 && sinks == kSinks && ring_begin == kSinks);
  CHECK_OK(hw_kv_cache_ring_state(ring, 0, NULL, NULL, NULL));
  CHECK_OK(hw_kv_cache_ring_state(same_size, 1, &ring_begin, &sinks, &is_ring));
  CHECK(is_ring == 0 && sinks == 0 && ring_begin == 0);

  static const int64_t kChunks[4] = {3, 6, 1, 9};
  int64_t length = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t n = kChunks[i];
    float* k = RandomArray(n * kCols, 1.0f);
    float* v = RandomArray(n * kCols, 1.0f);
    CHECK_OK(hw_kv_cache_append(ring, 1, n, k, 0, v, 0));
    CHECK_OK(hw_kv_cache_append(plain, 0, n, k, 0, v, 0));
    free(k);
    free(v);
    length += n;
    const int64_t want_begin =
        length - kRing > kSinks ? length - kRing : kSinks;
    CHECK(Length(ring, 1) == length && Length(ring, 0) == 0);
    CHECK_OK(hw_kv_cache_ring_state(ring, 1, &ring_begin, NULL, NULL));
    CHECK(ring_begin == want_begin);
    for (int64_t g = 0; g < kHeads; ++g) {
      for (int keys = 0; keys < 2; ++keys) {
        int64_t ring_rows = 0, plain_rows = 0;
        float* got = LoadedRows(ring, keys, 1, g, kDim, &ring_rows);
        float* want = LoadedRows(plain, keys, 0, g, kDim, &plain_rows);
        CHECK(ring_rows == (length < kCap ? length : kCap));
        CHECK(plain_rows == length);
        for (int64_t p = 0; p < length; ++p) {
          if (p >= kSinks && p < ring_begin) continue; /* dropped */
          int64_t slot = -1;
          CHECK_OK(hw_kv_cache_slot(ring, p, &slot));
          CHECK(slot == (p < kSinks ? p : kSinks + (p - kSinks) % kRing));
          if (slot < 0 || slot >= ring_rows) continue;
          CHECK(memcmp(got + slot * kDim, want + p * kDim,
                       kDim * sizeof(float)) == 0);
        }
        free(got);
        free(want);
      }
    }
  }
  /* length 19, ring_begin 15: truncate no earlier than ring_begin. */
  CHECK_ERR(hw_kv_cache_truncate(ring, 1, 14), HW_OUT_OF_RANGE,
            "hw_kv_cache_truncate: new_length (14) is before ring_begin (15) "
            "of seq 1: rows before it were overwritten");
  CHECK_ERR(hw_kv_cache_truncate(ring, 1, 0), HW_OUT_OF_RANGE, "ring_begin");
  CHECK(Length(ring, 1) == 19);
  CHECK_OK(hw_kv_cache_truncate(ring, 1, 15));
  CHECK(Length(ring, 1) == 15);
  CHECK_OK(hw_kv_cache_ring_state(ring, 1, &ring_begin, NULL, NULL));
  CHECK(ring_begin == 15);
  /* Any n_new fits a ring; only the positions past 2^62 do not. */
  {
    float* k = RandomArray(12 * kCols, 1.0f);
    CHECK_OK(hw_kv_cache_append(ring, 1, 12, k, 0, k, 0));
    CHECK(Length(ring, 1) == 27);
    CHECK_ERR(hw_kv_cache_append(ring, 1, INT64_MAX, k, 0, k, 0),
              HW_RESOURCE_EXHAUSTED, "hw_kv_cache_append: k: n_new (");
    free(k);
  }
  CHECK_OK(hw_kv_cache_copy_sequence(ring, 1, 0));
  CHECK(Length(ring, 0) == 27);
  CHECK_OK(hw_kv_cache_ring_state(ring, 0, &ring_begin, NULL, NULL));
  CHECK(ring_begin == 23);
  CHECK_OK(hw_kv_cache_reset(ring, 0));
  CHECK_OK(hw_kv_cache_ring_state(ring, 0, &ring_begin, NULL, NULL));
  CHECK(ring_begin == kSinks && Length(ring, 0) == 0);
  CHECK_OK(hw_kv_cache_reset_all(ring));
  CHECK_OK(hw_kv_cache_ring_state(ring, 1, &ring_begin, NULL, NULL));
  CHECK(ring_begin == kSinks && Length(ring, 1) == 0);

  /* Errors. */
  int64_t slot = 77;
  CHECK_ERR(hw_kv_cache_slot(ring, -1, &slot), HW_INVALID_ARGUMENT,
            "hw_kv_cache_slot: position must be >= 0 (got -1)");
  CHECK_ERR(hw_kv_cache_slot(NULL, 0, &slot), HW_INVALID_ARGUMENT,
            "hw_kv_cache_slot: cache is null");
  CHECK_ERR(hw_kv_cache_slot(ring, 0, NULL), HW_INVALID_ARGUMENT,
            "hw_kv_cache_slot: slot is null");
  CHECK(slot == 77);
  CHECK_OK(hw_kv_cache_slot(same_size, 7, &slot));
  CHECK(slot == 7);
  ring_begin = 77;
  CHECK_ERR(hw_kv_cache_ring_state(ring, 2, &ring_begin, NULL, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_cache_ring_state: seq (2)");
  CHECK_ERR(hw_kv_cache_ring_state(NULL, 0, &ring_begin, NULL, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_cache_ring_state: cache is null");
  CHECK(ring_begin == 77);
  hw_kv_cache* other = NULL;
  CHECK_ERR(hw_kv_cache_create_ring(1, 1, 4, 5, 5, dtype, &other),
            HW_INVALID_ARGUMENT,
            "hw_kv_cache_create_ring: n_sink_tokens (5) must be less than "
            "capacity (5) in ring mode");
  CHECK_ERR(hw_kv_cache_create_ring(1, 1, 4, 5, -1, dtype, &other),
            HW_INVALID_ARGUMENT,
            "hw_kv_cache_create_ring: n_sink_tokens must be >= 0 (got -1)");
  CHECK_ERR(hw_kv_cache_create_ring(1, 1, 4, 0, 0, dtype, &other),
            HW_INVALID_ARGUMENT,
            "hw_kv_cache_create_ring: capacity must be >= 1 (got 0)");
  CHECK_ERR(hw_kv_cache_create_ring(1, 1, 4, 5, 0, 9, &other),
            HW_INVALID_ARGUMENT,
            "hw_kv_cache_create_ring: dtype (9) is not a known hw_kv_dtype");
  CHECK_ERR(hw_kv_cache_create_ring(1, 1, 4, 5, 0, dtype, NULL),
            HW_INVALID_ARGUMENT, "hw_kv_cache_create_ring: out is null");
  CHECK(other == NULL);
  /* No sinks: the whole capacity is the ring. */
  CHECK_OK(hw_kv_cache_create_ring(1, 1, 4, 3, 0, dtype, &other));
  CHECK_OK(hw_kv_cache_slot(other, 7, &slot));
  CHECK(slot == 1);
  hw_kv_cache_destroy(other);

  hw_kv_cache_destroy(ring);
  hw_kv_cache_destroy(plain);
  hw_kv_cache_destroy(same_size);
}

static void TestKvDtypes(void) {
  TestKvRounding();
  for (int i = 0; i < 4; ++i) TestKvDtypeCache(kDtypes[i]);
  TestKvDtypeErrors();
  for (int i = 0; i < 4; ++i) TestKvRingCache(kDtypes[i]);
}

/* ---------------------------------------------------------- RoPE, RMSNorm */

/* hw_rope_config with the zeros that mean a default replaced by the defaults
 * headway.h documents: this file's own statement of them. */
static hw_rope_config ResolvedRope(hw_rope_config rope) {
  if (rope.theta == 0.0) rope.theta = 10000.0;
  if (rope.factor == 0.0) rope.factor = 1.0;
  if (rope.low_freq_factor == 0.0) rope.low_freq_factor = 1.0;
  if (rope.high_freq_factor == 0.0) rope.high_freq_factor = 4.0;
  if (rope.original_max_position == 0) rope.original_max_position = 8192;
  return rope;
}

/* freq_i of a resolved config in float64: theta^(-2 i / rotary_dim), then
 * scaled as Hugging Face's _compute_default_rope_parameters,
 * _compute_linear_scaling_rope_parameters and _compute_llama3_parameters do
 * it. */
static double RopeFreq(const hw_rope_config* rope, int64_t i) {
  const double inv_freq =
      pow(rope->theta, -2.0 * (double)i / (double)rope->rotary_dim);
  if (rope->scaling == HW_ROPE_SCALING_LINEAR) return inv_freq / rope->factor;
  if (rope->scaling != HW_ROPE_SCALING_LLAMA3) return inv_freq;
  const double old_len = (double)rope->original_max_position;
  const double low_freq_wavelen = old_len / rope->low_freq_factor;
  const double high_freq_wavelen = old_len / rope->high_freq_factor;
  const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
  if (wavelen > low_freq_wavelen) return inv_freq / rope->factor;
  if (wavelen < high_freq_wavelen) return inv_freq;
  const double smooth = (old_len / wavelen - rope->low_freq_factor) /
                        (rope->high_freq_factor - rope->low_freq_factor);
  return (1.0 - smooth) * inv_freq / rope->factor + smooth * inv_freq;
}

/* The two elements of a head that pair i rotates. */
static void RopePair(const hw_rope_config* rope, int64_t i, int64_t* a,
                     int64_t* b) {
  if (rope->layout == HW_ROPE_INTERLEAVED) {
    *a = 2 * i;
    *b = 2 * i + 1;
  } else {
    *a = i;
    *b = i + rope->rotary_dim / 2;
  }
}

/* RoPE of one head [head_dim] at position pos in float64, for a resolved
 * config. */
static void ReferenceRope(const hw_rope_config* rope, int64_t pos,
                          double* head) {
  for (int64_t i = 0; i < rope->rotary_dim / 2; ++i) {
    const double angle = (double)pos * RopeFreq(rope, i);
    const double c = cos(angle), s = sin(angle);
    int64_t a = 0, b = 0;
    RopePair(rope, i, &a, &b);
    const double xa = head[a], xb = head[b];
    head[a] = xa * c - xb * s;
    head[b] = xb * c + xa * s;
  }
}

/* RMSNorm of one head [head_dim] in float64. */
static void ReferenceRmsNorm(int64_t head_dim, const float* weight, double eps,
                             double* head) {
  double sum = 0.0;
  for (int64_t i = 0; i < head_dim; ++i) sum += head[i] * head[i];
  const double inv = 1.0 / sqrt(sum / (double)head_dim + eps);
  for (int64_t i = 0; i < head_dim; ++i) head[i] *= inv * weight[i];
}

/* One hw_apply_rope case: rows at `positions`, n_heads heads, row stride
 * `stride` (0: dense), against ReferenceRope. Per element, with (a, b) the
 * input pair, |got - want| <= 4 u (|a| + |b|), u = 2^-24 (headway.h's bound),
 * plus 1e-9 (|a| + |b|) for the reference's own float64 angle, which differs
 * from the library's by up to pos * freq * 2^-52 radians (2e-10 at position
 * 10^6). Columns past rotary_dim and the padding keep their bits. */
static void TestRopeCase(hw_rope_config rope, int64_t head_dim, int64_t n_heads,
                         const int64_t* positions, int64_t rows,
                         int64_t stride) {
  const int64_t cols = n_heads * head_dim;
  const int64_t s = stride == 0 ? cols : stride;
  const hw_rope_config resolved = ResolvedRope(rope);
  float* x = RandomArray(rows * s, 4.0f);
  float* in = RandomArray(rows * s, 0.0f);
  double* head = (double*)malloc((size_t)head_dim * sizeof(double));
  if (head == NULL) exit(2);
  memcpy(in, x, (size_t)(rows * s) * sizeof(float));
  CHECK_OK(hw_apply_rope(&rope, head_dim, positions, x, rows, cols, stride));
  int bad = 0;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* a_in = in + t * s + h * head_dim;
      const float* got = x + t * s + h * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) head[c] = a_in[c];
      ReferenceRope(&resolved, positions[t], head);
      for (int64_t i = 0; i < resolved.rotary_dim / 2; ++i) {
        int64_t a = 0, b = 0;
        RopePair(&resolved, i, &a, &b);
        const double norm1 = fabs(a_in[a]) + fabs(a_in[b]);
        const double bound = (4.0 / 16777216.0 + 1e-9) * norm1 + 1e-30;
        if (!(fabs(got[a] - head[a]) <= bound) ||
            !(fabs(got[b] - head[b]) <= bound)) {
          if (bad++ < 4) {
            fprintf(stderr,
                    "  rope row %d head %d pair %d (pos %lld): got %.9g %.9g "
                    "want %.9g %.9g\n",
                    (int)t, (int)h, (int)i, (long long)positions[t], got[a],
                    got[b], head[a], head[b]);
          }
        }
      }
      /* Past rotary_dim: the same bits. */
      const int64_t rd = resolved.rotary_dim;
      if (memcmp(got + rd, a_in + rd,
                 (size_t)(head_dim - rd) * sizeof(float))) {
        ++bad;
      }
    }
    if (s > cols && memcmp(x + t * s + cols, in + t * s + cols,
                           (size_t)(s - cols) * sizeof(float)) != 0) {
      ++bad; /* padding written */
    }
  }
  CHECK(bad == 0);
  free(x);
  free(in);
  free(head);
}

static hw_rope_config RopeConfig(int64_t rotary_dim, int32_t layout,
                                 int32_t scaling) {
  hw_rope_config rope;
  memset(&rope, 0, sizeof(rope));
  rope.rotary_dim = rotary_dim;
  rope.layout = layout;
  rope.scaling = scaling;
  return rope;
}

static void TestRope(void) {
  /* Small positions, around float32's 2^24 and past a million. */
  static const int64_t kPositions[9] = {0,     1,       2,       17,      4096,
                                        65537, 1000000, 1234567, 16777217};
  /* Defaults: theta 10000, halves, full rotary_dim; padded rows. */
  TestRopeCase(RopeConfig(64, HW_ROPE_HALVES, HW_ROPE_SCALING_NONE), 64, 3,
               kPositions, 9, 3 * 64 + 5);
  /* Interleaved, partial rotary_dim (and a head_dim not a multiple of 16). */
  TestRopeCase(RopeConfig(16, HW_ROPE_INTERLEAVED, HW_ROPE_SCALING_NONE), 24, 2,
               kPositions, 9, 0);
  {
    /* Partial halves of head_dim 80 with linear scaling and theta 500000. */
    hw_rope_config rope =
        RopeConfig(40, HW_ROPE_HALVES, HW_ROPE_SCALING_LINEAR);
    rope.theta = 500000.0;
    rope.factor = 4.0;
    TestRopeCase(rope, 80, 2, kPositions, 9, 2 * 80 + 1);
  }
  {
    /* Llama 3.1's: theta 500000, factor 8, the other fields default (low 1,
     * high 4, original 8192): wavelengths from 6.3 to 2.4e6 cover the three
     * bands. */
    hw_rope_config rope =
        RopeConfig(128, HW_ROPE_HALVES, HW_ROPE_SCALING_LLAMA3);
    rope.theta = 500000.0;
    rope.factor = 8.0;
    TestRopeCase(rope, 128, 2, kPositions, 9, 0);
  }
  {
    /* Llama 3 scaling, every field given, interleaved and partial:
     * wavelengths 6.3, 19.9, 62.8, 199, ... against bands at 64 / 4 = 16 and
     * 64 / 1 = 64: kept, blended (two), divided. */
    hw_rope_config rope =
        RopeConfig(16, HW_ROPE_INTERLEAVED, HW_ROPE_SCALING_LLAMA3);
    rope.theta = 10000.0;
    rope.factor = 3.0;
    rope.low_freq_factor = 1.0;
    rope.high_freq_factor = 4.0;
    rope.original_max_position = 64;
    TestRopeCase(rope, 24, 3, kPositions, 9, 3 * 24 + 2);
  }
  /* rotary_dim 2 of head_dim 2, one row. */
  TestRopeCase(RopeConfig(2, HW_ROPE_HALVES, HW_ROPE_SCALING_NONE), 2, 1,
               kPositions + 6, 1, 0);
}

/* hw_rms_norm_heads against float64: |got - want| <= 2^-23 |want| (the
 * documented 2^-24 (1 + 2^-20) with room). Rows scaled to 1e30 and 1e-30
 * need the float64 sums. */
static void TestRmsNormHeads(void) {
  static const int64_t kHeadDims[3] = {3, 20, 128};
  static const float kEps[2] = {1e-6f, 0.0f};
  enum { kRows = 5, kHeads = 3 };
  for (int d = 0; d < 3; ++d) {
    for (int e = 0; e < 2; ++e) {
      const int64_t hd = kHeadDims[d], cols = kHeads * hd;
      /* Padded rows but for head_dim 20's (dense, stride 0). */
      const int64_t s = d == 1 ? cols : cols + 3;
      const int64_t stride = d == 1 ? 0 : s;
      float* x = RandomArray(kRows * s, 4.0f);
      float* weight = RandomArray(hd, 1.0f);
      for (int64_t i = 0; i < hd; ++i) weight[i] += 1.0f;
      for (int64_t c = 0; c < cols; ++c) {
        x[3 * s + c] *= 1e30f;
        x[4 * s + c] *= 1e-30f;
      }
      float* in = RandomArray(kRows * s, 0.0f);
      memcpy(in, x, (size_t)(kRows * s) * sizeof(float));
      double head[128];
      CHECK_OK(hw_rms_norm_heads(x, kRows, cols, stride, hd, weight, kEps[e]));
      int bad = 0;
      for (int64_t t = 0; t < kRows; ++t) {
        for (int64_t h = 0; h < kHeads; ++h) {
          const int64_t at = t * s + h * hd;
          for (int64_t i = 0; i < hd; ++i) head[i] = in[at + i];
          ReferenceRmsNorm(hd, weight, kEps[e], head);
          for (int64_t i = 0; i < hd; ++i) {
            if (!(fabs(x[at + i] - head[i]) <= fabs(head[i]) / 8388608.0)) {
              if (bad++ < 4) {
                fprintf(stderr,
                        "  rms_norm head_dim %d row %d head %d [%d]: got "
                        "%.9g want %.9g\n",
                        (int)hd, (int)t, (int)h, (int)i, x[at + i], head[i]);
              }
            }
          }
        }
        if (s > cols) bad += x[t * s + cols] != in[t * s + cols];
      }
      CHECK(bad == 0);
      free(x);
      free(in);
      free(weight);
    }
  }
}

static void TestRopeAndNormErrors(void) {
  enum { kHd = 8, kCols = 2 * kHd, kRows = 3 };
  float* x = RandomArray(kRows * kCols, 1.0f);
  float* copy = RandomArray(kRows * kCols, 0.0f);
  memcpy(copy, x, sizeof(float) * kRows * kCols);
  int64_t pos[kRows] = {0, 5, 9};
  const hw_rope_config good =
      RopeConfig(kHd, HW_ROPE_HALVES, HW_ROPE_SCALING_NONE);
  hw_rope_config bad = good;

  CHECK_ERR(hw_apply_rope(NULL, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "hw_apply_rope: rope is null");
  CHECK_ERR(hw_apply_rope(&good, kHd, NULL, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "hw_apply_rope: positions is null");
  CHECK_ERR(hw_apply_rope(&good, kHd, pos, NULL, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "hw_apply_rope: x is null");
  bad.rotary_dim = 5;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "hw_apply_rope: rope.rotary_dim (5)");
  bad.rotary_dim = kHd + 2;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.rotary_dim (10)");
  bad.rotary_dim = 0; /* "none" only in a layer's variants */
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.rotary_dim (0)");
  bad = good;
  bad.layout = 2;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT,
            "hw_apply_rope: rope.layout (2) is not a hw_rope_layout");
  bad = good;
  bad.scaling = 3;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.scaling (3) is not a hw_rope_scaling");
  bad = good;
  bad.theta = -1.0;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.theta");
  bad = good;
  bad.scaling = HW_ROPE_SCALING_LINEAR;
  bad.factor = NAN;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.factor");
  /* low_freq_factor 5 against the default high_freq_factor 4. */
  bad = good;
  bad.scaling = HW_ROPE_SCALING_LLAMA3;
  bad.low_freq_factor = 5.0;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.high_freq_factor (4");
  bad.low_freq_factor = 0.0;
  bad.original_max_position = -1;
  CHECK_ERR(hw_apply_rope(&bad, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT, "rope.original_max_position (-1)");
  pos[2] = -1;
  CHECK_ERR(hw_apply_rope(&good, kHd, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT,
            "hw_apply_rope: positions[2] (-1) is negative");
  pos[2] = 9;
  CHECK_ERR(hw_apply_rope(&good, 0, pos, x, kRows, kCols, 0),
            HW_INVALID_ARGUMENT,
            "hw_apply_rope: head_dim must be >= 1 (got 0)");
  CHECK_ERR(hw_apply_rope(&good, kHd, pos, x, kRows, kCols - 2, 0),
            HW_INVALID_ARGUMENT,
            "hw_apply_rope: cols (14) is not a multiple of head_dim (8)");
  CHECK_ERR(hw_apply_rope(&good, kHd, pos, x, kRows, kCols, kCols - 1),
            HW_INVALID_ARGUMENT,
            "hw_apply_rope: stride (15) is shorter than cols (16)");
  CHECK_ERR(hw_apply_rope(&good, kHd, pos, x, 0, kCols, 0), HW_INVALID_ARGUMENT,
            "hw_apply_rope: rows must be >= 1 (got 0)");
  CHECK_ERR(hw_apply_rope(&good, kHd, pos, x, INT64_MAX / 4, kCols, 0),
            HW_RESOURCE_EXHAUSTED, "hw_apply_rope: x: rows");

  float weight[kHd];
  for (int i = 0; i < kHd; ++i) weight[i] = 1.0f + 0.1f * (float)i;
  CHECK_ERR(hw_rms_norm_heads(NULL, kRows, kCols, 0, kHd, weight, 1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: x is null");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, kHd, NULL, 1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: weight is null");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, kHd, weight, -1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: eps (");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, kHd, weight, NAN),
            HW_INVALID_ARGUMENT, "eps");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, 0, weight, 1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: head_dim must be >= 1");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, 5, weight, 1e-6f),
            HW_INVALID_ARGUMENT,
            "hw_rms_norm_heads: cols (16) is not a multiple of head_dim (5)");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 3, kHd, weight, 1e-6f),
            HW_INVALID_ARGUMENT,
            "hw_rms_norm_heads: stride (3) is shorter than cols (16)");
  CHECK_ERR(hw_rms_norm_heads(x, -1, kCols, 0, kHd, weight, 1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: rows must be >= 1");
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, kHd, x + 4, 1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: x overlaps weight");
  weight[2] = INFINITY;
  CHECK_ERR(hw_rms_norm_heads(x, kRows, kCols, 0, kHd, weight, 1e-6f),
            HW_INVALID_ARGUMENT, "hw_rms_norm_heads: weight[2]");
  /* Nothing written by any of the failed calls. */
  CHECK(memcmp(copy, x, sizeof(float) * kRows * kCols) == 0);
  free(x);
  free(copy);
}

/* ------------------------------------------------------- Attention layer */

typedef struct Model {
  int64_t d_model, n_heads, n_kv_heads, head_dim;
  int32_t mask;
  int has_bias;
  /* Dense weights: wq [d, H*hd], wk and wv [d, G*hd], wo [H*hd, d]. */
  float *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo;
} Model;

static Model MakeModel(int64_t d_model, int64_t n_heads, int64_t n_kv_heads,
                       int64_t head_dim, int32_t mask, int has_bias) {
  Model m;
  m.d_model = d_model;
  m.n_heads = n_heads;
  m.n_kv_heads = n_kv_heads;
  m.head_dim = head_dim;
  m.mask = mask;
  m.has_bias = has_bias;
  const int64_t q_cols = n_heads * head_dim, kv_cols = n_kv_heads * head_dim;
  /* Scaled by 1 / sqrt(fan-in) so that outputs stay of order 1. Larger
   * Q and K weights make the attention pattern less uniform. */
  const float in_scale = 4.0f / sqrtf((float)d_model);
  const float out_scale = 2.0f / sqrtf((float)q_cols);
  m.wq = RandomArray(d_model * q_cols, in_scale);
  m.wk = RandomArray(d_model * kv_cols, in_scale);
  m.wv = RandomArray(d_model * kv_cols, in_scale);
  m.wo = RandomArray(q_cols * d_model, out_scale);
  m.bq = has_bias ? RandomArray(q_cols, 0.5f) : NULL;
  m.bk = has_bias ? RandomArray(kv_cols, 0.5f) : NULL;
  m.bv = has_bias ? RandomArray(kv_cols, 0.5f) : NULL;
  m.bo = has_bias ? RandomArray(d_model, 0.5f) : NULL;
  return m;
}

static void FreeModel(Model* m) {
  free(m->wq);
  free(m->wk);
  free(m->wv);
  free(m->wo);
  free(m->bq);
  free(m->bk);
  free(m->bv);
  free(m->bo);
}

static hw_attention_layer_config Config(const Model* m) {
  hw_attention_layer_config config;
  memset(&config, 0, sizeof(config));
  config.d_model = m->d_model;
  config.n_heads = m->n_heads;
  /* Leave the defaults (zeros) where they give the model's shape. */
  config.n_kv_heads = m->n_kv_heads == m->n_heads ? 0 : m->n_kv_heads;
  config.head_dim = m->head_dim * m->n_heads == m->d_model ? 0 : m->head_dim;
  config.mask = m->mask;
  return config;
}

static hw_matrix Matrix(const float* data, int64_t rows, int64_t cols) {
  hw_matrix matrix;
  matrix.data = data;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.stride = 0; /* dense */
  return matrix;
}

static hw_attention_layer_weights Weights(const Model* m) {
  hw_attention_layer_weights w;
  const int64_t q_cols = m->n_heads * m->head_dim;
  const int64_t kv_cols = m->n_kv_heads * m->head_dim;
  w.w_q = Matrix(m->wq, m->d_model, q_cols);
  w.w_k = Matrix(m->wk, m->d_model, kv_cols);
  w.w_v = Matrix(m->wv, m->d_model, kv_cols);
  w.w_o = Matrix(m->wo, q_cols, m->d_model);
  w.b_q = m->bq;
  w.b_k = m->bk;
  w.b_v = m->bv;
  w.b_o = m->bo;
  return w;
}

/* Whether the query at position pos sees the key at position s before the
 * additive mask (headway.h's hw_attention_variants): s <= pos if causal, and
 * with a window s > pos - window or s < n_sinks (sink tokens). */
static int Visible(int64_t s, int64_t pos, int causal, int64_t window,
                   int64_t n_sinks) {
  return (!causal || s <= pos) &&
         (window == 0 || s > pos - window || s < n_sinks);
}

/* The score of query head h at position pos for the key at position s, from
 * scale * q . k = scaled: soft-capped, then plus the ALiBi bias (headway.h's
 * order; the additive mask comes after). */
static double VariantScore(double scaled, int64_t h, int64_t s, int64_t pos,
                           double softcap, const float* slopes) {
  double z = scaled;
  if (softcap != 0.0) z = softcap * tanh(z / softcap);
  if (slopes != NULL) z += slopes[h] * (double)(s - pos);
  return z;
}

/* y = layer(x) in float64 for one sequence of n tokens from an empty cache:
 * x [n, d] dense, y [n, d] dense. variants (resolved: ResolvedVariants, or
 * NULL for none): after the bias, RMSNorm of every Q and K head, then RoPE at
 * the token's position t; the attention variants as ReferenceAttention
 * applies them (alibi_slopes and sink_logits of the whole model's heads). */
static void ReferenceLayer(const Model* m, int64_t n, const float* x,
                           const hw_attention_layer_variants* variants,
                           double* y) {
  const int64_t d = m->d_model, hd = m->head_dim;
  const int64_t q_cols = m->n_heads * hd, kv_cols = m->n_kv_heads * hd;
  const int64_t group = m->n_heads / m->n_kv_heads;
  double* q = (double*)calloc((size_t)(n * q_cols), sizeof(double));
  double* k = (double*)calloc((size_t)(n * kv_cols), sizeof(double));
  double* v = (double*)calloc((size_t)(n * kv_cols), sizeof(double));
  double* o = (double*)calloc((size_t)(n * q_cols), sizeof(double));
  double* p = (double*)calloc((size_t)n, sizeof(double));
  if (!q || !k || !v || !o || !p) exit(2);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < q_cols; ++c) {
      double s = m->bq ? m->bq[c] : 0.0;
      for (int64_t i = 0; i < d; ++i)
        s += (double)x[t * d + i] * m->wq[i * q_cols + c];
      q[t * q_cols + c] = s;
    }
    for (int64_t c = 0; c < kv_cols; ++c) {
      double sk = m->bk ? m->bk[c] : 0.0, sv = m->bv ? m->bv[c] : 0.0;
      for (int64_t i = 0; i < d; ++i) {
        sk += (double)x[t * d + i] * m->wk[i * kv_cols + c];
        sv += (double)x[t * d + i] * m->wv[i * kv_cols + c];
      }
      k[t * kv_cols + c] = sk;
      v[t * kv_cols + c] = sv;
    }
    if (variants == NULL) continue;
    /* Q heads, then K heads: (heads, first head, norm weight). */
    for (int which = 0; which < 2; ++which) {
      const int64_t heads = which == 0 ? m->n_heads : m->n_kv_heads;
      double* first = which == 0 ? q + t * q_cols : k + t * kv_cols;
      const float* weight = which == 0 ? variants->q_norm : variants->k_norm;
      for (int64_t h = 0; h < heads; ++h) {
        if (variants->qk_norm) {
          ReferenceRmsNorm(hd, weight, variants->qk_norm_eps, first + h * hd);
        }
        if (variants->rope.rotary_dim != 0) {
          ReferenceRope(&variants->rope, t, first + h * hd);
        }
      }
    }
  }
  const double scale = 1.0 / sqrt((double)hd);
  const int causal = m->mask == HW_MASK_CAUSAL;
  const int64_t window = variants != NULL ? variants->window : 0;
  const int64_t n_sinks = variants != NULL ? variants->n_sink_tokens : 0;
  const double softcap = variants != NULL ? variants->softcap : 0.0;
  const float* slopes = variants != NULL ? variants->alibi_slopes : NULL;
  const float* sinks = variants != NULL ? variants->sink_logits : NULL;
  for (int64_t h = 0; h < m->n_heads; ++h) {
    const int64_t g = h / group;
    for (int64_t t = 0; t < n; ++t) {
      /* Every row sees at least its own token: max is finite. */
      double max = sinks != NULL ? sinks[h] : -INFINITY, sum = 0.0;
      for (int64_t s = 0; s < n; ++s) {
        p[s] = -INFINITY;
        if (!Visible(s, t, causal, window, n_sinks)) continue;
        double dot = 0.0;
        for (int64_t c = 0; c < hd; ++c) {
          dot += q[t * q_cols + h * hd + c] * k[s * kv_cols + g * hd + c];
        }
        p[s] = VariantScore(scale * dot, h, s, t, softcap, slopes);
        if (p[s] > max) max = p[s];
      }
      for (int64_t s = 0; s < n; ++s) {
        p[s] = exp(p[s] - max);
        sum += p[s];
      }
      if (sinks != NULL) sum += exp(sinks[h] - max);
      for (int64_t c = 0; c < hd; ++c) {
        double acc = 0.0;
        for (int64_t s = 0; s < n; ++s) {
          acc += p[s] * v[s * kv_cols + g * hd + c];
        }
        o[t * q_cols + h * hd + c] = acc / sum;
      }
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      double s = m->bo ? m->bo[c] : 0.0;
      for (int64_t i = 0; i < q_cols; ++i)
        s += o[t * q_cols + i] * m->wo[i * d + c];
      y[t * d + c] = s;
    }
  }
  free(q);
  free(k);
  free(v);
  free(o);
  free(p);
}

static hw_layer_sequence Seq(int64_t seq, int64_t n_tokens) {
  hw_layer_sequence s;
  s.seq = seq;
  s.n_tokens = n_tokens;
  return s;
}

/* The sequence the layer tests repeat: a new cache for layer (capacity > 0:
 * hw_attention_layer_create_cache_typed of that many rows; 0:
 * hw_attention_layer_create_ring_cache), of element type dtype; its sequence
 * 0 fed the rows of x (dense [sum of chunks, d_model]) in forward calls of
 * chunks[0], chunks[1], ... tokens, the outputs into y (dense); the cache
 * destroyed. *bytes (if not NULL) gets its hw_kv_cache_bytes. Returns 1 if
 * every call succeeded (a failure is CHECKed). */
static int ForwardChunks(hw_attention_layer* layer, int64_t capacity, int dtype,
                         const int64_t* chunks, int n_chunks, const float* x,
                         float* y, size_t* bytes) {
  hw_attention_layer_config config;
  hw_kv_cache* cache = NULL;
  int ok = 1;
  CHECK_OK(hw_attention_layer_get_config(layer, &config));
  if (capacity > 0) {
    CHECK_OK(hw_attention_layer_create_cache_typed(layer, 1, capacity, dtype,
                                                   &cache));
  } else {
    CHECK_OK(hw_attention_layer_create_ring_cache(layer, 1, dtype, &cache));
  }
  if (cache == NULL) return 0;
  if (bytes != NULL) CHECK_OK(hw_kv_cache_bytes(cache, bytes));
  int64_t row = 0;
  for (int i = 0; i < n_chunks; ++i) {
    const hw_layer_sequence s = Seq(0, chunks[i]);
    const int rc = hw_attention_layer_forward(layer, cache, &s, 1,
                                              x + row * config.d_model, 0,
                                              y + row * config.d_model, 0);
    CHECK_OK(rc);
    ok &= rc == HW_OK;
    row += chunks[i];
  }
  CHECK(Length(cache, 0) == row);
  hw_kv_cache_destroy(cache);
  return ok;
}

/* One layer shape on the target active now: metadata, the float64
 * reference, prefill = prefill + decode, batch = alone. */
static void TestLayerShape(const Model* m) {
  const hw_attention_layer_config config = Config(m);
  const hw_attention_layer_weights weights = Weights(m);
  hw_attention_layer* layer = NULL;
  CHECK_OK(hw_attention_layer_create(&config, &weights, &layer));
  if (layer == NULL) return;
  const int64_t d = m->d_model, hd = m->head_dim;
  const int64_t H = m->n_heads, G = m->n_kv_heads;

  /* Metadata. */
  hw_attention_layer_config got;
  CHECK_OK(hw_attention_layer_get_config(layer, &got));
  CHECK(got.d_model == d && got.n_heads == H && got.n_kv_heads == G &&
        got.head_dim == hd && got.mask == m->mask && got.head_begin == 0 &&
        got.head_end == H);
  CHECK(fabs(got.scale - 1.0 / sqrt((double)hd)) < 1e-6);
  int64_t n_weights = 0;
  CHECK_OK(hw_attention_layer_n_weights(layer, &n_weights));
  const int64_t matrices = 2 * d * H * hd + 2 * d * G * hd;
  const int64_t biases = m->has_bias ? H * hd + 2 * G * hd + d : 0;
  CHECK(n_weights == matrices + biases);
  size_t packed = 0;
  CHECK_OK(hw_attention_layer_packed_bytes(layer, &packed));
  CHECK(packed >= (size_t)matrices * sizeof(float));
  size_t per_token = 0, cache_per_token = 0;
  CHECK_OK(hw_attention_layer_cache_bytes_per_token(layer, &per_token));
  const int64_t row_stride = (hd + 15) / 16 * 16;
  CHECK(per_token == (size_t)(2 * G * row_stride) * sizeof(float));

  enum { kN = 7, kPrefix = 3, kCap = 16 };
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_attention_layer_create_cache(layer, 2, kCap, &cache));
  if (cache == NULL) {
    hw_attention_layer_destroy(layer);
    return;
  }
  int64_t cache_heads = 0, cache_dim = 0;
  CHECK_OK(
      hw_kv_cache_shape(cache, NULL, &cache_heads, &cache_dim, NULL, NULL));
  CHECK(cache_heads == G && cache_dim == hd);
  CHECK_OK(hw_kv_cache_bytes_per_token(cache, &cache_per_token));
  CHECK(cache_per_token == per_token);

  /* Prefill of kN tokens in sequence 0, against the float64 reference. */
  float* x = RandomArray(kN * d, 2.0f);
  float* y_full = FilledArray(kN * d, NAN);
  double* ref = (double*)calloc((size_t)(kN * d), sizeof(double));
  float* ref_f = FilledArray(kN * d, 0.0f);
  if (ref == NULL) exit(2);
  hw_layer_sequence s0 = Seq(0, kN);
  CHECK_OK(hw_attention_layer_forward(layer, cache, &s0, 1, x, 0, y_full, 0));
  CHECK(Length(cache, 0) == kN);
  ReferenceLayer(m, kN, x, NULL, ref);
  for (int64_t i = 0; i < kN * d; ++i) ref_f[i] = (float)ref[i];
  CHECK(NormwiseDiff(y_full, d, ref_f, d, kN, d) <= kTolerance);
  /* The scratch the call left: released whole, then grown again. */
  size_t scratch = 0, released = 0;
  CHECK_OK(hw_attention_layer_scratch_bytes(layer, &scratch));
  CHECK(scratch > 0);
  CHECK_OK(hw_attention_layer_release_scratch(layer, &released));
  CHECK(released == scratch);
  CHECK_OK(hw_attention_layer_scratch_bytes(layer, &scratch));
  CHECK(scratch == 0);
  CHECK_OK(hw_attention_layer_release_scratch(layer, NULL));

  if (m->mask == HW_MASK_CAUSAL) {
    /* Sequence 1: prefill of kPrefix tokens, then one decode step per token:
     * the same outputs (with a causal mask a token's output depends on the
     * tokens up to it only). */
    float* y_steps = FilledArray(kN * d, NAN);
    hw_layer_sequence s1 = Seq(1, kPrefix);
    CHECK_OK(
        hw_attention_layer_forward(layer, cache, &s1, 1, x, 0, y_steps, 0));
    for (int64_t t = kPrefix; t < kN; ++t) {
      s1 = Seq(1, 1);
      CHECK_OK(hw_attention_layer_forward(layer, cache, &s1, 1, x + t * d, 0,
                                          y_steps + t * d, 0));
    }
    CHECK(Length(cache, 1) == kN);
    CHECK(NormwiseDiff(y_steps, d, y_full, d, kN, d) <= kTolerance);
    free(y_steps);
  }

  /* A batch of two sequences (5 and 3 tokens, padded strides) against each
   * alone, then one decode step of both against each alone. */
  {
    enum { kA = 5, kB = 3, kT = kA + kB };
    const int64_t xs = d + 3, ys = d + 5;
    float* xb = RandomArray((kT + 2) * xs, 2.0f); /* + 2 decode rows */
    float* y_batch = FilledArray((kT + 2) * ys, NAN);
    float* y_alone = FilledArray((kT + 2) * ys, NAN);
    hw_kv_cache* batch = NULL;
    hw_kv_cache* alone = NULL;
    CHECK_OK(hw_attention_layer_create_cache(layer, 2, kCap, &batch));
    CHECK_OK(hw_attention_layer_create_cache(layer, 2, kCap, &alone));

    /* Sequence 1 first in the batch, to take rows in another order than the
     * slots. */
    hw_layer_sequence both[2];
    both[0] = Seq(1, kA);
    both[1] = Seq(0, kB);
    CHECK_OK(
        hw_attention_layer_forward(layer, batch, both, 2, xb, xs, y_batch, ys));
    hw_layer_sequence one = Seq(1, kA);
    CHECK_OK(
        hw_attention_layer_forward(layer, alone, &one, 1, xb, xs, y_alone, ys));
    one = Seq(0, kB);
    CHECK_OK(hw_attention_layer_forward(layer, alone, &one, 1, xb + kA * xs, xs,
                                        y_alone + kA * ys, ys));
    both[0] = Seq(1, 1);
    both[1] = Seq(0, 1);
    CHECK_OK(hw_attention_layer_forward(layer, batch, both, 2, xb + kT * xs, xs,
                                        y_batch + kT * ys, ys));
    one = Seq(1, 1);
    CHECK_OK(hw_attention_layer_forward(layer, alone, &one, 1, xb + kT * xs, xs,
                                        y_alone + kT * ys, ys));
    one = Seq(0, 1);
    CHECK_OK(hw_attention_layer_forward(layer, alone, &one, 1,
                                        xb + (kT + 1) * xs, xs,
                                        y_alone + (kT + 1) * ys, ys));
    CHECK(Length(batch, 0) == kB + 1 && Length(batch, 1) == kA + 1);
    CHECK(Length(alone, 0) == kB + 1 && Length(alone, 1) == kA + 1);
    CHECK(NormwiseDiff(y_batch, ys, y_alone, ys, kT + 2, d) <= kTolerance);
    /* The padding between rows of y is not written. */
    CHECK(isnan(y_batch[d]) && isnan(y_batch[(kT + 1) * ys + d + 4]));

    /* Capacity exceeded: an error, the cache and y unchanged. */
    float* y_bad = FilledArray(kCap * d, 7.0f);
    one = Seq(1, kCap - kA);
    float* x_long = RandomArray(kCap * d, 1.0f);
    CHECK_ERR(
        hw_attention_layer_forward(layer, batch, &one, 1, x_long, 0, y_bad, 0),
        HW_OUT_OF_RANGE, "capacity");
    CHECK(Length(batch, 1) == kA + 1 && Length(batch, 0) == kB + 1);
    int untouched = 1;
    for (int64_t i = 0; i < kCap * d; ++i) untouched &= y_bad[i] == 7.0f;
    CHECK(untouched);
    /* Exactly up to the capacity is fine. */
    one = Seq(1, kCap - kA - 1);
    CHECK_OK(
        hw_attention_layer_forward(layer, batch, &one, 1, x_long, 0, y_bad, 0));
    CHECK(Length(batch, 1) == kCap);

    free(x_long);
    free(y_bad);
    hw_kv_cache_destroy(batch);
    hw_kv_cache_destroy(alone);
    free(xb);
    free(y_batch);
    free(y_alone);
  }

  free(x);
  free(y_full);
  free(ref);
  free(ref_f);
  hw_kv_cache_destroy(cache);
  hw_attention_layer_destroy(layer);
}

/* TestLayerShape of each of the 4 models at context. */
static void LayerShapesOnTarget(void* models) {
  for (int i = 0; i < 4; ++i) TestLayerShape(&((Model*)models)[i]);
}

static void TestLayerShapes(void) {
  Model models[4];
  models[0] = MakeModel(32, 4, 4, 8, HW_MASK_CAUSAL, 0);  /* MHA */
  models[1] = MakeModel(32, 4, 2, 12, HW_MASK_CAUSAL, 1); /* GQA, hd != d/H */
  models[2] = MakeModel(24, 4, 1, 6, HW_MASK_CAUSAL, 1);  /* MQA */
  models[3] = MakeModel(16, 2, 1, 8, HW_MASK_NONE, 1);    /* MQA, no mask */

  /* On every instruction set this CPU runs (the layer packs its weights for
   * the target active at create). */
  OnEveryTarget(LayerShapesOnTarget, models);
  for (int i = 0; i < 4; ++i) FreeModel(&models[i]);
}

/* The layer writing K and V into a cache of each dtype: the stored rows are
 * the float32 cache's rows rounded (within the rounding bound, plus float32's
 * own rounding of the projection), and the outputs of a prefill and a decode
 * step differ from the float32 cache's by the storage rounding only:
 * normwise 2e-2 for bfloat16 and int8 (2^-8 relative per element, int8 up to
 * row_max / 254), 3e-3 for float16 (2^-11); observed at most 2.1e-3, 6.3e-3
 * and 2.4e-4 on every target (float32: 0, the same cache). */
static void TestLayerDtypesOnTarget(const Model* m) {
  const hw_attention_layer_config config = Config(m);
  const hw_attention_layer_weights weights = Weights(m);
  hw_attention_layer* layer = NULL;
  CHECK_OK(hw_attention_layer_create(&config, &weights, &layer));
  if (layer == NULL) return;
  enum { kN = 6, kCap = 8 };
  const int64_t d = m->d_model, hd = m->head_dim, G = m->n_kv_heads;
  float* x = RandomArray((kN + 1) * d, 2.0f);
  float* y32 = FilledArray((kN + 1) * d, NAN);
  float* y = FilledArray((kN + 1) * d, NAN);
  hw_kv_cache* f32 = NULL;
  CHECK_OK(hw_attention_layer_create_cache(layer, 1, kCap, &f32));
  const hw_layer_sequence prompt = Seq(0, kN), step = Seq(0, 1);
  CHECK_OK(hw_attention_layer_forward(layer, f32, &prompt, 1, x, 0, y32, 0));
  CHECK_OK(hw_attention_layer_forward(layer, f32, &step, 1, x + kN * d, 0,
                                      y32 + kN * d, 0));
  for (int i = 0; i < 4 && f32 != NULL; ++i) {
    const int dtype = kDtypes[i];
    hw_kv_cache* cache = NULL;
    CHECK_OK(
        hw_attention_layer_create_cache_typed(layer, 1, kCap, dtype, &cache));
    if (cache == NULL) continue;
    int got = -1;
    CHECK_OK(hw_kv_cache_dtype(cache, &got, NULL));
    CHECK(got == dtype);
    CHECK_OK(hw_attention_layer_forward(layer, cache, &prompt, 1, x, 0, y, 0));
    CHECK_OK(hw_attention_layer_forward(layer, cache, &step, 1, x + kN * d, 0,
                                        y + kN * d, 0));
    for (int keys = 0; keys < 2; ++keys) {
      for (int64_t g = 0; g < G; ++g) {
        int64_t rows = 0, rows32 = 0;
        float* got_rows = LoadedRows(cache, keys, 0, g, hd, &rows);
        float* want = LoadedRows(f32, keys, 0, g, hd, &rows32);
        CHECK(rows == kN + 1 && rows32 == kN + 1);
        for (int64_t r = 0; r < rows && r < rows32; ++r) {
          double row_max = 0.0;
          for (int64_t c = 0; c < hd; ++c) {
            if (fabs(want[r * hd + c]) > row_max)
              row_max = fabs(want[r * hd + c]);
          }
          for (int64_t c = 0; c < hd; ++c) {
            const double w = want[r * hd + c];
            CHECK(fabs(got_rows[r * hd + c] - w) <=
                  RoundingBound(dtype, w, row_max) * 1.01 + 1e-6 * row_max);
          }
        }
        free(got_rows);
        free(want);
      }
    }
    const double tolerance = dtype == HW_KV_FLOAT32   ? kTolerance
                             : dtype == HW_KV_FLOAT16 ? 3e-3
                                                      : 2e-2;
    const double diff = NormwiseDiff(y, d, y32, d, kN + 1, d);
    if (!(diff <= tolerance)) {
      fprintf(stderr, "  layer with a %s cache: diff %g\n",
              hw_kv_dtype_name(dtype), diff);
    }
    CHECK(diff <= tolerance);
    hw_kv_cache_destroy(cache);
  }
  hw_kv_cache* other = NULL;
  CHECK_ERR(hw_attention_layer_create_cache_typed(layer, 1, kCap, 9, &other),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_cache_typed: dtype (9)");
  CHECK_ERR(hw_attention_layer_create_cache_typed(NULL, 1, kCap, 0, &other),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_cache_typed: layer is null");
  CHECK_ERR(hw_attention_layer_create_cache_typed(layer, 0, kCap, 1, &other),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_cache_typed: n_sequences must be >= 1");
  CHECK_ERR(hw_attention_layer_create_cache_typed(layer, 1, kCap, 1, NULL),
            HW_INVALID_ARGUMENT, "out is null");
  CHECK(other == NULL);
  hw_kv_cache_destroy(f32);
  free(x);
  free(y32);
  free(y);
  hw_attention_layer_destroy(layer);
}

static void LayerDtypesOnTarget(void* model) {
  TestLayerDtypesOnTarget((Model*)model);
}

static void TestLayerDtypes(void) {
  Model m = MakeModel(32, 4, 2, 12, HW_MASK_CAUSAL, 1); /* GQA, odd tail */
  OnEveryTarget(LayerDtypesOnTarget, &m);
  FreeModel(&m);
}

static void TestLayerErrors(void) {
  Model m = MakeModel(16, 4, 2, 4, HW_MASK_CAUSAL, 1);
  hw_attention_layer_config config = Config(&m);
  hw_attention_layer_weights weights = Weights(&m);
  hw_attention_layer* layer = NULL;

  /* Bad config or weights: an error naming the argument, *out unchanged. */
  {
    hw_attention_layer_weights bad = weights;
    bad.w_q.cols = 15;
    CHECK_ERR(hw_attention_layer_create(&config, &bad, &layer),
              HW_INVALID_ARGUMENT, "w_q");
    bad = weights;
    bad.w_k.rows = 8;
    CHECK_ERR(hw_attention_layer_create(&config, &bad, &layer),
              HW_INVALID_ARGUMENT, "w_k");
    bad = weights;
    bad.w_o.rows = 17;
    CHECK_ERR(hw_attention_layer_create(&config, &bad, &layer),
              HW_INVALID_ARGUMENT, "w_o");
    bad = weights;
    bad.w_v.data = NULL;
    CHECK_ERR(hw_attention_layer_create(&config, &bad, &layer),
              HW_INVALID_ARGUMENT, "w_v");
    bad = weights;
    bad.w_q.stride = 3; /* shorter than the row */
    CHECK_ERR(hw_attention_layer_create(&config, &bad, &layer),
              HW_INVALID_ARGUMENT, "w_q");
  }
  {
    hw_attention_layer_config bad = config;
    bad.n_kv_heads = 3; /* does not divide n_heads = 4 */
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "n_kv_heads");
    bad = config;
    bad.mask = 7;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT,
              "hw_attention_layer_create: config.mask is not an "
              "hw_attention_mask (got 7)");
    bad = config;
    bad.n_heads = 0;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "config.n_heads must be >= 1");
    bad = config;
    bad.n_kv_heads = -1;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT,
              "hw_attention_layer_create: config.n_kv_heads must be >= 0");
    bad = config;
    bad.head_dim = -1;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "config.head_dim must be >= 0");
    bad = config;
    bad.head_dim = 0;
    bad.d_model = 18; /* not a multiple of n_heads = 4 */
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "config.head_dim is 0");
    bad = config;
    bad.head_begin = 1; /* not on a KV-group boundary */
    bad.head_end = 4;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "config.head_begin");
    bad = config;
    bad.scale = NAN;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "config.scale");
    /* Sizes whose byte count overflows name the field. */
    bad = config;
    bad.d_model = INT64_C(1) << 62;
    CHECK_ERR(
        hw_attention_layer_create(&bad, &weights, &layer),
        HW_RESOURCE_EXHAUSTED,
        "hw_attention_layer_create: config.d_model (4611686018427387904)");
    bad = config;
    bad.head_dim = INT64_C(1) << 62;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_RESOURCE_EXHAUSTED, "config.head_dim (4611686018427387904)");
    bad = config;
    bad.n_heads = INT64_C(1) << 62;
    bad.n_kv_heads = 0;
    bad.head_dim = 1;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_RESOURCE_EXHAUSTED, "config.n_heads (4611686018427387904)");
    bad = config;
    bad.d_model = 0;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "d_model");
    bad = config;
    bad.scale = -1.0f;
    CHECK_ERR(hw_attention_layer_create(&bad, &weights, &layer),
              HW_INVALID_ARGUMENT, "scale");
  }
  CHECK_ERR(hw_attention_layer_create(NULL, &weights, &layer),
            HW_INVALID_ARGUMENT, "config");
  CHECK_ERR(hw_attention_layer_create(&config, NULL, &layer),
            HW_INVALID_ARGUMENT, "weights");
  CHECK_ERR(hw_attention_layer_create(&config, &weights, NULL),
            HW_INVALID_ARGUMENT, "out");
  CHECK(layer == NULL);

  CHECK_OK(hw_attention_layer_create(&config, &weights, &layer));
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_attention_layer_create_cache(layer, 1, 8, &cache));
  float* x = RandomArray(4 * 16, 1.0f);
  float* y = FilledArray(4 * 16, 0.0f);
  hw_layer_sequence s = Seq(0, 2);

  /* Null handles and pointers. */
  CHECK_ERR(hw_attention_layer_forward(NULL, cache, &s, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "layer is null");
  CHECK_ERR(hw_attention_layer_forward(layer, NULL, &s, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "cache is null");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, NULL, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "sequences is null");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, NULL, 0, y, 0),
            HW_INVALID_ARGUMENT, "x is null");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, NULL, 0),
            HW_INVALID_ARGUMENT, "y is null");
  int64_t n = 0;
  size_t bytes = 0;
  hw_kv_cache* other = NULL;
  CHECK_ERR(hw_attention_layer_n_weights(NULL, &n), HW_INVALID_ARGUMENT,
            "layer");
  CHECK_ERR(hw_attention_layer_packed_bytes(NULL, &bytes), HW_INVALID_ARGUMENT,
            "layer");
  CHECK_ERR(hw_attention_layer_cache_bytes_per_token(layer, NULL),
            HW_INVALID_ARGUMENT, "bytes");
  CHECK_ERR(hw_attention_layer_create_cache(NULL, 1, 8, &other),
            HW_INVALID_ARGUMENT, "layer");
  CHECK_ERR(hw_attention_layer_get_config(NULL, &config), HW_INVALID_ARGUMENT,
            "layer");
  CHECK_ERR(hw_attention_layer_get_config(layer, NULL), HW_INVALID_ARGUMENT,
            "config is null");
  CHECK_ERR(hw_attention_layer_n_weights(layer, NULL), HW_INVALID_ARGUMENT,
            "n is null");
  CHECK_ERR(hw_attention_layer_packed_bytes(layer, NULL), HW_INVALID_ARGUMENT,
            "bytes is null");
  CHECK_ERR(hw_attention_layer_scratch_bytes(NULL, &bytes), HW_INVALID_ARGUMENT,
            "layer");
  CHECK_ERR(hw_attention_layer_scratch_bytes(layer, NULL), HW_INVALID_ARGUMENT,
            "bytes is null");
  CHECK_ERR(hw_attention_layer_release_scratch(NULL, &bytes),
            HW_INVALID_ARGUMENT, "layer");
  CHECK_ERR(hw_attention_layer_cache_bytes_per_token(NULL, &bytes),
            HW_INVALID_ARGUMENT, "layer is null");
  CHECK_ERR(hw_attention_layer_create_cache(layer, 1, 8, NULL),
            HW_INVALID_ARGUMENT, "out is null");
  CHECK_ERR(hw_attention_layer_create_cache(layer, 0, 8, &other),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_cache: n_sequences must be >= 1 (got "
            "0)");
  CHECK_ERR(hw_attention_layer_create_cache(layer, 1, -1, &other),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_cache: capacity must be >= 1 (got -1)");
  CHECK_ERR(hw_attention_layer_create_cache(layer, 1, INT64_MAX, &other),
            HW_RESOURCE_EXHAUSTED,
            "hw_attention_layer_create_cache: 2 x n_sequences (1)");
  CHECK(other == NULL);
  hw_attention_layer_destroy(NULL); /* a no-op */

  /* Bad sequences and views. */
  hw_layer_sequence bad = Seq(0, 0);
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &bad, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "n_tokens");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 0, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "n_sequences");
  bad = Seq(1, 1); /* the cache has one sequence */
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &bad, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "seq");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, x, 15, y, 0),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_forward: x_stride (15) is shorter");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, x, 0),
            HW_INVALID_ARGUMENT, "y overlaps x");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, y, 15),
            HW_INVALID_ARGUMENT, "y_stride (15) is shorter");
  CHECK_ERR(
      hw_attention_layer_forward(layer, cache, &s, 1, x, INT64_MAX / 2, y, 0),
      HW_RESOURCE_EXHAUSTED, "hw_attention_layer_forward: x: rows (2)");
  bad = Seq(0, -1);
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &bad, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "sequences[0].n_tokens must be >= 1 (got -1)");
  CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, -5, x, 0, y, 0),
            HW_INVALID_ARGUMENT, "n_sequences must be >= 1 (got -5)");
  {
    /* y inside the cache. */
    const float* keys = NULL;
    CHECK_OK(hw_kv_cache_keys(cache, 0, 0, &keys, NULL, NULL));
    CHECK_ERR(
        hw_attention_layer_forward(layer, cache, &s, 1, x, 0, (float*)keys, 0),
        HW_INVALID_ARGUMENT, "y overlaps the cache");
  }
  {
    /* A repeated seq; n_tokens whose sum overflows (an error about the
     * sequences, as the sum of valid ones cannot overflow). */
    hw_kv_cache* two = NULL;
    CHECK_OK(hw_attention_layer_create_cache(layer, 2, 8, &two));
    hw_layer_sequence pair[2];
    pair[0] = Seq(1, 1);
    pair[1] = Seq(1, 1);
    CHECK_ERR(hw_attention_layer_forward(layer, two, pair, 2, x, 0, y, 0),
              HW_INVALID_ARGUMENT, "sequences[1].seq (1) is listed twice");
    pair[0] = Seq(0, INT64_MAX / 2 + 1);
    pair[1] = Seq(1, INT64_MAX / 2 + 1);
    CHECK_ERR(hw_attention_layer_forward(layer, two, pair, 2, x, 0, y, 0),
              HW_OUT_OF_RANGE, "sequences[0]: length 0 + ");
    CHECK(Length(two, 0) == 0 && Length(two, 1) == 0);
    hw_kv_cache_destroy(two);
  }
  CHECK_OK(hw_kv_cache_create(1, 2, 8, 8, &other)); /* head_dim 8, not 4 */
  CHECK_ERR(hw_attention_layer_forward(layer, other, &s, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_forward: cache has n_kv_heads 2 and head_dim "
            "8 but the layer needs n_kv_heads 2 and head_dim 4 (see "
            "hw_attention_layer_create_cache)");
  CHECK(Length(other, 0) == 0);
  hw_kv_cache_destroy(other);
  CHECK(Length(cache, 0) == 0);

  /* Too many tokens: an error, the cache unchanged. */
  float* x_long = RandomArray(9 * 16, 1.0f);
  float* y_long = FilledArray(9 * 16, 0.0f);
  bad = Seq(0, 9);
  CHECK_ERR(
      hw_attention_layer_forward(layer, cache, &bad, 1, x_long, 0, y_long, 0),
      HW_OUT_OF_RANGE, "capacity");
  CHECK(Length(cache, 0) == 0);

  /* A cap on another vector width after create: FAILED_PRECONDITION until the
   * cap is removed. */
  const char* targets[16];
  const int64_t n_targets = hw_supported_targets(targets, 16);
  /* The fallback's width differs from the best target's unless both are
   * 128-bit (EMU128 on an SSE4 CPU). */
  const char* fallback = targets[n_targets - 1];
  if (n_targets > 1 &&
      (strcmp(fallback, "SCALAR") == 0 || strncmp(targets[0], "AVX", 3) == 0)) {
    CHECK_OK(hw_set_max_target(fallback));
    CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, y, 0),
              HW_FAILED_PRECONDITION, "");
    CHECK(Length(cache, 0) == 0);
    hw_reset_max_target();
  }
  CHECK_OK(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, y, 0));
  CHECK(Length(cache, 0) == 2);

  free(x_long);
  free(y_long);
  free(x);
  free(y);
  hw_kv_cache_destroy(cache);
  hw_attention_layer_destroy(layer);
  FreeModel(&m);
}

/* ------------------------------------------------ Attention layer variants */

/* The variants as the layer reports them (headway.h): zeros that mean a
 * default replaced by it, and a variant that is off with C++'s defaults. */
static hw_attention_layer_variants ResolvedVariants(
    const hw_attention_layer_variants* variants) {
  hw_attention_layer_variants v;
  memset(&v, 0, sizeof(v));
  if (variants != NULL) v = *variants;
  v.struct_size = sizeof(v);
  if (v.qk_norm == 0 || v.qk_norm_eps == 0.0f) v.qk_norm_eps = 1e-6f;
  if (v.qk_norm == 0) v.q_norm = v.k_norm = NULL;
  if (v.rope.rotary_dim == 0) memset(&v.rope, 0, sizeof(v.rope));
  v.rope = ResolvedRope(v.rope);
  return v;
}

static int SameRope(const hw_rope_config* a, const hw_rope_config* b) {
  return a->rotary_dim == b->rotary_dim && a->layout == b->layout &&
         a->scaling == b->scaling && a->theta == b->theta &&
         a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
         a->high_freq_factor == b->high_freq_factor &&
         a->original_max_position == b->original_max_position;
}

/* A zeroed struct of this header's size: every variant off. */
static hw_attention_layer_variants NoVariants(void) {
  hw_attention_layer_variants v;
  memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  return v;
}

/* One layer with variants on the target active now: what get_variants
 * reports, then tokens reaching the cache three ways against the float64
 * reference: sequence 1's prefill of kPrefix tokens; a batch of sequence 0's
 * prefill of kN tokens (positions 0 .. kN - 1) with sequence 1's next token
 * (position kPrefix, row 0 of its call); sequence 1's decode steps. A RoPE
 * position taken from the call's rows instead of the cache's length, or a
 * norm applied to the wrong head, moves the outputs by O(1). */
static void TestLayerVariantsCase(const Model* m,
                                  const hw_attention_layer_variants* variants) {
  const hw_attention_layer_config config = Config(m);
  const hw_attention_layer_weights weights = Weights(m);
  const int64_t d = m->d_model, hd = m->head_dim;
  hw_attention_layer* layer = NULL;
  CHECK_OK(hw_attention_layer_create_with_variants(&config, &weights, variants,
                                                   &layer));
  if (layer == NULL) return;
  const hw_attention_layer_variants want = ResolvedVariants(variants);

  hw_attention_layer_variants got;
  memset(&got, 0xff, sizeof(got));
  got.struct_size = sizeof(got);
  CHECK_OK(hw_attention_layer_get_variants(layer, &got));
  CHECK(got.struct_size == sizeof(got) && got.qk_norm == want.qk_norm &&
        got.qk_norm_eps == want.qk_norm_eps && SameRope(&got.rope, &want.rope));
  if (want.qk_norm) {
    /* The layer's copies, not the caller's arrays. */
    CHECK(got.q_norm != NULL && got.q_norm != want.q_norm &&
          got.k_norm != NULL && got.k_norm != want.k_norm);
    if (got.q_norm != NULL && got.k_norm != NULL) {
      CHECK(memcmp(got.q_norm, want.q_norm, (size_t)hd * sizeof(float)) == 0);
      CHECK(memcmp(got.k_norm, want.k_norm, (size_t)hd * sizeof(float)) == 0);
    }
  } else {
    CHECK(got.q_norm == NULL && got.k_norm == NULL);
  }
  CHECK(got.window == want.window && got.softcap == want.softcap &&
        got.n_sink_tokens == want.n_sink_tokens &&
        got.weight_dtype == want.weight_dtype &&
        got.projection_compute == want.projection_compute &&
        got.attention_compute == want.attention_compute);
  /* The per-head arrays: the layer's copies of the whole model's [n_heads]. */
  CHECK((got.alibi_slopes != NULL) == (want.alibi_slopes != NULL) &&
        (got.sink_logits != NULL) == (want.sink_logits != NULL));
  if (got.alibi_slopes != NULL && want.alibi_slopes != NULL) {
    CHECK(got.alibi_slopes != want.alibi_slopes &&
          memcmp(got.alibi_slopes, want.alibi_slopes,
                 (size_t)m->n_heads * sizeof(float)) == 0);
  }
  if (got.sink_logits != NULL && want.sink_logits != NULL) {
    CHECK(got.sink_logits != want.sink_logits &&
          memcmp(got.sink_logits, want.sink_logits,
                 (size_t)m->n_heads * sizeof(float)) == 0);
  }

  enum { kN = 7, kPrefix = 3, kCap = 8 };
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_attention_layer_create_cache(layer, 2, kCap, &cache));
  float* x = RandomArray((kN + 1) * d, 2.0f); /* + sequence 1's batch row */
  float* yb = FilledArray((kN + 1) * d, NAN);
  float* y1 = FilledArray(kN * d, NAN);
  float* ref_f = FilledArray(kN * d, 0.0f);
  double* ref = (double*)calloc((size_t)(kN * d), sizeof(double));
  if (ref == NULL) exit(2);
  memcpy(x + kN * d, x + kPrefix * d, (size_t)d * sizeof(float));
  if (cache != NULL) {
    hw_layer_sequence s = Seq(1, kPrefix);
    CHECK_OK(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, y1, 0));
    hw_layer_sequence both[2];
    both[0] = Seq(0, kN);
    both[1] = Seq(1, 1);
    CHECK_OK(hw_attention_layer_forward(layer, cache, both, 2, x, 0, yb, 0));
    memcpy(y1 + kPrefix * d, yb + kN * d, (size_t)d * sizeof(float));
    for (int64_t t = kPrefix + 1; t < kN; ++t) {
      s = Seq(1, 1);
      CHECK_OK(hw_attention_layer_forward(layer, cache, &s, 1, x + t * d, 0,
                                          y1 + t * d, 0));
    }
    CHECK(Length(cache, 0) == kN && Length(cache, 1) == kN);
    ReferenceLayer(m, kN, x, &want, ref);
    for (int64_t i = 0; i < kN * d; ++i) ref_f[i] = (float)ref[i];
    CHECK(NormwiseDiff(yb, d, ref_f, d, kN, d) <= kTolerance);
    CHECK(NormwiseDiff(y1, d, ref_f, d, kN, d) <= kTolerance);
  }
  free(x);
  free(yb);
  free(y1);
  free(ref_f);
  free(ref);
  hw_kv_cache_destroy(cache);
  hw_attention_layer_destroy(layer);
}

/* Tensor parallelism with the attention variants: two shards of a layer
 * (query heads [0, 2) and [2, 4) of 4, each reading its heads of the whole
 * model's slopes and sinks) sum to the whole layer, over a prefill and two
 * decode steps; a shard reports the whole model's arrays. */
static void TestLayerVariantShards(
    const Model* m, const hw_attention_layer_variants* variants) {
  enum { kN = 5, kSteps = 2, kT = kN + kSteps };
  const int64_t d = m->d_model, H = m->n_heads;
  const hw_attention_layer_weights weights = Weights(m);
  float* x = RandomArray(kT * d, 2.0f);
  float* y[3];
  hw_attention_layer* layers[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; ++i) {
    /* 0: the whole layer; 1, 2: the shards. */
    hw_attention_layer_config config = Config(m);
    if (i > 0) {
      config.head_begin = (i - 1) * H / 2;
      config.head_end = i * H / 2;
    }
    y[i] = FilledArray(kT * d, NAN);
    CHECK_OK(hw_attention_layer_create_with_variants(&config, &weights,
                                                     variants, &layers[i]));
    if (layers[i] == NULL) continue;
    const int64_t chunks[1 + kSteps] = {kN, 1, 1};
    ForwardChunks(layers[i], kT, HW_KV_FLOAT32, chunks, 1 + kSteps, x, y[i],
                  NULL);
    hw_attention_layer_variants got = NoVariants();
    CHECK_OK(hw_attention_layer_get_variants(layers[i], &got));
    CHECK(got.alibi_slopes != NULL && got.sink_logits != NULL);
    if (got.alibi_slopes != NULL && got.sink_logits != NULL) {
      CHECK(memcmp(got.alibi_slopes, variants->alibi_slopes,
                   (size_t)H * sizeof(float)) == 0 &&
            memcmp(got.sink_logits, variants->sink_logits,
                   (size_t)H * sizeof(float)) == 0);
    }
  }
  for (int64_t e = 0; e < kT * d; ++e) y[1][e] += y[2][e];
  CHECK(NormwiseDiff(y[1], d, y[0], d, kT, d) <= kTolerance);
  for (int i = 0; i < 3; ++i) {
    hw_attention_layer_destroy(layers[i]);
    free(y[i]);
  }
  free(x);
}

/* Four variant sets on a GQA layer and one on an MQA layer with head_dim 6
 * (QK-norm and RoPE), then the attention variants (sliding window,
 * soft-capping, ALiBi, sink logits) alone and with QK-norm and RoPE on the
 * GQA layer and with RoPE on the MQA one, on every instruction set; shards
 * with every variant. */
/* The layer variant sets of TestLayerVariants on one target. */
typedef struct LayerVariantsRun {
  const Model* models;
  const hw_attention_layer_variants* sets;
  const int* model_of; /* the model of each set */
  int n_sets;
} LayerVariantsRun;

static void LayerVariantsOnTarget(void* context) {
  const LayerVariantsRun* run = (const LayerVariantsRun*)context;
  for (int i = 0; i < run->n_sets; ++i) {
    const int before_set = g_failures;
    TestLayerVariantsCase(&run->models[run->model_of[i]], &run->sets[i]);
    if (g_failures != before_set) {
      fprintf(stderr, "  (the failures above are of variant set %d)\n", i);
    }
  }
  TestLayerVariantShards(&run->models[0], &run->sets[6]);
}

static void TestLayerVariants(void) {
  Model models[2];
  models[0] = MakeModel(32, 4, 2, 16, HW_MASK_CAUSAL, 1);
  models[1] = MakeModel(24, 4, 1, 6, HW_MASK_CAUSAL, 0);
  float* norms[2][2];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      norms[i][j] = RandomArray(models[i].head_dim, 1.0f);
      for (int64_t c = 0; c < models[i].head_dim; ++c) norms[i][j][c] += 1.0f;
    }
  }
  /* Both models have 4 heads: 2^-2, 2^-4, 2^-6, 2^-8, and sinks from a
   * share of a few percent to most of a row. */
  float slopes[4];
  const float sinks[4] = {0.5f, -1.0f, 2.5f, 1.0f};
  CHECK_OK(hw_alibi_slopes(4, slopes));
  enum { kSets = 8 };
  hw_attention_layer_variants sets[kSets];
  const int model_of[kSets] = {0, 0, 0, 0, 1, 0, 0, 1};
  for (int i = 0; i < kSets; ++i) sets[i] = NoVariants();
  /* QK-norm with the default eps (0), RoPE on half of each head (halves). */
  sets[0].qk_norm = 1;
  sets[0].rope.rotary_dim = 8;
  /* RoPE alone, interleaved, Llama 3 scaling with bands inside the head:
   * wavelengths 6.3 .. 2e4 against 16 / 4 = 4 and 16 / 1 = 16. */
  sets[1].rope = RopeConfig(16, HW_ROPE_INTERLEAVED, HW_ROPE_SCALING_LLAMA3);
  sets[1].rope.factor = 8.0;
  sets[1].rope.original_max_position = 16;
  /* QK-norm alone, eps given. */
  sets[2].qk_norm = 1;
  sets[2].qk_norm_eps = 1e-3f;
  /* Both, linear scaling, theta 10^6. */
  sets[3].qk_norm = 1;
  sets[3].qk_norm_eps = 1e-5f;
  sets[3].rope = RopeConfig(16, HW_ROPE_HALVES, HW_ROPE_SCALING_LINEAR);
  sets[3].rope.theta = 1e6;
  sets[3].rope.factor = 2.0;
  /* MQA, head_dim 6: QK-norm, RoPE on 4 of 6 (interleaved). */
  sets[4].qk_norm = 1;
  sets[4].rope = RopeConfig(4, HW_ROPE_INTERLEAVED, HW_ROPE_SCALING_NONE);
  /* The attention variants: a window of 3 of the 7 tokens, soft-capping at
   * 2 (the scores reach about 5), ALiBi and sinks. */
  sets[5].window = 3;
  sets[5].softcap = 2.0f;
  sets[5].alibi_slopes = slopes;
  sets[5].sink_logits = sinks;
  /* Everything at once: QK-norm, RoPE, window 4 with 2 sink tokens, softcap
   * 5, ALiBi, sinks. */
  sets[6] = sets[5];
  sets[6].qk_norm = 1;
  sets[6].rope = RopeConfig(8, HW_ROPE_HALVES, HW_ROPE_SCALING_NONE);
  sets[6].window = 4;
  sets[6].n_sink_tokens = 2;
  sets[6].softcap = 5.0f;
  /* MQA: RoPE, window 2 (a token and the one before), sinks. */
  sets[7].rope = RopeConfig(4, HW_ROPE_HALVES, HW_ROPE_SCALING_NONE);
  sets[7].window = 2;
  sets[7].sink_logits = sinks;
  for (int i = 0; i < kSets; ++i) {
    sets[i].q_norm = norms[model_of[i]][0];
    sets[i].k_norm = norms[model_of[i]][1];
  }

  LayerVariantsRun run = {models, sets, model_of, kSets};
  OnEveryTarget(LayerVariantsOnTarget, &run);
  for (int i = 0; i < 2; ++i) {
    FreeModel(&models[i]);
    free(norms[i][0]);
    free(norms[i][1]);
  }
}

/* A layer with every variant off, however asked (NULL variants, a zeroed
 * struct whose ignored fields hold garbage, a longer struct from a newer
 * header with zero tail), is hw_attention_layer_create's: the same outputs,
 * bit for bit. */
static void TestLayerVariantsOff(void) {
  Model m = MakeModel(32, 4, 2, 8, HW_MASK_CAUSAL, 1);
  const hw_attention_layer_config config = Config(&m);
  const hw_attention_layer_weights weights = Weights(&m);
  typedef struct Longer {
    hw_attention_layer_variants v;
    unsigned char tail[16]; /* fields of a later version, zero: off */
  } Longer;
  Longer longer;
  memset(&longer, 0, sizeof(longer));
  longer.v.struct_size = sizeof(longer);
  hw_attention_layer_variants ignored = NoVariants();
  ignored.qk_norm_eps = -1.0f;       /* ignored without qk_norm */
  ignored.q_norm = (const float*)16; /* likewise, never read */
  ignored.rope.layout = 9;           /* ignored with rotary_dim 0 */
  ignored.rope.theta = -5.0;
  const hw_attention_layer_variants* asks[3] = {NULL, &ignored, &longer.v};

  enum { kN = 5 };
  const int64_t d = m.d_model;
  float* x = RandomArray(kN * d, 2.0f);
  float* want = FilledArray(kN * d, NAN);
  float* got = FilledArray(kN * d, NAN);
  hw_attention_layer* plain = NULL;
  const int64_t all[1] = {kN};
  CHECK_OK(hw_attention_layer_create(&config, &weights, &plain));
  if (plain == NULL) return;
  ForwardChunks(plain, kN, HW_KV_FLOAT32, all, 1, x, want, NULL);
  {
    hw_attention_layer_variants v;
    memset(&v, 0xff, sizeof(v));
    v.struct_size = sizeof(v);
    CHECK_OK(hw_attention_layer_get_variants(plain, &v));
    const hw_attention_layer_variants off = ResolvedVariants(NULL);
    CHECK(v.struct_size == sizeof(v) && v.qk_norm == 0 &&
          v.qk_norm_eps == off.qk_norm_eps && v.q_norm == NULL &&
          v.k_norm == NULL && SameRope(&v.rope, &off.rope));
    CHECK(v.rope.rotary_dim == 0 && v.rope.theta == 10000.0 &&
          v.rope.factor == 1.0 && v.rope.low_freq_factor == 1.0 &&
          v.rope.high_freq_factor == 4.0 &&
          v.rope.original_max_position == 8192 && v.qk_norm_eps == 1e-6f);
    CHECK(v.window == 0 && v.n_sink_tokens == 0 && v.softcap == 0.0f &&
          v.alibi_slopes == NULL && v.sink_logits == NULL &&
          v.weight_dtype == HW_WEIGHT_FLOAT32 &&
          v.projection_compute == HW_COMPUTE_FLOAT32);
  }
  for (int i = 0; i < 3; ++i) {
    hw_attention_layer* layer = NULL;
    CHECK_OK(hw_attention_layer_create_with_variants(&config, &weights, asks[i],
                                                     &layer));
    if (layer == NULL) continue;
    for (int64_t j = 0; j < kN * d; ++j) got[j] = NAN;
    ForwardChunks(layer, kN, HW_KV_FLOAT32, all, 1, x, got, NULL);
    CHECK(memcmp(got, want, (size_t)(kN * d) * sizeof(float)) == 0);
    /* A newer caller's longer struct: its tail comes back zero. */
    memset(&longer, 0x5a, sizeof(longer));
    longer.v.struct_size = sizeof(longer);
    CHECK_OK(hw_attention_layer_get_variants(layer, &longer.v));
    CHECK(longer.v.struct_size == sizeof(longer) && longer.v.qk_norm == 0 &&
          longer.v.rope.rotary_dim == 0 && longer.tail[0] == 0 &&
          longer.tail[15] == 0);
    memset(&longer, 0, sizeof(longer));
    longer.v.struct_size = sizeof(longer);
    hw_attention_layer_destroy(layer);
  }
  free(x);
  free(want);
  free(got);
  hw_attention_layer_destroy(plain);
  FreeModel(&m);
}

static void TestLayerVariantErrors(void) {
  Model m = MakeModel(16, 4, 2, 4, HW_MASK_CAUSAL, 1);
  const hw_attention_layer_config config = Config(&m);
  const hw_attention_layer_weights weights = Weights(&m);
  float q_norm[4] = {1.0f, 0.5f, 2.0f, 1.5f};
  float k_norm[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  hw_attention_layer* layer = NULL;
  hw_attention_layer_variants v = NoVariants();
  char needle[160];

  /* struct_size: checked here, whatever the C++ layer does. */
  CHECK_ERR(hw_attention_layer_create_with_variants(NULL, &weights, &v, &layer),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_with_variants: config is null");
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, NULL),
      HW_INVALID_ARGUMENT, "out is null");
  v.struct_size = 0;
  snprintf(needle, sizeof(needle),
           "hw_attention_layer_create_with_variants: variants.struct_size (0) "
           "is smaller than version 1's (%u)",
           (unsigned)HW_ATTENTION_LAYER_VARIANTS_V1_SIZE);
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, needle);
  v.struct_size = HW_ATTENTION_LAYER_VARIANTS_V1_SIZE - 1;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.struct_size");
  v.struct_size = 4097;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.struct_size (4097) is larger than 4096");
  {
    struct {
      hw_attention_layer_variants v;
      unsigned char tail[16];
    } longer;
    memset(&longer, 0, sizeof(longer));
    longer.v.struct_size = sizeof(longer);
    longer.tail[3] = 1; /* a variant this library does not know, on */
    snprintf(needle, sizeof(needle),
             "variants.struct_size (%u) is larger than this library's (%u) "
             "and byte %u is not zero",
             (unsigned)sizeof(longer),
             (unsigned)sizeof(hw_attention_layer_variants),
             (unsigned)sizeof(hw_attention_layer_variants) + 3);
    CHECK_ERR(hw_attention_layer_create_with_variants(&config, &weights,
                                                      &longer.v, &layer),
              HW_INVALID_ARGUMENT, needle);
  }
  v = NoVariants();
  v.qk_norm = 2;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_with_variants: variants.qk_norm (2) must be 0 "
      "or 1");
  /* The plain create's errors, in this function's name. */
  {
    hw_attention_layer_weights bad = weights;
    bad.w_q.cols = 15;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &bad, NULL, &layer),
        HW_INVALID_ARGUMENT, "hw_attention_layer_create_with_variants: ");
  }
  CHECK(layer == NULL);

  /* get_variants. */
  CHECK_OK(hw_attention_layer_create(&config, &weights, &layer));
  v = NoVariants();
  CHECK_ERR(hw_attention_layer_get_variants(NULL, &v), HW_INVALID_ARGUMENT,
            "hw_attention_layer_get_variants: layer is null");
  CHECK_ERR(hw_attention_layer_get_variants(layer, NULL), HW_INVALID_ARGUMENT,
            "hw_attention_layer_get_variants: variants is null");
  v.struct_size = 8;
  v.qk_norm = 77;
  CHECK_ERR(hw_attention_layer_get_variants(layer, &v), HW_INVALID_ARGUMENT,
            "hw_attention_layer_get_variants: variants.struct_size (8)");
  CHECK(v.qk_norm == 77); /* nothing written */
  hw_attention_layer_destroy(layer);
  layer = NULL;

  /* Checked by the C++ layer (AttentionLayer::Create), named in C's words. */
  v = NoVariants();
  v.rope.rotary_dim = 3;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_with_variants: variants.rope.rotary_dim (3)");
  v.rope.rotary_dim = 6; /* > head_dim 4 */
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.rope.rotary_dim (6)");
  v.rope.rotary_dim = 4;
  v.rope.layout = 3;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.rope.layout (3) is not a hw_rope_layout");
  v.rope.layout = HW_ROPE_HALVES;
  v.rope.theta = -1.0;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.rope.theta");
  v = NoVariants();
  v.qk_norm = 1;
  v.k_norm = k_norm;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.q_norm");
  v.q_norm = q_norm;
  v.k_norm = NULL;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.k_norm");
  v.k_norm = k_norm;
  v.qk_norm_eps = -1.0f;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.qk_norm_eps");
  v.qk_norm_eps = 0.0f;
  q_norm[1] = NAN;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT, "variants.q_norm[1]");

  /* The attention variants, checked by the C++ layer as config.attention's
   * fields, named as the C caller's. */
  {
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    float sinks[4] = {0.0f, 1.0f, -1.0f, 2.0f};
    v = NoVariants();
    v.window = -1;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
        HW_INVALID_ARGUMENT,
        "hw_attention_layer_create_with_variants: variants.window must be >= "
        "0 (got -1)");
    v.window = 2;
    v.softcap = NAN;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
        HW_INVALID_ARGUMENT,
        "hw_attention_layer_create_with_variants: variants.softcap must be "
        "finite and >= 0");
    v.softcap = -1.0f;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
        HW_INVALID_ARGUMENT, "variants.softcap must be finite and >= 0");
    v.softcap = 30.0f;
    v.alibi_slopes = slopes;
    v.sink_logits = sinks;
    slopes[2] = NAN;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
        HW_INVALID_ARGUMENT,
        "hw_attention_layer_create_with_variants: variants.alibi_slopes[2] is "
        "not finite");
    slopes[2] = 0.125f;
    sinks[3] = INFINITY;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
        HW_INVALID_ARGUMENT,
        "hw_attention_layer_create_with_variants: variants.sink_logits[3] is "
        "not finite");
    CHECK(layer == NULL);
    /* All four valid: created, and reported back. */
    sinks[3] = 2.0f;
    CHECK_OK(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer));
    hw_attention_layer_variants got = NoVariants();
    CHECK_OK(hw_attention_layer_get_variants(layer, &got));
    CHECK(got.window == 2 && got.softcap == 30.0f && got.qk_norm == 0 &&
          got.rope.rotary_dim == 0);
    CHECK(got.alibi_slopes != NULL && got.alibi_slopes != slopes &&
          got.sink_logits != NULL && got.sink_logits != sinks);
    /* Copies: the caller's arrays may change or go. */
    slopes[0] = sinks[0] = 99.0f;
    if (got.alibi_slopes != NULL && got.sink_logits != NULL) {
      CHECK(got.alibi_slopes[0] == 0.5f && got.alibi_slopes[3] == 0.0625f &&
            got.sink_logits[0] == 0.0f && got.sink_logits[3] == 2.0f);
    }
    hw_attention_layer_destroy(layer);
    layer = NULL;
  }
  FreeModel(&m);
}

/* --------------------------------------- Attention layer, weight storage */

/* Puts each column of w [rows, cols] on the int8 grid of step 2^-9: 2^-9 q
 * with q an integer in [-127, 127] and |q| = 127 in row 0. Such weights are
 * stored exactly in every hw_weight_dtype (bfloat16 keeps 8 significant bits;
 * int8's scale is max / 127 = 2^-9), so a layer multiplies by the model's own
 * weights whatever it stores and matches ReferenceLayer to float32's
 * rounding: a dtype that does not reach the layer, or is read wrongly, shows
 * in packed_bytes and get_variants, not in the outputs. */
static void OnInt8Grid(float* w, int64_t rows, int64_t cols) {
  const float step = 1.0f / 512.0f;
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      float q = nearbyintf(w[r * cols + c] / step);
      if (r == 0) q = w[c] < 0.0f ? -127.0f : 127.0f;
      q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
      w[r * cols + c] = step * q;
    }
  }
}

/* The bf16 compute mode rounds x and the attention output to bfloat16 (8
 * significant bits: 2^-8 relative at most, random in sign): the outputs move
 * by about 2^-8 of their scale through the projections and the softmax (at
 * most 4.6e-3 normwise over 200 models of TestLayerWeightDtypes' shape with
 * both roundings applied in float64), far more than float32's rounding
 * (kTolerance) and far less than a wrong head or weight (O(1)). Normwise 2e-2,
 * five times 2^-8; headway::AttentionLayer's tests hold the mode to an
 * elementwise bound. */
static const double kBf16ComputeTolerance = 2e-2;

/* A layer of `config` and `weights` whose attention computes in `compute`:
 * get_variants reports it; over caches of `dtype`, its outputs for n tokens
 * of x are the float32 products' within kBf16ComputeTolerance (attention.h's
 * AttentionCompute bounds are smaller); a forward on a cache of `wrong` is
 * the error `message` (after the field's name). y and ref are scratch. */
static void CheckLayerAttentionCompute(
    const hw_attention_layer_config* config,
    const hw_attention_layer_weights* weights, int32_t compute,
    hw_kv_dtype dtype, hw_kv_dtype wrong, const char* message, int64_t n,
    const float* x, float* y, float* ref) {
  const int64_t d = config->d_model, chunks[3] = {n - 2, 1, 1};
  hw_attention_layer* plain = NULL;
  hw_attention_layer* layer = NULL;
  hw_attention_layer_variants v = NoVariants();
  CHECK_OK(
      hw_attention_layer_create_with_variants(config, weights, &v, &plain));
  v.attention_compute = compute;
  CHECK_OK(
      hw_attention_layer_create_with_variants(config, weights, &v, &layer));
  if (plain != NULL && layer != NULL) {
    hw_attention_layer_variants got = NoVariants();
    CHECK_OK(hw_attention_layer_get_variants(layer, &got));
    CHECK(got.attention_compute == compute);
    ForwardChunks(plain, n, dtype, chunks, 3, x, ref, NULL);
    ForwardChunks(layer, n, dtype, chunks, 3, x, y, NULL);
    CHECK(NormwiseDiff(y, d, ref, d, n, d) <= kBf16ComputeTolerance);
    hw_kv_cache* cache = NULL;
    CHECK_OK(hw_attention_layer_create_cache_typed(layer, 1, n, wrong, &cache));
    if (cache != NULL) {
      char needle[200];
      snprintf(needle, sizeof(needle),
               "the layer's variants.attention_compute %s", message);
      const hw_layer_sequence s = Seq(0, 1);
      CHECK_ERR(hw_attention_layer_forward(layer, cache, &s, 1, x, 0, y, 0),
                HW_INVALID_ARGUMENT, needle);
      hw_kv_cache_destroy(cache);
    }
  }
  hw_attention_layer_destroy(plain);
  hw_attention_layer_destroy(layer);
}

/* A layer of each hw_weight_dtype (and bfloat16 weights in the bf16 compute
 * mode) from m's weights (on the int8 grid), on the target active now:
 * get_variants reports the storage, packed_bytes its size, and a prefill then
 * two decode steps match the float64 reference. m has d_model and n_heads *
 * head_dim 64: each packed matrix then holds a multiple of 64 weights, so no
 * rounding up to 64 bytes: bfloat16 is half float32's bytes, int8 a quarter
 * plus a float scale per (padded) column, float32's bytes / 64 for K = 64. */
static void TestLayerWeightDtypesOnTarget(const Model* m) {
  const hw_attention_layer_config config = Config(m);
  const hw_attention_layer_weights weights = Weights(m);
  enum { kN = 6 };
  const int64_t d = m->d_model, chunks[3] = {4, 1, 1};
  /* GCC 12 with -fsanitize=address,undefined otherwise sees a path on which
   * the calloc below asks for over PTRDIFF_MAX bytes (-Walloc-size-larger-
   * than). */
  if (d < 1 || d > 4096) exit(2);
  float* x = RandomArray(kN * d, 2.0f);
  float* y = FilledArray(kN * d, NAN);
  double* ref = (double*)calloc((size_t)(kN * d), sizeof(double));
  float* ref_f = FilledArray(kN * d, 0.0f);
  if (ref == NULL) exit(2);
  ReferenceLayer(m, kN, x, NULL, ref);
  for (int64_t i = 0; i < kN * d; ++i) ref_f[i] = (float)ref[i];
  size_t bytes[3] = {0, 0, 0};
  for (int dtype = HW_WEIGHT_FLOAT32; dtype <= HW_WEIGHT_INT8; ++dtype) {
    for (int compute = HW_COMPUTE_FLOAT32; compute <= HW_COMPUTE_BFLOAT16;
         ++compute) {
      if (compute == HW_COMPUTE_BFLOAT16 && dtype == HW_WEIGHT_FLOAT32) {
        continue;
      }
      hw_attention_layer_variants v = NoVariants();
      v.weight_dtype = dtype;
      v.projection_compute = compute;
      hw_attention_layer* layer = NULL;
      CHECK_OK(hw_attention_layer_create_with_variants(&config, &weights, &v,
                                                       &layer));
      if (layer == NULL) continue;
      hw_attention_layer_variants got = NoVariants();
      CHECK_OK(hw_attention_layer_get_variants(layer, &got));
      CHECK(got.weight_dtype == dtype && got.projection_compute == compute);
      CHECK_OK(hw_attention_layer_packed_bytes(layer, &bytes[dtype]));
      for (int64_t i = 0; i < kN * d; ++i) y[i] = NAN;
      ForwardChunks(layer, kN, HW_KV_FLOAT32, chunks, 3, x, y, NULL);
      const double diff = NormwiseDiff(y, d, ref_f, d, kN, d);
      const double tolerance =
          compute == HW_COMPUTE_BFLOAT16 ? kBf16ComputeTolerance : kTolerance;
      if (!(diff <= tolerance)) {
        fprintf(stderr, "  weight dtype %d, compute %d: diff %g\n", dtype,
                compute, diff);
      }
      CHECK(diff <= tolerance);
      hw_attention_layer_destroy(layer);
    }
  }
  CHECK(bytes[0] > 0 && bytes[HW_WEIGHT_BFLOAT16] * 2 == bytes[0] &&
        bytes[HW_WEIGHT_INT8] == bytes[0] / 4 + bytes[0] / 64);
  /* Attention in bf16 products over a bfloat16 cache, and in int8 products
   * over an int8 one (decode of m's GQA: 2 query rows per KV head). */
  CheckLayerAttentionCompute(&config, &weights, HW_ATTENTION_BFLOAT16,
                             HW_KV_BFLOAT16, HW_KV_FLOAT32,
                             "HW_ATTENTION_BFLOAT16 needs a bfloat16 cache "
                             "(got float32)",
                             kN, x, y, ref_f);
  CheckLayerAttentionCompute(&config, &weights, HW_ATTENTION_INT8, HW_KV_INT8,
                             HW_KV_BFLOAT16,
                             "HW_ATTENTION_INT8 needs an int8 cache (got "
                             "bfloat16)",
                             kN, x, y, ref_f);
  free(x);
  free(y);
  free(ref);
  free(ref_f);
}

static void LayerWeightDtypesOnTarget(void* model) {
  TestLayerWeightDtypesOnTarget((Model*)model);
}

/* Bad storage fields (named as the C caller's), and older callers: a
 * struct_size before version 3 stores float32 and gets no storage fields. */
static void TestLayerWeightDtypeErrors(void) {
  Model m = MakeModel(16, 4, 2, 4, HW_MASK_CAUSAL, 1);
  const hw_attention_layer_config config = Config(&m);
  hw_attention_layer_weights weights = Weights(&m);
  hw_attention_layer* layer = NULL;
  hw_attention_layer_variants v = NoVariants();
  const struct {
    int32_t weight_dtype, projection_compute;
    const char* needle;
  } bad[] = {
      {3, HW_COMPUTE_FLOAT32,
       "hw_attention_layer_create_with_variants: variants.weight_dtype (3) is "
       "not a hw_weight_dtype"},
      {HW_WEIGHT_FLOAT32, -1,
       "variants.projection_compute (-1) is not a hw_matmul_compute"},
      {HW_WEIGHT_FLOAT32, HW_COMPUTE_BFLOAT16,
       "variants.projection_compute (1, bf16) needs bf16 or int8 weights, "
       "variants.weight_dtype 1 or 2 (got 0)"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    v.weight_dtype = bad[i].weight_dtype;
    v.projection_compute = bad[i].projection_compute;
    CHECK_ERR(
        hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
        HW_INVALID_ARGUMENT, bad[i].needle);
  }
  /* int8 cannot store NaN or inf: the element is named. */
  float* w_k = RandomArray(16 * 8, 1.0f);
  w_k[2 * 8 + 3] = NAN;
  weights.w_k = Matrix(w_k, 16, 8);
  v.weight_dtype = HW_WEIGHT_INT8;
  v.projection_compute = HW_COMPUTE_FLOAT32;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_with_variants: weights.w_k[2, 3] is nan, "
      "which int8 weights (variants.weight_dtype 2) cannot store");
  CHECK(layer == NULL);
  /* float32 takes it (NaN propagates): the C++ rule, not the C wrapper's. */
  v.weight_dtype = HW_WEIGHT_FLOAT32;
  CHECK_OK(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer));
  hw_attention_layer_destroy(layer);
  layer = NULL;
  free(w_k);
  weights = Weights(&m);

  /* Version 2's struct_size: the storage fields are neither read (int8 and
   * garbage past struct_size: float32) nor written. */
  v = NoVariants();
  v.struct_size = HW_ATTENTION_LAYER_VARIANTS_V2_SIZE;
  v.weight_dtype = HW_WEIGHT_INT8;
  v.projection_compute = 7;
  CHECK_OK(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer));
  if (layer != NULL) {
    hw_attention_layer_variants got;
    memset(&got, 0x5a, sizeof(got));
    got.struct_size = HW_ATTENTION_LAYER_VARIANTS_V2_SIZE;
    CHECK_OK(hw_attention_layer_get_variants(layer, &got));
    CHECK(got.struct_size == HW_ATTENTION_LAYER_VARIANTS_V2_SIZE &&
          got.weight_dtype == 0x5a5a5a5a &&
          got.projection_compute == 0x5a5a5a5a);
    got = NoVariants();
    CHECK_OK(hw_attention_layer_get_variants(layer, &got));
    CHECK(got.weight_dtype == HW_WEIGHT_FLOAT32 &&
          got.projection_compute == HW_COMPUTE_FLOAT32);
    hw_attention_layer_destroy(layer);
  }
  FreeModel(&m);
}

static void TestLayerWeightDtypes(void) {
  Model m = MakeModel(64, 4, 2, 16, HW_MASK_CAUSAL, 1); /* GQA */
  OnInt8Grid(m.wq, m.d_model, m.n_heads * m.head_dim);
  OnInt8Grid(m.wk, m.d_model, m.n_kv_heads * m.head_dim);
  OnInt8Grid(m.wv, m.d_model, m.n_kv_heads * m.head_dim);
  OnInt8Grid(m.wo, m.n_heads * m.head_dim, m.d_model);
  OnEveryTarget(LayerWeightDtypesOnTarget, &m);
  FreeModel(&m);
  TestLayerWeightDtypeErrors();
}

/* ------------------------------------------------------- Attention core */

/* ------------------------------------------------ Attention layer, ring */

/* A layer with a window of 4 and 2 sink tokens (with RoPE and ALiBi, so that
 * a position taken from a ring row instead of the token shows) on a ring
 * cache from hw_attention_layer_create_ring_cache (6 rows) and on a plain
 * cache holding every position, both of dtype: a prefill of 11 tokens, longer
 * than the ring, then 13 tokens in decode steps and a chunk of 5 (the ring
 * wraps four times) give the same outputs within kTolerance (they differ in
 * float32 summation order only), and for float32 the float64 reference's;
 * the ring cache's bytes are its 6 rows, the plain one's 24. */
static void TestLayerRingOnTarget(const Model* m, int dtype) {
  enum { kWindow = 4, kSinks = 2, kCap = kWindow + kSinks, kT = 24 };
  const int64_t chunks[] = {11, 1, 1, 5, 1, 1, 1, 1, 1, 1};
  const int n_chunks = (int)(sizeof(chunks) / sizeof(chunks[0]));
  const int64_t d = m->d_model;
  float slopes[4];
  CHECK_OK(hw_alibi_slopes(4, slopes));
  hw_attention_layer_variants variants = NoVariants();
  variants.window = kWindow;
  variants.n_sink_tokens = kSinks;
  variants.rope = RopeConfig(8, HW_ROPE_HALVES, HW_ROPE_SCALING_NONE);
  variants.alibi_slopes = slopes;
  const hw_attention_layer_config config = Config(m);
  const hw_attention_layer_weights weights = Weights(m);
  hw_attention_layer* layer = NULL;
  CHECK_OK(hw_attention_layer_create_with_variants(&config, &weights, &variants,
                                                   &layer));
  if (layer == NULL) return;

  /* The ring cache's shape and state. */
  {
    hw_kv_cache* ring = NULL;
    int64_t capacity = 0, ring_begin = -1, sinks = -1;
    int is_ring = 0, got_dtype = -1;
    CHECK_OK(hw_attention_layer_create_ring_cache(layer, 2, dtype, &ring));
    if (ring != NULL) {
      CHECK_OK(hw_kv_cache_shape(ring, NULL, NULL, NULL, &capacity, NULL));
      CHECK_OK(hw_kv_cache_ring_state(ring, 1, &ring_begin, &sinks, &is_ring));
      CHECK_OK(hw_kv_cache_dtype(ring, &got_dtype, NULL));
      CHECK(capacity == kCap && is_ring == 1 && sinks == kSinks &&
            ring_begin == kSinks && got_dtype == dtype);
    }
    hw_kv_cache_destroy(ring);
  }

  float* x = RandomArray(kT * d, 2.0f);
  float* y_ring = FilledArray(kT * d, NAN);
  float* y_plain = FilledArray(kT * d, NAN);
  size_t ring_bytes = 0, plain_bytes = 0;
  ForwardChunks(layer, 0, dtype, chunks, n_chunks, x, y_ring, &ring_bytes);
  ForwardChunks(layer, kT, dtype, chunks, n_chunks, x, y_plain, &plain_bytes);
  CHECK(ring_bytes > 0 && ring_bytes * kT == plain_bytes * kCap);
  const double diff = NormwiseDiff(y_ring, d, y_plain, d, kT, d);
  if (!(diff <= kTolerance)) {
    fprintf(stderr, "  layer on a %s ring cache: diff %g\n",
            hw_kv_dtype_name(dtype), diff);
  }
  CHECK(diff <= kTolerance);
  if (dtype == HW_KV_FLOAT32) {
    const hw_attention_layer_variants want = ResolvedVariants(&variants);
    double* ref = (double*)calloc((size_t)(kT * d), sizeof(double));
    float* ref_f = FilledArray(kT * d, 0.0f);
    if (ref == NULL) exit(2);
    ReferenceLayer(m, kT, x, &want, ref);
    for (int64_t i = 0; i < kT * d; ++i) ref_f[i] = (float)ref[i];
    CHECK(NormwiseDiff(y_ring, d, ref_f, d, kT, d) <= kTolerance);
    free(ref);
    free(ref_f);
  }
  free(x);
  free(y_ring);
  free(y_plain);
  hw_attention_layer_destroy(layer);
}

/* The ring layer's errors: a ring cache too short for the layer's window or
 * with other sink tokens, a layer without a window on a ring cache (nothing
 * written, the cache unchanged), hw_attention_layer_create_ring_cache's
 * arguments; n_sink_tokens in the variants: < 0 rejected, reported by
 * get_variants, ignored (and not written) with version 1's struct_size. */
static void TestLayerRingErrors(void) {
  Model m = MakeModel(16, 4, 2, 4, HW_MASK_CAUSAL, 1);
  const hw_attention_layer_config config = Config(&m);
  const hw_attention_layer_weights weights = Weights(&m);
  hw_attention_layer_variants v = NoVariants();
  v.window = 4;
  v.n_sink_tokens = 2;
  hw_attention_layer *layer = NULL, *plain = NULL;
  CHECK_OK(
      hw_attention_layer_create_with_variants(&config, &weights, &v, &layer));
  CHECK_OK(hw_attention_layer_create(&config, &weights, &plain));
  if (layer == NULL || plain == NULL) {
    hw_attention_layer_destroy(layer);
    hw_attention_layer_destroy(plain);
    FreeModel(&m);
    return;
  }
  enum { kN = 2 };
  float* x = RandomArray(kN * 16, 1.0f);
  float* y = FilledArray(kN * 16, 7.0f);
  const hw_layer_sequence s = Seq(0, kN);

  /* Rings that do not fit the layer. */
  hw_kv_cache *short_ring = NULL, *other_sinks = NULL, *fits = NULL;
  CHECK_OK(hw_kv_cache_create_ring(1, 2, 4, 5, 2, HW_KV_FLOAT32, &short_ring));
  CHECK_OK(
      hw_kv_cache_create_ring(1, 2, 4, 10, 1, HW_KV_FLOAT32, &other_sinks));
  CHECK_OK(hw_kv_cache_create_ring(1, 2, 4, 6, 2, HW_KV_FLOAT32, &fits));
  CHECK_ERR(hw_attention_layer_forward(layer, short_ring, &s, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_forward: the layer's variants.window (4) must "
            "be in [1, capacity - n_sink_tokens = 3] with a ring cache");
  CHECK_ERR(hw_attention_layer_forward(layer, other_sinks, &s, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_forward: the layer's variants.n_sink_tokens "
            "(2) must equal the ring cache's n_sink_tokens (1)");
  CHECK_ERR(hw_attention_layer_forward(plain, fits, &s, 1, x, 0, y, 0),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_forward: the layer's variants.window (0) must "
            "be in [1, capacity - n_sink_tokens = 4]");
  CHECK(Length(short_ring, 0) == 0 && Length(other_sinks, 0) == 0 &&
        Length(fits, 0) == 0);
  int untouched = 1;
  for (int64_t i = 0; i < kN * 16; ++i) untouched &= y[i] == 7.0f;
  CHECK(untouched);
  /* A ring longer than the window with the layer's sinks is fine. */
  CHECK_OK(hw_attention_layer_forward(layer, fits, &s, 1, x, 0, y, 0));
  hw_kv_cache_destroy(short_ring);
  hw_kv_cache_destroy(other_sinks);
  hw_kv_cache_destroy(fits);

  /* hw_attention_layer_create_ring_cache's arguments. */
  hw_kv_cache* cache = NULL;
  CHECK_ERR(
      hw_attention_layer_create_ring_cache(plain, 1, HW_KV_FLOAT32, &cache),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_ring_cache: the layer has no sliding "
      "window (variants.window is 0)");
  CHECK_ERR(
      hw_attention_layer_create_ring_cache(NULL, 1, HW_KV_FLOAT32, &cache),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_ring_cache: layer is null");
  CHECK_ERR(hw_attention_layer_create_ring_cache(layer, 1, HW_KV_FLOAT32, NULL),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_ring_cache: out is null");
  CHECK_ERR(
      hw_attention_layer_create_ring_cache(layer, 0, HW_KV_FLOAT32, &cache),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_ring_cache: n_sequences must be >= 1 (got 0)");
  CHECK_ERR(hw_attention_layer_create_ring_cache(layer, 1, 9, &cache),
            HW_INVALID_ARGUMENT,
            "hw_attention_layer_create_ring_cache: dtype (9) is not a known "
            "hw_kv_dtype");
  CHECK(cache == NULL);

  /* n_sink_tokens in the variants. */
  hw_attention_layer* other = NULL;
  hw_attention_layer_variants bad = v;
  bad.n_sink_tokens = -1;
  CHECK_ERR(
      hw_attention_layer_create_with_variants(&config, &weights, &bad, &other),
      HW_INVALID_ARGUMENT,
      "hw_attention_layer_create_with_variants: variants.n_sink_tokens "
      "must be >= 0 (got -1)");
  CHECK(other == NULL);
  {
    hw_attention_layer_variants got;
    memset(&got, 0x5a, sizeof(got));
    got.struct_size = sizeof(got);
    CHECK_OK(hw_attention_layer_get_variants(layer, &got));
    CHECK(got.window == 4 && got.n_sink_tokens == 2);
    /* Version 1's size: n_sink_tokens is not written. */
    memset(&got, 0x5a, sizeof(got));
    got.struct_size = HW_ATTENTION_LAYER_VARIANTS_V1_SIZE;
    CHECK_OK(hw_attention_layer_get_variants(layer, &got));
    CHECK(got.struct_size == HW_ATTENTION_LAYER_VARIANTS_V1_SIZE &&
          got.window == 4);
    int64_t sentinel;
    memset(&sentinel, 0x5a, sizeof(sentinel));
    CHECK(got.n_sink_tokens == sentinel);
    /* Nor read: a version 1 caller's layer has no sink tokens. */
    hw_attention_layer_variants v1 = v;
    v1.struct_size = HW_ATTENTION_LAYER_VARIANTS_V1_SIZE;
    CHECK_OK(hw_attention_layer_create_with_variants(&config, &weights, &v1,
                                                     &other));
    got = NoVariants();
    if (other != NULL) CHECK_OK(hw_attention_layer_get_variants(other, &got));
    CHECK(got.window == 4 && got.n_sink_tokens == 0);
    hw_attention_layer_destroy(other);
  }
  free(x);
  free(y);
  hw_attention_layer_destroy(layer);
  hw_attention_layer_destroy(plain);
  FreeModel(&m);
}

/* The ring layer on every instruction set, float32 and bfloat16 caches. */
static void LayerRingOnTarget(void* model) {
  TestLayerRingOnTarget((Model*)model, HW_KV_FLOAT32);
  TestLayerRingOnTarget((Model*)model, HW_KV_BFLOAT16);
}

static void TestLayerRing(void) {
  Model m = MakeModel(32, 4, 2, 8, HW_MASK_CAUSAL, 1); /* GQA */
  OnEveryTarget(LayerRingOnTarget, &m);
  FreeModel(&m);
  TestLayerRingErrors();
}

static hw_out_matrix OutMatrix(float* data, int64_t rows, int64_t cols,
                               int64_t stride) {
  hw_out_matrix matrix;
  matrix.data = data;
  matrix.rows = rows;
  matrix.cols = cols;
  matrix.stride = stride;
  return matrix;
}

static hw_matrix StridedMatrix(const float* data, int64_t rows, int64_t cols,
                               int64_t stride) {
  hw_matrix matrix = Matrix(data, rows, cols);
  matrix.stride = stride;
  return matrix;
}

/* The n_sink_tokens of variants as a call reads it: 0 for NULL or a
 * struct_size of version 1. */
static int64_t SinkTokens(const hw_attention_variants* variants) {
  return variants != NULL &&
                 variants->struct_size >= HW_ATTENTION_VARIANTS_V2_SIZE
             ? variants->n_sink_tokens
             : 0;
}

/* float64 attention of one query (headway.h's formula) over the rows
 * appended to its sequence: k and v [length, G * hd] dense; q [n, H * hd]
 * row stride qs; mask [n, length] row stride ms, or NULL; the variants (or
 * NULL: none): a key at position <= p - window hidden (but for the first
 * n_sink_tokens), the score soft-capped
 * then plus slope_h * (k - p) before the mask, exp(sink_h) in each row's
 * softmax denominator. Writes out [n, H * hd] dense and, if not NULL,
 * weights [H * n, length] dense. */
static void ReferenceAttention(int64_t H, int64_t G, int64_t hd, int64_t length,
                               const float* k, const float* v, int64_t n,
                               int64_t q_pos0, const float* q, int64_t qs,
                               const float* mask, int64_t ms, int causal,
                               double scale,
                               const hw_attention_variants* variants,
                               double* out, double* weights) {
  const int64_t group = H / G;
  const int64_t window = variants != NULL ? variants->window : 0;
  const int64_t n_sinks = SinkTokens(variants);
  const double softcap = variants != NULL ? variants->softcap : 0.0;
  const float* slopes = variants != NULL ? variants->alibi_slopes : NULL;
  const float* sinks = variants != NULL ? variants->sink_logits : NULL;
  double* p = (double*)calloc((size_t)length, sizeof(double));
  if (p == NULL) exit(2);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = q_pos0 + t;
      double max = -INFINITY, sum = 0.0;
      for (int64_t s = 0; s < length; ++s) {
        double z = -INFINITY;
        if (Visible(s, pos, causal, window, n_sinks)) {
          double dot = 0.0;
          for (int64_t c = 0; c < hd; ++c) {
            dot += (double)q[t * qs + h * hd + c] * k[s * G * hd + g * hd + c];
          }
          z = VariantScore(scale * dot, h, s, pos, softcap, slopes) +
              (mask != NULL ? mask[t * ms + s] : 0.0);
        }
        p[s] = z;
        if (z > max) max = z;
      }
      /* A sink is a key of score sinks[h] and value 0; a row that sees no
       * key is zeros, sink or not. */
      if (sinks != NULL && max != -INFINITY && sinks[h] > max) max = sinks[h];
      for (int64_t s = 0; s < length; ++s) {
        p[s] = max == -INFINITY ? 0.0 : exp(p[s] - max);
        sum += p[s];
      }
      if (sinks != NULL && max != -INFINITY) sum += exp(sinks[h] - max);
      for (int64_t s = 0; s < length; ++s) {
        if (sum > 0.0) p[s] /= sum;
        if (weights != NULL) weights[(h * n + t) * length + s] = p[s];
      }
      for (int64_t c = 0; c < hd; ++c) {
        double acc = 0.0;
        for (int64_t s = 0; s < length; ++s) {
          acc += p[s] * v[s * G * hd + g * hd + c];
        }
        out[t * H * hd + h * hd + c] = acc;
      }
    }
  }
  free(p);
}

/* max |got - want| / max |want| of a float matrix (stride gs) against a
 * dense float64 one. */
static double DiffToReference(const float* got, int64_t gs, const double* want,
                              int64_t rows, int64_t cols) {
  float* want_f = FilledArray(rows * cols, 0.0f);
  for (int64_t i = 0; i < rows * cols; ++i) want_f[i] = (float)want[i];
  const double diff = NormwiseDiff(got, gs, want_f, cols, rows, cols);
  free(want_f);
  return diff;
}

/* The rows of sequence seq as the attention calls see them: float32, dense
 * [length, G * hd] (K if keys, else V), from the cache's stored rows. */
static float* DequantizedRows(const hw_kv_cache* cache, int keys, int64_t seq,
                              int64_t G, int64_t hd, int64_t length) {
  float* out = FilledArray(length * G * hd, NAN);
  for (int64_t g = 0; g < G; ++g) {
    int64_t rows = 0;
    float* head = LoadedRows(cache, keys, seq, g, hd, &rows);
    CHECK(rows == length);
    for (int64_t r = 0; r < length && r < rows; ++r) {
      memcpy(out + r * G * hd + g * hd, head + r * hd, hd * sizeof(float));
    }
    free(head);
  }
  return out;
}

/* GQA (4 query heads on 2 KV heads, head_dim 5) over a cache of three
 * sequences stored as dtype; one call with three queries (a prefill chunk with
 * a mask that has -inf entries and a fully masked row, a decode step without a
 * mask, a prefill from position 0 with a mask), causal and not, default and
 * given scale; and the materialised path. Against float64 attention over the
 * dequantized rows (the stored K and V as float32: the storage rounding is
 * the only difference from float32 storage), on the target active now, with
 * float32's tolerance. */
static void TestAttentionOnTarget(int dtype) {
  enum { H = 4, G = 2, D = 5, W = H * D, KW = G * D, kCap = 16, kQ = 3 };
  const int64_t lengths[kQ] = {10, 7, 3};
  const int64_t n_tokens[kQ] = {6, 1, 3};
  const int64_t q_pos0[kQ] = {4, 6, 0};
  const int has_mask[kQ] = {1, 0, 1};
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create_typed(kQ, G, D, kCap, dtype, &cache));
  if (cache == NULL) return;
  float *k[kQ], *v[kQ], *q[kQ], *out[kQ], *mask[kQ];
  int64_t qs[kQ], os[kQ], ms[kQ];
  hw_attention_query queries[kQ];
  for (int i = 0; i < kQ; ++i) {
    k[i] = RandomArray(lengths[i] * KW, 4.0f);
    v[i] = RandomArray(lengths[i] * KW, 2.0f);
    CHECK_OK(hw_kv_cache_append(cache, i, lengths[i], k[i], 0, v[i], 0));
    /* The reference reads the stored rows. */
    float* stored_k = DequantizedRows(cache, 1, i, G, D, lengths[i]);
    float* stored_v = DequantizedRows(cache, 0, i, G, D, lengths[i]);
    free(k[i]);
    free(v[i]);
    k[i] = stored_k;
    v[i] = stored_v;
    /* Padded strides for the first query, dense (0) for the others. */
    qs[i] = i == 0 ? W + 3 : W;
    os[i] = i == 0 ? W + 2 : W;
    ms[i] = i == 0 ? lengths[i] + 1 : lengths[i];
    q[i] = RandomArray(n_tokens[i] * qs[i], 4.0f);
    out[i] = FilledArray(n_tokens[i] * os[i], NAN);
    mask[i] = RandomArray(n_tokens[i] * ms[i], 2.0f);
    for (int64_t t = 0; t < n_tokens[i]; ++t) {
      for (int64_t s = 0; s < lengths[i]; ++s) {
        if ((t + 2 * s) % 5 == 1) mask[i][t * ms[i] + s] = -INFINITY;
      }
    }
    queries[i].seq = i;
    queries[i].q_pos0 = q_pos0[i];
    queries[i].q = StridedMatrix(q[i], n_tokens[i], W, i == 0 ? qs[i] : 0);
    queries[i].out = OutMatrix(out[i], n_tokens[i], W, i == 0 ? os[i] : 0);
    queries[i].mask = StridedMatrix(has_mask[i] ? mask[i] : NULL, n_tokens[i],
                                    lengths[i], i == 0 ? ms[i] : 0);
  }
  /* Query 0's row 2 sees nothing: zeros. */
  for (int64_t s = 0; s < lengths[0]; ++s) mask[0][2 * ms[0] + s] = -INFINITY;

  for (int variant = 0; variant < 3; ++variant) {
    hw_attention_options options;
    memset(&options, 0, sizeof(options)); /* zeroed: causal, default scale */
    if (variant == 1) options.mask = HW_MASK_NONE;
    if (variant == 2) options.scale = 0.3f;
    const int causal = options.mask == HW_MASK_CAUSAL;
    const double scale = variant == 2 ? 0.3f : 1.0 / sqrt((double)D);
    CHECK_OK(
        hw_attention(cache, H, queries, kQ, variant == 0 ? NULL : &options));
    for (int i = 0; i < kQ; ++i) {
      double* ref = (double*)calloc((size_t)(n_tokens[i] * W), sizeof(double));
      if (ref == NULL) exit(2);
      ReferenceAttention(H, G, D, lengths[i], k[i], v[i], n_tokens[i],
                         q_pos0[i], q[i], qs[i], has_mask[i] ? mask[i] : NULL,
                         ms[i], causal, scale, NULL, ref, NULL);
      const double diff = DiffToReference(out[i], os[i], ref, n_tokens[i], W);
      if (!(diff <= kTolerance)) {
        fprintf(stderr, "  %s, query %d, variant %d: diff %g\n",
                hw_kv_dtype_name(dtype), i, variant, diff);
      }
      CHECK(diff <= kTolerance);
      free(ref);
    }
    for (int64_t c = 0; c < W; ++c) CHECK(out[0][2 * os[0] + c] == 0.0f);
    CHECK(isnan(out[0][W]) && isnan(out[0][5 * os[0] + W + 1])); /* padding */

    /* The materialised path for query 0: its weights and its output. */
    const int64_t rows = H * n_tokens[0], ws = lengths[0] + 2;
    float* weights = FilledArray(rows * ws, NAN);
    float* out2 = FilledArray(n_tokens[0] * os[0], NAN);
    hw_attention_query one = queries[0];
    one.out.data = out2;
    CHECK_OK(hw_attention_with_weights(cache, H, &one,
                                       OutMatrix(weights, rows, lengths[0], ws),
                                       variant == 0 ? NULL : &options));
    double* ref = (double*)calloc((size_t)(n_tokens[0] * W), sizeof(double));
    double* ref_w =
        (double*)calloc((size_t)(rows * lengths[0]), sizeof(double));
    if (ref == NULL || ref_w == NULL) exit(2);
    ReferenceAttention(H, G, D, lengths[0], k[0], v[0], n_tokens[0], q_pos0[0],
                       q[0], qs[0], mask[0], ms[0], causal, scale, NULL, ref,
                       ref_w);
    CHECK(DiffToReference(out2, os[0], ref, n_tokens[0], W) <= kTolerance);
    CHECK(DiffToReference(weights, ws, ref_w, rows, lengths[0]) <= kTolerance);
    CHECK(isnan(weights[lengths[0]]) && isnan(weights[ws - 1]));
    free(ref);
    free(ref_w);
    free(weights);
    free(out2);
  }
  for (int i = 0; i < kQ; ++i) CHECK(Length(cache, i) == lengths[i]);
  for (int i = 0; i < kQ; ++i) {
    free(k[i]);
    free(v[i]);
    free(q[i]);
    free(out[i]);
    free(mask[i]);
  }
  hw_kv_cache_destroy(cache);
}

static void AttentionOnTarget(void* unused) {
  (void)unused;
  for (int i = 0; i < 4; ++i) TestAttentionOnTarget(kDtypes[i]);
}

static void TestAttention(void) { OnEveryTarget(AttentionOnTarget, NULL); }

/* ------------------------------------------------- Attention variants */

/* Options and variants for one run of the core calls, named for reports. */
typedef struct AttnVariantSet {
  const char* name;
  int32_t mask;
  float scale; /* 0: 1 / sqrt(head_dim) */
  hw_attention_variants v;
} AttnVariantSet;

/* A zeroed hw_attention_variants of this header's size: every variant off. */
static hw_attention_variants NoAttnVariants(void) {
  hw_attention_variants v;
  memset(&v, 0, sizeof(v));
  v.struct_size = sizeof(v);
  return v;
}

/* The attention variants on GQA (8 query heads on 2 KV heads, head_dim 5)
 * over a cache of three sequences stored as dtype, in one call with three
 * queries: a prefill chunk of 20 tokens at positions 280 .. 299 of 300 with
 * a mask that has -inf entries and a fully masked row (a window of 100 leaves
 * the first 128-key block unseen), a decode step at position 1299 of 1300
 * (three 512-key chunks merged; a window of 700 spans two) and a prefill of 9
 * tokens from position 0 with a mask. Against the float64 reference over the
 * dequantized rows, on the target active now, with float32's tolerance; then
 * the materialised path: its output, its weights (exactly 0 where a key is
 * hidden, rows summing to 1 minus the sink's share); normwise differences
 * observed up to 1.2e-6 on every target and type (kTolerance: 1e-4). First,
 * no variants however asked (NULL, zeroed, version 1's size, a newer
 * header's longer struct with zero tail) give the plain calls' results bit
 * for bit. */
static void TestAttentionVariantsOnTarget(int dtype, const AttnVariantSet* sets,
                                          int n_sets) {
  enum { H = 8, G = 2, D = 5, W = H * D, KW = G * D, kCap = 1300, kQ = 3 };
  const int64_t lengths[kQ] = {300, 1300, 9};
  const int64_t n_tokens[kQ] = {20, 1, 9};
  const int64_t q_pos0[kQ] = {280, 1299, 0};
  const int has_mask[kQ] = {1, 0, 1};
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create_typed(kQ, G, D, kCap, dtype, &cache));
  if (cache == NULL) return;
  float *k[kQ], *v[kQ], *q[kQ], *out[kQ], *mask[kQ];
  int64_t qs[kQ], ms[kQ];
  hw_attention_query queries[kQ];
  for (int i = 0; i < kQ; ++i) {
    float* k0 = RandomArray(lengths[i] * KW, 4.0f);
    float* v0 = RandomArray(lengths[i] * KW, 2.0f);
    CHECK_OK(hw_kv_cache_append(cache, i, lengths[i], k0, 0, v0, 0));
    free(k0);
    free(v0);
    /* The reference reads the stored rows. */
    k[i] = DequantizedRows(cache, 1, i, G, D, lengths[i]);
    v[i] = DequantizedRows(cache, 0, i, G, D, lengths[i]);
    /* Padded strides for the first query, dense (0) for the others. */
    qs[i] = i == 0 ? W + 3 : W;
    ms[i] = i == 0 ? lengths[i] + 1 : lengths[i];
    q[i] = RandomArray(n_tokens[i] * qs[i], 4.0f);
    out[i] = FilledArray(n_tokens[i] * W, NAN);
    mask[i] = RandomArray(n_tokens[i] * ms[i], 2.0f);
    for (int64_t t = 0; t < n_tokens[i]; ++t) {
      for (int64_t s = 0; s < lengths[i]; ++s) {
        if ((t + 2 * s) % 7 == 1) mask[i][t * ms[i] + s] = -INFINITY;
      }
    }
    queries[i].seq = i;
    queries[i].q_pos0 = q_pos0[i];
    queries[i].q = StridedMatrix(q[i], n_tokens[i], W, i == 0 ? qs[i] : 0);
    queries[i].out = OutMatrix(out[i], n_tokens[i], W, 0);
    queries[i].mask = StridedMatrix(has_mask[i] ? mask[i] : NULL, n_tokens[i],
                                    lengths[i], i == 0 ? ms[i] : 0);
  }
  /* Query 0's row 2 sees nothing: zeros, with a sink too. */
  for (int64_t s = 0; s < lengths[0]; ++s) mask[0][2 * ms[0] + s] = -INFINITY;

  /* No variants: the plain calls' bits. */
  {
    typedef struct Longer {
      hw_attention_variants v;
      unsigned char tail[24]; /* a later version's fields, zero: off */
    } Longer;
    Longer longer;
    memset(&longer, 0, sizeof(longer));
    longer.v.struct_size = sizeof(longer);
    hw_attention_variants zeroed = NoAttnVariants();
    hw_attention_variants v1 = NoAttnVariants();
    v1.struct_size = HW_ATTENTION_VARIANTS_V1_SIZE;
    const hw_attention_variants* asks[4] = {NULL, &zeroed, &v1, &longer.v};
    const int64_t rows = H * n_tokens[0], length = lengths[0];
    float* want[kQ];
    float* want_w = FilledArray(rows * length, NAN);
    float* want_o = FilledArray(n_tokens[0] * W, NAN);
    float* got_w = FilledArray(rows * length, NAN);
    hw_attention_query one = queries[0];
    CHECK_OK(hw_attention(cache, H, queries, kQ, NULL));
    for (int i = 0; i < kQ; ++i) {
      want[i] = FilledArray(n_tokens[i] * W, NAN);
      memcpy(want[i], out[i], (size_t)(n_tokens[i] * W) * sizeof(float));
    }
    one.out.data = want_o;
    CHECK_OK(hw_attention_with_weights(
        cache, H, &one, OutMatrix(want_w, rows, length, 0), NULL));
    one.out.data = out[0];
    for (int a = 0; a < 4; ++a) {
      for (int i = 0; i < kQ; ++i) {
        for (int64_t e = 0; e < n_tokens[i] * W; ++e) out[i][e] = NAN;
      }
      CHECK_OK(
          hw_attention_with_variants(cache, H, queries, kQ, NULL, asks[a]));
      for (int i = 0; i < kQ; ++i) {
        CHECK(memcmp(out[i], want[i],
                     (size_t)(n_tokens[i] * W) * sizeof(float)) == 0);
      }
      for (int64_t e = 0; e < rows * length; ++e) got_w[e] = NAN;
      CHECK_OK(hw_attention_with_weights_and_variants(
          cache, H, &one, OutMatrix(got_w, rows, length, 0), NULL, asks[a]));
      CHECK(memcmp(got_w, want_w, (size_t)(rows * length) * sizeof(float)) ==
                0 &&
            memcmp(out[0], want_o, (size_t)(n_tokens[0] * W) * sizeof(float)) ==
                0);
    }
    for (int i = 0; i < kQ; ++i) free(want[i]);
    free(want_w);
    free(want_o);
    free(got_w);
  }

  for (int si = 0; si < n_sets; ++si) {
    const AttnVariantSet* set = &sets[si];
    const hw_attention_variants* var = &set->v;
    hw_attention_options options;
    memset(&options, 0, sizeof(options));
    options.mask = set->mask;
    options.scale = set->scale;
    const int causal = set->mask == HW_MASK_CAUSAL;
    const double scale =
        set->scale != 0.0f ? (double)set->scale : 1.0 / sqrt((double)D);
    const int before = g_failures;
    double min_row_sum = 1.0; /* over the rows that see a key */
    for (int i = 0; i < kQ; ++i) {
      for (int64_t e = 0; e < n_tokens[i] * W; ++e) out[i][e] = NAN;
    }
    CHECK_OK(hw_attention_with_variants(cache, H, queries, kQ, &options, var));
    for (int i = 0; i < kQ; ++i) {
      const int64_t n = n_tokens[i], length = lengths[i];
      const int64_t rows = H * n, ws = length + 2;
      const float* qmask = has_mask[i] ? mask[i] : NULL;
      double* ref = (double*)calloc((size_t)(n * W), sizeof(double));
      double* ref_w = (double*)calloc((size_t)(rows * length), sizeof(double));
      if (ref == NULL || ref_w == NULL) exit(2);
      ReferenceAttention(H, G, D, length, k[i], v[i], n, q_pos0[i], q[i], qs[i],
                         qmask, ms[i], causal, scale, var, ref, ref_w);
      const double diff = DiffToReference(out[i], W, ref, n, W);
      if (!(diff <= kTolerance)) {
        fprintf(stderr, "  query %d: diff %g\n", i, diff);
      }
      CHECK(diff <= kTolerance);

      /* The materialised path. */
      float* weights = FilledArray(rows * ws, NAN);
      float* out2 = FilledArray(n * W, NAN);
      hw_attention_query one = queries[i];
      one.out = OutMatrix(out2, n, W, 0);
      CHECK_OK(hw_attention_with_weights_and_variants(
          cache, H, &one, OutMatrix(weights, rows, length, ws), &options, var));
      CHECK(DiffToReference(out2, W, ref, n, W) <= kTolerance);
      CHECK(DiffToReference(weights, ws, ref_w, rows, length) <= kTolerance);
      int hidden_zero = 1;
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < n; ++t) {
          const float* w = weights + (h * n + t) * ws;
          const double* rw = ref_w + (h * n + t) * length;
          double got_sum = 0.0, want_sum = 0.0;
          for (int64_t s = 0; s < length; ++s) {
            if (!Visible(s, q_pos0[i] + t, causal, var->window,
                         SinkTokens(var))) {
              hidden_zero &= w[s] == 0.0f;
            }
            got_sum += w[s];
            want_sum += rw[s];
          }
          /* want_sum: 1 minus the sink's share (0 for a row that sees no
           * key). */
          CHECK(fabs(got_sum - want_sum) <= kTolerance);
          if (want_sum > 0.0 && want_sum < min_row_sum) min_row_sum = want_sum;
        }
      }
      CHECK(hidden_zero);
      if (i == 0) { /* the row that sees nothing */
        for (int64_t c = 0; c < W; ++c) {
          CHECK(out[0][2 * W + c] == 0.0f && out2[2 * W + c] == 0.0f);
        }
      }
      free(weights);
      free(out2);
      free(ref);
      free(ref_w);
    }
    /* Without sinks the rows sum to 1; with them (one head's sink of 8
     * takes a large share), some row visibly less. */
    if (var->sink_logits == NULL) {
      CHECK(min_row_sum > 1.0 - 1e-9);
    } else {
      CHECK(min_row_sum < 0.9);
    }
    if (g_failures != before) {
      fprintf(stderr, "  (the failures above are of %s, %s)\n", set->name,
              hw_kv_dtype_name(dtype));
    }
  }
  for (int i = 0; i < kQ; ++i) CHECK(Length(cache, i) == lengths[i]);
  for (int i = 0; i < kQ; ++i) {
    free(k[i]);
    free(v[i]);
    free(q[i]);
    free(out[i]);
    free(mask[i]);
  }
  hw_kv_cache_destroy(cache);
}

/* Each variant alone and all together, causal and not, on every target and
 * stored type. */
enum { kAttnVariantSets = 11 };

/* TestAttentionVariantsOnTarget of the kAttnVariantSets sets at context for
 * every dtype. */
static void AttentionVariantsOnTarget(void* sets) {
  for (int i = 0; i < 4; ++i) {
    TestAttentionVariantsOnTarget(kDtypes[i], (const AttnVariantSet*)sets,
                                  kAttnVariantSets);
  }
}

static void TestAttentionVariants(void) {
  float slopes[8];
  const float sinks[8] = {0.5f, -1.0f, 2.0f, 8.0f, 0.0f, 3.0f, -4.0f, 1.0f};
  CHECK_OK(hw_alibi_slopes(8, slopes)); /* 2^-1 .. 2^-8 */
  enum { kSets = kAttnVariantSets };
  AttnVariantSet sets[kSets];
  for (int i = 0; i < kSets; ++i) {
    memset(&sets[i], 0, sizeof(sets[i]));
    sets[i].v = NoAttnVariants();
  }
  sets[0].name = "window 100";
  sets[0].v.window = 100;
  sets[1].name = "window 1"; /* a query sees itself alone */
  sets[1].v.window = 1;
  sets[2].name = "window 5, HW_MASK_NONE"; /* keys after p, none <= p - 5 */
  sets[2].mask = HW_MASK_NONE;
  sets[2].v.window = 5;
  sets[3].name = "softcap 1.5"; /* the scores reach about 9 */
  sets[3].v.softcap = 1.5f;
  sets[4].name = "ALiBi";
  sets[4].v.alibi_slopes = slopes;
  sets[5].name = "sinks";
  sets[5].v.sink_logits = sinks;
  sets[6].name = "all, window 700, scale 0.3";
  sets[6].scale = 0.3f;
  sets[6].v.window = 700;
  sets[6].v.softcap = 3.0f;
  sets[6].v.alibi_slopes = slopes;
  sets[6].v.sink_logits = sinks;
  sets[7].name = "all, window 50, HW_MASK_NONE";
  sets[7].mask = HW_MASK_NONE;
  sets[7].v = sets[6].v;
  sets[7].v.window = 50;
  sets[8].name = "window past the cache, softcap, sinks"; /* sees all */
  sets[8].v.window = 5000;
  sets[8].v.softcap = 20.0f;
  sets[8].v.sink_logits = sinks;
  /* StreamingLLM's sink tokens: the first keys stay visible. */
  sets[9].name = "window 100, 4 sink tokens";
  sets[9].v.window = 100;
  sets[9].v.n_sink_tokens = 4;
  sets[10].name = "all, window 200, 130 sink tokens, HW_MASK_NONE";
  sets[10].mask = HW_MASK_NONE;
  sets[10].v = sets[6].v;
  sets[10].v.window = 200;
  sets[10].v.n_sink_tokens = 130; /* past the first 128-key block */

  OnEveryTarget(AttentionVariantsOnTarget, sets);
}

/* hw_alibi_slopes: the paper's slopes, and its errors. */
static void TestAlibiSlopes(void) {
  float s[16];
  CHECK_OK(hw_alibi_slopes(8, s));
  for (int h = 0; h < 8; ++h) CHECK(s[h] == ldexpf(1.0f, -(h + 1)));
  CHECK_OK(hw_alibi_slopes(1, s));
  CHECK(s[0] == 1.0f / 256.0f);
  CHECK_OK(hw_alibi_slopes(4, s));
  CHECK(s[0] == 0.25f && s[1] == 1.0f / 16 && s[2] == 1.0f / 64 &&
        s[3] == 1.0f / 256);
  /* Not a power of two: 4's slopes, then every other one of 8's. */
  CHECK_OK(hw_alibi_slopes(6, s));
  CHECK(s[0] == 0.25f && s[3] == 1.0f / 256 && s[4] == 0.5f && s[5] == 0.125f);
  /* 12: 8's, then 16's odd ones, 2^-0.5 .. 2^-3.5 (to float's rounding). */
  CHECK_OK(hw_alibi_slopes(12, s));
  for (int h = 0; h < 8; ++h) CHECK(s[h] == ldexpf(1.0f, -(h + 1)));
  for (int h = 8; h < 12; ++h) {
    const double want = exp2(-0.5 - (h - 8));
    CHECK(fabs(s[h] - want) <= want * 6e-8);
  }

  for (int h = 0; h < 16; ++h) s[h] = 7.0f;
  CHECK_ERR(hw_alibi_slopes(0, s), HW_INVALID_ARGUMENT,
            "hw_alibi_slopes: n_heads must be >= 1 (got 0)");
  CHECK_ERR(hw_alibi_slopes(-3, s), HW_INVALID_ARGUMENT,
            "hw_alibi_slopes: n_heads must be >= 1 (got -3)");
  CHECK_ERR(hw_alibi_slopes(4, NULL), HW_INVALID_ARGUMENT,
            "hw_alibi_slopes: slopes is null");
  CHECK(s[0] == 7.0f && s[15] == 7.0f);
}

/* An attention_compute mode on a cache of its dtype, GQA-4 decode (q, K and
 * V in [-1, 1], D = 64, scale 1/8): within `bound` of the float32 products
 * (attention.h's AttentionCompute bounds), and not the same bits; a version
 * 2 struct_size leaves a garbage attention_compute unread. */
static void CheckAttentionCompute(hw_kv_dtype dtype, int32_t compute,
                                  double bound) {
  enum { H = 8, G = 2, D = 64, W = H * D, L = 300 };
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create_typed(1, G, D, L, dtype, &cache));
  if (cache == NULL) return;
  float* k = RandomArray(L * G * D, 1.0f);
  float* v = RandomArray(L * G * D, 1.0f);
  CHECK_OK(hw_kv_cache_append(cache, 0, L, k, 0, v, 0));
  float* q = RandomArray(W, 1.0f);
  float* want = FilledArray(W, 7.0f);
  float* got = FilledArray(W, 7.0f);
  hw_attention_query query;
  query.seq = 0;
  query.q_pos0 = L - 1;
  query.q = Matrix(q, 1, W);
  query.mask = Matrix(NULL, 0, 0);
  hw_attention_variants var = NoAttnVariants();
  query.out = OutMatrix(want, 1, W, 0);
  CHECK_OK(hw_attention_with_variants(cache, H, &query, 1, NULL, &var));
  var.attention_compute = compute;
  query.out = OutMatrix(got, 1, W, 0);
  CHECK_OK(hw_attention_with_variants(cache, H, &query, 1, NULL, &var));
  double worst = 0.0;
  for (int i = 0; i < W; ++i) {
    const double diff = fabs((double)got[i] - (double)want[i]);
    if (diff > worst) worst = diff;
  }
  CHECK(worst <= bound && worst > 0.0);
  var.struct_size = HW_ATTENTION_VARIANTS_V2_SIZE;
  var.attention_compute = 7;
  CHECK_OK(hw_attention_with_variants(cache, H, &query, 1, NULL, &var));
  CHECK(memcmp(got, want, sizeof(float) * W) == 0);
  free(k);
  free(v);
  free(q);
  free(want);
  free(got);
  hw_kv_cache_destroy(cache);
}

/* bf16: each score moves by at most 2^-9 * 64 / 8 = 2^-6, so an output by
 * (e^(2^-5) (1 + 2^-9) - 1) = 3.4e-2 of |V|max = 1. int8: by at most
 * (1/8) (1/254 + 2^-22) * 64 = 3.2e-2, so an output by e^(6.3e-2) - 1 =
 * 6.5e-2. */
static void TestAttentionCompute(void) {
  CheckAttentionCompute(HW_KV_BFLOAT16, HW_ATTENTION_BFLOAT16, 3.4e-2);
  CheckAttentionCompute(HW_KV_INT8, HW_ATTENTION_INT8, 6.5e-2);
}

/* The variants' errors on the core calls: named as the C caller's fields,
 * nothing written. */
static void TestAttentionVariantErrors(void) {
  enum { H = 4, G = 2, D = 4, W = H * D, N = 3, L = 5 };
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create(1, G, D, 8, &cache));
  if (cache == NULL) return;
  float* kv = RandomArray(L * G * D, 1.0f);
  CHECK_OK(hw_kv_cache_append(cache, 0, L, kv, 0, kv, 0));
  float* q = RandomArray(N * W, 1.0f);
  float* out = FilledArray(N * W, 7.0f);
  float* weights = FilledArray(H * N * L, 7.0f);
  float slopes[H] = {0.5f, 0.25f, -0.125f, 0.0f};
  float sinks[H] = {0.0f, 1.0f, -1.0f, 2.0f};
  hw_attention_query good;
  good.seq = 0;
  good.q_pos0 = 2;
  good.q = Matrix(q, N, W);
  good.out = OutMatrix(out, N, W, 0);
  good.mask = Matrix(NULL, 0, 0);
  const hw_out_matrix w = OutMatrix(weights, H * N, L, 0);
  hw_attention_options options;
  memset(&options, 0, sizeof(options));
  hw_attention_variants v = NoAttnVariants();
  char needle[200];

  CHECK_ERR(hw_attention_with_variants(NULL, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT, "hw_attention_with_variants: cache is null");
  CHECK_ERR(hw_attention_with_weights_and_variants(cache, H, NULL, w, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_weights_and_variants: query is null");

  /* struct_size. */
  v.struct_size = 0;
  snprintf(needle, sizeof(needle),
           "hw_attention_with_variants: variants.struct_size (0) is smaller "
           "than version 1's (%u): set it to sizeof(hw_attention_variants)",
           (unsigned)HW_ATTENTION_VARIANTS_V1_SIZE);
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT, needle);
  CHECK_ERR(
      hw_attention_with_weights_and_variants(cache, H, &good, w, NULL, &v),
      HW_INVALID_ARGUMENT,
      "hw_attention_with_weights_and_variants: variants.struct_size (0)");
  v.struct_size = HW_ATTENTION_VARIANTS_V1_SIZE - 1;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT, "variants.struct_size");
  v.struct_size = 4097;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "variants.struct_size (4097) is larger than 4096");
  {
    struct {
      hw_attention_variants v;
      unsigned char tail[16];
    } longer;
    memset(&longer, 0, sizeof(longer));
    longer.v.struct_size = sizeof(longer);
    longer.tail[5] = 1; /* a variant this library does not know, on */
    snprintf(needle, sizeof(needle),
             "hw_attention_with_variants: variants.struct_size (%u) is larger "
             "than this library's (%u) and byte %u is not zero",
             (unsigned)sizeof(longer), (unsigned)sizeof(hw_attention_variants),
             (unsigned)sizeof(hw_attention_variants) + 5);
    CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &longer.v),
              HW_INVALID_ARGUMENT, needle);
    CHECK_ERR(hw_attention_with_weights_and_variants(cache, H, &good, w, NULL,
                                                     &longer.v),
              HW_INVALID_ARGUMENT, "is not zero");
  }

  /* The fields, checked by the C++ call, named as the C caller's. */
  v = NoAttnVariants();
  v.window = -1;
  CHECK_ERR(
      hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
      HW_INVALID_ARGUMENT,
      "hw_attention_with_variants: variants.window must be >= 0 (got -1)");
  CHECK_ERR(
      hw_attention_with_weights_and_variants(cache, H, &good, w, NULL, &v),
      HW_INVALID_ARGUMENT,
      "hw_attention_with_weights_and_variants: variants.window must be "
      ">= 0 (got -1)");
  v.window = 0;
  v.softcap = NAN;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.softcap must be finite and "
            ">= 0");
  v.softcap = -2.0f;
  CHECK_ERR(
      hw_attention_with_weights_and_variants(cache, H, &good, w, NULL, &v),
      HW_INVALID_ARGUMENT, "variants.softcap must be finite and >= 0");
  v.softcap = INFINITY;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT, "variants.softcap must be finite");
  v.softcap = 0.0f;
  /* attention_compute: a hw_attention_compute, and HW_ATTENTION_BFLOAT16
   * needs a bfloat16 cache, HW_ATTENTION_INT8 an int8 one (this one is
   * float32). */
  v.attention_compute = 5;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.attention_compute is not an "
            "hw_attention_compute (got 5)");
  v.attention_compute = HW_ATTENTION_BFLOAT16;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.attention_compute "
            "HW_ATTENTION_BFLOAT16 needs a bfloat16 cache (got float32)");
  v.attention_compute = HW_ATTENTION_INT8;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.attention_compute "
            "HW_ATTENTION_INT8 needs an int8 cache (got float32)");
  v.attention_compute = HW_ATTENTION_FLOAT32;
  v.alibi_slopes = slopes;
  v.sink_logits = sinks;
  slopes[2] = NAN;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.alibi_slopes[2] is not "
            "finite");
  slopes[2] = -0.125f;
  slopes[1] = -INFINITY;
  CHECK_ERR(
      hw_attention_with_weights_and_variants(cache, H, &good, w, NULL, &v),
      HW_INVALID_ARGUMENT, "variants.alibi_slopes[1] is not finite");
  slopes[1] = 0.25f;
  sinks[3] = INFINITY;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.sink_logits[3] is not "
            "finite");
  sinks[3] = 2.0f;
  sinks[0] = NAN;
  CHECK_ERR(
      hw_attention_with_weights_and_variants(cache, H, &good, w, NULL, &v),
      HW_INVALID_ARGUMENT, "variants.sink_logits[0] is not finite");
  sinks[0] = 0.0f;
  /* hw_attention's own errors, in this function's name. */
  CHECK_ERR(hw_attention_with_variants(cache, 3, &good, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: n_heads (3) is not a multiple");
  options.mask = 7;
  CHECK_ERR(hw_attention_with_variants(cache, H, &good, 1, &options, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: options.mask is not an "
            "hw_attention_mask (got 7)");
  CHECK_ERR(
      hw_attention_with_weights_and_variants(cache, H, &good, w, &options, &v),
      HW_INVALID_ARGUMENT,
      "hw_attention_with_weights_and_variants: options.mask is not an "
      "hw_attention_mask");
  options.mask = HW_MASK_CAUSAL;

  /* Nothing was written. */
  int untouched = 1;
  for (int64_t i = 0; i < N * W; ++i) untouched &= out[i] == 7.0f;
  for (int64_t i = 0; i < H * N * L; ++i) untouched &= weights[i] == 7.0f;
  CHECK(untouched);

  /* The good calls work: negative slopes and sinks are fine. */
  v.window = 2;
  v.softcap = 10.0f;
  CHECK_OK(hw_attention_with_variants(cache, H, &good, 1, &options, &v));
  CHECK_OK(
      hw_attention_with_weights_and_variants(cache, H, &good, w, &options, &v));
  CHECK(out[0] != 7.0f && weights[0] != 7.0f);
  /* Row 0 (position 2) sees keys 1 and 2 of 5: weights of keys 0, 3 and 4
   * are 0. */
  CHECK(weights[0] == 0.0f && weights[3] == 0.0f && weights[4] == 0.0f &&
        weights[1] > 0.0f && weights[2] > 0.0f);

  free(kv);
  free(q);
  free(out);
  free(weights);
  hw_kv_cache_destroy(cache);
}

/* Bad calls: an error naming the C argument, nothing written. */
/* ----------------------------------------------------- Attention, ring */

/* hw_attention_with_variants with a window of 5 and 2 sink tokens on a ring
 * cache of 9 rows (a ring of 7) against the same calls on a plain cache
 * holding all 48 positions, both of dtype and appended alike: sequence 1 in
 * chunks of 1 to 3 tokens (at most capacity - n_sink_tokens - window + 1 =
 * 3, so that each query finds its window), each chunk's queries attended
 * right after, some steps with soft-capping and ALiBi or HW_MASK_NONE; the
 * ring wraps six times. The two differ in float32 summation order only
 * (kTolerance). Sequence 0 appended in one go: its last 3 tokens can attend,
 * its last 4 cannot (HW_OUT_OF_RANGE). Version 1's struct_size reads no
 * n_sink_tokens: a ring rejects it, a plain cache attends without sinks. */
static void TestAttentionRingOnTarget(int dtype) {
  enum {
    H = 4,
    G = 2,
    D = 6,
    W = H * D,
    KW = G * D,
    kWindow = 5,
    kSinks = 2,
    kCap = kWindow + kSinks + 2,
    kRing = kCap - kSinks,
    kTotal = 48
  };
  hw_kv_cache *ring = NULL, *plain = NULL;
  CHECK_OK(hw_kv_cache_create_ring(2, G, D, kCap, kSinks, dtype, &ring));
  CHECK_OK(hw_kv_cache_create_typed(2, G, D, kTotal, dtype, &plain));
  if (ring == NULL || plain == NULL) {
    hw_kv_cache_destroy(ring);
    hw_kv_cache_destroy(plain);
    return;
  }
  float slopes[H];
  CHECK_OK(hw_alibi_slopes(H, slopes));
  float* k = RandomArray(kTotal * KW, 4.0f);
  float* v = RandomArray(kTotal * KW, 2.0f);
  float* q = RandomArray(kTotal * W, 4.0f);
  float* got = FilledArray(kTotal * W, NAN);
  float* want = FilledArray(kTotal * W, NAN);
  hw_attention_variants var = NoAttnVariants();
  var.window = kWindow;
  var.n_sink_tokens = kSinks;
  hw_attention_options options;
  memset(&options, 0, sizeof(options));
  hw_attention_query query;
  query.seq = 1;
  query.mask = Matrix(NULL, 0, 0);
  double worst = 0.0;
  int64_t length = 0;
  for (int step = 0; length < kTotal; ++step) {
    int64_t n = 1 + step % 3;
    if (n > kTotal - length) n = kTotal - length;
    CHECK_OK(
        hw_kv_cache_append(ring, 1, n, k + length * KW, 0, v + length * KW, 0));
    CHECK_OK(hw_kv_cache_append(plain, 1, n, k + length * KW, 0,
                                v + length * KW, 0));
    var.softcap = step % 2 == 1 ? 2.0f : 0.0f;
    var.alibi_slopes = step % 2 == 1 ? slopes : NULL;
    options.mask = step % 4 == 3 ? HW_MASK_NONE : HW_MASK_CAUSAL;
    query.q_pos0 = length;
    query.q = Matrix(q + length * W, n, W);
    query.out = OutMatrix(got + length * W, n, W, 0);
    CHECK_OK(hw_attention_with_variants(ring, H, &query, 1, &options, &var));
    query.out.data = want + length * W;
    CHECK_OK(hw_attention_with_variants(plain, H, &query, 1, &options, &var));
    const double diff =
        NormwiseDiff(got + length * W, W, want + length * W, W, n, W);
    if (!(diff <= worst)) worst = diff; /* NaN sticks */
    length += n;
  }
  if (!(worst <= kTolerance)) {
    fprintf(stderr, "  ring attention, %s: diff %g\n", hw_kv_dtype_name(dtype),
            worst);
  }
  CHECK(worst <= kTolerance);
  {
    int64_t ring_begin = -1;
    CHECK_OK(hw_kv_cache_ring_state(ring, 1, &ring_begin, NULL, NULL));
    CHECK(ring_begin == kTotal - kRing);
  }

  /* Sequence 0 in one append: the ring holds positions 41 .. 47 and the
   * sinks. */
  var.softcap = 0.0f;
  var.alibi_slopes = NULL;
  options.mask = HW_MASK_CAUSAL;
  CHECK_OK(hw_kv_cache_append(ring, 0, kTotal, k, 0, v, 0));
  CHECK_OK(hw_kv_cache_append(plain, 0, kTotal, k, 0, v, 0));
  query.seq = 0;
  query.q_pos0 = kTotal - 4; /* its window starts at 40 */
  query.q = Matrix(q, 4, W);
  query.out = OutMatrix(got, 4, W, 0);
  for (int64_t i = 0; i < 4 * W; ++i) got[i] = 7.0f;
  CHECK_ERR(hw_attention_with_variants(ring, H, &query, 1, &options, &var),
            HW_OUT_OF_RANGE,
            "hw_attention_with_variants: queries[0]: the query at position 44 "
            "sees keys from position 40 on, but the ring of sequence 0 holds "
            "them from 41 on");
  int untouched = 1;
  for (int64_t i = 0; i < 4 * W; ++i) untouched &= got[i] == 7.0f;
  CHECK(untouched);
  query.q_pos0 = kTotal - 3;
  query.q = Matrix(q, 3, W);
  query.out = OutMatrix(got, 3, W, 0);
  CHECK_OK(hw_attention_with_variants(ring, H, &query, 1, &options, &var));
  query.out.data = want;
  CHECK_OK(hw_attention_with_variants(plain, H, &query, 1, &options, &var));
  CHECK(NormwiseDiff(got, W, want, W, 3, W) <= kTolerance);

  /* Version 1's struct_size: n_sink_tokens not read. */
  {
    hw_attention_variants v1 = var;
    hw_attention_variants no_sinks = var;
    v1.struct_size = HW_ATTENTION_VARIANTS_V1_SIZE;
    no_sinks.n_sink_tokens = 0;
    CHECK_ERR(hw_attention_with_variants(ring, H, &query, 1, &options, &v1),
              HW_INVALID_ARGUMENT,
              "hw_attention_with_variants: variants.n_sink_tokens (0) must "
              "equal the ring cache's n_sink_tokens (2)");
    float* with_v1 = FilledArray(3 * W, NAN);
    query.out.data = with_v1;
    CHECK_OK(hw_attention_with_variants(plain, H, &query, 1, &options, &v1));
    query.out.data = got;
    CHECK_OK(
        hw_attention_with_variants(plain, H, &query, 1, &options, &no_sinks));
    CHECK(memcmp(with_v1, got, (size_t)(3 * W) * sizeof(float)) == 0);
    /* ... and the sinks do change the outputs there. */
    CHECK(memcmp(with_v1, want, (size_t)(3 * W) * sizeof(float)) != 0);
    free(with_v1);
  }
  free(k);
  free(v);
  free(q);
  free(got);
  free(want);
  hw_kv_cache_destroy(ring);
  hw_kv_cache_destroy(plain);
}

/* What a ring cache rejects (nothing written): hw_attention (no window), a
 * window of 0 or past capacity - n_sink_tokens, other sink tokens, a mask,
 * the materialised path; n_sink_tokens < 0 on any cache. */
static void TestAttentionRingErrors(void) {
  enum { H = 4, G = 2, D = 4, W = H * D, N = 2, kCap = 9, kSinks = 2 };
  hw_kv_cache *ring = NULL, *plain = NULL;
  CHECK_OK(
      hw_kv_cache_create_ring(1, G, D, kCap, kSinks, HW_KV_FLOAT32, &ring));
  CHECK_OK(hw_kv_cache_create(1, G, D, 16, &plain));
  if (ring == NULL || plain == NULL) {
    hw_kv_cache_destroy(ring);
    hw_kv_cache_destroy(plain);
    return;
  }
  float* kv = RandomArray(12 * G * D, 1.0f);
  CHECK_OK(hw_kv_cache_append(ring, 0, 12, kv, 0, kv, 0));
  CHECK_OK(hw_kv_cache_append(plain, 0, 12, kv, 0, kv, 0));
  float* q = RandomArray(N * W, 1.0f);
  float* out = FilledArray(N * W, 7.0f);
  float* mask = RandomArray(N * 12, 1.0f);
  float* weights = FilledArray(H * N * 12, 7.0f);
  const hw_out_matrix w = OutMatrix(weights, H * N, 12, 0);
  hw_attention_query query;
  query.seq = 0;
  query.q_pos0 = 12 - N;
  query.q = Matrix(q, N, W);
  query.out = OutMatrix(out, N, W, 0);
  query.mask = Matrix(NULL, 0, 0);
  hw_attention_variants v = NoAttnVariants();
  v.window = 4;
  v.n_sink_tokens = kSinks;

  CHECK_ERR(hw_attention(ring, H, &query, 1, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: variants.window (0) must be in [1, capacity - "
            "n_sink_tokens = 7] with a ring cache");
  hw_attention_variants bad = v;
  bad.window = 0;
  CHECK_ERR(hw_attention_with_variants(ring, H, &query, 1, NULL, &bad),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.n_sink_tokens (2) must be "
            "<= variants.window (0)");
  bad.n_sink_tokens = 0;
  CHECK_ERR(hw_attention_with_variants(ring, H, &query, 1, NULL, &bad),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.window (0) must be in [1, "
            "capacity - n_sink_tokens = 7]");
  bad.n_sink_tokens = kSinks;
  bad.window = 8;
  CHECK_ERR(hw_attention_with_variants(ring, H, &query, 1, NULL, &bad),
            HW_INVALID_ARGUMENT, "variants.window (8) must be in [1, ");
  bad = v;
  bad.n_sink_tokens = 1;
  CHECK_ERR(hw_attention_with_variants(ring, H, &query, 1, NULL, &bad),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.n_sink_tokens (1) must "
            "equal the ring cache's n_sink_tokens (2)");
  bad.n_sink_tokens = -1;
  CHECK_ERR(hw_attention_with_variants(plain, H, &query, 1, NULL, &bad),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: variants.n_sink_tokens must be >= 0 "
            "(got -1)");
  hw_attention_query masked = query;
  masked.mask = Matrix(mask, N, 12);
  CHECK_ERR(hw_attention_with_variants(ring, H, &masked, 1, NULL, &v),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_variants: queries[0].mask must be null with a "
            "ring cache");
  CHECK_ERR(hw_attention_with_weights(ring, H, &query, w, NULL),
            HW_INVALID_ARGUMENT, "hw_attention_with_weights: ");
  CHECK_ERR(
      hw_attention_with_weights_and_variants(ring, H, &query, w, NULL, &v),
      HW_INVALID_ARGUMENT,
      "hw_attention_with_weights_and_variants: cache is a ring cache, whose "
      "weights would span positions it no longer holds");
  int untouched = 1;
  for (int64_t i = 0; i < N * W; ++i) untouched &= out[i] == 7.0f;
  for (int64_t i = 0; i < H * N * 12; ++i) untouched &= weights[i] == 7.0f;
  CHECK(untouched);
  /* The same query with the ring's variants is fine. */
  CHECK_OK(hw_attention_with_variants(ring, H, &query, 1, NULL, &v));
  free(kv);
  free(q);
  free(out);
  free(mask);
  free(weights);
  hw_kv_cache_destroy(ring);
  hw_kv_cache_destroy(plain);
}

static void AttentionRingOnTarget(void* unused) {
  (void)unused;
  TestAttentionRingOnTarget(HW_KV_FLOAT32);
  TestAttentionRingOnTarget(HW_KV_FLOAT16);
}

/* Ring attention on every target, float32 and float16 caches; its errors. */
static void TestAttentionRing(void) {
  OnEveryTarget(AttentionRingOnTarget, NULL);
  TestAttentionRingErrors();
}

static void TestAttentionErrors(void) {
  enum { H = 4, G = 2, D = 4, W = H * D, N = 3, L = 5 };
  hw_kv_cache* cache = NULL;
  CHECK_OK(hw_kv_cache_create(2, G, D, 8, &cache));
  if (cache == NULL) return;
  float* kv = RandomArray(L * G * D, 1.0f);
  CHECK_OK(hw_kv_cache_append(cache, 0, L, kv, 0, kv, 0));
  float* q = RandomArray(N * W, 1.0f);
  float* out = FilledArray(2 * N * W, 7.0f);
  float* mask = FilledArray(N * L, 0.0f);
  float* weights = FilledArray(H * N * L, 7.0f);
  hw_attention_query good;
  good.seq = 0;
  good.q_pos0 = 2;
  good.q = Matrix(q, N, W);
  good.out = OutMatrix(out, N, W, 0);
  good.mask = Matrix(NULL, 0, 0);
  hw_attention_options options;
  memset(&options, 0, sizeof(options));
  hw_attention_query bad = good;

  CHECK_ERR(hw_attention(NULL, H, &good, 1, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: cache is null");
  CHECK_ERR(hw_attention(cache, H, NULL, 1, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: queries is null");
  CHECK_ERR(hw_attention(cache, H, &good, 0, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: n_queries must be >= 1 (got 0)");
  CHECK_ERR(hw_attention(cache, 3, &good, 1, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: n_heads (3) is not a multiple");
  CHECK_ERR(hw_attention(cache, 0, &good, 1, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: n_heads must be >= 1");
  options.mask = 7;
  CHECK_ERR(hw_attention(cache, H, &good, 1, &options), HW_INVALID_ARGUMENT,
            "hw_attention: options.mask is not an hw_attention_mask (got 7)");
  options.mask = HW_MASK_CAUSAL;
  options.scale = -1.0f;
  CHECK_ERR(hw_attention(cache, H, &good, 1, &options), HW_INVALID_ARGUMENT,
            "hw_attention: options.scale");
  options.scale = NAN;
  CHECK_ERR(hw_attention(cache, H, &good, 1, &options), HW_INVALID_ARGUMENT,
            "options.scale");
  bad.seq = 2;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "hw_attention: queries[0].seq (2)");
  bad = good;
  bad.q_pos0 = -1;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].q_pos0 must be >= 0");
  bad.q_pos0 = L - N + 1;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_OUT_OF_RANGE,
            "hw_attention: queries[0]: q_pos0 + n_tokens (3 + 3)");
  bad = good;
  bad.q.cols = W - 1;
  bad.out.cols = W - 1;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].q.cols (15)");
  bad = good;
  bad.out.rows = N - 1;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].out is [2, 16]");
  bad = good;
  bad.out.stride = W - 1;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].out.stride (15) is shorter than queries[0].out.cols");
  bad = good;
  bad.q.data = NULL;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].q.data is null");
  bad = good;
  bad.q.rows = INT64_MAX / 8;
  bad.out.rows = INT64_MAX / 8;
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_RESOURCE_EXHAUSTED,
            "queries[0].q");
  bad = good;
  bad.mask = Matrix(mask, N, L - 1);
  CHECK_ERR(
      hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
      "queries[0].mask is [3, 4] but must be [n_tokens, length] = [3, 5]");
  bad.mask = StridedMatrix(mask, N, L, L - 1);
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].mask.stride (4)");
  bad = good;
  bad.out.data = (float*)q; /* writes what it reads */
  CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
            "queries[0].out overlaps queries[0].q");
  {
    const float* keys = NULL;
    CHECK_OK(hw_kv_cache_keys(cache, 1, 0, &keys, NULL, NULL));
    bad.out.data = (float*)keys;
    CHECK_ERR(hw_attention(cache, H, &bad, 1, NULL), HW_INVALID_ARGUMENT,
              "queries[0].out overlaps the cache's keys");
  }
  {
    hw_attention_query two[2];
    two[0] = good;
    two[1] = good;
    two[1].out.data = out + W; /* overlaps two[0].out */
    CHECK_ERR(hw_attention(cache, H, two, 2, NULL), HW_INVALID_ARGUMENT,
              "queries[1].out overlaps queries[0].out");
    two[1].seq = 1; /* empty: a query must come after its keys */
    two[1].q_pos0 = 0;
    two[1].out.data = out + N * W;
    CHECK_ERR(hw_attention(cache, H, two, 2, NULL), HW_OUT_OF_RANGE,
              "queries[1]: q_pos0 + n_tokens (0 + 3) exceeds the 0 cached");
  }

  const hw_out_matrix w = OutMatrix(weights, H * N, L, 0);
  CHECK_ERR(hw_attention_with_weights(NULL, H, &good, w, NULL),
            HW_INVALID_ARGUMENT, "hw_attention_with_weights: cache is null");
  CHECK_ERR(hw_attention_with_weights(cache, H, NULL, w, NULL),
            HW_INVALID_ARGUMENT, "hw_attention_with_weights: query is null");
  CHECK_ERR(hw_attention_with_weights(
                cache, H, &good, OutMatrix(weights, H * N, L - 1, 0), NULL),
            HW_INVALID_ARGUMENT,
            "hw_attention_with_weights: weights is [12, 4] but must be");
  CHECK_ERR(hw_attention_with_weights(cache, H, &good,
                                      OutMatrix(NULL, H * N, L, 0), NULL),
            HW_INVALID_ARGUMENT, "weights.data is null");
  CHECK_ERR(hw_attention_with_weights(cache, H, &good,
                                      OutMatrix(weights, H * N, L, 2), NULL),
            HW_INVALID_ARGUMENT, "weights.stride (2) is shorter");
  CHECK_ERR(hw_attention_with_weights(cache, H, &good,
                                      OutMatrix(out, H * N, L, 0), NULL),
            HW_INVALID_ARGUMENT, "weights overlaps query.out");
  options.scale = INFINITY;
  CHECK_ERR(hw_attention_with_weights(cache, H, &good, w, &options),
            HW_INVALID_ARGUMENT, "hw_attention_with_weights: options.scale");
  bad = good;
  bad.seq = -1;
  CHECK_ERR(hw_attention_with_weights(cache, H, &bad, w, NULL),
            HW_INVALID_ARGUMENT, "hw_attention_with_weights: query.seq (-1)");

  /* Nothing was written. */
  int untouched = 1;
  for (int64_t i = 0; i < 2 * N * W; ++i) untouched &= out[i] == 7.0f;
  for (int64_t i = 0; i < H * N * L; ++i) untouched &= weights[i] == 7.0f;
  CHECK(untouched);
  CHECK(Length(cache, 0) == L && Length(cache, 1) == 0);

  /* The good call works. */
  CHECK_OK(hw_attention(cache, H, &good, 1, NULL));
  CHECK_OK(hw_attention_with_weights(cache, H, &good, w, NULL));
  CHECK(out[0] != 7.0f && weights[0] != 7.0f);

  free(kv);
  free(q);
  free(out);
  free(mask);
  free(weights);
  hw_kv_cache_destroy(cache);
}

/* --------------------------------------------------- Matmul and softmax */

static void TestMatmul(void) {
  enum { M = 5, N = 7, K = 9 };
  for (int ta = 0; ta <= 1; ++ta) {
    for (int tb = 0; tb <= 1; ++tb) {
      /* Stored shapes, with padded strides. */
      const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
      const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
      const int64_t lda = a_cols + 1, ldb = b_cols + 2, ldc = N + 3;
      float* a = RandomArray(a_rows * lda, 2.0f);
      float* b = RandomArray(b_rows * ldb, 2.0f);
      float* c = RandomArray(M * ldc, 2.0f);
      float* c0 = RandomArray(M * ldc, 0.0f);
      memcpy(c0, c, (size_t)(M * ldc) * sizeof(float));
      const float alpha = 0.75f, beta = -1.5f;
      CHECK_OK(hw_matmul(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc));
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double s = 0.0, abs_sum = 0.0;
          for (int64_t p = 0; p < K; ++p) {
            const double av = ta ? a[p * lda + i] : a[i * lda + p];
            const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
            s += av * bv;
            abs_sum += fabs(av * bv);
          }
          const double want = alpha * s + beta * c0[i * ldc + j];
          /* matmul.h's bound: (K + K / 512 + 3) 2^-24 (|alpha| sum |a b| +
           * |beta| |c_old|). */
          const double bound =
              (K + 3) * ldexp(1.0, -24) *
              (fabs(alpha) * abs_sum + fabs(beta) * fabs(c0[i * ldc + j]));
          CHECK(fabs(c[i * ldc + j] - want) <= bound);
        }
        for (int64_t j = N; j < ldc; ++j)
          CHECK(c[i * ldc + j] == c0[i * ldc + j]);
      }
      free(a);
      free(b);
      free(c);
      free(c0);
    }
  }

  /* Dense strides (0) and beta = 0 over NaN. */
  {
    float a[2 * 3] = {1, 2, 3, 4, 5, 6};
    float b[3 * 2] = {1, 0, 0, 1, 1, 1};
    float c[2 * 2] = {NAN, NAN, NAN, NAN};
    CHECK_OK(hw_matmul(HW_NO_TRANS, HW_NO_TRANS, 2, 2, 3, 1.0f, a, 0, b, 0,
                       0.0f, c, 0));
    CHECK(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);

    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, NULL, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "a is null");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, a, 0, NULL, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "b is null");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, a, 0, b, 0, 0.0f, NULL, 0),
              HW_INVALID_ARGUMENT, "c is null");
    CHECK_ERR(hw_matmul(2, 0, 2, 2, 3, 1.0f, a, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "trans_a");
    CHECK_ERR(hw_matmul(0, -1, 2, 2, 3, 1.0f, a, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "trans_b");
    CHECK_ERR(hw_matmul(0, 0, 0, 2, 3, 1.0f, a, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "m");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, a, 2, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "hw_matmul: lda (2) is shorter than k (3)");
    CHECK_ERR(hw_matmul(1, 0, 2, 2, 3, 1.0f, a, 1, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "hw_matmul: lda (1) is shorter than m (2)");
    CHECK_ERR(hw_matmul(0, 1, 2, 2, 3, 1.0f, a, 0, b, 2, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "hw_matmul: ldb (2) is shorter than k (3)");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, a, 0, b, 1, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "hw_matmul: ldb (1) is shorter than n (2)");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, a, 0, b, 0, 0.0f, c, 1),
              HW_INVALID_ARGUMENT, "hw_matmul: ldc (1) is shorter than n (2)");
    CHECK_ERR(hw_matmul(0, 0, 2, 0, 3, 1.0f, a, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "n = 0");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, -1, 1.0f, a, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "k = -1");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, 1.0f, a, 0, b, 0, INFINITY, c, 0),
              HW_INVALID_ARGUMENT, "hw_matmul: beta");
    CHECK_ERR(hw_matmul(0, 0, 1, 2, 3, 1.0f, a, 0, b, 0, 0.0f, b, 0),
              HW_INVALID_ARGUMENT, "c overlaps b");
    CHECK_ERR(
        hw_matmul(0, 0, INT64_MAX / 8, 2, 3, 1.0f, a, 0, b, 0, 0.0f, c, 0),
        HW_RESOURCE_EXHAUSTED, "hw_matmul: a: rows");
    CHECK_ERR(hw_matmul(0, 0, 2, 2, 3, NAN, a, 0, b, 0, 0.0f, c, 0),
              HW_INVALID_ARGUMENT, "alpha");
    CHECK_ERR(hw_matmul(0, 0, 2, 1, 3, 1.0f, a, 0, a, 1, 0.0f, a, 0),
              HW_INVALID_ARGUMENT, "overlap");
    CHECK(c[0] == 4 && c[3] == 11 && a[0] == 1);
  }
}

static void TestSoftmax(void) {
  enum { R = 3, C = 6, S = 8 };
  float x[R * S], y[R * S];
  for (int i = 0; i < R * S; ++i) {
    x[i] = 4.0f * Rand();
    y[i] = -5.0f;
  }
  x[2 * S + 0] = -INFINITY; /* an -inf entry gives 0 */
  CHECK_OK(hw_softmax_rows(R, C, x, S, y, S, 0.5f));
  for (int r = 0; r < R; ++r) {
    double max = -INFINITY, sum = 0.0;
    for (int c = 0; c < C; ++c) {
      if (0.5 * x[r * S + c] > max) max = 0.5 * x[r * S + c];
    }
    for (int c = 0; c < C; ++c) sum += exp(0.5 * x[r * S + c] - max);
    for (int c = 0; c < C; ++c) {
      const double want = exp(0.5 * x[r * S + c] - max) / sum;
      CHECK(fabs(y[r * S + c] - want) <= 1e-6 * want + 1e-30);
    }
    CHECK(y[r * S + C] == -5.0f); /* padding not written */
  }
  CHECK(y[2 * S] == 0.0f);

  /* In place, dense. */
  float z[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  CHECK_OK(hw_softmax_rows(1, 4, z, 0, z, 0, 1.0f));
  CHECK(fabs(z[0] - 0.25) < 1e-7 && fabs(z[3] - 0.25) < 1e-7);

  CHECK_ERR(hw_softmax_rows(R, C, NULL, S, y, S, 1.0f), HW_INVALID_ARGUMENT,
            "x is null");
  CHECK_ERR(hw_softmax_rows(R, C, x, S, NULL, S, 1.0f), HW_INVALID_ARGUMENT,
            "y is null");
  CHECK_ERR(hw_softmax_rows(R, C, x, 4, y, S, 1.0f), HW_INVALID_ARGUMENT,
            "hw_softmax_rows: x_stride (4) is shorter than cols (6)");
  CHECK_ERR(hw_softmax_rows(R, C, x, S, y, 5, 1.0f), HW_INVALID_ARGUMENT,
            "hw_softmax_rows: y_stride (5) is shorter than cols (6)");
  CHECK_ERR(hw_softmax_rows(R, 0, x, S, y, S, 1.0f), HW_INVALID_ARGUMENT,
            "hw_softmax_rows: cols must be >= 1 (got 0)");
  CHECK_ERR(hw_softmax_rows(R, C, x, S, x + 1, S, 1.0f), HW_INVALID_ARGUMENT,
            "overlaps");
  CHECK_ERR(hw_softmax_rows(INT64_MAX / 4, C, x, S, y, S, 1.0f),
            HW_RESOURCE_EXHAUSTED, "hw_softmax_rows: x: rows");
  CHECK_ERR(hw_softmax_rows(R, C, x, S, y, S, INFINITY), HW_INVALID_ARGUMENT,
            "scale");
  CHECK_ERR(hw_softmax_rows(0, C, x, S, y, S, 1.0f), HW_INVALID_ARGUMENT,
            "hw_softmax_rows: rows must be >= 1 (got 0)");
}

/* ---------------------------- Thread scratch and allocation failure */

/* A thread that called hw_matmul with a large B keeps scratch memory until
 * hw_release_thread_scratch frees it; the next call gives the same result. */
static void TestReleaseThreadScratch(void) {
  enum { M = 200, K = 1100, N = 1100 }; /* B packed: over 4 MiB */
  float* a = RandomArray(M * K, 1.0f);
  float* b = RandomArray(K * N, 1.0f);
  float* c1 = FilledArray(M * N, 0.0f);
  float* c2 = FilledArray(M * N, 0.0f);
  CHECK_OK(hw_matmul(HW_NO_TRANS, HW_NO_TRANS, M, N, K, 1.0f, a, 0, b, 0, 0.0f,
                     c1, 0));
  const int64_t released = hw_release_thread_scratch();
  CHECK(released > 0);
  /* On 2 or more threads the two row blocks share a copy of B packed into
   * this thread's buffer. */
  if (hw_max_threads() > 1) CHECK(released >= (int64_t)K * N * 4);
  CHECK(hw_release_thread_scratch() == 0);
  CHECK_OK(hw_matmul(HW_NO_TRANS, HW_NO_TRANS, M, N, K, 1.0f, a, 0, b, 0, 0.0f,
                     c2, 0));
  CHECK(memcmp(c1, c2, sizeof(float) * M * N) == 0);
  CHECK(hw_release_thread_scratch() > 0);
  free(a);
  free(b);
  free(c1);
  free(c2);
}

/* Under AddressSanitizer a failed malloc returns NULL only with
 * allocator_may_return_null=1 (by default ASan ends the process); ASAN_OPTIONS
 * from the environment still apply on top of this. Unused without ASan. */
const char* __asan_default_options(void);
const char* __asan_default_options(void) {
  return "allocator_may_return_null=1";
}

/* A cache of 2^50 bytes (no overflow) is more than memory. */
static void TestAllocationFailure(void) {
  hw_kv_cache* cache = NULL;
  CHECK_ERR(hw_kv_cache_create(1, 1, 16, (int64_t)1 << 43, &cache),
            HW_RESOURCE_EXHAUSTED, "out of memory");
  CHECK(cache == NULL);
}

int main(void) {
  TestStatusAndVersion();
  TestTargetsAndThreads();
  TestKvCache();
  TestKvDtypes();
  TestRope();
  TestRmsNormHeads();
  TestRopeAndNormErrors();
  TestLayerShapes();
  TestLayerDtypes();
  TestLayerErrors();
  TestLayerVariantsOff();
  TestLayerVariantErrors();
  TestLayerVariants();
  TestLayerRing();
  TestLayerWeightDtypes();
  TestAttention();
  TestAttentionErrors();
  TestAlibiSlopes();
  TestAttentionVariants();
  TestAttentionVariantErrors();
  TestAttentionCompute();
  TestAttentionRing();
  TestMatmul();
  TestSoftmax();
  TestReleaseThreadScratch();
  TestAllocationFailure();
  if (g_failures != 0) {
    fprintf(stderr, "capi_test: %d check(s) failed\n", g_failures);
    return g_failures < 100 ? g_failures : 100;
  }
  printf("capi_test: all checks passed (version %s, target %s)\n", hw_version(),
         hw_active_target());
  return 0;
}

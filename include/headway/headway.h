/* Headway's C API: a plain C (C99) interface to the library, for hosts written
 * in C, Rust, Go, Python (ctypes), ... It wraps the C++ API (headway.hpp and
 * layer.h) and adds nothing to it; the C++ headers document the algorithms.
 *
 * Conventions
 *
 * Handles: hw_kv_cache and hw_attention_layer are opaque. A create function
 * writes a new handle to *out (only on success); destroy frees it (NULL is a
 * no-op). A NULL handle or NULL pointer argument is an error naming the
 * argument, never a crash.
 *
 * Errors: every function that can fail returns an int status, one of
 * hw_status_code (HW_OK == 0). The message of the last such call on the
 * calling thread is hw_last_error(): "" after HW_OK, otherwise it begins with
 * the C function's name and names the bad argument as the caller passed it
 * (a parameter, or a struct field such as config.d_model), e.g.
 *   "hw_attention_layer_forward: cache is null"
 *   "hw_kv_cache_append: length (8) + n_new (1) exceeds capacity (8) of seq 0".
 * On error nothing has been written: *out pointers, caches, outputs are
 * unchanged. Where several arguments are bad, which one is reported is not
 * specified. No C++ exception crosses this API: an allocation failure is
 * HW_RESOURCE_EXHAUSTED, anything unexpected HW_INTERNAL.
 *
 * Matrices: float32, row-major. A matrix argument is a data pointer plus a row
 * stride in elements (the distance from one row's start to the next, >= the
 * number of columns); a stride of 0 means densely packed (stride == cols), the
 * same rule as C++ (MatrixView's constructor, headway/view.h). Sizes are
 * int64_t so that a negative size is reported, not wrapped; a size or stride
 * whose byte count overflows is HW_RESOURCE_EXHAUSTED.
 *
 * Compatibility: a released function keeps its signature and meaning; a new
 * argument comes with a new function (hw_kv_cache_create is
 * hw_kv_cache_create_typed with HW_KV_FLOAT32). Enum values travel as int
 * and match the C++ enums'; 0 is the default, so a zeroed struct is the
 * default configuration. Handles are opaque, so what they hold can grow.
 * A released struct keeps its size and layout; a struct made to grow
 * (hw_attention_variants, hw_attention_layer_variants) begins with
 * `size_t struct_size`, which the caller sets to sizeof as it compiled it:
 * fields appended later are read only when struct_size covers them, and a
 * library older than the caller's header accepts the larger struct when the
 * bytes it does not know are zero (the new features left off). struct_size
 * must be at least the struct's version 1 size (its _V1_SIZE macro) and at
 * most 4096; each version's size has a macro (_V2_SIZE, ...), so that a
 * caller can also pass an older version's size on purpose.
 *
 * Threads: kernels run in parallel on oneTBB inside. Functions on different
 * handles may be called concurrently; one hw_attention_layer must not run two
 * forward calls at once; calls that change one cache sequence must not run
 * concurrently with other calls on that sequence (see kv_cache.h). Target and
 * thread caps are process-wide: set them at start-up.
 */
#ifndef HEADWAY_HEADWAY_H_
#define HEADWAY_HEADWAY_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define HEADWAY_C_API
#else
#define HEADWAY_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- Status */

/* The same values as headway::StatusCode. */
typedef enum hw_status_code {
  HW_OK = 0,
  HW_INVALID_ARGUMENT = 1, /* a null pointer, a bad shape, stride, name, ... */
  HW_OUT_OF_RANGE = 2,     /* a size or position beyond a buffer or a cache */
  HW_RESOURCE_EXHAUSTED = 3,  /* out of memory, or a byte count overflows */
  HW_FAILED_PRECONDITION = 4, /* valid call, wrong state (target changed) */
  HW_INTERNAL = 5             /* a bug in Headway: please report it */
} hw_status_code;

/* The message of the last failing call on this thread, "" if the last call
 * that returns a status returned HW_OK. Never NULL. The pointer stays valid
 * until the next Headway call on this thread: copy it to keep it. */
HEADWAY_C_API const char* hw_last_error(void);

/* Name of a status code, e.g. "INVALID_ARGUMENT"; "UNKNOWN" for other values.
 * Static storage. */
HEADWAY_C_API const char* hw_status_name(int code);

/* ---------------------------------------------- Version, targets, threads */

/* The library's version, "MAJOR.MINOR.PATCH". Static storage. */
HEADWAY_C_API const char* hw_version(void);

/* Name of the instruction set the next call dispatches to ("AVX3_DL", "AVX3",
 * "AVX2", "SSE4", "SSSE3", and "SCALAR" in g++ builds or "EMU128" in clang
 * builds, on x86-64). Static storage. */
HEADWAY_C_API const char* hw_active_target(void);

/* The instruction sets this CPU can run, best first, whatever the cap: writes
 * up to `capacity` names (static storage) to names[0 .. capacity) and returns
 * how many there are (call with names == NULL, capacity == 0 to count). */
HEADWAY_C_API int64_t hw_supported_targets(const char** names,
                                           int64_t capacity);

/* Caps dispatch at target `name` (case-insensitive, e.g. "avx2"): calls then
 * use the best supported target not better than it. Process-wide; set it while
 * no other Headway call runs. Weights packed by hw_attention_layer_create are
 * for the target active at create: see hw_attention_layer_forward.
 * Errors (cap unchanged): HW_INVALID_ARGUMENT for a NULL name or a name that is
 * not a compiled target; HW_FAILED_PRECONDITION if this CPU cannot run it. */
HEADWAY_C_API int hw_set_max_target(const char* name);

/* Removes the cap (including one from the environment variable
 * HEADWAY_MAX_TARGET). */
HEADWAY_C_API void hw_reset_max_target(void);

/* Caps the threads of every oneTBB parallel loop in the process; n == 0
 * removes the cap. A cap, not a request: a call uses at most the threads of
 * the oneTBB arena it runs in, and a C caller's calls run in the default
 * arena, one thread per core, so n above the number of cores gives one thread
 * per core (hw_max_threads() says what a call gets). C++ SetMaxThreads is the
 * same function; only a C++ host that runs calls in a larger tbb::task_arena
 * gets more threads than cores. Results do not depend on the number of
 * threads. Error: HW_INVALID_ARGUMENT if n < 0. */
HEADWAY_C_API int hw_set_max_threads(int n);

/* The number of threads a call from this thread may use now: the default
 * arena's (one per core), capped by hw_set_max_threads. */
HEADWAY_C_API int hw_max_threads(void);

/* Frees the scratch memory the calling thread keeps between calls and returns
 * its bytes (0 if none); the next call allocates again and gives the same
 * results. A thread that called hw_matmul with a B larger than 4 MiB keeps a
 * packed copy of it, up to 64 MiB, until it exits or calls this. Frees only
 * this thread's buffers, not those of oneTBB's worker threads, handles' memory
 * or hw_last_error(): see headway::ReleaseThreadScratch in threads.h. */
HEADWAY_C_API int64_t hw_release_thread_scratch(void);

/* -------------------------------------------------------------- KV cache */

/* The element type a cache stores K and V in; the same values as
 * headway::KvDtype (headway/kv_cache.h, which has the rounding rules). 0, the
 * default, is float32. Every type is appended as float32 and read by the
 * attention calls in its stored form, accumulating in float32. */
typedef enum hw_kv_dtype {
  HW_KV_FLOAT32 = 0,  /* 4 bytes per element, as appended */
  HW_KV_BFLOAT16 = 1, /* 2 bytes: bfloat16, rounded to nearest even */
  HW_KV_FLOAT16 = 2,  /* 2 bytes: IEEE half, rounded to nearest even */
  HW_KV_INT8 = 3      /* 1 byte, plus one float scale per row (below) */
} hw_kv_dtype;

/* What each type stores (its rounding, int8's row scale, what NaN and inf
 * become) is the table at the top of headway/kv_cache.h. Appending NaN or inf
 * is never an error: it changes only its own row (a whole int8 row reads back
 * as NaN). */

/* Bytes per stored element of dtype: 4, 2, 2, 1; 0 for a value that is not
 * a hw_kv_dtype. */
HEADWAY_C_API size_t hw_kv_dtype_size(int dtype);

/* "float32", "bfloat16", "float16", "int8"; "unknown" for other values.
 * Static storage. */
HEADWAY_C_API const char* hw_kv_dtype_name(int dtype);

/* The keys and values of one attention layer for n_sequences sequences (slots
 * 0 .. n_sequences - 1), up to `capacity` tokens each (a ring cache: the last
 * ones, see hw_kv_cache_create_ring), stored in one hw_kv_dtype. */
typedef struct hw_kv_cache hw_kv_cache;

/* Creates a cache of element type dtype (a hw_kv_dtype), every sequence
 * empty, into *out. Allocates and zeroes hw_kv_cache_bytes() bytes up front.
 * Errors: HW_INVALID_ARGUMENT for a NULL out, any size < 1, a dtype that is
 * not a hw_kv_dtype; HW_RESOURCE_EXHAUSTED when the byte count overflows (the
 * message names the sizes) or memory runs out. */
HEADWAY_C_API int hw_kv_cache_create_typed(int64_t n_sequences,
                                           int64_t n_kv_heads, int64_t head_dim,
                                           int64_t capacity, int dtype,
                                           hw_kv_cache** out);

/* hw_kv_cache_create_typed with dtype HW_KV_FLOAT32. */
HEADWAY_C_API int hw_kv_cache_create(int64_t n_sequences, int64_t n_kv_heads,
                                     int64_t head_dim, int64_t capacity,
                                     hw_kv_cache** out);

/* Creates a ring cache (for sliding-window attention; headway/kv_cache.h's
 * Ring mode): hw_kv_cache_create_typed, but the `capacity` rows of a sequence
 * are a ring, so that a sequence grows without end (up to 2^62 positions)
 * while the cache holds positions [0, n_sink_tokens) (pinned sinks) and the
 * last capacity - n_sink_tokens positions; a window of W keys needs capacity
 * >= W + n_sink_tokens, the bytes of a plain cache of that capacity. Position
 * p lives in row hw_kv_cache_slot(p); appending position p overwrites
 * position p - (capacity - n_sink_tokens). hw_kv_cache_length counts the
 * positions appended, held or not; hw_kv_cache_ring_state gives the oldest
 * held one.
 * Errors: as hw_kv_cache_create_typed, and HW_INVALID_ARGUMENT for
 * n_sink_tokens < 0 or >= capacity. */
HEADWAY_C_API int hw_kv_cache_create_ring(int64_t n_sequences,
                                          int64_t n_kv_heads, int64_t head_dim,
                                          int64_t capacity,
                                          int64_t n_sink_tokens, int dtype,
                                          hw_kv_cache** out);

/* Frees a cache (NULL: nothing). */
HEADWAY_C_API void hw_kv_cache_destroy(hw_kv_cache* cache);

/* The cache's sizes; any output pointer may be NULL (not written).
 * row_stride: elements between cached rows, head_dim rounded up to 16 (for
 * every dtype).
 * Error: HW_INVALID_ARGUMENT for a NULL cache. */
HEADWAY_C_API int hw_kv_cache_shape(const hw_kv_cache* cache,
                                    int64_t* n_sequences, int64_t* n_kv_heads,
                                    int64_t* head_dim, int64_t* capacity,
                                    int64_t* row_stride);

/* *dtype = the cache's hw_kv_dtype, *element_size = its bytes per element
 * (hw_kv_dtype_size); either pointer may be NULL (not written).
 * Error: HW_INVALID_ARGUMENT for a NULL cache. */
HEADWAY_C_API int hw_kv_cache_dtype(const hw_kv_cache* cache, int* dtype,
                                    size_t* element_size);

/* *length = tokens cached for sequence seq (a ring cache: the positions
 * appended, held or not).
 * Errors: HW_INVALID_ARGUMENT for a NULL cache or length, seq outside
 * [0, n_sequences). */
HEADWAY_C_API int hw_kv_cache_length(const hw_kv_cache* cache, int64_t seq,
                                     int64_t* length);

/* The ring state of sequence seq; any output pointer may be NULL (not
 * written). *ring: 1 for a ring cache (hw_kv_cache_create_ring), else 0.
 * *n_sink_tokens: the ring's pinned positions (0 without ring).
 * *ring_begin: the oldest position held past the sinks; a ring holds
 * positions [0, min(length, n_sink_tokens)) and [ring_begin, length).
 * n_sink_tokens for an empty ring, 0 without ring.
 * Errors: HW_INVALID_ARGUMENT for a NULL cache, seq outside
 * [0, n_sequences). */
HEADWAY_C_API int hw_kv_cache_ring_state(const hw_kv_cache* cache, int64_t seq,
                                         int64_t* ring_begin,
                                         int64_t* n_sink_tokens, int* ring);

/* *slot = the row that holds position `position` (>= 0): the position itself
 * without ring; in a ring cache the position for a sink (position <
 * n_sink_tokens), else n_sink_tokens + (position - n_sink_tokens) mod
 * (capacity - n_sink_tokens).
 * Errors: HW_INVALID_ARGUMENT for a NULL cache or slot, position < 0. */
HEADWAY_C_API int hw_kv_cache_slot(const hw_kv_cache* cache, int64_t position,
                                   int64_t* slot);

/* *bytes = bytes of the K and V buffers together, padding and int8 scales
 * included.
 * Errors: HW_INVALID_ARGUMENT for a NULL cache or bytes. */
HEADWAY_C_API int hw_kv_cache_bytes(const hw_kv_cache* cache, size_t* bytes);

/* *bytes = bytes one token of one sequence takes, as stored:
 * 2 * n_kv_heads * (row_stride * element size + 4 for int8's scale), e.g.
 * 2 * n_kv_heads * row_stride * 4 for float32.
 * Errors: HW_INVALID_ARGUMENT for a NULL cache or bytes. */
HEADWAY_C_API int hw_kv_cache_bytes_per_token(const hw_kv_cache* cache,
                                              size_t* bytes);

/* Appends n_new tokens to sequence seq, converted to the cache's dtype (see
 * hw_kv_dtype). k and v: float32 [n_new, n_kv_heads * head_dim] (head g in
 * columns [g * head_dim, (g + 1) * head_dim)), row strides k_stride and
 * v_stride (0: dense).
 * Errors (cache unchanged): HW_INVALID_ARGUMENT for a NULL cache, k or v, a
 * bad seq, n_new < 1, a stride (other than 0) < n_kv_heads * head_dim;
 * HW_RESOURCE_EXHAUSTED if n_new rows of k or v at their stride overflow the
 * address space (checked before the capacity: n_new = INT64_MAX is this
 * error); HW_OUT_OF_RANGE if length + n_new > capacity (a ring cache: > 2^62;
 * it writes only the positions it still holds afterwards). */
HEADWAY_C_API int hw_kv_cache_append(hw_kv_cache* cache, int64_t seq,
                                     int64_t n_new, const float* k,
                                     int64_t k_stride, const float* v,
                                     int64_t v_stride);

/* The cached keys (or values) of one head of sequence seq, as stored, for a
 * host that inspects or serializes them: *data points at [*rows, head_dim]
 * elements of type *dtype (a hw_kv_dtype) and *element_size bytes each inside
 * the cache, element (r, c) at
 *   (const char*)*data + (r * *stride + c) * *element_size,
 * each row aligned to 16 elements (64 bytes for float32, 16 for int8; *rows
 * == length(seq); a ring cache: min(length, capacity) rows in slot order,
 * position p in row hw_kv_cache_slot(p), a row of no held position stale).
 * For HW_KV_INT8, *scales
 * points at the *rows row scales (element (r, c) stands for
 * (*scales)[r] * q); for the other types *scales is NULL. hw_kv_load_rows
 * turns the rows into float32. The pointers stay valid until the cache is
 * destroyed; the rows they show change with appends and truncations. Any
 * output pointer but data may be NULL (not written).
 * Errors: HW_INVALID_ARGUMENT for a NULL cache or data, a bad seq or
 * kv_head. */
HEADWAY_C_API int hw_kv_cache_stored_keys(const hw_kv_cache* cache, int64_t seq,
                                          int64_t kv_head, int* dtype,
                                          size_t* element_size,
                                          const void** data, int64_t* rows,
                                          int64_t* stride,
                                          const float** scales);
HEADWAY_C_API int hw_kv_cache_stored_values(const hw_kv_cache* cache,
                                            int64_t seq, int64_t kv_head,
                                            int* dtype, size_t* element_size,
                                            const void** data, int64_t* rows,
                                            int64_t* stride,
                                            const float** scales);

/* The cached keys (or values) of one head of sequence seq of a float32 cache:
 * hw_kv_cache_stored_keys (values) without the type, as float pointers. Any
 * of rows and stride may be NULL.
 * Errors: HW_INVALID_ARGUMENT for a NULL cache or data, a bad seq or kv_head,
 * a cache of another dtype (the message names it: read that one with
 * hw_kv_cache_stored_keys). */
HEADWAY_C_API int hw_kv_cache_keys(const hw_kv_cache* cache, int64_t seq,
                                   int64_t kv_head, const float** data,
                                   int64_t* rows, int64_t* stride);
HEADWAY_C_API int hw_kv_cache_values(const hw_kv_cache* cache, int64_t seq,
                                     int64_t kv_head, const float** data,
                                     int64_t* rows, int64_t* stride);

/* Converts float32 rows into a dtype's stored form with the cache's rounding
 * (what hw_kv_cache_append stores): src [rows, cols] at row stride
 * src_stride (0: dense) into dst, rows of cols elements of dtype, dst_stride
 * elements apart (0: dense), and for HW_KV_INT8 the row scales into
 * scales[0, rows) (ignored, and may be NULL, for the other types). Only
 * columns [0, cols) of dst are written.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a dtype that is not a
 * hw_kv_dtype, a NULL src or dst, NULL scales with HW_KV_INT8, rows or
 * cols < 1, a stride (other than 0) < cols, src overlapping dst or scales;
 * HW_RESOURCE_EXHAUSTED for sizes whose byte count overflows. */
HEADWAY_C_API int hw_kv_store_rows(int dtype, int64_t rows, int64_t cols,
                                   const float* src, int64_t src_stride,
                                   void* dst, int64_t dst_stride,
                                   float* scales);

/* Reads stored rows back as float32, the values the attention calls use:
 * src, rows of cols elements of dtype, src_stride elements apart (0: dense),
 * with scales[0, rows) for HW_KV_INT8 (ignored, and may be NULL, for the
 * other types), into dst [rows, cols] at row stride dst_stride (0: dense).
 * Reads what hw_kv_cache_stored_keys and _values return, or what
 * hw_kv_store_rows wrote.
 * Errors (nothing written): as hw_kv_store_rows, with dst overlapping src or
 * scales. */
HEADWAY_C_API int hw_kv_load_rows(int dtype, int64_t rows, int64_t cols,
                                  const void* src, int64_t src_stride,
                                  const float* scales, float* dst,
                                  int64_t dst_stride);

/* Keeps the first new_length tokens of sequence seq (rolls back rejected
 * speculative tokens). O(1). A ring cache keeps its ring_begin.
 * Errors (cache unchanged): HW_INVALID_ARGUMENT for a NULL cache or a bad seq;
 * HW_OUT_OF_RANGE if new_length < 0 or > length(seq), or, once a ring has
 * dropped a position (ring_begin > n_sink_tokens), new_length < ring_begin
 * (the rows before it were overwritten). */
HEADWAY_C_API int hw_kv_cache_truncate(hw_kv_cache* cache, int64_t seq,
                                       int64_t new_length);

/* Makes sequence `to` a copy of sequence `from` (length, ring_begin and rows,
 * with their scales), e.g. to fork a shared prompt. from == to: nothing to
 * do.
 * Errors (cache unchanged): HW_INVALID_ARGUMENT for a NULL cache, a bad from
 * or to. */
HEADWAY_C_API int hw_kv_cache_copy_sequence(hw_kv_cache* cache, int64_t from,
                                            int64_t to);

/* Empties sequence seq (length 0, a ring's ring_begin n_sink_tokens; O(1)).
 * Errors (cache unchanged): HW_INVALID_ARGUMENT for a NULL cache or a bad
 * seq. */
HEADWAY_C_API int hw_kv_cache_reset(hw_kv_cache* cache, int64_t seq);

/* Empties every sequence. Error: HW_INVALID_ARGUMENT for a NULL cache. */
HEADWAY_C_API int hw_kv_cache_reset_all(hw_kv_cache* cache);

/* ---------------------------------------------------------- RoPE, RMSNorm */

/* Which elements of a head form the rotated pairs; the same values as
 * headway::RopeLayout (headway/rope.h). Pair i < rotary_dim / 2 is rotated
 * by the angle pos * freq_i. */
typedef enum hw_rope_layout {
  /* (x[i], x[i + rotary_dim / 2]): GPT-NeoX, Hugging Face transformers */
  HW_ROPE_HALVES = 0,
  /* (x[2i], x[2i + 1]): GPT-J, Meta's Llama reference code */
  HW_ROPE_INTERLEAVED = 1
} hw_rope_layout;

/* How the frequencies are stretched for contexts past the trained one; the
 * same values as headway::RopeScaling. */
typedef enum hw_rope_scaling {
  HW_ROPE_SCALING_NONE = 0,
  HW_ROPE_SCALING_LINEAR = 1, /* freq_i / factor (position interpolation) */
  /* Llama 3.1 (Hugging Face's "llama3" rope_type): wavelengths 2 pi / freq_i
   * shorter than original_max_position / high_freq_factor keep freq_i, longer
   * than original_max_position / low_freq_factor get freq_i / factor, in
   * between a linear blend in original_max_position / wavelength. */
  HW_ROPE_SCALING_LLAMA3 = 2
} hw_rope_scaling;

/* Rotary position embeddings, headway::RopeConfig:
 *   freq_i = theta^(-2 i / rotary_dim), i < rotary_dim / 2, then scaled.
 * A zeroed struct plus rotary_dim is the C++ default: every other field's 0
 * means the default written beside it (0 is not a valid value of any of
 * them); a negative value is passed on and rejected. The scaling fields are
 * read only by the scalings that use them. */
typedef struct hw_rope_config {
  /* Rotated elements of each head, the first rotary_dim of head_dim (the rest
   * pass through): even, 2 .. head_dim. In a layer's variants 0 means no
   * RoPE; hw_apply_rope rejects 0. */
  int64_t rotary_dim;
  int32_t layout;  /* hw_rope_layout; 0 (HW_ROPE_HALVES) by default */
  int32_t scaling; /* hw_rope_scaling; 0 (HW_ROPE_SCALING_NONE) by default */
  double theta;    /* > 0; 0 means 10000 */
  double factor;   /* LINEAR, LLAMA3: > 0; 0 means 1 */
  double low_freq_factor;        /* LLAMA3: > 0; 0 means 1 */
  double high_freq_factor;       /* LLAMA3: > low_freq_factor; 0 means 4 */
  int64_t original_max_position; /* LLAMA3: >= 1; 0 means 8192 */
} hw_rope_config;

/* Rotates every head of every row of x in place (headway::ApplyRope):
 *   x: [rows, cols] at row stride `stride` (0: dense), cols = n_heads *
 *      head_dim, head h in columns [h * head_dim, (h + 1) * head_dim);
 *   positions: [rows], the absolute position of each row, >= 0.
 * For pair (a, b) of a head of row t, with angle = positions[t] * freq_i:
 *   a' = a cos(angle) - b sin(angle),  b' = b cos(angle) + a sin(angle).
 * Columns past rotary_dim of each head, and the padding between rows, are not
 * written. Angles are taken in float64; error per output element, u = 2^-24:
 * |x' - exact| <= 4 u (|a| + |b|) for positions < 2^31.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a NULL rope, positions
 * or x, head_dim < 1, rows or cols < 1, cols not a multiple of head_dim, a
 * stride (other than 0) < cols, a bad rope field (rotary_dim odd, < 2 or >
 * head_dim, a value out of the range above, a layout or scaling that is not
 * one of the enum's; the message names it, e.g. "rope.rotary_dim"), a
 * negative position (the message names its index); HW_RESOURCE_EXHAUSTED
 * when x at its stride overflows the address space, or no memory. */
HEADWAY_C_API int hw_apply_rope(const hw_rope_config* rope, int64_t head_dim,
                                const int64_t* positions, float* x,
                                int64_t rows, int64_t cols, int64_t stride);

/* RMSNorm of every head of every row of x in place (headway::RmsNormHeads,
 * QK-norm):
 *   x_i' = x_i / sqrt(mean_j x_j^2 + eps) * weight[i]
 *   x: [rows, cols] at row stride `stride` (0: dense), cols = n_heads *
 *      head_dim; weight: [head_dim], shared by the heads.
 * Sums are taken in float64: |x' - exact| <= 2^-24 |exact| (1 + 2^-20). A
 * head holding a NaN or an inf becomes all NaN; an all-zero head with eps == 0
 * stays zero.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a NULL x or weight,
 * head_dim < 1, rows or cols < 1, cols not a multiple of head_dim, a stride
 * (other than 0) < cols, a weight element that is not finite (the message
 * names its index), eps < 0 or not finite, weight overlapping x;
 * HW_RESOURCE_EXHAUSTED when x at its stride overflows the address space. */
HEADWAY_C_API int hw_rms_norm_heads(float* x, int64_t rows, int64_t cols,
                                    int64_t stride, int64_t head_dim,
                                    const float* weight, float eps);

/* ------------------------------------------------------- Attention layer */

/* One MHA / GQA / MQA attention layer with its packed weights:
 *   Q = x W_Q + b_q, K = x W_K + b_k, V = x W_V + b_v
 *   Q_h, K_g = RoPE(RMSNorm(Q_h)), RoPE(RMSNorm(K_g))  (each optional: see
 *                                            hw_attention_layer_variants)
 *   o_h = softmax(scale * Q_h K_g^T + mask) V_g, g = h / (n_heads / n_kv_heads)
 *         (with the attention variants, if any: sliding window, soft-capping,
 *         ALiBi, sink logits, as hw_attention_with_variants applies them)
 *   y = concat_h(o_h) W_O + b_o
 * A layer with a sliding window can keep a ring cache of window +
 * n_sink_tokens rows per sequence (hw_attention_layer_create_ring_cache).
 * See headway/layer.h. */
typedef struct hw_attention_layer hw_attention_layer;

/* Mask values, the same as headway::AttentionMask's. HW_MASK_CAUSAL is 0 so
 * that a zeroed config or hw_attention_options is causal, the default. */
typedef enum hw_attention_mask {
  HW_MASK_CAUSAL = 0, /* a token sees its sequence's tokens up to itself */
  HW_MASK_NONE = 1    /* a token sees every cached token of its sequence */
} hw_attention_mask;

/* The layer's shape. A zeroed struct plus d_model and n_heads is a causal MHA
 * layer: every field's zero means the same default as AttentionLayerConfig. */
typedef struct hw_attention_layer_config {
  int64_t d_model; /* >= 1 */
  int64_t n_heads; /* >= 1 */
  /* KV heads: 0 means n_heads (MHA); 1 is MQA; a divisor of n_heads is GQA. */
  int64_t n_kv_heads;
  /* Elements per head; 0 means d_model / n_heads (which must divide). */
  int64_t head_dim;
  int32_t mask; /* hw_attention_mask; 0 (HW_MASK_CAUSAL) by default */
  /* Multiplies q . k; 0 means 1 / sqrt(head_dim). */
  float scale;
  /* Tensor parallelism: the query heads this layer owns, [head_begin,
   * head_end), on KV-group boundaries; both 0 means all heads. A shard's
   * forward returns its part of the output (b_o added by the shard with
   * head_begin == 0 only): the shards' outputs sum to the layer's. */
  int64_t head_begin;
  int64_t head_end;
} hw_attention_layer_config;

/* A read-only float32 matrix [rows, cols], element (r, c) at
 * data[r * stride + c]; stride 0 means cols. rows and cols are the caller's
 * statement of the shape: they are checked against the config. */
typedef struct hw_matrix {
  const float* data;
  int64_t rows;
  int64_t cols;
  int64_t stride;
} hw_matrix;

/* The whole layer's weights (for a shard too: the layer takes its own
 * columns and rows). Biases may be NULL (no bias). Copied and packed by
 * create: the host may free them afterwards. */
typedef struct hw_attention_layer_weights {
  hw_matrix w_q;    /* [d_model, n_heads * head_dim] */
  hw_matrix w_k;    /* [d_model, n_kv_heads * head_dim] */
  hw_matrix w_v;    /* [d_model, n_kv_heads * head_dim] */
  hw_matrix w_o;    /* [n_heads * head_dim, d_model] */
  const float* b_q; /* [n_heads * head_dim] or NULL */
  const float* b_k; /* [n_kv_heads * head_dim] or NULL */
  const float* b_v; /* [n_kv_heads * head_dim] or NULL */
  const float* b_o; /* [d_model] or NULL */
} hw_attention_layer_weights;

/* How a layer stores its packed weights, the same values as
 * headway::WeightDtype (matmul.h). */
typedef enum hw_weight_dtype {
  HW_WEIGHT_FLOAT32 = 0,  /* 4 bytes per weight, as given */
  HW_WEIGHT_BFLOAT16 = 1, /* 2 bytes: bfloat16, rounded to nearest even */
  HW_WEIGHT_INT8 = 2      /* 1 byte, plus a float scale per output feature */
} hw_weight_dtype;

/* What a layer's projections multiply in, the same values as
 * headway::MatmulCompute (matmul.h). */
typedef enum hw_matmul_compute {
  HW_COMPUTE_FLOAT32 = 0, /* the inputs as they are, float32 accumulation */
  /* The inputs (x, and the attention output before W_O) rounded to bfloat16,
   * times bfloat16 or int8 weights, pairs of products summed in float32 (AMX
   * tiles on Intel's cores from Sapphire Rapids on, for more than 16 tokens:
   * 6x float32's GEMM speed at 2048^3 on one core, measured; with
   * AVX512_BF16 on AMD's cores: 1.8x on Zen 5; elsewhere float32's speed). */
  HW_COMPUTE_BFLOAT16 = 1
} hw_matmul_compute;

/* What attention multiplies in, the same values as
 * headway::AttentionCompute (attention.h, which states the bound). */
typedef enum hw_attention_compute {
  HW_ATTENTION_FLOAT32 = 0, /* q, the weights and K, V as float32 */
  /* A bfloat16 cache only: where a sequence's query rows per KV head (tokens
   * times query heads per KV head) number 2 to the target's float lanes - 1
   * (GQA decode, a few tokens at a time), q and the softmax weights rounded
   * to bfloat16 and multiplied with the stored K and V, sums in float32 (with
   * AVX512_BF16 on AMD's cores: vdpbf16ps, GQA-8 decode 1.15x faster on Zen
   * 4, measured); with more rows (prefill; head_dim a multiple of 32, at
   * most 32 query heads per KV head), the same on AMX tiles where the CPU has
   * them (causal prefill about 3.3x faster), else with vdpbf16ps on AMD's
   * cores (about 1.6x on Zen 5);
   * the rest as HW_ATTENTION_FLOAT32. */
  HW_ATTENTION_BFLOAT16 = 1,
  /* An int8 cache only: where a sequence's query rows per KV head number 1
   * to the target's float lanes - 1 (MHA and GQA decode, a few tokens at a
   * time), q quantized to int8 per row as the cache quantizes its rows, the
   * scores exact integer dot products with the stored K times the scales,
   * the softmax weights (times V's scales) quantized to 15-bit integers per
   * block of 128 keys and summed with the stored V (with AVX512_VNNI:
   * vpdpbusd and vpdpwssd); the rest as HW_ATTENTION_FLOAT32. attention.h's
   * AttentionCompute::kInt8 states the bound. */
  HW_ATTENTION_INT8 = 2
} hw_attention_compute;

/* What a layer does beyond hw_attention_layer_config's plain attention (Qwen3,
 * Gemma 2 and 3, Llama 3, Mistral, OLMo 2, gpt-oss, BLOOM layers) and how it
 * stores its weights: a struct that grows, one field group per variant, each
 * off (the default) when zeroed. Set struct_size to
 * sizeof(hw_attention_layer_variants) and zero the rest (memset) before
 * setting fields, so that a field this header adds later reads as off.
 * Version 1 ends after `sink_logits` (HW_ATTENTION_LAYER_VARIANTS_V1_SIZE
 * bytes); version 2 adds `n_sink_tokens` (HW_ATTENTION_LAYER_VARIANTS_V2_SIZE
 * bytes), version 3 `weight_dtype` and `projection_compute`
 * (HW_ATTENTION_LAYER_VARIANTS_V3_SIZE bytes), version 4
 * `attention_compute` (HW_ATTENTION_LAYER_VARIANTS_V4_SIZE bytes); a
 * struct_size of an earlier version reads the later fields as 0. Its fields
 * from `window` to `n_sink_tokens`, and `attention_compute`, are
 * hw_attention_variants' (the same names, meanings and checks), flat here
 * rather than a nested struct so that the layer's struct has one struct_size
 * and an error names the field the same way in both ("variants.window"). */
typedef struct hw_attention_layer_variants {
  size_t struct_size; /* sizeof(hw_attention_layer_variants) */
  /* QK-norm: 1 applies, after the bias, RMSNorm (hw_rms_norm_heads) to every
   * Q head with q_norm and every K head with k_norm; 0: none. */
  int32_t qk_norm;
  /* With qk_norm: >= 0, finite; 0 means 1e-6 (so eps == 0 itself cannot be
   * asked for: 1e-45f, the smallest denormal, is the nearest). */
  float qk_norm_eps;
  const float* q_norm; /* with qk_norm: [head_dim]; otherwise ignored */
  const float* k_norm; /* with qk_norm: [head_dim]; otherwise ignored */
  /* RoPE of Q and K after QK-norm (as hw_apply_rope), at each token's
   * absolute position: its sequence's cache length before the forward call
   * plus its index among the call's tokens of that sequence. K is cached
   * rotated. rope.rotary_dim == 0: none (the other rope fields ignored). */
  hw_rope_config rope;
  /* The layer's attention variants, as hw_attention_variants' fields (see
   * there): a sliding window of `window` tokens (>= 0; 0: none), logit
   * soft-capping (finite, >= 0; 0: none), and per-head ALiBi slopes and sink
   * logits (finite; NULL: none). alibi_slopes and sink_logits are the whole
   * model's [config.n_heads], also for a shard (which reads its own heads'
   * [head_begin, head_end)); create copies them. */
  int64_t window;
  float softcap;
  const float* alibi_slopes;
  const float* sink_logits;
  /* Version 2: StreamingLLM's sink tokens, as hw_attention_variants'
   * n_sink_tokens (>= 0; 0: none): with a window, the first n_sink_tokens
   * positions of a sequence stay visible. A layer with a window can keep a
   * ring cache of window + n_sink_tokens rows per sequence
   * (hw_attention_layer_create_ring_cache). */
  int64_t n_sink_tokens;
  /* Version 3: how the packed W_QKV and W_O are stored, a hw_weight_dtype
   * (0: float32; bfloat16 halves the bytes a decode step reads, int8 quarters
   * them), and what the projections multiply in, a hw_matmul_compute (0:
   * float32; HW_COMPUTE_BFLOAT16 needs HW_WEIGHT_BFLOAT16 or HW_WEIGHT_INT8).
   * The weights are given as float32 whatever the dtype; create stores
   * them. */
  int32_t weight_dtype;
  int32_t projection_compute;
  /* Version 4: what attention decode multiplies in, as
   * hw_attention_variants' attention_compute (a hw_attention_compute; 0:
   * float32; HW_ATTENTION_BFLOAT16 needs the layer's cache in bfloat16,
   * HW_ATTENTION_INT8 in int8, checked by each forward). */
  int32_t attention_compute;
} hw_attention_layer_variants;

/* The size of version 1 of hw_attention_layer_variants, the smallest
 * struct_size accepted: without n_sink_tokens. */
#define HW_ATTENTION_LAYER_VARIANTS_V1_SIZE \
  (offsetof(hw_attention_layer_variants, sink_logits) + sizeof(const float*))
/* The size of version 2: with n_sink_tokens. */
#define HW_ATTENTION_LAYER_VARIANTS_V2_SIZE \
  (offsetof(hw_attention_layer_variants, n_sink_tokens) + sizeof(int64_t))
/* The size of version 3: with weight_dtype and projection_compute. */
#define HW_ATTENTION_LAYER_VARIANTS_V3_SIZE \
  (offsetof(hw_attention_layer_variants, projection_compute) + sizeof(int32_t))
/* The size of version 4: with attention_compute. */
#define HW_ATTENTION_LAYER_VARIANTS_V4_SIZE \
  (offsetof(hw_attention_layer_variants, attention_compute) + sizeof(int32_t))

/* The new tokens of one sequence in a forward call: n_tokens consecutive rows
 * of x and y, at positions length(seq) .. length(seq) + n_tokens - 1. */
typedef struct hw_layer_sequence {
  int64_t seq; /* slot in the cache */
  int64_t n_tokens;
} hw_layer_sequence;

/* Validates config and weights, copies and packs the weights (for the
 * instruction set active now) into a new layer *out.
 * Errors: HW_INVALID_ARGUMENT for a NULL config, weights or out, d_model or
 * n_heads < 1, n_kv_heads < 0 or not dividing n_heads, head_dim < 0 or 0 with
 * d_model not a multiple of n_heads, a bad head range, a scale that is not
 * finite or < 0, a bad mask, a weight matrix that is NULL, has a bad stride or
 * the wrong shape (the message names it: "w_q", ...); HW_RESOURCE_EXHAUSTED for
 * sizes whose byte count overflows (the message names config.d_model,
 * n_heads, n_kv_heads and head_dim) or no memory. */
HEADWAY_C_API int hw_attention_layer_create(
    const hw_attention_layer_config* config,
    const hw_attention_layer_weights* weights, hw_attention_layer** out);

/* hw_attention_layer_create plus the variants (NULL: none, the same layer as
 * hw_attention_layer_create's). The norm weights, ALiBi slopes and sink
 * logits are copied: the host may free them afterwards.
 * Errors: those of hw_attention_layer_create, and HW_INVALID_ARGUMENT for
 * variants->struct_size smaller than HW_ATTENTION_LAYER_VARIANTS_V1_SIZE,
 * larger than 4096, or larger than this library's
 * sizeof(hw_attention_layer_variants) with a nonzero byte past it (a variant
 * this library does not know; the message gives the byte's offset), qk_norm
 * not 0 or 1, with qk_norm a qk_norm_eps < 0 or not finite, a NULL q_norm or
 * k_norm or one with an element that is not finite, a bad rope field (as
 * hw_apply_rope; rotary_dim must be <= head_dim), a window < 0, an
 * n_sink_tokens < 0, a softcap < 0 or not finite, an alibi_slopes or
 * sink_logits element that is not finite, a weight_dtype that is not a
 * hw_weight_dtype, a projection_compute that is not a hw_matmul_compute or is
 * HW_COMPUTE_BFLOAT16 without HW_WEIGHT_BFLOAT16, with HW_WEIGHT_INT8 a NaN or
 * inf in the weights the layer packs (int8 cannot store it). Messages name
 * the field, e.g. "variants.rope.rotary_dim (5) must be even
 * ...", "variants.sink_logits[3] is not finite (got nan)",
 * "weights.w_k[3, 5] is nan, which int8 weights ... cannot store". */
HEADWAY_C_API int hw_attention_layer_create_with_variants(
    const hw_attention_layer_config* config,
    const hw_attention_layer_weights* weights,
    const hw_attention_layer_variants* variants, hw_attention_layer** out);

/* Frees a layer (NULL: nothing). */
HEADWAY_C_API void hw_attention_layer_destroy(hw_attention_layer* layer);

/* *config = the layer's config with defaults resolved (n_kv_heads, head_dim,
 * scale, head_end filled in). Its variants and weight storage:
 * hw_attention_layer_get_variants.
 * Errors: HW_INVALID_ARGUMENT for a NULL layer or config. */
HEADWAY_C_API int hw_attention_layer_get_config(
    const hw_attention_layer* layer, hw_attention_layer_config* config);

/* Writes the layer's variants into *variants, whose struct_size the caller
 * sets first and which keeps it: the fields up to struct_size are written,
 * those this library does not know as zero (off). Zeros that mean a default
 * read as the default (qk_norm_eps, the rope fields), and a variant that is
 * off as its defaults (qk_norm 0 with qk_norm_eps 1e-6, q_norm and k_norm
 * NULL; rope.rotary_dim 0 with theta 10000, factor 1, ...; window 0, softcap
 * 0, alibi_slopes and sink_logits NULL, n_sink_tokens 0; weight_dtype,
 * projection_compute and attention_compute as created, 0 by default; a
 * struct_size of an earlier
 * version gets none of the later fields). q_norm, k_norm ([head_dim]),
 * alibi_slopes and sink_logits ([n_heads], the whole model's) point at the
 * layer's copies, valid until it is destroyed. A layer from
 * hw_attention_layer_create has every variant off.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a NULL layer or variants,
 * a struct_size smaller than HW_ATTENTION_LAYER_VARIANTS_V1_SIZE or larger
 * than 4096. */
HEADWAY_C_API int hw_attention_layer_get_variants(
    const hw_attention_layer* layer, hw_attention_layer_variants* variants);

/* *n = parameters of the layer (its shard), as AttentionLayer::n_weights:
 * weights plus the biases given, QK-norm's weights and its heads' sink logits;
 * 4 * d_model^2 for an MHA layer without bias with n_heads * head_dim ==
 * d_model. Errors: HW_INVALID_ARGUMENT for a NULL layer or n. */
HEADWAY_C_API int hw_attention_layer_n_weights(const hw_attention_layer* layer,
                                               int64_t* n);

/* *bytes = bytes of the packed weights as stored (variants.weight_dtype:
 * about 4, 2 or 1 per weight of this shard, with panel padding and int8's
 * scales). Errors: HW_INVALID_ARGUMENT for a NULL layer or bytes. */
HEADWAY_C_API int hw_attention_layer_packed_bytes(
    const hw_attention_layer* layer, size_t* bytes);

/* *bytes = bytes of the scratch the layer keeps for its next forward call,
 * grown to its largest call so far (AttentionLayer::scratch_bytes).
 * Errors: HW_INVALID_ARGUMENT for a NULL layer or bytes. */
HEADWAY_C_API int hw_attention_layer_scratch_bytes(
    const hw_attention_layer* layer, size_t* bytes);

/* Frees that scratch (after a long prefill, say); *released, unless NULL,
 * = its bytes. The next forward call allocates again. Not while a forward
 * call of this layer runs. Errors: HW_INVALID_ARGUMENT for a NULL layer. */
HEADWAY_C_API int hw_attention_layer_release_scratch(hw_attention_layer* layer,
                                                     size_t* released);

/* *bytes = float32 KV cache bytes per token of one sequence for this layer
 * (2 * local KV heads * row stride * 4); a cache of another dtype says its own
 * with hw_kv_cache_bytes_per_token.
 * Errors: HW_INVALID_ARGUMENT for a NULL layer or bytes. */
HEADWAY_C_API int hw_attention_layer_cache_bytes_per_token(
    const hw_attention_layer* layer, size_t* bytes);

/* Creates a cache for this layer (its local KV heads and head_dim) with
 * n_sequences slots of `capacity` tokens of element type dtype (a
 * hw_kv_dtype) into *out; the layer's forward writes K and V into it in that
 * type. Free it with hw_kv_cache_destroy.
 * Errors: HW_INVALID_ARGUMENT for a NULL layer or out, n_sequences or
 * capacity < 1, a dtype that is not a hw_kv_dtype; HW_RESOURCE_EXHAUSTED when
 * the byte count overflows or memory runs out. */
HEADWAY_C_API int hw_attention_layer_create_cache_typed(
    const hw_attention_layer* layer, int64_t n_sequences, int64_t capacity,
    int dtype, hw_kv_cache** out);

/* hw_attention_layer_create_cache_typed with dtype HW_KV_FLOAT32. */
HEADWAY_C_API int hw_attention_layer_create_cache(
    const hw_attention_layer* layer, int64_t n_sequences, int64_t capacity,
    hw_kv_cache** out);

/* Creates a ring cache for a layer with a sliding window (headway::
 * AttentionLayer::RingCacheConfig): hw_kv_cache_create_ring with the layer's
 * local KV heads and head_dim, capacity variants.window +
 * variants.n_sink_tokens and the layer's n_sink_tokens, for n_sequences
 * sequences of element type dtype, into *out. Its bytes stay those of
 * capacity rows per sequence however long the sequences grow: the layer's
 * forward takes any number of tokens into it (see
 * hw_attention_layer_forward). Free it with hw_kv_cache_destroy.
 * Errors: HW_INVALID_ARGUMENT for a NULL layer or out, a layer without a
 * window (variants.window 0: a ring would drop keys the layer attends to;
 * use hw_attention_layer_create_cache), n_sequences < 1, a dtype that is not
 * a hw_kv_dtype; HW_RESOURCE_EXHAUSTED when the byte count overflows (the
 * message names the sizes) or memory runs out. */
HEADWAY_C_API int hw_attention_layer_create_ring_cache(
    const hw_attention_layer* layer, int64_t n_sequences, int dtype,
    hw_kv_cache** out);

/* Runs the layer over the new tokens of n_sequences sequences:
 *   x: [T, d_model], T = sum of sequences[i].n_tokens, row stride x_stride
 *      (0: dense); the rows of sequences[0] first, then sequences[1], ...
 *   y: [T, d_model], row stride y_stride (0: dense), written.
 * Appends the tokens' K and V to their sequences in cache (each length grows
 * by its n_tokens), then each token attends to its sequence's cached tokens
 * (up to itself with HW_MASK_CAUSAL). Prefill, chunked prefill and decode
 * (n_tokens == 1 for many sequences) are all this call. Scratch memory is
 * reused: after a first call of a given size, calls no larger allocate
 * nothing (TBB itself allocates when it creates a worker thread, the first
 * time work needs it, and on every call where it runs without its
 * allocator, libtbbmalloc).
 * Ring caches: a layer with a window takes a ring cache
 * (hw_attention_layer_create_ring_cache, or hw_kv_cache_create_ring with
 * capacity >= window + n_sink_tokens and the layer's n_sink_tokens) and a
 * call of any number of tokens: the new tokens attend to the ring's rows
 * before they overwrite them, so a prefill longer than the ring gives the
 * outputs of a plain cache holding every position.
 * Errors (nothing written, cache unchanged): HW_INVALID_ARGUMENT for a NULL
 * layer, cache, sequences, x or y, n_sequences < 1, n_tokens < 1, a bad or
 * repeated seq, a cache whose n_kv_heads or head_dim do not match the layer, a
 * stride (other than 0) < d_model, y overlapping x or the cache, a ring cache
 * with a layer whose window is 0 or more than capacity - n_sink_tokens or
 * whose n_sink_tokens differ from the cache's (the message names the layer's
 * variants.window or variants.n_sink_tokens);
 * HW_OUT_OF_RANGE when a sequence's length + n_tokens exceeds the capacity
 * of a plain cache (n_tokens that sum past INT64_MAX give one of these
 * errors);
 * HW_RESOURCE_EXHAUSTED when x or y at its stride overflows the address space,
 * or no memory; HW_FAILED_PRECONDITION when the active instruction set has
 * another vector width than at create (after hw_set_max_target: create the
 * layer again). */
HEADWAY_C_API int hw_attention_layer_forward(hw_attention_layer* layer,
                                             hw_kv_cache* cache,
                                             const hw_layer_sequence* sequences,
                                             int64_t n_sequences,
                                             const float* x, int64_t x_stride,
                                             float* y, int64_t y_stride);

/* --------------------------------------------------------- Attention core */

/* The attention of new queries against a cache's keys and values, for MHA,
 * GQA and MQA alike (headway/attention.h): query head h of n_heads reads KV
 * head g = h / (n_heads / n_kv_heads); for query row t at position
 * q_pos0 + t,
 *   out[t, h*d : (h+1)*d] = sum_s softmax_s(scale q_h[t] . K_g[s] + M[t, s])
 *                           V_g[s]
 * over the cached rows s < length(seq), M = the causal mask (-inf for
 * s > q_pos0 + t, HW_MASK_CAUSAL only) plus the optional additive mask. A row
 * whose every score is masked gives zeros. K_g and V_g are the cache's rows
 * as stored (hw_kv_load_rows gives them as float32): the calls read them in
 * their hw_kv_dtype and compute in float32. The queries' keys and values must
 * be in the cache already (hw_kv_cache_append first).
 *
 * Ring caches (hw_kv_cache_create_ring): hw_attention_with_variants attends
 * over the positions a ring holds as a plain cache holding every position
 * would (up to float32 summation order), given the variants a ring needs: a
 * window in [1, capacity - n_sink_tokens], n_sink_tokens equal to the
 * cache's, no additive mask. Each query must find its window in the ring: a
 * call can attend at most capacity - n_sink_tokens - window + 1 new tokens of
 * a sequence appended in one go (hw_attention_layer_forward handles longer
 * prefills itself). hw_attention (no window) and the with_weights calls
 * (whose weights would span positions the ring no longer holds) reject a
 * ring cache. */

/* A float32 matrix a call writes; otherwise as hw_matrix. */
typedef struct hw_out_matrix {
  float* data;
  int64_t rows;
  int64_t cols;
  int64_t stride; /* 0: cols */
} hw_out_matrix;

/* A zeroed struct (or NULL options) is the default: causal, scale
 * 1 / sqrt(head_dim). */
typedef struct hw_attention_options {
  int32_t mask; /* hw_attention_mask */
  float scale;  /* multiplies q . k; 0 means 1 / sqrt(head_dim) */
} hw_attention_options;

/* The attention variants models use (headway::AttentionOptions' window,
 * n_sink_tokens, softcap, alibi_slopes and sink_logits), for
 * hw_attention_with_variants and hw_attention_with_weights_and_variants: a
 * struct that grows (see Compatibility at the top), each variant off when
 * zeroed. Set struct_size to sizeof(hw_attention_variants) and zero the rest
 * (memset) before setting fields. Version 1 ends after `sink_logits`
 * (HW_ATTENTION_VARIANTS_V1_SIZE bytes); version 2 adds `n_sink_tokens`
 * (HW_ATTENTION_VARIANTS_V2_SIZE bytes; a struct_size of version 1 reads it
 * as 0), version 3 `attention_compute` (HW_ATTENTION_VARIANTS_V3_SIZE bytes).
 *
 * The score of query head h at position p for the key at position k is, in
 * this order (each step only where its field is set):
 *   s = scale * q . k
 *   s = softcap * tanh(s / softcap)          (Gemma 2's logit soft-capping)
 *   s = s + alibi_slopes[h] * (k - p)        (ALiBi)
 *   s = s + mask[t, k]                       (the query's additive mask)
 * and the key takes part only if k <= p (HW_MASK_CAUSAL) and k > p - window
 * or k < n_sink_tokens (with a window). With sink_logits the softmax's
 * denominator also holds exp(sink_logits[h]) (gpt-oss's attention sinks: a
 * virtual key of that score whose value is zero), so that a row's weights
 * sum to less than 1.
 *
 * Ring caches (hw_kv_cache_create_ring) need these variants:
 * hw_attention_with_variants on a ring takes a window in [1, capacity -
 * n_sink_tokens] and the cache's own n_sink_tokens here, and no additive
 * mask; hw_attention (no variants: window 0) and the with_weights calls
 * reject a ring. */
typedef struct hw_attention_variants {
  size_t struct_size; /* sizeof(hw_attention_variants) */
  /* Sliding window (Mistral, Gemma 2 and 3, gpt-oss): a query at position p
   * sees no key at position <= p - window; >= 0, 0: none. Work follows the
   * keys a query sees (decode reads `window` keys). */
  int64_t window;
  /* Logit soft-capping (Gemma 2: 50); finite, >= 0; 0: none. A score of
   * +inf becomes softcap. */
  float softcap;
  /* [n_heads] per-head ALiBi slopes (hw_alibi_slopes gives the paper's), all
   * finite; NULL: none. Distances k - p are exact below 2^24. */
  const float* alibi_slopes;
  /* [n_heads] per-head sink logits in natural units (gpt-oss), all finite;
   * NULL: none. */
  const float* sink_logits;
  /* Version 2. StreamingLLM's attention sinks (Xiao et al., 2024, keep 4):
   * with a window, keys at positions < n_sink_tokens stay visible to every
   * query that sees them causally; >= 0, 0: none (ignored without a window).
   * Not sink_logits' learned sinks: these are real keys. A ring cache pins
   * its own n_sink_tokens and needs the same value here. */
  int64_t n_sink_tokens;
  /* Version 3. What decode multiplies in, a hw_attention_compute (0:
   * float32); HW_ATTENTION_BFLOAT16 needs a bfloat16 cache,
   * HW_ATTENTION_INT8 an int8 one. The with_weights calls compute in float32
   * whatever it says. */
  int32_t attention_compute;
} hw_attention_variants;

/* The size of version 1 of hw_attention_variants, the smallest struct_size
 * accepted: without n_sink_tokens. */
#define HW_ATTENTION_VARIANTS_V1_SIZE \
  (offsetof(hw_attention_variants, sink_logits) + sizeof(const float*))
/* The size of version 2: with n_sink_tokens. */
#define HW_ATTENTION_VARIANTS_V2_SIZE \
  (offsetof(hw_attention_variants, n_sink_tokens) + sizeof(int64_t))
/* The size of version 3: with attention_compute. */
#define HW_ATTENTION_VARIANTS_V3_SIZE \
  (offsetof(hw_attention_variants, attention_compute) + sizeof(int32_t))

/* The ALiBi paper's slopes for n_heads heads into slopes[0, n_heads)
 * (headway::AlibiSlopes): for n_heads a power of two, 2^(-8 (h + 1) /
 * n_heads) (2^-1 .. 2^-8 for 8 heads); otherwise those of the largest power
 * of two n < n_heads, then every other slope of 2 n (BLOOM's and the paper's
 * code).
 * Errors (nothing written): HW_INVALID_ARGUMENT for n_heads < 1, a NULL
 * slopes. */
HEADWAY_C_API int hw_alibi_slopes(int64_t n_heads, float* slopes);

/* The n_tokens new queries of one sequence. */
typedef struct hw_attention_query {
  int64_t seq;    /* slot in the cache */
  int64_t q_pos0; /* position of q's first row: its row in the cache */
  /* [n_tokens, n_heads * head_dim], head h in columns [h * head_dim,
   * (h + 1) * head_dim). */
  hw_matrix q;
  hw_out_matrix out; /* [n_tokens, n_heads * head_dim], written */
  /* Additive [n_tokens, length(seq)] (-inf allowed), or data NULL: none. */
  hw_matrix mask;
} hw_attention_query;

/* Fused attention of n_queries sequences' queries in one call (prefill,
 * chunked prefill, decode of many sequences); nothing n_tokens x length is
 * materialised. Results are the same for any number of threads.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a NULL cache or queries,
 * n_queries < 1, n_heads < 1 or not a multiple of the cache's n_kv_heads, a
 * bad options->mask, an options->scale that is not finite or < 0, a bad
 * queries[i].seq, q_pos0 < 0, a q or out with NULL data, a q, out or mask
 * (with data) whose rows or cols < 1 or whose stride (other than 0) < cols, q
 * or out not [n_tokens, n_heads * head_dim], a mask not [n_tokens,
 * length(seq)],
 * an out overlapping any q, mask, other out or the cache, a ring cache (it
 * needs a window: hw_attention_with_variants); HW_OUT_OF_RANGE if
 * q_pos0 + n_tokens > length(seq); HW_RESOURCE_EXHAUSTED for a matrix whose
 * byte count overflows, or no memory. The message names the argument, e.g.
 * "hw_attention: queries[1].out.stride (3) is shorter than ...". */
HEADWAY_C_API int hw_attention(const hw_kv_cache* cache, int64_t n_heads,
                               const hw_attention_query* queries,
                               int64_t n_queries,
                               const hw_attention_options* options);

/* The materialised path, for a caller who wants the attention weights, for
 * one sequence: as hw_attention, and
 *   weights[h * n_tokens + t, s] = softmax_s(scale q_h[t] . K_g[s] + M[t, s])
 * written ([n_heads * n_tokens, length(seq)]; hidden entries are 0, except in
 * a row that sees a NaN or +inf score, which is NaN throughout). Memory: the
 * weights are n_heads * n_tokens * length floats.
 * Errors (nothing written): as hw_attention for its one query (NULL query
 * instead of NULL queries), plus weights with NULL data, not [n_heads *
 * n_tokens, length(seq)], a bad stride, or overlapping query->out or a read
 * matrix; HW_INVALID_ARGUMENT for a ring cache, with or without variants
 * (use hw_attention_with_variants). */
HEADWAY_C_API int hw_attention_with_weights(
    const hw_kv_cache* cache, int64_t n_heads, const hw_attention_query* query,
    hw_out_matrix weights, const hw_attention_options* options);

/* hw_attention with the variants (NULL: none, the same as hw_attention):
 * sliding window, soft-capping, ALiBi and sink logits, as
 * hw_attention_variants describes; a key that a row does not see (causal,
 * window or a -inf mask entry) contributes nothing to it. A row whose every
 * key is hidden gives zeros (with or without a sink).
 * Errors: those of hw_attention, and HW_INVALID_ARGUMENT for
 * variants->struct_size smaller than HW_ATTENTION_VARIANTS_V1_SIZE, larger
 * than 4096, or larger than this library's sizeof(hw_attention_variants)
 * with a nonzero byte past it (the message gives the byte's offset), a
 * window < 0, an n_sink_tokens < 0, a softcap < 0 or not finite, an
 * alibi_slopes or sink_logits element that is not finite (the message names
 * its index, e.g. "hw_attention_with_variants: variants.alibi_slopes[2] is
 * not finite"); with a ring cache, HW_INVALID_ARGUMENT for a window not in
 * [1, capacity - n_sink_tokens], an n_sink_tokens other than the cache's, a
 * query with a mask, and HW_OUT_OF_RANGE when the ring no longer holds the
 * window of a query's first token (it was appended with too many tokens
 * after it). */
HEADWAY_C_API int hw_attention_with_variants(
    const hw_kv_cache* cache, int64_t n_heads,
    const hw_attention_query* queries, int64_t n_queries,
    const hw_attention_options* options, const hw_attention_variants* variants);

/* hw_attention_with_weights with the variants (NULL: none, the same as
 * hw_attention_with_weights): the weights are the softmax with the variants
 * applied: 0 for a key outside the window, and with sink_logits a row sums
 * to 1 - exp(sink_logits[h]) / (exp(sink_logits[h]) + sum_s exp(score_s)).
 * Errors: those of hw_attention_with_weights and of
 * hw_attention_with_variants' variants. */
HEADWAY_C_API int hw_attention_with_weights_and_variants(
    const hw_kv_cache* cache, int64_t n_heads, const hw_attention_query* query,
    hw_out_matrix weights, const hw_attention_options* options,
    const hw_attention_variants* variants);

/* ---------------------------------------------------------------- Kernels */

/* op(X): X or its transpose. */
typedef enum hw_transpose { HW_NO_TRANS = 0, HW_TRANS = 1 } hw_transpose;

/* C = alpha * op(A) * op(B) + beta * C, float32, as BLAS sgemm (row-major):
 *   op(A): [m, k]; a is [m, k] (HW_NO_TRANS) or [k, m] (HW_TRANS) as stored,
 *          row stride lda (0: dense)
 *   op(B): [k, n]; b is [k, n] or [n, k], row stride ldb (0: dense)
 *   c:     [m, n], row stride ldc (0: dense)
 * beta == 0 writes C without reading it; alpha == 0 reads neither a nor b.
 * Results do not depend on the number of threads.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a NULL a, b or c, m, n or
 * k < 1, a stride (other than 0) shorter than its row, a bad trans value, c
 * overlapping a or b, alpha or beta not finite; HW_RESOURCE_EXHAUSTED for
 * sizes whose byte count overflows or no memory. */
HEADWAY_C_API int hw_matmul(int trans_a, int trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float* a, int64_t lda,
                            const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc);

/* Softmax of each row of scale * x, numerically stable:
 *   x, y: [rows, cols], row strides x_stride and y_stride (0: dense).
 * y may be x itself with the same stride (in place); any other overlap is an
 * error. A row of all -inf gives zeros.
 * Errors (nothing written): HW_INVALID_ARGUMENT for a NULL x or y, rows or
 * cols < 1, a stride (other than 0) < cols, a partial overlap, a scale that is
 * not finite; HW_RESOURCE_EXHAUSTED for sizes whose byte count overflows. */
HEADWAY_C_API int hw_softmax_rows(int64_t rows, int64_t cols, const float* x,
                                  int64_t x_stride, float* y, int64_t y_stride,
                                  float scale);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HEADWAY_HEADWAY_H_ */

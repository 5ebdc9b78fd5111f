// Matmul: the per-target packing, micro-kernels and blocked driver.
//
// Compiled once per target, in matmul.cc; other modules' per-target code calls
// its entry points there (lib/core/kernels-inl.h), a direct call within the
// target (no second dispatch).
//
// Algorithm (Goto & van de Geijn, "Anatomy of high-performance matrix
// multiplication", 2008, and BLIS), for
// C [M, N] = alpha * op(A) [M, K] * op(B) [K, N] + beta * C:
//
// - K is cut into blocks of at most KC = 512 (MatmulKBlocks: a function of K).
//
// - B is packed into slices [kc][NR] of NR columns (the edge panel
//   zero-padded), laid out [K block][panel][kc][NR] (MatmulPackedLayout): the
//   slices of one K block follow each other in the order the kernels read
//   them. PackedB holds all of them. An unpacked call packs B during the call
//   (MatmulBSource), each slice before its first use: when B fits the L2
//   caches (<= 4 MiB), each thread the slices it uses into a buffer of its own
//   (MatmulOwnB; where that would pack too much twice, all threads one shared
//   copy first); a larger B, where one task has all the rows, into a window of
//   one NC block per task, else into one shared copy (MatmulLazyB). A large B
//   is thus not written to memory and read back.
//
// - A PackedB may store its slices as bf16 or int8 (WeightDtype, same layout,
//   elements of the stored type; int8 with scales [panels][NR] of the columns):
//   the kernels, templated on the stored type T, load B through LoadStored and
//   multiply each int8 column's accumulator by its scale at the store.
//
// - A is packed per K block into strips of MR rows, [MR][KC + 16] (row copies;
//   the padding spreads the rows over L1 sets), in a per-thread buffer.
//
// - The micro-kernel (MatmulTileFull; MatmulTile for the edge tiles) keeps an
//   MR x NR tile of C in registers (MR rows of kNV vectors); per k it does kNV
//   aligned loads of B, MR broadcasts of A and MR * kNV FMAs. At the end of its
//   K block it adds alpha * tile to C (to beta * C on the first block).
//
// - Tasks (tbb::parallel_for, simple partitioner, >= 8 per thread) are blocks
//   of up to MC rows (one thread: up to kMatmulMCOneThread) times groups of
//   panels, numbered panel-group major so that
//   threads work on different parts of B. One task: for each K block: for each
//   NC block of panels (kc x NC of B, 256 KiB, stays in L2): for each strip
//   (A: MR x kc, 25 KiB, stays in L1; packed by its first kernel, while its
//   kernels prefetch the next strip, a line of each row per N k): for each
//   panel: micro-kernel, which prefetches its C tile for writing (and, the
//   native bf16 kernel of 8 rows or more, B 8 pairs ahead).
//
// - Few rows (M <= kMatmulSmallM = 16, decode): one task per group of panels,
//   one group per thread, A packed once for all K blocks; for each K block,
//   for each panel, the 1 or 2 strips. B, the bulk of the bytes, is read
//   once, front to back, in one run per K block and thread; up to 4 rows
//   over float32 or bf16 B packed before the call take the group's panels in
//   pairs half the group apart (MatmulGemvPanelPairs), two runs at once.
//
// Determinism: only KC shapes the arithmetic of an element: its dot product is
// accumulated in registers over one K block in k order, then added to C
// (alpha * acc + C), block after block in order. MC, NC, the loop order and the
// number of threads decide who computes a tile and when, never how: results
// are identical for any thread count, and for packed and unpacked B. Strips
// start at multiples of MR from row 0, panels at multiples of NR.
//
// Edges: strips of fewer than MR rows run a micro-kernel instantiated for that
// row count; columns past N are zeros in the packed panel and are never stored
// (the edge tile is stored one lane at a time). Nothing reads or writes past a
// view (no masked loads: on SSE4 they are full aligned loads).

// Non-SIMD part: normal include guard.
#ifndef HEADWAY_LIB_MATMUL_MATMUL_INL_H_PLAN_
#define HEADWAY_LIB_MATMUL_MATMUL_INL_H_PLAN_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "headway/threads.h"
#include "hwy/aligned_allocator.h"
#include "lib/core/blocks.h"
#include "lib/matmul/matmul_call.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"
#include "tbb/task_arena.h"

namespace headway {

// M up to this many rows takes the streaming (decode) loop order: B is read
// once.
inline constexpr size_t kMatmulSmallM = 16;

// K blocks: the largest block length is max_kc; the blocks of one K are of
// equal length (the last one shorter by less than 4), so K = 600 gives
// 300 + 300 for max_kc = 512, not 512 + 88.
struct MatmulKBlocks : EvenBlocks {
  MatmulKBlocks(size_t k, size_t max_kc)
      : EvenBlocks(k, (k + max_kc - 1) / max_kc, 4) {}
};

}  // namespace headway

#endif  // HEADWAY_LIB_MATMUL_MATMUL_INL_H_PLAN_

// Per-target part: toggle guard, included once per target by foreach_target.h.
#if defined(HEADWAY_LIB_MATMUL_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HEADWAY_LIB_MATMUL_MATMUL_INL_H_
#undef HEADWAY_LIB_MATMUL_MATMUL_INL_H_
#else
#define HEADWAY_LIB_MATMUL_MATMUL_INL_H_
#endif

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lib/core/native_dot-inl.h"
#include "lib/core/storage-inl.h"
#include "lib/core/transpose-inl.h"

HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register blocking. A tile holds MR * kNV accumulators, plus kNV vectors of B
// and one broadcast of A: 12 * 2 + 2 + 1 = 27 of the 32 registers of AVX-512,
// 6 * 2 + 2 + 1 = 15 of the 16 of AVX2/SSE4. Per k the kernel does MR * kNV
// FMAs for kNV + MR loads: on AVX3, 24 FMAs (12 cycles at 2 per cycle on Zen 5)
// for 14 loads (Zen 5 does up to 4 per cycle). NR = 2 vectors keeps the edge
// panel small for head_dim = 64 or 128 (no partial panel at all).
#if HWY_TARGET == HWY_SCALAR
inline constexpr size_t kMatmulMR = 4;
inline constexpr size_t kMatmulNV = 4;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr size_t kMatmulMR = 12;
inline constexpr size_t kMatmulNV = 2;
#else
inline constexpr size_t kMatmulMR = 6;
inline constexpr size_t kMatmulNV = 2;
#endif

using MatmulTag = hn::ScalableTag<float>;
// Columns per vector and per panel (NR). Fixed per target on x86.
inline constexpr size_t kMatmulLanes = hn::MaxLanes(MatmulTag());
inline constexpr size_t kMatmulNR = kMatmulNV * kMatmulLanes;

// K block length: C is updated once per block, and the A strip MR x KC (25 KiB
// on AVX3) stays in L1. KC = 512: 191 vs 184 GFLOP/s at 256 (2048^3).
inline constexpr size_t kMatmulMaxKC = 512;
// Rows per task: the A block MC x KC (384 KiB on AVX3) stays in L2 while the
// NC blocks of B pass under it. 16 strips are 5% faster than 8 at 2048^3.
inline constexpr size_t kMatmulMC = kMatmulMR * 16;
// Rows per task on one thread: up to 86 strips, more than MC so that B is read
// fewer times (2 threads would each pack the A block: 8% slower): 2048^3 bf16
// compute 0.99-1.00x oneDNN's bf16 matmul vs 0.98x at 171 strips.
inline constexpr size_t kMatmulMCOneThread = kMatmulMR * 86;
// Fraction of L2 for an NC block of B.
inline constexpr size_t kMatmulNCDiv = 4;
// Zen 5: 1 MiB of L2 per core.
inline constexpr size_t kMatmulL2Bytes = size_t{1} << 20;

// ---------------------------------------------------------------------------------------------
// Packing.

// PackBSlice for op(B) = b^T, b [n, k]: op(B)[kk][j] = b[j][kk].
HWY_INLINE void PackBSliceTransposed(const float* HWY_RESTRICT b, size_t ldb,
                                     size_t k0, size_t kc, size_t j0,
                                     size_t cols, size_t avail,
                                     float* HWY_RESTRICT dst) {
  constexpr size_t NR = kMatmulNR;
  // 4 x 4 block transposes over chunks of 64 k (the destination rows, 8 KiB
  // on AVX3, stay in L1); each group of 4 rows prefetches the chunk of the
  // rows 16 ahead, an order of reads the hardware prefetchers miss: 14-17 vs
  // 9 GB/s for a B^T [1024, 128] from memory.
  constexpr size_t kChunk = 64;
  for (size_t c0 = 0; c0 < kc; c0 += kChunk) {
    const size_t c1 = std::min(kc, c0 + kChunk);
    size_t j = 0;
#if HWY_TARGET == HWY_SCALAR
    (void)avail;
#else
    constexpr size_t kAheadRows = 16;
    for (; j + 4 <= cols; j += 4) {
      const float* src = b + (j0 + j) * ldb + k0;
      for (size_t i = j + kAheadRows; i < std::min(avail, j + kAheadRows + 4);
           ++i) {
        const float* ahead = b + (j0 + i) * ldb + k0;
        for (size_t kk = c0; kk < c1; kk += 64 / sizeof(float)) {
          hwy::Prefetch(ahead + kk);
        }
      }
      size_t kk = c0;
      for (; kk + 4 <= c1; kk += 4) {
        // Rows j..j+3 of b, k kk..kk+3, to rows kk..kk+3 of dst.
        float* out = dst + kk * NR + j;
        Transpose4x4(src + kk, src + ldb + kk, src + 2 * ldb + kk,
                     src + 3 * ldb + kk, 1.0f, out, out + NR, out + 2 * NR,
                     out + 3 * NR);
      }
      for (; kk < c1; ++kk) {
        for (size_t i = 0; i < 4; ++i) dst[kk * NR + j + i] = src[i * ldb + kk];
      }
    }
#endif
    for (; j < cols; ++j) {
      const float* src = b + (j0 + j) * ldb + k0;
      for (size_t kk = c0; kk < c1; ++kk) dst[kk * NR + j] = src[kk];
    }
    if (cols < NR) {
      for (size_t kk = c0; kk < c1; ++kk) {
        memset(dst + kk * NR + cols, 0, (NR - cols) * sizeof(float));
      }
    }
  }
}

// Packs columns [j0, j0 + cols) and rows [k0, k0 + kc) of op(B), cols <= NR,
// into one slice dst [kc][NR], zeros in the columns past `cols`. op(B) = b [k,
// n] (row stride ldb), or b^T with b [n, k]. Columns [j0, j0 + avail) exist
// (avail >= cols): the transpose prefetches the rows of b ahead of it up to
// there, into the next slice's.
HWY_INLINE void PackBSlice(const float* HWY_RESTRICT b, size_t ldb, bool trans,
                           size_t k0, size_t kc, size_t j0, size_t cols,
                           size_t avail, float* HWY_RESTRICT dst) {
  constexpr size_t NR = kMatmulNR;
  if (trans) {
    PackBSliceTransposed(b, ldb, k0, kc, j0, cols, avail, dst);
    return;
  }
  const MatmulTag d;
  // Rows ldb apart, which the hardware prefetchers do not follow across pages:
  // 32 rows ahead is 10% faster (AVX2, 2048^3, unpacked B).
  constexpr size_t kAhead = 32;
  for (size_t kk = 0; kk < kc; ++kk) {
    const float* src = b + (k0 + kk) * ldb + j0;
    if (kk + kAhead < kc) {
      hwy::Prefetch(src + kAhead * ldb);
      hwy::Prefetch(src + kAhead * ldb + cols - 1);
    }
    float* out = dst + kk * NR;
    if (cols == NR) {
      for (size_t v = 0; v < kMatmulNV; ++v) {
        hn::Store(hn::LoadU(d, src + v * kMatmulLanes), d,
                  out + v * kMatmulLanes);
      }
    } else {
      memcpy(out, src, cols * sizeof(float));
      memset(out + cols, 0, (NR - cols) * sizeof(float));
    }
  }
}

// Layout of a packed op(B) [k, n]: [K blocks][panels][kc][NR], panels of NR
// columns (the last zero-padded), so that the slices of one K block lie one
// after the other in the order the kernels read them and the hardware
// prefetcher streams them.
struct MatmulPackedLayout {
  MatmulPackedLayout(size_t k, size_t n)
      : kblocks(k, kMatmulMaxKC),
        panels((n + kMatmulNR - 1) / kMatmulNR),
        k(k) {}
  size_t Floats() const { return panels * kMatmulNR * k; }
  // Offset of the [kc][NR] slice of K block kb and panel p.
  size_t Slice(size_t kb, size_t p) const {
    return kblocks.Begin(kb) * panels * kMatmulNR +
           p * kblocks.Size(kb, k) * kMatmulNR;
  }
  MatmulKBlocks kblocks;
  size_t panels;
  size_t k;
};

// Floats of the packed op(B) [k, n].
HWY_INLINE size_t PackedBFloats(size_t k, size_t n) {
  return MatmulPackedLayout(k, n).Floats();
}

// Packs slice (kb, p) of op(B) = [op(parts[0]) | op(parts[1]) | ...] [k, n]
// (parts in column order, covering [0, n)) into slice [kc][NR]. A panel inside
// one float part is packed from it by PackBSlice, inside one bf16 part from a
// float copy of its block; one that straddles parts (at most n_parts - 1 of
// them) is gathered element by element. Either way the slice holds exactly
// what packing the whole matrix as floats would write.
HWY_INLINE void PackBPartsSlice(const MatmulBPart* parts, size_t n_parts,
                                const MatmulPackedLayout& layout, size_t n,
                                size_t kb, size_t p,
                                float* HWY_RESTRICT slice) {
  constexpr size_t NR = kMatmulNR;
  const size_t k0 = layout.kblocks.Begin(kb);
  const size_t kc = layout.kblocks.Size(kb, layout.k);
  const size_t j0 = p * NR, j1 = std::min(n, j0 + NR);
  size_t q = 0;  // the part that holds column j0
  while (q + 1 < n_parts && parts[q].begin + parts[q].cols <= j0) ++q;
  const MatmulBPart& part = parts[q];
  if (j1 <= part.begin + part.cols) {
    const size_t col = j0 - part.begin, cols = j1 - j0;
    if (part.b != nullptr) {
      PackBSlice(part.b, part.ldb, part.trans, k0, kc, col, cols,
                 part.cols - col, slice);
      return;
    }
    // bf16: the block as floats, [kc][cols] (op(B) = b) or [cols][kc].
    thread_local std::vector<float> block;
    block.resize(kc * cols);
    for (size_t r = 0; r < (part.trans ? cols : kc); ++r) {
      for (size_t c = 0; c < (part.trans ? kc : cols); ++c) {
        block[r * (part.trans ? kc : cols) + c] =
            part.trans ? part.At(col + r, k0 + c) : part.At(k0 + r, col + c);
      }
    }
    PackBSlice(block.data(), part.trans ? kc : cols, part.trans, 0, kc, 0, cols,
               cols, slice);
    return;
  }
  for (size_t kk = 0; kk < kc; ++kk) {
    float* out = slice + kk * NR;
    size_t at = q;
    for (size_t j = j0; j < j1; ++j) {
      while (at + 1 < n_parts && parts[at].begin + parts[at].cols <= j) ++at;
      const MatmulBPart& src = parts[at];
      const size_t col = j - src.begin, row = k0 + kk;
      out[j - j0] = src.trans ? src.At(col, row) : src.At(row, col);
    }
    std::fill(out + (j1 - j0), out + NR, 0.0f);
  }
}

// Packs all of op(B) = [parts] [k, n] (see PackBPartsSlice) into dst
// (PackedBFloats(k, n) floats, 64-byte aligned), panels in parallel.
HWY_INLINE void PackBPanelsParts(const MatmulBPart* parts, size_t n_parts,
                                 size_t k, size_t n, float* dst) {
  constexpr size_t NR = kMatmulNR;
  const MatmulPackedLayout layout(k, n);
  // ~64 KiB of packed output per task at least: below that a task costs more
  // than it saves.
  const size_t grain = std::max<size_t>(1, 16384 / (k * NR));
  tbb::parallel_for(tbb::blocked_range<size_t>(0, layout.panels, grain),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t kb = 0; kb < layout.kblocks.count; ++kb) {
                        for (size_t p = range.begin(); p < range.end(); ++p) {
                          PackBPartsSlice(parts, n_parts, layout, n, kb, p,
                                          dst + layout.Slice(kb, p));
                        }
                      }
                    });
}

// Packs all of op(B) [k, n] into dst (PackedBFloats(k, n) floats, 64-byte
// aligned), panels in parallel.
HWY_INLINE void PackBPanels(const float* b, size_t ldb, bool trans, size_t k,
                            size_t n, float* dst) {
  const MatmulBPart whole{b, ldb, trans, 0, n};
  PackBPanelsParts(&whole, 1, k, n, dst);
}

// Packs op(B) = [parts] [k, n] (see PackBPartsSlice) into dst in the
// MatmulPackedLayout with elements of T, panels in parallel, each panel
// through a float copy of it in the calling thread ([K][NR], k * NR floats).
// bf16: each element rounded to nearest even (StoreRowVec, storage.h's rule),
// slices in pairs of rows (MatmulBPairs). int8: storage.h's Int8Scale and
// Int8FromFloat per column instead of per row, scales[j] = Int8Scale(max_k
// |B[k, j]|) into scales [panels * NR] (0 in the padding). Returns -1, or
// (int8) the first column with a NaN or inf, dst then unset.
template <class T>
HWY_INLINE int64_t PackBStored(const MatmulBPart* parts, size_t n_parts,
                               size_t k, size_t n, T* HWY_RESTRICT dst,
                               float* HWY_RESTRICT scales) {
  constexpr size_t NR = kMatmulNR;
  const MatmulPackedLayout layout(k, n);
  std::atomic<int64_t> first_bad{-1};
  const size_t grain = std::max<size_t>(1, 16384 / (k * NR));
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, layout.panels, grain),
      [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
        const MatmulTag d;
        // [K][NR], slice kb at k0 NR, aligned for PackBSlice's stores.
        thread_local ThreadScratchBuffer panel_scratch;
        float* panel = panel_scratch.Get(k * NR);
        for (size_t p = range.begin(); p < range.end(); ++p) {
          for (size_t kb = 0; kb < layout.kblocks.count; ++kb) {
            PackBPartsSlice(parts, n_parts, layout, n, kb, p,
                            panel + layout.kblocks.Begin(kb) * NR);
          }
          if constexpr (!internal::kKvScaled<T>) {
            (void)scales;
            // Rounded row by row into `rows`, then pairs of rows interleaved
            // (MatmulBPairs).
            thread_local std::vector<T> rows;
            rows.resize(kMatmulMaxKC * NR);
            for (size_t kb = 0; kb < layout.kblocks.count; ++kb) {
              const size_t kc = layout.kblocks.Size(kb, k);
              StoreRowVec(d, panel + layout.kblocks.Begin(kb) * NR, kc * NR,
                          rows.data(), nullptr);
              T* slice = dst + layout.Slice(kb, p);
              for (size_t kk = 0; kk < kc / 2 * 2; ++kk) {
                for (size_t j = 0; j < NR; ++j) {
                  slice[(kk / 2 * NR + j) * 2 + kk % 2] = rows[kk * NR + j];
                }
              }
              std::copy(rows.data() + kc / 2 * 2 * NR, rows.data() + kc * NR,
                        slice + kc / 2 * 2 * NR);
            }
          } else {
            float max_abs[NR] = {};
            bool finite[NR];
            std::fill(finite, finite + NR, true);
            for (size_t kk = 0; kk < k; ++kk) {
              for (size_t j = 0; j < NR; ++j) {
                const float x = std::fabs(panel[kk * NR + j]);
                finite[j] = finite[j] && x <= hwy::HighestValue<float>();
                max_abs[j] = std::fmax(max_abs[j], x);
              }
            }
            for (size_t j = 0; j < NR; ++j) {
              if (finite[j]) continue;
              const int64_t column = static_cast<int64_t>(p * NR + j);
              int64_t seen = first_bad.load(std::memory_order_relaxed);
              while ((seen < 0 || column < seen) &&
                     !first_bad.compare_exchange_weak(seen, column)) {
              }
              break;
            }
            float* panel_scales = scales + p * NR;
            for (size_t j = 0; j < NR; ++j) {
              panel_scales[j] = internal::Int8Scale(max_abs[j]);
            }
            for (size_t kb = 0; kb < layout.kblocks.count; ++kb) {
              const float* src = panel + layout.kblocks.Begin(kb) * NR;
              T* slice = dst + layout.Slice(kb, p);
              for (size_t kk = 0; kk < layout.kblocks.Size(kb, k); ++kk) {
                for (size_t j = 0; j < NR; ++j) {
                  slice[kk * NR + j] = internal::Int8FromFloat(src[kk * NR + j],
                                                               panel_scales[j]);
                }
              }
            }
          }
        }
      });
  return first_bad.load();
}

// Row stride of a packed A strip: KC plus one cache line, so that the MR rows
// of a strip fall into different L1 sets (1088 bytes apart on every target),
// and the kernel addresses row r with a constant displacement r *
// kMatmulAStride.
inline constexpr size_t kMatmulAStride = kMatmulMaxKC + 16;
// Floats of one packed A strip.
inline constexpr size_t kMatmulAStripFloats = kMatmulMR * kMatmulAStride;

// Packs rows [i0, i0 + rows), rows <= MR, and k in [k0, k0 + kc), kc <= KC, of
// op(A) into one strip dst [MR][kMatmulAStride] (rows past `rows` are left
// unset: the kernel for `rows` rows does not read them). op(A) = a [m, k] (row
// stride lda): row copies; or a^T with a [k, m].
HWY_INLINE void PackAStrip(const float* HWY_RESTRICT a, size_t lda, bool trans,
                           size_t i0, size_t rows, size_t k0, size_t kc,
                           float* HWY_RESTRICT dst) {
  constexpr size_t S = kMatmulAStride;
  if (!trans) {
    for (size_t r = 0; r < rows; ++r) {
      memcpy(dst + r * S, a + (i0 + r) * lda + k0, kc * sizeof(float));
    }
    return;
  }
  for (size_t kk = 0; kk < kc; ++kk) {
    const float* src = a + (k0 + kk) * lda + i0;
    for (size_t r = 0; r < rows; ++r) dst[r * S + kk] = src[r];
  }
}

// How a call multiplies (MatmulCompute with the kernel that runs it):
//   kMatmulFloat32      op(A) as is, float FMAs;
//   kMatmulBF16Fallback op(A) rounded to bf16 (nearest even), float FMAs (the
//                       products of bf16 values are exact in float);
//   kMatmulBF16Native   op(A) rounded to bf16, vdpbf16ps on pairs of k (AVX3
//                       targets on CPUs with AVX512_BF16 only).
enum MatmulMode : int {
  kMatmulFloat32 = 0,
  kMatmulBF16Fallback = 1,
  kMatmulBF16Native = 2,
};

// An element of A as the bf16 kernels (native, AMX) read it: a float rounded
// (storage.h's rule), a bf16 as it is.
HWY_INLINE hwy::bfloat16_t MatmulBF16Element(float x) {
  return internal::BF16FromFloat(x);
}
HWY_INLINE hwy::bfloat16_t MatmulBF16Element(hwy::bfloat16_t x) { return x; }

// PackAStrip for `mode`: kMatmulBF16Fallback rounds the floats to bf16 (and
// back); kMatmulBF16Native stores each row as bf16, [kMatmulAStride / 2]
// pairs of k as uint32 (k even in the low half), with a zero after the last k
// of an odd kc. A bf16 A (TA; the bf16 modes only) is taken as it is: widened
// (exact) for the fallback, copied for the native kernel.
template <int kMode, class TA>
HWY_INLINE void PackAStripMode(const TA* HWY_RESTRICT a, size_t lda, bool trans,
                               size_t i0, size_t rows, size_t k0, size_t kc,
                               float* HWY_RESTRICT dst) {
  if constexpr (!hwy::IsSame<TA, float>()) {
    static_assert(kMode != kMatmulFloat32, "a bf16 A: bf16 compute only");
    for (size_t r = 0; r < rows; ++r) {
      // Row i0 + r of op(A) from k0 on: a row of a, or a column of a^T
      // (elements lda apart).
      const TA* row = trans ? a + k0 * lda + i0 + r : a + (i0 + r) * lda + k0;
      float* out = dst + r * kMatmulAStride;
      if constexpr (kMode == kMatmulBF16Native) {
        hwy::bfloat16_t* pairs = reinterpret_cast<hwy::bfloat16_t*>(out);
        if (trans) {
          for (size_t kk = 0; kk < kc; ++kk) pairs[kk] = row[kk * lda];
        } else {
          std::copy(row, row + kc, pairs);
        }
        if (kc % 2 != 0) pairs[kc].bits = 0;
      } else if (trans) {
        for (size_t kk = 0; kk < kc; ++kk) {
          out[kk] = internal::FloatFrom(row[kk * lda]);
        }
      } else {
        WidenRowU(MatmulTag(), row, kc, out);
      }
    }
  } else if constexpr (kMode == kMatmulFloat32) {
    PackAStrip(a, lda, trans, i0, rows, k0, kc, dst);
  } else {
    constexpr size_t S = kMatmulAStride;
    const MatmulTag d;
    const hn::RebindToUnsigned<MatmulTag> du;
    const size_t lanes = hn::Lanes(d);
    HWY_ALIGN float gathered[kMatmulMaxKC];  // a row of A^T's strip
    for (size_t r = 0; r < rows; ++r) {
      if (trans) {
        for (size_t kk = 0; kk < kc; ++kk) {
          gathered[kk] = a[(k0 + kk) * lda + i0 + r];
        }
      }
      const float* row = trans ? gathered : a + (i0 + r) * lda + k0;
      float* out = dst + r * S;
      if constexpr (kMode == kMatmulBF16Native) {
        hwy::bfloat16_t* pairs = reinterpret_cast<hwy::bfloat16_t*>(out);
        StoreRowVec(d, row, kc, pairs, nullptr);
        if (kc % 2 != 0) pairs[kc].bits = 0;
      } else {
        size_t kk = 0;
        for (; kk + lanes <= kc; kk += lanes) {
          const auto bits =
              hn::PromoteTo(du, BF16Bits(d, hn::LoadU(d, row + kk)));
          hn::Store(hn::BitCast(d, hn::ShiftLeft<16>(bits)), d, out + kk);
        }
        for (; kk < kc; ++kk) {
          out[kk] = internal::FloatFromBF16(internal::BF16FromFloat(row[kk]));
        }
      }
    }
  }
}

// Part of what PackAStrip reads for the next strip of A, which one kernel
// prefetches as it runs: `rows` rows in memory of `bytes` bytes, the first at
// row0, `pitch` bytes apart (rows == 0: none); MR rows of kc elements of A for
// op(A) = A, kc rows of MR for A^T. The full kernel spreads it over its chunks,
// a line of each row per N k, so that it leaves L1 miss buffers to the loads
// of B: 17% faster than all at once (per-head 1024 x 128 x 1024, one thread).
struct MatmulAPrefetch {
  const char* row0 = nullptr;
  size_t pitch = 0;
  size_t rows = 0;
  size_t bytes = 0;

  // `rows` rows of `cols` elements of A (float or bf16) from row0, lda apart.
  template <class TA>
  static MatmulAPrefetch Rows(const TA* row0, size_t lda, size_t rows,
                              size_t cols) {
    return {reinterpret_cast<const char*>(row0), lda * sizeof(TA), rows,
            cols * sizeof(TA)};
  }

  // Line `line` of every row (64 bytes from the row's start: lines of the
  // source need not start there), and with `last` also each row's last byte.
  HWY_INLINE void Line(size_t line, bool last) const {
    const size_t offset = line * 64;
    for (size_t r = 0; r < rows; ++r) {
      const char* row = row0 + r * pitch;
      if (offset < bytes) hwy::Prefetch(row + offset);
      if (last) hwy::Prefetch(row + bytes - 1);
    }
  }
  // All of it at once (for the edge kernels).
  HWY_INLINE void All() const {
    for (size_t line = 0; line * 64 < bytes; ++line) {
      Line(line, (line + 1) * 64 >= bytes);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Micro-kernel.

// A bf16 slice [kc][NR] holds its rows in pairs: [kc / 2][NR][2], element
// (kk, j) at (kk / 2 * NR + j) * 2 + kk % 2, then for odd kc the last row as
// is, [NR]. One aligned load of 2N bf16 gives rows kk and kk + 1 of N columns
// as floats with a shift and a mask (MatmulLoadBPair), where a row on its own
// takes a widening shuffle; and it is the operand layout of vdpbf16ps.
template <class T>
inline constexpr bool kMatmulBPairs = hwy::IsSame<T, hwy::bfloat16_t>();

// Rows 2 kp and 2 kp + 1, columns [v N, v N + N), of a bf16 slice as floats.
template <class V>
HWY_INLINE void MatmulLoadBPair(const hwy::bfloat16_t* HWY_RESTRICT slice,
                                size_t kp, size_t v, V* even, V* odd) {
  const MatmulTag d;
  const hn::RebindToUnsigned<MatmulTag> du;
  const auto bits = hn::Load(du, reinterpret_cast<const uint32_t*>(slice) +
                                     kp * kMatmulNR + v * kMatmulLanes);
  *even = hn::BitCast(d, hn::ShiftLeft<16>(bits));
  *odd = hn::BitCast(d, hn::And(bits, hn::Set(du, 0xFFFF0000u)));
}

// Row kk (of kc), columns [v N, v N + N), of a slice of T as floats.
template <class T>
HWY_INLINE hn::Vec<MatmulTag> MatmulLoadBRow(const T* HWY_RESTRICT slice,
                                             size_t kk, size_t kc, size_t v) {
  const MatmulTag d;
  if constexpr (kMatmulBPairs<T>) {
    if (kk < kc / 2 * 2) {
      hn::Vec<MatmulTag> even, odd;
      MatmulLoadBPair(slice, kk / 2, v, &even, &odd);
      return kk % 2 == 0 ? even : odd;
    }
  } else {
    (void)kc;
  }
  return LoadStored(d, slice + kk * kMatmulNR + v * kMatmulLanes);
}

// The bf16 slice (the MatmulBPairs layout) of an int8 slice [kc][NR], into
// dst [kc][NR]: each level q as the bf16 of the same value, exact (|q| <= 127
// has at most 7 significant bits), so that the bf16 compute kernels multiply
// int8 weights; their column scales stay with the caller (MatmulScaleRow).
HWY_INLINE void MatmulBF16SliceFromInt8(const int8_t* HWY_RESTRICT src,
                                        size_t kc,
                                        hwy::bfloat16_t* HWY_RESTRICT dst) {
  const MatmulTag d;
  const hn::RebindToSigned<MatmulTag> di;
  const hn::RebindToUnsigned<MatmulTag> du;
  const hn::Rebind<int8_t, MatmulTag> d8;
  constexpr size_t N = kMatmulLanes;
  constexpr size_t NR = kMatmulNR;
  // A float's bits, whose low half is zero for these values.
  const auto bits = [&](const int8_t* q) HWY_ATTR {
    return hn::BitCast(du,
                       hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, q))));
  };
  const auto high = hn::Set(du, 0xFFFF0000u);
  uint32_t* pairs = reinterpret_cast<uint32_t*>(dst);
  for (size_t kp = 0; kp < kc / 2; ++kp) {
    for (size_t j = 0; j < NR; j += N) {
      const auto even = bits(src + 2 * kp * NR + j);
      const auto odd = bits(src + (2 * kp + 1) * NR + j);
      hn::StoreU(hn::Or(hn::And(odd, high), hn::ShiftRight<16>(even)), du,
                 pairs + kp * NR + j);
    }
  }
  if (kc % 2 != 0) {
    const size_t last = (kc - 1) * NR;
    for (size_t j = 0; j < NR; ++j) {
      dst[last + j] =
          internal::BF16FromFloat(static_cast<float>(src[last + j]));
    }
  }
}

// Independent accumulator sets: FMA latency (4 cycles) x 2 pipes needs >= 8
// independent chains, so tiles with fewer than 8 accumulators split k over
// several sets (k mod sets), summed in a fixed order at the end.
template <size_t kRows>
constexpr size_t MatmulSets() {
  constexpr size_t chains = kRows * kMatmulNV;
  return chains >= 8 ? 1 : (chains >= 4 ? 2 : 4);
}

// One k of a tile: acc[r][v] += a[r * kMatmulAStride] * bv[v].
template <size_t kRows, class V>
HWY_INLINE void MatmulFma(V (&acc)[kRows][kMatmulNV],
                          const float* HWY_RESTRICT a,
                          const V (&bv)[kMatmulNV]) {
  const MatmulTag d;
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    const V ar = hn::Set(d, a[r * kMatmulAStride]);
    HWY_UNROLL(4)
    for (size_t v = 0; v < kMatmulNV; ++v) {
      acc[r][v] = hn::MulAdd(ar, bv[v], acc[r][v]);
    }
  }
}

// MatmulStoreRow's operations one lane at a time, column j at ptr(j): for the
// edge tile (values match the full-tile path) and for tiles whose columns are
// not next to each other in memory (a segmented MatmulOut).
template <class V, class Ptr>
HWY_INLINE void MatmulStoreLanes(const V (&acc)[kMatmulNV], const Ptr& ptr,
                                 size_t cols, float alpha, float beta,
                                 bool first) {
  const MatmulTag d;
  constexpr size_t N = kMatmulLanes;
  HWY_ALIGN float lanes[kMatmulNR];
  for (size_t v = 0; v < kMatmulNV; ++v) hn::Store(acc[v], d, lanes + v * N);
  const hn::CappedTag<float, 1> d1;
  const auto valpha1 = hn::Set(d1, alpha);
  const auto vbeta1 = hn::Set(d1, beta);
  for (size_t j = 0; j < cols; ++j) {
    float* cj = ptr(j);
    const auto a1 = hn::LoadU(d1, lanes + j);
    hn::Vec<decltype(d1)> out;
    if (!first) {
      out = hn::MulAdd(valpha1, a1, hn::LoadU(d1, cj));
    } else if (beta == 0.0f) {
      out = hn::Mul(valpha1, a1);
    } else {
      out = hn::MulAdd(valpha1, a1, hn::Mul(vbeta1, hn::LoadU(d1, cj)));
    }
    hn::StoreU(out, d1, cj);
  }
}

// Stores one row of a tile: c[0, cols) = alpha * acc + (first ? beta * c : c),
// with beta == 0 on the first block meaning c is not read.
template <class V>
HWY_INLINE void MatmulStoreRow(const V (&acc)[kMatmulNV], float* HWY_RESTRICT c,
                               size_t cols, float alpha, float beta,
                               bool first) {
  const MatmulTag d;
  constexpr size_t N = kMatmulLanes;
  const auto valpha = hn::Set(d, alpha);
  if (cols == kMatmulNR) {
    for (size_t v = 0; v < kMatmulNV; ++v) {
      float* p = c + v * N;
      V out;
      if (!first) {
        out = hn::MulAdd(valpha, acc[v], hn::LoadU(d, p));
      } else if (beta == 0.0f) {
        out = hn::Mul(valpha, acc[v]);
      } else {
        out = hn::MulAdd(valpha, acc[v],
                         hn::Mul(hn::Set(d, beta), hn::LoadU(d, p)));
      }
      hn::StoreU(out, d, p);
    }
    return;
  }
  MatmulStoreLanes(
      acc, [c](size_t j) HWY_ATTR { return c + j; }, cols, alpha, beta, first);
}

// Prefetches the cache line at p into L1 for writing (exclusive: the store
// then finds it without asking for ownership).
HWY_INLINE void PrefetchForWrite(const float* p) {
#if HWY_ARCH_X86 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
  // GCC emits PREFETCHW for __builtin_prefetch(p, 1) only with -mprfchw, which
  // Highway's target attributes do not enable; on x86 CPUs without it the
  // instruction is a no-op.
  asm volatile("prefetchw %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 1);
#endif
}

// Starts the lines of C tile [rows, cols] on their way from L3 / memory early
// in a kernel (MatmulTile: at its start; the full kernel: MatmulChunkPrefetch),
// so that the store at its end finds them in L1, owned: for writing, also when
// the store only writes C, since a store that misses holds an L1 miss buffer.
// 3-5% faster on 1024 x 1024 x 128 on two threads.
HWY_INLINE void MatmulPrefetchC(const MatmulOut::Column& column, size_t i0,
                                size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    const float* c = column.At(i0 + r);
    for (size_t j = 0; j < cols; j += 16) PrefetchForWrite(c + j);
    PrefetchForWrite(c + cols - 1);
  }
}

// The prefetches of chunk `chunk` of a kernel, `last` its last chunk: its C
// tile [kRows, cols] for writing (none for a null column: C's columns not
// next to each other), a quarter in each of the first 4 chunks (the rest in
// the last, for kc <= 3 chunks), and kLines lines of each row of `next` (1 per
// chunk of N k; 2 per chunk of N pairs). Quarters make the float kernel 9%
// faster than the whole tile at once (1024 x 1024 x 128, two threads); the
// native kernel was measured with the whole schedule (MatmulTileNative).
template <size_t kRows, size_t kLines = 1>
HWY_INLINE void MatmulChunkPrefetch(size_t chunk, bool last,
                                    const MatmulOut::Column* column, size_t i0,
                                    size_t cols, const MatmulAPrefetch& next) {
  constexpr size_t kParts = 4;
  if (column != nullptr && chunk < kParts) {
    const size_t r0 = chunk * kRows / kParts;
    const size_t r1 = last ? kRows : (chunk + 1) * kRows / kParts;
    MatmulPrefetchC(*column, i0 + r0, r1 - r0, cols);
  }
  HWY_UNROLL(2)
  for (size_t line = 0; line < kLines; ++line) {
    next.Line(chunk * kLines + line, last);
  }
}

// Multiplies the accumulators of one row of a tile by the scales of its
// columns (scales [NR], aligned): int8 B's, and a bf16 B's where it holds int8
// weights (MatmulBF16SliceFromInt8; scales null otherwise); float B has none.
template <class T, class V>
HWY_INLINE void MatmulScaleRow(V (&acc)[kMatmulNV],
                               const float* HWY_RESTRICT scales) {
  if constexpr (!hwy::IsSame<T, float>()) {
    if (internal::kKvScaled<T> || scales != nullptr) {
      const MatmulTag d;
      for (size_t v = 0; v < kMatmulNV; ++v) {
        acc[v] = hn::Mul(acc[v], hn::Load(d, scales + v * kMatmulLanes));
      }
    }
  } else {
    (void)acc;
    (void)scales;
  }
}

// Row i of a C tile, columns [j0, j0 + cols), stored (alpha, beta, first as
// MatmulStoreRow): through `column` (out.ColumnAt(j0)), or lane by lane for a
// null column (the tile's columns not next to each other).
template <class V>
HWY_INLINE void MatmulStoreTileRow(const V (&acc)[kMatmulNV],
                                   const MatmulOut& out,
                                   const MatmulOut::Column* column, size_t i,
                                   size_t j0, size_t cols, float alpha,
                                   float beta, bool first) {
  if (column != nullptr) {
    MatmulStoreRow(acc, column->At(i), cols, alpha, beta, first);
  } else {
    MatmulStoreLanes(
        acc, [&out, i, j0](size_t j) HWY_ATTR { return out.At(i, j0 + j); },
        cols, alpha, beta, first);
  }
}

// The end of MatmulTile and MatmulTileNative: the kSets accumulator sets of a
// C tile [kRows, cols] at (i0, j0) summed pairwise in a fixed order, int8
// columns scaled (scales [NR]), and the tile stored (alpha, beta, first as
// MatmulStoreRow): through `column` (out.ColumnAt(j0)), or lane by lane for
// a null column (the tile's columns not next to each other).
// Unrolled, so that MatmulTileNative's accumulators stay in registers across
// its chunks (with these loops rolled GCC 12 kept them on the stack, loaded
// and stored at every chunk: 0.94x).
template <class T, size_t kSets, size_t kRows, class V>
HWY_INLINE void MatmulFinishTile(V (&acc)[kSets][kRows][kMatmulNV],
                                 const MatmulOut& out,
                                 const MatmulOut::Column* column, size_t i0,
                                 size_t j0, size_t cols, float alpha,
                                 float beta, bool first,
                                 const float* HWY_RESTRICT scales) {
  HWY_UNROLL(4)
  for (size_t step = kSets / 2; step >= 1; step /= 2) {
    HWY_UNROLL(4)
    for (size_t s = 0; s < step; ++s) {
      HWY_UNROLL(16)
      for (size_t r = 0; r < kRows; ++r) {
        HWY_UNROLL(4)
        for (size_t v = 0; v < kMatmulNV; ++v) {
          acc[s][r][v] = hn::Add(acc[s][r][v], acc[s + step][r][v]);
        }
      }
    }
  }
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    MatmulScaleRow<T>(acc[0][r], scales);
    MatmulStoreTileRow(acc[0][r], out, column, i0 + r, j0, cols, alpha, beta,
                       first);
  }
}

// The B slices of a tile (MatmulTileSlices): slice q, b[q] [kc][NR], gives C's
// columns [j0[q], j0[q] + cols[q]), int8 columns scaled by scales[q] [NR].
template <size_t kSlices, class T>
struct MatmulSlices {
  const T* b[kSlices];
  size_t j0[kSlices];
  size_t cols[kSlices];
  const float* scales[kSlices];
};

// The C columns of a tile's slices: contiguous[q] is out.ContiguousColumn's
// answer for slice q (pointing into columns[q], or null), whose `rows` rows
// from i0 are prefetched for writing.
template <size_t kSlices>
struct MatmulSliceColumns {
  template <class T>
  MatmulSliceColumns(const MatmulOut& out,
                     const MatmulSlices<kSlices, T>& slices, size_t i0,
                     size_t rows) {
    for (size_t q = 0; q < kSlices; ++q) {
      contiguous[q] =
          out.ContiguousColumn(slices.j0[q], slices.cols[q], &columns[q]);
      if (contiguous[q] != nullptr) {
        MatmulPrefetchC(columns[q], i0, rows, slices.cols[q]);
      }
    }
  }
  MatmulSliceColumns(const MatmulSliceColumns&) = delete;
  MatmulSliceColumns& operator=(const MatmulSliceColumns&) = delete;
  MatmulOut::Column columns[kSlices];
  const MatmulOut::Column* contiguous[kSlices];
};

// Bytes ahead of its loads at which a tile of at most kMatmulGemvBAheadRows
// rows prefetches each bf16 or int8 slice (GEMVs stream B from memory, and the
// hardware prefetchers alone keep too few lines in flight for a kernel that
// converts what it loads): 2 KiB, 1 x 4096 x 4096 from DRAM on one Intel
// core, int8 16.2 against 13.4 GB/s, bf16 16.8 against 15.5 (4 KiB: 15.3,
// 16.7); narrower targets gain more (the bench's copies, one thread: AVX2 int8
// 11.0 against 5.6, SSE4 6.4 against 2.7). Float32 B, which the prefetchers
// keep up with: 14.6 against 16.0, so none (docs/BENCHMARKS.md).
inline constexpr size_t kMatmulGemvBAhead = 2048;
inline constexpr size_t kMatmulGemvBAheadRows = 4;

// C tiles [kRows, cols[q]] at (i0, j0[q]) of out op= alpha * A strip
// [MR][kMatmulAStride] * B slice q [kc][NR] of T (float, bf16 or int8, loaded
// through LoadStored; int8 accumulators times the slice's scales before the
// store), for kSlices slices at once: two slices far apart in B are two
// streams from memory where one slice is one (MatmulGemvPanelPairs). Each
// slice's arithmetic is the same whatever kSlices.
// Not inlined: on its own the kernel gets all 32 registers (inlined into the
// loops of the driver, GCC 12 at -O3 hoists loop invariants into them and
// spills a B vector).
template <size_t kRows, size_t kSlices, class T>
HWY_NOINLINE void MatmulTileSlices(size_t kc, const float* HWY_RESTRICT a,
                                   const MatmulSlices<kSlices, T>& slices,
                                   const MatmulOut& out, size_t i0, float alpha,
                                   float beta, bool first) {
  const MatmulTag d;
  using V = hn::Vec<MatmulTag>;
  constexpr size_t NR = kMatmulNR;
  constexpr size_t N = kMatmulLanes;
  constexpr size_t kNV = kMatmulNV;
  constexpr size_t kSets = MatmulSets<kRows>();
  const MatmulSliceColumns<kSlices> c_out(out, slices, i0, kRows);
  V acc[kSlices][kSets][kRows][kNV];
  for (size_t q = 0; q < kSlices; ++q) {
    for (size_t s = 0; s < kSets; ++s) {
      for (size_t r = 0; r < kRows; ++r) {
        for (size_t v = 0; v < kNV; ++v) acc[q][s][r][v] = hn::Zero(d);
      }
    }
  }
  // k per pass of the main loop: kSets, and at least a pair of bf16 rows.
  // Set s takes k = s mod kSets.
  constexpr size_t kStep = kMatmulBPairs<T> && kSets == 1 ? 2 : kSets;
  const size_t kc_main = kMatmulBPairs<T> ? kc / 2 * 2 : kc;
  size_t k = 0;
  for (; k + kStep <= kc_main; k += kStep) {
    if constexpr (sizeof(T) < sizeof(float) && kRows <= kMatmulGemvBAheadRows) {
      // A line per 64 bytes of each slice's kStep rows (integer addresses,
      // so no pointer past B is formed).
      for (size_t q = 0; q < kSlices; ++q) {
        const uintptr_t at = reinterpret_cast<uintptr_t>(slices.b[q] + k * NR);
        for (size_t l = 0; l < kStep * NR * sizeof(T); l += 64) {
          __builtin_prefetch(
              reinterpret_cast<const void*>(at + l + kMatmulGemvBAhead),
              /*rw=*/0, /*locality=*/3);
        }
      }
    }
    if constexpr (kMatmulBPairs<T>) {
      for (size_t s = 0; s < kStep; s += 2) {
        for (size_t q = 0; q < kSlices; ++q) {
          V even[kNV], odd[kNV];
          for (size_t v = 0; v < kNV; ++v) {
            MatmulLoadBPair(slices.b[q], (k + s) / 2, v, &even[v], &odd[v]);
          }
          MatmulFma<kRows>(acc[q][s % kSets], a + k + s, even);
          MatmulFma<kRows>(acc[q][(s + 1) % kSets], a + k + s + 1, odd);
        }
      }
    } else {
      for (size_t s = 0; s < kStep; ++s) {
        for (size_t q = 0; q < kSlices; ++q) {
          V bv[kNV];
          for (size_t v = 0; v < kNV; ++v) {
            bv[v] = LoadStored(d, slices.b[q] + (k + s) * NR + v * N);
          }
          MatmulFma<kRows>(acc[q][s], a + k + s, bv);
        }
      }
    }
  }
  // The last kc - k < kStep k (constant indices keep the accumulators in
  // registers).
  for (size_t s = 0; s + 1 < kStep; ++s) {
    if (k + s < kc) {
      for (size_t q = 0; q < kSlices; ++q) {
        V bv[kNV];
        for (size_t v = 0; v < kNV; ++v) {
          bv[v] = MatmulLoadBRow(slices.b[q], k + s, kc, v);
        }
        MatmulFma<kRows>(acc[q][s % kSets], a + k + s, bv);
      }
    }
  }
  for (size_t q = 0; q < kSlices; ++q) {
    MatmulFinishTile<T>(acc[q], out, c_out.contiguous[q], i0, slices.j0[q],
                        slices.cols[q], alpha, beta, first, slices.scales[q]);
  }
}

// MatmulTileSlices of one slice: C tile [kRows, cols] at (i0, j0) from the B
// slice b [kc][NR] (int8: scales [NR]).
template <size_t kRows, class T>
HWY_INLINE void MatmulTile(size_t kc, const float* HWY_RESTRICT a,
                           const T* HWY_RESTRICT b, const MatmulOut& out,
                           size_t i0, size_t j0, size_t cols, float alpha,
                           float beta, bool first,
                           const float* HWY_RESTRICT scales) {
  const MatmulSlices<1, T> slice{{b}, {j0}, {cols}, {scales}};
  MatmulTileSlices<kRows, 1>(kc, a, slice, out, i0, alpha, beta, first);
}

// Where and how MatmulTileFull stores its tile.
struct MatmulTileStore {
  MatmulOut::Column column;
  size_t i0;
  float alpha;
  float beta;
  bool first;
  const float* scales;  // int8 B: [NR] scales of the tile's columns
};

// Where MatmulTileFull<kRows, true> (float) or MatmulTileNative<kRows, true>
// (float or bf16) packs its A strip from: kRows rows of op(A) = a [m, k] (not
// transposed), the first at src (row i0, column k0), row stride lda.
template <class TA = float>
struct MatmulASource {
  const TA* src;
  size_t lda;
};

// k [k0, k1) of a full tile, B a slice of T with kc rows.
template <size_t kRows, class T, class V>
HWY_INLINE void MatmulFullSteps(V (&acc)[kRows][kMatmulNV],
                                const float* HWY_RESTRICT a,
                                const T* HWY_RESTRICT b, size_t k0, size_t k1,
                                size_t kc) {
  constexpr size_t kNV = kMatmulNV;
  size_t k = k0;
  if constexpr (kMatmulBPairs<T>) {
    // Chunks start at even k where N is even (every target but SCALAR).
    if (k % 2 != 0 && k < k1) {
      V bv[kNV];
      HWY_UNROLL(4)
      for (size_t v = 0; v < kNV; ++v) bv[v] = MatmulLoadBRow(b, k, kc, v);
      MatmulFma<kRows>(acc, a + k, bv);
      ++k;
    }
    const size_t pairs_end = HWY_MIN(k1, kc / 2 * 2);
    for (; k + 2 <= pairs_end; k += 2) {
      V even[kNV], odd[kNV];
      HWY_UNROLL(4)
      for (size_t v = 0; v < kNV; ++v) {
        MatmulLoadBPair(b, k / 2, v, &even[v], &odd[v]);
      }
      MatmulFma<kRows>(acc, a + k, even);
      MatmulFma<kRows>(acc, a + k + 1, odd);
    }
  }
  for (; k < k1; ++k) {
    V bv[kNV];
    HWY_UNROLL(4)
    for (size_t v = 0; v < kNV; ++v) bv[v] = MatmulLoadBRow(b, k, kc, v);
    MatmulFma<kRows>(acc, a + k, bv);
  }
}

// Copies columns [k0, k0 + N) of the kRows rows at src (row stride lda) into
// the strip a [kRows][kMatmulAStride].
template <size_t kRows>
HWY_INLINE void MatmulCopyAVector(const float* HWY_RESTRICT src, size_t lda,
                                  size_t k0, float* HWY_RESTRICT a) {
  const MatmulTag d;
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    hn::StoreU(hn::LoadU(d, src + r * lda + k0), d,
               a + r * kMatmulAStride + k0);
  }
}

// MatmulTile for the common tile, MR rows of all NR columns of C, next to each
// other in every row, with the same arithmetic. Everything is unrolled, so the
// accumulators stay in registers from the first FMA to the store (GCC 12 keeps
// MatmulTile's in a stack array: 3-12% of a call). The store's arguments come
// by reference and are read after the K loop (in registers, GCC 12 spills a B
// vector: 0.7x).
//
// kPackA: the kernel also packs its A strip, from `source`, into `a`: one
// vector of every row ahead of the FMAs that read it (the loads and stores go
// into the slots the FMAs leave free), the last kc mod N columns first, for
// the 4-8% of a call that a separate copy (PackAStrip) costs at N = 128.
template <size_t kRows, bool kPackA, class T>
HWY_NOINLINE void MatmulTileFull(size_t kc, float* HWY_RESTRICT a,
                                 const T* HWY_RESTRICT b,
                                 const MatmulTileStore& store,
                                 const MatmulASource<>& source,
                                 const MatmulAPrefetch& next) {
  static_assert(MatmulSets<kRows>() == 1, "one accumulator set");
  const MatmulOut::Column& column = store.column;
  const size_t i0 = store.i0;
  const MatmulTag d;
  using V = hn::Vec<MatmulTag>;
  constexpr size_t NR = kMatmulNR;
  constexpr size_t N = kMatmulLanes;
  constexpr size_t kNV = kMatmulNV;
  V acc[kRows][kNV];
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    HWY_UNROLL(4)
    for (size_t v = 0; v < kNV; ++v) acc[r][v] = hn::Zero(d);
  }
  if constexpr (!kPackA) {
    for (size_t k0 = 0; k0 < kc; k0 += N) {
      MatmulChunkPrefetch<kRows>(k0 / N, k0 + N >= kc, &column, i0, kMatmulNR,
                                 next);
      MatmulFullSteps<kRows>(acc, a, b, k0, HWY_MIN(kc, k0 + N), kc);
    }
  } else {
    const float* HWY_RESTRICT src = source.src;
    const size_t lda = source.lda;
    const size_t kc_vec = kc / N * N;
    for (size_t r = 0; r < kRows; ++r) {
      for (size_t k = kc_vec; k < kc; ++k) {
        a[r * kMatmulAStride + k] = src[r * lda + k];
      }
    }
    if (kc_vec != 0) MatmulCopyAVector<kRows>(src, lda, 0, a);
    for (size_t k0 = 0; k0 < kc; k0 += N) {
      if (k0 + 2 * N <= kc) MatmulCopyAVector<kRows>(src, lda, k0 + N, a);
      MatmulChunkPrefetch<kRows>(k0 / N, k0 + N >= kc, &column, i0, kMatmulNR,
                                 next);
      MatmulFullSteps<kRows>(acc, a, b, k0, HWY_MIN(kc, k0 + N), kc);
    }
  }
  const MatmulTileStore st = store;
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    MatmulScaleRow<T>(acc[r], st.scales);
    MatmulStoreRow(acc[r], st.column.At(st.i0 + r), NR, st.alpha, st.beta,
                   st.first);
  }
}

// Calls f(std::integral_constant<size_t, rows>()), rows in [1, MR]: the
// kernels are instantiated per row count.
template <class F>
HWY_INLINE void MatmulWithRows(size_t rows, const F& f) {
  static_assert(kMatmulMR <= 12, "MatmulWithRows has cases up to 12 rows");
  switch (rows) {
#define HEADWAY_MATMUL_CASE(R)                \
  case R:                                     \
    if constexpr (R <= kMatmulMR) {           \
      f(std::integral_constant<size_t, R>()); \
    }                                         \
    break;
    HEADWAY_MATMUL_CASE(1)
    HEADWAY_MATMUL_CASE(2)
    HEADWAY_MATMUL_CASE(3)
    HEADWAY_MATMUL_CASE(4)
    HEADWAY_MATMUL_CASE(5)
    HEADWAY_MATMUL_CASE(6)
    HEADWAY_MATMUL_CASE(7)
    HEADWAY_MATMUL_CASE(8)
    HEADWAY_MATMUL_CASE(9)
    HEADWAY_MATMUL_CASE(10)
    HEADWAY_MATMUL_CASE(11)
    HEADWAY_MATMUL_CASE(12)
#undef HEADWAY_MATMUL_CASE
    default:
      HWY_DASSERT(false);
  }
}

// Runs the micro-kernel for a strip of `rows` (1..MR) rows over a slice of B
// of T, with `scales` [NR] its columns' scales for int8 (else unused). With a
// source (not null), the strip a is packed from it first (by the full kernel,
// as it runs, or by PackAStrip).
template <class T>
HWY_INLINE void MatmulStrip(size_t rows, size_t kc, float* a, const T* b,
                            const MatmulOut& out, size_t i0, size_t j0,
                            size_t cols, float alpha, float beta, bool first,
                            const float* scales,
                            const MatmulASource<>* source = nullptr,
                            const MatmulAPrefetch& next = MatmulAPrefetch()) {
  MatmulOut::Column column{};
  if (rows == kMatmulMR && cols == kMatmulNR &&
      out.ContiguousColumn(j0, cols, &column) != nullptr) {
    const MatmulTileStore store{column, i0, alpha, beta, first, scales};
    if (source != nullptr) {
      MatmulTileFull<kMatmulMR, true>(kc, a, b, store, *source, next);
    } else {
      MatmulTileFull<kMatmulMR, false>(kc, a, b, store, MatmulASource<>{},
                                       next);
    }
    return;
  }
  next.All();
  if (source != nullptr) {
    PackAStrip(source->src, source->lda, false, 0, rows, 0, kc, a);
  }
  MatmulWithRows(rows, [&](auto tag) HWY_ATTR {
    constexpr size_t R = decltype(tag)::value;
    MatmulTile<R>(kc, a, b, out, i0, j0, cols, alpha, beta, first, scales);
  });
}

// The native kernel, on the targets with vdpbf16ps (native_dot-inl.h).
#if HEADWAY_NATIVE_BF16

// Converts elements [k0, k0 + 2N) of each of the kRows rows at src (row
// stride lda) into pairs [k0 / 2, k0 / 2 + N) of the native strip a: floats
// rounded 2N at a time, bf16 copied.
template <size_t kRows>
HWY_INLINE void MatmulConvertAChunk(const float* HWY_RESTRICT src, size_t lda,
                                    size_t k0, uint32_t* HWY_RESTRICT a) {
  const MatmulTag d;
  const hn::RebindToUnsigned<MatmulTag> du;
  constexpr size_t N = kMatmulLanes;
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    const float* row = src + r * lda + k0;
    hn::Store(BF16PairsFromFloats(hn::LoadU(d, row), hn::LoadU(d, row + N)), du,
              a + r * kMatmulAStride + k0 / 2);
  }
}
template <size_t kRows>
HWY_INLINE void MatmulConvertAChunk(const hwy::bfloat16_t* HWY_RESTRICT src,
                                    size_t lda, size_t k0,
                                    uint32_t* HWY_RESTRICT a) {
  const hn::RebindToUnsigned<MatmulTag> du;
  const hn::Repartition<uint16_t, decltype(du)> du16;
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(src + r * lda + k0);
    hn::Store(hn::BitCast(du, hn::LoadU(du16, row)), du,
              a + r * kMatmulAStride + k0 / 2);
  }
}

// acc[r][v] += A pair (r, q) times B pairs bv[v] (vdpbf16ps), for every row
// r of a strip of bf16 pairs a [kRows][kMatmulAStride].
template <size_t kRows, class V, class VU>
HWY_INLINE void MatmulNativePair(V (&acc)[kRows][kMatmulNV],
                                 const uint32_t* HWY_RESTRICT a, size_t q,
                                 const VU (&bv)[kMatmulNV]) {
  const hn::RebindToUnsigned<MatmulTag> du;
  HWY_UNROLL(16)
  for (size_t r = 0; r < kRows; ++r) {
    const VU ar = hn::Set(du, a[r * kMatmulAStride + q]);
    HWY_UNROLL(4)
    for (size_t v = 0; v < kMatmulNV; ++v) {
      acc[r][v] = DotBF16Pairs(acc[r][v], ar, bv[v]);
    }
  }
}

// B pairs that MatmulNativeSteps prefetches into L1 ahead of its loads (a
// line per B vector and pair; integer addresses, so no pointer past B is
// formed): 8 (1 KiB), 2048^3 0.996-0.999x oneDNN's bf16 matmul vs
// 0.968-0.977x without (one thread; docs/BENCHMARKS.md).
inline constexpr size_t kMatmulNativeBAhead = 8;
// Only tiles of at least this many rows prefetch B: GEMVs stream it from
// memory faster without (1 x 4096 x 4096: 1.07-1.12x oneDNN vs 0.99-1.01x).
inline constexpr size_t kMatmulNativeBAheadRows = 8;

// Pairs [kp0, kp1) (kp1 - kp0 a multiple of kSets) of a native tile: set s
// takes pairs kp + s (MatmulNativePair), B pairs bp [pairs][NR].
template <size_t kSets, size_t kRows, class V>
HWY_INLINE void MatmulNativeSteps(V (&acc)[kSets][kRows][kMatmulNV],
                                  const uint32_t* HWY_RESTRICT a,
                                  const uint32_t* HWY_RESTRICT bp, size_t kp0,
                                  size_t kp1) {
  const hn::RebindToUnsigned<MatmulTag> du;
  using VU = hn::Vec<decltype(du)>;
  constexpr size_t N = kMatmulLanes;
  constexpr size_t kAheadBytes =
      kMatmulNativeBAhead * kMatmulNR * sizeof(uint32_t);
  for (size_t kp = kp0; kp < kp1; kp += kSets) {
    HWY_UNROLL(4)
    for (size_t s = 0; s < kSets; ++s) {
      const uint32_t* row = bp + (kp + s) * kMatmulNR;
      VU bv[kMatmulNV];
      HWY_UNROLL(4)
      for (size_t v = 0; v < kMatmulNV; ++v) {
        if constexpr (kRows >= kMatmulNativeBAheadRows) {
          const uintptr_t ahead = reinterpret_cast<uintptr_t>(row + v * N);
          __builtin_prefetch(reinterpret_cast<const void*>(ahead + kAheadBytes),
                             /*rw=*/0, /*locality=*/3);
        }
        bv[v] = hn::Load(du, row + v * N);
      }
      MatmulNativePair<kRows>(acc[s], a, kp + s, bv);
    }
  }
}

// The last pairs of a native tile, past the whole sets (fewer than kSets),
// then for odd kc its last row as the pair (b, 0): set s takes pair
// kc / 2 / kSets * kSets + s. B: the bf16 slice [kc][NR] in pairs.
template <size_t kSets, size_t kRows, class V>
HWY_INLINE void MatmulNativeTail(V (&acc)[kSets][kRows][kMatmulNV],
                                 const uint32_t* HWY_RESTRICT a,
                                 const hwy::bfloat16_t* HWY_RESTRICT b,
                                 size_t kc) {
  const hn::RebindToUnsigned<MatmulTag> du;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  using VU = hn::Vec<decltype(du)>;
  constexpr size_t NR = kMatmulNR;
  constexpr size_t N = kMatmulLanes;
  const uint32_t* HWY_RESTRICT bp = reinterpret_cast<const uint32_t*>(b);
  const size_t full_pairs = kc / 2;
  const size_t kp = full_pairs / kSets * kSets;
  HWY_UNROLL(4)
  for (size_t s = 0; s < kSets; ++s) {
    const size_t q = kp + s;
    if (q > full_pairs || (q == full_pairs && kc % 2 == 0)) break;
    VU bv[kMatmulNV];
    HWY_UNROLL(4)
    for (size_t v = 0; v < kMatmulNV; ++v) {
      bv[v] =
          q < full_pairs
              ? hn::Load(du, bp + q * NR + v * N)
              : hn::PromoteTo(
                    du, hn::Load(du16, reinterpret_cast<const uint16_t*>(b) +
                                           q * 2 * NR + v * N));
    }
    MatmulNativePair<kRows>(acc[s], a, q, bv);
  }
}

// MatmulTile for kMatmulBF16Native: C tile [kRows, cols] at (i0, j0) op=
// alpha * A strip of bf16 pairs (PackAStripMode) * bf16 B slice (pairs,
// MatmulBPairs; the odd last row read as pairs (b, 0)). Sets as MatmulTile's;
// every loop unrolled, so that the accumulators stay in registers. The K loop
// runs in chunks of N pairs, each started by its share of the prefetches (C
// in quarters, the next strip's A line by line) instead of all of them before
// the first product: 1.01x at 512^3 and at 2048^3 (one thread, call by call
// against oneDNN's bf16 matmul).
// kPackA: the kernel also converts its A strip from `source` (op(A) = A; TA
// float or bf16) into `a`, as MatmulTileFull<kRows, true> copies it: each
// chunk of N pairs one chunk ahead of the products that read it, the last kc
// mod 2N elements first (MatmulBF16Element), for the 4-7% of a 512^3 call that
// PackAStripMode costs.
template <size_t kRows, bool kPackA, class TA = float>
HWY_NOINLINE void MatmulTileNative(size_t kc, uint32_t* HWY_RESTRICT a,
                                   const hwy::bfloat16_t* HWY_RESTRICT b,
                                   const MatmulOut& out, size_t i0, size_t j0,
                                   size_t cols, float alpha, float beta,
                                   bool first, const float* scales,
                                   const MatmulASource<TA>& source,
                                   const MatmulAPrefetch& next) {
  const MatmulTag d;
  using V = hn::Vec<MatmulTag>;
  constexpr size_t AS = kMatmulAStride;
  constexpr size_t N = kMatmulLanes;
  constexpr size_t kNV = kMatmulNV;
  constexpr size_t kSets = MatmulSets<kRows>();
  MatmulOut::Column column{};
  const MatmulOut::Column* contiguous = out.ContiguousColumn(j0, cols, &column);
  const uint32_t* HWY_RESTRICT bp = reinterpret_cast<const uint32_t*>(b);
  V acc[kSets][kRows][kNV];
  HWY_UNROLL(4)
  for (size_t s = 0; s < kSets; ++s) {
    HWY_UNROLL(16)
    for (size_t r = 0; r < kRows; ++r) {
      HWY_UNROLL(4)
      for (size_t v = 0; v < kNV; ++v) acc[s][r][v] = hn::Zero(d);
    }
  }
  const size_t full_pairs = kc / 2;
  // kPackA: pairs below pairs_vec come in chunks of N, the rest before them.
  const size_t pairs_vec = kc / (2 * N) * N;
  if constexpr (kPackA) {
    hwy::bfloat16_t* a16 = reinterpret_cast<hwy::bfloat16_t*>(a);
    for (size_t r = 0; r < kRows; ++r) {
      for (size_t k = 2 * pairs_vec; k < kc; ++k) {
        a16[r * 2 * AS + k] = MatmulBF16Element(source.src[r * source.lda + k]);
      }
      if (kc % 2 != 0) a16[r * 2 * AS + kc].bits = 0;
    }
    if (pairs_vec != 0)
      MatmulConvertAChunk<kRows>(source.src, source.lda, 0, a);
  }
  // At the first pair of each chunk of N pairs (2N k): the next chunk of A
  // converted (kPackA), and the chunk's prefetches (MatmulChunkPrefetch: a
  // quarter of the C tile in each of the first 4, two lines of each row of the
  // next strip's A).
  const size_t pairs_all = (kc + 1) / 2;
  const auto chunk_start = [&](size_t kp) HWY_ATTR {
    if constexpr (kPackA) {
      if (kp + N < pairs_vec) {
        MatmulConvertAChunk<kRows>(source.src, source.lda, 2 * (kp + N), a);
      }
    }
    MatmulChunkPrefetch<kRows, 2>(kp / N, kp + N >= pairs_all, contiguous, i0,
                                  cols, next);
  };
  // Chunks of N pairs (a multiple of kSets) over the pairs that fill whole
  // sets, each started by chunk_start.
  const size_t set_pairs = full_pairs / kSets * kSets;
  for (size_t c0 = 0; c0 < set_pairs; c0 += N) {
    chunk_start(c0);
    MatmulNativeSteps<kSets>(acc, a, bp, c0, HWY_MIN(c0 + N, set_pairs));
  }
  if (set_pairs % N == 0 && set_pairs < pairs_all) chunk_start(set_pairs);
  MatmulNativeTail(acc, a, b, kc);
  MatmulFinishTile<hwy::bfloat16_t>(acc, out, contiguous, i0, j0, cols, alpha,
                                    beta, first, scales);
}

// MatmulTileNative on an A strip packed before the call, for kSlices B slices
// at once (MatmulGemvPanelPairs: two streams from memory): each slice's pairs
// go to its sets as in MatmulTileNative, so its results are the same bits.
// C's tiles are prefetched at the start, as MatmulTileSlices does.
template <size_t kRows, size_t kSlices>
HWY_NOINLINE void MatmulTileNativeSlices(
    size_t kc, const uint32_t* HWY_RESTRICT a,
    const MatmulSlices<kSlices, hwy::bfloat16_t>& slices, const MatmulOut& out,
    size_t i0, float alpha, float beta, bool first) {
  const MatmulTag d;
  using V = hn::Vec<MatmulTag>;
  constexpr size_t kSets = MatmulSets<kRows>();
  const MatmulSliceColumns<kSlices> c_out(out, slices, i0, kRows);
  V acc[kSlices][kSets][kRows][kMatmulNV];
  HWY_UNROLL(2)
  for (size_t q = 0; q < kSlices; ++q) {
    HWY_UNROLL(4)
    for (size_t s = 0; s < kSets; ++s) {
      HWY_UNROLL(16)
      for (size_t r = 0; r < kRows; ++r) {
        HWY_UNROLL(4)
        for (size_t v = 0; v < kMatmulNV; ++v) acc[q][s][r][v] = hn::Zero(d);
      }
    }
  }
  const size_t set_pairs = kc / 2 / kSets * kSets;
  for (size_t kp = 0; kp < set_pairs; kp += kSets) {
    HWY_UNROLL(2)
    for (size_t q = 0; q < kSlices; ++q) {
      MatmulNativeSteps<kSets>(acc[q], a,
                               reinterpret_cast<const uint32_t*>(slices.b[q]),
                               kp, kp + kSets);
    }
  }
  HWY_UNROLL(2)
  for (size_t q = 0; q < kSlices; ++q) {
    MatmulNativeTail(acc[q], a, slices.b[q], kc);
    MatmulFinishTile<hwy::bfloat16_t>(acc[q], out, c_out.contiguous[q], i0,
                                      slices.j0[q], slices.cols[q], alpha, beta,
                                      first, slices.scales[q]);
  }
}
#endif  // HEADWAY_NATIVE_BF16

// MatmulStrip for `mode` (A packed by PackAStripMode, or, for kMatmulFloat32
// and kMatmulBF16Native with a source, by the kernel): the native kernel, or
// MatmulStrip. A source of bf16 (TA) in the native mode only.
template <int kMode, class T, class TA>
HWY_INLINE void MatmulStripMode(size_t rows, size_t kc, float* a, const T* b,
                                const MatmulOut& out, size_t i0, size_t j0,
                                size_t cols, float alpha, float beta,
                                bool first, const float* scales,
                                const MatmulASource<TA>* source,
                                const MatmulAPrefetch& next) {
#if HEADWAY_NATIVE_BF16
  if constexpr (kMode == kMatmulBF16Native) {
    static_assert(kMatmulBPairs<T>, "native bf16 needs bf16 B");
    uint32_t* pairs = reinterpret_cast<uint32_t*>(a);
    MatmulWithRows(rows, [&](auto tag) HWY_ATTR {
      constexpr size_t R = decltype(tag)::value;
      if (source != nullptr) {
        MatmulTileNative<R, true>(kc, pairs, b, out, i0, j0, cols, alpha, beta,
                                  first, scales, *source, next);
      } else {
        MatmulTileNative<R, false>(kc, pairs, b, out, i0, j0, cols, alpha, beta,
                                   first, scales, MatmulASource<>{nullptr, 0},
                                   next);
      }
    });
  }
#endif
  static_assert(kMode != kMatmulBF16Native || HEADWAY_NATIVE_BF16,
                "native bf16 on an AVX3 target only");
  if constexpr (kMode != kMatmulBF16Native) {
    // Only the float32 mode's full kernel packs A from a source (of floats).
    const MatmulASource<>* float_source = nullptr;
    if constexpr (kMode == kMatmulFloat32) float_source = source;
    MatmulStrip(rows, kc, a, b, out, i0, j0, cols, alpha, beta, first, scales,
                float_source, next);
  }
}

// ---------------------------------------------------------------------------------------------
// Driver.

// C = beta * C (alpha == 0: A and B are not read); beta == 0 writes zeros.
HWY_INLINE void MatmulScaleC(float* c, size_t ldc, size_t m, size_t n,
                             float beta) {
  tbb::parallel_for(tbb::blocked_range<size_t>(0, m),
                    [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
                      for (size_t i = range.begin(); i < range.end(); ++i) {
                        float* row = c + i * ldc;
                        if (beta == 0.0f) {
                          std::fill(row, row + n, 0.0f);
                        } else {
                          for (size_t j = 0; j < n; ++j) row[j] *= beta;
                        }
                      }
                    });
}

// Unpacked op(B) [k, n] (see PackBSlice) and the layout to pack it into.
struct MatmulBSource {
  // Packs slice (kb, p) into dst [kc][NR].
  void Pack(size_t kb, size_t p, float* dst) const {
    const size_t j0 = p * kMatmulNR;
    PackBSlice(b, ldb, trans, layout.kblocks.Begin(kb),
               layout.kblocks.Size(kb, layout.k), j0,
               std::min(kMatmulNR, n - j0), n - j0, dst);
  }
  const float* b;
  size_t ldb;
  bool trans;
  const MatmulPackedLayout& layout;
  size_t n;
};

// B packed during the multiplication, each slice by the first task that needs
// it, into one copy that the tasks share, so that the slice is in that core's
// cache when it is first used (packing all of B first: 25% of the time of
// 128 x 4096 x 4096).
class MatmulLazyB {
 public:
  MatmulLazyB(const MatmulBSource& source, float* packed)
      : source_(source),
        packed_(packed),
        state_(new std::atomic<uint8_t>[source.layout.kblocks.count *
                                        source.layout.panels]) {
    for (size_t i = 0; i < source.layout.kblocks.count * source.layout.panels;
         ++i) {
      state_[i].store(kEmpty, std::memory_order_relaxed);
    }
  }

  // Returns slice (kb, p), packing it first if no other thread has; waits
  // (spinning: a slice takes microseconds) while another thread packs it.
  const float* Slice(size_t kb, size_t p) {
    float* slice = packed_ + source_.layout.Slice(kb, p);
    std::atomic<uint8_t>& state = state_[kb * source_.layout.panels + p];
    if (state.load(std::memory_order_acquire) == kReady) return slice;
    uint8_t expected = kEmpty;
    if (state.compare_exchange_strong(expected, kPacking,
                                      std::memory_order_acquire)) {
      source_.Pack(kb, p, slice);
      state.store(kReady, std::memory_order_release);
      return slice;
    }
    for (size_t spins = 0; state.load(std::memory_order_acquire) != kReady;
         ++spins) {
      if (spins > 64) std::this_thread::yield();
    }
    return slice;
  }

  // The copy, [K block][panel][kc][NR].
  const float* Packed() const { return packed_; }

 private:
  static constexpr uint8_t kEmpty = 0, kPacking = 1, kReady = 2;
  const MatmulBSource& source_;
  float* packed_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // [K block][panel]
};

// B packed during the multiplication by each thread, into a buffer of its own,
// the slices that its tasks use, on first use in the call, so that no core
// rewrites lines the others still hold from the call before (a shared 1024 x
// 128 B: 41 us to pack on 2 threads against 13 us). Each slice is packed by
// every thread that uses it: worth it when the threads share few of them
// (MatmulOwnBPays). Each thread keeps its buffer (at most 4 MiB: only a B that
// fits L2 is packed this way) for the next call.
class MatmulOwnB {
 public:
  explicit MatmulOwnB(const MatmulBSource& source)
      : source_(source), call_(NextCall()) {}

  // The calling thread's copy of packed B (MatmulPackedLayout), for the rest
  // of the task that calls this. Another call's tasks that the thread ran
  // since may have overwritten it: it then starts over.
  const float* Begin() {
    State& state = ThreadState();
    if (state.call != call_) {
      const MatmulPackedLayout& layout = source_.layout;
      state.call = call_;
      state.packed = state.buffer.Get(layout.Floats());
      state.ready.assign(layout.kblocks.count * layout.panels, 0);
    }
    return state.packed;
  }

  // Slice (kb, p) of the calling thread's copy, packed first if this thread
  // has not. After Begin in the same task.
  const float* Slice(size_t kb, size_t p) {
    State& state = ThreadState();
    float* slice = state.packed + source_.layout.Slice(kb, p);
    uint8_t& ready = state.ready[kb * source_.layout.panels + p];
    if (!ready) {
      source_.Pack(kb, p, slice);
      ready = 1;
    }
    return slice;
  }

 private:
  struct State final : ThreadScratch {
    size_t Bytes() const override {
      return buffer.capacity * sizeof(float) + ready.capacity();
    }
    void Release() override {
      call = 0;
      buffer.Trim(0);
      packed = nullptr;
      std::vector<uint8_t>().swap(ready);
    }

    uint64_t call = 0;  // whose B `packed` holds
    ScratchBuffer buffer;
    float* packed = nullptr;
    std::vector<uint8_t> ready;  // [K block][panel]
  };
  static State& ThreadState() {
    thread_local State state;
    return state;
  }
  static uint64_t NextCall() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  const MatmulBSource& source_;
  uint64_t call_;
};

// Where MatmulPackedOut's B [k, n] comes from, in the MatmulPackedLayout:
// packed before the call (PackedB, PackBPanels), or packed during it, each
// slice on first use, into one shared copy (MatmulLazyB), into a copy per
// thread (MatmulOwnB), or by each task into a window of one NC block in a
// buffer of its thread, dropped after the block (only for a split of one row
// block, where a task is the only one to use its slices: a copy of all of a B
// too large for the caches would be written to memory and never read back).
//
// A B packed before the call holds elements of T (float, bf16 or int8, the
// driver's template argument) and, for int8, scales [panels * NR]; a B packed
// during the call is float; int8 weights converted during the call (for the
// bf16 compute kernels) are bf16 with int8's scales.
class MatmulB {
 public:
  static MatmulB Packed(const void* packed, const float* scales = nullptr) {
    MatmulB b(packed, nullptr, nullptr, nullptr);
    b.scales_ = scales;
    return b;
  }
  // Panels [first_panel, first_panel + panels of the call) of a B packed
  // whole with b_panels panels: the call's columns [0, n) are B's columns
  // [first_panel * NR, first_panel * NR + n).
  static MatmulB PackedPanels(const void* packed, const float* scales,
                              size_t b_panels, size_t first_panel) {
    MatmulB b(packed, nullptr, nullptr, nullptr);
    b.scales_ = scales;
    b.b_panels_ = b_panels;
    b.first_panel_ = first_panel;
    return b;
  }
  static MatmulB Lazy(MatmulLazyB* lazy) {
    return MatmulB(lazy->Packed(), lazy, nullptr, nullptr);
  }
  static MatmulB Own(MatmulOwnB* own) {
    return MatmulB(nullptr, nullptr, own, nullptr);
  }
  static MatmulB Window(const MatmulBSource* source) {
    return MatmulB(nullptr, nullptr, nullptr, source);
  }
  // int8 weights packed before the call (`int8`, Packed or PackedPanels) as
  // the bf16 kernels read them: each task converts its slices into its window
  // (MatmulBF16SliceFromInt8) on first use; the scales stay int8's.
  static MatmulB Int8AsBF16(const MatmulB& int8) {
    MatmulB b = int8;
    b.int8_as_bf16_ = true;
    return b;
  }

  // Whether tasks pack (or convert) their slices into a window of their own.
  bool Windowed() const { return window_ != nullptr || int8_as_bf16_; }
  // Whether B was packed before the call (nothing is packed during it).
  bool PackedBefore() const {
    return lazy_ == nullptr && own_ == nullptr && !Windowed();
  }
  // A task's B, for the rest of the task (not windowed).
  const void* Begin() const {
    return own_ != nullptr ? own_->Begin() : packed_;
  }
  // The int8 scales of the call's columns [j0, j0 + NR); null for float and
  // bf16.
  const float* Scales(size_t j0) const {
    return scales_ == nullptr ? nullptr
                              : scales_ + first_panel_ * kMatmulNR + j0;
  }
  // Slice (kb, p) of a task's B at `base` (Begin), or in slot `slot` of its
  // window, packed first if it is packed during the call and `use` may be its
  // first use.
  template <class T>
  HWY_INLINE const T* Slice(const MatmulPackedLayout& layout, const void* base,
                            float* window, size_t kb, size_t p, size_t slot,
                            bool use) const {
    if constexpr (hwy::IsSame<T, float>()) {
      if (window != nullptr) {
        float* slice = window + slot * layout.kblocks.length * kMatmulNR;
        if (use) window_->Pack(kb, p, slice);
        return slice;
      }
      if (use && lazy_ != nullptr) return lazy_->Slice(kb, p);
      if (use && own_ != nullptr) return own_->Slice(kb, p);
    } else if constexpr (kMatmulBPairs<T>) {
      if (int8_as_bf16_) {
        T* slice = reinterpret_cast<T*>(window + slot * layout.kblocks.length *
                                                     kMatmulNR);
        if (use) {
          MatmulBF16SliceFromInt8(
              Slice<int8_t>(layout, base, nullptr, kb, p, 0, false),
              layout.kblocks.Size(kb, layout.k), slice);
        }
        return slice;
      }
    } else {
      (void)window;
      (void)slot;
      (void)use;
    }
    const T* packed = static_cast<const T*>(base);
    if (b_panels_ != 0) {
      return packed + layout.kblocks.Begin(kb) * b_panels_ * kMatmulNR +
             (first_panel_ + p) * layout.kblocks.Size(kb, layout.k) * kMatmulNR;
    }
    return packed + layout.Slice(kb, p);
  }

 private:
  MatmulB(const void* packed, MatmulLazyB* lazy, MatmulOwnB* own,
          const MatmulBSource* window)
      : packed_(packed), lazy_(lazy), own_(own), window_(window) {}

  const void* packed_;             // all of B, or the copy lazy_ packs into
  const float* scales_ = nullptr;  // int8: [panels * NR]
  MatmulLazyB* lazy_;
  MatmulOwnB* own_;
  const MatmulBSource* window_;
  size_t b_panels_ = 0;  // PackedPanels: B's panels (0: the call's)
  size_t first_panel_ = 0;
  bool int8_as_bf16_ = false;  // Int8AsBF16
};

// A task's window of B (MatmulB::Window), a thread_local of the thread that
// runs it, constructed on its first use only (constructing a thread_local
// registers its destructor: a malloc).
HWY_INLINE ScratchBuffer& MatmulWindowScratch() {
  thread_local ThreadScratchBuffer window;
  return window;
}

// MatmulPackedOut's A strips: the calling thread's slots, one buffer per
// thread of the arena.
HWY_INLINE ThreadScratchSlots& MatmulASlots() {
  thread_local ThreadScratchSlots slots;
  return slots;
}

// Work split of MatmulPackedOut into row blocks x panel groups (never changes
// the arithmetic, see the top of this file). One thread: blocks of up to
// kMatmulMCOneThread rows (fewer rows: one block, so that B is read once).
// Several: row blocks of at most MC rows, and groups of panels, for >= 8
// tasks per thread (the last task then costs the other threads at most ~1/8
// of a thread's share of the time), each group of >= 4 panels (128 columns on
// AVX3) so that packing the A block pays off. Few rows (small M, B streamed
// once): one group per thread, as a group reads B in one run per K block
// (GEMV 4096^2 on 2 threads: 11-23% faster with int8 and bf16 weights than 8
// groups per thread, whose runs are 128 and 256 KiB). With few panels (N = 128:
// 4), rows are cut finer (down to one strip) to make the tasks. `b_in_l2`: B
// was packed before the call and all of it fits half an L2, so every thread
// keeps all of it there: rows are cut first, and each row of A is packed once
// (512^3 bf16 compute on 2 threads: 689-698 against 587-630 GFLOP/s).
struct MatmulSplit {
  MatmulSplit(size_t m, size_t panels, size_t threads, bool b_in_l2 = false) {
    const size_t want_tasks = (m <= kMatmulSmallM ? 1 : 8) * threads;
    const size_t max_panel_blocks = std::max<size_t>(1, panels / 4);
    strips = (m + kMatmulMR - 1) / kMatmulMR;
    row_blocks = (m + kMatmulMCOneThread - 1) / kMatmulMCOneThread;
    panel_blocks = 1;
    if (threads > 1) {
      const size_t panel_blocks_first = b_in_l2 ? 1 : max_panel_blocks;
      row_blocks =
          std::max((m + kMatmulMC - 1) / kMatmulMC,
                   (want_tasks + panel_blocks_first - 1) / panel_blocks_first);
      row_blocks = std::min(row_blocks, strips);
      panel_blocks = std::min(max_panel_blocks,
                              (want_tasks + row_blocks - 1) / row_blocks);
    }
  }
  size_t strips;        // of MR rows
  size_t row_blocks;    // of strips
  size_t panel_blocks;  // groups of panels
};

// Whether MatmulOwnB pays for this split on `threads` threads: whether each
// thread packs at most twice its share of B, counting the panel groups of its
// share of the tasks plus one (its range of tasks straddles a group). Always
// on 1 and 2 threads, where it is 4-6% faster than one shared copy (per-head
// 1024 x 128 x 1024).
HWY_INLINE bool MatmulOwnBPays(const MatmulSplit& split, size_t threads) {
  const size_t groups = split.panel_blocks;
  const size_t touched = std::min(groups, (groups + threads - 1) / threads + 1);
  return touched * threads <= 2 * groups;
}

// Rows up to which a task of few rows over B of T runs its panels two at a
// time (MatmulGemvPanelPairs), in every mode; 0: never. On targets with 32
// vector registers (two slices of 1 to 4 rows take at most 24 accumulators).
// GEMV 4096^2, one thread, 1-4 rows: float32 1.06-1.23x, bf16 1.05-1.39x,
// native bf16 compute 1.15x and 1.24x at 1 and 2 rows, 0.99-1.01x at 3 and 4;
// int8 one row 1.07x at one and two threads, 2-4 rows (bound by the
// conversions, not the bytes) 0.86-0.93x, so one (docs/BENCHMARKS.md).
template <class T>
inline constexpr size_t kMatmulGemvPairRows = HWY_TARGET <= HWY_AVX3
                                                  ? (sizeof(T) == 1 ? 1 : 4)
                                                  : 0;

// Whether a task of few rows (`strips` strips, the first of `rows` rows) runs
// its panels in pairs: B packed before the call (its slices are where they
// lie), one strip of at most kMatmulGemvPairRows rows.
template <class T>
HWY_INLINE bool MatmulGemvPairs(const MatmulB& b, size_t strips, size_t rows) {
  return b.PackedBefore() && strips == 1 && rows <= kMatmulGemvPairRows<T>;
}

// MatmulTileSlices in mode kMode: for kMatmulBF16Native the native kernel on
// A's bf16 pairs (PackAStripMode), else MatmulTileSlices.
template <int kMode, size_t kRows, size_t kSlices, class T>
HWY_INLINE void MatmulTileSlicesMode(size_t kc, const float* HWY_RESTRICT a,
                                     const MatmulSlices<kSlices, T>& slices,
                                     const MatmulOut& out, size_t i0,
                                     float alpha, float beta, bool first) {
#if HEADWAY_NATIVE_BF16
  if constexpr (kMode == kMatmulBF16Native) {
    MatmulTileNativeSlices<kRows, kSlices>(kc,
                                           reinterpret_cast<const uint32_t*>(a),
                                           slices, out, i0, alpha, beta, first);
    return;
  }
#endif
  MatmulTileSlices<kRows, kSlices>(kc, a, slices, out, i0, alpha, beta, first);
}

// One K block of a task of few rows over panels [p0, p1): panel p0 + u with
// panel p0 + half + u (half = (p1 - p0) / 2) in one kernel of mode kMode
// (MatmulTileSlicesMode), so that B comes from memory as two streams, half the
// task's block apart: a core reads one stream at about 0.8x the rate of two or
// more (docs/BENCHMARKS.md). The odd last panel alone. slice(p), scales(p):
// panel p's B slice and int8 scales.
template <int kMode, class T, class SliceFn, class ScalesFn>
HWY_INLINE void MatmulGemvPanelPairs(size_t rows, size_t kc,
                                     const float* HWY_RESTRICT a, size_t p0,
                                     size_t p1, size_t n, const SliceFn& slice,
                                     const ScalesFn& scales,
                                     const MatmulOut& out, size_t i0,
                                     float alpha, float beta, bool first) {
  constexpr size_t NR = kMatmulNR;
  const size_t half = (p1 - p0) / 2;
  const auto cols = [n](size_t p) {
    return std::min(kMatmulNR, n - p * kMatmulNR);
  };
  MatmulWithRows(rows, [&](auto tag) HWY_ATTR {
    constexpr size_t R = decltype(tag)::value;
    if constexpr (R <= kMatmulGemvPairRows<T>) {
      for (size_t u = 0; u < half; ++u) {
        const size_t pa = p0 + u, pb = p0 + half + u;
        const MatmulSlices<2, T> pair{{slice(pa), slice(pb)},
                                      {pa * NR, pb * NR},
                                      {cols(pa), cols(pb)},
                                      {scales(pa), scales(pb)}};
        MatmulTileSlicesMode<kMode, R>(kc, a, pair, out, i0, alpha, beta,
                                       first);
      }
      for (size_t p = p0 + 2 * half; p < p1; ++p) {
        const MatmulSlices<1, T> one{
            {slice(p)}, {p * NR}, {cols(p)}, {scales(p)}};
        MatmulTileSlicesMode<kMode, R>(kc, a, one, out, i0, alpha, beta, first);
      }
    }
  });
}

// C [m, n] (at out) = alpha * op(A) [m, k] * B [k, n] + beta * C, alpha != 0,
// B's elements of T (MatmulB). A of TA: float, or bf16 in the bf16 modes.
template <class T = float, int kMode = kMatmulFloat32, class TA>
HWY_INLINE void MatmulPackedOut(const TA* a, size_t lda, bool trans_a,
                                const MatmulB& b, size_t m, size_t n, size_t k,
                                const MatmulOut& out, float alpha, float beta) {
  constexpr size_t MR = kMatmulMR;
  constexpr size_t NR = kMatmulNR;
  const MatmulPackedLayout layout(k, n);
  const MatmulKBlocks& kblocks = layout.kblocks;
  const size_t panels = layout.panels;
  // MaxThreads, not the arena's concurrency alone: under SetMaxThreads(1) the
  // default arena still reports every core, and the split for several threads
  // (A packed per group of panels) ran on one.
  const size_t threads = static_cast<size_t>(std::max(1, MaxThreads()));
  const bool small_m = m <= kMatmulSmallM;

  const size_t b_bytes = k * panels * NR * sizeof(T);
  const bool b_in_l2 = b.PackedBefore() && b_bytes <= kMatmulL2Bytes / 2;
  const MatmulSplit split(m, panels, threads, b_in_l2);
  const size_t strips_total = split.strips;
  const size_t row_blocks = split.row_blocks;
  const size_t panel_blocks = split.panel_blocks;
  // Row block b is strips [b * S / row_blocks, (b + 1) * S / row_blocks) of
  // the S strips, panel group g likewise: the tasks differ by at most a strip
  // or a panel (5% faster than blocks of MC rows at M = 1024 on 2 threads).
  const size_t strips_max = (strips_total + row_blocks - 1) / row_blocks;

  // Small M packs A for all K blocks at once:
  // [strip][K block][MR][kMatmulAStride].
  const size_t strip_floats =
      kMatmulAStripFloats * (small_m ? kblocks.count : 1);
  const size_t tasks = row_blocks * panel_blocks;
  // Panels per NC block: kc x NC of B in a quarter of the 1 MiB L2 (128
  // columns of float32 on AVX3 for kc = 512, 256 of bf16): each strip of A
  // is read once per NC block.
  const size_t nc_panels = std::max<size_t>(
      1, kMatmulL2Bytes / kMatmulNCDiv / (kblocks.length * NR * sizeof(T)));
  // Where a task's panels fit one NC block, each strip of A serves that block
  // only, and all strips share one buffer, which stays in L1: 1.2% faster than
  // a buffer per strip (per-head 1024 x 128 x 1024).
  const bool one_nc_block =
      !small_m && (panels + panel_blocks - 1) / panel_blocks <= nc_panels;
  const size_t a_strips = one_nc_block ? 1 : strips_max;
  // A's strips: the calling thread's slots, every one sized here, and the
  // loop isolated (ThreadSlots).
  ThreadSlots& a_slots = MatmulASlots();
  a_slots.Reserve(a_strips * strip_floats);
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, tasks, 1),
        [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
          float* a_buf = a_slots.Mine().Get(a_strips * strip_floats);
          // B for this task: its window, the thread's own copy, or the shared
          // copy.
          float* window =
              b.Windowed()
                  ? MatmulWindowScratch().Get(nc_panels * kblocks.length * NR)
                  : nullptr;
          const void* b_base = b.Begin();
          for (size_t task = range.begin(); task < range.end(); ++task) {
            // Panel-group major: TBB hands each thread a contiguous range of
            // tasks, so threads mostly work on different panels of B (their own
            // B in their own L2, and no waiting for a slice another packs).
            const size_t row_block = task % row_blocks;
            const size_t group = task / row_blocks;
            const size_t i0 = row_block * strips_total / row_blocks * MR;
            const size_t i1 =
                std::min(m, (row_block + 1) * strips_total / row_blocks * MR);
            const size_t p0 = group * panels / panel_blocks;
            const size_t p1 = (group + 1) * panels / panel_blocks;
            const size_t strips = (i1 - i0 + MR - 1) / MR;
            if (small_m) {
              // A once for all of K; then per K block the task's panels in
              // order, which lie one after the other: B streams once.
              for (size_t s = 0; s < strips; ++s) {
                const size_t r0 = i0 + s * MR;
                for (size_t kb = 0; kb < kblocks.count; ++kb) {
                  PackAStripMode<kMode>(
                      a, lda, trans_a, r0, std::min(MR, i1 - r0),
                      kblocks.Begin(kb), kblocks.Size(kb, k),
                      a_buf + s * strip_floats + kb * kMatmulAStripFloats);
                }
              }
              if constexpr (kMatmulGemvPairRows<T> != 0) {
                if (MatmulGemvPairs<T>(b, strips, i1 - i0)) {
                  for (size_t kb = 0; kb < kblocks.count; ++kb) {
                    MatmulGemvPanelPairs<kMode, T>(
                        i1 - i0, kblocks.Size(kb, k),
                        a_buf + kb * kMatmulAStripFloats, p0, p1, n,
                        [&](size_t p) HWY_ATTR {
                          return b.template Slice<T>(layout, b_base, window, kb,
                                                     p, 0, true);
                        },
                        [&](size_t p) { return b.Scales(p * kMatmulNR); }, out,
                        i0, alpha, beta, kb == 0);
                  }
                  continue;
                }
              }
              for (size_t kb = 0; kb < kblocks.count; ++kb) {
                const size_t kc = kblocks.Size(kb, k);
                for (size_t p = p0; p < p1; ++p) {
                  const size_t j0 = p * NR;
                  const size_t cols = std::min(NR, n - j0);
                  const T* slice = b.template Slice<T>(layout, b_base, window,
                                                       kb, p, 0, true);
                  for (size_t s = 0; s < strips; ++s) {
                    const size_t r0 = i0 + s * MR;
                    MatmulStripMode<kMode>(
                        std::min(MR, i1 - r0), kc,
                        a_buf + s * strip_floats + kb * kMatmulAStripFloats,
                        slice, out, r0, j0, cols, alpha, beta, kb == 0,
                        b.Scales(j0),
                        static_cast<const MatmulASource<TA>*>(nullptr),
                        MatmulAPrefetch());
                  }
                }
              }
              continue;
            }
            for (size_t kb = 0; kb < kblocks.count; ++kb) {
              const size_t k0 = kblocks.Begin(kb), kc = kblocks.Size(kb, k);
              // NC blocks of panels: their B (kc x NC) stays in L2 while every
              // strip passes over it; each strip's A (MR x kc) stays in L1
              // across the panels. A strip is packed by its first kernel (A^T:
              // just before it), and the next strip's A (the first of the next
              // K block after the last) is prefetched during its kernels, so
              // that memory delivers it then instead of in a packing phase of
              // its own.
              for (size_t q0 = p0; q0 < p1; q0 += nc_panels) {
                const size_t q1 = std::min(p1, q0 + nc_panels);
                for (size_t s = 0; s < strips; ++s) {
                  const size_t r0 = i0 + s * MR;
                  const size_t rows = std::min(MR, i1 - r0);
                  float* a_strip =
                      a_buf + (one_nc_block ? 0 : s) * strip_floats;
                  // The strip to prefetch during this one's kernels: the next
                  // one, or the first of the next K block.
                  size_t next_r0 = 0, next_rows = 0, next_kb = kb;
                  // The strip is packed with its first kernel (by that kernel,
                  // in the common case), or here for A^T and the bf16 fallback.
                  const bool pack_a = q0 == p0;
                  const bool pack_in_kernel =
                      pack_a && !trans_a &&
                      (kMode == kMatmulFloat32 || kMode == kMatmulBF16Native);
                  const MatmulASource<TA> source{
                      pack_in_kernel ? a + r0 * lda + k0 : nullptr, lda};
                  if (pack_a) {
                    if (!pack_in_kernel) {
                      PackAStripMode<kMode>(a, lda, trans_a, r0, rows, k0, kc,
                                            a_strip);
                    }
                    if (s + 1 < strips) {
                      next_r0 = r0 + MR;
                      next_rows = std::min(MR, i1 - next_r0);
                    } else if (kb + 1 < kblocks.count) {
                      next_r0 = i0;
                      next_rows = std::min(MR, i1 - i0);
                      next_kb = kb + 1;
                    }
                  }
                  for (size_t p = q0; p < q1; ++p) {
                    MatmulAPrefetch next;
                    if (next_rows != 0) {
                      // Piece p - q0 of the q1 - q0 kernels' shares of the next
                      // strip's rows in memory.
                      const size_t pieces = q1 - q0, piece = p - q0;
                      const size_t next_k0 = kblocks.Begin(next_kb);
                      const size_t next_kc = kblocks.Size(next_kb, k);
                      const size_t rows_in_memory =
                          trans_a ? next_kc : next_rows;
                      const size_t first = piece * rows_in_memory / pieces;
                      next = MatmulAPrefetch::Rows(
                          trans_a ? a + (next_k0 + first) * lda + next_r0
                                  : a + (next_r0 + first) * lda + next_k0,
                          lda, (piece + 1) * rows_in_memory / pieces - first,
                          trans_a ? next_rows : next_kc);
                    }
                    const size_t j0 = p * NR;
                    const T* slice = b.template Slice<T>(layout, b_base, window,
                                                         kb, p, p - q0, s == 0);
                    MatmulStripMode<kMode>(
                        rows, kc, a_strip, slice, out, r0, j0,
                        std::min(NR, n - j0), alpha, beta, kb == 0,
                        b.Scales(j0),
                        pack_in_kernel && p == q0 ? &source : nullptr, next);
                  }
                }
              }
            }
          }
        },
        tbb::simple_partitioner());
  });
}

#if HEADWAY_NATIVE_AMX
// ---------------------------------------------------------------------------------------------
// AMX: kMatmulBF16Native on tiles, where AmxBFloat16Active() and M > 16.
//
// A C block of 32 rows x one panel (NR = 32 columns) is four 16 x 16 float
// tiles (tmm0-3), summed over a K block in the tiles. Per 32 k: two A tiles of
// 16 rows x 32 bf16 (tmm4, 5), the panel's two B tiles of 16 pairs of k x 16
// columns (tmm6, 7: the slice's pair layout, MatmulBPairs, read in place 128
// bytes a pair of rows) and four tile products (AmxBlockSteps,
// native_dot-inl.h). A task converts its rows of A
// to bf16 once, for all of K (MatmulAmxPackA); a K block whose length is not a
// multiple of 32 takes its last B tiles from a copy padded with zeros
// (MatmulAmxTailB). An element's sum runs over k in order, 32 at a time,
// whichever task computes it: results are identical for any thread count.

// Rows of a C block (two tiles) and k per tile product.
inline constexpr size_t kMatmulAmxRows = kAmxBlock;
inline constexpr size_t kMatmulAmxK = kAmxBlock;
static_assert(kMatmulNR == 32, "AMX blocks are two 16-column tiles wide");
// Rows of A per task, their bf16 in L2 while the task's panels pass: at most
// 256 (512^3 one thread 1328-1360 GFLOP/s against 1298-1339 at 128 and
// 1271-1318 at 512), and no more than keep them within 1.25 MiB
// (MatmulAmxTaskRows; K = 2048: 256 rows, 1 MiB).
inline constexpr size_t kMatmulAmxTaskRows = 256;
inline constexpr size_t kMatmulAmxTaskABytes = size_t{1280} << 10;
// What converting an int8 weight to bf16 costs a row task, in the split's
// bytes (MatmulPackedAmx): 16, 512^3 on 2 threads as 2 x 4 tasks, 166-170 us
// against 185 as 8 x 1 (weighed as bf16's 2).
inline constexpr double kMatmulAmxInt8Weight = 16.0;

// K as the AMX kernel stores A: each K block padded to a multiple of 32.
HWY_INLINE size_t MatmulAmxPaddedK(const MatmulKBlocks& kblocks, size_t k) {
  size_t padded = 0;
  for (size_t kb = 0; kb < kblocks.count; ++kb) {
    padded += RoundUp(kblocks.Size(kb, k), kMatmulAmxK);
  }
  return padded;
}

// The row stride of A as the AMX kernel stores it (bf16): padded K plus one
// cache line (rows fall into different L1 sets).
HWY_INLINE size_t MatmulAmxAStride(size_t k) {
  return MatmulAmxPaddedK(MatmulKBlocks(k, kMatmulMaxKC), k) + kMatmulAmxK;
}

// Rows [r0, r0 + rows) of op(A) (a [m, k], or a^T with a [k, m]; float or
// bf16) into dst [RoundUp(rows, 32)][stride] bf16, each K block zero-padded to
// a multiple of 32 k, the rows past `rows` zeros. Floats are rounded by
// vcvtne2ps2bf16 32 at a time (BF16PairsFromFloats: storage.h's rounding but
// denormals to 0, which the tiles read as 0 anyway), the rest by storage.h's
// rule; bf16 is copied.
template <class TA>
HWY_INLINE void MatmulAmxPackA(const TA* HWY_RESTRICT a, size_t lda,
                               bool trans_a, size_t r0, size_t rows,
                               const MatmulKBlocks& kblocks, size_t k,
                               hwy::bfloat16_t* HWY_RESTRICT dst,
                               size_t stride) {
  const NativeF32 d;
  const NativePairs du;
  constexpr size_t N = hn::MaxLanes(d);
  constexpr bool kFloat = hwy::IsSame<TA, float>();
  hwy::bfloat16_t zero;
  zero.bits = 0;
  for (size_t r = 0; r < RoundUp(rows, kMatmulAmxRows); ++r) {
    hwy::bfloat16_t* row = dst + r * stride;
    if (r >= rows) {
      std::fill(row, row + stride, zero);
      continue;
    }
    size_t at = 0;
    for (size_t kb = 0; kb < kblocks.count; ++kb) {
      const size_t k0 = kblocks.Begin(kb), kc = kblocks.Size(kb, k);
      size_t kk = 0;
      if (!trans_a) {
        const TA* src = a + (r0 + r) * lda + k0;
        if constexpr (kFloat) {
          for (; kk + 2 * N <= kc; kk += 2 * N) {
            hn::StoreU(BF16PairsFromFloats(hn::LoadU(d, src + kk),
                                           hn::LoadU(d, src + kk + N)),
                       du, reinterpret_cast<uint32_t*>(row + at + kk));
          }
        } else {
          std::copy(src, src + kc, row + at);
          kk = kc;
        }
      }
      for (; kk < kc; ++kk) {
        row[at + kk] = MatmulBF16Element(trans_a ? a[(k0 + kk) * lda + r0 + r]
                                                 : a[(r0 + r) * lda + k0 + kk]);
      }
      const size_t kc_padded = RoundUp(kc, kMatmulAmxK);
      std::fill(row + at + kc, row + at + kc_padded, zero);
      at += kc_padded;
    }
  }
}

// Rows of A per task for A's rows of a_stride bf16: kMatmulAmxTaskRows, fewer
// (a multiple of 32, at least 64) where they would pass kMatmulAmxTaskABytes,
// beyond which A leaves L2 for every panel: 512 x 4096 x 4096 one thread (the
// layer's projection at prefill 512) 16.6-16.7 ms at 128 rows, 17.4-17.9 at
// 64 and 96, 17.7 at 192, 22.8-25.3 at 256.
HWY_INLINE size_t MatmulAmxTaskRows(size_t a_stride) {
  const size_t fit = kMatmulAmxTaskABytes /
                     (a_stride * sizeof(hwy::bfloat16_t)) / kMatmulAmxRows *
                     kMatmulAmxRows;
  return std::min(kMatmulAmxTaskRows, std::max(2 * kMatmulAmxRows, fit));
}

// The last B tiles of a K block of kc (not a multiple of 32) k: the slice's
// pairs of rows past its last 32 k, then the odd last row as pairs (b, 0),
// then zeros, into tail [16][NR][2].
HWY_INLINE void MatmulAmxTailB(const hwy::bfloat16_t* HWY_RESTRICT slice,
                               size_t kc, hwy::bfloat16_t* HWY_RESTRICT tail) {
  constexpr size_t NR = kMatmulNR;
  const size_t first_pair = kc / kMatmulAmxK * kMatmulAmxK / 2;
  const size_t pairs = kc / 2;
  hwy::bfloat16_t zero;
  zero.bits = 0;
  std::fill(tail, tail + kMatmulAmxK * NR, zero);
  std::copy(slice + first_pair * 2 * NR, slice + pairs * 2 * NR, tail);
  if (kc % 2 != 0) {
    for (size_t j = 0; j < NR; ++j) {
      tail[((pairs - first_pair) * NR + j) * 2] = slice[pairs * 2 * NR + j];
    }
  }
}

// C rows [i0, i0 + rows), rows <= 32, columns [j0, j0 + cols) = alpha *
// tiles tmm0-3 (times int8 weights' column scales [NR], or null) + beta * C:
// stored straight from the tiles where C is one plain block of 32 x NR,
// unscaled, and alpha = 1, beta = 0, else through c_tiles [32][NR].
HWY_INLINE void MatmulAmxFinish(float* HWY_RESTRICT c_tiles,
                                const MatmulOut& out, size_t i0, size_t rows,
                                size_t j0, size_t cols, float alpha, float beta,
                                const float* HWY_RESTRICT scales) {
  if (scales == nullptr && out.rows == nullptr && rows == kMatmulAmxRows &&
      cols == kMatmulNR && alpha == 1.0f && beta == 0.0f) {
    AmxStoreBlock(out.c + i0 * out.ldc + j0, out.ldc);
    return;
  }
  AmxStoreBlock(c_tiles, kMatmulNR);
  const MatmulTag d;
  MatmulOut::Column column{};
  const MatmulOut::Column* contiguous = out.ContiguousColumn(j0, cols, &column);
  for (size_t r = 0; r < rows; ++r) {
    hn::Vec<MatmulTag> acc[kMatmulNV];
    for (size_t v = 0; v < kMatmulNV; ++v) {
      acc[v] = hn::Load(d, c_tiles + r * kMatmulNR + v * kMatmulLanes);
    }
    MatmulScaleRow<hwy::bfloat16_t>(acc, scales);
    MatmulStoreTileRow(acc, out, contiguous, i0 + r, j0, cols, alpha, beta,
                       /*first=*/true);
  }
}

// MatmulPackedAmx's per-thread buffers (as MatmulASlots).
HWY_INLINE ThreadScratchSlots& MatmulAmxSlots() {
  thread_local ThreadScratchSlots slots;
  return slots;
}

// C [m, n] (at out) = alpha * op(A) [m, k] * B [k, n] + beta * C, alpha != 0,
// A of float or bf16 (TA), B of bf16 or int8 (TB) packed before the call, on
// AMX tiles. Tasks: blocks of up to MatmulAmxTaskRows rows x groups of panels
// (more than one thread: >= 4 tasks per thread). A task, per panel, per K
// block: every C block of its rows, whose tiles wait in c_acc between the K
// blocks (stored and loaded exactly: the sums are those of one pass over K),
// while the panel's B for the K block stays in L1. int8 B: a task converts
// each panel's slices to bf16 (MatmulBF16SliceFromInt8) into a buffer of its
// thread ([k][NR] bf16) before its blocks pass, and the column scales apply
// as the C blocks are stored.
template <class TB, class TA>
HWY_INLINE void MatmulPackedAmx(const TA* a, size_t lda, bool trans_a,
                                const MatmulB& b, size_t m, size_t n, size_t k,
                                const MatmulOut& out, float alpha, float beta,
                                const hwy::bfloat16_t* a_prepared) {
  constexpr size_t NR = kMatmulNR;
  constexpr size_t KT = kMatmulAmxK;
  constexpr size_t MB = kMatmulAmxRows;
  const MatmulPackedLayout layout(k, n);
  const MatmulKBlocks& kblocks = layout.kblocks;
  const size_t panels = layout.panels;
  const size_t threads = static_cast<size_t>(std::max(1, MaxThreads()));
  const size_t a_stride = MatmulAmxAStride(k);
  const size_t blocks_total = (m + MB - 1) / MB;
  // Tasks: row_tasks blocks of rows x groups of panels, >= 4 per thread on
  // more than one, the split of least cost: each row task reads all of B (2 k
  // n bytes; int8: converts it, b_weight per element), each group converts all
  // of A (m k elements, each weighed as 16 bytes read). 2 threads: 512^3 8 x
  // 1, 1983-2064 GFLOP/s against 1188-1684 as 4 x 2; the MHA layer's prefill
  // 512 4 x 2, 67-70 ms against 72-79 as 2 x 4 and 80 as 8 x 1.
  constexpr bool kInt8 = hwy::IsSame<TB, int8_t>();
  const double b_weight = kInt8 ? kMatmulAmxInt8Weight : 2.0;
  const size_t task_rows = MatmulAmxTaskRows(a_stride);
  const size_t min_row_tasks = (m + task_rows - 1) / task_rows;
  size_t row_tasks = min_row_tasks, groups = 1;
  if (threads > 1) {
    const size_t want = 4 * threads;
    const size_t max_row_tasks =
        std::max(min_row_tasks, std::min(blocks_total, want));
    double best = -1.0;
    for (size_t r = min_row_tasks; r <= max_row_tasks; ++r) {
      const size_t g = std::min(panels, (want + r - 1) / r);
      const double bytes =
          b_weight * static_cast<double>(r) * static_cast<double>(k * n) +
          16.0 * static_cast<double>(g) * static_cast<double>(m * k);
      if (best < 0.0 || bytes < best) {
        best = bytes;
        row_tasks = r;
        groups = g;
      }
    }
  }
  const size_t tasks = row_tasks * groups;
  const size_t blocks_max = (blocks_total + row_tasks - 1) / row_tasks;
  // Per thread: a C block [32][NR] floats, the task's C blocks between K blocks
  // [blocks_max][32][NR] floats, A [blocks_max * 32][a_stride] bf16, the tails
  // [K blocks][32 NR] bf16, int8: the panel as bf16 [k][NR], the slices'
  // pointers.
  const size_t c_floats = MB * NR;
  const size_t acc_floats = blocks_max * MB * NR;
  const size_t a_floats =
      a_prepared != nullptr ? 0 : blocks_max * MB * a_stride / 2;
  const size_t tail_floats = kblocks.count * KT * NR / 2;
  const size_t panel_floats = kInt8 ? k * NR / 2 : 0;
  const size_t floats = c_floats + acc_floats + a_floats + tail_floats +
                        panel_floats + 2 * kblocks.count;
  ThreadSlots& slots = MatmulAmxSlots();
  slots.Reserve(floats);
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, tasks, 1),
        [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
          float* c_tiles = slots.Mine().Get(floats);  // 64-byte aligned
          float* c_acc = c_tiles + c_floats;
          hwy::bfloat16_t* a_buf =
              reinterpret_cast<hwy::bfloat16_t*>(c_acc + acc_floats);
          hwy::bfloat16_t* tails =
              reinterpret_cast<hwy::bfloat16_t*>(c_acc + acc_floats + a_floats);
          hwy::bfloat16_t* panel = tails + 2 * tail_floats;  // int8's bf16
          const hwy::bfloat16_t** slices =
              reinterpret_cast<const hwy::bfloat16_t**>(
                  c_acc + acc_floats + a_floats + tail_floats + panel_floats);
          const void* b_base = b.Begin();
          const size_t a_row_bytes = a_stride * sizeof(hwy::bfloat16_t);
          AmxLoadConfig(AmxBlockConfig());
          for (size_t task = range.begin(); task < range.end(); ++task) {
            const size_t row_task = task % row_tasks;
            const size_t group = task / row_tasks;
            const size_t i0 = row_task * blocks_total / row_tasks * MB;
            const size_t i1 =
                std::min(m, (row_task + 1) * blocks_total / row_tasks * MB);
            const size_t blocks = (i1 - i0 + MB - 1) / MB;
            const size_t p0 = group * panels / groups;
            const size_t p1 = (group + 1) * panels / groups;
            const hwy::bfloat16_t* a_rows = a_buf;
            if (a_prepared != nullptr) {
              a_rows = a_prepared + i0 * a_stride;
            } else {
              MatmulAmxPackA(a, lda, trans_a, i0, i1 - i0, kblocks, k, a_buf,
                             a_stride);
            }
            for (size_t p = p0; p < p1; ++p) {
              for (size_t kb = 0; kb < kblocks.count; ++kb) {
                const size_t kc = kblocks.Size(kb, k);
                if constexpr (kInt8) {
                  hwy::bfloat16_t* slice = panel + kblocks.Begin(kb) * NR;
                  MatmulBF16SliceFromInt8(
                      b.template Slice<int8_t>(layout, b_base, nullptr, kb, p,
                                               0, false),
                      kc, slice);
                  slices[kb] = slice;
                } else {
                  slices[kb] = b.template Slice<hwy::bfloat16_t>(
                      layout, b_base, nullptr, kb, p, 0, false);
                }
                if (kc % KT != 0) {
                  MatmulAmxTailB(slices[kb], kc, tails + kb * KT * NR);
                }
              }
              const size_t j0 = p * NR;
              const size_t cols = std::min(NR, n - j0);
              size_t a_at = 0;  // bytes of A's row before K block kb
              for (size_t kb = 0; kb < kblocks.count; ++kb) {
                const size_t kc = kblocks.Size(kb, k);
                const size_t full = kc / KT, steps = (kc + KT - 1) / KT;
                const hwy::bfloat16_t* slice = slices[kb];
                const hwy::bfloat16_t* tail = tails + kb * KT * NR;
                const auto b_step = [&](size_t s) {
                  return s < full ? slice + s * KT * NR : tail;
                };
                const bool first = kb == 0;
                const bool last = kb + 1 == kblocks.count;
                for (size_t blk = 0; blk < blocks; ++blk) {
                  float* acc = c_acc + blk * MB * NR;
                  if (first) {
                    AmxZeroBlock();
                  } else {
                    AmxLoadBlock(acc, NR);
                  }
                  // A streamed past the panel's B for the K block (32 KiB),
                  // which stays in L1: 512^3 one thread 1.28-1.36 TFLOP/s
                  // against 1.13-1.17 with plain loads in passes of 256 k.
                  AmxBlockSteps</*kStreamA=*/true>(
                      reinterpret_cast<const char*>(a_rows) +
                          blk * MB * a_row_bytes + a_at,
                      a_row_bytes, steps, b_step);
                  const size_t r0 = i0 + blk * MB;
                  if (last) {
                    MatmulAmxFinish(c_tiles, out, r0, std::min(MB, i1 - r0), j0,
                                    cols, alpha, beta, b.Scales(j0));
                  } else {
                    AmxStoreBlock(acc, NR);
                  }
                }
                a_at += steps * KT * sizeof(hwy::bfloat16_t);
              }
            }
          }
          AmxRelease();
        },
        tbb::simple_partitioner());
  });
}

// a [m, k] (float, row stride lda) in the AMX tasks' bf16 layout: dst
// [RoundUp(m, 32)][MatmulAmxAStride(k)], MatmulPackedAmx's own pack, in
// parallel blocks of 32 rows, for a caller that runs several products over the
// same rows (MatmulPackedAmx's a_prepared).
HWY_INLINE void MatmulAmxPrepareA(const float* a, size_t lda, size_t m,
                                  size_t k, hwy::bfloat16_t* dst) {
  const MatmulKBlocks kblocks(k, kMatmulMaxKC);
  const size_t a_stride = MatmulAmxAStride(k);
  const size_t blocks = (m + kMatmulAmxRows - 1) / kMatmulAmxRows;
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, blocks),
      [&](const tbb::blocked_range<size_t>& range) HWY_ATTR {
        for (size_t blk = range.begin(); blk < range.end(); ++blk) {
          const size_t r0 = blk * kMatmulAmxRows;
          MatmulAmxPackA(a, lda, /*trans_a=*/false, r0,
                         std::min(kMatmulAmxRows, m - r0), kblocks, k,
                         dst + r0 * a_stride, a_stride);
        }
      });
}
#endif  // HEADWAY_NATIVE_AMX

// C = alpha * op(A) * op(B) + beta * C with B packed here, into a buffer of the
// calling thread: an unpacked call, for the public entry point and for other
// kernels' per-target code (the materialised attention path).
HWY_INLINE void MatmulUnpacked(const float* a, size_t lda, bool trans_a,
                               const float* b, size_t ldb, bool trans_b,
                               size_t m, size_t n, size_t k, float* c,
                               size_t ldc, float alpha, float beta) {
  if (alpha == 0.0f) {
    MatmulScaleC(c, ldc, m, n, beta);
    return;
  }
  // Reused across calls. isolate(): while this thread waits for the parallel
  // loops below it must not pick up another task of the host that calls Matmul
  // and reuses the same buffer.
  thread_local ThreadScratchBuffer b_scratch;
  tbb::this_task_arena::isolate([&]() HWY_ATTR {
    const MatmulPackedLayout layout(k, n);
    const size_t threads = static_cast<size_t>(std::max(1, MaxThreads()));
    // Packed B that fits the L2 caches (4 MiB: a 1024 x 1024 B) is packed by
    // each thread, the slices it uses (MatmulOwnB), or, where the threads
    // would pack too much of it twice, first, all threads on disjoint panels.
    // A larger one is packed slice by slice, so that it is not written to
    // memory and read back: into a window per task where one task has all the
    // rows, else into one shared copy by the tasks that first need each slice.
    const bool small_b = layout.Floats() * sizeof(float) <= (size_t{4} << 20);
    const MatmulSplit split(m, layout.panels, threads);
    const MatmulBSource source{b, ldb, trans_b, layout, n};
    MatmulOut out;
    out.c = c;
    out.ldc = ldc;
    if (small_b && MatmulOwnBPays(split, threads)) {
      MatmulOwnB own_b(source);
      MatmulPackedOut(a, lda, trans_a, MatmulB::Own(&own_b), m, n, k, out,
                      alpha, beta);
      return;
    }
    if (!small_b && split.row_blocks == 1) {
      MatmulPackedOut(a, lda, trans_a, MatmulB::Window(&source), m, n, k, out,
                      alpha, beta);
      return;
    }
    float* packed = b_scratch.Get(layout.Floats());
    if (small_b) {
      PackBPanels(b, ldb, trans_b, k, n, packed);
      MatmulPackedOut(a, lda, trans_a, MatmulB::Packed(packed), m, n, k, out,
                      alpha, beta);
    } else {
      MatmulLazyB lazy_b(source, packed);
      MatmulPackedOut(a, lda, trans_a, MatmulB::Lazy(&lazy_b), m, n, k, out,
                      alpha, beta);
    }
  });
  // Keep up to 64 MiB (a 4096 x 4096 B) for the next call; free anything
  // larger.
  b_scratch.Trim(size_t{16} << 20);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#endif  // HEADWAY_LIB_MATMUL_MATMUL_INL_H_

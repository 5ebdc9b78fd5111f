// Threads: Headway's kernels run their parallel loops on oneTBB.
//
// A call runs in the caller's tbb::task_arena, so a host that wants a Headway
// call on N threads runs it inside `tbb::task_arena(N).execute(...)`; that is
// also how a host keeps Headway off cores it uses for something else.
// SetMaxThreads is the simple, process-wide alternative.
//
// Results never depend on the number of threads: work is split by shape, not by
// thread count, so every call is bit-identical on 1 or 64 threads.
//
// Memory: each thread that runs part of a call keeps its scratch buffers for
// the next call (a call of a size seen before allocates nothing), until the
// thread exits or ReleaseThreadScratch runs on it. The largest is the thread
// that calls Matmul with an unpacked B whose packed form exceeds 4 MiB: it
// keeps that copy of B, up to 64 MiB (a 4096 x 4096 B) for each instruction
// set it ran on.
#ifndef HEADWAY_THREADS_H_
#define HEADWAY_THREADS_H_

#include <stdint.h>

#include "headway/export.h"
#include "headway/status.h"

namespace headway {

// Caps the threads of every oneTBB parallel loop in this process
// (tbb::global_control, so it also caps the host's own TBB work). n = 0 removes
// the cap. A cap, not a request: a call uses at most the threads of the arena
// it runs in, so n above the arena's concurrency (one thread per core for the
// default arena, the only one a C caller has) changes nothing; running the
// call in a larger tbb::task_arena is the way to more threads than cores
// (MaxThreads() says what a call gets). hw_set_max_threads is this function.
// Error: kInvalidArgument if n < 0.
HEADWAY_API Status SetMaxThreads(int n);

// The number of threads a Headway call made now from this thread may use: the
// current arena's concurrency, capped by SetMaxThreads.
HEADWAY_API int MaxThreads();

// Frees the scratch memory that the calling thread keeps between calls, for
// every instruction set, and returns its bytes; the next call allocates again
// and gives the same results. It frees the buffers of this thread in Matmul
// (the unpacked B's packed copy, a private copy of a B of up to 4 MiB, a bf16
// A widened to floats for float32 compute, the strips of A and window of B of
// the tasks it ran; also inside AttentionWithWeights and
// AttentionLayer::Forward) and in Attention (the tiles
// of the tasks it ran, its plan and partial results). It frees nothing of
// another thread: oneTBB's worker threads keep theirs (the same per-task
// buffers, about 1 MiB plus a B copy of up to 4 MiB per instruction set, more
// for attention with a large head_dim) until they exit, at process exit or
// tbb::finalize. Objects keep their own memory (PackedB, KvCache, and an
// AttentionLayer's buffers until it is destroyed), and the C API keeps this
// thread's hw_last_error message.
HEADWAY_API int64_t ReleaseThreadScratch();

// Bytes of scratch memory the calling thread keeps now: what
// ReleaseThreadScratch would free.
HEADWAY_API int64_t ThreadScratchBytes();

}  // namespace headway

#endif  // HEADWAY_THREADS_H_

// Threads: Headway's kernels run their parallel loops on oneTBB.
//
// A call runs in the caller's tbb::task_arena, so a host that wants a Headway
// call on N threads runs it inside `tbb::task_arena(N).execute(...)`; that is
// also how a host keeps Headway off cores it uses for something else.
// SetMaxThreads is the simple, process-wide alternative.
//
// Results never depend on the number of threads: work is split by shape, not by
// thread count, so every call is bit-identical on 1 or 64 threads.
#ifndef HEADWAY_THREADS_H_
#define HEADWAY_THREADS_H_

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

}  // namespace headway

#endif  // HEADWAY_THREADS_H_

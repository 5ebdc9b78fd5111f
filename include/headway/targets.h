// Instruction sets: which ones Headway was built for, which one runs, and how
// to cap it.
//
// Every kernel is compiled once per instruction set ("target": AVX3_DL, AVX3,
// AVX2, SSE4, SSSE3 and SCALAR on x86-64, EMU128 instead of SCALAR when built
// with clang) and each public call dispatches once to the best target that
// this CPU supports and that is not above the cap. The cap starts from the
// environment variable HEADWAY_MAX_TARGET (e.g. HEADWAY_MAX_TARGET=AVX2), read
// once, at the first Headway call.
//
// The cap is process-wide (it is Highway's). Change it from one thread while no
// Headway call is running: it is meant for start-up, benchmarks and tests, not
// for switching per call.
#ifndef HEADWAY_TARGETS_H_
#define HEADWAY_TARGETS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "headway/export.h"
#include "headway/status.h"

namespace headway {

struct Target {
  int64_t bits = 0;            // Highway's HWY_* bit: compare, never persist
  const char* name = nullptr;  // "AVX3_DL", ..., "SSSE3", "SCALAR" or "EMU128"
};

inline bool operator==(const Target& a, const Target& b) {
  return a.bits == b.bits;
}
inline bool operator!=(const Target& a, const Target& b) { return !(a == b); }

// The targets this build of Headway contains, best first.
HEADWAY_API std::vector<Target> CompiledTargets();

// The compiled targets this CPU can run, best first, whatever the cap. Never
// empty.
HEADWAY_API std::vector<Target> SupportedTargets();

// The target the next Headway call dispatches to: the best supported one not
// above the cap.
HEADWAY_API Target ActiveTarget();

// Caps dispatch at `name` (case-insensitive, e.g. "avx2"): calls then use the
// best supported target that is not better than it. Errors: kInvalidArgument if
// `name` is not a compiled target; kFailedPrecondition if this CPU cannot run
// it. The cap is unchanged on error.
HEADWAY_API Status SetMaxTarget(std::string_view name);

// Removes the cap (including one from HEADWAY_MAX_TARGET): calls use the best
// target again.
HEADWAY_API void ResetMaxTarget();

// Whether this CPU has AVX512_BF16 (the native bf16 dot product vdpbf16ps),
// detected once.
HEADWAY_API bool CpuHasNativeBFloat16();

// Whether this CPU has AVX512_BF16 and runs it faster than float32 FMAs, so
// that the bf16 compute modes gain from it: true on AMD's cores (Zen 4 and Zen
// 5: vdpbf16ps does twice the float32 FMA's flops per cycle, measured), false
// on Intel's, whose vdpbf16ps does half of them (Emerald Rapids, measured: 0.46
// to 0.54x, and the bf16 GEMM 1.2-2.6x faster with the fallback kernel, median
// 1.5 in 5 runs; Cooper Lake and Sapphire and Granite Rapids are taken to be
// alike). Detected once.
HEADWAY_API bool CpuPrefersNativeBFloat16();

// Where the bf16 compute modes (MatmulCompute::kBFloat16,
// AttentionCompute::kBFloat16) run vdpbf16ps, on the AVX3 and AVX3_DL targets:
enum class NativeBFloat16 : int {
  kWhereFaster = 0,     // where CpuPrefersNativeBFloat16() (the default)
  kWhereSupported = 1,  // where CpuHasNativeBFloat16() (the tests)
  kNever = 2,           // nowhere: the fallback kernel, same contract
};

// Whether the bf16 compute modes run vdpbf16ps now: the active target is AVX3
// or AVX3_DL and the CPU is one that SetNativeBFloat16's setting names.
// Otherwise they run a fallback kernel with the same contract.
HEADWAY_API bool NativeBFloat16Active();

// Sets where the native bf16 dot product runs (the default kWhereFaster) and
// returns the setting before the call. Process-wide, like SetMaxTarget: change
// it while no Headway call runs.
HEADWAY_API NativeBFloat16 SetNativeBFloat16(NativeBFloat16 where);

// SetNativeBFloat16(where) for the lifetime of the scope, then the setting it
// found.
class NativeBFloat16Scope {
 public:
  explicit NativeBFloat16Scope(NativeBFloat16 where)
      : previous_(SetNativeBFloat16(where)) {}
  ~NativeBFloat16Scope() { SetNativeBFloat16(previous_); }
  NativeBFloat16Scope(const NativeBFloat16Scope&) = delete;
  NativeBFloat16Scope& operator=(const NativeBFloat16Scope&) = delete;

 private:
  NativeBFloat16 previous_;
};

// Whether this CPU has AMX's bf16 tile multiply (AMX-TILE and AMX-BF16: Intel
// from Sapphire Rapids on) and the operating system lets this process use its
// tiles (XCR0; on Linux the XTILEDATA permission, requested here), detected
// once.
HEADWAY_API bool CpuHasAmxBFloat16();

// Whether the bf16 compute GEMM (MatmulCompute::kBFloat16, more than 16 rows
// of A) runs on AMX tiles now: the active target is AVX3 or AVX3_DL, the CPU
// has them and SetAmxBFloat16 has not turned them off (on by default). One
// core's tile multiplies: 3.1 TFLOP/s, 14.6x its float32 FMA peak (a Xeon with
// AMX, measured). Otherwise the mode runs the kernel NativeBFloat16Active
// picks, with the same contract.
HEADWAY_API bool AmxBFloat16Active();

// Turns the AMX kernel on (the default) or off and returns the setting before
// the call. Process-wide, like SetMaxTarget: change it while no Headway call
// runs.
HEADWAY_API bool SetAmxBFloat16(bool enabled);

// SetAmxBFloat16(enabled) for the lifetime of the scope, then the setting it
// found.
class AmxBFloat16Scope {
 public:
  explicit AmxBFloat16Scope(bool enabled)
      : previous_(SetAmxBFloat16(enabled)) {}
  ~AmxBFloat16Scope() { SetAmxBFloat16(previous_); }
  AmxBFloat16Scope(const AmxBFloat16Scope&) = delete;
  AmxBFloat16Scope& operator=(const AmxBFloat16Scope&) = delete;

 private:
  bool previous_;
};

}  // namespace headway

#endif  // HEADWAY_TARGETS_H_

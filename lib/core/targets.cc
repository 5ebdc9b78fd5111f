// Instruction-set control on top of Highway's dispatch.
//
// The cap is set with hwy::SetSupportedTargetsForTest, not hwy::DisableTargets:
// in Highway 1.0.3 every call of hwy::SupportedTargets() (by us, by the host,
// by another library) re-points dispatch at all of the CPU's targets before
// applying DisableTargets' mask, which silently undoes a DisableTargets cap
// until the next DisableTargets. A "supported targets" mask set with
// SetSupportedTargetsForTest is what SupportedTargets() returns, so it survives
// those calls.
#include "headway/targets.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lib/core/targets.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "lib/core/init.h"

// Per-target part.
HWY_BEFORE_NAMESPACE();
namespace headway {
namespace HWY_NAMESPACE {

// The target this copy is compiled for: dispatched, the target dispatch picks.
int64_t CompiledTargetT() { return HWY_TARGET; }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace headway
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace headway {

HWY_EXPORT(CompiledTargetT);
namespace {

// Bits of the compiled targets, best first (Highway's better targets have lower
// bits).
std::vector<int64_t> CompiledBits() {
  std::vector<int64_t> bits;
  for (int64_t rest = HWY_TARGETS; rest != 0; rest &= rest - 1) {
    bits.push_back(rest & ~(rest - 1));
  }
  return bits;
}

Target MakeTarget(int64_t bits) { return Target{bits, hwy::TargetName(bits)}; }

// What this CPU runs, read before any cap is applied, so that it does not
// change with the cap.
int64_t CpuTargets() {
  static const int64_t cpu = [] {
    hwy::SetSupportedTargetsForTest(0);
    return hwy::SupportedTargets() & HWY_TARGETS;
  }();
  return cpu;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(a[i])) !=
        std::toupper(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string CompiledNames() {
  std::string names;
  for (int64_t bits : CompiledBits()) {
    if (!names.empty()) names += ", ";
    names += hwy::TargetName(bits);
  }
  return names;
}

Status ApplyMaxTarget(std::string_view name) {
  for (int64_t bits : CompiledBits()) {
    if (!EqualsIgnoreCase(name, hwy::TargetName(bits))) continue;
    if ((CpuTargets() & bits) == 0) {
      return Status::FailedPrecondition(
          "SetMaxTarget: this CPU cannot run target " + std::string(name));
    }
    // Better targets have lower bits: keep this bit and the CPU's targets above
    // it.
    hwy::SetSupportedTargetsForTest(CpuTargets() & ~(bits - 1));
    return Status::Ok();
  }
  return Status::InvalidArgument("SetMaxTarget: unknown target \"" +
                                 std::string(name) +
                                 "\"; compiled: " + CompiledNames());
}

}  // namespace

namespace internal {

void InitOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    CpuTargets();
    const char* env = std::getenv("HEADWAY_MAX_TARGET");
    if (env != nullptr && env[0] != '\0') {
      // A bad value must not stop the host: it is reported once and ignored.
      const Status status = ApplyMaxTarget(env);
      if (!status.ok()) {
        std::fprintf(stderr, "headway: ignoring HEADWAY_MAX_TARGET=%s: %s\n",
                     env, status.message().c_str());
      }
    }
  });
}

}  // namespace internal

std::vector<Target> CompiledTargets() {
  std::vector<Target> targets;
  for (int64_t bits : CompiledBits()) targets.push_back(MakeTarget(bits));
  return targets;
}

std::vector<Target> SupportedTargets() {
  internal::InitOnce();
  std::vector<Target> targets;
  for (int64_t bits : CompiledBits()) {
    if (CpuTargets() & bits) targets.push_back(MakeTarget(bits));
  }
  return targets;
}

Target ActiveTarget() {
  internal::InitOnce();
  // Dispatch's choice, a table lookup: hwy::SupportedTargets() runs CPUID on
  // every call (36 us in this VM, where CPUID traps; per bf16-compute Matmul
  // call, through NativeBFloat16Active).
  return MakeTarget(HWY_DYNAMIC_DISPATCH(CompiledTargetT)());
}

Status SetMaxTarget(std::string_view name) {
  internal::InitOnce();
  return ApplyMaxTarget(name);
}

void ResetMaxTarget() {
  internal::InitOnce();
  hwy::SetSupportedTargetsForTest(0);
}

bool CpuHasNativeBFloat16() {
#if defined(__x86_64__) || defined(__i386__)
  // CPUID leaf 7, sub-leaf 1: EAX bit 5 is AVX512_BF16.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 &&
           ((eax >> 5) & 1u) != 0;
  }();
  return has;
#else
  return false;
#endif
}

bool CpuPrefersNativeBFloat16() {
#if defined(__x86_64__) || defined(__i386__)
  // CPUID leaf 0: the vendor string in EBX, EDX, ECX ("GenuineIntel").
  static const bool prefers = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool intel = ebx == 0x756e6547u && edx == 0x49656e69u &&
                       ecx == 0x6c65746eu;  // "Genu" "ineI" "ntel"
    return CpuHasNativeBFloat16() && !intel;
  }();
  return prefers;
#else
  return false;
#endif
}

namespace {
std::atomic<int> g_native_bf16{static_cast<int>(NativeBFloat16::kWhereFaster)};
}  // namespace

bool NativeBFloat16Active() {
#if HWY_ARCH_X86
  const int64_t active = ActiveTarget().bits;
  if (active != HWY_AVX3 && active != HWY_AVX3_DL) return false;
  switch (static_cast<NativeBFloat16>(
      g_native_bf16.load(std::memory_order_relaxed))) {
    case NativeBFloat16::kWhereFaster:
      return CpuPrefersNativeBFloat16();
    case NativeBFloat16::kWhereSupported:
      return CpuHasNativeBFloat16();
    case NativeBFloat16::kNever:
      break;
  }
  return false;
#else
  return false;
#endif
}

NativeBFloat16 SetNativeBFloat16(NativeBFloat16 where) {
  return static_cast<NativeBFloat16>(g_native_bf16.exchange(
      static_cast<int>(where), std::memory_order_relaxed));
}

bool CpuHasAmxBFloat16() {
#if defined(__x86_64__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    // CPUID leaf 1: ECX bit 27 is OSXSAVE (XGETBV may run).
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || ((ecx >> 27) & 1u) == 0)
      return false;
    // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 ||
        ((edx >> 22) & 1u) == 0 || ((edx >> 24) & 1u) == 0) {
      return false;
    }
    // XCR0 bits 17 and 18: the OS saves TILECFG and TILEDATA.
    uint32_t xcr0 = 0, xcr0_high = 0;
    asm volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    if (((xcr0 >> 17) & 3u) != 3u) return false;
#if defined(__linux__)
    // Linux 5.16+: a process asks once for the tile data state
    // (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18), for all of its
    // threads.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
  }();
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<bool> g_amx_bf16{true};
}  // namespace

bool AmxBFloat16Active() {
#if HWY_ARCH_X86
  if (!g_amx_bf16.load(std::memory_order_relaxed)) return false;
  const int64_t active = ActiveTarget().bits;
  // vcvtne2ps2bf16 (AVX512_BF16, which every AMX CPU has) rounds A.
  return (active == HWY_AVX3 || active == HWY_AVX3_DL) && CpuHasAmxBFloat16() &&
         CpuHasNativeBFloat16();
#else
  return false;
#endif
}

bool SetAmxBFloat16(bool enabled) {
  return g_amx_bf16.exchange(enabled, std::memory_order_relaxed);
}

}  // namespace headway
#endif  // HWY_ONCE

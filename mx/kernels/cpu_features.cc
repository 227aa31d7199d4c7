#include "mx/kernels/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

// CPUID.(EAX=7,ECX=0):EDX feature bits of AMX (Intel SDM, vol. 2A, CPUID). GCC's
// cpuid.h names them; clang 14's does not.
#ifndef bit_AMX_BF16
#define bit_AMX_BF16 (1u << 22)
#endif
#ifndef bit_AMX_TILE
#define bit_AMX_TILE (1u << 24)
#endif
#ifndef bit_AMX_INT8
#define bit_AMX_INT8 (1u << 25)
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mx::kernels {
namespace {

constexpr Isa kAll[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx};

uint64_t Xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t{edx} << 32) | eax;
}

bool RequestAmxPermission() {
  // Linux asks a process to opt in to the 8 KiB AMX tile state before using it.
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

Isa Detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::kScalar;
  const bool osxsave = c & bit_OSXSAVE;
  const bool fma = c & bit_FMA;
  const bool f16c = c & bit_F16C;
  const bool avx = c & bit_AVX;
  if (!osxsave || !avx) return Isa::kScalar;
  const uint64_t xcr0 = Xgetbv0();
  if ((xcr0 & 0x6) != 0x6) return Isa::kScalar;  // the OS saves XMM and YMM state
  if (__get_cpuid_max(0, nullptr) < 7) return Isa::kScalar;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & bit_AVX2;
  if (!(avx2 && fma && f16c)) return Isa::kScalar;
  const bool avx512 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) &&
                      (b & bit_AVX512DQ) && (c & bit_AVX512VNNI) && (xcr0 & 0xE0) == 0xE0;
  if (!avx512) return Isa::kAvx2;
  const bool amx = (d & bit_AMX_TILE) && (d & bit_AMX_INT8) && (d & bit_AMX_BF16);
  if (!amx || !RequestAmxPermission()) return Isa::kAvx512;
  return Isa::kAmx;
}

bool DetectAvx512Bf16() {
  if (CpuSupports() < Isa::kAvx512) return false;
  unsigned a, b, c, d;
  __cpuid_count(7, 1, a, b, c, d);
  return a & (1u << 5);  // CPUID.(EAX=7,ECX=1):EAX[5], AVX512_BF16
}

}  // namespace

bool CpuHasAvx512Bf16() {
  static const bool has = DetectAvx512Bf16();
  return has;
}

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (Isa isa : kAll) {
    if (IsaName(isa) == lower) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ISA level '", name, "'; expected one of scalar, avx2, avx512, amx"));
}

Isa CpuSupports() {
  static const Isa supported = Detect();
  return supported;
}

Isa KernelsBuiltFor() { return Isa::kAmx; }

std::span<const Isa> AvailableIsas() {
  const Isa best = std::min(CpuSupports(), KernelsBuiltFor());
  return std::span<const Isa>(kAll, static_cast<size_t>(best) + 1);
}

Isa Resolve(Isa requested) { return std::min(requested, AvailableIsas().back()); }

Isa ChooseIsa(const char* mx_isa, std::string* warning) {
  const Isa best = AvailableIsas().back();
  if (mx_isa == nullptr || *mx_isa == '\0') return best;
  absl::StatusOr<Isa> requested = ParseIsa(mx_isa);
  if (!requested.ok()) {
    *warning = absl::StrCat("MX_ISA: ", requested.status().message(), "; using ", IsaName(best));
    return best;
  }
  if (*requested > best) {
    *warning = absl::StrCat("MX_ISA=", mx_isa, ": not available here (the CPU supports ",
                            IsaName(CpuSupports()), ", the kernels are built up to ",
                            IsaName(KernelsBuiltFor()), "); using ", IsaName(best));
    return best;
  }
  return *requested;
}

Isa DefaultIsa() {
  static const Isa chosen = [] {
    std::string warning;
    const Isa isa = ChooseIsa(std::getenv("MX_ISA"), &warning);
    if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
    return isa;
  }();
  return chosen;
}

}  // namespace mx::kernels

// Which instruction-set level the fast kernels run at, chosen at run time.
//
// Levels, each a superset of the one before:
//   scalar  plain C++, no SIMD beyond the x86-64 baseline: runs anywhere
//   avx2    AVX2 + FMA + F16C (Haswell, Zen and later)
//   avx512  AVX-512 F/BW/VL/DQ + VNNI
//   amx     AVX-512 as above + AMX-TILE/INT8/BF16, with the kernel's permission
//
// The active level is the best one that the CPU supports, that the kernels are
// built for (see KernelsBuiltFor), and that the environment variable MX_ISA
// allows: MX_ISA=scalar|avx2|avx512|amx caps it, so tests and benchmarks can
// force each level on a machine that has them all.
#pragma once

#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mx::kernels {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

absl::string_view IsaName(Isa isa);
// "scalar", "avx2", "avx512", "amx" (case-insensitive); the error lists them.
absl::StatusOr<Isa> ParseIsa(absl::string_view name);

// What this CPU (and OS) supports: every level up to the returned one. AMX counts
// only once arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) has granted the
// tile state to this process; a refusal leaves the answer at avx512.
Isa CpuSupports();

// Whether the CPU has AVX512_BF16 (vdpbf16ps) besides the avx512 level: Zen 4
// and later, Cooper Lake and Sapphire Rapids and later, not Ice Lake. The
// avx512 level's BF16 × BF16 kernel needs it (internal::Kind::kBf16).
bool CpuHasAvx512Bf16();

// The levels the fast kernels have code for in this build: all four. Not every
// level has every kind of kernel: which ones each has is one table,
// internal::kHasKernel in gemm_internal.h, and a kind without its own kernel at a
// level runs the best level below that has one. KernelNameFor (linear.h) gives
// the name Linear reports for a pair of formats at a level.
Isa KernelsBuiltFor();

// The levels a caller may force on this machine: scalar up to
// min(CpuSupports(), KernelsBuiltFor()). Tests run every kernel at each.
std::span<const Isa> AvailableIsas();

// The level kernels use when the caller does not name one: the best available,
// capped by MX_ISA when set. An MX_ISA naming an unknown level, or a level this
// machine cannot run, is reported once on stderr and ignored (capped to the best
// available), so a daemon never fails to start over it.
Isa DefaultIsa();

// DefaultIsa's rule, for a given value of MX_ISA (nullptr: unset). A value that
// cannot be honoured sets *warning to a one-line explanation.
Isa ChooseIsa(const char* mx_isa, std::string* warning);

// Resolves a requested level to the one that will run: min(requested, best
// available).
Isa Resolve(Isa requested);

}  // namespace mx::kernels

// The amx tile kernels compiled against an AMX emulation and SIMDe
// (simd_emulation.h), for emulated_levels_test on CPUs without AMX.
#include "tests/mx/kernels/simd_emulation.h"
// The emulation first: the kernel below must see its intrinsics (kept apart
// from the include sorting of clang-format).

#include "mx/kernels/gemm_amx.cc"

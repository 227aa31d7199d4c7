// The amx tile kernels compiled against an AMX emulation and SIMDe
// (simd_emulation.h), for emulated_levels_test on CPUs without AMX.
#include "tests/mx/kernels/simd_emulation.h"
#include "mx/kernels/gemm_amx.cc"

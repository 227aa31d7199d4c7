// The avx512 tile kernels compiled against SIMDe (simd_emulation.h), for
// avx512_emulated_test on CPUs without AVX-512.
#include "tests/mx/kernels/simd_emulation.h"
// The emulation first: the kernel below must see its intrinsics (kept apart
// from the include sorting of clang-format).

#include "mx/kernels/gemm_avx512.cc"

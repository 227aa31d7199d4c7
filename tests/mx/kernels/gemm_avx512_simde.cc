// The avx512 tile kernels compiled against SIMDe's portable AVX-512, so that
// avx512_emulated_test can check their logic on CPUs without AVX-512. Built with
// AVX2/FMA (SIMDe then computes each 512-bit FMA as two native 256-bit ones: one
// rounding, as the hardware's).
#define MX_KERNELS_SIMDE 1
#include "mx/kernels/gemm_avx512.cc"

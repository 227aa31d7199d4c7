// <immintrin.h> for the files compiled with the avx512 flags (gemm_avx512.cc,
// gemm_amx.cc). GCC 12's avx512fintrin.h trips its own -Wuninitialized (the
// _mm512_undefined_* helpers behind _mm512_set1_*); the warnings point into the
// header, so they are silenced around it and nowhere else.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

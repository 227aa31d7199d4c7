// amx_probe: what this CPU's AMX unit does per second for one thread, the
// roofline the amx kernels are measured against (bench/README.md). Prints, in
// ns per instruction and GFLOP/s (2 · 16 · 16 · K per product):
//   TDPBSUD / TDPBF16PS on four independent C tiles, operands in registers
//   the same with A and B reloaded from L1 before each product (TILELOADD)
//   TILESTORED of a C tile followed by AVX-512 loads of it (what a per-block
//     epilogue pays)
//   LDTILECFG + TILERELEASE (what each kernel call pays)
// Needs AMX-TILE/INT8/BF16 and the kernel's permission (mx::kernels::CpuSupports);
// exits 0 with a line saying so elsewhere, so scripts can run it anywhere.
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "mx/kernels/avx512_intrinsics.h"
#include "mx/kernels/cpu_features.h"

namespace {

struct alignas(64) Config {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// C0..C3 = 16 × 64 bytes, A0/A1 16 × 64, B0/B1 16 × 64 (K = 64 int8, 32 BF16).
Config FullTiles() {
  Config c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  return c;
}

using Clock = std::chrono::steady_clock;
double NanosSince(Clock::time_point start, int64_t count) {
  const std::chrono::duration<double, std::nano> elapsed = Clock::now() - start;
  return elapsed.count() / static_cast<double>(count);
}

void Report(const char* what, double ns, double flops_per) {
  std::printf("%-58s %7.2f ns", what, ns);
  if (flops_per > 0) std::printf("  %7.1f GFLOP/s", flops_per / ns);
  std::printf("\n");
}

// Sets `ns` to the time of `body` (a block) per iteration over kSteps / divide
// iterations, after a tenth as many to warm up. A macro, not a lambda: the
// body must be compiled with its function's target, which a lambda's is not.
#define MX_PROBE(ns, divide, body)                                        \
  do {                                                                    \
    const int64_t n_warm = kSteps / (divide) / 10, n = kSteps / (divide); \
    for (int64_t i = 0; i < n_warm; ++i) body                             \
    const Clock::time_point start = Clock::now();                         \
    for (int64_t i = 0; i < n; ++i) body                                  \
    ns = NanosSince(start, n);                                            \
  } while (false)

// C0..C3 from A (tiles 4, 5) times B (6, 7): four independent products.
#define MX_FOUR_PRODUCTS(product) \
  product(0, 4, 6);               \
  product(1, 4, 7);               \
  product(2, 5, 6);               \
  product(3, 5, 7)

alignas(64) uint8_t g_a[2][16][64], g_b[2][16][64];
alignas(64) int32_t g_c[16][16];

__attribute__((target("amx-tile,amx-int8,amx-bf16,avx512f"))) void Run() {
  constexpr int64_t kSteps = 2'000'000;
  const double flops_i8 = 2.0 * 16 * 16 * 64, flops_bf16 = 2.0 * 16 * 16 * 32;
  const Config config = FullTiles();
  double ns = 0;
  _tile_loadconfig(&config);
  _tile_loadd(4, g_a[0], 64);
  _tile_loadd(5, g_a[1], 64);
  _tile_loadd(6, g_b[0], 64);
  _tile_loadd(7, g_b[1], 64);
  MX_PROBE(ns, 1, { MX_FOUR_PRODUCTS(_tile_dpbsud); });
  Report("TDPBSUD, 4 independent C tiles, K = 64", ns / 4, flops_i8);
  MX_PROBE(ns, 1, { _tile_dpbsud(0, 4, 6); });
  Report("TDPBSUD, one C tile (each waits on the last)", ns, flops_i8);
  MX_PROBE(ns, 1, { MX_FOUR_PRODUCTS(_tile_dpbf16ps); });
  Report("TDPBF16PS, 4 independent C tiles, K = 32 pairs", ns / 4, flops_bf16);
  MX_PROBE(ns, 4, {
           _tile_loadd(4, g_a[0], 64);
           _tile_loadd(5, g_a[1], 64);
           _tile_loadd(6, g_b[0], 64);
           _tile_loadd(7, g_b[1], 64);
           MX_FOUR_PRODUCTS(_tile_dpbsud);
         });
  Report("TDPBSUD with A, B reloaded from L1 (2 + 2 per 4)", ns / 4, flops_i8);
  __m512i sum = _mm512_setzero_si512();
  MX_PROBE(ns, 4, {
           _tile_dpbsud(0, 4, 6);
           _tile_stored(0, g_c, 64);
           for (int r = 0; r < 16; ++r) sum = _mm512_add_epi32(sum, _mm512_load_si512(g_c[r]));
         });
  Report("TDPBSUD + TILESTORED + 16 vector loads of it", ns, 0);
  _mm512_store_si512(g_c[0], sum);  // keeps the loads
  _tile_release();
  MX_PROBE(ns, 20, {
           _tile_loadconfig(&config);
           _tile_zero(0);
           _tile_release();
         });
  Report("LDTILECFG + TILEZERO + TILERELEASE", ns, 0);
}

}  // namespace

int main() {
  if (mx::kernels::CpuSupports() < mx::kernels::Isa::kAmx) {
    std::printf("amx_probe: this CPU (or its kernel's permission) has no AMX; nothing to measure\n");
    return 0;
  }
  Run();
  return 0;
}

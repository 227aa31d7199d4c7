// amx_probe: what this CPU's AMX unit does per second for one thread, the
// roofline the amx kernels are measured against (bench/README.md). Prints, in
// ns per instruction and GFLOP/s (2 · 16 · 16 · K per product):
//   TDPBSUD / TDPBF16PS on four independent C tiles, operands in registers
//   the same with A and B reloaded from L1 before each product (TILELOADD)
//   TILESTORED of a C tile followed by AVX-512 loads of it (what a per-block
//     epilogue pays)
//   LDTILECFG + TILERELEASE (what each kernel call pays)
//   one call of an INT8 tile kernel's shape — 32 rows of X × two 16-column
//   panels of W, K = 896: 14 steps of 2 + 2 TILELOADD and 4 TDPBSUD, C stored —
//   with X's rows read at their stride (896 B) from a 256-row group (L2), and
//   then without the per-call LDTILECFG/TILERELEASE, with X first copied into
//   a contiguous block (stride 64), from such a block without the copy, and
//   in the driver's order (8 calls a pair of W's panels, 152 pairs: W from L3)
//   with X at its stride or laid out per call, with and without an epilogue:
//   the fifth session's INT8 2×2 kernel took about 6 µs a call where its 56
//   products take 0.7, and these say which part of a call costs it
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

// A tile kernel's operands: a task's 256 rows of X (int8, K = 896 a row), two
// panels of W in the VNNI layout ([K / 4][16 lanes][4], 64 bytes a k-group of
// four), C's four tiles, and X's 32 rows of a call staged contiguously
// ([K step][row tile][16 rows][64]).
constexpr int kK = 896, kSteps64 = kK / 64, kGroupRows = 256, kCallRows = 32;
alignas(64) uint8_t g_x[kGroupRows][kK];
alignas(64) uint8_t g_w[2][kK / 4][64];
alignas(64) int32_t g_out[4][16][16];
alignas(64) uint8_t g_staged[kSteps64][2][16][64];
// W at the bench layer's width: 152 pairs of panels, [pair][panel][K / 4][64].
constexpr int64_t kWidePairs = 4864 / 32;
alignas(64) uint8_t g_wide_w[kWidePairs * 2 * kK * 16];
// The group's X laid out per call as its tiles read it, and y for its outputs.
alignas(64) uint8_t g_x_tiled[kGroupRows / kCallRows][kSteps64][2][16][64];
alignas(64) float g_y[kGroupRows][4864];

// One call at rows row0 .. row0 + 31: C0..C3 = X's two row tiles × W's two
// panels over K (`w`, evaluated once: two panels of [K / 4][64] bytes, one after
// the other), X read from `x` (evaluated once) at `x_stride` bytes a row and
// `x_step` bytes a K step, C stored. The caller configures the tiles.
#define MX_CALL_PRODUCTS(x, x_stride, x_step) MX_CALL_PRODUCTS_W(x, x_stride, x_step, &g_w[0][0][0])
#define MX_CALL_PRODUCTS_W(x, x_stride, x_step, w)                            \
  do {                                                                        \
    const uint8_t* const x_call = (x);                                        \
    const uint8_t* const w_call = (w);                                        \
    _tile_zero(0);                                                            \
    _tile_zero(1);                                                            \
    _tile_zero(2);                                                            \
    _tile_zero(3);                                                            \
    for (int s = 0; s < kSteps64; ++s) {                                      \
      _tile_loadd(4, x_call + s * (x_step), x_stride);                        \
      _tile_loadd(5, x_call + 16 * (x_stride) + s * (x_step), x_stride);      \
      _tile_loadd(6, w_call + 1024 * s, 64);                                  \
      _tile_loadd(7, w_call + kK * 16 + 1024 * s, 64);                        \
      MX_FOUR_PRODUCTS(_tile_dpbsud);                                         \
    }                                                                         \
    _tile_stored(0, g_out[0], 64);                                            \
    _tile_stored(1, g_out[1], 64);                                            \
    _tile_stored(2, g_out[2], 64);                                            \
    _tile_stored(3, g_out[3], 64);                                            \
  } while (false)

// An INT8-like epilogue of call `c` in the driver's order: its four C tiles
// (stored in g_out) converted, scaled and stored into y's 32 × 32 outputs.
__attribute__((target("avx512f"))) void Epilogue(int64_t c) {
  const int64_t row0 = c % (kGroupRows / kCallRows) * kCallRows;
  const int64_t col0 = c / (kGroupRows / kCallRows) % kWidePairs * 32;
  const __m512 scale = _mm512_set1_ps(0.5f), bias = _mm512_set1_ps(1.0f);
  for (int t = 0; t < 2; ++t) {
    for (int j = 0; j < 2; ++j) {
      for (int r = 0; r < 16; ++r) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512(g_out[2 * t + j][r]));
        _mm512_storeu_ps(&g_y[row0 + 16 * t + r][col0 + 16 * j], _mm512_fmadd_ps(v, scale, bias));
      }
    }
  }
}

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

  // A kernel call's worth, 56 products; rows cycle through the 256-row group.
  constexpr double kCallFlops = 2.0 * kCallRows * 32 * kK;
  constexpr int64_t kCallDivide = 200;  // 10 K calls
  for (int r = 0; r < kGroupRows; ++r) {
    for (int k = 0; k < kK; ++k) g_x[r][k] = static_cast<uint8_t>(r * 7 + k);
  }
  // Written, so that W's pages are its own and not the kernel's one zero page.
  for (int64_t i = 0; i < kWidePairs * 2 * kK * 16; ++i) g_wide_w[i] = static_cast<uint8_t>(i * 13);
  // X's rows and the staged block as byte ranges of their whole arrays.
  const uint8_t* const x_group = reinterpret_cast<const uint8_t*>(g_x);
  const uint8_t* const staged = reinterpret_cast<const uint8_t*>(g_staged);
  int64_t call = 0;
  const auto rows_of = [&](int64_t c) {
    return x_group + c % (kGroupRows / kCallRows) * kCallRows * kK;
  };
  MX_PROBE(ns, kCallDivide, {
    _tile_loadconfig(&config);
    MX_CALL_PRODUCTS(rows_of(call++), kK, 64);
    _tile_release();
  });
  Report("call: X at its stride from L2, LDTILECFG/RELEASE each", ns, kCallFlops);
  _tile_loadconfig(&config);
  MX_PROBE(ns, kCallDivide, { MX_CALL_PRODUCTS(rows_of(call++), kK, 64); });
  Report("call: X at its stride from L2, tiles configured once", ns, kCallFlops);
  MX_PROBE(ns, kCallDivide, {
    const uint8_t* x = rows_of(call++);
    for (int t = 0; t < 2; ++t) {
      for (int s = 0; s < kSteps64; ++s) {
        for (int r = 0; r < 16; ++r) {
          _mm512_store_si512(g_staged[s][t][r], _mm512_loadu_si512(x + (16 * t + r) * kK + 64 * s));
        }
      }
    }
    MX_CALL_PRODUCTS(staged, 64, 2 * 16 * 64);
  });
  Report("call: X copied into a contiguous block first, then loaded", ns, kCallFlops);
  MX_PROBE(ns, kCallDivide, { MX_CALL_PRODUCTS(staged, 64, 2 * 16 * 64); });
  Report("call: X from a contiguous block (no copy)", ns, kCallFlops);
  // The driver's order: a task takes one pair of panels through the group's 8
  // calls, and the next task the next pair of W's 152 (4864 columns, 4.4 MB:
  // L3, or memory), so each pair's first call reads it from there. X either at
  // its stride or laid out per call as the tiles read it ([call][K step][row
  // tile][16][64], the group's 224 KB from L2 as well), each with or without an
  // INT8-like epilogue (C stored, converted, scaled and stored into y's 32 × 32
  // outputs of the call, y being 256 × 4864 floats). Three rounds, interleaved,
  // because these VMs move 2× between minutes.
  for (int64_t i = 0; i < static_cast<int64_t>(sizeof g_x_tiled); ++i) {
    reinterpret_cast<uint8_t*>(g_x_tiled)[i] = static_cast<uint8_t>(i * 7);
  }
  const auto pair_of = [&](int64_t c) {
    return g_wide_w + c / (kGroupRows / kCallRows) % kWidePairs * 2 * kK * 16;
  };
  const auto tiled_of = [&](int64_t c) {
    return &g_x_tiled[c % (kGroupRows / kCallRows)][0][0][0][0];
  };
  for (int round = 1; round <= 3; ++round) {
    std::printf("round %d\n", round);
    MX_PROBE(ns, kCallDivide, {
      MX_CALL_PRODUCTS_W(rows_of(call), kK, 64, pair_of(call));
      ++call;
    });
    Report("call: driver's order, W from L3, X at its stride", ns, kCallFlops);
    MX_PROBE(ns, kCallDivide, {
      MX_CALL_PRODUCTS_W(tiled_of(call), 64, 2 * 16 * 64, pair_of(call));
      ++call;
    });
    Report("call: driver's order, W from L3, X laid out per call", ns, kCallFlops);
    MX_PROBE(ns, kCallDivide, {
      MX_CALL_PRODUCTS_W(rows_of(call), kK, 64, pair_of(call));
      Epilogue(call++);
    });
    Report("call: ... X at its stride, + epilogue into y", ns, kCallFlops);
    MX_PROBE(ns, kCallDivide, {
      MX_CALL_PRODUCTS_W(tiled_of(call), 64, 2 * 16 * 64, pair_of(call));
      Epilogue(call++);
    });
    Report("call: ... X laid out per call, + epilogue into y", ns, kCallFlops);
  }
  _tile_release();
  _mm512_store_si512(g_c[1], _mm512_load_si512(g_out[call % 4][0]));  // keeps the stores
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

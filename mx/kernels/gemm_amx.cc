// The amx level: BF16 × BF16 (kBf16) on TDPBF16PS tiles. This file is compiled
// with AMX-TILE/INT8/BF16 and the avx512 flags; the driver calls in only after
// CpuSupports() said the CPU has them and the kernel granted the tile state
// (cpu_features.cc).
//
// One call computes up to 32 rows of X (two tiles of 16) against two 16-column
// panels of W (Shape2x2 below): four C tiles of FP32 sums over all of K, each A
// and B tile loaded once for two products, then one epilogue. Every other kind
// runs the avx512 kernels (kHasKernel in gemm_internal.h): on the one AMX CPU
// measured (bench/README.md, "Fifth session"), tile kernels for the integer and
// MX kinds (TDPBSUD per 32-k block with a per-block AVX-512 epilogue; kMxI16
// exactly on TDPBF16PS) lost to avx512's at M = 8, the decode step (median
// ratio to oneDNN 1.6–2.6× lower for the MX kinds, 1.16× for INT8), and at
// M = 512 in two of three one-thread sets; commit 0e83440 has them.
//
// Tests compile this file against an AMX emulation and SIMDe
// (tests/mx/kernels/simd_emulation.h); the entry point is then AmxTileEmulated.
#ifdef MX_KERNELS_EMULATED
#define MX_AMX_ENTRY AmxTileEmulated
#else
#include "mx/kernels/avx512_intrinsics.h"
#define MX_AMX_ENTRY AmxTile
#endif

#include <algorithm>
#include <bit>

#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

#include "mx/kernels/panel_avx512.inc"
#include "mx/kernels/bf16_avx512.inc"

// One call's tiles: X's rows [row0, row0 + 16) and [row0 + 16, row0 + 32) (A0,
// A1) against W's panels `panel` and `panel + 1` (B0, B1), into C[i][j] = Ai ·
// Bj — all eight tile registers: each A and B tile is loaded once for two
// products, and the four sums are independent (2.1× the single-tile kernel's
// speed for BF16 at M = 512 on the AMX Xeon measured). A call may lack
// the second row tile (16 rows or fewer) or the second panel (the last of an
// odd count); the tiles it would use stay unconfigured and unused. Numbers, not
// constants: the intrinsics paste them into the instruction's text.
#define MX_TMM_C00 0
#define MX_TMM_C01 1
#define MX_TMM_C10 2
#define MX_TMM_C11 3
#define MX_TMM_A0 4
#define MX_TMM_A1 5
#define MX_TMM_B0 6
#define MX_TMM_B1 7

// Rows of one AMX tile of X: a call has two.
constexpr int kTileRows = kAmxTileRows / 2;

// LDTILECFG's 64 bytes (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  void Set(int tile, int tile_rows, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};
static_assert(sizeof(TileConfig) == 64);

// The shape of one call: rows per row tile and panels (gemm_internal.h's
// TileFn contract: rows <= kAmxTileRows, panel even, a second panel where W
// has one).
struct Shape2x2 {
  int rows[2];
  bool two_panels;

  Shape2x2(const Problem& p, int call_rows, int64_t panel)
      : rows{std::min(call_rows, kTileRows), std::max(call_rows - kTileRows, 0)},
        two_panels(panel + 1 < p.w->panels) {}
  int panels() const { return two_panels ? 2 : 1; }
  // A tiles of 32 BF16 per row, B tiles of 16 pairs of k × 16 lanes (64 bytes a
  // row), C tiles of 16 FP32 lanes.
  TileConfig Config() const {
    constexpr int a_bytes = 2 * kBlockSize;
    TileConfig c;
    c.Set(MX_TMM_A0, rows[0], a_bytes);
    c.Set(MX_TMM_B0, a_bytes / 4, kPanel * 4);
    c.Set(MX_TMM_C00, rows[0], kPanel * 4);
    if (two_panels) {
      c.Set(MX_TMM_B1, a_bytes / 4, kPanel * 4);
      c.Set(MX_TMM_C01, rows[0], kPanel * 4);
    }
    if (rows[1] > 0) {
      c.Set(MX_TMM_A1, rows[1], a_bytes);
      c.Set(MX_TMM_C10, rows[1], kPanel * 4);
      if (two_panels) c.Set(MX_TMM_C11, rows[1], kPanel * 4);
    }
    return c;
  }
};

// The FP32 sums of a call's C tiles, [row tile][panel][row][lane].
using Sums2x2 = float[2][2][kTileRows][kPanel];

// The C tiles of `shape` in memory.
inline void StoreC(const Shape2x2& shape, Sums2x2& sums) {
  _tile_stored(MX_TMM_C00, sums[0][0], kPanel * 4);
  if (shape.two_panels) _tile_stored(MX_TMM_C01, sums[0][1], kPanel * 4);
  if (shape.rows[1] > 0) {
    _tile_stored(MX_TMM_C10, sums[1][0], kPanel * 4);
    if (shape.two_panels) _tile_stored(MX_TMM_C11, sums[1][1], kPanel * 4);
  }
}
inline void ZeroC(const Shape2x2& shape) {
  _tile_zero(MX_TMM_C00);
  if (shape.two_panels) _tile_zero(MX_TMM_C01);
  if (shape.rows[1] > 0) {
    _tile_zero(MX_TMM_C10);
    if (shape.two_panels) _tile_zero(MX_TMM_C11);
  }
}

// Loads A0 (A1) from X's rows at `x` (row stride `x_stride` bytes) and B0 (B1)
// from W's panels at `w0`, `w1` (64-byte rows), then C[i][j] += Ai · Bj
// (TDPBF16PS).
inline void Multiply2x2(const Shape2x2& shape, const void* x, int64_t x_stride, const void* w0,
                        const void* w1) {
  _tile_loadd(MX_TMM_A0, x, x_stride);
  _tile_loadd(MX_TMM_B0, w0, kPanel * 4);
  if (shape.two_panels) _tile_loadd(MX_TMM_B1, w1, kPanel * 4);
  if (shape.rows[1] > 0) {
    _tile_loadd(MX_TMM_A1, static_cast<const uint8_t*>(x) + kTileRows * x_stride, x_stride);
  }
  _tile_dpbf16ps(MX_TMM_C00, MX_TMM_A0, MX_TMM_B0);
  if (shape.two_panels) _tile_dpbf16ps(MX_TMM_C01, MX_TMM_A0, MX_TMM_B1);
  if (shape.rows[1] > 0) {
    _tile_dpbf16ps(MX_TMM_C10, MX_TMM_A1, MX_TMM_B0);
    if (shape.two_panels) _tile_dpbf16ps(MX_TMM_C11, MX_TMM_A1, MX_TMM_B1);
  }
}

// kBf16: TDPBF16PS, 32 k per instruction — X's rows of 32 BF16 as they are (A),
// W's pair layout as it is (B: 16 pairs of k × 16 lanes × 2) — summed in the
// four C tiles over all of K, then the bias added once: no per-block epilogue,
// so the tile unit, not AVX-512, sets the pace. Each output's sum is the one
// a single C tile gives (the same instructions on the same data, in order).
// Within the float paths' bound like avx512's Bf16PairTile, whose per-output
// guard (Bf16Checked) it shares.
void Bf16Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const Shape2x2 shape(p, rows, panel);
  const int64_t last = panel + shape.panels() - 1;
  const uint16_t* xp = x.bf16.data() + row0 * kp;
  const uint16_t* wp[2] = {w.f16.data() + panel * kp * kPanel, w.f16.data() + last * kp * kPanel};

  const TileConfig config = shape.Config();
  _tile_loadconfig(&config);
  ZeroC(shape);
  for (int64_t k = 0; k < kp; k += kBlockSize) {
    Multiply2x2(shape, xp + k, kp * 2, wp[0] + k * kPanel, wp[1] + k * kPanel);
  }
  alignas(64) Sums2x2 sums;
  StoreC(shape, sums);
  _tile_release();

  for (int j = 0; j < shape.panels(); ++j) {
    const Out out(p, panel + j);
    const __m512 bias = out.Start(p);
    for (int r = 0; r < rows; ++r) {  // the outputs the guard refuses again, in exact order
      const float* sum = sums[r / kTileRows][j][r % kTileRows];
      const __m512 v = _mm512_add_ps(bias, _mm512_load_ps(sum));
      out.Store(p, row0 + r, Bf16Checked(p, row0 + r, panel + j, v, bias));
    }
  }
}

}  // namespace

TileKernel MX_AMX_ENTRY(Kind kind, const Problem&) {
  return kind == Kind::kBf16 ? TileKernel(Bf16Tile, 2) : nullptr;
}

}  // namespace mx::kernels::internal

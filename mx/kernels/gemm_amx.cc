// The amx level: kMxI8, kMxI16, kNvI8, kInt8 and kBf16 on AMX tiles, the epilogues in
// AVX-512. This file is
// compiled with AMX-TILE/INT8 and the avx512 flags; the driver calls in only
// after CpuSupports() said the CPU has them and the kernel granted the tile
// state (cpu_features.cc).
//
// One call computes up to 32 rows of X (two tiles of 16) against two 16-column
// panels of W (Shape2x2 below): four C tiles of int32 or FP32 sums, each A and B
// tile loaded once for two products. Per MX block (K = 32) a TDPBSUD multiplies
// a 16 × 32 s8 tile of X by the 8 × 64 u8 tile of W — the panel layout already
// is AMX's: 4 consecutive k of 16 lanes per 64-byte row — into a 16 × 16 int32
// tile, which is stored and scaled into the FP32 sums by AVX-512, block by block
// in ascending order (MxBlocksTile). Each instruction covers one block only
// (the scales change every 32 k), so the epilogue, not the multiply, bounds
// that kernel; the next block's tile instructions run while it scales. kMxI16
// runs the same way on TDPBF16PS, exactly (Bf16Blocks says why).
//
// INT8 × INT8 (kInt8) runs TDPBSUD and BF16 × BF16 (kBf16) TDPBF16PS, each over
// all of K in the C tiles with one epilogue (Int8Tile, Bf16Tile).
// NVFP4 (kNvI8) runs as kMxI8 with blocks of 16 and its tensor scales after.
// Other kinds (kMxF64, kF32) run the best level below that has them
// (kHasKernel in gemm_internal.h: avx512).
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

#include "mx/kernels/i8_weights_avx512.inc"
#include "mx/kernels/panel_avx512.inc"
#include "mx/kernels/bf16_avx512.inc"

// One call's tiles: X's rows [row0, row0 + 16) and [row0 + 16, row0 + 32) (A0,
// A1) against W's panels `panel` and `panel + 1` (B0, B1), into C[i][j] = Ai ·
// Bj — all eight tile registers. Four independent sums keep the tile unit busy
// through an instruction's latency, where one C tile waited on itself each
// step, and each A and B tile is loaded once for two products. A call may lack
// the second row tile (17 rows or fewer) or the second panel (the last of an
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
      : rows{std::min(call_rows, kAmxTileRows / 2), std::max(call_rows - kAmxTileRows / 2, 0)},
        two_panels(panel + 1 < p.w->panels) {}
  int panels() const { return two_panels ? 2 : 1; }
  // A tiles of `a_bytes` per row (k / 4 rows of B, 64 bytes each) and C tiles
  // of 16 lanes of 32 bits.
  TileConfig Config(int a_bytes) const {
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

// The int32 or FP32 sums of a call's C tiles, [row tile][panel][row][lane].
template <typename T>
using Sums2x2 = T[2][2][kAmxTileRows / 2][kPanel];

// The C tiles of `shape` in memory and back.
template <typename T>
inline void StoreC(const Shape2x2& shape, Sums2x2<T>& sums) {
  _tile_stored(MX_TMM_C00, sums[0][0], kPanel * 4);
  if (shape.two_panels) _tile_stored(MX_TMM_C01, sums[0][1], kPanel * 4);
  if (shape.rows[1] > 0) {
    _tile_stored(MX_TMM_C10, sums[1][0], kPanel * 4);
    if (shape.two_panels) _tile_stored(MX_TMM_C11, sums[1][1], kPanel * 4);
  }
}
template <typename T>
inline void LoadC(const Shape2x2& shape, Sums2x2<T>& sums) {
  _tile_loadd(MX_TMM_C00, sums[0][0], kPanel * 4);
  if (shape.two_panels) _tile_loadd(MX_TMM_C01, sums[0][1], kPanel * 4);
  if (shape.rows[1] > 0) {
    _tile_loadd(MX_TMM_C10, sums[1][0], kPanel * 4);
    if (shape.two_panels) _tile_loadd(MX_TMM_C11, sums[1][1], kPanel * 4);
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
// from W's panels at `w0`, `w1` (64-byte rows), then C[i][j] += Ai · Bj with
// TDPBSUD (kBf16 false) or TDPBF16PS.
template <bool kBf16>
inline void Multiply2x2(const Shape2x2& shape, const void* x, int64_t x_stride, const void* w0,
                        const void* w1) {
  _tile_loadd(MX_TMM_A0, x, x_stride);
  _tile_loadd(MX_TMM_B0, w0, kPanel * 4);
  if (shape.two_panels) _tile_loadd(MX_TMM_B1, w1, kPanel * 4);
  if (shape.rows[1] > 0) {
    _tile_loadd(MX_TMM_A1, static_cast<const uint8_t*>(x) + kAmxTileRows / 2 * x_stride, x_stride);
  }
  if constexpr (kBf16) {
    _tile_dpbf16ps(MX_TMM_C00, MX_TMM_A0, MX_TMM_B0);
    if (shape.two_panels) _tile_dpbf16ps(MX_TMM_C01, MX_TMM_A0, MX_TMM_B1);
    if (shape.rows[1] > 0) {
      _tile_dpbf16ps(MX_TMM_C10, MX_TMM_A1, MX_TMM_B0);
      if (shape.two_panels) _tile_dpbf16ps(MX_TMM_C11, MX_TMM_A1, MX_TMM_B1);
    }
  } else {
    _tile_dpbsud(MX_TMM_C00, MX_TMM_A0, MX_TMM_B0);
    if (shape.two_panels) _tile_dpbsud(MX_TMM_C01, MX_TMM_A0, MX_TMM_B1);
    if (shape.rows[1] > 0) {
      _tile_dpbsud(MX_TMM_C10, MX_TMM_A1, MX_TMM_B0);
      if (shape.two_panels) _tile_dpbsud(MX_TMM_C11, MX_TMM_A1, MX_TMM_B1);
    }
  }
}

// The operands of an MX kind's blocks on tiles, one block of a call at a time:
// kMxI8's s8 X and u8 W + offset through TDPBSUD, int32 dots with X's offset
// share added after (I8Blocks), or kMxI16's elements as BF16 through
// TDPBF16PS, FP32 dots (Bf16Blocks).
template <bool kNibbles>
struct I8Blocks {
  using Sum = int32_t;
  static constexpr bool kBf16 = false, kTensorScales = false;
  static constexpr int kABytes = kBlockSize;  // 32 s8 of a row of X per block
  const I8Weights512<kNibbles> weights[2];
  alignas(64) uint8_t wide[2][kBlockSize / 4][64];  // nibbles widened: one block of B each

  I8Blocks(const WeightPanels& w, int64_t panel, int64_t last)
      : weights{{w, panel}, {w, last}} {}
  static const void* X(const DecodedX& x, int64_t row0, int64_t b) {
    return x.i8.data() + row0 * x.k_padded + b * kBlockSize;
  }
  static int64_t XStride(const DecodedX& x) { return x.k_padded; }
  const void* W(int j, int64_t b) { return weights[j].Block(b, wide[j]); }
  static __m512 Dot(const DecodedX& x, int64_t at, const int32_t* sums) {
    return _mm512_cvtepi32_ps(
        _mm512_add_epi32(_mm512_load_si512(sums), _mm512_set1_epi32(x.block_offset[at])));
  }
};

// kNvI8: NVFP4's blocks of 16 k through TDPBSUD (16 s8 of a row of X, 4 rows of
// B), W as kMxI8's wide storage (w + 12, X's share −12 · Σx in block_offset):
// sums from +0, the fast epilogue per block (always exact for it,
// gemm_internal.h), then y · fp32(ts_x · ts_w) and the bias, the order of the
// other levels.
struct NvBlocks {
  using Sum = int32_t;
  static constexpr bool kBf16 = false, kTensorScales = true;
  static constexpr int kABytes = kNvBlockSize;
  const uint8_t* panels[2];

  NvBlocks(const WeightPanels& w, int64_t panel, int64_t last)
      : panels{w.u8.data() + panel * w.k_padded * kPanel, w.u8.data() + last * w.k_padded * kPanel} {}
  static const void* X(const DecodedX& x, int64_t row0, int64_t b) {
    return x.i8.data() + row0 * x.k_padded + b * kNvBlockSize;
  }
  static int64_t XStride(const DecodedX& x) { return x.k_padded; }
  const void* W(int j, int64_t b) const { return panels[j] + b * kNvBlockSize * kPanel; }
  static __m512 Dot(const DecodedX& x, int64_t at, const int32_t* sums) {
    return I8Blocks<false>::Dot(x, at, sums);
  }
};

// kMxI16 on TDPBF16PS, exact: each element of these formats is, in its fixed
// point, an integer of at most 8 significant bits (E3M2 3, E2M3 4, E2M1 2,
// MXINT8 7 and −128; BF16 holds them exactly, ExactBf16Bits), and a block
// pair's Σ|x'w'| stays below 2^23 (the kind's bound, FastScalesOk): every
// product and every partial sum the instruction forms, in whatever order, is an
// integer below 2^24, which FP32 holds — nothing rounds and nothing is
// subnormal. The FP32 block dot is then the int32 dot the avx512 tile converts,
// so the epilogue, and the bits, are the same. X comes as BF16 from decoding
// (DecodedX::bf16); W's int16 pairs — already B's layout, [k/2][16][2] — are
// converted a block at a time.
struct Bf16Blocks {
  using Sum = float;
  static constexpr bool kBf16 = true, kTensorScales = false;
  static constexpr int kABytes = 2 * kBlockSize;  // 32 BF16 of a row of X per block
  const int16_t* panels[2];
  alignas(64) uint16_t converted[2][kBlockSize / 2][2 * kPanel];

  Bf16Blocks(const WeightPanels& w, int64_t panel, int64_t last)
      : panels{w.i16.data() + panel * w.k_padded * kPanel,
               w.i16.data() + last * w.k_padded * kPanel} {}
  static const void* X(const DecodedX& x, int64_t row0, int64_t b) {
    return x.bf16.data() + row0 * x.k_padded + b * kBlockSize;
  }
  static int64_t XStride(const DecodedX& x) { return 2 * x.k_padded; }
  // Block b of panel j: 16 rows of 32 int16 → the BF16 of their FP32 values,
  // whose low halves are zero (the high halves picked by one permute).
  const void* W(int j, int64_t b) {
    const __m512i high_halves = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const int16_t* block = panels[j] + b * kBlockSize * kPanel;
    for (int row = 0; row < kBlockSize / 2; ++row) {
      const int16_t* src = block + row * 2 * kPanel;
      const __m512 low = _mm512_cvtepi32_ps(
          _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
      const __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + kPanel))));
      _mm512_store_si512(converted[j][row],
                         _mm512_permutex2var_epi16(_mm512_castps_si512(low), high_halves,
                                                   _mm512_castps_si512(high)));
    }
    return converted[j];
  }
  static __m512 Dot(const DecodedX&, int64_t, const float* sums) { return _mm512_load_ps(sums); }
};

// An MX kind per block (K = 32): the four products of the call, each tile's
// block dots stored and scaled into FP32 sums by AVX-512, block by block in
// ascending order. Software-pipelined: the tile instructions of block b + 1
// come before block b's epilogue in program order, into the other of two
// buffers, so the tile unit works while the vector units scale — the epilogue
// (a conversion and an FMA per 16 outputs per block), not the multiply, bounds
// these kernels.
template <typename Blocks>
void MxBlocksTile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  using Sum = typename Blocks::Sum;
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const Shape2x2 shape(p, rows, panel);
  const int64_t last = panel + shape.panels() - 1;
  Blocks blocks(w, panel, last);
  const Out out[2] = {{p, panel}, {p, last}};

  const TileConfig config = shape.Config(Blocks::kABytes);
  _tile_loadconfig(&config);
  alignas(64) Sums2x2<Sum> dots[2];  // block b's in dots[b % 2]
  const auto multiply = [&](int64_t b) {
    const void* w0 = blocks.W(0, b);
    const void* w1 = shape.two_panels ? blocks.W(1, b) : w0;
    ZeroC(shape);
    Multiply2x2<Blocks::kBf16>(shape, Blocks::X(x, row0, b), Blocks::XStride(x), w0, w1);
    StoreC(shape, dots[b % 2]);
  };

  __m512 y[kAmxTileRows][2];
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < shape.panels(); ++j) {
      y[r][j] = Blocks::kTensorScales ? _mm512_setzero_ps() : out[j].Start(p);
    }
  }
  multiply(0);
  for (int64_t b = 0; b < x.blocks; ++b) {
    if (b + 1 < x.blocks) multiply(b + 1);
    __m512 ws[2];
    for (int j = 0; j < shape.panels(); ++j) {
      ws[j] = _mm512_loadu_ps(w.scale.data() + ((panel + j) * x.blocks + b) * kPanel);
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t at = (row0 + r) * x.blocks + b;
      const Sum(*row_dots)[kAmxTileRows / 2][kPanel] = dots[b % 2][r / (kAmxTileRows / 2)];
      for (int j = 0; j < shape.panels(); ++j) {
        const __m512 dot = Blocks::Dot(x, at, row_dots[j][r % (kAmxTileRows / 2)]);
        y[r][j] = FastEpilogue(dot, x.scale[at], ws[j], y[r][j]);
      }
    }
  }
  _tile_release();
  for (int j = 0; j < shape.panels(); ++j) {
    if constexpr (Blocks::kTensorScales) {
      const __m512 tw = _mm512_maskz_loadu_ps(out[j].cols, w.tensor_scale.data() + out[j].n0);
      for (int r = 0; r < rows; ++r) {
        const __m512 v = _mm512_mul_ps(
            y[r][j], _mm512_mul_ps(_mm512_set1_ps(x.tensor_scale[row0 + r]), tw));
        out[j].Store(p, row0 + r, p.bias ? _mm512_add_ps(v, out[j].Start(p)) : v);  // −0 kept
      }
    } else {
      for (int r = 0; r < rows; ++r) out[j].Store(p, row0 + r, y[r][j]);
    }
  }
}

// kInt8: TDPBSUD over all of K in the four C tiles — X's s8 rows (A) by W's u8
// copy w + 128 (B, already AMX's layout), 64 k per instruction — from zero,
// wrapping; where the blocks are odd, the sums go to memory and come back
// under a configuration of 32 k for the last block (LDTILECFG clears the
// tiles). X's −128 · Σx per row (block_offset) then makes each sum exact mod
// 2^32, and so exact: the driver caps K so that the true sum fits int32
// (avx512's Int8Tile says why). The epilogue is the reference's: (float(dot) ·
// scale_x) · scale_w, then the bias.
void Int8Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  const Shape2x2 shape(p, rows, panel);
  const int64_t last = panel + shape.panels() - 1;
  const int8_t* xp = x.i8.data() + row0 * kp;
  const uint8_t* wp[2] = {w.u8.data() + panel * kp * kPanel, w.u8.data() + last * kp * kPanel};

  const TileConfig config = shape.Config(2 * kBlockSize);
  _tile_loadconfig(&config);
  ZeroC(shape);
  int64_t k = 0;
  for (; k + 2 * kBlockSize <= kp; k += 2 * kBlockSize) {
    Multiply2x2<false>(shape, xp + k, kp, wp[0] + k * kPanel, wp[1] + k * kPanel);
  }
  alignas(64) Sums2x2<int32_t> dots;
  if (k < kp) {
    StoreC(shape, dots);
    const TileConfig tail = shape.Config(kBlockSize);
    _tile_loadconfig(&tail);
    LoadC(shape, dots);
    Multiply2x2<false>(shape, xp + k, kp, wp[0] + k * kPanel, wp[1] + k * kPanel);
  }
  StoreC(shape, dots);
  _tile_release();

  for (int j = 0; j < shape.panels(); ++j) {
    const Out out(p, panel + j);
    const __m512 ws = _mm512_loadu_ps(w.scale.data() + (panel + j) * kPanel);
    for (int r = 0; r < rows; ++r) {
      const __m512i dot =
          _mm512_add_epi32(_mm512_load_si512(dots[r / 16][j][r % 16]),
                           _mm512_set1_epi32(x.block_offset[row0 + r]));
      out.Store(p, row0 + r, Int8Epilogue(p, out, dot, x.scale[row0 + r], ws));
    }
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

  const TileConfig config = shape.Config(kBlockSize * 2);  // 32 BF16 per row of A
  _tile_loadconfig(&config);
  ZeroC(shape);
  for (int64_t k = 0; k < kp; k += kBlockSize) {
    Multiply2x2<true>(shape, xp + k, kp * 2, wp[0] + k * kPanel, wp[1] + k * kPanel);
  }
  alignas(64) Sums2x2<float> sums;
  StoreC(shape, sums);
  _tile_release();

  for (int j = 0; j < shape.panels(); ++j) {
    const Out out(p, panel + j);
    const __m512 bias = out.Start(p);
    for (int r = 0; r < rows; ++r) {  // the outputs the guard refuses again, in exact order
      const __m512 v = _mm512_add_ps(bias, _mm512_load_ps(sums[r / 16][j][r % 16]));
      out.Store(p, row0 + r, Bf16Checked(p, row0 + r, panel + j, v, bias));
    }
  }
}

}  // namespace

TileKernel MX_AMX_ENTRY(Kind kind, const Problem& p) {
  switch (kind) {
    case Kind::kMxI8:
      if (!p.fast_scales) return nullptr;
      return {p.w->nibbles ? MxBlocksTile<I8Blocks<true>> : MxBlocksTile<I8Blocks<false>>, 2};
    case Kind::kMxI16:
      if (!p.fast_scales || p.x->bf16.empty()) return nullptr;
      return {MxBlocksTile<Bf16Blocks>, 2};
    case Kind::kNvI8:
      return {MxBlocksTile<NvBlocks>, 2};
    case Kind::kInt8:
      return {Int8Tile, 2};
    case Kind::kBf16:
      return {Bf16Tile, 2};
    default:
      return nullptr;
  }
}

}  // namespace mx::kernels::internal

// The scalar level: portable C++ tile kernels, one per kind. Every MX kind uses
// the wide epilogue, so these are exact for any block scales; the AVX2 driver
// also falls back to them when its fast epilogue would not be.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "mx/element.h"
#include "mx/kernels/gemm_internal.h"

namespace mx::kernels::internal {
namespace {

// MX kinds: exact integer (or FP64) block dots, the wide epilogue per block.
template <Kind K>
void MxTile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  Tile tile(p, panel, /*with_bias=*/true);
  for (int64_t b = 0; b < x.blocks; ++b) {
    const double* ws = w.scale_d.data() + (panel * x.blocks + b) * kPanel;
    // This block of the panel's W, read once for all rows: kMxI8 bytes, or
    // kMxF64 element values widened from FP16.
    uint8_t w8[kBlockSize][kPanel];
    double wd[kBlockSize][kPanel];
    if constexpr (K == Kind::kMxI8) I8WeightBlock(w, panel, b, w8);
    if constexpr (K == Kind::kMxF64) {
      const uint16_t* wk = w.f16.data() + (panel * kp + b * kBlockSize) * kPanel;
      for (int i = 0; i < kBlockSize; ++i) {
        for (int j = 0; j < kPanel; ++j) wd[i][j] = Fp16ToFloat(wk[i * kPanel + j]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t row = row0 + r;
      double dot[kPanel] = {};
      if constexpr (K == Kind::kMxF64) {
        for (int i = 0; i < kBlockSize; ++i) {
          const double xv = x.f64[row * kp + b * kBlockSize + i];
          for (int j = 0; j < kPanel; ++j) dot[j] += xv * wd[i][j];
        }
      } else {
        int32_t acc[kPanel] = {};
        for (int i = 0; i < kBlockSize; ++i) {
          const int64_t k = b * kBlockSize + i;
          if constexpr (K == Kind::kMxI8) {
            const int32_t xv = x.i8[row * kp + k];
            for (int j = 0; j < kPanel; ++j) acc[j] += xv * int32_t{w8[i][j]};
          } else {
            const int32_t xv = x.i16[row * kp + k];
            const int16_t* wk = w.i16.data() + ((panel * (kp / 2) + k / 2) * kPanel) * 2 + k % 2;
            for (int j = 0; j < kPanel; ++j) acc[j] += xv * int32_t{wk[2 * j]};
          }
        }
        const int32_t offset = K == Kind::kMxI8 ? x.block_offset[row * x.blocks + b] : 0;
        for (int j = 0; j < kPanel; ++j) dot[j] = acc[j] + offset;
      }
      const double xs = x.scale_d[row * x.blocks + b];
      // Exact in FP64; the conversion to float is the block's one rounding.
      for (int j = 0; j < kPanel; ++j) tile.y[r][j] += static_cast<float>(dot[j] * xs * ws[j]);
    }
  }
  tile.Store(p, row0, rows);
}

// INT8: exact int32 dot over all of K, then float(dot)·scale_x·scale_w + bias.
void Int8Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  Tile tile(p, panel, /*with_bias=*/false);
  for (int r = 0; r < rows; ++r) {
    const int64_t row = row0 + r;
    int32_t acc[kPanel] = {};
    for (int64_t k = 0; k < kp; ++k) {
      const int32_t xv = x.i16[row * kp + k];
      const int16_t* wk = w.i16.data() + ((panel * (kp / 2) + k / 2) * kPanel) * 2 + k % 2;
      for (int j = 0; j < kPanel; ++j) acc[j] += xv * int32_t{wk[2 * j]};
    }
    for (int j = 0; j < tile.cols; ++j) {
      float v = static_cast<float>(acc[j]) * x.scale[row] * w.scale[panel * kPanel + j];
      if (p.bias) v += p.bias[tile.n0 + j];
      tile.y[r][j] = v;
    }
  }
  tile.Store(p, row0, rows);
}

// NVFP4: per 16-block the exact int32 dot, then y += (float(dot) · xs) · ws with
// both products exact (the block result needs no rounding); after the blocks
// y · fp32(ts_x · ts_w), then + bias.
void NvTile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  Tile tile(p, panel, /*with_bias=*/false);
  for (int64_t b = 0; b < x.blocks; ++b) {
    const float* ws = w.scale.data() + (panel * x.blocks + b) * kPanel;
    for (int r = 0; r < rows; ++r) {
      const int64_t row = row0 + r;
      int32_t acc[kPanel] = {};
      for (int64_t k = b * kNvBlockSize; k < (b + 1) * kNvBlockSize; ++k) {
        const int32_t xv = x.i8[row * kp + k];
        const uint8_t* wk = w.u8.data() + (panel * (kp / 4) + k / 4) * kPanel * 4 + k % 4;
        for (int j = 0; j < kPanel; ++j) acc[j] += xv * (int32_t{wk[4 * j]} - w.i8_offset);
      }
      const float xs = x.scale[row * x.blocks + b];
      for (int j = 0; j < kPanel; ++j) {
        const float t = static_cast<float>(acc[j]) * xs;
        tile.y[r][j] += t * ws[j];
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < tile.cols; ++j) {
      float v = tile.y[r][j] * (x.tensor_scale[row0 + r] * w.tensor_scale[tile.n0 + j]);
      if (p.bias) v += p.bias[tile.n0 + j];
      tile.y[r][j] = v;
    }
  }
  tile.Store(p, row0, rows);
}

// Float kind: y = fma(x_k, w_k, y) for k ascending from the bias, per output:
// the reference's own order, so even these bits match it.
void F32Tile(const Problem& p, int64_t row0, int rows, int64_t panel) {
  const DecodedX& x = *p.x;
  const WeightPanels& w = *p.w;
  const int64_t kp = x.k_padded;
  Tile tile(p, panel, /*with_bias=*/true);
  float wk[kPanel];
  for (int64_t k = 0; k < w.k; ++k) {
    const int64_t at = (panel * kp + k) * kPanel;
    const int64_t pair_at = (panel * kp + (k & ~int64_t{1})) * kPanel + (k & 1);  // BF16
    for (int j = 0; j < kPanel; ++j) {
      wk[j] = w.float_store == Format::kFp32   ? w.f32[at + j]
              : w.float_store == Format::kFp16 ? Fp16ToFloat(w.f16[at + j])
                                               : Bf16ToFloat(w.f16[pair_at + 2 * j]);
    }
    for (int r = 0; r < rows; ++r) {
      const float xk = x.f32[(row0 + r) * kp + k];
      for (int j = 0; j < kPanel; ++j) tile.y[r][j] = std::fma(xk, wk[j], tile.y[r][j]);
    }
  }
  tile.Store(p, row0, rows);
}

}  // namespace

TileKernel ScalarTile(Kind kind) {
  switch (kind) {
    case Kind::kMxI8: return MxTile<Kind::kMxI8>;
    case Kind::kMxI16: return MxTile<Kind::kMxI16>;
    case Kind::kMxF64: return MxTile<Kind::kMxF64>;
    case Kind::kInt8: return Int8Tile;
    case Kind::kNvI8: return NvTile;
    case Kind::kF32:
    case Kind::kBf16: return F32Tile;
  }
  return nullptr;
}

}  // namespace mx::kernels::internal

// The FPGA GEMM engine, in the Vitis HLS style: weight-stationary, one W tile of
// kPeCols rows held on chip while every row of X streams past it, a kPeRows ×
// kPeCols array of processing elements, and load → compute → store overlapped in
// a dataflow region. See fpga/README.md for the block diagram.
//
// Compiled by g++ as plain C++ (pragmas ignored) it is the `hls-sim` backend and
// the subject of tests/fpga/hls_kernel_test.cc, which hold it to mx/'s reference
// bit for bit. It deliberately shares no code with mx/: Vitis must synthesize
// every line, so the decoders and the one rounding are written here in
// fixed-width integer arithmetic.
#include "fpga/hls/mx_gemm.h"

#include <cmath>
#include <cstring>

#include "fpga/hls/hls_compat.h"

namespace mxhls {
namespace {

// One block of 32 elements of one row, as it leaves the loaders: the raw words,
// the block's scale (MX: its E8M0 byte; NVFP4: its halves' UE4M3 bytes, the
// first in bits 7:0) and the row's FP32 scale (INT8, NVFP4).
struct BlockWords {
  Word words[kMaxWordsPerBlock];
  uint32_t scale_bits;
  uint32_t row_scale_bits;
};

// --- Element decoders (combinational logic in hardware) -------------------------

// Element i of a block: bits [i·bits, i·bits + bits) of the block's bit string.
inline uint32_t ElementCode(const Word* words, int bits, int i) {
#pragma HLS INLINE
  const int offset = i * bits;
  const int word = offset >> 6, shift = offset & 63;
  UInt<64> v = words[word] >> shift;
  if (shift + bits > 64) v |= words[word + 1] << (64 - shift);
  return static_cast<uint32_t>(v & ((UInt<64>{1} << bits) - 1));
}

// A minifloat's fields; MXINT8 has none (its code is the integer itself).
struct Minifloat {
  int exponent_bits, mantissa_bits, bias;
};
inline Minifloat MinifloatOf(HwFormat f) {
#pragma HLS INLINE
  switch (f) {
    case kHwE4m3: return {4, 3, 7};
    case kHwE5m2: return {5, 2, 15};
    case kHwE3m2: return {3, 2, 3};
    case kHwE2m3: return {2, 3, 1};
    default:      return {2, 1, 1};  // E2M1
  }
}

// Bits below the binary point of the format's smallest step: every finite element
// is an integer multiple of 2^-F (E4M3 9, E5M2 16, E3M2 4, E2M3 3, E2M1 1, MXINT8 6).
inline int FractionBits(HwFormat f) {
#pragma HLS INLINE
  if (f == kHwMxInt8) return 6;
  const Minifloat mf = MinifloatOf(f);
  return mf.bias - 1 + mf.mantissa_bits;
}

enum ElementKind : uint8_t { kFinite = 0, kNan = 1, kPosInf = 2, kNegInf = 3 };

// An MX element as sign·significand · 2^shift in units of 2^-F. The significand
// needs at most 8 bits plus sign (MXINT8), the shift at most 29 (E5M2). NVFP4's
// elements decode as E2M1, its UE4M3 scale bytes as (non-negative) E4M3.
struct MxElement {
  Int<9> significand;
  UInt<5> shift;
  ElementKind kind;
};

inline MxElement DecodeMx(HwFormat f, uint32_t code) {
#pragma HLS INLINE
  if (f == kHwMxInt8) return {static_cast<Int<9>>(static_cast<int8_t>(code)), 0, kFinite};
  const Minifloat mf = MinifloatOf(f);
  const int total = 1 + mf.exponent_bits + mf.mantissa_bits;
  const bool negative = (code >> (total - 1)) & 1;
  const uint32_t exponent = (code >> mf.mantissa_bits) & ((1u << mf.exponent_bits) - 1);
  const uint32_t mantissa = code & ((1u << mf.mantissa_bits) - 1);
  const uint32_t top = (1u << mf.exponent_bits) - 1;
  if (f == kHwE4m3 && exponent == top && mantissa == 7) return {0, 0, kNan};
  if (f == kHwE5m2 && exponent == top) {
    if (mantissa != 0) return {0, 0, kNan};
    return {0, 0, negative ? kNegInf : kPosInf};
  }
  const int magnitude = exponent == 0 ? mantissa : (1u << mf.mantissa_bits) | mantissa;
  const int shift = exponent == 0 ? 0 : exponent - 1;
  return {static_cast<Int<9>>(negative ? -magnitude : magnitude), static_cast<UInt<5>>(shift),
          kFinite};
}

// --- Codebook ROMs --------------------------------------------------------------------

// NF4's and bitsandbytes FP4's 16 values by code (mx/codebook.h states the
// contract; the kernel keeps its own copy, as a 16-entry ROM per format).
inline float CodebookRom(HwFormat f, uint32_t code) {
#pragma HLS INLINE
  static const float kNf4[16] = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
      -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
      0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
      0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
  static const float kFp4[16] = {
      0.0f,  5.208333333e-03f,  0.66666667f,  1.0f,  0.33333333f,  0.5f,  0.16666667f,  0.25f,
      -0.0f, -5.208333333e-03f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f};
  return f == kHwNf4 ? kNf4[code & 15] : kFp4[code & 15];
}

// --- FP32 bit patterns ---------------------------------------------------------------

inline float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float QuietNan() { return FloatFromBits(0x7FC00000u); }
inline float Infinity(bool negative) { return FloatFromBits(negative ? 0xFF800000u : 0x7F800000u); }
// The E8M0 byte that marks a block NaN.
constexpr uint32_t kNanScale = 0xFF;

// --- The one rounding --------------------------------------------------------------

// value · 2^exponent rounded once to FP32 (nearest, ties to even), with FP32
// subnormals and overflow to ±Inf: a leading-one detector, one barrel shift and
// an incrementer. |value| < 2^71.
inline float RoundToFloat(Int<72> value, int exponent) {
#pragma HLS INLINE
  if (value == 0) return 0.0f;
  const bool negative = value < 0;
  const UInt<72> magnitude = negative ? static_cast<UInt<72>>(-value) : static_cast<UInt<72>>(value);
  int lead = 0;
  for (int b = 0; b < 72; ++b) {
#pragma HLS UNROLL
    if ((magnitude >> b) & 1) lead = b;
  }
  uint32_t bits;
  if (lead + exponent > 127) {
    bits = 0x7F800000u;
  } else {
    // The result's step: 24 significant bits, never below the subnormal step 2^-149.
    const int step = lead + exponent - 23 > -149 ? lead + exponent - 23 : -149;
    const int shift = step - exponent;
    UInt<72> q;
    if (shift <= 0) {
      q = magnitude << -shift;  // fewer than 24 bits: exact
    } else if (shift > 72) {
      q = 0;  // below half the smallest step
    } else {
      q = magnitude >> shift;
      const UInt<80> remainder = static_cast<UInt<80>>(magnitude) & ((UInt<80>{1} << shift) - 1);
      const UInt<80> half = UInt<80>{1} << (shift - 1);
      if (remainder > half || (remainder == half && (q & 1))) q += 1;
    }
    // q ≤ 2^24. Exponent field and significand in one add: a carry out of the
    // significand bumps the exponent, and past the largest finite value gives Inf.
    bits = (static_cast<uint32_t>(step + 149) << 23) + static_cast<uint32_t>(q);
  }
  if (negative) bits |= 0x80000000u;
  return FloatFromBits(bits);
}

inline float Fp16ToFloat(uint32_t h) {
#pragma HLS INLINE
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  if (exponent == 0x1F) return FloatFromBits(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return FloatFromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = RoundToFloat(mantissa, -24);  // subnormal: exact
  return sign ? -magnitude : magnitude;
}

// A minifloat code's sign bit: a zero keeps it (-0 · scale is -0).
inline bool SignBit(HwFormat f, uint32_t code) {
#pragma HLS INLINE
  const Minifloat mf = MinifloatOf(f);
  return (code >> (mf.exponent_bits + mf.mantissa_bits)) & 1;
}
inline float SignedZero(bool negative) { return FloatFromBits(negative ? 0x80000000u : 0u); }

// An element widened to FP32 for the float path: exact for the MX formats and
// BF16/FP16/FP32; INT8's code · row scale is one FP32 multiply, NVFP4's
// element · block scale is exact and its product with the tensor scale one
// FP32 multiply, a codebook's table value · absmax one FP32 multiply, as in
// mx::Dequantize. `block_scale` is the element's block scale (MX: E8M0, NVFP4:
// UE4M3, codebooks: the FP32 absmax's bits).
inline float ElementToFloat(HwFormat f, uint32_t code, uint32_t block_scale, uint32_t row_scale_bits) {
#pragma HLS INLINE
  switch (f) {
    case kHwInt8:
      return static_cast<float>(static_cast<int8_t>(code)) * FloatFromBits(row_scale_bits);
    case kHwBf16: return FloatFromBits(code << 16);
    case kHwFp16: return Fp16ToFloat(code);
    case kHwFp32: return FloatFromBits(code);
    case kHwNf4:
    case kHwBnbFp4:  // the ROM's value times the block's absmax (FP32 bits here)
      return CodebookRom(f, code) * FloatFromBits(block_scale);
    default: break;
  }
  const MxElement e = DecodeMx(f, code);
  if (f == kHwNvfp4) {
    if (block_scale == kNvScaleNanByte) return QuietNan();
    const MxElement s = DecodeMx(kHwE4m3, block_scale);
    const Int<16> product = static_cast<Int<16>>(e.significand * s.significand);
    const float exact = product == 0 ? SignedZero(SignBit(f, code))
                                     : RoundToFloat(product, static_cast<int>(e.shift + s.shift) -
                                                                 FractionBits(f) - FractionBits(kHwE4m3));
    return exact * FloatFromBits(row_scale_bits);
  }
  if (block_scale == kNanScale) return QuietNan();
  if (e.kind == kNan) return QuietNan();
  if (e.kind != kFinite) return Infinity(e.kind == kNegInf);
  if (e.significand == 0) return SignedZero(f != kHwMxInt8 && SignBit(f, code));
  return RoundToFloat(e.significand,
                      static_cast<int>(e.shift) - FractionBits(f) + static_cast<int>(block_scale) - 127);
}

// --- One block through one processing element --------------------------------------

// A block as the PE array's edge decoders hand it to a row or column of PEs.
struct DecodedBlock {
  MxElement mx[kBlock];
  Int<10> fixed[kBlock];  // integer path: the element in units of 2^-F
  float wide[kBlock];     // float path
  int8_t int8[kBlock];    // INT8 path
  uint32_t scale_bits;
  bool any_special;
};

inline void DecodeBlock(HwFormat f, Datapath path, const BlockWords& in, DecodedBlock& out) {
#pragma HLS INLINE
  const int bits = ElementBits(f);
  out.scale_bits = in.scale_bits;
  out.any_special = false;
  for (int t = 0; t < kBlock; ++t) {
#pragma HLS UNROLL
    const uint32_t code = ElementCode(in.words, bits, t);
    switch (path) {
      case kPathMxInteger:
      case kPathMxWide:
      case kPathNv:
        out.mx[t] = DecodeMx(f, code);
        // The integer paths' formats stay below 2^9 in units of 2^-F; FP8 would not.
        if (path != kPathMxWide) {
          out.fixed[t] = static_cast<Int<10>>(out.mx[t].significand << out.mx[t].shift);
        }
        out.any_special |= out.mx[t].kind != kFinite;
        break;
      case kPathInt8:
        out.int8[t] = static_cast<int8_t>(code);
        break;
      case kPathFloat: {
        // NVFP4: each half of the block has its own scale byte.
        const uint32_t scale = f == kHwNvfp4 ? (in.scale_bits >> (t < kNvHalf ? 0 : 8)) & 0xFF
                                             : in.scale_bits;
        out.wide[t] = ElementToFloat(f, code, scale, in.row_scale_bits);
        break;
      }
    }
  }
}

// The result of a block holding Inf or NaN codes, as IEEE arithmetic gives it:
// NaN if any product is NaN (a NaN factor, or Inf · 0) or infinities of both signs
// meet, else the one infinity. Every code counts, a short last block's padding
// included (the contract: padding codes are elements).
inline float NonFiniteBlock(const DecodedBlock& a, const DecodedBlock& b) {
#pragma HLS INLINE
  bool nan = false, pos = false, neg = false;
  for (int t = 0; t < kBlock; ++t) {
#pragma HLS UNROLL
    const MxElement x = a.mx[t], y = b.mx[t];
    if (x.kind == kNan || y.kind == kNan) {
      nan = true;
    } else if (x.kind != kFinite || y.kind != kFinite) {
      const bool x_zero = x.kind == kFinite && x.significand == 0;
      const bool y_zero = y.kind == kFinite && y.significand == 0;
      if (x_zero || y_zero) {
        nan = true;
      } else {
        const bool x_neg = x.kind == kNegInf || (x.kind == kFinite && x.significand < 0);
        const bool y_neg = y.kind == kNegInf || (y.kind == kFinite && y.significand < 0);
        (x_neg != y_neg ? neg : pos) = true;
      }
    }
  }
  if (nan || (pos && neg)) return QuietNan();
  return Infinity(neg);
}

// Exact block dot of two MX blocks rounded once to FP32: the contract's step 1.
inline float MxBlockResult(Datapath path, HwFormat fx, HwFormat fw, const DecodedBlock& a,
                           const DecodedBlock& b) {
#pragma HLS INLINE
  if (a.scale_bits == kNanScale || b.scale_bits == kNanScale) return QuietNan();
  const int exponent = static_cast<int>(a.scale_bits) + static_cast<int>(b.scale_bits) - 254 -
                       FractionBits(fx) - FractionBits(fw);
  if (path == kPathMxInteger) {
    // |element| ≤ 448 (E3M2 in units of 2^-4): products below 2^18, 32 of them below 2^23.
    Int<24> dot = 0;
    for (int t = 0; t < kBlock; ++t) {
#pragma HLS UNROLL
      dot += static_cast<Int<19>>(a.fixed[t] * b.fixed[t]);
    }
    return RoundToFloat(dot, exponent);
  }
  if (a.any_special || b.any_special) return NonFiniteBlock(a, b);
  // Significand products (at most 8×8 bits) aligned by the exponent sum, at most
  // 29 + 29: each below 2^64, the sum of 32 below 2^69.
  Int<72> dot = 0;
  for (int t = 0; t < kBlock; ++t) {
#pragma HLS UNROLL
    const Int<18> product = static_cast<Int<18>>(a.mx[t].significand * b.mx[t].significand);
    dot += static_cast<Int<72>>(product) << (a.mx[t].shift + b.mx[t].shift);
  }
  return RoundToFloat(dot, exponent);
}

// One NVFP4 half block (elements 16·half …) through a PE: the exact dot of the
// E2M1 elements (units of 2^-2, |dot| ≤ 16 · 12 · 12 < 2^12) times both UE4M3
// significands (4 bits each), below 2^20 and so exact in FP32 — the contract's
// block result, no rounding of its own. NaN when either scale byte marks a NaN
// block.
inline float NvHalfResult(const DecodedBlock& a, const DecodedBlock& b, int half) {
#pragma HLS INLINE
  const uint32_t byte_a = (a.scale_bits >> (8 * half)) & 0xFF;
  const uint32_t byte_b = (b.scale_bits >> (8 * half)) & 0xFF;
  if (byte_a == kNvScaleNanByte || byte_b == kNvScaleNanByte) return QuietNan();
  Int<14> dot = 0;
  for (int t = 0; t < kNvHalf; ++t) {
#pragma HLS UNROLL
    dot += static_cast<Int<9>>(a.fixed[half * kNvHalf + t] * b.fixed[half * kNvHalf + t]);
  }
  const MxElement sa = DecodeMx(kHwE4m3, byte_a), sb = DecodeMx(kHwE4m3, byte_b);
  const Int<24> value = static_cast<Int<24>>(dot) * sa.significand * sb.significand;
  return RoundToFloat(value, static_cast<int>(sa.shift + sb.shift) - 2 * FractionBits(kHwE4m3) -
                                 2 * FractionBits(kHwNvfp4));
}

// --- The dataflow processes ----------------------------------------------------------

struct Shape {
  int m, n, k, blocks;
  HwFormat fx, fw;
  Datapath path;
  bool bias;
};

// A block's scale bits: MX one byte, NVFP4 the two bytes of its halves, a
// codebook its FP32 absmax.
inline uint32_t ScaleBits(const Word* scales, HwFormat f, int row, int blocks, int block) {
#pragma HLS INLINE
  const int64_t index = static_cast<int64_t>(row) * blocks + block;
  if (IsCodebook(f)) return static_cast<uint32_t>(scales[index >> 1] >> ((index & 1) * 32));
  if (IsMxFormat(f)) return static_cast<uint32_t>((scales[index >> 3] >> ((index & 7) * 8)) & 0xFF);
  if (f == kHwNvfp4) return static_cast<uint32_t>((scales[index >> 2] >> ((index & 3) * 16)) & 0xFFFF);
  return 0;
}

// A row's FP32 scale (INT8, NVFP4), in a buffer of `rows` rows.
inline uint32_t RowScaleBits(const Word* scales, HwFormat f, int rows, int blocks, int row) {
#pragma HLS INLINE
  if (!HasRowScale(f)) return 0;
  const Word* base = f == kHwNvfp4 ? scales + NvRowScaleWord(rows, blocks) : scales;
  return static_cast<uint32_t>(base[row >> 1] >> ((row & 1) * 32));
}

// The W tile: kPeCols rows of W (n0 … n0 + kPeCols - 1) read once from HBM into
// on-chip memory; rows past N are zeros and their outputs are never stored.
void LoadWTile(const Word* w, const Word* w_scales, const float* bias, const Shape& s, int n0,
               Word w_tile[kPeCols][kMaxBlocks * kMaxWordsPerBlock],
               uint32_t w_scale[kPeCols][kMaxBlocks], uint32_t w_row_scale[kPeCols],
               float bias_tile[kPeCols]) {
  const int wpb = WordsPerBlock(s.fw);
  const int64_t row_words = static_cast<int64_t>(s.blocks) * wpb;
  for (int c = 0; c < kPeCols; ++c) {
    const int row = n0 + c;
    bias_tile[c] = s.bias && row < s.n ? bias[row] : 0.0f;
    w_row_scale[c] = row < s.n ? RowScaleBits(w_scales, s.fw, s.n, s.blocks, row) : 0;
    for (int i = 0; i < row_words; ++i) {
#pragma HLS PIPELINE II = 1
      w_tile[c][i] = row < s.n ? w[row * row_words + i] : 0;
    }
    for (int b = 0; b < s.blocks; ++b) {
#pragma HLS PIPELINE II = 1
      w_scale[c][b] = row < s.n ? ScaleBits(w_scales, s.fw, row, s.blocks, b) : 0;
    }
  }
}

// Streams X block by block: for each group of kPeRows rows, block 0 of every row,
// then block 1, ... so the PE array consumes blocks in ascending order.
void StreamX(const Word* x, const Word* x_scales, const Shape& s, Stream<BlockWords>& out) {
  const int wpb = WordsPerBlock(s.fx);
  const int64_t row_words = static_cast<int64_t>(s.blocks) * wpb;
  for (int m0 = 0; m0 < s.m; m0 += kPeRows) {
    for (int b = 0; b < s.blocks; ++b) {
      for (int r = 0; r < kPeRows; ++r) {
#pragma HLS PIPELINE II = 1
        const int row = m0 + r;
        BlockWords block{};
        if (row < s.m) {
          for (int i = 0; i < wpb; ++i) block.words[i] = x[row * row_words + b * wpb + i];
          block.scale_bits = ScaleBits(x_scales, s.fx, row, s.blocks, b);
          block.row_scale_bits = RowScaleBits(x_scales, s.fx, s.m, s.blocks, row);
        }
        out.write(block);
      }
    }
  }
}

// The PE array. Per group of rows: accumulators start from the bias (or +0.0;
// INT8 and NVFP4 add the bias after their row scales); block by block, the
// edge decoders turn kPeRows X blocks and kPeCols W blocks into operands and
// every PE (r, c) adds its block result (FP32, ascending blocks; NVFP4 its two
// half-block results, in order). The float path adds element by element with
// FMA, the INT8 path keeps one integer dot and scales it at the end.
void PeArray(Stream<BlockWords>& in, const Shape& s,
             const Word w_tile[kPeCols][kMaxBlocks * kMaxWordsPerBlock],
             const uint32_t w_scale[kPeCols][kMaxBlocks], const uint32_t w_row_scale[kPeCols],
             const float bias_tile[kPeCols], Stream<float>& out) {
  const int wpb = WordsPerBlock(s.fw);
  DecodedBlock xd[kPeRows], wd[kPeCols];
  float acc[kPeRows][kPeCols];
  Int<32> idot[kPeRows][kPeCols];
  uint32_t x_row_scale[kPeRows];
#pragma HLS ARRAY_PARTITION variable = acc complete dim = 0
#pragma HLS ARRAY_PARTITION variable = idot complete dim = 0
  for (int m0 = 0; m0 < s.m; m0 += kPeRows) {
    for (int r = 0; r < kPeRows; ++r) {
      for (int c = 0; c < kPeCols; ++c) {
#pragma HLS UNROLL
        acc[r][c] = s.path == kPathInt8 || s.path == kPathNv ? 0.0f : bias_tile[c];
        idot[r][c] = 0;
      }
    }
    for (int b = 0; b < s.blocks; ++b) {
      const int valid = s.k - b * kBlock < kBlock ? s.k - b * kBlock : kBlock;
      for (int r = 0; r < kPeRows; ++r) {
        const BlockWords block = in.read();
        DecodeBlock(s.fx, s.path, block, xd[r]);
        x_row_scale[r] = block.row_scale_bits;
      }
      for (int c = 0; c < kPeCols; ++c) {
        BlockWords block;
        for (int i = 0; i < wpb; ++i) block.words[i] = w_tile[c][b * wpb + i];
        block.scale_bits = w_scale[c][b];
        block.row_scale_bits = w_row_scale[c];
        DecodeBlock(s.fw, s.path, block, wd[c]);
      }
      for (int r = 0; r < kPeRows; ++r) {
#pragma HLS UNROLL
        for (int c = 0; c < kPeCols; ++c) {
#pragma HLS UNROLL
          switch (s.path) {
            case kPathMxInteger:
            case kPathMxWide:
              acc[r][c] += MxBlockResult(s.path, s.fx, s.fw, xd[r], wd[c]);
              break;
            case kPathNv:
              acc[r][c] += NvHalfResult(xd[r], wd[c], 0);
              // A second half past ceil(K/16) half blocks is not there.
              if (valid > kNvHalf) acc[r][c] += NvHalfResult(xd[r], wd[c], 1);
              break;
            case kPathInt8:
              for (int t = 0; t < kBlock; ++t) idot[r][c] += xd[r].int8[t] * wd[c].int8[t];
              break;
            case kPathFloat:
              // Only the real elements: an FMA with the zero padding could turn a
              // -0.0 sum into +0.0.
              for (int t = 0; t < valid; ++t) acc[r][c] = std::fma(xd[r].wide[t], wd[c].wide[t], acc[r][c]);
              break;
          }
        }
      }
    }
    for (int r = 0; r < kPeRows; ++r) {
      for (int c = 0; c < kPeCols; ++c) {
#pragma HLS PIPELINE II = 1
        float v = acc[r][c];
        if (s.path == kPathInt8) {
          // float(dot) · scale_x · scale_w, then + bias: two roundings, as the contract says.
          v = static_cast<float>(idot[r][c]) * FloatFromBits(x_row_scale[r]) *
              FloatFromBits(w_row_scale[c]);
          if (s.bias) v += bias_tile[c];
        } else if (s.path == kPathNv) {
          // sum · fp32(ts_x · ts_w), then + bias.
          v = v * (FloatFromBits(x_row_scale[r]) * FloatFromBits(w_row_scale[c]));
          if (s.bias) v += bias_tile[c];
        }
        out.write(v);
      }
    }
  }
}

void WriteY(Stream<float>& in, const Shape& s, int n0, float* y) {
  for (int m0 = 0; m0 < s.m; m0 += kPeRows) {
    for (int r = 0; r < kPeRows; ++r) {
      for (int c = 0; c < kPeCols; ++c) {
#pragma HLS PIPELINE II = 1
        const float v = in.read();
        if (m0 + r < s.m && n0 + c < s.n) y[static_cast<int64_t>(m0 + r) * s.n + n0 + c] = v;
      }
    }
  }
}

void ComputeNTile(const Word* x, const Word* x_scales, const Shape& s, int n0,
                  const Word w_tile[kPeCols][kMaxBlocks * kMaxWordsPerBlock],
                  const uint32_t w_scale[kPeCols][kMaxBlocks], const uint32_t w_row_scale[kPeCols],
                  const float bias_tile[kPeCols], float* y) {
#pragma HLS DATAFLOW
  Stream<BlockWords> x_blocks;
  Stream<float> results;
#pragma HLS STREAM variable = x_blocks depth = 64
#pragma HLS STREAM variable = results depth = 64
  StreamX(x, x_scales, s, x_blocks);
  PeArray(x_blocks, s, w_tile, w_scale, w_row_scale, bias_tile, results);
  WriteY(results, s, n0, y);
}

}  // namespace
}  // namespace mxhls

extern "C" void mx_gemm(const mxhls::Word* x, const mxhls::Word* x_scales, const mxhls::Word* w,
                        const mxhls::Word* w_scales, const float* bias, float* y, int m, int n,
                        int k, uint32_t control) {
#pragma HLS INTERFACE m_axi port = x offset = slave bundle = gmem0 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = x_scales offset = slave bundle = gmem0
#pragma HLS INTERFACE m_axi port = w offset = slave bundle = gmem1 max_read_burst_length = 64
#pragma HLS INTERFACE m_axi port = w_scales offset = slave bundle = gmem1
#pragma HLS INTERFACE m_axi port = bias offset = slave bundle = gmem2
#pragma HLS INTERFACE m_axi port = y offset = slave bundle = gmem2 max_write_burst_length = 64
#pragma HLS INTERFACE s_axilite port = m
#pragma HLS INTERFACE s_axilite port = n
#pragma HLS INTERFACE s_axilite port = k
#pragma HLS INTERFACE s_axilite port = control
#pragma HLS INTERFACE s_axilite port = return
  using namespace mxhls;
  // On-chip: the W tile in URAM, one bank per PE column so every column reads its
  // block in the same cycle. `static` keeps 8 MiB off the stack in C simulation
  // (and makes one call at a time the rule there, as on the card).
  static Word w_tile[kPeCols][kMaxBlocks * kMaxWordsPerBlock];
  static uint32_t w_scale[kPeCols][kMaxBlocks];
  static uint32_t w_row_scale[kPeCols];
  static float bias_tile[kPeCols];
#pragma HLS BIND_STORAGE variable = w_tile type = ram_2p impl = uram
#pragma HLS ARRAY_PARTITION variable = w_tile complete dim = 1
#pragma HLS ARRAY_PARTITION variable = w_scale complete dim = 1
#pragma HLS ARRAY_PARTITION variable = w_row_scale complete
#pragma HLS ARRAY_PARTITION variable = bias_tile complete

  const Shape s{m, n, k, (k + kBlock - 1) / kBlock, ControlX(control), ControlW(control),
                ControlPath(control), ControlHasBias(control)};
  for (int n0 = 0; n0 < n; n0 += kPeCols) {
    LoadWTile(w, w_scales, bias, s, n0, w_tile, w_scale, w_row_scale, bias_tile);
    ComputeNTile(x, x_scales, s, n0, w_tile, w_scale, w_row_scale, bias_tile, y);
  }
}

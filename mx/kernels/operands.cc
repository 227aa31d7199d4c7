// Converting operands into the kernels' layouts: W once per weight (PackedWeight),
// X once per call (DecodeX in linear.cc calls DecodeActivations here).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "mx/element.h"
#include "mx/kernels/gemm_internal.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/operands.h"

namespace mx::kernels::internal {
namespace {

bool IsI8Element(Format f) {
  return f == Format::kMxfp4E2m1 || f == Format::kMxfp6E2m3 || f == Format::kMxint8;
}
bool IsI16Element(Format f) { return IsI8Element(f) || f == Format::kMxfp6E3m2; }

// kBf16's guard (gemm_internal.h): the exponent a BF16 value adds to its row's
// extremes (kNoExponent: ±0 and NaN add none; NaN stays NaN either way).
int Bf16Exponent(uint16_t bits) {
  const int biased = bits >> 7 & 0xff;
  if ((bits & 0x7fff) == 0 || (biased == 0xff && (bits & 0x7f) != 0)) return kNoExponent;
  return biased == 0xff ? 128 : biased == 0 ? -127 : biased - 127;
}
// Element `i` of a 16-bit format (FP16, BF16) as its bits: little-endian bytes.
uint16_t HalfBits(const QuantizedMatrix& m, int64_t i) {
  return static_cast<uint16_t>(m.elements[2 * i] | (m.elements[2 * i + 1] << 8));
}
void AddBf16Exponent(int exp, int16_t& least, int16_t& greatest) {
  least = static_cast<int16_t>(std::min<int>(least, exp));
  greatest = static_cast<int16_t>(std::max<int>(greatest, exp));
}

// MXFP4 W in kMxI8 (gemm_internal.h): the byte holding element (n, k), and
// which nibble of it. A group pair's 64 bytes hold its 16 lanes × 4 k in order.
int64_t NibbleByte(int64_t n, int64_t k, int64_t k_padded) {
  return (n / kPanel * (k_padded / 8) + k / 8) * 64 + n % kPanel * 4 + k % 4;
}
int NibbleShift(int64_t k) { return (k / 4) % 2 * 4; }

}  // namespace

void I8WeightBlock(const WeightPanels& w, int64_t panel, int64_t block,
                   uint8_t (&out)[kBlockSize][kPanel]) {
  const int64_t kp = w.k_padded;
  for (int g = 0; g < 8; ++g) {
    const int64_t k0 = (block * 8 + g) * 4;  // the group's first k
    // Both layouts keep a group's 16 lanes × 4 k in order (nibbles: in one
    // nibble of the group pair's 64 bytes).
    const uint8_t* bytes = w.u8.data() + (w.nibbles ? NibbleByte(panel * kPanel, k0, kp)
                                                    : (panel * (kp / 4) + k0 / 4) * 64);
    const int shift = NibbleShift(k0);
    for (int lane = 0; lane < kPanel; ++lane) {
      for (int i = 0; i < 4; ++i) {
        const uint8_t byte = bytes[lane * 4 + i];
        out[g * 4 + i][lane] = w.nibbles ? w.nibble_lut[(byte >> shift) & 0x0F] : byte;
      }
    }
  }
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kMxI8: return "mx_i8";
    case Kind::kMxI16: return "mx_i16";
    case Kind::kMxF64: return "mx_f64";
    case Kind::kInt8: return "int8";
    case Kind::kNvI8: return "nv_i8";
    case Kind::kF32: return "f32";
    case Kind::kBf16: return "bf16";
  }
  return "?";
}

Kind KindFor(Format x, Format w) {
  if (IsMx(x) && IsMx(w)) {
    if (IsI8Element(x) && IsI8Element(w) && !(x == Format::kMxint8 && w == Format::kMxint8)) {
      return Kind::kMxI8;
    }
    if (IsI16Element(x) && IsI16Element(w)) return Kind::kMxI16;
    return Kind::kMxF64;
  }
  if (x == Format::kInt8 && w == Format::kInt8) return Kind::kInt8;
  if (x == Format::kNvfp4 && w == Format::kNvfp4) return Kind::kNvI8;
  if (x == Format::kBf16 && w == Format::kBf16) return Kind::kBf16;
  return Kind::kF32;
}

int I8Offset(Format w) {
  switch (w) {
    case Format::kMxfp4E2m1: return 12;
    case Format::kMxfp6E2m3: return 60;
    default: return 127;
  }
}

bool FastScalesOk(const DecodedX& x, const WeightPanels& w) {
  // No scales; kBf16's pair kernels check each output themselves (Bf16PairsExact).
  if (x.kind == Kind::kF32 || x.kind == Kind::kBf16) return true;
  // Dots of the int8/int16 kinds stay below 2^23; kMxF64's int16 path's below 2^31.
  return FastScalesOk(x.range, w.range, x.kind == Kind::kMxF64 ? kShiftedDotBits : 23);
}

bool FastScalesOk(const ScaleRange& x, const ScaleRange& w, int dot_bits) {
  // t = float(dot)·2^ex with 1 <= |dot| < 2^dot_bits must be normal: ex in
  // [-126, 127 - dot_bits]; 2^ew must be a normal float; dot·2^(ex+ew) normal again.
  const int top = 127 - dot_bits;
  if (!x.empty() && (x.min < -126 || x.max > top)) return false;
  if (!w.empty() && (w.min < -126 || w.max > 127)) return false;
  if (x.empty() || w.empty()) return true;
  return x.min + w.min >= -126 && x.max + w.max <= top;
}

const CodeTable& Codes(Format format) {
  static const auto* tables = [] {
    auto* t = new std::array<CodeTable, 6>();
    for (const FormatTraits& traits : AllFormats()) {
      if (!traits.is_mx()) continue;
      CodeTable& table = (*t)[static_cast<int>(traits.format)];
      table.fraction_bits = FixedPointFractionBits(traits.format);
      for (uint32_t code = 0; code < CodeCount(traits.format); ++code) {
        table.special[code] = IsSpecialCode(traits.format, code);
        table.fixed[code] = table.special[code] ? 0 : ElementToFixed(traits.format, code);
        table.value[code] = table.special[code] ? 0.0f : DecodeElement(traits.format, code);
      }
    }
    return t;
  }();
  return (*tables)[static_cast<int>(format)];
}

void UnpackCodes(Format format, const uint8_t* row, int64_t blocks, uint8_t* codes) {
  const int64_t count = blocks * kBlockSize;
  switch (Traits(format).element_bits) {
    case 8:
      std::memcpy(codes, row, count);
      return;
    case 4:
      for (int64_t i = 0; i < count / 2; ++i) {
        codes[2 * i] = row[i] & 0x0F;
        codes[2 * i + 1] = row[i] >> 4;
      }
      return;
    case 6:
      for (int64_t i = 0; i < count / 4; ++i) {
        const uint32_t v = row[3 * i] | (uint32_t{row[3 * i + 1]} << 8) |
                           (uint32_t{row[3 * i + 2]} << 16);
        codes[4 * i] = v & 63;
        codes[4 * i + 1] = (v >> 6) & 63;
        codes[4 * i + 2] = (v >> 12) & 63;
        codes[4 * i + 3] = (v >> 18) & 63;
      }
      return;
  }
}

BlockInfo InspectBlock(const CodeTable& table, const uint8_t* codes) {
  BlockInfo info;
  uint64_t any = 0, largest = 0, sum = 0;  // 32 magnitudes below 2^32: no overflow
  for (int i = 0; i < kBlockSize; ++i) {
    info.special |= table.special[codes[i]];
    const uint64_t magnitude = static_cast<uint64_t>(std::abs(table.fixed[codes[i]]));
    any |= magnitude;
    sum += magnitude;
    largest = std::max(largest, magnitude);
  }
  info.all_zero = any == 0;
  info.low_bit = info.all_zero ? 0 : std::countr_zero(any);
  info.span_bits = info.all_zero ? 0 : std::bit_width(largest) - info.low_bit;
  info.max = largest >> info.low_bit;
  info.l1 = sum >> info.low_bit;
  info.l1_bits = static_cast<int>(std::bit_width(info.l1));
  return info;
}

double ShiftedSquares(const CodeTable& table, const uint8_t* codes, int low_bit) {
  // Shifted magnitudes below 2^32: 32 squares below 2^69, exact in 128 bits.
  unsigned __int128 squares = 0;
  for (int i = 0; i < kBlockSize; ++i) {
    const uint64_t v = static_cast<uint64_t>(std::abs(table.fixed[codes[i]])) >> low_bit;
    squares += static_cast<unsigned __int128>(v) * v;
  }
  if (squares < (uint64_t{1} << 53)) {  // every int16 block: exact, and cheap
    return static_cast<double>(static_cast<uint64_t>(squares));
  }
  const double rounded = static_cast<double>(squares);
  return static_cast<unsigned __int128>(rounded) < squares
             ? std::nextafter(rounded, std::numeric_limits<double>::infinity())
             : rounded;
}

BlockScales ScalesOf(uint8_t scale_byte, int fraction_bits, bool all_zero) {
  BlockScales s;
  if (scale_byte == kScaleNan) {
    s.fast = s.wide = std::numeric_limits<double>::quiet_NaN();
    return s;
  }
  s.exponent = scale_byte - kScaleBias - fraction_bits;
  s.wide = std::ldexp(1.0, s.exponent);
  s.counts = !all_zero;
  // The fast scale only matters when the range check passes; out of float range
  // it is never used.
  s.fast = all_zero ? 0.0 : (s.exponent >= -126 && s.exponent <= 127 ? s.wide : 0.0);
  return s;
}

BlockScales ShiftedScalesOf(uint8_t scale_byte, const CodeTable& table, const BlockInfo& info) {
  BlockScales s = ScalesOf(scale_byte, table.fraction_bits - info.low_bit, info.all_zero);
  s.counts = s.counts && info.span_bits <= kShiftedSplitBits;
  return s;
}

int LimbShift(const BlockInfo& info) {
  return info.span_bits <= kShiftedSplitBits ? std::max(0, info.span_bits - kShiftedI16Bits) : -1;
}

Limbs SplitLimbs(int64_t fixed, int low_bit, int shift) {
  const int64_t v = fixed >> low_bit;  // exact: fixed is a multiple of 2^low_bit
  const int64_t high = v >> shift;     // floor, so the low limb is >= 0
  return {static_cast<int16_t>(high), static_cast<int16_t>(v - (high << shift))};
}

namespace {

// kNvI8: a UE4M3 block scale as the epilogue multiplies it, S · 2^-1 (the
// element's fixed-point unit), NaN for the NaN byte.
float NvScale(uint8_t byte) { return NvScaleValue(byte) * 0.5f; }

// NVFP4's E2M1 code (low nibble of a packed byte pair) as its fixed-point
// integer: MXFP4's table, the same elements.
int32_t NvFixed(const uint8_t* row, int64_t k) {
  const uint8_t code = (row[k / 2] >> (k % 2 * 4)) & 0x0F;
  return static_cast<int32_t>(Codes(Format::kMxfp4E2m1).fixed[code]);
}

constexpr int kNvOffset = 12;  // the largest |E2M1| in units of 2^-1

std::shared_ptr<WeightPanels> PackNvPanels(const QuantizedMatrix& w) {
  auto out = std::make_shared<WeightPanels>();
  WeightPanels& p = *out;
  p.kind = Kind::kNvI8;
  p.format = w.format;
  p.n = w.rows;
  p.k = w.cols;
  p.blocks = BlocksPerRow(Format::kNvfp4, w.cols);
  p.k_padded = p.blocks * kNvBlockSize;
  p.panels = (w.rows + kPanel - 1) / kPanel;
  p.i8_offset = kNvOffset;
  const int64_t lanes = p.panels * kPanel, kp = p.k_padded;
  p.u8.assign(lanes * kp, static_cast<uint8_t>(kNvOffset));  // element 0 in the padding
  p.scale.assign(lanes * p.blocks, 0.0f);
  p.tensor_scale.assign(lanes, 1.0f);
  p.scale_bytes = w.block_scales;
  const int64_t row_bytes = RowBytes(w.format, w.cols);
  for (int64_t n = 0; n < w.rows; ++n) {
    const uint8_t* row = w.elements.data() + n * row_bytes;
    const int64_t panel = n / kPanel, lane = n % kPanel;
    p.tensor_scale[n] = w.row_scales[n];
    for (int64_t b = 0; b < p.blocks; ++b) {
      p.scale[(panel * p.blocks + b) * kPanel + lane] = NvScale(w.block_scales[n * p.blocks + b]);
    }
    // All of K padded: the packed padding nibbles count as the reference counts them.
    for (int64_t k = 0; k < kp; ++k) {
      p.u8[((panel * (kp / 4) + k / 4) * kPanel + lane) * 4 + k % 4] =
          static_cast<uint8_t>(NvFixed(row, k) + kNvOffset);
    }
  }
  return out;
}

QuantizedMatrix UnpackNvPanels(const WeightPanels& p) {
  QuantizedMatrix m = AllocateQuantized(p.format, p.n, p.k);
  m.block_scales = p.scale_bytes;
  std::copy_n(p.tensor_scale.begin(), p.n, m.row_scales.begin());
  // Fixed value + 12 back to the E2M1 code; +0 (code 0) for zero.
  std::array<uint8_t, 2 * kNvOffset + 1> code_of{};
  const CodeTable& table = Codes(Format::kMxfp4E2m1);
  for (int code = 15; code >= 0; --code) code_of[table.fixed[code] + kNvOffset] = code;
  const int64_t kp = p.k_padded, row_bytes = RowBytes(p.format, p.k);
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t k = 0; k < kp; ++k) {
      const uint8_t code =
          code_of[p.u8[((n / kPanel * (kp / 4) + k / 4) * kPanel + n % kPanel) * 4 + k % 4]];
      m.elements[n * row_bytes + k / 2] |= static_cast<uint8_t>(code << (k % 2 * 4));
    }
  }
  return m;
}

// Zeroes row r's padding past `cols` in a rows × kp array (DecodedX's arrays
// are RowArray: left uninitialized, written in full by the row tasks).
template <typename T>
void ZeroPadding(T* rows, int64_t r, int64_t cols, int64_t kp) {
  std::fill(rows + r * kp + cols, rows + (r + 1) * kp, T{0});
}

// X's rows in tasks of about 16K elements, across `pool` when one is given and
// there is more than one task: fn(first_row, end_row, task).
struct RowTasks {
  int64_t rows, per_task, count;
  RowTasks(int64_t rows_, int64_t row_elements)
      : rows(rows_),
        per_task(std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(row_elements, 1))),
        count((rows_ + per_task - 1) / per_task) {}
  template <typename F>
  void Run(ThreadPool* pool, const F& fn) const {
    const auto task = [&](int64_t t) { fn(t * per_task, std::min(rows, (t + 1) * per_task), t); };
    if (pool != nullptr && count > 1) {
      pool->ParallelFor(count, task);
    } else {
      for (int64_t t = 0; t < count; ++t) task(t);
    }
  }
};

DecodedX DecodeNvActivations(const QuantizedMatrix& x, ThreadPool* pool) {
  DecodedX d;
  d.kind = Kind::kNvI8;
  d.rows = x.rows;
  d.blocks = BlocksPerRow(Format::kNvfp4, x.cols);
  d.k_padded = d.blocks * kNvBlockSize;
  const int64_t kp = d.k_padded, blocks = d.blocks, row_bytes = RowBytes(x.format, x.cols);
  d.i8.resize(x.rows * kp);  // every k of every block written below
  d.block_offset.assign(x.rows * blocks, 0);
  d.scale.assign(x.rows * blocks, 0.0f);
  d.tensor_scale = x.row_scales;
  const auto decode_rows = [&](int64_t first, int64_t end) {
    int8_t* const i8 = d.i8.data();
    for (int64_t r = first; r < end; ++r) {
      const uint8_t* row = x.elements.data() + r * row_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;
        for (int64_t k = b * kNvBlockSize; k < (b + 1) * kNvBlockSize; ++k) {
          const int32_t v = NvFixed(row, k);
          i8[r * kp + k] = static_cast<int8_t>(v);
          sum += v;
        }
        d.block_offset[r * blocks + b] = -kNvOffset * sum;
        d.scale[r * blocks + b] = NvScale(x.block_scales[r * blocks + b]);
      }
    }
  };
  RowTasks(x.rows, kp).Run(pool, [&](int64_t first, int64_t end, int64_t) {
    decode_rows(first, end);
  });
  return d;
}

}  // namespace

std::shared_ptr<WeightPanels> PackPanels(const QuantizedMatrix& w, Kind kind) {
  if (kind == Kind::kNvI8) return PackNvPanels(w);
  auto out = std::make_shared<WeightPanels>();
  WeightPanels& p = *out;
  p.kind = kind;
  p.format = w.format;
  p.n = w.rows;
  p.k = w.cols;
  p.blocks = BlocksPerRow(w.cols);
  p.k_padded = p.blocks * kBlockSize;
  p.panels = (w.rows + kPanel - 1) / kPanel;
  const int64_t lanes = p.panels * kPanel;
  const int64_t kp = p.k_padded;
  // Index of element (n, k) in each layout.
  const auto pair_index = [&](int64_t n, int64_t k, int group) {
    const int64_t panel = n / kPanel, lane = n % kPanel;
    return ((panel * (kp / group) + k / group) * kPanel + lane) * group + k % group;
  };
  switch (kind) {
    case Kind::kMxI8:
      p.i8_offset = I8Offset(w.format);
      p.nibbles = w.format == Format::kMxfp4E2m1;
      if (p.nibbles) {
        for (int code = 0; code < 16; ++code) {
          p.nibble_lut[code] = static_cast<uint8_t>(Codes(w.format).fixed[code] + p.i8_offset);
        }
        p.u8.assign(lanes * kp / 2, 0);  // code 0 (+0) in the padding lanes
      } else {
        p.u8.assign(lanes * kp, static_cast<uint8_t>(p.i8_offset));
      }
      break;
    case Kind::kMxI16:
    case Kind::kInt8:
      p.i16.assign(lanes * kp, 0);
      // INT8 and MXINT8 W also as u8 w + 128 in kMxI8's layout, for vpdpbusd
      // (avx512): twice the products per instruction of the int16 pairs.
      if (HasU8Copy(kind, w.format)) {
        p.i8_offset = kU8Offset;
        p.u8.assign(lanes * kp, static_cast<uint8_t>(kU8Offset));
      }
      break;
    case Kind::kMxF64:
      p.f16.assign(lanes * kp, 0);
      p.i16.assign(lanes * kp, 0);
      p.span_bits.assign(w.rows * p.blocks, 0);
      p.fit_max.assign(p.panels * p.blocks, 0.0);  // zero lanes fit
      p.fit_l1.assign(p.panels * p.blocks, 0.0);
      p.fit_sq.assign(p.panels * p.blocks, 0.0);
      p.panel_l1.assign(p.panels * p.blocks, 0);
      p.split_at.assign(p.panels * p.blocks, -1);
      p.split_pairs.assign(p.panels * p.blocks, 0);
      p.split_shift.assign(lanes * p.blocks, 0);
      break;
    case Kind::kNvI8:
      break;  // PackNvPanels
    case Kind::kF32:
    case Kind::kBf16:
      p.float_store =
          (w.format == Format::kFp16 || w.format == Format::kBf16) ? w.format : Format::kFp32;
      if (p.float_store == Format::kFp32) {
        p.f32.assign(lanes * kp, 0.0f);
      } else {
        p.f16.assign(lanes * kp, 0);
      }
      break;
  }

  if (kind == Kind::kF32 || kind == Kind::kBf16) {
    if (p.float_store != Format::kFp32) {  // FP16/BF16 bits as they are: half the bytes
      const int group = p.float_store == Format::kBf16 ? 2 : 1;
      if (group == 2) {
        p.min_exp.assign(lanes, kNoExponent);
        p.max_exp.assign(lanes, -kNoExponent);
        p.panel_min_exp.assign(p.panels, kNoExponent);
        p.panel_max_exp.assign(p.panels, -kNoExponent);
      }
      for (int64_t n = 0; n < w.rows; ++n) {
        for (int64_t k = 0; k < w.cols; ++k) {
          const uint16_t bits = HalfBits(w, n * w.cols + k);
          p.f16[pair_index(n, k, group)] = bits;
          if (const int exp = Bf16Exponent(bits); group == 2 && exp != kNoExponent) {
            AddBf16Exponent(exp, p.min_exp[n], p.max_exp[n]);
          }
        }
      }
      for (int64_t lane = 0; group == 2 && lane < lanes; ++lane) {  // each panel's extremes
        if (p.min_exp[lane] == kNoExponent) continue;  // nothing in it
        int16_t& least = p.panel_min_exp[lane / kPanel];
        int16_t& greatest = p.panel_max_exp[lane / kPanel];
        AddBf16Exponent(p.min_exp[lane], least, greatest);
        AddBf16Exponent(p.max_exp[lane], least, greatest);
      }
      return out;
    }
    const std::vector<float> values = DequantizeFast(w);
    for (int64_t n = 0; n < w.rows; ++n) {
      for (int64_t k = 0; k < w.cols; ++k) p.f32[pair_index(n, k, 1)] = values[n * w.cols + k];
    }
    return out;
  }
  if (kind == Kind::kInt8) {
    p.scale.assign(lanes, 0.0f);
    for (int64_t n = 0; n < w.rows; ++n) {
      p.scale[n] = w.row_scales[n];
      for (int64_t k = 0; k < w.cols; ++k) {
        const int8_t v = static_cast<int8_t>(w.elements[n * w.cols + k]);
        p.i16[pair_index(n, k, 2)] = v;
        p.u8[pair_index(n, k, 4)] = static_cast<uint8_t>(v + kU8Offset);
      }
    }
    return out;
  }

  // MX kinds.
  const CodeTable& table = Codes(w.format);
  // kMxF64 multiplies element values, the integer kinds fixed-point integers.
  const int fraction_bits = kind == Kind::kMxF64 ? 0 : table.fraction_bits;
  p.scale.assign(lanes * p.blocks, 0.0f);
  p.scale_d.assign(lanes * p.blocks, 0.0);
  p.scale_bytes = w.block_scales;
  std::vector<uint8_t> codes(kp);
  // kMxF64, this row's blocks: the lowest set bit, and the limb shift (LimbShift).
  std::vector<int> block_low_bit(p.blocks, 0), block_split(p.blocks, -1);
  const int64_t row_bytes = RowBytes(w.format, w.cols);
  for (int64_t n = 0; n < w.rows; ++n) {
    UnpackCodes(w.format, w.elements.data() + n * row_bytes, p.blocks, codes.data());
    for (int64_t b = 0; b < p.blocks; ++b) {
      const BlockInfo info = InspectBlock(table, codes.data() + b * kBlockSize);
      p.has_special |= info.special;
      p.max_span_bits = std::max(p.max_span_bits, info.span_bits);
      const uint8_t scale_byte = w.block_scales[n * p.blocks + b];
      const BlockScales s = ScalesOf(scale_byte, fraction_bits, info.all_zero);
      // The fast epilogue's scale: kMxF64's is its int16 path's.
      const BlockScales fast =
          kind == Kind::kMxF64 ? ShiftedScalesOf(scale_byte, table, info) : s;
      const int64_t at = ((n / kPanel) * p.blocks + b) * kPanel + n % kPanel;
      p.scale_d[at] = s.wide;
      p.scale[at] = static_cast<float>(fast.fast);
      if (fast.counts) p.range.Add(fast.exponent);
      if (kind == Kind::kMxF64) {
        p.span_bits[n * p.blocks + b] = static_cast<uint8_t>(info.span_bits);
        const int64_t panel_block = (n / kPanel) * p.blocks + b;
        p.panel_l1[panel_block] =
            std::max(p.panel_l1[panel_block], static_cast<uint8_t>(info.l1_bits));
        const bool has_limbs = info.span_bits <= kShiftedSplitBits;
        const double inf = std::numeric_limits<double>::infinity();
        p.fit_max[panel_block] = std::max(p.fit_max[panel_block],
                                          has_limbs ? static_cast<double>(info.max) : inf);
        p.fit_l1[panel_block] = std::max(p.fit_l1[panel_block],
                                         has_limbs ? static_cast<double>(info.l1) : inf);
        p.fit_sq[panel_block] =
            std::max(p.fit_sq[panel_block],
                     has_limbs ? ShiftedSquares(table, codes.data() + b * kBlockSize, info.low_bit)
                               : inf);
        block_low_bit[b] = info.low_bit;
        block_split[b] = LimbShift(info);
        if (block_split[b] > 0) {
          p.split_shift[at] = static_cast<uint8_t>(block_split[b]);
          int32_t& lo = p.split_at[panel_block];
          if (lo < 0) {
            lo = static_cast<int32_t>(p.i16_lo.size());
            p.i16_lo.resize(p.i16_lo.size() + kBlockSize * kPanel, 0);
          }
        }
      }
    }
    // All of K padded: a client may pack non-zero codes into a short block's
    // padding, and the reference multiplies them too.
    for (int64_t k = 0; k < kp; ++k) {
      const uint8_t code = codes[k];
      switch (kind) {
        case Kind::kMxI8:
          if (p.nibbles) {
            p.u8[NibbleByte(n, k, kp)] |= static_cast<uint8_t>(code << NibbleShift(k));
          } else {
            p.u8[pair_index(n, k, 4)] = static_cast<uint8_t>(table.fixed[code] + p.i8_offset);
          }
          break;
        case Kind::kMxI16:
          p.i16[pair_index(n, k, 2)] = static_cast<int16_t>(table.fixed[code]);
          if (!p.u8.empty()) {
            p.u8[pair_index(n, k, 4)] = static_cast<uint8_t>(table.fixed[code] + kU8Offset);
          }
          break;
        default:  // kMxF64
          p.f16[pair_index(n, k, 1)] = FloatToFp16(table.value[code]);
          if (const int split = block_split[k / kBlockSize]; split >= 0) {
            const Limbs limbs = SplitLimbs(table.fixed[code], block_low_bit[k / kBlockSize], split);
            p.i16[pair_index(n, k, 2)] = limbs.high;
            if (split > 0) {  // the low limb in i16_lo, the block's 16 pairs of 16 lanes
              const int64_t pb = (n / kPanel) * p.blocks + k / kBlockSize;
              const int64_t in_block = ((k % kBlockSize) / 2 * kPanel + n % kPanel) * 2 + k % 2;
              p.i16_lo[p.split_at[pb] + in_block] = limbs.low;
              if (limbs.low != 0) p.split_pairs[pb] |= static_cast<uint16_t>(1u << (k % kBlockSize / 2));
            }
          }
          break;
      }
    }
  }
  return out;
}

QuantizedMatrix UnpackPanels(const WeightPanels& p) {
  if (p.kind == Kind::kNvI8) return UnpackNvPanels(p);
  QuantizedMatrix m;
  m.format = p.format;
  m.rows = p.n;
  m.cols = p.k;
  const int64_t kp = p.k_padded;
  const auto at = [&](int64_t n, int64_t k, int group) {
    return ((n / kPanel * (kp / group) + k / group) * kPanel + n % kPanel) * group + k % group;
  };
  if (p.kind == Kind::kInt8) {
    m.elements.resize(p.n * p.k);
    m.row_scales.assign(p.scale.begin(), p.scale.begin() + p.n);
    for (int64_t n = 0; n < p.n; ++n) {
      for (int64_t k = 0; k < p.k; ++k) {
        m.elements[n * p.k + k] = static_cast<uint8_t>(p.i16[at(n, k, 2)]);
      }
    }
    return m;
  }
  if (p.kind == Kind::kF32 || p.kind == Kind::kBf16) {
    // Only W of a float format is packed for its own kind (PackedWeight::Pack).
    const int bytes = p.float_store == Format::kFp32 ? 4 : 2;
    const int group = p.float_store == Format::kBf16 ? 2 : 1;
    m.elements.resize(p.n * p.k * bytes);
    for (int64_t n = 0; n < p.n; ++n) {
      for (int64_t k = 0; k < p.k; ++k) {
        uint8_t* e = m.elements.data() + bytes * (n * p.k + k);
        if (bytes == 4) {
          std::memcpy(e, &p.f32[at(n, k, 1)], 4);
        } else {
          std::memcpy(e, &p.f16[at(n, k, group)], 2);
        }
      }
    }
    return m;
  }
  // MX: element values back to codes through the format's code table.
  const CodeTable& table = Codes(p.format);
  std::vector<int32_t> code_of_fixed;  // fixed + 2^17 → code (+0 wins over −0)
  std::vector<int32_t> code_of_f16(1 << 16, -1);
  const int codes = static_cast<int>(CodeCount(p.format));
  code_of_fixed.assign(1 << 19, -1);
  for (int c = codes - 1; c >= 0; --c) {
    if (table.special[c]) continue;
    if (std::abs(table.fixed[c]) < (1 << 17)) code_of_fixed[table.fixed[c] + (1 << 17)] = c;
    // (Only the integer kinds look codes up by fixed value; their formats fit.)
    code_of_f16[FloatToFp16(table.value[c])] = c;
  }
  m.block_scales = p.scale_bytes;
  const int64_t row_bytes = RowBytes(p.format, p.k);
  m.elements.resize(p.n * row_bytes);
  std::array<uint8_t, kBlockSize> block;
  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t b = 0; b < p.blocks; ++b) {
      for (int i = 0; i < kBlockSize; ++i) {
        const int64_t k = b * kBlockSize + i;
        int32_t code;
        switch (p.kind) {
          case Kind::kMxI8:
            code = p.nibbles ? (p.u8[NibbleByte(n, k, kp)] >> NibbleShift(k)) & 0x0F
                             : code_of_fixed[p.u8[at(n, k, 4)] - p.i8_offset + (1 << 17)];
            break;
          case Kind::kMxI16:
            code = code_of_fixed[p.i16[at(n, k, 2)] + (1 << 17)];
            break;
          default:
            code = code_of_f16[p.f16[at(n, k, 1)]];
            break;
        }
        block[i] = static_cast<uint8_t>(code);
      }
      PackBlock(p.format, block, m.elements.data() + n * row_bytes + b * BlockBytes(p.format));
    }
  }
  return m;
}

std::vector<float> DequantizeFast(const QuantizedMatrix& m) {
  if (Traits(m.format).kind != FormatKind::kFloat) {
    return Dequantize(m);  // MX, NVFP4 and INT8 operands in the float kind: mixed pairs
  }
  std::vector<float> out(m.rows * m.cols);
  WidenToFloat(m.format, m.elements.data(), out.size(), out.data());
  return out;
}

DecodedX DecodeActivations(const QuantizedMatrix& x, Kind kind, Format w_format,
                           ThreadPool* pool) {
  if (kind == Kind::kNvI8) return DecodeNvActivations(x, pool);
  DecodedX d;
  d.kind = kind;
  d.rows = x.rows;
  d.blocks = BlocksPerRow(x.cols);
  d.k_padded = d.blocks * kBlockSize;
  const int64_t kp = d.k_padded;
  if (kind == Kind::kBf16) {  // one pass: the values, the bits for the pairs, the guard's
    d.f32.resize(x.rows * kp);  // written below, padding too (RowArray)
    d.bf16.resize(x.rows * kp);
    d.min_exp.assign(x.rows, kNoExponent);
    d.max_exp.assign(x.rows, -kNoExponent);
    // Rows across the pool, as the other kinds'. Plain pointers, as decode_rows
    // below says why: through the captured `d` the compiler reloads every
    // vector after each opaque call.
    float* const f32 = d.f32.data();
    uint16_t* const bf16 = d.bf16.data();
    int16_t* const min_exp = d.min_exp.data();
    int16_t* const max_exp = d.max_exp.data();
    RowTasks(x.rows, kp).Run(pool, [&, f32, bf16, min_exp, max_exp](int64_t first, int64_t end,
                                                                    int64_t) {
      for (int64_t r = first; r < end; ++r) {
        // The row's extremes in registers, stored once: neighbouring rows'
        // share a cache line, and tasks on other cores write theirs.
        int16_t lo = kNoExponent, hi = -kNoExponent;
        for (int64_t c = 0; c < x.cols; ++c) {
          const uint16_t bits = HalfBits(x, r * x.cols + c);
          f32[r * kp + c] = Bf16ToFloat(bits);
          bf16[r * kp + c] = bits;
          if (const int exp = Bf16Exponent(bits); exp != kNoExponent) AddBf16Exponent(exp, lo, hi);
        }
        ZeroPadding(f32, r, x.cols, kp);
        ZeroPadding(bf16, r, x.cols, kp);
        min_exp[r] = lo;
        max_exp[r] = hi;
      }
    });
    return d;
  }
  if (kind == Kind::kF32) {
    d.f32.resize(x.rows * kp);  // written below, padding too (RowArray)
    float* const f32 = d.f32.data();
    if (Traits(x.format).kind == FormatKind::kFloat) {  // FP32, BF16, FP16
      // Each row widened straight into its padded place, rows across the pool.
      const int64_t row_bytes = RowBytes(x.format, x.cols);
      RowTasks(x.rows, kp).Run(pool, [&, f32](int64_t first, int64_t end, int64_t) {
        for (int64_t r = first; r < end; ++r) {
          WidenToFloat(x.format, x.elements.data() + r * row_bytes, x.cols, f32 + r * kp);
          ZeroPadding(f32, r, x.cols, kp);
        }
      });
    } else {  // MX, NVFP4 and INT8 X in the float kind: mixed pairs
      const std::vector<float> values = Dequantize(x);
      for (int64_t r = 0; r < x.rows; ++r) {
        std::copy_n(values.data() + r * x.cols, x.cols, f32 + r * kp);
        ZeroPadding(f32, r, x.cols, kp);
      }
    }
    return d;
  }
  if (kind == Kind::kInt8) {
    d.i16.resize(x.rows * kp);  // written below, padding too (RowArray)
    d.i8.resize(x.rows * kp);
    d.block_offset.assign(x.rows, 0);  // one "block", all of K: −128 · Σ x
    d.scale = x.row_scales;
    int16_t* const i16 = d.i16.data();
    int8_t* const i8 = d.i8.data();
    int32_t* const block_offset = d.block_offset.data();
    RowTasks(x.rows, kp).Run(pool, [&, i16, i8, block_offset](int64_t first, int64_t end,
                                                              int64_t) {
      for (int64_t r = first; r < end; ++r) {
        int64_t sum = 0;  // decoded before the driver checks K: any K
        for (int64_t c = 0; c < x.cols; ++c) {
          const int8_t v = static_cast<int8_t>(x.elements[r * x.cols + c]);
          i16[r * kp + c] = v;
          i8[r * kp + c] = v;
          sum += v;
        }
        ZeroPadding(i16, r, x.cols, kp);
        ZeroPadding(i8, r, x.cols, kp);
        // −128 · Σ x passes int32 for K past the cap (then the driver takes the
        // reference): kept mod 2^32, which is all the kernel's int32 sums need.
        block_offset[r] = static_cast<int32_t>(static_cast<uint32_t>(-kU8Offset * sum));
      }
    });
    return d;
  }
  const CodeTable& table = Codes(x.format);
  const int fraction_bits = kind == Kind::kMxF64 ? 0 : table.fraction_bits;
  switch (kind) {
    // The per-element arrays (RowArray) are written in full by decode_rows:
    // every k of every block, the padding of the last block included.
    case Kind::kMxI8:
      d.i8.resize(x.rows * kp);
      d.block_offset.assign(x.rows * d.blocks, 0);
      break;
    case Kind::kMxI16:
      d.i16.resize(x.rows * kp);
      if (HasU8Copy(kind, x.format) && HasU8Copy(kind, w_format)) {  // W has u8 w + 128
        d.i8.resize(x.rows * kp);
        d.block_offset.assign(x.rows * d.blocks, 0);
      }
      break;
    default:
      d.f64.resize(x.rows * kp);
      d.i16.resize(x.rows * kp);
      d.i16_lo.resize(x.rows * kp);
      d.split_shift.assign(x.rows * d.blocks, 0);
      d.span_bits.assign(x.rows * d.blocks, 0);
      d.fit_max.assign((x.rows + kFitRows - 1) / kFitRows * d.blocks * kFitRows, 0.0);
      d.fit_l1.assign(d.fit_max.size(), 0.0);
      d.fit_sq.assign(d.fit_max.size(), 0.0);
      break;
  }
  d.scale.assign(x.rows * d.blocks, 0.0f);
  d.scale_d.assign(x.rows * d.blocks, 0.0);
  const int offset = kind == Kind::kMxI8 ? I8Offset(w_format) : kU8Offset;
  const bool with_i8 = kind == Kind::kMxI8 || !d.i8.empty();
  const int64_t row_bytes = RowBytes(x.format, x.cols);
  // What a range of rows contributes to the operand-wide facts.
  struct Facts {
    bool has_special = false;
    int max_span_bits = 0;
    ScaleRange range;
  };
  const auto decode_rows = [&](int64_t first, int64_t end, Facts& facts) {
    // Plain pointers: through the captured `d`, every int8 store (which may alias
    // anything) would make the compiler reload them, doubling the time.
    int8_t* const i8 = d.i8.data();
    int16_t* const i16 = d.i16.data();
    double* const f64 = d.f64.data();
    float* const scale = d.scale.data();
    double* const scale_d = d.scale_d.data();
    int32_t* const block_offset = d.block_offset.data();
    uint8_t* const span_bits = d.span_bits.data();
    int16_t* const i16_lo = d.i16_lo.data();
    uint8_t* const x_split = d.split_shift.data();
    double* const fit_max = d.fit_max.data();
    double* const fit_l1 = d.fit_l1.data();
    double* const fit_sq = d.fit_sq.data();
    const int64_t* const fixed = table.fixed.data();
    const float* const value = table.value.data();
    const int64_t blocks = d.blocks;
    std::vector<uint8_t> codes(kp);
    for (int64_t r = first; r < end; ++r) {
      UnpackCodes(x.format, x.elements.data() + r * row_bytes, blocks, codes.data());
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = codes.data() + b * kBlockSize;
        const BlockInfo info = InspectBlock(table, block);
        facts.has_special |= info.special;
        facts.max_span_bits = std::max(facts.max_span_bits, info.span_bits);
        const int64_t at_block = r * blocks + b;
        const BlockScales s = ScalesOf(x.block_scales[at_block], fraction_bits, info.all_zero);
        // The fast epilogue's scale, as in PackPanels.
        const BlockScales fast =
            kind == Kind::kMxF64 ? ShiftedScalesOf(x.block_scales[at_block], table, info) : s;
        scale_d[at_block] = s.wide;
        scale[at_block] = static_cast<float>(fast.fast);
        if (fast.counts) facts.range.Add(fast.exponent);
        const int64_t at = r * kp + b * kBlockSize;
        if (with_i8) {  // kMxI8, and MXINT8 × MXINT8's copy: bytes and the offset's share
          int32_t sum = 0;
          for (int i = 0; i < kBlockSize; ++i) {
            const auto v = static_cast<int32_t>(fixed[block[i]]);
            i8[at + i] = static_cast<int8_t>(v);
            sum += v;
          }
          block_offset[at_block] = -offset * sum;
        }
        if (kind == Kind::kMxI16) {
          for (int i = 0; i < kBlockSize; ++i) i16[at + i] = static_cast<int16_t>(fixed[block[i]]);
        } else if (kind == Kind::kMxF64) {
          for (int i = 0; i < kBlockSize; ++i) f64[at + i] = value[block[i]];
          span_bits[at_block] = static_cast<uint8_t>(info.span_bits);
          const bool one_limb = info.span_bits <= kShiftedI16Bits;
          const double inf = std::numeric_limits<double>::infinity();
          fit_max[FitAt(r, b, blocks)] = one_limb ? static_cast<double>(info.max) : inf;
          fit_l1[FitAt(r, b, blocks)] = one_limb ? static_cast<double>(info.l1) : inf;
          fit_sq[FitAt(r, b, blocks)] = one_limb ? ShiftedSquares(table, block, info.low_bit) : inf;
          if (const int t = LimbShift(info); t >= 0) {  // one int16 limb, or two as W's
            x_split[at_block] = static_cast<uint8_t>(t);
            for (int i = 0; i < kBlockSize; ++i) {
              const Limbs limbs = SplitLimbs(fixed[block[i]], info.low_bit, t);
              i16[at + i] = limbs.high;
              i16_lo[at + i] = limbs.low;
            }
          } else {  // no int16 form: zeros, never read as values (the FP64 path takes it)
            std::fill_n(i16 + at, kBlockSize, int16_t{0});
            std::fill_n(i16_lo + at, kBlockSize, int16_t{0});
          }
        }
      }
    }
  };
  const RowTasks tasks(x.rows, kp);
  std::vector<Facts> facts(std::max<int64_t>(tasks.count, 1));
  tasks.Run(pool,
            [&](int64_t first, int64_t end, int64_t t) { decode_rows(first, end, facts[t]); });
  for (const Facts& f : facts) {
    d.has_special |= f.has_special;
    d.max_span_bits = std::max(d.max_span_bits, f.max_span_bits);
    if (!f.range.empty()) {
      d.range.Add(f.range.min);
      d.range.Add(f.range.max);
    }
  }
  return d;
}

}  // namespace mx::kernels::internal

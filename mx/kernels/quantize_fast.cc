// Fast quantization: argument checks, dispatch by ISA level, and the scalar level.
//
// The scalar level is plain C++ (no intrinsics) following the scheme of the
// header: a block's codes come from a handful of float and integer operations per
// element, with no per-element branches on the default options. Every kernel is
// instantiated per source type (FP32, BF16, FP16), element format and rounding
// mode, so the element shapes are compile-time constants.
#include "mx/kernels/quantize_fast.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mx::kernels {
namespace internal {
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFF;
constexpr uint32_t kInfBits = 0x7F800000;

uint32_t Bits(float v) { return std::bit_cast<uint32_t>(v); }
float Float(uint32_t bits) { return std::bit_cast<float>(bits); }
// The two's-complement byte of k with v's sign (-0 gives 0), without a branch:
// signs of real data are random.
uint8_t WithSign(int k, float v) {
  const int negative = static_cast<int>(Bits(v) >> 31);
  return static_cast<uint8_t>((k ^ -negative) + negative);
}
// 2^e for e in [-126, 127].
float Pow2(int e) { return Float(static_cast<uint32_t>(e + 127) << 23); }

// The shared exponent by the floor rule (mx::SharedExponent with ScaleRule::kFloor)
// for the bits of a finite block maximum.
int FloorRuleExponent(uint32_t amax_bits, int emax) {
  if (amax_bits == 0) return -kScaleBias;
  const int biased = static_cast<int>(amax_bits >> 23);
  // A subnormal's floor(log2) is the position of its leading one bit, minus 149.
  const int floor_log2 = biased != 0 ? biased - 127 : (31 - std::countl_zero(amax_bits)) - 149;
  return std::clamp(floor_log2 - emax, -kScaleBias, kScaleBias);
}

// --- Sources: one value widened exactly to FP32, as mx::WidenToFloat does. ---

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t magnitude = h & 0x7FFF;
  uint32_t bits;
  if (magnitude >= 0x7C00) {
    bits = magnitude == 0x7C00 ? kInfBits : 0x7FC00000;  // NaN: the reference's quiet NaN
  } else if (magnitude >= 0x0400) {
    bits = (magnitude << 13) + ((127 - 15) << 23);  // normal: rebias the exponent
  } else {
    bits = Bits(static_cast<float>(magnitude) * 0x1p-24f);  // subnormal or zero: exact
  }
  return Float(sign | bits);
}

template <Format S>
using SourceType = std::conditional_t<S == Format::kFp32, float, uint16_t>;

template <Format S>
float Widen(SourceType<S> v) {
  if constexpr (S == Format::kFp32) {
    return v;
  } else if constexpr (S == Format::kBf16) {
    return Float(uint32_t{v} << 16);
  } else {
    return Fp16ToFloat(v);
  }
}

// --- Codecs: the codes of one MX block at a given shared exponent. ---
//
// Each has kFormat, kEmax (the element's emax, for the floor rule), kBits (bits per
// packed element) and Encode(values, e, codes) for 32 finite values.

// Minifloat elements (E4M3, E5M2, E3M2, E2M3, E2M1), the header's steps 2 to 4,
// written so that the compiler vectorizes the loop over a block (with SSE2 only).
template <Format F, const ElementShape& S, bool kAway>
struct MinifloatCodec {
  static constexpr Format kFormat = F;
  static constexpr int kEmax = S.emax;
  static constexpr int kBits = 1 + S.exponent_bits + S.mantissa_bits;
  static constexpr int kP = S.mantissa_bits;
  // 2^emin_elem, the smallest normal element, as FP32 bits.
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - S.bias) << 23;
  static constexpr uint32_t kMaxNormalBits = std::bit_cast<uint32_t>(S.max_normal);
  // The header's C for s, from the bits X of 2^max(floor(log2 s), emin):
  // X + (23 - p) << 23 is 2^(u + 23), and X >> (23 - p) - (128 - bias) << p is base.
  static constexpr uint32_t kMagicOffset =
      (static_cast<uint32_t>(23 - kP) << 23) - (static_cast<uint32_t>(128 - S.bias) << kP);

  static uint8_t EncodeOne(float v, float inverse_scale) {
    // s = min(|v| · 2^-e, max normal), compared as bits: non-negative floats order
    // like their bits, and integer selects let the compiler vectorize the loop.
    const uint32_t scaled = Bits(std::fabs(v) * inverse_scale);
    const uint32_t s_bits = scaled < kMaxNormalBits ? scaled : kMaxNormalBits;
    const float s = Float(s_bits);
    const uint32_t exponent = (s_bits > kMinNormalBits ? s_bits : kMinNormalBits) & kInfBits;
    const float c = Float(exponent + (exponent >> (23 - kP)) + kMagicOffset);
    const uint32_t sum = Bits(s + c);  // the one rounding, ties to even
    uint32_t code = sum & 0xFF;
    if constexpr (kAway) {
      // A tie rounded down (s - r, exact, is half a step 2^(u-1)): one code up.
      const float r = Float(sum) - c;
      if (s - r == Float(exponent - (static_cast<uint32_t>(kP + 1) << 23))) ++code;
    }
    return static_cast<uint8_t>(code | (Bits(v) >> 31 << (S.exponent_bits + kP)));
  }

  static void Encode(const float* values, int e, uint8_t* codes) {
    const float inverse_scale = Pow2(-e);  // e <= 127 - emax < 127 for a finite amax
    for (int i = 0; i < kBlockSize; ++i) codes[i] = EncodeOne(values[i], inverse_scale);
  }
};

// MXINT8: k = round(|v| · 2^(6 - e)) clamped to 127, two's complement.
template <bool kAway>
struct Mxint8Codec {
  static constexpr Format kFormat = Format::kMxint8;
  static constexpr int kEmax = 0;
  static constexpr int kBits = 8;

  static uint8_t EncodeOne(float v, float factor) {
    const float x = std::fabs(v) * factor;  // below 2^8 (at most 2^(emax+1) · 2^6)
    float r = (x + 0x1p23f) - 0x1p23f;      // nearest integer, ties to even
    if constexpr (kAway) {
      if (x - r == 0.5f) r += 1.0f;
    }
    const int k = static_cast<int>(std::min(r, 127.0f));
    return WithSign(k, v);
  }

  static void Encode(const float* values, int e, uint8_t* codes) {
    if (6 - e <= 127) {
      const float factor = Pow2(6 - e);
      for (int i = 0; i < kBlockSize; ++i) codes[i] = EncodeOne(values[i], factor);
      return;
    }
    // e < -121: 2^(6 - e) is no float. Only tiny blocks get here; v · 2^6 is exact.
    const float factor = Pow2(-e);
    for (int i = 0; i < kBlockSize; ++i) codes[i] = EncodeOne(values[i] * 64.0f, factor);
  }
};

// Bit-packs 32 codes as mx::PackBlock does.
template <int kBits>
void PackCodes(const uint8_t* codes, uint8_t* block) {
  if constexpr (kBits == 8) {
    std::memcpy(block, codes, kBlockSize);
  } else if constexpr (kBits == 6) {
    for (int j = 0; j < kBlockSize / 4; ++j) {
      const uint32_t word = codes[4 * j] | uint32_t{codes[4 * j + 1]} << 6 |
                            uint32_t{codes[4 * j + 2]} << 12 | uint32_t{codes[4 * j + 3]} << 18;
      block[3 * j] = static_cast<uint8_t>(word);
      block[3 * j + 1] = static_cast<uint8_t>(word >> 8);
      block[3 * j + 2] = static_cast<uint8_t>(word >> 16);
    }
  } else {
    static_assert(kBits == 4);
    for (int j = 0; j < kBlockSize / 2; ++j) {
      block[j] = static_cast<uint8_t>(codes[2 * j] | codes[2 * j + 1] << 4);
    }
  }
}

// Quantizes the MX rows of `job` with `Codec`.
template <Format S, class Codec>
void MxRows(const RowsJob& job) {
  using T = SourceType<S>;
  const int64_t blocks = BlocksPerRow(job.cols);
  const int64_t full_blocks = job.cols / kBlockSize;
  constexpr int kBlockBytes = kBlockSize * Codec::kBits / 8;
  const bool floor_rule = job.options.scale_rule == ScaleRule::kFloor;
  float widened[kBlockSize];
  uint8_t codes[kBlockSize];
  for (int64_t r = 0; r < job.rows; ++r) {
    const T* row = static_cast<const T*>(job.values) + r * job.cols;
    uint8_t* scales = job.block_scales + r * blocks;
    uint8_t* out = job.elements + r * blocks * kBlockBytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const T* in = row + b * kBlockSize;
      const float* values = widened;
      if constexpr (S == Format::kFp32) {
        if (b < full_blocks) values = in;  // read in place
      }
      if (values == widened) {
        // A short last block is padded with +0, whose code is 0.
        const int count = b < full_blocks ? kBlockSize : static_cast<int>(job.cols % kBlockSize);
        for (int i = 0; i < count; ++i) widened[i] = Widen<S>(in[i]);
        std::fill(widened + count, widened + kBlockSize, 0.0f);
      }
      // The largest magnitude as bits; NaN and Inf compare at or above Inf.
      uint32_t amax = 0;
      for (int i = 0; i < kBlockSize; ++i) amax = std::max(amax, Bits(values[i]) & kAbsMask);
      if (amax >= kInfBits) {
        scales[b] = kScaleNan;
        std::memset(out + b * kBlockBytes, 0, kBlockBytes);
        continue;
      }
      const int e = floor_rule ? FloorRuleExponent(amax, Codec::kEmax)
                               : SharedExponent(Codec::kFormat, Float(amax), job.options);
      scales[b] = static_cast<uint8_t>(e + kScaleBias);
      Codec::Encode(values, e, codes);
      PackCodes<Codec::kBits>(codes, out + b * kBlockBytes);
    }
  }
}

// INT8: the code of q = v / scale, rounded and clamped to ±127 (NaN, from 0 / 0
// when the scale underflowed to 0, gives 0; ±Inf clamps).
template <bool kAway>
uint8_t EncodeInt8(float q) {
  const float a = std::fabs(q);
  int k;
  if (a < 127.0f) {
    float r = (a + 0x1p23f) - 0x1p23f;
    if constexpr (kAway) {
      if (a - r == 0.5f) r += 1.0f;
    }
    k = static_cast<int>(r);
  } else {
    k = std::isnan(a) ? 0 : 127;
  }
  return WithSign(k, q);
}

// INT8 rows: scale = amax / 127 in FP32, code = round(v / scale) with the same
// IEEE division as the reference.
template <Format S, bool kAway>
void Int8Rows(const RowsJob& job) {
  using T = SourceType<S>;
  const size_t cols = static_cast<size_t>(job.cols);
  for (int64_t r = 0; r < job.rows; ++r) {
    const T* row = static_cast<const T*>(job.values) + r * job.cols;
    uint8_t* out = job.elements + r * job.cols;
    uint32_t amax = 0;
    for (size_t i = 0; i < cols; ++i) amax = std::max(amax, Bits(Widen<S>(row[i])) & kAbsMask);
    if (amax >= kInfBits || amax == 0) {
      std::memset(out, 0, cols);
      job.row_scales[r] = amax == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float scale = Float(amax) / 127.0f;
    for (size_t i = 0; i < cols; ++i) out[i] = EncodeInt8<kAway>(Widen<S>(row[i]) / scale);
    job.row_scales[r] = scale;
  }
}

// FP32 to BF16, nearest even, overflow to Inf, NaN to the quiet NaN of its sign
// (mx::FloatToBf16).
uint16_t ToBf16(float v) {
  const uint32_t x = Bits(v);
  if ((x & kAbsMask) > kInfBits) return static_cast<uint16_t>((x >> 16 & 0x8000) | 0x7FC0);
  return static_cast<uint16_t>((x + 0x7FFF + (x >> 16 & 1)) >> 16);
}

// FP32 to FP16, the same rules (mx::FloatToFp16).
uint16_t ToFp16(float v) {
  const uint32_t x = Bits(v);
  const uint16_t sign = static_cast<uint16_t>(x >> 16 & 0x8000);
  const uint32_t a = x & kAbsMask;
  if (a > kInfBits) return sign | 0x7E00;
  if (a >= 0x47800000) return sign | 0x7C00;  // >= 2^16, Inf included
  if (a >= 0x38800000) {                      // >= 2^-14: FP16 normal (or rounds to Inf)
    const uint32_t rounded = a + 0xFFF + (a >> 13 & 1);
    return static_cast<uint16_t>(sign | ((rounded >> 13) - ((127 - 15) << 10)));
  }
  // Below 2^-14: round to a multiple of 2^-24 by adding 0.5, whose FP32 step is
  // 2^-24; the count of steps is the subnormal code (1024 = the smallest normal).
  return static_cast<uint16_t>(sign | (Bits(Float(a) + 0.5f) - Bits(0.5f)));
}

template <Format S>
void FloatRows(const RowsJob& job) {
  using T = SourceType<S>;
  const T* in = static_cast<const T*>(job.values);
  const int64_t count = job.rows * job.cols;
  uint8_t* out = job.elements;
  if (job.format == Format::kFp32) {
    if constexpr (S == Format::kFp32) {
      std::memcpy(out, in, count * sizeof(float));
    } else {
      for (int64_t i = 0; i < count; ++i) {
        const uint32_t bits = Bits(Widen<S>(in[i]));
        std::memcpy(out + 4 * i, &bits, 4);  // little-endian host
      }
    }
  } else if (job.format == Format::kBf16) {
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t code = ToBf16(Widen<S>(in[i]));
      std::memcpy(out + 2 * i, &code, 2);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t code = ToFp16(Widen<S>(in[i]));
      std::memcpy(out + 2 * i, &code, 2);
    }
  }
}

#include "mx/kernels/quantize_dispatch.inc"
#include "mx/kernels/ue4m3.inc"

}  // namespace

void QuantizeRowsScalar(const RowsJob& job) { RowsOfJob(job); }

// NVFP4 rows under tensor scale `ts`, nearest (even, or away): the reference's
// recipe (QuantizeNvBlock) with the E2M1 rounding as seven comparisons against
// the midpoints of the element grid {0, .5, 1, 1.5, 2, 3, 4, 6} — exact, since
// every midpoint is an FP32 value — instead of one EncodeElement call per
// element. `elements`, `scales`, `row_scales` point at the rows' place in the
// matrix. (NvRowsAvx2 is the same with intrinsics: 2.9x faster in mx_bench on
// an AMD EPYC Zen 5.)
void NvRowsScalar(const float* values, int64_t rows, int64_t cols, float ts, bool away,
                  uint8_t* elements, uint8_t* scales, float* row_scales) {
  const int64_t blocks = BlocksPerRow(Format::kNvfp4, cols);
  const int64_t row_bytes = RowBytes(Format::kNvfp4, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = values + r * cols;
    row_scales[r] = ts;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kNvBlockSize;
      const int count = static_cast<int>(std::min<int64_t>(kNvBlockSize, cols - begin));
      float v[kNvBlockSize] = {};
      std::memcpy(v, row + begin, count * sizeof(float));
      uint32_t max_bits = 0;
      for (int i = 0; i < kNvBlockSize; ++i) {
        max_bits = std::max(max_bits, std::bit_cast<uint32_t>(v[i]) & 0x7FFFFFFFu);
      }
      uint8_t* block = elements + r * row_bytes + b * BlockBytes(Format::kNvfp4);
      if (max_bits >= 0x7F800000u) {
        scales[r * blocks + b] = kNvScaleNan;
        std::memset(block, 0, BlockBytes(Format::kNvfp4));
        continue;
      }
      const float block_scale = std::bit_cast<float>(max_bits) / kNvElementMax / ts;
      float scale_value;
      scales[r * blocks + b] =
          RoundUe4m3(std::clamp(block_scale, kNvScaleMin, kNvScaleMax), scale_value);
      const float total = ts * scale_value;
      uint8_t codes[kNvBlockSize];
      for (int i = 0; i < kNvBlockSize; ++i) {
        const float q = v[i] / total;
        const float a = std::min(std::fabs(q), kNvElementMax);
        // Ties to even go to the even code: down at .25, 1.25, 2.5 and 5, up at
        // .75, 1.75 and 3.5; ties away always up.
        const int magnitude = away ? (a >= 0.25f) + (a >= 0.75f) + (a >= 1.25f) + (a >= 1.75f) +
                                         (a >= 2.5f) + (a >= 3.5f) + (a >= 5.0f)
                                   : (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                                         (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
        codes[i] = static_cast<uint8_t>(magnitude | ((std::bit_cast<uint32_t>(q) >> 28) & 8u));
      }
      for (int i = 0; i < kNvBlockSize / 2; ++i) {
        block[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
      }
    }
  }
}

void TransposePanelScalar(const float* values, int64_t k, int64_t n, int64_t j0, int width,
                          float* panel) {
  // Eight rows of K at a time: each pass reads whole stretches of eight rows' width.
  constexpr int64_t kStep = 8;
  for (int64_t i0 = 0; i0 < k; i0 += kStep) {
    const int64_t i1 = std::min(k, i0 + kStep);
    for (int j = 0; j < width; ++j) {
      for (int64_t i = i0; i < i1; ++i) panel[j * k + i] = values[i * n + j0 + j];
    }
  }
}

}  // namespace internal

namespace {

using internal::RowsJob;

// Rows [first, first + count) of `m` as a job's output.
RowsJob JobFor(QuantizedMatrix& m, int64_t first, int64_t count, Format source, const void* values,
               const QuantizeOptions& options) {
  RowsJob job;
  job.source = source;
  job.values = values;
  job.rows = count;
  job.cols = m.cols;
  job.format = m.format;
  job.options = options;
  job.elements = m.elements.data() + first * RowBytes(m.format, m.cols);
  if (!m.block_scales.empty())
    job.block_scales = m.block_scales.data() + first * BlocksPerRow(m.cols);
  if (!m.row_scales.empty()) job.row_scales = m.row_scales.data() + first;
  return job;
}

bool UseAvx2(Isa isa) { return Resolve(isa) >= Isa::kAvx2; }

void Run(const RowsJob& job, Isa isa) {
  if (job.rows == 0 || job.cols == 0) return;  // nothing to write (INT8 row scales stay 0)
  if (UseAvx2(isa)) {
    internal::QuantizeRowsAvx2(job);
  } else {
    internal::QuantizeRowsScalar(job);
  }
}

// Values per task when a pool splits the work: enough that handing a task over
// costs little beside it (a few microseconds of quantizing).
constexpr int64_t kValuesPerTask = int64_t{1} << 15;

// Quantizes all rows of `m` from `values` (rows × cols of `source`), in tasks of
// whole rows across `pool` when there is enough work for more than one.
void RunRows(QuantizedMatrix& m, Format source, const void* values, const QuantizeOptions& options,
             Isa isa, ThreadPool* pool) {
  const int64_t rows_per_task = std::max<int64_t>(1, kValuesPerTask / std::max<int64_t>(1, m.cols));
  const int64_t tasks = (m.rows + rows_per_task - 1) / rows_per_task;
  const size_t value_bytes = source == Format::kFp32 ? 4 : 2;
  const auto task = [&](int64_t t) {
    const int64_t first = t * rows_per_task, count = std::min(rows_per_task, m.rows - first);
    const auto* at = static_cast<const uint8_t*>(values) + first * m.cols * value_bytes;
    Run(JobFor(m, first, count, source, at, options), isa);
  };
  if (pool != nullptr && tasks > 1) {
    pool->ParallelFor(tasks, task);
  } else {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
}

// Copies part's rows into rows [first, first + part.rows) of `m` (same format
// and columns).
void PlaceRows(const QuantizedMatrix& part, int64_t first, QuantizedMatrix& m) {
  std::copy(part.elements.begin(), part.elements.end(),
            m.elements.begin() + first * RowBytes(m.format, m.cols));
  if (IsBlockScaled(m.format)) {
    std::copy(part.block_scales.begin(), part.block_scales.end(),
              m.block_scales.begin() + first * ScaleBytesPerRow(m.format, m.cols));
  }
  if (HasRowScales(m.format)) {
    std::copy(part.row_scales.begin(), part.row_scales.end(), m.row_scales.begin() + first);
  }
}

// What the branch-free MX/INT8 kernels do not take: stochastic rounding (the
// reference's per-element encoder: an element drawing its own bits has no
// branch-free form here yet), NVFP4 (NvRows, or the reference when stochastic)
// and the lookup formats (the reference's threshold or codebook search).
// SpecialRows does all.
bool SpecialPath(Format format, const QuantizeOptions& options) {
  return options.rounding == Rounding::kStochastic || format == Format::kNvfp4 ||
         Traits(format).is_lookup();
}

// `options` as each part of a matrix quantized in parts needs them: NVFP4's
// tensor scale is the whole matrix's.
QuantizeOptions WholeMatrixOptions(Format format, std::span<const float> values,
                                   QuantizeOptions options) {
  if (format == Format::kNvfp4 && !BringsTensorScale(options)) {
    options.tensor_scale = NvTensorScale(FiniteAmax(values));
  }
  return options;
}

// NVFP4 rows at the level `isa` asks for (as Run does for the other formats).
void NvRows(Isa isa, const float* values, int64_t rows, int64_t cols, float ts, bool away,
            uint8_t* elements, uint8_t* scales, float* row_scales) {
  if (UseAvx2(isa)) {
    internal::NvRowsAvx2(values, rows, cols, ts, away, elements, scales, row_scales);
  } else {
    internal::NvRowsScalar(values, rows, cols, ts, away, elements, scales, row_scales);
  }
}

// Rows [first, first + count) of `m` from `rows` (count × m.cols, row-major),
// for what the branch-free kernels do not take (SpecialPath): NVFP4 to nearest
// through NvRows, anything stochastic through the reference encoder, element
// (r, c) of the part drawing index index_offset + r · row_step + c · col_step.
// `whole` carries the whole matrix's NVFP4 tensor scale (WholeMatrixOptions).
void SpecialRows(QuantizedMatrix& m, int64_t first, const float* rows, int64_t count,
                     const QuantizeOptions& whole, uint64_t index_offset, uint64_t row_step,
                     uint64_t col_step, Isa isa) {
  if (m.format == Format::kNvfp4 && whole.rounding != Rounding::kStochastic) {
    NvRows(isa, rows, count, m.cols, whole.tensor_scale,
           whole.rounding == Rounding::kNearestAway,
           m.elements.data() + first * RowBytes(m.format, m.cols),
           m.block_scales.data() + first * BlocksPerRow(m.format, m.cols),
           m.row_scales.data() + first);
    return;
  }
  QuantizeOptions part = whole;
  part.index_offset = static_cast<int64_t>(index_offset);
  PlaceRows(*QuantizeRowsDrawing(std::span<const float>(rows, count * m.cols), count, m.cols,
                                 m.format, part, row_step, col_step),
            first, m);
}

// SpecialRows over all rows of `m`, in tasks of whole rows across `pool`.
void AllSpecialRows(QuantizedMatrix& m, std::span<const float> values,
                   const QuantizeOptions& options, Isa isa, ThreadPool* pool) {
  const QuantizeOptions whole = WholeMatrixOptions(m.format, values, options);
  const int64_t rows_per_task = std::max<int64_t>(1, kValuesPerTask / std::max<int64_t>(1, m.cols));
  const int64_t tasks = (m.rows + rows_per_task - 1) / rows_per_task;
  const uint64_t stride = options.index_row_stride != 0 ? options.index_row_stride : m.cols;
  const auto task = [&](int64_t t) {
    const int64_t first = t * rows_per_task, count = std::min(rows_per_task, m.rows - first);
    SpecialRows(m, first, values.data() + first * m.cols, count, whole,
                    static_cast<uint64_t>(options.index_offset) + first * stride, stride, 1, isa);
  };
  if (pool != nullptr && tasks > 1) {
    pool->ParallelFor(tasks, task);
  } else {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
}

}  // namespace

absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const float> values, int64_t rows,
                                             int64_t cols, Format format,
                                             const QuantizeOptions& options, Isa isa,
                                             ThreadPool* pool) {
  if (absl::Status s = ValidateShape(values.size(), rows, cols, "values"); !s.ok()) return s;
  QuantizedMatrix m = AllocateQuantized(format, rows, cols);
  if (SpecialPath(format, options)) {
    AllSpecialRows(m, values, options, isa, pool);
  } else {
    RunRows(m, Format::kFp32, values.data(), options, isa, pool);
  }
  return m;
}

absl::StatusOr<QuantizedMatrix> QuantizeRows(std::span<const uint16_t> values, Format source,
                                             int64_t rows, int64_t cols, Format format,
                                             const QuantizeOptions& options, Isa isa,
                                             ThreadPool* pool) {
  if (source != Format::kBf16 && source != Format::kFp16) {
    return absl::InvalidArgumentError(
        absl::StrCat("source: expected BF16 or FP16, got ", FormatName(source)));
  }
  if (absl::Status s = ValidateShape(values.size(), rows, cols, "values"); !s.ok()) return s;
  if (SpecialPath(format, options)) {
    std::vector<float> widened(values.size());
    WidenToFloat(source, values.data(), values.size(), widened.data());
    return QuantizeRows(widened, rows, cols, format, options, isa, pool);
  }
  QuantizedMatrix m = AllocateQuantized(format, rows, cols);
  RunRows(m, source, values.data(), options, isa, pool);
  return m;
}

absl::StatusOr<QuantizedMatrix> QuantizeColumns(std::span<const float> values, int64_t k, int64_t n,
                                                Format format, const QuantizeOptions& options,
                                                Isa isa, ThreadPool* pool) {
  if (absl::Status s = ValidateShape(values.size(), k, n, "values"); !s.ok()) return s;
  QuantizedMatrix m = AllocateQuantized(format, n, k);
  if (k == 0 || n == 0) {
    // Nothing to quantize; NVFP4 rows still carry the (empty) tensor's scale.
    const QuantizeOptions whole = WholeMatrixOptions(format, values, options);
    std::fill(m.row_scales.begin(), m.row_scales.end(), whole.tensor_scale);
    return m;
  }
  const bool special = SpecialPath(format, options);
  const QuantizeOptions whole =
      special ? WholeMatrixOptions(format, values, options) : options;
  // Panels of columns, transposed into rows of K, then quantized as rows; each
  // task owns its panel buffer.
  const bool avx2 = UseAvx2(isa);
  const int64_t panels = (n + internal::kColumnPanel - 1) / internal::kColumnPanel;
  const int64_t panels_per_task =
      std::max<int64_t>(1, kValuesPerTask / (internal::kColumnPanel * k));
  const int64_t tasks = (panels + panels_per_task - 1) / panels_per_task;
  const auto task = [&](int64_t t) {
    std::vector<float> panel(static_cast<size_t>(internal::kColumnPanel * k));
    const int64_t end = std::min(n, (t + 1) * panels_per_task * internal::kColumnPanel);
    for (int64_t j0 = t * panels_per_task * internal::kColumnPanel; j0 < end;
         j0 += internal::kColumnPanel) {
      const int width = static_cast<int>(std::min<int64_t>(internal::kColumnPanel, n - j0));
      if (avx2) {
        internal::TransposePanelAvx2(values.data(), k, n, j0, width, panel.data());
      } else {
        internal::TransposePanelScalar(values.data(), k, n, j0, width, panel.data());
      }
      if (special) {
        // Panel element (j, i) is source (i, j0 + j): index offset + j0 + j + i · stride.
        const uint64_t stride = options.index_row_stride != 0 ? options.index_row_stride : n;
        SpecialRows(m, j0, panel.data(), width, whole,
                        static_cast<uint64_t>(options.index_offset) + j0, 1, stride, isa);
      } else {
        Run(JobFor(m, j0, width, Format::kFp32, panel.data(), options), isa);
      }
    }
  };
  if (pool != nullptr && tasks > 1) {
    pool->ParallelFor(tasks, task);
  } else {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
  return m;
}

}  // namespace mx::kernels

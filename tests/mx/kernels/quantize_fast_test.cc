// The fast quantizers against the reference (mx/packed.h), bit for bit: every
// format, both rounding modes and both scale rules, FP32, BF16 and FP16 inputs,
// rows and columns, at every ISA level this machine runs.
#include "mx/kernels/quantize_fast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/element.h"
#include "mx/packed.h"
#include "tests/mx/test_util.h"

namespace {

using mx::Format;
using mx::QuantizedMatrix;
using mx::QuantizeOptions;
using mx::kernels::Isa;

constexpr Format kAllFormats[] = {
    Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2, Format::kMxfp6E2m3,
    Format::kMxfp4E2m1, Format::kMxint8,    Format::kInt8,      Format::kBf16,
    Format::kFp16,      Format::kFp32,
};

std::vector<QuantizeOptions> AllOptions() {
  std::vector<QuantizeOptions> all;
  for (mx::Rounding rounding : {mx::Rounding::kNearestEven, mx::Rounding::kNearestAway}) {
    for (mx::ScaleRule rule : mx::kAllScaleRules) all.push_back({rounding, rule});
  }
  return all;
}

std::string Describe(Format format, Isa isa, const QuantizeOptions& options) {
  return absl::StrCat(
      mx::FormatName(format), " at ", mx::kernels::IsaName(isa), ", ",
      options.rounding == mx::Rounding::kNearestEven ? "ties to even" : "ties away", ", ",
      mx::ScaleRuleName(options.scale_rule), " scale");
}

uint32_t Bits(float v) { return std::bit_cast<uint32_t>(v); }
std::string Hex(uint32_t x) { return absl::StrCat("0x", absl::Hex(x)); }
float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

// The column of the first element stored in byte `byte` of a packed row.
int64_t ColumnOfByte(Format format, int64_t byte) {
  if (!mx::IsMx(format)) return byte / (mx::Traits(format).element_bits / 8);
  const int64_t block = byte / mx::BlockBytes(format);
  return block * mx::kBlockSize +
         (byte % mx::BlockBytes(format)) * 8 / mx::Traits(format).element_bits;
}

// Equal buffers, or a message naming the first difference by row and column.
// `input(row, col)` describes the value quantized there.
template <class Input>
testing::AssertionResult SameMatrix(const QuantizedMatrix& got, const QuantizedMatrix& want,
                                    const Input& input) {
  if (got.format != want.format || got.rows != want.rows || got.cols != want.cols) {
    return testing::AssertionFailure()
           << "shape: got " << mx::FormatName(got.format) << " " << got.rows << "x" << got.cols
           << ", want " << mx::FormatName(want.format) << " " << want.rows << "x" << want.cols;
  }
  if (got.elements.size() != want.elements.size() ||
      got.block_scales.size() != want.block_scales.size() ||
      got.row_scales.size() != want.row_scales.size()) {
    return testing::AssertionFailure() << "buffer sizes differ";
  }
  const int64_t row_bytes = mx::RowBytes(want.format, want.cols);
  for (size_t i = 0; i < want.elements.size(); ++i) {
    if (got.elements[i] == want.elements[i]) continue;
    const int64_t row = static_cast<int64_t>(i) / row_bytes;
    const int64_t col = ColumnOfByte(want.format, static_cast<int64_t>(i) % row_bytes);
    return testing::AssertionFailure()
           << "element byte " << i << " (row " << row << ", col " << col << ", input "
           << input(row, col) << "): got " << Hex(got.elements[i]) << ", want "
           << Hex(want.elements[i]);
  }
  const int64_t blocks = mx::BlocksPerRow(want.cols);
  for (size_t i = 0; i < want.block_scales.size(); ++i) {
    if (got.block_scales[i] == want.block_scales[i]) continue;
    const int64_t row = static_cast<int64_t>(i) / blocks;
    const int64_t col = static_cast<int64_t>(i) % blocks * mx::kBlockSize;
    return testing::AssertionFailure()
           << "block scale (row " << row << ", cols from " << col << ", first input "
           << input(row, col) << "): got " << int{got.block_scales[i]} << ", want "
           << int{want.block_scales[i]};
  }
  for (size_t i = 0; i < want.row_scales.size(); ++i) {
    if (Bits(got.row_scales[i]) == Bits(want.row_scales[i])) continue;
    return testing::AssertionFailure() << "row scale of row " << i << ": got " << got.row_scales[i]
                                       << ", want " << want.row_scales[i];
  }
  return testing::AssertionSuccess();
}

// --- Inputs ---

enum class Distribution {
  kGaussian,    // N(0, 1) · 2^s, s from -140 to 120 per block
  kTies,        // midpoints between adjacent elements of the format, and ±1 ulp
  kNearMax,     // the top binade: max normal, the midpoint past it, just below 2^(emax+1)
  kSubnormal,   // FP32 subnormals, alone and beside tiny normals
  kZeros,       // +0 and -0, whole blocks of them, a few tiny values
  kSpecials,    // NaN and ±Inf in some blocks
  kExtreme,     // block maxima near 2^127, 2^-126 and 2^-149
  kRandomBits,  // uniformly random FP32 bit patterns
};

constexpr Distribution kAllDistributions[] = {
    Distribution::kGaussian,  Distribution::kTies,       Distribution::kNearMax,
    Distribution::kSubnormal, Distribution::kZeros,      Distribution::kSpecials,
    Distribution::kExtreme,   Distribution::kRandomBits,
};

const char* DistributionName(Distribution d) {
  switch (d) {
    case Distribution::kGaussian:
      return "Gaussian";
    case Distribution::kTies:
      return "Ties";
    case Distribution::kNearMax:
      return "NearMax";
    case Distribution::kSubnormal:
      return "Subnormal";
    case Distribution::kZeros:
      return "Zeros";
    case Distribution::kSpecials:
      return "Specials";
    case Distribution::kExtreme:
      return "Extreme";
    case Distribution::kRandomBits:
      return "RandomBits";
  }
  return "?";
}
void PrintTo(Distribution d, std::ostream* os) { *os << DistributionName(d); }

// The largest finite positive code of a format whose codes grow with magnitude
// (MX minifloats, BF16, FP16), for picking adjacent element pairs.
uint32_t MaxFiniteCode(Format format) {
  const mx::FormatTraits& t = mx::Traits(format);
  const uint32_t max_field = (1u << t.exponent_bits) - 1;
  switch (t.specials) {
    case mx::Specials::kNone:
      return (1u << (t.exponent_bits + t.mantissa_bits)) - 1;
    case mx::Specials::kNanOnlyE4m3:
      return (max_field << t.mantissa_bits) | ((1u << t.mantissa_bits) - 2);
    case mx::Specials::kIeee:
      return (max_field << t.mantissa_bits) - 1;
  }
  return 0;
}

class InputMaker {
 public:
  explicit InputMaker(uint64_t seed) : rng_(seed) {}

  // rows × cols values shaped for `format` (which sets where the ties and the top
  // binade are).
  std::vector<float> Make(Distribution d, Format format, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols; b += mx::kBlockSize) {
        const int64_t count = std::min<int64_t>(mx::kBlockSize, cols - b);
        FillBlock(d, format, std::span<float>(v.data() + r * cols + b, count));
      }
    }
    return v;
  }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  float Sign() { return Chance(0.5) ? -1.0f : 1.0f; }
  float Gaussian() { return std::normal_distribution<float>(0.0f, 1.0f)(rng_); }
  // One FP32 ulp up or down, or none.
  float Nudge(float x) {
    switch (Uniform(0, 2)) {
      case 0:
        return std::nextafter(x, 0.0f);
      case 1:
        return std::nextafter(x, std::numeric_limits<float>::infinity());
      default:
        return x;
    }
  }

  // A midpoint between two adjacent positive values of `format`, in element units
  // (for MX formats before the block scale; INT8: in units of the row scale).
  double Midpoint(Format format) {
    const mx::FormatTraits& t = mx::Traits(format);
    if (t.kind == mx::FormatKind::kMxInt) return (Uniform(0, 126) + 0.5) / 64.0;
    if (t.kind == mx::FormatKind::kInt8) return Uniform(0, 126) + 0.5;
    if (format == Format::kFp32) return Gaussian();
    const uint32_t code =
        static_cast<uint32_t>(Uniform(0, static_cast<int>(MaxFiniteCode(format)) - 1));
    return (double{mx::DecodeElement(format, code)} + mx::DecodeElement(format, code + 1)) / 2;
  }

  // The largest finite value of `format`.
  static double MaxNormal(Format format) {
    const mx::FormatTraits& t = mx::Traits(format);
    if (t.kind == mx::FormatKind::kInt8) return 127.0;
    if (format == Format::kFp32) return std::numeric_limits<float>::max();
    return t.max_normal;
  }

  void FillBlock(Distribution d, Format format, std::span<float> block) {
    const mx::FormatTraits& t = mx::Traits(format);
    switch (d) {
      case Distribution::kGaussian: {
        const int s = Uniform(-140, 120);
        for (float& x : block) x = std::ldexp(Gaussian(), s);
        break;
      }
      case Distribution::kTies: {
        // One element ±2^(emax + s) pins the MX scale to 2^s (INT8: ±127 pins the
        // row scale to 1, the midpoints being below it).
        const int s = t.kind == mx::FormatKind::kInt8 ? 0 : Uniform(-130, 100);
        const bool integer = t.kind == mx::FormatKind::kInt8;
        const bool mx_format = t.is_mx();
        for (float& x : block) {
          x = Sign() * static_cast<float>(std::ldexp(Midpoint(format), mx_format ? s : 0));
          if (Chance(0.3)) x = Nudge(x);
        }
        const size_t pin = static_cast<size_t>(Uniform(0, static_cast<int>(block.size()) - 1));
        if (mx_format) block[pin] = Sign() * std::ldexp(1.0f, t.emax + s);
        if (integer) block[pin] = Sign() * 127.0f;
        break;
      }
      case Distribution::kNearMax: {
        const int s = t.is_mx() ? Uniform(-120, 100) : 0;
        // Up to the next power of two (FP16: 65504, the tie 65520, up to 65536).
        const double max = MaxNormal(format);
        const double top = t.kind == mx::FormatKind::kInt8 ? 128.0 : std::ldexp(1.0, t.emax + 1);
        const double step = top - max;
        for (float& x : block) {
          double y;
          switch (Uniform(0, 4)) {
            case 0:
              y = max;
              break;
            case 1:
              y = max + step / 2;
              break;
            case 2:
              y = max + step / 4;
              break;
            case 3:
              y = std::nextafter(static_cast<float>(top), 0.0f);
              break;
            default:
              y = max * (0.9 + 0.11 * std::uniform_real_distribution<double>()(rng_));
          }
          if (!t.is_mx() && y > std::numeric_limits<float>::max()) y = max;
          x = Sign() * std::ldexp(static_cast<float>(y), s);
          if (Chance(0.3)) x = Nudge(x);
        }
        break;
      }
      case Distribution::kSubnormal: {
        const bool with_normals = Chance(0.5);
        for (float& x : block) {
          if (with_normals && Chance(0.2)) {
            x = Sign() * std::ldexp(1.0f + std::fabs(Gaussian()), Uniform(-126, -110));
          } else {
            x = FromBits((Chance(0.5) ? 0x80000000u : 0u) |
                         (static_cast<uint32_t>(rng_()) >> Uniform(9, 31)));
          }
        }
        break;
      }
      case Distribution::kZeros: {
        const bool all_zero = Chance(0.5);
        for (float& x : block) {
          x = Chance(0.5) ? -0.0f : 0.0f;
          if (!all_zero && Chance(0.2)) x = Sign() * std::ldexp(1.0f, Uniform(-149, 10));
        }
        break;
      }
      case Distribution::kSpecials: {
        const int s = Uniform(-60, 60);
        for (float& x : block) x = std::ldexp(Gaussian(), s);
        if (Chance(0.6)) {
          const uint32_t special_bits[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                                           0x7F800001u, 0xFFFFFFFFu, 0x7FA12345u};
          const int count = Uniform(1, 3);
          for (int i = 0; i < count; ++i) {
            block[static_cast<size_t>(Uniform(0, static_cast<int>(block.size()) - 1))] =
                FromBits(special_bits[Uniform(0, 6)]);
          }
        }
        break;
      }
      case Distribution::kExtreme: {
        const int center = std::array<int, 3>{127, -126, -149}[Uniform(0, 2)];
        for (float& x : block) {
          const int e = std::max(-149, std::min(127, center - Uniform(0, 30)));
          x = Sign() *
              std::ldexp(1.0f + std::ldexp(static_cast<float>(Uniform(0, 1 << 23)), -23), e);
          if (!std::isfinite(x)) x = Sign() * std::numeric_limits<float>::max();
        }
        if (center == 127 && Chance(0.5)) block[0] = std::numeric_limits<float>::max();
        break;
      }
      case Distribution::kRandomBits: {
        for (float& x : block) x = FromBits(static_cast<uint32_t>(rng_()));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

// Formats a value for messages: its decimal and its bits.
std::string Show(float v) { return absl::StrCat(v, " (", Hex(Bits(v)), ")"); }

// --- Rows from FP32 ---

class QuantizeFastRows : public testing::TestWithParam<Distribution> {};

TEST_P(QuantizeFastRows, MatchReferenceBitForBit) {
  const Distribution d = GetParam();
  InputMaker maker(1000 + static_cast<uint64_t>(d));
  const int64_t shapes[][2] = {{1, 1},   {2, 31}, {3, 32}, {1, 33},  {5, 100},
                               {4, 896}, {2, 64}, {3, 7},  {1, 257}, {5, 33}};
  for (Format format : kAllFormats) {
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1];
      const std::vector<float> values = maker.Make(d, format, rows, cols);
      const auto input = [&](int64_t r, int64_t c) { return Show(values[r * cols + c]); };
      for (const QuantizeOptions& options : AllOptions()) {
        const QuantizedMatrix want = mx::QuantizeRows(values, rows, cols, format, options).value();
        for (Isa isa : mx::kernels::AvailableIsas()) {
          const QuantizedMatrix got =
              mx::kernels::QuantizeRows(values, rows, cols, format, options, isa).value();
          EXPECT_TRUE(SameMatrix(got, want, input))
              << Describe(format, isa, options) << ", " << DistributionName(d) << ", " << rows
              << "x" << cols;
        }
      }
    }
  }
}

// --- Columns from FP32 ---

TEST_P(QuantizeFastRows, ColumnsMatchReferenceBitForBit) {
  const Distribution d = GetParam();
  InputMaker maker(2000 + static_cast<uint64_t>(d));
  const int64_t shapes[][2] = {{1, 1},   {31, 3}, {32, 8},  {33, 16}, {100, 17},
                               {64, 33}, {7, 40}, {96, 15}, {40, 1}};
  for (Format format : kAllFormats) {
    for (const auto& shape : shapes) {
      const int64_t k = shape[0], n = shape[1];
      // Quantized along K: make each column a run of the distribution.
      const std::vector<float> columns = maker.Make(d, format, n, k);
      std::vector<float> values(columns.size());
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < k; ++i) values[i * n + j] = columns[j * k + i];
      }
      // Rows of the result are columns of the input.
      const auto input = [&](int64_t j, int64_t i) { return Show(values[i * n + j]); };
      for (const QuantizeOptions& options : AllOptions()) {
        const QuantizedMatrix want = mx::QuantizeColumns(values, k, n, format, options).value();
        for (Isa isa : mx::kernels::AvailableIsas()) {
          const QuantizedMatrix got =
              mx::kernels::QuantizeColumns(values, k, n, format, options, isa).value();
          EXPECT_TRUE(SameMatrix(got, want, input))
              << "columns, " << Describe(format, isa, options) << ", " << DistributionName(d)
              << ", K=" << k << " N=" << n;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Distributions, QuantizeFastRows, testing::ValuesIn(kAllDistributions),
                         [](const auto& info) { return DistributionName(info.param); });

// A sweep of the FP32 bit patterns in order, so that each block holds neighbouring
// magnitudes, through every exponent, NaN and Inf included.
TEST(QuantizeFast, FloatBitPatternSweepMatchesReference) {
  std::vector<float> values;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) {
    values.push_back(FromBits(static_cast<uint32_t>(bits)));
  }
  const int64_t cols = static_cast<int64_t>(values.size());
  const auto input = [&](int64_t, int64_t c) { return Show(values[c]); };
  for (Format format : kAllFormats) {
    for (const QuantizeOptions& options : AllOptions()) {
      const QuantizedMatrix want = mx::QuantizeRows(values, 1, cols, format, options).value();
      for (Isa isa : mx::kernels::AvailableIsas()) {
        EXPECT_TRUE(SameMatrix(
            mx::kernels::QuantizeRows(values, 1, cols, format, options, isa).value(), want, input))
            << Describe(format, isa, options);
      }
    }
  }
}

// Rows built by hand around the edges: INT8 rows so tiny that amax / 127 rounds to
// 0 (then 0 / 0 is NaN and v / 0 is Inf), rows of -0, NaN or Inf alone, block
// maxima at the top of the FP32 range (MXINT8 reaches the scale 2^127 there), and
// values just below powers of two.
TEST(QuantizeFast, EdgeRowsMatchReference) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float tiny = FromBits(1);  // 2^-149
  std::vector<std::vector<float>> rows;
  for (uint32_t top : {1u, 2u, 63u, 64u, 127u, 128u, 200u, 0x7FFFFFu, 0x800000u}) {
    rows.push_back({FromBits(top), 0.0f, -0.0f, tiny, -tiny, FromBits(top / 2), -FromBits(top)});
  }
  rows.push_back(std::vector<float>(40, -0.0f));
  rows.push_back(std::vector<float>(33, std::numeric_limits<float>::quiet_NaN()));
  rows.push_back(std::vector<float>(31, -std::numeric_limits<float>::infinity()));
  rows.push_back({kMax, -kMax, 1.0f, std::ldexp(1.0f, 127), -std::ldexp(1.5f, 126), 0.0f});
  rows.push_back({std::nextafter(2.0f, 0.0f), std::nextafter(1.0f, 0.0f), 0.75f, -0.0f});
  rows.push_back({std::nextafter(std::ldexp(1.0f, -126), 0.0f), std::ldexp(1.0f, -126), -tiny});
  for (const std::vector<float>& row : rows) {
    const int64_t cols = static_cast<int64_t>(row.size());
    const auto input = [&](int64_t, int64_t c) { return Show(row[c]); };
    for (Format format : kAllFormats) {
      for (const QuantizeOptions& options : AllOptions()) {
        const QuantizedMatrix want = mx::QuantizeRows(row, 1, cols, format, options).value();
        for (Isa isa : mx::kernels::AvailableIsas()) {
          EXPECT_TRUE(SameMatrix(
              mx::kernels::QuantizeRows(row, 1, cols, format, options, isa).value(), want, input))
              << Describe(format, isa, options) << ", row starting " << Show(row[0]);
        }
      }
    }
  }
}

// --- BF16 and FP16 inputs ---

class QuantizeFastHalf : public testing::TestWithParam<Format> {};

// Every 16-bit code in order, as one row (2048 blocks of neighbouring codes), and
// then shuffled into rows of ragged length; then random codes from a narrow
// exponent range, so that blocks hold no NaN.
TEST_P(QuantizeFastHalf, MatchesReferenceBitForBit) {
  const Format source = GetParam();
  std::mt19937_64 rng(source == Format::kBf16 ? 16 : 17);
  std::vector<std::pair<std::vector<uint16_t>, std::pair<int64_t, int64_t>>> cases;
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  cases.push_back({all, {1, 65536}});
  std::shuffle(all.begin(), all.end(), rng);
  cases.push_back({std::vector<uint16_t>(all.begin(), all.begin() + 5 * 100), {5, 100}});
  cases.push_back({std::vector<uint16_t>(all.begin(), all.begin() + 3 * 33), {3, 33}});
  const int exponent_shift = source == Format::kBf16 ? 7 : 10;
  const int max_field = source == Format::kBf16 ? 255 : 31;
  for (int64_t cols : {1, 31, 32, 896}) {
    std::vector<uint16_t> codes(static_cast<size_t>(2 * cols));
    // Per block a random exponent window (subnormal codes at field 0).
    for (size_t b = 0; b < codes.size(); b += 32) {
      const int top = std::uniform_int_distribution<int>(1, max_field - 1)(rng);
      for (size_t i = b; i < std::min(codes.size(), b + 32); ++i) {
        const int field = std::max(0, top - std::uniform_int_distribution<int>(0, 12)(rng));
        codes[i] = static_cast<uint16_t>((rng() & 1) << 15 | field << exponent_shift |
                                         (rng() & ((1u << exponent_shift) - 1)));
      }
    }
    cases.push_back({codes, {2, cols}});
  }
  for (const auto& [codes, shape] : cases) {
    const auto [rows, cols] = shape;
    // Copies for the lambda: clang 14 cannot capture structured bindings.
    const auto input = [&codes = codes, cols = cols](int64_t r, int64_t c) {
      return absl::StrCat("code ", Hex(codes[r * cols + c]));
    };
    for (Format format : kAllFormats) {
      for (const QuantizeOptions& options : AllOptions()) {
        const QuantizedMatrix want =
            mx::QuantizeRows(codes, source, rows, cols, format, options).value();
        for (Isa isa : mx::kernels::AvailableIsas()) {
          const QuantizedMatrix got =
              mx::kernels::QuantizeRows(codes, source, rows, cols, format, options, isa).value();
          EXPECT_TRUE(SameMatrix(got, want, input))
              << mx::FormatName(source) << " input, " << Describe(format, isa, options) << ", "
              << rows << "x" << cols;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sources, QuantizeFastHalf, testing::Values(Format::kBf16, Format::kFp16),
                         [](const auto& info) { return std::string(mx::FormatName(info.param)); });

// --- Golden inputs ---

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), values.size() * 4);
  return values;
}

// The golden quantize inputs and matmul operands: the reference reproduces the
// golden outputs (tests/mx/golden_test.cc), so matching it here is enough.
TEST(QuantizeFast, GoldenInputsMatchReference) {
  const std::string& dir = mx_test::kGoldenDir;
  if (!std::ifstream(dir + "/manifest.json")) {
    GTEST_SKIP() << "golden vectors not found at " << dir;
  }
  int inputs = 0;
  for (Format format : {Format::kMxfp8E4m3, Format::kMxfp8E5m2, Format::kMxfp6E3m2,
                        Format::kMxfp6E2m3, Format::kMxfp4E2m1, Format::kMxint8}) {
    const std::string name(mx::FormatName(format));
    for (const char* file : {"main_in.f32", "ragged100_in.f32"}) {
      const std::vector<float> values = ReadFloats(dir + "/quantize/" + name + "/" + file);
      if (values.empty()) continue;
      ++inputs;
      const int64_t n = static_cast<int64_t>(values.size());
      const auto input = [&](int64_t, int64_t c) { return Show(values[c]); };
      const QuantizedMatrix want = mx::QuantizeRows(values, 1, n, format).value();
      for (Isa isa : mx::kernels::AvailableIsas()) {
        EXPECT_TRUE(SameMatrix(mx::kernels::QuantizeRows(values, 1, n, format, {}, isa).value(),
                               want, input))
            << name << "/" << file << " at " << mx::kernels::IsaName(isa);
      }
    }
    for (const auto& [m, k, n] : {std::array<int64_t, 3>{4, 64, 8}, {16, 96, 32}}) {
      const std::string base = absl::StrCat(dir, "/matmul/", name, "/M", m, "_K", k, "_N", n);
      const std::vector<float> a = ReadFloats(base + "/A.f32");
      const std::vector<float> b = ReadFloats(base + "/B.f32");
      if (a.size() != static_cast<size_t>(m * k) || b.size() != static_cast<size_t>(k * n))
        continue;
      ++inputs;
      const auto a_input = [&a, k = k](int64_t r, int64_t c) { return Show(a[r * k + c]); };
      const auto b_input = [&b, n = n](int64_t r, int64_t c) { return Show(b[c * n + r]); };
      const QuantizedMatrix want_a = mx::QuantizeRows(a, m, k, format).value();
      const QuantizedMatrix want_b = mx::QuantizeColumns(b, k, n, format).value();
      for (Isa isa : mx::kernels::AvailableIsas()) {
        EXPECT_TRUE(SameMatrix(mx::kernels::QuantizeRows(a, m, k, format, {}, isa).value(), want_a,
                               a_input))
            << base << " A at " << mx::kernels::IsaName(isa);
        EXPECT_TRUE(SameMatrix(mx::kernels::QuantizeColumns(b, k, n, format, {}, isa).value(),
                               want_b, b_input))
            << base << " B at " << mx::kernels::IsaName(isa);
      }
    }
  }
  EXPECT_GT(inputs, 0) << "no golden inputs read from " << dir;
}

// --- Shapes and errors ---

TEST(QuantizeFast, EmptyShapesMatchReference) {
  const std::vector<float> none;
  const auto input = [](int64_t, int64_t) { return std::string("-"); };
  for (Format format : kAllFormats) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{0, 0}, {0, 5}, {3, 0}}) {
      for (Isa isa : mx::kernels::AvailableIsas()) {
        EXPECT_TRUE(SameMatrix(mx::kernels::QuantizeRows(none, rows, cols, format, {}, isa).value(),
                               mx::QuantizeRows(none, rows, cols, format).value(), input))
            << mx::FormatName(format) << " " << rows << "x" << cols;
        EXPECT_TRUE(
            SameMatrix(mx::kernels::QuantizeColumns(none, rows, cols, format, {}, isa).value(),
                       mx::QuantizeColumns(none, rows, cols, format).value(), input))
            << mx::FormatName(format) << " columns " << rows << "x" << cols;
      }
    }
  }
}

TEST(QuantizeFast, ErrorsMatchReference) {
  const std::vector<float> six(6, 1.0f);
  const std::vector<uint16_t> six_codes(6, 0x3C00);
  const int64_t big = (int64_t{1} << 31) + 1;
  for (Isa isa : mx::kernels::AvailableIsas()) {
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{2, 4}, {-1, 6}, {6, -1}, {big, 0}, {1, 7}}) {
      const absl::Status want = mx::QuantizeRows(six, rows, cols, Format::kMxfp4E2m1).status();
      ASSERT_FALSE(want.ok());
      EXPECT_EQ(mx::kernels::QuantizeRows(six, rows, cols, Format::kMxfp4E2m1, {}, isa).status(),
                want);
      EXPECT_EQ(mx::kernels::QuantizeColumns(six, rows, cols, Format::kInt8, {}, isa).status(),
                mx::QuantizeColumns(six, rows, cols, Format::kInt8).status());
      EXPECT_EQ(
          mx::kernels::QuantizeRows(six_codes, Format::kFp16, rows, cols, Format::kMxint8, {}, isa)
              .status(),
          mx::QuantizeRows(six_codes, Format::kFp16, rows, cols, Format::kMxint8).status());
    }
    for (Format source : {Format::kFp32, Format::kMxfp8E4m3, Format::kInt8}) {
      const absl::Status want = mx::QuantizeRows(six_codes, source, 2, 3, Format::kFp32).status();
      EXPECT_EQ(want.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(mx::kernels::QuantizeRows(six_codes, source, 2, 3, Format::kFp32, {}, isa).status(),
                want);
    }
  }
}

// The compile-time element shapes of the kernels are the format table's.
TEST(QuantizeFast, ElementShapesMatchTraits) {
  using mx::kernels::internal::ElementShape;
  const std::pair<Format, ElementShape> shapes[] = {
      {Format::kMxfp8E4m3, mx::kernels::internal::kE4m3},
      {Format::kMxfp8E5m2, mx::kernels::internal::kE5m2},
      {Format::kMxfp6E3m2, mx::kernels::internal::kE3m2},
      {Format::kMxfp6E2m3, mx::kernels::internal::kE2m3},
      {Format::kMxfp4E2m1, mx::kernels::internal::kE2m1},
  };
  for (const auto& [format, shape] : shapes) {
    const mx::FormatTraits& t = mx::Traits(format);
    EXPECT_EQ(shape.exponent_bits, t.exponent_bits) << t.name;
    EXPECT_EQ(shape.mantissa_bits, t.mantissa_bits) << t.name;
    EXPECT_EQ(shape.bias, t.exponent_bias) << t.name;
    EXPECT_EQ(shape.emax, t.emax) << t.name;
    EXPECT_EQ(shape.max_normal, t.max_normal) << t.name;
  }
}

// The default level (the best available, or MX_ISA's) gives the same bits.
TEST(QuantizeFast, DefaultIsaMatchesReference) {
  InputMaker maker(7);
  const std::vector<float> values = maker.Make(Distribution::kGaussian, Format::kMxfp4E2m1, 3, 70);
  const auto input = [&](int64_t r, int64_t c) { return Show(values[r * 70 + c]); };
  for (Format format : kAllFormats) {
    EXPECT_TRUE(SameMatrix(mx::kernels::QuantizeRows(values, 3, 70, format).value(),
                           mx::QuantizeRows(values, 3, 70, format).value(), input))
        << mx::FormatName(format);
  }
}

// Split across a pool: rows in tasks of whole rows, columns in tasks of panels,
// BF16 input too. Sizes give several tasks, the last one short. The bits must not
// depend on the split.
TEST(QuantizeFast, PoolSplitMatchesReference) {
  mx::kernels::ThreadPool pool(2);
  InputMaker maker(8);
  const int64_t rows = 301, cols = 230;  // 142 rows per task: three tasks, one of 17
  const std::vector<float> values =
      maker.Make(Distribution::kGaussian, Format::kMxfp8E4m3, rows, cols);
  std::vector<uint16_t> bf16(values.size());
  for (size_t i = 0; i < values.size(); ++i) bf16[i] = static_cast<uint16_t>(Bits(values[i]) >> 16);
  const auto input = [&](int64_t r, int64_t c) { return Show(values[r * cols + c]); };
  const auto column_input = [&](int64_t r, int64_t c) { return Show(values[c * cols + r]); };
  const auto bf16_input = [&](int64_t r, int64_t c) { return Hex(bf16[r * cols + c]); };
  const Isa isa = mx::kernels::DefaultIsa();
  for (Format format : kAllFormats) {
    SCOPED_TRACE(mx::FormatName(format));
    EXPECT_TRUE(SameMatrix(
        mx::kernels::QuantizeRows(values, rows, cols, format, {}, isa, &pool).value(),
        mx::QuantizeRows(values, rows, cols, format).value(), input));
    // K = 301 rows of the input, N = 230 columns: 15 panels, 6 per task.
    EXPECT_TRUE(SameMatrix(
        mx::kernels::QuantizeColumns(values, rows, cols, format, {}, isa, &pool).value(),
        mx::QuantizeColumns(values, rows, cols, format).value(), column_input));
    EXPECT_TRUE(SameMatrix(
        mx::kernels::QuantizeRows(bf16, Format::kBf16, rows, cols, format, {}, isa, &pool).value(),
        mx::QuantizeRows(bf16, Format::kBf16, rows, cols, format).value(), bf16_input));
  }
}

}  // namespace

// tests/golden/nvfp4.json — NVFP4 quantization and the NVFP4 × NVFP4 GEMM, written
// by an exact rational model of the recipe (tests/golden/make_nvfp4_vectors.py)
// that shares no code with mx/ — reproduced bit for bit by the reference, by the
// fast quantizers and GEMM kernels at every ISA level this CPU runs, by rows and
// by columns, on one thread and split across a pool. Also the layout's sizes and
// the tensor scale's edge cases.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"
#include "mx/quantize.h"
#include "mx/reference_gemm.h"
#include "nlohmann/json.hpp"
#include "tests/golden_json.h"
#include "tests/same_bits.h"

namespace {

using mx::Format;
using mx_test::HexFloats;

const nlohmann::json& Golden() {
  static const nlohmann::json* json =
      new nlohmann::json(mx_test::LoadGolden(MXSERVE_SOURCE_DIR "/tests/golden/nvfp4.json"));
  return *json;
}

// The case's bytes: scales, codes (one per element), and the tensor scale per row.
void ExpectCase(const mx::QuantizedMatrix& m, const nlohmann::json& c, const std::string& where) {
  const int64_t rows = c.at("rows"), cols = c.at("cols");
  ASSERT_EQ(m.format, Format::kNvfp4) << where;
  ASSERT_TRUE(mx::ValidateLayout(m).ok()) << where;
  EXPECT_EQ(m.block_scales, c.at("scales").get<std::vector<uint8_t>>()) << where;
  const std::vector<uint8_t> codes = c.at("codes").get<std::vector<uint8_t>>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      ASSERT_EQ(mx::ElementCode(m, r, k), codes[r * cols + k]) << where << " at " << r << ", " << k;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(m.row_scales[r]),
              std::stoul(c.at("tensor_scale").get<std::string>(), nullptr, 16))
        << where << " row " << r;
  }
}

TEST(Nvfp4Golden, EveryQuantizerWritesEveryCase) {
  ASSERT_GE(Golden().at("quantize").size(), 9u);
  mx::kernels::ThreadPool pool(2);
  for (const nlohmann::json& c : Golden().at("quantize")) {
    const std::string id = c.at("id");
    const int64_t rows = c.at("rows"), cols = c.at("cols");
    const std::vector<float> values = HexFloats(c.at("values"));
    mx::QuantizeOptions options;
    if (c.at("given_tensor_scale").get<bool>()) {
      options.tensor_scale = HexFloats(nlohmann::json::array({c.at("tensor_scale")}))[0];
    }
    ExpectCase(*mx::QuantizeRows(values, rows, cols, Format::kNvfp4, options), c, id + " reference");
    // By columns: the transpose, quantized along its columns, is the same matrix.
    std::vector<float> transposed(values.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) transposed[k * rows + r] = values[r * cols + k];
    }
    ExpectCase(*mx::QuantizeColumns(transposed, cols, rows, Format::kNvfp4, options), c,
               id + " reference by columns");
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      const std::string where = absl::StrCat(id, " ", mx::kernels::IsaName(isa));
      ExpectCase(*mx::kernels::QuantizeRows(values, rows, cols, Format::kNvfp4, options, isa, &pool),
                 c, where);
      ExpectCase(*mx::kernels::QuantizeColumns(transposed, cols, rows, Format::kNvfp4, options,
                                               isa, &pool),
                 c, where + " by columns");
    }
  }
}

TEST(Nvfp4Golden, EveryGemmGivesEveryCase) {
  ASSERT_GE(Golden().at("gemm").size(), 3u);
  mx::kernels::ThreadPool pool(2);
  for (const nlohmann::json& c : Golden().at("gemm")) {
    const std::string id = c.at("id");
    const int64_t m = c.at("m"), k = c.at("k"), n = c.at("n");
    const std::vector<float> a = HexFloats(c.at("a")), b = HexFloats(c.at("b"));
    const std::vector<float> want = HexFloats(c.at("c")), bias = mx_test::HexFloatsOrEmpty(c.at("bias"));
    const mx::QuantizedMatrix qa = *mx::QuantizeRows(a, m, k, Format::kNvfp4);
    const mx::QuantizedMatrix qb = *mx::QuantizeColumns(b, k, n, Format::kNvfp4);
    EXPECT_TRUE(mx_test::SameBitsAll(*mx::ReferenceLinear(qa, qb, bias), want)) << id;
    if (bias.empty()) {
      EXPECT_TRUE(mx_test::SameBitsAll(
          *mx::ReferenceGemm(a, Format::kNvfp4, b, Format::kNvfp4, m, k, n), want))
          << id;
    }
    const mx::kernels::PackedWeight w = *mx::kernels::PackedWeight::Pack(qb);
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      std::vector<float> y(m * n);
      const auto info = mx::kernels::Linear(qa, w, bias, y, {.isa = isa, .pool = &pool});
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_TRUE(mx_test::SameBitsAll(y, want)) << id << " " << info->name;
      EXPECT_EQ(info->name, mx::kernels::KernelNameFor(Format::kNvfp4, Format::kNvfp4, isa));
      // The weight unpacked from its panels is the one packed (a −0 element may
      // come back as +0, as for MX).
      const mx::QuantizedMatrix back = w.Unpacked();
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          const uint32_t code = mx::ElementCode(qb, r, c);
          ASSERT_EQ(mx::ElementCode(back, r, c), code == 8 ? 0u : code) << id;
        }
      }
      EXPECT_EQ(back.block_scales, qb.block_scales) << id;
      EXPECT_EQ(back.row_scales, qb.row_scales) << id;
    }
  }
}

// Whole panels of 16 outputs with a bias, several tasks of rows, NaN blocks and
// operands of different tensor scales: every level, on a pool, gives the
// reference's bits.
TEST(Nvfp4, KernelsMatchTheReferenceOnWholePanels) {
  const int64_t m = 300, k = 80, n = 37;
  std::vector<float> x(m * k), w(n * k), bias(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * i) * std::ldexp(1.0f, i % 9 - 4);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11f * i) * 0.05f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * i - 3.0f;
  x[7] = NAN;
  const auto qx = *mx::QuantizeRows(x, m, k, Format::kNvfp4);
  const auto qw = *mx::QuantizeRows(w, n, k, Format::kNvfp4);
  ASSERT_NE(qx.row_scales[0], qw.row_scales[0]);
  // By columns, in several panels of 16 and tasks: the reference's bytes.
  std::vector<float> wt(k * n);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) wt[i * n + j] = w[j * k + i];
  }
  for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
    mx::kernels::ThreadPool columns_pool(2);
    const auto fast = *mx::kernels::QuantizeColumns(wt, k, n, Format::kNvfp4, {}, isa, &columns_pool);
    EXPECT_EQ(fast.elements, qw.elements) << mx::kernels::IsaName(isa);
    EXPECT_EQ(fast.block_scales, qw.block_scales) << mx::kernels::IsaName(isa);
    EXPECT_EQ(fast.row_scales, qw.row_scales) << mx::kernels::IsaName(isa);
  }
  const std::vector<float> want = *mx::ReferenceLinear(qx, qw, bias);
  const mx::kernels::PackedWeight packed = *mx::kernels::PackedWeight::Pack(qw);
  mx::kernels::ThreadPool pool(2);
  for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
    std::vector<float> y(m * n);
    ASSERT_TRUE(mx::kernels::Linear(qx, packed, bias, y, {.isa = isa, .pool = &pool}).ok());
    EXPECT_TRUE(mx_test::SameBitsAll(y, want)) << mx::kernels::IsaName(isa);
    EXPECT_TRUE(std::isnan(y[0]));
  }
}

// Codes a client packed into the padding of a short last block count, as for
// MX: the fast kernels multiply them as the reference does. And a tensor scale
// that is not positive and finite is computed, by every quantizer alike.
TEST(Nvfp4, PaddingCodesAndGivenTensorScalesAgreeEverywhere) {
  std::vector<float> xv(2 * 20), wv(3 * 20);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.3f * static_cast<float>(i % 7) - 1.0f;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.2f * static_cast<float>(i % 5) - 0.4f;
  mx::QuantizedMatrix x = *mx::QuantizeRows(xv, 2, 20, Format::kNvfp4);
  mx::QuantizedMatrix w = *mx::QuantizeRows(wv, 3, 20, Format::kNvfp4);
  // K = 20: elements 20..31 of each row are padding; put codes there (6 and -6).
  for (int64_t r = 0; r < 2; ++r) x.elements[r * 16 + 12] = 0x77;
  for (int64_t r = 0; r < 3; ++r) w.elements[r * 16 + 13] = 0xF7;
  const std::vector<float> want = *mx::ReferenceLinear(x, w);
  for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
    EXPECT_TRUE(mx_test::SameBitsAll(*mx::kernels::Linear(x, w, {}, {.isa = isa}), want))
        << mx::kernels::IsaName(isa);
  }
  for (const float bad : {std::nanf(""), -1.0f, 0.0f, INFINITY}) {
    mx::QuantizeOptions options;
    options.tensor_scale = bad;
    const auto reference = *mx::QuantizeRows(xv, 2, 20, Format::kNvfp4, options);
    EXPECT_EQ(reference.row_scales[0], mx::NvTensorScale(mx::FiniteAmax(xv))) << bad;
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      const auto fast = *mx::kernels::QuantizeRows(xv, 2, 20, Format::kNvfp4, options, isa);
      EXPECT_EQ(fast.block_scales, reference.block_scales) << bad;
      EXPECT_EQ(fast.row_scales, reference.row_scales) << bad;
    }
  }
  // An empty K: the rows still carry the tensor scale of an empty tensor, 1.
  const auto empty = *mx::kernels::QuantizeColumns({}, 0, 3, Format::kNvfp4);
  EXPECT_EQ(empty.row_scales, (std::vector<float>{1.0f, 1.0f, 1.0f}));
  EXPECT_EQ(mx::QuantizeColumns({}, 0, 3, Format::kNvfp4)->row_scales, empty.row_scales);
}

// NVFP4 against another format goes through the float path: both dequantized
// (an NVFP4 value is fp32(element · block scale · tensor scale)), then the fma
// chain; the fast kernels agree with the reference there too.
TEST(Nvfp4, MixedPairsRunTheFloatPathOnEveryLevel) {
  std::vector<float> a(3 * 40), b(40 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.7f * i) * 3.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.3f * i);
  for (const Format other : {Format::kMxfp4E2m1, Format::kBf16, Format::kInt8}) {
    const auto qa = *mx::QuantizeRows(a, 3, 40, Format::kNvfp4);
    const auto qb = *mx::QuantizeColumns(b, 40, 5, other);
    const std::vector<float> want = *mx::ReferenceLinear(qa, qb);
    EXPECT_EQ(mx::GemmPathFor(Format::kNvfp4, other), mx::GemmPath::kFloat);
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      EXPECT_TRUE(mx_test::SameBitsAll(*mx::kernels::Linear(qa, qb, {}, {.isa = isa}), want))
          << mx::FormatName(other) << " " << mx::kernels::IsaName(isa);
    }
  }
}

TEST(Nvfp4, TensorScaleAndLayout) {
  EXPECT_EQ(mx::NvTensorScale(2688.0f), 1.0f);
  EXPECT_EQ(mx::NvTensorScale(0.0f), 1.0f);                   // an all-zero tensor
  EXPECT_EQ(mx::NvTensorScale(std::ldexp(1.0f, -120)), 1.0f);  // the quotient is subnormal
  EXPECT_EQ(mx::NvTensorScale(1.0f), 1.0f / 2688.0f);
  EXPECT_EQ(mx::FiniteAmax(std::vector<float>{1.0f, -3.0f, NAN, INFINITY}), 3.0f);

  EXPECT_EQ(mx::Traits(Format::kNvfp4).block_size(), 16);
  EXPECT_EQ(mx::BlockBytes(Format::kNvfp4), 8);
  EXPECT_EQ(mx::RowBytes(Format::kNvfp4, 33), 3 * 8);  // padded to whole blocks
  const auto size = mx::CheckedLayoutSize(Format::kNvfp4, 5, 33);
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(size->element_bytes, 5u * 24u);
  EXPECT_EQ(size->block_scale_bytes, 5u * 3u);
  EXPECT_EQ(size->row_scales, 5u);
  EXPECT_FALSE(mx::CheckedLayoutSize(Format::kNvfp4, int64_t{1} << 62, int64_t{1} << 40));
  mx::QuantizedMatrix m = mx::AllocateQuantized(Format::kNvfp4, 5, 33);
  m.row_scales.pop_back();
  EXPECT_EQ(mx::ValidateLayout(m).message(),
            "row_scales (floats): expected 5 for a 5x33 NVFP4 matrix, got 4");

  // One value per block, dequantized: element · block scale · tensor scale.
  const std::vector<float> row = {6.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.75f};
  const auto q = *mx::QuantizeRows(row, 1, 17, Format::kNvfp4);
  const float ts = 6.0f / 2688.0f;
  EXPECT_EQ(q.row_scales[0], ts);
  EXPECT_EQ(mx::ElementValue(q, 0, 0), 6.0f * 448.0f * ts);  // block scale 448
  // Block 1: amax 0.75 -> s = fp32(0.125 / ts) = 56 -> UE4M3 56, element 0.75/(56 ts).
  EXPECT_EQ(mx::Dequantize(q)[16], mx::ElementValue(q, 0, 16));
  EXPECT_NEAR(mx::ElementValue(q, 0, 16), 0.75f, 0.75f / 4);
}

}  // namespace

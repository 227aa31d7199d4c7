// tests/golden/lobcq.json — LO-BCQ: the LO_BCQ format's quantization (codes,
// codebook selectors and FP32 scales per array of 64), the quantizer at other
// geometries with other codebooks, and LO_BCQ GEMMs on the float path, written
// by an exact rational model (tests/golden/make_lobcq_vectors.py) that shares no
// code with mx/ — reproduced bit for bit by the reference quantizer and GEMM and
// by the fast quantizers and kernels at every ISA level this CPU runs, by rows
// and by columns, on one thread and across a pool.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/kernels/thread_pool.h"
#include "mx/lobcq.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "nlohmann/json.hpp"
#include "tests/golden_json.h"
#include "tests/mx/kernels/golden_gemm.h"
#include "tests/same_bits.h"

namespace {

using mx::Format;
using mx_test::HexFloats;

const nlohmann::json& Golden() {
  static const nlohmann::json* json =
      new nlohmann::json(mx_test::LoadGolden(MXSERVE_SOURCE_DIR "/tests/golden/lobcq.json"));
  return *json;
}

std::vector<mx::LoBcqCodebook> Books(const nlohmann::json& j) {
  std::vector<mx::LoBcqCodebook> books;
  for (const nlohmann::json& row : j) {
    mx::LoBcqCodebook book{};
    for (int k = 0; k < 16; ++k) book[k] = static_cast<int8_t>(row.at(k).get<int>());
    books.push_back(book);
  }
  return books;
}

mx::LoBcqGeometry GeometryOf(const nlohmann::json& c) {
  const nlohmann::json& g = c.at("geometry");
  return {.block_len = g.at("block_len"), .array_len = g.at("array_len"),
          .codebooks = g.at("codebooks")};
}

bool IsW4A4(const nlohmann::json& c) {
  const mx::LoBcqGeometry g = GeometryOf(c);
  return c.at("codebooks").is_null() && g.block_len == 8 && g.array_len == 64 && g.codebooks == 16;
}

TEST(LoBcqGolden, TheFrozenCodebooksAreTheGoldenOnes) {
  const std::vector<mx::LoBcqCodebook> want = Books(Golden().at("default_codebooks"));
  const auto have = mx::DefaultLoBcqCodebooks();
  ASSERT_EQ(have.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) EXPECT_EQ(have[j], want[j]) << "codebook " << j;
  EXPECT_TRUE(mx::ValidateLoBcq({}, have).ok());
}

// The quantizer's parameters: every case, array by array, at its geometry.
TEST(LoBcqGolden, TheArrayQuantizerWritesEveryCaseAtEveryGeometry) {
  ASSERT_GE(Golden().at("quantize").size(), 6u);
  for (const nlohmann::json& c : Golden().at("quantize")) {
    const std::string id = c.at("id");
    const mx::LoBcqGeometry g = GeometryOf(c);
    const std::vector<mx::LoBcqCodebook> own =
        c.at("codebooks").is_null() ? std::vector<mx::LoBcqCodebook>() : Books(c.at("codebooks"));
    const std::span<const mx::LoBcqCodebook> books =
        own.empty() ? mx::DefaultLoBcqCodebooks() : std::span<const mx::LoBcqCodebook>(own);
    ASSERT_TRUE(mx::ValidateLoBcq(g, books).ok()) << id;
    const int64_t rows = c.at("rows"), cols = c.at("cols");
    const std::vector<float> values = HexFloats(c.at("values"));
    const std::vector<uint8_t> codes = c.at("codes").get<std::vector<uint8_t>>();
    const std::vector<uint8_t> selectors = c.at("selectors").get<std::vector<uint8_t>>();
    const std::vector<float> scales = HexFloats(c.at("scales"));
    const int64_t arrays = (cols + g.array_len - 1) / g.array_len;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t a = 0; a < arrays; ++a) {
        const int64_t begin = a * g.array_len, count = std::min<int64_t>(g.array_len, cols - begin);
        std::vector<uint8_t> got_codes(count), got_selectors(g.blocks_per_array());
        const float scale = *mx::QuantizeLoBcqArray(
            g, books, std::span<const float>(values.data() + r * cols + begin, count), got_codes,
            got_selectors);
        const std::string where = absl::StrCat(id, " row ", r, " array ", a);
        EXPECT_TRUE(mx_test::SameBits(scale, scales[r * arrays + a])) << where;
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(got_codes[i], codes[r * cols + begin + i]) << where << " value " << i;
        }
        for (int b = 0; b < g.blocks_per_array(); ++b) {
          ASSERT_EQ(got_selectors[b], selectors[(r * arrays + a) * g.blocks_per_array() + b])
              << where << " block " << b;
        }
      }
    }
  }
}

void ExpectFormatCase(const mx::QuantizedMatrix& m, const nlohmann::json& c,
                      const std::string& where) {
  const int64_t rows = c.at("rows"), cols = c.at("cols");
  ASSERT_TRUE(mx::ValidateLayout(m).ok()) << where;
  const std::vector<uint8_t> codes = c.at("codes").get<std::vector<uint8_t>>();
  const std::vector<uint8_t> selectors = c.at("selectors").get<std::vector<uint8_t>>();
  const std::vector<float> scales = HexFloats(c.at("scales"));
  const int64_t arrays = mx::BlocksPerRow(m.format, cols);
  ASSERT_EQ(static_cast<int64_t>(scales.size()), rows * arrays) << where;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      ASSERT_EQ(mx::ElementCode(m, r, k), codes[r * cols + k]) << where << " at " << r << ", " << k;
      ASSERT_EQ(mx::LoBcqSelector(m, r, k),
                selectors[(r * arrays + k / 64) * 8 + (k % 64) / 8])
          << where << " at " << r << ", " << k;
    }
    for (int64_t a = 0; a < arrays; ++a) {
      EXPECT_TRUE(mx_test::SameBits(mx::LookupScale(m, r, a), scales[r * arrays + a]))
          << where << " array " << r << ", " << a;
    }
  }
}

TEST(LoBcqGolden, EveryQuantizerWritesEveryFormatCase) {
  mx::kernels::ThreadPool pool(2);
  int checked = 0;
  for (const nlohmann::json& c : Golden().at("quantize")) {
    if (!IsW4A4(c)) continue;
    ++checked;
    const std::string id = c.at("id");
    const int64_t rows = c.at("rows"), cols = c.at("cols");
    const std::vector<float> values = HexFloats(c.at("values"));
    ExpectFormatCase(*mx::QuantizeRows(values, rows, cols, Format::kLoBcq), c, id + " reference");
    std::vector<float> transposed(values.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) transposed[k * rows + r] = values[r * cols + k];
    }
    ExpectFormatCase(*mx::QuantizeColumns(transposed, cols, rows, Format::kLoBcq), c,
                     id + " by columns");
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      const std::string where = absl::StrCat(id, " ", mx::kernels::IsaName(isa));
      ExpectFormatCase(*mx::kernels::QuantizeRows(values, rows, cols, Format::kLoBcq, {}, isa, &pool),
                       c, where);
      ExpectFormatCase(
          *mx::kernels::QuantizeColumns(transposed, cols, rows, Format::kLoBcq, {}, isa, &pool), c,
          where + " by columns");
    }
    // The rounding modes do not apply: stochastic rounding writes the same bytes.
    const mx::QuantizeOptions stochastic{.rounding = mx::Rounding::kStochastic, .seed = 9};
    ExpectFormatCase(*mx::QuantizeRows(values, rows, cols, Format::kLoBcq, stochastic), c,
                     id + " stochastic");
  }
  EXPECT_GE(checked, 4);
}

TEST(LoBcqGolden, EveryGemmGivesEveryCase) {
  ASSERT_GE(Golden().at("gemm").size(), 2u);
  mx_test::ExpectEveryGoldenGemm(Golden().at("gemm"));
}

TEST(LoBcq, GeometryAndCodebooksAreChecked) {
  const auto books = mx::DefaultLoBcqCodebooks();
  EXPECT_EQ(mx::ValidateLoBcq({.block_len = 0}, books).message(),
            "block_len: expected 1 to 64, got 0");
  EXPECT_EQ(mx::ValidateLoBcq({.block_len = 8, .array_len = 60}, books).message(),
            "array_len: expected a multiple of block_len (8) up to 256, got 60");
  EXPECT_EQ(mx::ValidateLoBcq({.codebooks = 17}, books).message(),
            "codebooks: expected 1 to 16 codebooks, got 17");
  EXPECT_EQ(mx::ValidateLoBcq({.codebooks = 4}, books).message(),
            "codebooks: expected 4 codebooks, got 16");
  std::vector<mx::LoBcqCodebook> bad(books.begin(), books.end());
  bad[3][5] = 32;
  EXPECT_EQ(mx::ValidateLoBcq({}, bad).message(),
            "codebooks[3][5]: expected an INT6 entry in [-31, 31], got 32");
  // The array quantizer checks what it is given instead of overrunning.
  std::vector<float> values(65, 1.0f);
  std::vector<uint8_t> codes(65), selectors(8);
  EXPECT_EQ(mx::QuantizeLoBcqArray({}, books, values, codes, selectors).status().message(),
            "values: expected at most array_len (64), got 65");
  EXPECT_EQ(mx::QuantizeLoBcqArray({}, books, std::span<const float>(values.data(), 64),
                                   std::span<uint8_t>(codes.data(), 64),
                                   std::span<uint8_t>(selectors.data(), 7))
                .status()
                .message(),
            "codes, selectors: expected 64 and 8, got 64 and 7");
  EXPECT_EQ(mx::QuantizeLoBcqArray({}, bad, std::span<const float>(values.data(), 8),
                                   std::span<uint8_t>(codes.data(), 8), selectors)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::isnan(mx::LoBcqValue(std::span(books.data(), 4), 4, 0, 1.0f)));
  // The format's traits: 4-bit codes, 8 scale bytes per 64 (5 bits per value).
  const mx::FormatTraits& t = mx::Traits(Format::kLoBcq);
  EXPECT_TRUE(t.is_lookup());
  EXPECT_EQ(t.block_size(), 64);
  EXPECT_EQ(t.block_scale_bytes(), 8);
  EXPECT_EQ(mx::ParseFormat("lo_bcq").value(), Format::kLoBcq);
  // max_normal and min_subnormal: the frozen set's largest and smallest positive
  // entries (the values at scale 1).
  int largest = 0, smallest = 99;
  for (const mx::LoBcqCodebook& book : books) {
    for (int8_t e : book) {
      largest = std::max(largest, std::abs(int{e}));
      if (e > 0) smallest = std::min(smallest, int{e});
    }
  }
  EXPECT_EQ(t.max_normal, largest);
  EXPECT_EQ(t.min_subnormal, smallest);
}

}  // namespace

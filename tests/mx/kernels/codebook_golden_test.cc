// tests/golden/codebook.json — NF4 and bitsandbytes FP4: quantization (codes and
// FP32 absmax per block of 64) and their GEMM on the float path, written by an
// exact rational model (tests/golden/make_codebook_vectors.py) that shares no
// code with mx/ — reproduced bit for bit by the reference quantizer and GEMM and
// by the fast quantizers and kernels at every ISA level this CPU runs, by rows
// and by columns, on one thread and across a pool.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/codebook.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/kernels/thread_pool.h"
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
      new nlohmann::json(mx_test::LoadGolden(MXSERVE_SOURCE_DIR "/tests/golden/codebook.json"));
  return *json;
}

void ExpectCase(const mx::QuantizedMatrix& m, const nlohmann::json& c, const std::string& where) {
  const int64_t rows = c.at("rows"), cols = c.at("cols");
  ASSERT_TRUE(mx::ValidateLayout(m).ok()) << where;
  const std::vector<uint8_t> codes = c.at("codes").get<std::vector<uint8_t>>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      ASSERT_EQ(mx::ElementCode(m, r, k), codes[r * cols + k]) << where << " at " << r << ", " << k;
    }
  }
  const std::vector<float> absmax = HexFloats(c.at("absmax"));
  const int64_t blocks = mx::BlocksPerRow(m.format, cols);
  ASSERT_EQ(static_cast<int64_t>(absmax.size()), rows * blocks) << where;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      EXPECT_TRUE(mx_test::SameBits(mx::LookupScale(m, r, b), absmax[r * blocks + b]))
          << where << " block " << r << ", " << b;
    }
  }
}

TEST(CodebookGolden, EveryQuantizerWritesEveryCase) {
  ASSERT_GE(Golden().at("quantize").size(), 8u);
  mx::kernels::ThreadPool pool(2);
  for (const nlohmann::json& c : Golden().at("quantize")) {
    const std::string id = c.at("id");
    const Format format = mx::ParseFormat(c.at("format").get<std::string>()).value();
    const int64_t rows = c.at("rows"), cols = c.at("cols");
    const std::vector<float> values = HexFloats(c.at("values"));
    ExpectCase(*mx::QuantizeRows(values, rows, cols, format), c, id + " reference");
    std::vector<float> transposed(values.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) transposed[k * rows + r] = values[r * cols + k];
    }
    ExpectCase(*mx::QuantizeColumns(transposed, cols, rows, format), c, id + " by columns");
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      const std::string where = absl::StrCat(id, " ", mx::kernels::IsaName(isa));
      ExpectCase(*mx::kernels::QuantizeRows(values, rows, cols, format, {}, isa, &pool), c, where);
      ExpectCase(*mx::kernels::QuantizeColumns(transposed, cols, rows, format, {}, isa, &pool), c,
                 where + " by columns");
    }
    // The rounding modes do not apply: stochastic rounding writes the same bytes.
    const mx::QuantizeOptions stochastic{.rounding = mx::Rounding::kStochastic, .seed = 9};
    ExpectCase(*mx::QuantizeRows(values, rows, cols, format, stochastic), c, id + " stochastic");
  }
}

TEST(CodebookGolden, EveryGemmGivesEveryCase) {
  ASSERT_GE(Golden().at("gemm").size(), 3u);
  mx_test::ExpectEveryGoldenGemm(Golden().at("gemm"));
}

// The tables and thresholds the contract states, pinned by hand.
TEST(Codebook, TablesAndTiesAreBitsandbytes) {
  EXPECT_EQ(mx::CodebookTable(Format::kNf4)[7], 0.0f);
  EXPECT_EQ(mx::CodebookTable(Format::kNf4)[15], 1.0f);
  EXPECT_EQ(mx::CodebookTable(Format::kBnbFp4)[0b0011], 1.0f);
  EXPECT_EQ(mx::CodebookTable(Format::kBnbFp4)[0b0001], 1.0f / 192.0f);
  EXPECT_EQ(mx::CodebookTable(Format::kBnbFp4)[0b1101], -0.5f);
  // NF4: 0.8614784 lies on the 0.7229568 | 1.0 threshold and stays down.
  const float top = static_cast<float>((0.7229568362236023 + 1.0) / 2.0);
  EXPECT_EQ(mx::CodebookCode(Format::kNf4, top), 14);
  EXPECT_EQ(mx::CodebookCode(Format::kNf4, std::nextafter(top, 2.0f)), 15);
  // FP4: bitsandbytes' literal thresholds, not the FP32 midpoints: 0.29166667
  // stays at 1/4 and the next float goes to 1/3 (sign from n < 0); 0.5833332
  // lies above 0.583333 and goes to 2/3, though the midpoint of 1/2 and 2/3 is
  // higher; 0.0026041685 lies below 0.00260417 and stays at 0.
  EXPECT_EQ(mx::CodebookCode(Format::kBnbFp4, 0.29166667f), 0b0111);
  EXPECT_EQ(mx::CodebookCode(Format::kBnbFp4, -std::nextafter(0.29166667f, 1.0f)), 0b1100);
  EXPECT_EQ(mx::CodebookCode(Format::kBnbFp4, 0.5833332f), 0b0010);
  EXPECT_EQ(mx::CodebookCode(Format::kBnbFp4, 0.0026041685f), 0b0000);
  EXPECT_TRUE(std::signbit(mx::CodebookTable(Format::kBnbFp4)[8]));  // code 8 is -0
  EXPECT_EQ(mx::CodebookCode(Format::kBnbFp4, -1e-6f), 0b1000);  // bnb's -0
  EXPECT_EQ(mx::CodebookCode(Format::kNf4, -1e-6f), 7);
}

}  // namespace

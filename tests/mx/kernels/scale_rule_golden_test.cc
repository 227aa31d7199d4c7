// tests/golden/scale_rules.json — every MX format under the four scale rules and
// both roundings, written by tests/golden/make_scale_rule_vectors.py, an exact
// rational model of its own — reproduced bit for bit by the reference quantizer
// (mx::QuantizeBlock) and by the fast quantizers at every ISA level this CPU
// runs. (clients/python/tests/test_scale_rules.py holds the trainer-side
// emulator and mxctl to the same file.)
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/quantize_fast.h"
#include "mx/quantize.h"
#include "nlohmann/json.hpp"

namespace {

struct Case {
  std::string where;
  mx::Format format;
  mx::QuantizeOptions options;
  std::array<float, mx::kBlockSize> values;
  uint8_t scale;
  std::array<uint8_t, mx::kBlockSize> codes;
};

std::vector<Case> LoadCases() {
  std::ifstream in(MXSERVE_SOURCE_DIR "/tests/golden/scale_rules.json");
  EXPECT_TRUE(in.good()) << "tests/golden/scale_rules.json not found";
  if (!in.good()) return {};
  const nlohmann::json json = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const nlohmann::json& c : json.at("cases")) {
    Case k;
    k.format = mx::ParseFormat(c.at("format").get<std::string>()).value();
    k.options.scale_rule = mx::ParseScaleRule(c.at("rule").get<std::string>()).value();
    k.options.rounding = c.at("rounding") == "away" ? mx::Rounding::kNearestAway
                                                    : mx::Rounding::kNearestEven;
    k.where = absl::StrCat(c.at("format").get<std::string>(), " ", c.at("rule").get<std::string>(),
                           " ", c.at("rounding").get<std::string>(), " block '",
                           c.value("block", std::string("?")), "'");
    for (size_t i = 0; i < mx::kBlockSize; ++i) {
      k.values[i] = std::bit_cast<float>(
          static_cast<uint32_t>(std::stoul(c.at("values")[i].get<std::string>(), nullptr, 16)));
      k.codes[i] = c.at("codes")[i].get<uint8_t>();
    }
    k.scale = c.at("scale").get<uint8_t>();
    cases.push_back(std::move(k));
  }
  return cases;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = LoadCases();
  return cases;
}

TEST(ScaleRuleGolden, EveryRuleFormatAndRoundingIsCovered) {
  // 6 formats x 4 rules x 2 roundings, each with its edge blocks.
  std::set<std::tuple<mx::Format, mx::ScaleRule, mx::Rounding>> seen;
  for (const Case& c : Cases()) seen.insert({c.format, c.options.scale_rule, c.options.rounding});
  EXPECT_EQ(seen.size(), 6u * 4u * 2u);
  EXPECT_GE(Cases().size(), 6u * 4u * 2u * 30u);
}

TEST(ScaleRuleGolden, TheReferenceQuantizerWritesEveryCase) {
  for (const Case& c : Cases()) {
    std::array<uint8_t, mx::kBlockSize> codes{};
    EXPECT_EQ(mx::QuantizeBlock(c.format, c.values, codes, c.options), c.scale) << c.where;
    EXPECT_EQ(codes, c.codes) << c.where;
  }
}

TEST(ScaleRuleGolden, EveryFastQuantizerWritesEveryCaseAtEveryIsa) {
  for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
    for (const Case& c : Cases()) {
      const std::string where = absl::StrCat(c.where, " at ", mx::kernels::IsaName(isa));
      const absl::StatusOr<mx::QuantizedMatrix> q =
          mx::kernels::QuantizeRows(c.values, 1, mx::kBlockSize, c.format, c.options, isa);
      ASSERT_TRUE(q.ok()) << where << ": " << q.status();
      EXPECT_EQ(q->block_scales.at(0), c.scale) << where;
      for (int i = 0; i < mx::kBlockSize; ++i) {
        // A NaN block's codes are 0 in the golden set; the packed layout agrees.
        EXPECT_EQ(mx::ElementCode(*q, 0, i), c.codes[i]) << where << ", element " << i;
      }
    }
  }
}

}  // namespace

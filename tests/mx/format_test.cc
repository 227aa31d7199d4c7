#include "mx/format.h"

#include <gtest/gtest.h>

#include <cmath>

#include "mx/element.h"

namespace {

TEST(Format, TableIsInEnumOrderAndNamesRoundTrip) {
  int index = 0;
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    EXPECT_EQ(static_cast<int>(t.format), index++);
    EXPECT_EQ(mx::ParseFormat(t.name).value(), t.format);
  }
  EXPECT_EQ(index, 14);
}

TEST(Format, ParseIsCaseInsensitiveWithAliases) {
  EXPECT_EQ(mx::ParseFormat("mxfp8_e5m2").value(), mx::Format::kMxfp8E5m2);
  EXPECT_EQ(mx::ParseFormat("mxfp8").value(), mx::Format::kMxfp8E4m3);
  EXPECT_EQ(mx::ParseFormat("MxFp6").value(), mx::Format::kMxfp6E2m3);
  EXPECT_EQ(mx::ParseFormat("mxfp4").value(), mx::Format::kMxfp4E2m1);
  EXPECT_EQ(mx::ParseFormat("bf16").value(), mx::Format::kBf16);
  EXPECT_EQ(mx::ParseFormat("int8").value(), mx::Format::kInt8);
}

TEST(Format, UnknownNameIsAnErrorListingTheChoices) {
  const auto parsed = mx::ParseFormat("MXFP5");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("unknown format 'MXFP5'"), absl::string_view::npos);
  EXPECT_NE(parsed.status().message().find("MXFP6_E3M2"), absl::string_view::npos);
}

// The table's numbers agree with what the element codec actually produces.
TEST(Format, TraitsAgreeWithTheCodec) {
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    if (t.format == mx::Format::kFp32) continue;
    // A LO_BCQ code means nothing without its block's codebook: lobcq_golden_test
    // checks its traits against the frozen codebooks.
    if (t.format == mx::Format::kLoBcq) continue;
    SCOPED_TRACE(std::string(t.name));
    double largest = 0.0, smallest = INFINITY;
    for (uint32_t code = 0; code < mx::CodeCount(t.format); ++code) {
      const float v = mx::DecodeElement(t.format, code);
      if (!std::isfinite(v)) continue;
      largest = std::max(largest, double{std::fabs(v)});
      if (v > 0) smallest = std::min(smallest, double{v});
    }
    // The integer formats' unused code 0x80 decodes one step past max normal.
    const double step = t.kind == mx::FormatKind::kMxFloat || t.kind == mx::FormatKind::kFloat ||
                                t.kind == mx::FormatKind::kNvFloat ||
                                t.kind == mx::FormatKind::kCodebook
                            ? 0.0
                            : t.min_subnormal;
    EXPECT_EQ(largest, t.max_normal + step);
    EXPECT_EQ(smallest, t.min_subnormal);
    if (t.kind == mx::FormatKind::kMxFloat) {
      EXPECT_GE(t.max_normal, std::ldexp(1.0, t.emax));  // max normal lies in binade emax
      EXPECT_LT(t.max_normal, std::ldexp(1.0, t.emax + 1));
      EXPECT_EQ(t.min_subnormal, std::ldexp(1.0, -mx::FixedPointFractionBits(t.format)));
    }
  }
}

}  // namespace

#include "mx/format.h"

#include <array>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mx {
namespace {

// ldexp in a constant expression: 2^e for the table below.
constexpr double Pow2(int e) {
  double v = 1.0;
  for (; e > 0; --e) v *= 2.0;
  for (; e < 0; ++e) v /= 2.0;
  return v;
}

constexpr std::array<FormatTraits, kFormatCount> kFormats = {{
    {Format::kMxfp8E4m3, "MXFP8_E4M3", FormatKind::kMxFloat, 8, 4, 3, 7, 8, 448.0, Pow2(-6),
     Pow2(-9), Specials::kNanOnlyE4m3, "no Inf; NaN is S.1111.111"},
    {Format::kMxfp8E5m2, "MXFP8_E5M2", FormatKind::kMxFloat, 8, 5, 2, 15, 15, 57344.0, Pow2(-14),
     Pow2(-16), Specials::kIeee, "Inf is S.11111.00; NaN is S.11111.{01,10,11}"},
    {Format::kMxfp6E3m2, "MXFP6_E3M2", FormatKind::kMxFloat, 6, 3, 2, 3, 4, 28.0, 0.25, 0.0625,
     Specials::kNone, "none: every code is finite"},
    {Format::kMxfp6E2m3, "MXFP6_E2M3", FormatKind::kMxFloat, 6, 2, 3, 1, 2, 7.5, 1.0, 0.125,
     Specials::kNone, "none: every code is finite"},
    {Format::kMxfp4E2m1, "MXFP4_E2M1", FormatKind::kMxFloat, 4, 2, 1, 1, 2, 6.0, 1.0, 0.5,
     Specials::kNone, "none: every code is finite"},
    {Format::kMxint8, "MXINT8", FormatKind::kMxInt, 8, 0, 0, 0, 0, 127.0 / 64.0, 0.0, Pow2(-6),
     Specials::kNone, "none; code 0x80 (-2.0) is never produced"},
    {Format::kInt8, "INT8", FormatKind::kInt8, 8, 0, 0, 0, 0, 127.0, 0.0, 1.0, Specials::kNone,
     "none; codes -127..127, one FP32 scale per row (NaN scale for a non-finite row)"},
    {Format::kBf16, "BF16", FormatKind::kFloat, 16, 8, 7, 127, 127, 3.3895313892515355e38,
     Pow2(-126), Pow2(-133), Specials::kIeee, "IEEE-style Inf and NaN"},
    {Format::kFp16, "FP16", FormatKind::kFloat, 16, 5, 10, 15, 15, 65504.0, Pow2(-14), Pow2(-24),
     Specials::kIeee, "IEEE 754 binary16 Inf and NaN"},
    {Format::kFp32, "FP32", FormatKind::kFloat, 32, 8, 23, 127, 127, 3.4028234663852886e38,
     Pow2(-126), Pow2(-149), Specials::kIeee, "IEEE 754 binary32 Inf and NaN"},
    {Format::kNvfp4, "NVFP4", FormatKind::kNvFloat, 4, 2, 1, 1, 2, 6.0, 1.0, 0.5,
     Specials::kNone,
     "none in elements; a NaN/Inf block gets UE4M3 scale 0x7F (NaN) and zero codes"},
    // Codebooks: elements are table values in [-1, 1] (mx/codebook.h); the
    // smallest positive one is NF4's 0.0796 and bnb FP4's 1/192.
    {Format::kNf4, "NF4", FormatKind::kCodebook, 4, 0, 0, 0, 0, 1.0, 0.0, 0.07958029955625534,
     Specials::kNone, "none in codes; a NaN/Inf block gets absmax NaN and the codes of 0"},
    {Format::kBnbFp4, "BNB_FP4", FormatKind::kCodebook, 4, 0, 0, 0, 0, 1.0, 0.0,
     static_cast<double>(1.0f / 192.0f), Specials::kNone,
     "none in codes; a NaN/Inf block gets absmax NaN and the codes of 0"},
    // LO-BCQ: elements are INT6 codebook entries in [-31, 31] times the array's
    // scale amax / 31 (mx/lobcq.h).
    {Format::kLoBcq, "LO_BCQ", FormatKind::kLoBcq, 4, 0, 0, 0, 0, 31.0, 0.0, 1.0,
     Specials::kNone, "none in codes; a NaN/Inf array gets scale NaN, selectors and codes 0"},
}};

// Traits(format) indexes the table by the enum's value.
constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kFormats.size(); ++i) {
    if (static_cast<size_t>(kFormats[i].format) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kFormats lists every Format once, in the enum's order");

constexpr std::array<FormatAlias, 3> kAliases = {{
    {"MXFP8", Format::kMxfp8E4m3},
    {"MXFP6", Format::kMxfp6E2m3},
    {"MXFP4", Format::kMxfp4E2m1},
}};

}  // namespace

std::span<const FormatTraits> AllFormats() { return kFormats; }

std::span<const FormatAlias> FormatAliases() { return kAliases; }

const FormatTraits& Traits(Format format) { return kFormats[static_cast<size_t>(format)]; }

absl::string_view FormatNameList() {
  static const std::string* list = [] {
    auto* s = new std::string;
    for (const FormatTraits& t : kFormats) absl::StrAppend(s, s->empty() ? "" : ", ", t.name);
    absl::StrAppend(s, " (or mxfp8, mxfp6, mxfp4)");
    return s;
  }();
  return *list;
}

absl::StatusOr<Format> ParseFormat(absl::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(name);
  for (const FormatTraits& t : kFormats) {
    if (upper == t.name) return t.format;
  }
  for (const FormatAlias& a : kAliases) {
    if (upper == a.name) return a.format;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown format '", name, "'; expected one of ", FormatNameList()));
}

}  // namespace mx

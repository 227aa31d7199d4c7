#include "proto/convert/formats.h"

#include <array>
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "proto/convert/enums.h"

namespace mxserve {
namespace {

struct WireFormat {
  mx::Format mx;
  v1::Format wire;
};

// Indexed by mx::Format.
constexpr std::array<WireFormat, mx::kFormatCount> kWireFormats = {{
    {mx::Format::kMxfp8E4m3, v1::FORMAT_MXFP8_E4M3},
    {mx::Format::kMxfp8E5m2, v1::FORMAT_MXFP8_E5M2},
    {mx::Format::kMxfp6E3m2, v1::FORMAT_MXFP6_E3M2},
    {mx::Format::kMxfp6E2m3, v1::FORMAT_MXFP6_E2M3},
    {mx::Format::kMxfp4E2m1, v1::FORMAT_MXFP4_E2M1},
    {mx::Format::kMxint8, v1::FORMAT_MXINT8},
    {mx::Format::kInt8, v1::FORMAT_INT8},
    {mx::Format::kBf16, v1::FORMAT_BF16},
    {mx::Format::kFp16, v1::FORMAT_FP16},
    {mx::Format::kFp32, v1::FORMAT_FP32},
    {mx::Format::kNvfp4, v1::FORMAT_NVFP4},
    {mx::Format::kNf4, v1::FORMAT_NF4},
    {mx::Format::kBnbFp4, v1::FORMAT_BNB_FP4},
    {mx::Format::kLoBcq, v1::FORMAT_LO_BCQ},
}};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kWireFormats.size(); ++i) {
    if (static_cast<size_t>(kWireFormats[i].mx) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kWireFormats lists every mx::Format once, in the enum's order");
// Every wire value but FORMAT_UNSPECIFIED names one mx format (proto_test checks
// the names).
static_assert(v1::Format_MIN == v1::FORMAT_UNSPECIFIED && v1::Format_MAX == mx::kFormatCount,
              "mxserve.v1.Format and mx::Format have the same formats");

}  // namespace

v1::Format ToProto(mx::Format format) { return kWireFormats[static_cast<size_t>(format)].wire; }

std::optional<mx::Format> ToMx(v1::Format format) {
  for (const WireFormat& f : kWireFormats) {
    if (f.wire == format) return f.mx;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<mx::Format>> FromProto(v1::Format format, absl::string_view field) {
  if (format == v1::FORMAT_UNSPECIFIED) return std::optional<mx::Format>();
  const std::optional<mx::Format> mx_format = ToMx(format);
  if (!mx_format) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": unknown format value ",
                                                   static_cast<int>(format), "; expected one of ",
                                                   mx::FormatNameList()));
  }
  return mx_format;
}

namespace {

const EnumMap<mx::ScaleRule, v1::ScaleRule>& ScaleRules() {
  static const EnumMap<mx::ScaleRule, v1::ScaleRule> map(mx::kAllScaleRules, mx::ScaleRuleName);
  return map;
}

const EnumMap<mx::Rounding, v1::Rounding>& Roundings() {
  static const EnumMap<mx::Rounding, v1::Rounding> map(mx::kAllRoundings, mx::RoundingName);
  return map;
}

}  // namespace

v1::Rounding ToProto(mx::Rounding rounding) { return Roundings().ToWire(rounding); }

std::optional<mx::Rounding> ToMx(v1::Rounding rounding) { return Roundings().FromWire(rounding); }

v1::ScaleRule ToProto(mx::ScaleRule rule) { return ScaleRules().ToWire(rule); }

std::optional<mx::ScaleRule> ToMx(v1::ScaleRule rule) { return ScaleRules().FromWire(rule); }

}  // namespace mxserve

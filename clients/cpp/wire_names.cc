#include "clients/cpp/wire_names.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mxclient {

absl::StatusOr<v1::Phase> ParsePhase(absl::string_view name) {
  const std::optional<v1::Phase> phase = ::mxserve::ParseWireName<v1::Phase>(name);
  if (phase && *phase != v1::PHASE_UNSPECIFIED) return *phase;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown phase '", name, "'; expected ",
                   ::mxserve::WireNameList(::mxserve::DescriptorOf<v1::Phase>(), /*full=*/false)));
}

absl::StatusOr<v1::Format> ParseWireFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "policy" || lower == "auto") return v1::FORMAT_UNSPECIFIED;
  absl::string_view bare = name;
  if (absl::StartsWithIgnoreCase(bare, "format_")) bare.remove_prefix(7);
  absl::StatusOr<mx::Format> format = mx::ParseFormat(bare);
  if (!format.ok()) return format.status();
  return ::mxserve::ToProto(*format);
}

std::string WireFormatName(v1::Format format) {
  if (format == v1::FORMAT_UNSPECIFIED) return "policy";
  const std::optional<mx::Format> mx_format = ::mxserve::ToMx(format);
  if (!mx_format) return absl::StrCat("format#", static_cast<int>(format));
  return std::string(mx::FormatName(*mx_format));
}

}  // namespace mxclient

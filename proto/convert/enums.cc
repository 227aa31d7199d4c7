#include "proto/convert/enums.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace mxserve {

std::string WireEnumPrefix(const EnumDescriptor& e) {
  // A word starts at a capital after a lower-case letter or digit: CostMetric →
  // COST_METRIC, DType → DTYPE.
  std::string prefix;
  char previous = 0;
  for (const char c : e.name()) {
    if (absl::ascii_isupper(c) && (absl::ascii_islower(previous) || absl::ascii_isdigit(previous))) {
      prefix += '_';
    }
    prefix += absl::ascii_toupper(c);
    previous = c;
  }
  return prefix + "_";
}

std::string WireName(const EnumDescriptor& e, int number) {
  const google::protobuf::EnumValueDescriptor* value = e.FindValueByNumber(number);
  if (value == nullptr) return absl::StrCat(absl::AsciiStrToLower(e.name()), "#", number);
  absl::string_view name = value->name();
  absl::ConsumePrefix(&name, WireEnumPrefix(e));
  return absl::AsciiStrToLower(name);
}

std::optional<int> ParseWireName(const EnumDescriptor& e, absl::string_view text) {
  const std::string prefix = WireEnumPrefix(e);
  for (int i = 0; i < e.value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor& value = *e.value(i);
    if (absl::EqualsIgnoreCase(text, value.name()) ||
        absl::EqualsIgnoreCase(text, WireName(e, value.number()))) {
      return value.number();
    }
  }
  return std::nullopt;
}

std::string WireNameList(const EnumDescriptor& e, bool full, bool with_unspecified) {
  const std::string unspecified = WireEnumPrefix(e) + "UNSPECIFIED";
  std::vector<std::string> names;
  for (int i = 0; i < e.value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor& value = *e.value(i);
    if (!with_unspecified && value.name() == unspecified) continue;
    names.push_back(full ? value.name() : WireName(e, value.number()));
  }
  return JoinWithOr(names);
}

std::string JoinWithOr(const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) list += i + 1 == names.size() ? " or " : ", ";
    list += names[i];
  }
  return list;
}

void AbortUnknownWireName(const EnumDescriptor& e, absl::string_view name) {
  std::fprintf(stderr, "EnumMap: '%.*s' names no value of %s (expected one of %s)\n",
               static_cast<int>(name.size()), name.data(), e.full_name().c_str(),
               WireNameList(e, /*full=*/false, /*with_unspecified=*/true).c_str());
  std::abort();
}

}  // namespace mxserve

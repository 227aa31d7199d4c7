#include "clients/cpp/flags.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mxctl {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args,
                                   const std::vector<std::string>& known) {
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    if (!flags.values_.emplace(name, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given twice"));
    }
  }
  return flags;
}

std::optional<std::string> Flags::Get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> Flags::Require(const std::string& name) const {
  std::optional<std::string> value = Get(name);
  if (!value) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
  return *value;
}

absl::StatusOr<int64_t> Flags::RequireInt(const std::string& name, int64_t min, int64_t max) const {
  absl::StatusOr<std::string> text = Require(name);
  if (!text.ok()) return text.status();
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": expected an integer in [", min,
                                                   ", ", max, "], got '", *text, "'"));
  }
  return value;
}

}  // namespace mxctl

#include "clients/cpp/flags.h"

#include "clients/cpp/cli_status.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mxctl {
namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args,
                                   const std::vector<std::string>& known) {
  return Parse(args, FlagSpec{.values = known});
}

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const FlagSpec& spec) {
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
    const bool is_switch = Contains(spec.switches, name);
    const bool is_repeatable = Contains(spec.repeatable, name);
    if (!is_switch && !is_repeatable && !Contains(spec.values, name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (is_switch) {
      if (value && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", name, ": a switch takes no value (or =true/=false), got '", *value, "'"));
      }
      if (!value) value = "true";
    } else if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    std::vector<std::string>& slot = flags.values_[name];
    if (!slot.empty() && !is_repeatable) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given twice"));
    }
    slot.push_back(*value);
  }
  return flags;
}

std::optional<std::string> Flags::Get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Flags::GetAll(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return {};
  return it->second;
}

bool Flags::Switch(const std::string& name) const { return Get(name).value_or("false") == "true"; }

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

absl::StatusOr<int64_t> Flags::IntOr(const std::string& name, int64_t fallback, int64_t min,
                                     int64_t max) const {
  if (!Has(name)) return fallback;
  return RequireInt(name, min, max);
}

absl::StatusOr<absl::Duration> Flags::DurationOr(const std::string& name,
                                                 absl::Duration fallback) const {
  const std::optional<std::string> text = Get(name);
  if (!text) return fallback;
  absl::Duration duration;
  double seconds = 0;
  if (absl::SimpleAtod(*text, &seconds)) {
    duration = std::isfinite(seconds) ? absl::Seconds(seconds) : -absl::InfiniteDuration();
  } else if (!absl::ParseDuration(*text, &duration)) {
    duration = -absl::InfiniteDuration();  // rejected below
  }
  if (duration < absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, ": expected a duration such as 10s, 500ms or 2.5, got '", *text, "'"));
  }
  return duration;
}

std::optional<std::string> TakeWord(std::vector<std::string>& args) {
  if (args.empty() || args.front().rfind("--", 0) == 0) return std::nullopt;
  std::string word = std::move(args.front());
  args.erase(args.begin());
  return word;
}

std::string Subcommands::List() const {
  std::string list;
  for (size_t i = 0; i < verbs.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : i + 1 == verbs.size() ? " or " : ", ", verbs[i]);
  }
  return list;
}

absl::Status Subcommands::Missing() const {
  return UsageError(absl::StrCat(command, ": expected ", List()));
}

absl::Status Subcommands::Unknown(const std::string& verb) const {
  return UsageError(
      absl::StrCat(command, ": unknown subcommand '", verb, "'; expected ", List()));
}

absl::Status Subcommands::Check(std::vector<std::string> args) const {
  const std::optional<std::string> verb = TakeWord(args);
  if (!verb || std::find(verbs.begin(), verbs.end(), *verb) != verbs.end()) {
    return absl::OkStatus();
  }
  return Unknown(*verb);
}

}  // namespace mxctl

#include "clients/cpp/common_flags.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/wire_names.h"

namespace mxctl {

absl::StatusOr<mx::QuantizeOptions> QuantizeOptionsFromFlags(const Flags& flags) {
  mx::QuantizeOptions options;
  const std::string rounding = flags.Get("rounding").value_or("even");
  absl::StatusOr<mx::Rounding> parsed_rounding = mx::ParseRounding(rounding);
  if (!parsed_rounding.ok()) {
    return UsageError(absl::StrCat("--rounding: ", parsed_rounding.status().message()));
  }
  options.rounding = *parsed_rounding;
  if (options.rounding == mx::Rounding::kStochastic) {
    if (!flags.Has("seed")) {
      return UsageError("--seed: required with --rounding stochastic (the random bits' key)");
    }
    // Any 64-bit seed (the wire's uint64), as the Python client and offload send them.
    const std::string text = *flags.Get("seed");
    if (!absl::SimpleAtoi(text, &options.seed) || text.empty() || text[0] == '-' ||
        text[0] == '+') {
      return UsageError(absl::StrCat("--seed: expected an integer from 0 to 2^64 - 1, got '",
                                     text, "'"));
    }
  } else if (flags.Has("seed")) {
    return UsageError("--seed: only read with --rounding stochastic");
  }
  // "nosat": the spelling mxctl took before the rules had their wire names.
  const std::string rule = flags.Get("scale-rule").value_or("floor");
  absl::StatusOr<mx::ScaleRule> parsed = mx::ParseScaleRule(rule == "nosat" ? "no_saturation" : rule);
  if (!parsed.ok()) return UsageError(absl::StrCat("--scale-rule: ", parsed.status().message()));
  options.scale_rule = *parsed;
  return options;
}

absl::StatusOr<mx::Format> FormatFlag(const Flags& flags, const std::string& name) {
  absl::StatusOr<std::string> text = flags.Require(name);
  if (!text.ok()) return text.status();
  absl::StatusOr<mx::Format> format = mx::ParseFormat(*text);
  if (!format.ok()) return UsageError(absl::StrCat("--", name, ": ", format.status().message()));
  return format;
}

absl::StatusOr<mxserve::v1::Format> WireFormatFlag(const Flags& flags, const std::string& name) {
  const std::optional<std::string> text = flags.Get(name);
  if (!text) return mxserve::v1::FORMAT_UNSPECIFIED;
  absl::StatusOr<mxserve::v1::Format> format = mxclient::ParseWireFormat(*text);
  if (!format.ok()) {
    return UsageError(absl::StrCat("--", name, ": ", format.status().message(), ", or 'policy'"));
  }
  return format;
}

absl::StatusOr<mxserve::v1::Phase> PhaseFlag(const Flags& flags, mxserve::v1::Phase fallback) {
  const std::optional<std::string> text = flags.Get("phase");
  if (!text) return fallback;
  absl::StatusOr<mxserve::v1::Phase> phase = mxclient::ParsePhase(*text);
  if (!phase.ok()) return UsageError(absl::StrCat("--phase: ", phase.status().message()));
  return phase;
}

std::string RunFlag(const Flags& flags) { return flags.Get("run").value_or(""); }

}  // namespace mxctl

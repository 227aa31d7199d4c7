// Flags several mxctl subcommands share: formats, rounding and scale rule,
// phases, run tags, and the wire (proto) forms of them for the remote commands.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "clients/cpp/flags.h"
#include "mx/format.h"
#include "mx/quantize.h"
#include "mxserve/v1/common.pb.h"

namespace mxctl {

// --rounding even|away|stochastic (with --seed S) and --scale-rule
// floor|nosat|ceil|rceil (all optional; no_saturation is nosat's long name).
absl::StatusOr<mx::QuantizeOptions> QuantizeOptionsFromFlags(const Flags& flags);
// A required format flag, e.g. --format MXFP4.
absl::StatusOr<mx::Format> FormatFlag(const Flags& flags, const std::string& name);
// An optional format flag on the wire: absent, "policy" or "auto" mean
// FORMAT_UNSPECIFIED (the model's active policy chooses).
absl::StatusOr<mxserve::v1::Format> WireFormatFlag(const Flags& flags, const std::string& name);
// --phase rollout|reward|update, `fallback` when absent.
absl::StatusOr<mxserve::v1::Phase> PhaseFlag(const Flags& flags, mxserve::v1::Phase fallback);
// --run TAG: the run tag requests carry (and `energy` filters by); "" (untagged)
// when absent. The daemon checks the tag (1-64 of [A-Za-z0-9_.:/-]) and names
// it in its error; the rule lives there only.
std::string RunFlag(const Flags& flags);

}  // namespace mxctl

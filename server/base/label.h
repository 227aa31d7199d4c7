// Client-chosen names the daemon keeps as keys: power sources and devices (metric
// labels) and run tags (energy ledger keys). They must stay short and plain,
// so they are bounded in length and characters, and checked by this one rule.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mxserve {

// The longest label a client may choose.
inline constexpr size_t kMaxLabelChars = 64;

// 1 to kMaxLabelChars characters of [A-Za-z0-9_.:/-].
bool IsPlainLabel(absl::string_view value);

// OK for a plain label; otherwise INVALID_ARGUMENT naming `field`:
// "samples[0].source: expected 1-64 characters of [A-Za-z0-9_.:/-], got 'a b'".
absl::Status CheckPlainLabel(absl::string_view value, absl::string_view field);

// A run tag (compute requests, power samples, energy reports): empty for
// untagged, otherwise a plain label; the error names `field` as above.
absl::Status CheckRunTag(absl::string_view run, absl::string_view field);

}  // namespace mxserve

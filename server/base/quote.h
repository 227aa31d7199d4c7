// Client text echoed in error messages and logs: quoted, non-printable bytes
// escaped, and cut to a bounded length, so a 100 KB name cannot turn into a
// 100 KB status message (which clients receive as a metadata-size error).
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace mxserve {

// Longest client string an error message repeats in full; longer ones are cut
// and say how long they were.
inline constexpr size_t kMaxEchoedChars = 64;

// 'value' with C escapes for non-printable bytes, cut to kMaxEchoedChars:
// 'aaaa…' (100000 bytes).
std::string Quote(absl::string_view value);
// The same without the quotes, for a name used as part of a field path
// ("policy.defaults.rollot").
std::string Shorten(absl::string_view value);

// Caps a status message at `max_bytes` (cutting at a character boundary): the
// last line of defence for messages that carry client text.
std::string CapMessage(absl::string_view message, size_t max_bytes = 1024);

}  // namespace mxserve

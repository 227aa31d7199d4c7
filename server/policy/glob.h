// Shell-style globs for layer names: '*' matches any run of characters (dots
// included), '?' exactly one, a backslash makes the character after
// it literal ("\\*" matches a '*'); everything else matches itself.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace mxserve {

bool GlobMatch(absl::string_view pattern, absl::string_view text);

// A glob that matches exactly `text`: '*', '?', backslash and a leading '@'
// escaped.
std::string GlobEscape(absl::string_view text);

}  // namespace mxserve

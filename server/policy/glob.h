// Shell-style globs for layer names: '*' matches any run of characters (dots
// included), '?' exactly one; everything else matches itself.
#pragma once

#include "absl/strings/string_view.h"

namespace mxserve {

bool GlobMatch(absl::string_view pattern, absl::string_view text);

}  // namespace mxserve

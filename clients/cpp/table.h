// Plain-text tables for mxctl's listings: columns padded to their widest cell,
// the first row a header, numbers right-aligned; and key-value blocks.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mxctl {

// `rows[0]` is the header. A cell that parses as a number is right-aligned.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

// "key    value" lines, keys padded to the longest, values left as they are.
std::string FormatKeyValues(const std::vector<std::pair<std::string, std::string>>& pairs);

}  // namespace mxctl

#include "clients/cpp/table.h"

#include <algorithm>

#include "absl/strings/numbers.h"

namespace mxctl {
namespace {

bool IsNumber(const std::string& cell) {
  double value = 0;
  return !cell.empty() && absl::SimpleAtod(cell, &value);
}

}  // namespace

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      const std::string pad(widths[c] - cell.size(), ' ');
      if (c > 0) line.append("  ");
      if (r > 0 && IsNumber(cell)) {
        line.append(pad).append(cell);
      } else {
        line.append(cell).append(pad);
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    text.append(line).push_back('\n');
  }
  return text;
}

std::string FormatKeyValues(const std::vector<std::pair<std::string, std::string>>& pairs) {
  size_t width = 0;
  for (const auto& [key, value] : pairs) width = std::max(width, key.size());
  std::string text;
  for (const auto& [key, value] : pairs) {
    text.append(key).append(width + 2 - key.size(), ' ').append(value).push_back('\n');
  }
  return text;
}

}  // namespace mxctl

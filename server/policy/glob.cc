#include "server/policy/glob.h"

namespace mxserve {

bool GlobMatch(absl::string_view pattern, absl::string_view text) {
  // Greedy match with one backtrack point: the last '*' seen. Linear in practice,
  // O(|pattern|·|text|) at worst, never exponential.
  size_t p = 0, t = 0;
  size_t star = absl::string_view::npos, star_text = 0;
  while (t < text.size()) {
    if (p + 1 < pattern.size() && pattern[p] == '\\') {
      if (pattern[p + 1] == text[t]) {
        p += 2;
        ++t;
        continue;
      }
    } else if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
      continue;
    }
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_text = t;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      t = ++star_text;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string GlobEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    // A leading '@' too: unescaped it would read as a layer class ("@tolerant").
    const bool leading_at = c == '@' && out.empty();
    if (c == '*' || c == '?' || c == '\\' || leading_at) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace mxserve

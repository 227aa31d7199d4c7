#include "server/base/label.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/base/quote.h"

namespace mxserve {

bool IsPlainLabel(absl::string_view value) {
  if (value.empty() || value.size() > kMaxLabelChars) return false;
  for (char c : value) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.' &&
        c != ':' && c != '/') {
      return false;
    }
  }
  return true;
}

absl::Status CheckPlainLabel(absl::string_view value, absl::string_view field) {
  if (IsPlainLabel(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected 1-", kMaxLabelChars,
                                                 " characters of [A-Za-z0-9_.:/-], got ",
                                                 Quote(value)));
}

absl::Status CheckRunTag(absl::string_view run, absl::string_view field) {
  if (run.empty()) return absl::OkStatus();
  return CheckPlainLabel(run, field);
}

}  // namespace mxserve

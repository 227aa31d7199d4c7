#include "server/base/quote.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace mxserve {
namespace {

// The longest prefix of `text` of at most `bytes` bytes that does not split a
// UTF-8 character.
absl::string_view Prefix(absl::string_view text, size_t bytes) {
  if (text.size() <= bytes) return text;
  while (bytes > 0 && (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) --bytes;
  return text.substr(0, bytes);
}

}  // namespace

std::string Quote(absl::string_view value) {
  if (value.size() <= kMaxEchoedChars) return absl::StrCat("'", absl::CHexEscape(value), "'");
  return absl::StrCat("'", absl::CHexEscape(Prefix(value, kMaxEchoedChars)), "…' (", value.size(),
                      " bytes)");
}

std::string Shorten(absl::string_view value) {
  if (value.size() <= kMaxEchoedChars) return absl::CHexEscape(value);
  return absl::StrCat(absl::CHexEscape(Prefix(value, kMaxEchoedChars)), "… (", value.size(),
                      " bytes)");
}

std::string CapMessage(absl::string_view message, size_t max_bytes) {
  if (message.size() <= max_bytes) return std::string(message);
  return absl::StrCat(Prefix(message, max_bytes), "… (message cut at ", max_bytes, " bytes)");
}

}  // namespace mxserve

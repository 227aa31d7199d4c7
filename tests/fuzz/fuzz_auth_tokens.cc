// Fuzz target: the --auth-tokens parser (server/base/auth_tokens.h). Any bytes
// give a file:line error or a table in which every token line of the input
// finds its principal, and a token that differs from all of them finds none.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/base/auth_tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<mxserve::AuthTokens> tokens = mxserve::AuthTokens::Parse(input, "f");
  if (!tokens.ok()) {
    // Errors name the file, and stay short whatever the input.
    if (!absl::StartsWith(tokens.status().message(), "f")) std::abort();
    if (tokens.status().message().size() > 2048) std::abort();
    return 0;
  }
  if (tokens->token_count() + tokens->cert_count() == 0) std::abort();
  size_t lines = 0;
  for (absl::string_view line : absl::StrSplit(input, '\n')) {
    line = line.substr(0, line.find('#'));
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\v\f"), absl::SkipEmpty());
    if (fields.empty()) continue;
    ++lines;
    if (fields.size() != 3) std::abort();  // the parser would have refused it
    const mxserve::Principal* who =
        absl::StartsWith(fields[0], mxserve::kCertTokenPrefix)
            ? tokens->FindCert(fields[0].substr(mxserve::kCertTokenPrefix.size()))
            : tokens->FindToken(fields[0]);
    if (who == nullptr || who->name != fields[1] || mxserve::RoleName(who->role) != fields[2]) {
      std::abort();
    }
    if (tokens->FindToken(std::string(fields[0]) + "\x01") != nullptr) std::abort();
  }
  if (lines != tokens->token_count() + tokens->cert_count()) std::abort();
  return 0;
}

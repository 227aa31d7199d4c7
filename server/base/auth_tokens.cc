#include "server/base/auth_tokens.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "mx/read_file.h"
#include "server/base/quote.h"

namespace mxserve {
namespace {

// Printable ASCII other than space: what an HTTP/2 header value carries safely.
bool PlainToken(absl::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

// Principals appear in logs and messages and key the ownership records.
constexpr size_t kMaxPrincipalChars = 128;
bool PrincipalName(absl::string_view text) {
  return !text.empty() && text.size() <= kMaxPrincipalChars &&
         std::all_of(text.begin(), text.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                  c == '-' || c == '@' || c == '+';
         });
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCompute:
      return "compute";
    case Role::kTrain:
      return "train";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role role : kAllRoles) {
    if (RoleName(role) == name) return role;
  }
  return std::nullopt;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<AuthTokens> AuthTokens::Parse(absl::string_view text, absl::string_view file) {
  AuthTokens tokens;
  // Where each token, certificate name and principal was first given.
  std::map<std::string, int, std::less<>> token_line, cert_line;
  std::map<std::string, std::pair<Role, int>, std::less<>> principal_role;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const std::string where = absl::StrCat(file, ":", number, ": ");
    if (line.size() > kMaxAuthTokenLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the line has ", line.size(),
                                                     " bytes; at most ", kMaxAuthTokenLineBytes));
    }
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\v\f"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(where, "expected TOKEN PRINCIPAL ROLE, got ",
                                                     fields.size(),
                                                     fields.size() == 1 ? " field" : " fields"));
    }
    const absl::string_view token = fields[0], name = fields[1], role_name = fields[2];
    if (!PlainToken(token)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "TOKEN: expected printable ASCII without spaces"));
    }
    if (!PrincipalName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "PRINCIPAL: expected 1-",
                                                     kMaxPrincipalChars,
                                                     " of [A-Za-z0-9._@+-], got ", Quote(name)));
    }
    const std::optional<Role> role = ParseRole(role_name);
    if (!role) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "ROLE: expected compute, train or admin, got ", Quote(role_name)));
    }
    if (auto it = principal_role.find(name);
        it != principal_role.end() && it->second.first != *role) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "principal ", Quote(name), " has role ", RoleName(it->second.first),
                       " on line ", it->second.second, "; a principal has one role"));
    }
    principal_role.emplace(name, std::make_pair(*role, number));
    Principal principal{std::string(name), *role};
    if (absl::StartsWith(token, kCertTokenPrefix)) {
      const absl::string_view common_name = token.substr(kCertTokenPrefix.size());
      if (common_name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "TOKEN: 'cert:' needs the certificate's subject common name"));
      }
      if (auto [it, added] = cert_line.emplace(common_name, number); !added) {
        return absl::InvalidArgumentError(absl::StrCat(where, "certificate name ",
                                                       Quote(common_name),
                                                       " is already given on line ", it->second));
      }
      tokens.certs_.push_back({std::string(common_name), std::move(principal)});
    } else {
      // The token itself is a secret: the message names the lines, not it.
      if (auto [it, added] = token_line.emplace(token, number); !added) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the same token is already given on line ", it->second));
      }
      tokens.tokens_.push_back({std::string(token), std::move(principal)});
    }
  }
  if (tokens.tokens_.empty() && tokens.certs_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": no tokens; expected lines of TOKEN PRINCIPAL ROLE"));
  }
  return tokens;
}

absl::StatusOr<AuthTokens> AuthTokens::Load(const std::string& path) {
  // A directory read as empty and was refused as "no tokens".
  absl::StatusOr<std::string> text = mx::ReadWholeFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth-tokens: ", text.status().message()));
  }
  absl::StatusOr<AuthTokens> tokens = Parse(*text, path);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth-tokens: ", tokens.status().message()));
  }
  return tokens;
}

const Principal* AuthTokens::FindToken(absl::string_view token) const {
  const Principal* found = nullptr;
  for (const Entry& entry : tokens_) {  // no early exit: every token is compared
    if (ConstantTimeEquals(entry.key, token)) found = &entry.principal;
  }
  return found;
}

const Principal* AuthTokens::FindCert(absl::string_view common_name) const {
  for (const Entry& entry : certs_) {
    if (entry.key == common_name) return &entry.principal;
  }
  return nullptr;
}

}  // namespace mxserve

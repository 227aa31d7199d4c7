// The --auth-tokens file: who may call the daemon, and as what.
//
// One `TOKEN PRINCIPAL ROLE` per line, fields separated by spaces or tabs; `#`
// starts a comment (to the end of the line); blank lines are skipped. ROLE is
// compute, train or admin. A TOKEN of the form `cert:NAME` is no bearer token:
// it names the subject common name of an mTLS client certificate, whose holder
// is then PRINCIPAL. Every error names the file and the line.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mxserve {

// Ordered: each role may do what the ones below it may.
enum class Role : int { kCompute = 0, kTrain = 1, kAdmin = 2 };
inline constexpr Role kAllRoles[] = {Role::kCompute, Role::kTrain, Role::kAdmin};

absl::string_view RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

struct Principal {
  std::string name;
  Role role = Role::kAdmin;
};

// The caller when the daemon runs without --auth-tokens.
inline const Principal& AnonymousPrincipal() {
  static const Principal* anonymous = new Principal{"anonymous", Role::kAdmin};
  return *anonymous;
}

inline constexpr absl::string_view kCertTokenPrefix = "cert:";
// Tokens and names are short; longer lines are refused, not truncated.
inline constexpr size_t kMaxAuthTokenLineBytes = 4096;

class AuthTokens {
 public:
  // Parses the text of `file` (the name is only used in messages).
  static absl::StatusOr<AuthTokens> Parse(absl::string_view text, absl::string_view file);
  // Reads and parses `path`; errors start with "--auth-tokens: ".
  static absl::StatusOr<AuthTokens> Load(const std::string& path);

  // The principal of a bearer token, comparing against every configured token
  // in time that depends on neither which one matches nor where they differ.
  const Principal* FindToken(absl::string_view token) const;
  // The principal of an mTLS client certificate's subject common name.
  const Principal* FindCert(absl::string_view common_name) const;

  size_t token_count() const { return tokens_.size(); }
  size_t cert_count() const { return certs_.size(); }

 private:
  struct Entry {
    std::string key;  // the token, or the certificate's common name
    Principal principal;
  };
  std::vector<Entry> tokens_;
  std::vector<Entry> certs_;
};

// True when `a` equals `b`, in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace mxserve

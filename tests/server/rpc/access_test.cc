// The --auth-tokens parser on good and bad files, and the role table the daemon
// enforces (server/rpc/access.cc) against the one server/README.md shows.
#include "server/rpc/access.h"

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "server/base/auth_tokens.h"

namespace mxserve {
namespace {

std::string ParseError(absl::string_view text) {
  absl::StatusOr<AuthTokens> tokens = AuthTokens::Parse(text, "tokens.txt");
  EXPECT_FALSE(tokens.ok()) << text;
  return tokens.ok() ? "" : std::string(tokens.status().message());
}

TEST(AuthTokens, ParsesLinesCommentsAndCertificates) {
  absl::StatusOr<AuthTokens> tokens = AuthTokens::Parse(
      "# header\n"
      "\n"
      "  tok-alice\talice   train   # trailing comment\n"
      "tok-bob bob compute\r\n"
      "tok-root root admin\n"
      "cert:ci-runner ci admin\n"
      "tok-alice-2 alice train",
      "tokens.txt");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->token_count(), 4u);
  EXPECT_EQ(tokens->cert_count(), 1u);
  const Principal* alice = tokens->FindToken("tok-alice");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kTrain);
  ASSERT_NE(tokens->FindToken("tok-alice-2"), nullptr);
  EXPECT_EQ(tokens->FindToken("tok-alice-2")->name, "alice");
  ASSERT_NE(tokens->FindToken("tok-bob"), nullptr);
  EXPECT_EQ(tokens->FindToken("tok-bob")->role, Role::kCompute);
  // Prefixes, extensions and the certificate form are no tokens.
  EXPECT_EQ(tokens->FindToken("tok-ali"), nullptr);
  EXPECT_EQ(tokens->FindToken("tok-alicex"), nullptr);
  EXPECT_EQ(tokens->FindToken(""), nullptr);
  EXPECT_EQ(tokens->FindToken("cert:ci-runner"), nullptr);
  ASSERT_NE(tokens->FindCert("ci-runner"), nullptr);
  EXPECT_EQ(tokens->FindCert("ci-runner")->name, "ci");
  EXPECT_EQ(tokens->FindCert("tok-root"), nullptr);
}

TEST(AuthTokens, BadLinesNameTheFileAndLine) {
  EXPECT_EQ(ParseError("a alice train\nb bob\n"),
            "tokens.txt:2: expected TOKEN PRINCIPAL ROLE, got 2 fields");
  EXPECT_EQ(ParseError("tok\n"), "tokens.txt:1: expected TOKEN PRINCIPAL ROLE, got 1 field");
  EXPECT_EQ(ParseError("a alice train extra\n"),
            "tokens.txt:1: expected TOKEN PRINCIPAL ROLE, got 4 fields");
  EXPECT_EQ(ParseError("# c\na alice root\n"),
            "tokens.txt:2: ROLE: expected compute, train or admin, got 'root'");
  EXPECT_EQ(ParseError("a alice Admin\n"),
            "tokens.txt:1: ROLE: expected compute, train or admin, got 'Admin'");
  EXPECT_EQ(ParseError("same alice train\n\nsame bob compute\n"),
            "tokens.txt:3: the same token is already given on line 1");
  EXPECT_EQ(ParseError("a alice train\nb alice admin\n"),
            "tokens.txt:2: principal 'alice' has role train on line 1; a principal has one role");
  EXPECT_EQ(ParseError("cert:x a admin\ncert:x b admin\n"),
            "tokens.txt:2: certificate name 'x' is already given on line 1");
  EXPECT_EQ(ParseError("cert: a admin\n"),
            "tokens.txt:1: TOKEN: 'cert:' needs the certificate's subject common name");
  EXPECT_EQ(ParseError("a al'ice train\n"),
            "tokens.txt:1: PRINCIPAL: expected 1-128 of [A-Za-z0-9._@+-], got 'al\\'ice'");
  EXPECT_EQ(ParseError("a\x01z alice train\n"),
            "tokens.txt:1: TOKEN: expected printable ASCII without spaces");
  EXPECT_EQ(ParseError(""), "tokens.txt: no tokens; expected lines of TOKEN PRINCIPAL ROLE");
  EXPECT_EQ(ParseError("# only comments\n\n   \n"),
            "tokens.txt: no tokens; expected lines of TOKEN PRINCIPAL ROLE");
  const std::string long_line(kMaxAuthTokenLineBytes + 1, 'x');
  EXPECT_EQ(ParseError("a alice train\n" + long_line),
            "tokens.txt:2: the line has 4097 bytes; at most 4096");
}

TEST(AuthTokens, SecretsStayOutOfMessages) {
  EXPECT_EQ(ParseError("s3cret-token alice train\ns3cret-token bob train\n").find("s3cret"),
            std::string::npos);
}

TEST(AuthTokens, LoadNamesTheFlag) {
  absl::StatusOr<AuthTokens> missing = AuthTokens::Load("/nonexistent/tokens");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(),
            "--auth-tokens: cannot read '/nonexistent/tokens': No such file or directory");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  // A directory read as empty: "no tokens; expected lines of TOKEN PRINCIPAL ROLE".
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<AuthTokens> directory = AuthTokens::Load(dir);
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().message(),
            absl::StrCat("--auth-tokens: '", dir, "' is a directory, not a file"));
}

TEST(AuthTokens, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("a\0", 2), "a"));
}

// The rows of the table under "### Principals and roles" in server/README.md:
// RPC → (minimum role, "below admin, only" text).
std::map<std::string, std::pair<std::string, std::string>> ReadmeTable() {
  std::ifstream in(MXSERVE_SOURCE_DIR "/server/README.md");
  std::stringstream text;
  text << in.rdbuf();
  std::map<std::string, std::pair<std::string, std::string>> rows;
  bool in_section = false, in_code = false;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    if (absl::StartsWith(line, "```")) in_code = !in_code;
    if (in_code) continue;
    if (absl::StartsWith(line, "#")) {
      in_section = line == "### Principals and roles";
      continue;
    }
    if (!in_section || !absl::ConsumePrefix(&line, "| `")) continue;
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() < 3) continue;
    for (std::string& cell : cells) cell = std::string(absl::StripAsciiWhitespace(cell));
    absl::string_view name = cells[0];
    EXPECT_TRUE(absl::ConsumeSuffix(&name, "`")) << line;
    EXPECT_TRUE(rows.emplace(std::string(name), std::make_pair(cells[1], cells[2])).second)
        << "row given twice: " << line;
  }
  return rows;
}

TEST(AccessTable, ReadmeTableIsTheDaemons) {
  const auto rows = ReadmeTable();
  ASSERT_FALSE(rows.empty()) << "no table under '### Principals and roles' in server/README.md";
  EXPECT_EQ(rows.size(), static_cast<size_t>(Rpc::kCount)) << "one row per RPC";
  for (int i = 0; i < static_cast<int>(Rpc::kCount); ++i) {
    const Rpc rpc = static_cast<Rpc>(i);
    const std::string name(RpcName(rpc));
    auto it = rows.find(name);
    ASSERT_NE(it, rows.end()) << "server/README.md has no row for " << name;
    const AccessRule rule = RuleOf(rpc);
    EXPECT_EQ(it->second.first, RoleName(rule.role)) << name;
    EXPECT_EQ(it->second.second, OwnedText(rule.owned)) << name;
  }
}

TEST(AccessTable, EveryRpcHasARule) {
  // kCount falls through to admin-only; no real RPC may land there by accident.
  for (int i = 0; i < static_cast<int>(Rpc::kCount); ++i) {
    EXPECT_NE(RuleOf(static_cast<Rpc>(i)).role, Role::kAdmin) << RpcName(static_cast<Rpc>(i));
  }
}

}  // namespace
}  // namespace mxserve

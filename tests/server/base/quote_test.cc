// Client text in messages: quoted, escaped, and cut.
#include "server/base/quote.h"

#include <gtest/gtest.h>

namespace mxserve {
namespace {

TEST(Quote, ShortTextIsQuotedWhole) {
  EXPECT_EQ(Quote("q_proj"), "'q_proj'");
  EXPECT_EQ(Quote(""), "''");
  EXPECT_EQ(Quote(std::string("a\nb\0c", 5)), R"('a\nb\x00\x63')");
  EXPECT_EQ(Shorten("rollot"), "rollot");
}

TEST(Quote, LongTextIsCutAndSaysHowLongItWas) {
  const std::string huge(100000, 'x');
  EXPECT_EQ(Quote(huge), "'" + std::string(kMaxEchoedChars, 'x') + "…' (100000 bytes)");
  EXPECT_EQ(Shorten(huge), std::string(kMaxEchoedChars, 'x') + "… (100000 bytes)");
}

TEST(Quote, MessagesAreCappedAtACharacterBoundary) {
  EXPECT_EQ(CapMessage("short"), "short");
  const std::string long_message = std::string(1023, 'a') + "é" + std::string(100, 'b');
  const std::string capped = CapMessage(long_message, 1024);
  EXPECT_EQ(capped, std::string(1023, 'a') + "… (message cut at 1024 bytes)");
}

}  // namespace
}  // namespace mxserve

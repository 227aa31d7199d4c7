// ParseJsonRefusingRepeats (server/base/strict_json.h): the value nlohmann
// parses, and the path of the first key an object repeats.
#include "server/base/strict_json.h"

#include <string>

#include "gtest/gtest.h"

namespace mxserve {
namespace {

std::string RepeatedIn(const std::string& text) {
  std::string repeated = "stale";
  const nlohmann::json json = ParseJsonRefusingRepeats(text, &repeated);
  EXPECT_FALSE(json.is_discarded()) << text;
  return repeated;
}

TEST(StrictJson, ADocumentWithoutRepeatsParsesAsNlohmannWould) {
  const std::string text =
      R"({"name": "p", "defaults": {"rollout": "MXFP4", "update": "FP32"},)"
      R"( "rules": [{"match": "a", "format": "FP16"}, {"match": "b"}], "n": [1, 2, [3, {"x": 4}]]})";
  std::string repeated = "stale";
  const nlohmann::json json = ParseJsonRefusingRepeats(text, &repeated);
  EXPECT_EQ(repeated, "");
  EXPECT_EQ(json, nlohmann::json::parse(text));
  // The same key in different objects is no repeat.
  EXPECT_EQ(RepeatedIn(R"({"a": {"k": 1}, "b": {"k": 2}, "k": [{"k": 1}, {"k": 2}]})"), "");
}

TEST(StrictJson, ARepeatedKeyIsNamedByItsPath) {
  EXPECT_EQ(RepeatedIn(R"({"name": "p3", "name": "p4"})"), "name");
  EXPECT_EQ(RepeatedIn(R"({"defaults": {"rollout": "MXFP4", "rollout": "FP32"}})"),
            "defaults.rollout");
  // Array indices count every kind of element before the object.
  EXPECT_EQ(RepeatedIn(R"({"rules": [1, "s", [2, 3], {"a": 1}, {"m": 1, "f": 2, "m": 3}]})"),
            "rules[4].m");
  EXPECT_EQ(RepeatedIn(R"([[{"x": 1}], [{"y": {"z": 1, "z": 2}}]])"), "[1][0].y.z");
  // The first repeat is the one named; a key repeated with an object value too.
  EXPECT_EQ(RepeatedIn(R"({"a": 1, "b": {"c": 1, "c": 2}, "a": {"d": 1}})"), "b.c");
  EXPECT_EQ(RepeatedIn(R"({"t": {"x": 1}, "t": {"x": 2}})"), "t");
}

TEST(StrictJson, InvalidJsonIsDiscarded) {
  for (const char* text : {"", "{", R"({"a": 1,})", R"({"a" 1})", "[1, 2", "nul"}) {
    std::string repeated;
    EXPECT_TRUE(ParseJsonRefusingRepeats(text, &repeated).is_discarded()) << text;
  }
}

}  // namespace
}  // namespace mxserve

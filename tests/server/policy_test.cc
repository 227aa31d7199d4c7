// The policy engine: parsing and its error messages, globs, the sensitivity
// heuristic, first-match resolution, and the built-in presets and their short names.
#include "server/policy/policy.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server/policy/glob.h"
#include "server/policy/layer_sensitivity.h"
#include "server/policy/policy_store.h"

namespace mxserve {
namespace {

using F = mx::Format;

TEST(Glob, StarsAndQuestionMarks) {
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("*", "model.layers.0.mlp.up_proj"));
  EXPECT_TRUE(GlobMatch("*.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(GlobMatch("*.q_proj", "model.layers.0.self_attn.k_proj"));
  EXPECT_TRUE(GlobMatch("model.layers.?.mlp.*", "model.layers.7.mlp.down_proj"));
  EXPECT_FALSE(GlobMatch("model.layers.?.mlp.*", "model.layers.17.mlp.down_proj"));
  EXPECT_TRUE(GlobMatch("*layers*mlp*", "model.layers.17.mlp.down_proj"));
  EXPECT_FALSE(GlobMatch("lm_head", "lm_head2"));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "aXbYbZ"));
}

TEST(Glob, BackslashMakesTheNextCharacterLiteral) {
  EXPECT_TRUE(GlobMatch("a\\*b", "a*b"));
  EXPECT_FALSE(GlobMatch("a\\*b", "aXb"));
  EXPECT_TRUE(GlobMatch("a\\?", "a?"));
  EXPECT_FALSE(GlobMatch("a\\?", "ab"));
  EXPECT_TRUE(GlobMatch("*\\*", "xyz*"));
  EXPECT_FALSE(GlobMatch("*\\*", "xyz"));
  EXPECT_TRUE(GlobMatch("a\\", "a\\"));  // a lone trailing backslash is itself
  // GlobEscape gives a glob that matches exactly its text, whatever it holds.
  for (const char* name : {"plain.layer", "odd*name?", "back\\slash*", "*", "??", "\\"}) {
    const std::string glob = GlobEscape(name);
    EXPECT_TRUE(GlobMatch(glob, name)) << name << " as " << glob;
    EXPECT_FALSE(GlobMatch(glob, std::string(name) + "x")) << name;
    EXPECT_FALSE(GlobMatch(glob, std::string("x") + name)) << name;
  }
  EXPECT_FALSE(GlobMatch(GlobEscape("odd*name?"), "oddXXnameY"));
}

TEST(LayerSensitivity, FirstLastBlocksAttentionAndOutsideLayers) {
  const std::vector<std::string> layers = {
      "model.layers.0.mlp.up_proj",   "model.layers.1.self_attn.q_proj",
      "model.layers.1.mlp.up_proj",   "model.layers.2.mlp.down_proj",
      "model.layers.3.mlp.gate_proj", "lm_head",
      "transformer.h.2.attn.c_attn"};
  EXPECT_EQ(BlockIndex("model.layers.12.mlp.up_proj"), 12);
  EXPECT_EQ(BlockIndex("lm_head"), -1);
  EXPECT_EQ(DefaultSensitiveLayers(layers),
            (std::vector<bool>{true, true, false, false, true, true, true}));
}

TEST(Policy, ParsesNormalizesAndRoundTrips) {
  const Policy policy = ParsePolicyJson(R"({
      "name": "mine", "description": "test",
      "defaults": {"rollout": "mxfp4", "Reward": "MXFP8_E5M2", "update": "bf16"},
      "rules": [{"phase": "*", "layers": "lm_head", "format": "fp32"},
                {"phase": "rollout", "layers": "@sensitive", "format": "mxfp6"}]})")
                            .value();
  EXPECT_EQ(policy.name, "mine");
  EXPECT_EQ(policy.defaults[0], F::kMxfp4E2m1);
  EXPECT_EQ(policy.defaults[1], F::kMxfp8E5m2);
  EXPECT_EQ(policy.defaults[2], F::kBf16);
  ASSERT_EQ(policy.rules.size(), 2u);
  EXPECT_FALSE(policy.rules[0].phase.has_value());
  EXPECT_EQ(policy.rules[1].format, F::kMxfp6E2m3);
  const std::string json = PolicyToJson(policy);
  EXPECT_NE(json.find("\"MXFP6_E2M3\""), std::string::npos);
  EXPECT_EQ(PolicyToJson(ParsePolicyJson(json).value()), json);
}

TEST(Policy, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "policy: not valid JSON"},
      {"[]", "policy: expected a JSON object"},
      {R"({"defaults": {}})", "policy.name: missing"},
      {R"({"name": "a b", "defaults": {}})",
       "policy.name: expected 1-128 characters of [A-Za-z0-9._-], got 'a b'"},
      {R"({"name": "p"})", "policy.defaults: missing (a format per phase)"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16"}})",
       "policy.defaults.update: missing"},
      {R"({"name": "p", "defaults": {"rollot": "FP16"}})",
       "policy.defaults.rollot: unknown phase 'rollot'; expected rollout, reward or update"},
      {R"({"name": "p", "defaults": {"rollout": "FP17", "reward": "FP16", "update": "FP16"}})",
       "policy.defaults.rollout: unknown format 'FP17'; expected one of MXFP8_E4M3"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "x", "format": "FP16"},
                     {"phase": "*", "layers": "@hot", "format": "FP16"}]})",
       "policy.rules[1].layers: unknown layer class '@hot'; expected @sensitive or @tolerant"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "train", "layers": "x", "format": "FP16"}]})",
       "policy.rules[0].phase: unknown phase 'train'; expected rollout, reward or update or *"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "x"}]})",
       "policy.rules[0].format: missing"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "x", "format": 8}]})",
       "policy.rules[0].format: expected a format name (a string)"},
      {R"({"name": "p", "default": {}})", "policy.default: unknown field"},
  };
  for (const auto& [json, message] : cases) {
    const absl::StatusOr<Policy> parsed = ParsePolicyJson(json);
    ASSERT_FALSE(parsed.ok()) << json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(parsed.status().message()).substr(0, std::string(message).size()),
              message);
  }
}

TEST(Policy, FirstMatchingRuleWinsThenPhaseDefault) {
  const Policy policy = ParsePolicyJson(R"({"name": "p",
      "defaults": {"rollout": "MXFP4", "reward": "MXFP8", "update": "FP16"},
      "rules": [{"phase": "rollout", "layers": "*.q_proj", "format": "MXINT8"},
                {"phase": "*", "layers": "*proj", "format": "MXFP6_E3M2"},
                {"phase": "update", "layers": "@tolerant", "format": "BF16"}]})")
                            .value();
  const auto resolve = [&](Phase phase, const char* layer, bool sensitive) {
    const ResolvedFormat r = Resolve(policy, phase, layer, sensitive);
    return std::make_pair(r.format, r.rule);
  };
  EXPECT_EQ(resolve(Phase::kRollout, "l.0.q_proj", false), std::make_pair(F::kMxint8, 0));
  EXPECT_EQ(resolve(Phase::kReward, "l.0.q_proj", false), std::make_pair(F::kMxfp6E3m2, 1));
  EXPECT_EQ(resolve(Phase::kReward, "lm_head", false), std::make_pair(F::kMxfp8E4m3, -1));
  EXPECT_EQ(resolve(Phase::kUpdate, "lm_head", false), std::make_pair(F::kBf16, 2));
  EXPECT_EQ(resolve(Phase::kUpdate, "lm_head", true), std::make_pair(F::kFp16, -1));
}

TEST(Policy, BuiltinPresetsFollowTheDesignTable) {
  const std::vector<Policy>& builtins = BuiltinPolicies();
  ASSERT_EQ(builtins.size(), 5u);
  const auto find = [&](absl::string_view name) -> const Policy& {
    for (const Policy& p : builtins) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << name;
    return builtins[0];
  };
  // (phase, sensitive) → format, per DESIGN.md's table.
  const auto table = [&](absl::string_view name) {
    std::vector<F> formats;
    for (Phase phase : kAllPhases) {
      for (bool sensitive : {false, true}) {
        formats.push_back(
            Resolve(find(name), phase, "model.layers.5.mlp.up_proj", sensitive).format);
      }
    }
    return formats;
  };
  EXPECT_EQ(table("fp16-baseline"), std::vector<F>(6, F::kFp16));
  EXPECT_EQ(table("A-conservative"), (std::vector<F>{F::kMxfp8E4m3, F::kMxfp8E4m3, F::kMxfp8E4m3,
                                                     F::kMxfp8E4m3, F::kFp16, F::kFp16}));
  EXPECT_EQ(table("B-balanced"), (std::vector<F>{F::kMxfp4E2m1, F::kMxfp8E4m3, F::kMxfp4E2m1,
                                                 F::kMxfp8E4m3, F::kFp16, F::kFp16}));
  EXPECT_EQ(table("C-aggressive"), (std::vector<F>{F::kMxfp4E2m1, F::kMxfp4E2m1, F::kMxfp4E2m1,
                                                   F::kMxfp4E2m1, F::kMxfp4E2m1, F::kMxfp8E4m3}));
  EXPECT_EQ(table("D-phase-adaptive"), (std::vector<F>{F::kMxfp4E2m1, F::kMxfp8E4m3, F::kMxfp8E4m3,
                                                       F::kFp16, F::kFp16, F::kFp32}));
  // Every preset survives its own JSON.
  for (const Policy& p : builtins) {
    EXPECT_EQ(PolicyToJson(ParsePolicyJson(PolicyToJson(p)).value()), PolicyToJson(p));
  }
  EXPECT_EQ(find(kDefaultPolicy).name, kDefaultPolicy);
}

TEST(Policy, ShortNamesAreTheBuiltinsOwn) {
  EXPECT_EQ(CanonicalPolicyName("fp16"), "fp16-baseline");
  EXPECT_EQ(CanonicalPolicyName("A"), "A-conservative");
  EXPECT_EQ(CanonicalPolicyName("B"), "B-balanced");
  EXPECT_EQ(CanonicalPolicyName("C"), "C-aggressive");
  EXPECT_EQ(CanonicalPolicyName("D"), "D-phase-adaptive");
  for (absl::string_view other : {"d", "D-phase-adaptive", "E", "", "mine", "D-"}) {
    EXPECT_EQ(CanonicalPolicyName(other), other);
  }
  // A --policy-dir file that takes a short name stops the start, naming the file.
  const std::string dir = ::testing::TempDir() + "/policy_short_names";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/A.json")
      << R"({"name": "A", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})";
  const auto store = PolicyStore::Create(dir);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().message(), dir + "/A.json: 'A' is a built-in policy name");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mxserve

// The policy engine: parsing and its error messages, globs, the tolerance
// ranking, layer classes ("@tolerant:0.8"), first-match resolution, and the
// built-in presets and their short names. Presets' energy against FP16:
// preset_energy_test.cc.
#include "server/policy/policy.h"

#include <gtest/gtest.h>

#include <cmath>
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
  for (const char* name :
       {"plain.layer", "odd*name?", "back\\slash*", "*", "??", "\\", "@tolerant", "a@b"}) {
    const std::string glob = GlobEscape(name);
    EXPECT_TRUE(GlobMatch(glob, name)) << name << " as " << glob;
    EXPECT_FALSE(GlobMatch(glob, std::string(name) + "x")) << name;
    EXPECT_FALSE(GlobMatch(glob, std::string("x") + name)) << name;
  }
  EXPECT_FALSE(GlobMatch(GlobEscape("odd*name?"), "oddXXnameY"));
  // A layer named like a layer class still makes a glob rule, not a class.
  EXPECT_EQ(GlobEscape("@tolerant"), "\\@tolerant");
  EXPECT_EQ(GlobEscape("a@b"), "a@b");
}

TEST(ToleranceRanks, OutsideThenFirstLastBlocksThenAttentionThenMiddleMlps) {
  const std::vector<std::string> layers = {
      "model.layers.0.mlp.up_proj",   "model.layers.1.self_attn.q_proj",
      "model.layers.1.mlp.up_proj",   "model.layers.2.mlp.down_proj",
      "model.layers.3.mlp.gate_proj", "lm_head",
      "transformer.h.2.attn.c_attn",  "model.layers.3.self_attn.o_proj"};
  EXPECT_EQ(BlockIndex("model.layers.12.mlp.up_proj"), 12);
  EXPECT_EQ(BlockIndex("lm_head"), -1);
  EXPECT_TRUE(IsAttentionProjection("transformer.h.2.attn.c_attn"));
  EXPECT_FALSE(IsAttentionProjection("model.layers.2.mlp.down_proj"));
  // Most tolerant first: middle MLPs (1.up, 2.down), middle attention (1.q,
  // h.2.c_attn), first/last-block MLPs (0.up, 3.gate), last-block attention
  // (3.o_proj), lm_head; ties in layer order.
  EXPECT_EQ(ToleranceRanks(layers), (std::vector<uint32_t>{4, 2, 0, 1, 5, 7, 3, 6}));
}

TEST(ToleranceRanks, MeasuredOrderReordersOnlyTheRanksItsLayersHold) {
  const std::vector<std::string> layers = {"blocks.0.fc", "blocks.1.fc", "blocks.2.fc",
                                           "blocks.3.fc", "head"};
  // Built in: blocks 1, 2 (middle), 0, 3 (first, last), head.
  EXPECT_EQ(ToleranceRanks(layers), (std::vector<uint32_t>{2, 0, 1, 3, 4}));
  // A profile of every layer decides alone (unknown names and repeats ignored).
  EXPECT_EQ(ToleranceRanks(layers, {"head", "blocks.3.fc", "nope", "blocks.0.fc", "blocks.2.fc",
                                    "blocks.1.fc", "head"}),
            (std::vector<uint32_t>{2, 4, 3, 1, 0}));
  // A partial one reorders its layers among the ranks they held (1 and 2 swap
  // their ranks 0 and 1); it cannot lift the head past unmeasured layers.
  EXPECT_EQ(ToleranceRanks(layers, {"blocks.2.fc", "blocks.1.fc"}),
            (std::vector<uint32_t>{2, 1, 0, 3, 4}));
  EXPECT_EQ(ToleranceRanks(layers, {"head"}), ToleranceRanks(layers));
}

TEST(LayerClass, ParsesTheFourFormsStrictly) {
  const LayerClass bare_sensitive = ParseLayerClass("@sensitive").value();
  EXPECT_FALSE(bare_sensitive.tolerant);
  EXPECT_FALSE(bare_sensitive.complement);
  EXPECT_EQ(bare_sensitive.fraction, kDefaultSensitiveFraction);
  const LayerClass bare_tolerant = ParseLayerClass("@tolerant").value();
  EXPECT_TRUE(bare_tolerant.tolerant);
  EXPECT_TRUE(bare_tolerant.complement);
  const LayerClass tolerant = ParseLayerClass("@tolerant:0.8").value();
  EXPECT_TRUE(tolerant.tolerant);
  EXPECT_FALSE(tolerant.complement);
  EXPECT_DOUBLE_EQ(tolerant.fraction, 0.8);
  EXPECT_DOUBLE_EQ(ParseLayerClass("@sensitive:.25").value().fraction, 0.25);
  EXPECT_DOUBLE_EQ(ParseLayerClass("@sensitive:1").value().fraction, 1.0);
  for (const char* bad :
       {"@tolerant:", "@tolerant:abc", "@tolerant:-0.5", "@tolerant:+0.5", "@tolerant:1e-1",
        "@tolerant:0.5.1", "@tolerant:.", "@tolerant: 0.5", "@tolerant:nan", "@tolerant:0x1"}) {
    const absl::Status s = ParseLayerClass(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("expected a decimal fraction in (0, 1]"), absl::string_view::npos)
        << bad << ": " << s.message();
  }
  for (const char* bad : {"@tolerant:0", "@sensitive:1.5", "@sensitive:0.000", "@tolerant:2"}) {
    const absl::Status s = ParseLayerClass(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("the fraction must be in (0, 1], got "), absl::string_view::npos)
        << bad << ": " << s.message();
  }
  for (const char* bad : {"@hot", "@tolerantx", "@sensitive0.5", "@", "@Tolerant:0.5"}) {
    EXPECT_NE(ParseLayerClass(bad).status().message().find("unknown layer class"),
              absl::string_view::npos)
        << bad;
  }
}

// The layers (ranks) of an n-layer model that `text` selects.
std::vector<uint32_t> Selected(absl::string_view text, uint32_t n) {
  const LayerClass layer_class = ParseLayerClass(text).value();
  std::vector<uint32_t> ranks;
  for (uint32_t rank = 0; rank < n; ++rank) {
    if (InLayerClass(layer_class, {rank, n})) ranks.push_back(rank);
  }
  return ranks;
}

TEST(LayerClass, SelectsRoundedSharesFromEitherEndOfTheRanking) {
  // 29 layers: 0.8 · 29 = 23.2 → 23; 0.2 · 29 = 5.8 → 6; 0.25 · 29 = 7.25 → 7.
  EXPECT_EQ(Selected("@tolerant:0.8", 29).size(), 23u);
  EXPECT_EQ(Selected("@tolerant:0.8", 29).back(), 22u);
  EXPECT_EQ(Selected("@sensitive:0.2", 29), (std::vector<uint32_t>{23, 24, 25, 26, 27, 28}));
  EXPECT_EQ(Selected("@sensitive", 29).size(), 7u);
  EXPECT_EQ(Selected("@sensitive", 29).front(), 22u);
  // Halves go up: 0.5 · 5 = 2.5 → 3 from each end, so they overlap by one.
  EXPECT_EQ(Selected("@tolerant:0.5", 5), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(Selected("@sensitive:0.5", 5), (std::vector<uint32_t>{2, 3, 4}));
  // Small fractions of small models can select nothing; 1 selects everything.
  EXPECT_TRUE(Selected("@tolerant:0.2", 2).empty());
  EXPECT_EQ(Selected("@sensitive:1", 3), (std::vector<uint32_t>{0, 1, 2}));
  for (uint32_t n = 1; n <= 64; ++n) {
    for (double f : {0.1, 0.2, 0.25, 0.5, 0.8, 1.0}) {
      EXPECT_EQ(SelectedLayers(f, n), static_cast<uint32_t>(std::lround(f * n))) << f << " " << n;
    }
    // Bare @tolerant and @sensitive split every model exactly.
    const std::vector<uint32_t> sensitive = Selected("@sensitive", n);
    const std::vector<uint32_t> tolerant = Selected("@tolerant", n);
    EXPECT_EQ(sensitive.size() + tolerant.size(), n) << n;
    EXPECT_EQ(sensitive.size(), SelectedLayers(kDefaultSensitiveFraction, n)) << n;
    if (!tolerant.empty() && !sensitive.empty()) {
      EXPECT_LT(tolerant.back(), sensitive.front());
    }
  }
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

// "scale_rules" names the phases whose operands a request leaves to the policy
// are not scaled by floor; a document without it reads, and writes, as before.
TEST(Policy, ScaleRulesByPhaseAreOptionalAndRoundTrip) {
  const std::string base = R"("name": "p", "defaults": {"rollout": "FP16", "reward": "FP16",
                               "update": "MXFP4"})";
  const Policy plain = ParsePolicyJson("{" + base + "}").value();
  for (const mx::ScaleRule rule : plain.scale_rules) EXPECT_EQ(rule, mx::ScaleRule::kFloor);
  EXPECT_EQ(PolicyToJson(plain).find("scale_rules"), std::string::npos);

  const Policy ruled =
      ParsePolicyJson("{" + base + R"(, "scale_rules": {"update": "RCEIL", "reward": "floor"}})")
          .value();
  EXPECT_EQ(ruled.scale_rules[static_cast<size_t>(Phase::kRollout)], mx::ScaleRule::kFloor);
  EXPECT_EQ(ruled.scale_rules[static_cast<size_t>(Phase::kReward)], mx::ScaleRule::kFloor);
  EXPECT_EQ(ruled.scale_rules[static_cast<size_t>(Phase::kUpdate)], mx::ScaleRule::kRceil);
  const std::string json = PolicyToJson(ruled);
  EXPECT_NE(json.find(R"("scale_rules": {
    "update": "rceil"
  })"), std::string::npos) << json;
  EXPECT_EQ(PolicyToJson(ParsePolicyJson(json).value()), json);

  const std::pair<std::string, std::string> errors[] = {
      {R"("scale_rules": ["ceil"])", "policy.scale_rules: expected an object of phase: scale rule"},
      {R"("scale_rules": {"train": "ceil"})",
       "policy.scale_rules.train: unknown phase 'train'; expected rollout, reward or update"},
      {R"("scale_rules": {"update": "round"})",
       "policy.scale_rules.update: unknown scale rule 'round'; expected floor, no_saturation, "
       "ceil or rceil"},
      {R"("scale_rules": {"update": 3})",
       "policy.scale_rules.update: expected a scale rule name (a string)"},
  };
  for (const auto& [extra, message] : errors) {
    const absl::StatusOr<Policy> parsed = ParsePolicyJson("{" + base + ", " + extra + "}");
    ASSERT_FALSE(parsed.ok()) << extra;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(), message);
  }
}

// "roundings", like "scale_rules": optional, by phase, written only where not
// nearest_even, and its errors name the field.
TEST(Policy, RoundingsByPhaseAreOptionalAndRoundTrip) {
  const std::string base = R"("name": "p", "defaults": {"rollout": "FP16", "reward": "FP16",
                               "update": "MXFP4"})";
  const Policy plain = ParsePolicyJson("{" + base + "}").value();
  for (const mx::Rounding rounding : plain.roundings) {
    EXPECT_EQ(rounding, mx::Rounding::kNearestEven);
  }
  EXPECT_EQ(PolicyToJson(plain).find("roundings"), std::string::npos);
  const Policy rounded =
      ParsePolicyJson("{" + base + R"(, "roundings": {"update": "Stochastic", "reward": "even"}})")
          .value();
  EXPECT_EQ(rounded.roundings[static_cast<size_t>(Phase::kRollout)], mx::Rounding::kNearestEven);
  EXPECT_EQ(rounded.roundings[static_cast<size_t>(Phase::kReward)], mx::Rounding::kNearestEven);
  EXPECT_EQ(rounded.roundings[static_cast<size_t>(Phase::kUpdate)], mx::Rounding::kStochastic);
  const std::string json = PolicyToJson(rounded);
  EXPECT_NE(json.find(R"("roundings": {
    "update": "stochastic"
  })"), std::string::npos) << json;
  EXPECT_EQ(PolicyToJson(ParsePolicyJson(json).value()), json);
  const std::pair<std::string, std::string> errors[] = {
      {R"("roundings": "stochastic")", "policy.roundings: expected an object of phase: rounding"},
      {R"("roundings": {"update": "dither"})",
       "policy.roundings.update: unknown rounding 'dither'; expected nearest_even (even), "
       "nearest_away (away) or stochastic"},
      {R"("roundings": {"update": true})",
       "policy.roundings.update: expected a rounding name (a string)"},
  };
  for (const auto& [extra, message] : errors) {
    const absl::StatusOr<Policy> parsed = ParsePolicyJson("{" + base + ", " + extra + "}");
    ASSERT_FALSE(parsed.ok()) << extra;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(), message);
  }
}

TEST(Policy, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "policy: not valid JSON: parse error at line 1, column 2: syntax error while "
            "parsing object key - unexpected end of input"},
      // Where a file's syntax breaks, by line and column (it said only "not valid JSON"),
      // without quoting the text.
      {"{\n  \"name\": \"p\",\n  defaults: {}\n}",
       "policy: not valid JSON: parse error at line 3, column 3: syntax error while parsing "
       "object key - invalid literal"},
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
       "policy.rules[1].layers: unknown layer class '@hot'; expected @sensitive, @tolerant, "
       "@sensitive:F or @tolerant:F with F a fraction in (0, 1]"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "@tolerant:1.5", "format": "FP16"}]})",
       "policy.rules[0].layers: layer class '@tolerant:1.5': the fraction must be in (0, 1], "
       "got 1.5"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "@sensitive:0", "format": "FP16"}]})",
       "policy.rules[0].layers: layer class '@sensitive:0': the fraction must be in (0, 1], "
       "got 0"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "@tolerant:80%", "format": "FP16"}]})",
       "policy.rules[0].layers: layer class '@tolerant:80%': expected a decimal fraction in "
       "(0, 1] after @tolerant:, e.g. @tolerant:0.8"},
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
      // nlohmann keeps the last of a repeated key: this was policy p4, and the
      // next one's rollout FP32, without a word (found by a black-box test).
      {R"({"name": "p3", "name": "p4", "defaults": {}})",
       "policy.name: given twice; each key may appear once in its object"},
      {R"({"name": "p", "defaults": {"rollout": "MXFP4_E2M1", "reward": "FP16", "update": "FP16",
                                     "rollout": "FP32"}})",
       "policy.defaults.rollout: given twice; each key may appear once in its object"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "*", "layers": "x", "format": "FP16"},
                     {"phase": "*", "layers": "y", "format": "FP16", "layers": "z"}]})",
       "policy.rules[1].layers: given twice; each key may appear once in its object"},
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
  // Of 4 layers, bare @sensitive is round(0.25 · 4) = 1, the least tolerant.
  const auto resolve = [&](Phase phase, const char* layer, bool sensitive) {
    const ResolvedFormat r = Resolve(policy, phase, layer, LayerTolerance{sensitive ? 3u : 0u, 4u});
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
  ASSERT_EQ(builtins.size(), 6u);
  const auto find = [&](absl::string_view name) -> const Policy& {
    for (const Policy& p : builtins) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << name;
    return builtins[0];
  };
  // Per phase, the format at ranks 0 (most tolerant), 5 and 9 of a 10-layer
  // model, per DESIGN.md's table: bare @sensitive is ranks 7-9 (round(2.5) = 3),
  // @tolerant:0.8 ranks 0-7, @tolerant:0.2 ranks 0-1.
  const auto table = [&](absl::string_view name) {
    std::vector<F> formats;
    for (Phase phase : kAllPhases) {
      for (uint32_t rank : {0u, 5u, 9u}) {
        formats.push_back(
            Resolve(find(name), phase, "model.layers.5.mlp.up_proj", {rank, 10}).format);
      }
    }
    return formats;
  };
  const F fp4 = F::kMxfp4E2m1, fp8 = F::kMxfp8E4m3, fp16 = F::kFp16;
  EXPECT_EQ(table("fp16-baseline"), std::vector<F>(9, fp16));
  EXPECT_EQ(table("A-conservative"),
            (std::vector<F>{fp8, fp8, fp8, fp8, fp8, fp8, fp16, fp16, fp16}));
  EXPECT_EQ(table("B-balanced"), (std::vector<F>{fp4, fp4, fp8, fp4, fp4, fp8, fp16, fp16, fp16}));
  EXPECT_EQ(table("C-aggressive"), (std::vector<F>{fp4, fp4, fp4, fp4, fp4, fp4, fp4, fp4, fp8}));
  EXPECT_EQ(table("D-phase-adaptive"),
            (std::vector<F>{fp4, fp4, fp8, fp8, fp8, fp16, fp8, fp16, fp16}));
  const F nv4 = F::kNvfp4;
  EXPECT_EQ(table("NV-balanced"), (std::vector<F>{nv4, nv4, fp8, nv4, nv4, fp8, fp16, fp16, fp16}));
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
  EXPECT_EQ(CanonicalPolicyName("NV"), "NV-balanced");
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

// Issue 32: replacing a policy (an admin may replace anyone's) keeps its
// owner; it used to pass to whoever put it last.
TEST(PolicyStore, ReplacingAPolicyKeepsItsOwner) {
  std::unique_ptr<PolicyStore> store = PolicyStore::Create("").value();
  const std::string json =
      R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})";
  ASSERT_EQ(store->Put(json, "alice").value().owner, "alice");
  std::vector<std::string> asked;  // whose policy may_change was asked about
  const StoredPolicy replaced =
      store
          ->Put(R"({"name": "p", "defaults": {"rollout": "BF16", "reward": "BF16", "update": "BF16"}})",
                "root",
                [&](const StoredPolicy& existing) {
                  asked.push_back(existing.owner);
                  return absl::OkStatus();
                })
          .value();
  EXPECT_EQ(replaced.owner, "alice");
  EXPECT_EQ(asked, (std::vector<std::string>{"alice"}));
  EXPECT_EQ(store->Get("p")->owner, "alice");
  EXPECT_EQ(store->Get("p")->policy->defaults[static_cast<int>(Phase::kRollout)], F::kBf16);
  // A new name is its putter's.
  EXPECT_EQ(store->Put(R"({"name": "q", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})",
                       "root")
                .value()
                .owner,
            "root");
}

// Delete asks `in_use` about the stored policy (its owner with it), and
// refuses while it says so.
TEST(PolicyStore, DeleteAsksInUseWithTheStoredPolicy) {
  std::unique_ptr<PolicyStore> store = PolicyStore::Create("").value();
  ASSERT_TRUE(store->Put(R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})",
                         "alice")
                  .ok());
  std::vector<std::string> owners;
  const absl::Status refused = store->Delete("p", [&](const StoredPolicy& policy) {
    owners.push_back(policy.owner);
    return true;
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "name: policy 'p' is in use (the active policy of one of its owner's models, or the "
            "daemon's --default-policy)");
  EXPECT_EQ(owners, (std::vector<std::string>{"alice"}));
  EXPECT_TRUE(store->Get("p").ok());
  EXPECT_TRUE(store->Delete("p", [](const StoredPolicy&) { return false; }).ok());
  EXPECT_EQ(store->Get("p").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mxserve

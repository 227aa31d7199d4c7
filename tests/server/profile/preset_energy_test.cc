// The built-in presets on real model shapes: what each costs per phase by the
// FPGA model (fpga/model/energy_model.json) against uniform FP16, how many
// layers D puts in each format, the built-in tolerance ranking's "sensitive"
// share, and a measured profile re-ranking a registered model.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "fpga/model/energy_model.h"
#include "server/model/memory_budget.h"
#include "server/model/registry.h"
#include "server/policy/layer_sensitivity.h"
#include "server/policy/policy.h"
#include "server/profile/generate.h"
#include "server/profile/profile.h"

namespace mxserve {
namespace {

using F = mx::Format;

struct Shape {
  std::string name;
  int64_t n = 0;  // out_features
  int64_t k = 0;  // in_features
};

// Qwen2.5-0.5B's 169 linear layers in Hugging Face's module order: 24 blocks of
// q, k, v, o (grouped-query: k and v are 128 wide) and the SiLU-gated MLP, then
// the (tied) LM head.
std::vector<Shape> Qwen25_05B() {
  std::vector<Shape> layers;
  for (int i = 0; i < 24; ++i) {
    const std::string block = absl::StrCat("model.layers.", i, ".");
    layers.push_back({block + "self_attn.q_proj", 896, 896});
    layers.push_back({block + "self_attn.k_proj", 128, 896});
    layers.push_back({block + "self_attn.v_proj", 128, 896});
    layers.push_back({block + "self_attn.o_proj", 896, 896});
    layers.push_back({block + "mlp.gate_proj", 4864, 896});
    layers.push_back({block + "mlp.up_proj", 4864, 896});
    layers.push_back({block + "mlp.down_proj", 896, 4864});
  }
  layers.push_back({"lm_head", 151936, 896});
  return layers;
}

// The quick experiment's policy model as the trainer offloads it:
// PolicyWithValue (clients/python/mxserve/rlhf/trainer.py) around tasks.py's
// BUILTIN_CONFIG, a 4-block Qwen2 (hidden 64, 4 heads of 16, 2 KV heads, MLP
// 128, vocabulary 32): layers "lm.…", then the value head.
std::vector<Shape> QuickExperiment(bool value_head = true) {
  std::vector<Shape> layers;
  for (int i = 0; i < 4; ++i) {
    const std::string block = absl::StrCat("lm.model.layers.", i, ".");
    layers.push_back({block + "self_attn.q_proj", 64, 64});
    layers.push_back({block + "self_attn.k_proj", 32, 64});
    layers.push_back({block + "self_attn.v_proj", 32, 64});
    layers.push_back({block + "self_attn.o_proj", 64, 64});
    layers.push_back({block + "mlp.gate_proj", 128, 64});
    layers.push_back({block + "mlp.up_proj", 128, 64});
    layers.push_back({block + "mlp.down_proj", 64, 128});
  }
  layers.push_back({"lm.lm_head", 32, 64});
  if (value_head) layers.push_back({"value_head", 1, 64});
  return layers;
}

std::vector<std::string> Names(const std::vector<Shape>& layers) {
  std::vector<std::string> names;
  for (const Shape& s : layers) names.push_back(s.name);
  return names;
}

const Policy& Builtin(absl::string_view name) {
  for (const Policy& p : BuiltinPolicies()) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no built-in " << name;
  return BuiltinPolicies().front();
}

// Each layer's format under `policy` in `phase`, by the built-in ranking
// (`ranks` given: that ranking).
std::vector<F> Formats(const Policy& policy, Phase phase, const std::vector<std::string>& names,
                       std::vector<uint32_t> ranks = {}) {
  if (ranks.empty()) ranks = ToleranceRanks(names);
  std::vector<F> formats;
  for (size_t i = 0; i < names.size(); ++i) {
    formats.push_back(
        Resolve(policy, phase, names[i], {ranks[i], static_cast<uint32_t>(names.size())}).format);
  }
  return formats;
}

std::map<F, int> Count(const std::vector<F>& formats) {
  std::map<F, int> count;
  for (F f : formats) ++count[f];
  return count;
}

fpga_model::EnergyModelParams ShippedEnergyModel() {
  absl::StatusOr<fpga_model::EnergyModelParams> params =
      fpga_model::LoadEnergyModel(MXSERVE_SOURCE_DIR "/fpga/model/energy_model.json");
  EXPECT_TRUE(params.ok()) << params.status();
  return params.value_or(fpga_model::EnergyModelParams{});
}

// The FPGA model's joules for one phase of `m` rows through every layer, booked
// as the daemon books them (server/compute/compute_work.cc): LayerForward is
// the forward GEMM; an update step is that forward plus LayerBackward's
// grad_input = dY·W (M×K over N) and grad_weight = dYᵀ·X (N×K over M), both
// operands in the layer's format.
double PhaseJoules(const fpga_model::EnergyModelParams& params, const std::vector<Shape>& layers,
                   const std::vector<F>& formats, Phase phase, int64_t m) {
  double joules = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const F f = formats[i];
    const int64_t n = layers[i].n, k = layers[i].k;
    joules += fpga_model::EstimateGemm(params, f, f, m, n, k).joules;
    if (phase == Phase::kUpdate) {
      joules += fpga_model::EstimateGemm(params, f, f, m, k, n).joules;
      joules += fpga_model::EstimateGemm(params, f, f, n, k, m).joules;
    }
  }
  return joules;
}

TEST(PresetEnergy, NoPresetCostsMoreThanFp16InAnyPhase) {
  const fpga_model::EnergyModelParams params = ShippedEnergyModel();
  ASSERT_GT(params.clock_hz, 0);
  const std::pair<const char*, std::vector<Shape>> models[] = {
      {"Qwen2.5-0.5B", Qwen25_05B()}, {"quick-experiment", QuickExperiment()}};
  // A decode step of 8 sequences (the PE array's rows) and a 512-token
  // sequence (prefill, reward scoring, an update batch).
  for (int64_t m : {int64_t{8}, int64_t{512}}) {
    for (const auto& [model, layers] : models) {
      const std::vector<std::string> names = Names(layers);
      std::array<double, 3> fp16{};
      for (Phase phase : kAllPhases) {
        fp16[static_cast<int>(phase)] =
            PhaseJoules(params, layers, std::vector<F>(layers.size(), F::kFp16), phase, m);
        ASSERT_GT(fp16[static_cast<int>(phase)], 0);
      }
      std::printf("FPGA-model energy vs uniform FP16, %s (%zu layers), M = %ld rows:\n", model,
                  layers.size(), static_cast<long>(m));
      for (const Policy& policy : BuiltinPolicies()) {
        std::string line = absl::StrFormat("  %-17s", policy.name);
        for (Phase phase : kAllPhases) {
          const std::vector<F> formats = Formats(policy, phase, names);
          const double joules = PhaseJoules(params, layers, formats, phase, m);
          const double relative = joules / fp16[static_cast<int>(phase)];
          absl::StrAppendFormat(&line, "  %s %.3f", PhaseName(phase), relative);
          EXPECT_LE(joules, fp16[static_cast<int>(phase)] * (1 + 1e-12))
              << policy.name << " " << PhaseName(phase) << " on " << model << " at M = " << m
              << ": " << relative << "x FP16";
          // Nothing above FP16 on any single layer either: the sum cannot hide
          // an FP32 layer behind cheap ones.
          for (size_t i = 0; i < formats.size(); ++i) {
            EXPECT_TRUE(formats[i] == F::kFp16 || mx::IsBlockScaled(formats[i]))
                << policy.name << " " << PhaseName(phase) << " " << names[i] << ": "
                << mx::FormatName(formats[i]);
          }
        }
        std::printf("%s\n", line.c_str());
        if (policy.name == "fp16-baseline") continue;
        // Every other preset saves something in rollout (all are low there).
        EXPECT_LT(PhaseJoules(params, layers, Formats(policy, Phase::kRollout, names),
                              Phase::kRollout, m),
                  fp16[0])
            << policy.name << " on " << model;
      }
    }
  }
}

TEST(PresetEnergy, DPutsTheOriginsFractionsInEachFormat) {
  const Policy& d = Builtin("D-phase-adaptive");
  // 30 layers (LM + value head): round(0.8 · 30) = 24, round(0.2 · 30) = 6.
  const std::vector<std::string> quick = Names(QuickExperiment());
  ASSERT_EQ(quick.size(), 30u);
  EXPECT_EQ(Count(Formats(d, Phase::kRollout, quick)),
            (std::map<F, int>{{F::kMxfp8E4m3, 6}, {F::kMxfp4E2m1, 24}}));
  EXPECT_EQ(Count(Formats(d, Phase::kReward, quick)),
            (std::map<F, int>{{F::kMxfp8E4m3, 24}, {F::kFp16, 6}}));
  EXPECT_EQ(Count(Formats(d, Phase::kUpdate, quick)),
            (std::map<F, int>{{F::kMxfp8E4m3, 6}, {F::kFp16, 24}}));
  // The 29-layer LM alone: 23 / 6 (0.8 · 29 = 23.2, 0.2 · 29 = 5.8 → 6).
  const std::vector<std::string> lm = Names(QuickExperiment(/*value_head=*/false));
  EXPECT_EQ(Count(Formats(d, Phase::kRollout, lm)),
            (std::map<F, int>{{F::kMxfp8E4m3, 6}, {F::kMxfp4E2m1, 23}}));
  EXPECT_EQ(Count(Formats(d, Phase::kUpdate, lm)),
            (std::map<F, int>{{F::kMxfp8E4m3, 6}, {F::kFp16, 23}}));
  // Qwen2.5-0.5B: 169 layers, round(135.2) = 135 and round(33.8) = 34.
  const std::vector<std::string> qwen = Names(Qwen25_05B());
  EXPECT_EQ(Count(Formats(d, Phase::kReward, qwen)),
            (std::map<F, int>{{F::kMxfp8E4m3, 135}, {F::kFp16, 34}}));
  EXPECT_EQ(Count(Formats(d, Phase::kUpdate, qwen)),
            (std::map<F, int>{{F::kMxfp8E4m3, 34}, {F::kFp16, 135}}));

  // Which layers: the heads stay precise in rollout and reward, and the update's
  // low 20 % are middle-block MLPs.
  const std::vector<F> rollout = Formats(d, Phase::kRollout, quick);
  const std::vector<F> update = Formats(d, Phase::kUpdate, quick);
  for (size_t i = 0; i < quick.size(); ++i) {
    if (quick[i] == "lm.lm_head" || quick[i] == "value_head") {
      EXPECT_EQ(rollout[i], F::kMxfp8E4m3) << quick[i];
    }
    if (update[i] == F::kMxfp8E4m3) {
      const int block = BlockIndex(quick[i]);
      EXPECT_TRUE((block == 1 || block == 2) && !IsAttentionProjection(quick[i])) << quick[i];
    }
  }
}

TEST(ToleranceRanks, SensitiveIsAQuarterNotMostOfASmallModel) {
  const LayerClass sensitive = ParseLayerClass(kSensitiveLayers).value();
  // The 4-block LM the old rule called 23 of 29 layers sensitive (first and
  // last blocks, every attention projection, the LM head).
  const std::vector<std::string> lm = Names(QuickExperiment(/*value_head=*/false));
  ASSERT_EQ(lm.size(), 29u);
  std::vector<uint32_t> ranks = ToleranceRanks(lm);
  std::vector<std::string> marked;
  for (size_t i = 0; i < lm.size(); ++i) {
    if (InLayerClass(sensitive, {ranks[i], 29})) marked.push_back(lm[i]);
  }
  // round(0.25 · 29) = 7: the LM head and six of the eight first/last-block
  // attention projections (ties: the later layer counts less tolerant).
  EXPECT_EQ(marked, (std::vector<std::string>{
                        "lm.model.layers.0.self_attn.v_proj", "lm.model.layers.0.self_attn.o_proj",
                        "lm.model.layers.3.self_attn.q_proj", "lm.model.layers.3.self_attn.k_proj",
                        "lm.model.layers.3.self_attn.v_proj", "lm.model.layers.3.self_attn.o_proj",
                        "lm.lm_head"}));
  // The most tolerant are the middle blocks' MLPs, then their attention.
  const std::vector<std::string> qwen = Names(Qwen25_05B());
  ranks = ToleranceRanks(qwen);
  for (size_t i = 0; i < qwen.size(); ++i) {
    const int block = BlockIndex(qwen[i]);
    const bool middle = block > 0 && block < 23;
    const bool attention = IsAttentionProjection(qwen[i]);
    // 22 middle blocks × 3 MLPs = 66 most tolerant, then 22 × 4 attention.
    if (middle && !attention) {
      EXPECT_LT(ranks[i], 66u) << qwen[i];
    } else if (middle) {
      EXPECT_TRUE(ranks[i] >= 66 && ranks[i] < 154) << qwen[i];
    } else {
      EXPECT_GE(ranks[i], 154u) << qwen[i];
    }
  }
  EXPECT_EQ(ranks.back(), 168u);  // lm_head: the least tolerant
}

// A weights profile of `layers` in MXFP4 and MXFP8 whose MXFP4 error falls
// with the layer's index: the last layer the most tolerant.
Profile DescendingErrorProfile(const std::vector<Shape>& layers) {
  Profile profile;
  profile.model = "quick";
  profile.weight_version = 1;
  profile.formats = {F::kMxfp8E4m3, F::kMxfp4E2m1};
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerProfile l;
    l.layer = layers[i].name;
    l.out_features = layers[i].n;
    l.in_features = layers[i].k;
    const double error = 1.0 / static_cast<double>(i + 1);
    // MXFP8's column ranks the other way round: ProfileToleranceOrder must read MXFP4's.
    l.scores.resize(2);
    l.scores[0].format = F::kMxfp8E4m3;
    l.scores[0].rel_error = 0.01 * static_cast<double>(i + 1);
    l.scores[1].format = F::kMxfp4E2m1;
    l.scores[1].rel_error = error;
    profile.layers.push_back(l);
  }
  return profile;
}

TEST(ToleranceRanks, AMeasuredProfileReranksARegisteredModel) {
  const std::vector<Shape> layers = QuickExperiment();
  const std::vector<std::string> names = Names(layers);
  const Profile profile = DescendingErrorProfile(layers);
  const std::vector<std::string> order = ProfileToleranceOrder(profile);
  ASSERT_EQ(order.size(), names.size());
  EXPECT_EQ(order.front(), "value_head");
  EXPECT_EQ(order.back(), "lm.model.layers.0.self_attn.q_proj");

  // A gradients profile ranks by Fisher scores (generate.h's kAuto).
  Profile gradients = profile;
  gradients.source = ProfileSource::kGradients;
  for (size_t i = 0; i < gradients.layers.size(); ++i) {
    for (FormatScore& s : gradients.layers[i].scores) {
      s.has_fisher = true;
      s.fisher = i == 5 ? 0.0 : 1.0;  // layer 5 the most tolerant, the rest tie
    }
  }
  EXPECT_EQ(ProfileToleranceOrder(gradients).front(), names[5]);
  EXPECT_EQ(ProfileToleranceOrder(gradients)[1], names[0]);  // ties: registration order

  MemoryBudget budget(uint64_t{1} << 30);
  Registry registry(&budget, [](mx::QuantizedMatrix) {
    return absl::StatusOr<std::shared_ptr<const PreparedWeight>>(
        absl::UnimplementedError("no weights in this test"));
  });
  std::vector<LayerSpec> specs;
  for (const Shape& s : layers) specs.push_back({s.name, s.n, s.k, false});
  ASSERT_TRUE(registry.Register("quick", specs, "D-phase-adaptive").ok());

  const Policy& d = Builtin("D-phase-adaptive");
  const auto rollout = [&](absl::string_view layer) {
    const ModelSummary summary = registry.Describe("quick").value();
    for (const ModelSummary::Layer& l : summary.layers) {
      if (l.spec.name == layer) return Resolve(d, Phase::kRollout, layer, l.tolerance).format;
    }
    ADD_FAILURE() << layer;
    return F::kFp32;
  };
  // Built in: the heads are the least tolerant, layer 0's q_proj not among the 6.
  EXPECT_EQ(rollout("value_head"), F::kMxfp8E4m3);
  EXPECT_EQ(rollout("lm.model.layers.0.self_attn.q_proj"), F::kMxfp4E2m1);
  ASSERT_TRUE(registry.SetToleranceOrder("quick", order).ok());
  EXPECT_EQ(rollout("value_head"), F::kMxfp4E2m1);
  EXPECT_EQ(rollout("lm.model.layers.0.self_attn.q_proj"), F::kMxfp8E4m3);
  EXPECT_EQ(registry.Describe("quick").value().layers.front().tolerance.rank, 29u);
  // Without a profile again: the built-in ranking.
  ASSERT_TRUE(registry.SetToleranceOrder("quick", {}).ok());
  EXPECT_EQ(rollout("value_head"), F::kMxfp8E4m3);
  EXPECT_EQ(registry.SetToleranceOrder("nope", order).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mxserve

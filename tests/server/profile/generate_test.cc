// GeneratePolicy on profiles built in the test: what the daemon's RPC cannot
// produce any more, such as a profile holding a NaN score (issue 32, item 8:
// ProfileModel used to store one when a batch overflowed a format).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fpga/model/energy_model.h"
#include "server/profile/generate.h"
#include "server/profile/profile.h"

namespace mxserve {
namespace {

Profile TwoLayerProfile() {
  Profile profile;
  profile.model = "gen-nan";
  profile.weight_version = 3;
  profile.formats = {mx::Format::kMxfp4E2m1, mx::Format::kFp16};
  for (const char* name : {"model.layers.0.q_proj", "model.layers.0.k_proj"}) {
    LayerProfile layer;
    layer.layer = name;
    layer.out_features = layer.in_features = 64;
    layer.tokens = 8;
    for (mx::Format f : profile.formats) {
      FormatScore score;
      score.format = f;
      score.rel_error = f == mx::Format::kFp16 ? 1e-4 : 0.1;
      score.sqnr_db = -20.0 * std::log10(score.rel_error);
      layer.scores.push_back(score);
    }
    profile.layers.push_back(layer);
  }
  return profile;
}

GenerationSpec FractionSpec() {
  GenerationSpec spec;
  spec.name = "gen-nan-policy";
  spec.kind = GenerationKind::kFraction;
  spec.low = mx::Format::kMxfp4E2m1;
  spec.values.push_back({std::nullopt, 0.5, "fractions[0]"});
  return spec;
}

TEST(GeneratePolicy, AProfileHoldingANanScoreIsRefusedNamingLayerAndFormat) {
  const std::vector<std::string> layers = {"model.layers.0.q_proj", "model.layers.0.k_proj"};
  const absl::StatusOr<fpga_model::EnergyModelParams> shipped =
      fpga_model::LoadEnergyModel(MXSERVE_SOURCE_DIR "/fpga/model/energy_model.json");
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  const fpga_model::EnergyModelParams& energy = *shipped;
  Profile profile = TwoLayerProfile();
  ASSERT_TRUE(GeneratePolicy(profile, layers, energy, FractionSpec()).ok());
  profile.layers[1].scores[0].rel_error = std::numeric_limits<double>::quiet_NaN();
  const absl::StatusOr<GeneratedPolicy> refused =
      GeneratePolicy(profile, layers, energy, FractionSpec());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "the profile of model 'gen-nan' (weight version 3) holds a NaN score (layer "
            "'model.layers.0.k_proj', MXFP4_E2M1); profile the model again");
}

}  // namespace
}  // namespace mxserve

// A sensitivity profile: for every profiled layer of one model version and every
// candidate format, how far the layer's output moves when it runs in that format,
// and what the FPGA model says that format costs per token (DESIGN.md, "Profiles
// and generated policies").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fpga/model/energy_model.h"
#include "mx/format.h"

namespace mxserve {

// Each with every value; SourceName and ReferenceName are the wire's names
// (rpc/profile_wire.h ties them to mxserve.v1's ProfileSource and Reference).
enum class ProfileSource { kWeights, kActivations, kGradients };
enum class Reference { kFp32, kFp64 };
inline constexpr ProfileSource kAllProfileSources[] = {
    ProfileSource::kWeights, ProfileSource::kActivations, ProfileSource::kGradients};
inline constexpr Reference kAllReferences[] = {Reference::kFp32, Reference::kFp64};

// Every MX format, INT8, BF16 and FP16: what a profile measures unless told.
std::vector<mx::Format> DefaultProfileFormats();

// What a layer costs in one format: the FPGA model at a profile's
// batch_tokens rows, per token, for the forward GEMM and for forward plus both
// backward GEMMs; and the bits its weight takes, scales included.
struct LayerCost {
  double seconds_per_token = 0;
  double joules_per_token = 0;
  double train_seconds_per_token = 0;
  double train_joules_per_token = 0;
  double weight_bits = 0;
};

struct FormatScore {
  mx::Format format = mx::Format::kFp32;
  // ‖Y_F − Y‖ / ‖Y‖ over every calibration output; weight-only: ‖W_F − W‖ / ‖W‖.
  double rel_error = 0;
  double sqnr_db = 0;  // −20·log10(rel_error); +inf when exact
  double fisher = 0;   // Σ (dL/dY)² (Y_F − Y)², when has_fisher
  bool has_fisher = false;
  LayerCost cost;
};

struct LayerProfile {
  std::string layer;
  int64_t out_features = 0;
  int64_t in_features = 0;
  uint64_t tokens = 0;
  std::vector<FormatScore> scores;  // in Profile::formats order
};

struct Profile {
  std::string model;
  uint64_t weight_version = 0;
  ProfileSource source = ProfileSource::kWeights;
  Reference reference = Reference::kFp32;
  int64_t batch_tokens = 0;
  std::vector<mx::Format> formats;
  std::vector<LayerProfile> layers;  // registration order
  uint64_t tokens = 0;
  double created_unix_seconds = 0;
  double compute_seconds = 0;

  // Index of `format` in `formats`, or -1.
  int FormatIndex(mx::Format format) const;
};

// The cost of an out×in layer in `format`.
LayerCost CostOf(const fpga_model::EnergyModelParams& params, mx::Format format,
                 int64_t out_features, int64_t in_features, int64_t batch_tokens);

// "weights", "activations", "gradients".
const char* SourceName(ProfileSource source);
// "fp32", "fp64".
const char* ReferenceName(Reference reference);

// The ExportProfile CSV: a header row, then one row per layer and format.
inline constexpr const char* kProfileCsvHeader =
    "layer,format,out_features,in_features,tokens,rel_error,sqnr_db,fisher,seconds_per_token,"
    "joules_per_token,train_seconds_per_token,train_joules_per_token,weight_bits";
std::string ProfileToCsv(const Profile& profile);

}  // namespace mxserve

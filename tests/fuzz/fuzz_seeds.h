// What the fuzz targets share with their seed corpus (make_seeds.cc): the RPC
// method table, the model the fuzzed daemon serves, and valid messages of every
// kind, from which the fuzzer mutates.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mxserve/v1/compute.pb.h"
#include "mxserve/v1/models.pb.h"
#include "mxserve/v1/policies.pb.h"
#include "mxserve/v1/profiles.pb.h"
#include "mxserve/v1/telemetry.pb.h"

namespace mx_fuzz {

namespace v1 = mxserve::v1;

struct RpcMethod {
  const char* name;
  bool streaming;  // client streaming or bidi: several messages
};

// fuzz_rpc's input starts with an index into this table.
inline constexpr RpcMethod kRpcMethods[] = {
    {"/mxserve.v1.Compute/Gemm", false},
    {"/mxserve.v1.Compute/LayerForward", false},
    {"/mxserve.v1.Compute/LayerBackward", false},
    {"/mxserve.v1.Compute/Stream", true},
    {"/mxserve.v1.Models/RegisterModel", false},
    {"/mxserve.v1.Models/UploadWeights", true},
    {"/mxserve.v1.Models/LoadSafetensors", false},
    {"/mxserve.v1.Models/PublishVersion", false},
    {"/mxserve.v1.Models/ListModels", false},
    {"/mxserve.v1.Models/DescribeModel", false},
    {"/mxserve.v1.Models/DeleteModel", false},
    {"/mxserve.v1.Policies/PutPolicy", false},
    {"/mxserve.v1.Policies/GetPolicy", false},
    {"/mxserve.v1.Policies/ListPolicies", false},
    {"/mxserve.v1.Policies/DeletePolicy", false},
    {"/mxserve.v1.Policies/SetActivePolicy", false},
    {"/mxserve.v1.Policies/ResolvePolicy", false},
    {"/mxserve.v1.Telemetry/ReportPower", true},
    {"/mxserve.v1.Telemetry/GetEnergyReport", false},
    {"/mxserve.v1.Profiles/ProfileModel", true},
    {"/mxserve.v1.Profiles/GetProfile", false},
    {"/mxserve.v1.Profiles/ListProfiles", false},
    {"/mxserve.v1.Profiles/ExportProfile", false},
    {"/mxserve.v1.Profiles/DeleteProfile", false},
    {"/mxserve.v1.Profiles/GeneratePolicy", false},
    // Appended, so that the indices of existing corpus inputs keep their method.
    {"/mxserve.v1.Telemetry/ReportEnergy", true},
    {"/mxserve.v1.Telemetry/ReportWork", false},
    {"/mxserve.v1.Models/StepOptimizer", false},
    {"/mxserve.v1.Models/DownloadWeights", false},
    {"/mxserve.v1.Compute/LayersForward", false},
};

inline constexpr const char* kSeedModel = "m";

// Measured intervals of one device, as a GPU baseline with an energy counter
// sends them: phases in turn, each starting where the previous one ended.
inline std::vector<v1::EnergyInterval> SeedIntervals(double now) {
  std::vector<v1::EnergyInterval> intervals(3);
  for (int i = 0; i < 3; ++i) {
    intervals[i].set_source("gpu_baseline");
    intervals[i].set_device("cuda:0");
    intervals[i].set_phase(static_cast<v1::Phase>(1 + i));
    intervals[i].set_start_seconds(now + i * 0.5);
    intervals[i].set_end_seconds(now + (i + 1) * 0.5);
    intervals[i].set_joules(150.0 + 75 * i);
    intervals[i].set_run(i == 2 ? "exp/fp16-baseline" : "");
  }
  return intervals;
}

// Layer calls a client computed itself, of the seed model's layers (SeedModel,
// below): forwards in two runs, a whole backward, grad_input alone, a
// weight_rows slice's grad_weight, and a repeated call.
inline v1::ReportWorkRequest SeedWork(const char* first_layer, const char* second_layer) {
  v1::ReportWorkRequest request;
  auto add = [&](v1::Phase phase, const char* run, const char* layer, v1::WorkCallKind kind,
                 v1::Format format, uint64_t m, uint64_t n, bool grad_input, bool grad_weight,
                 uint64_t count) {
    v1::WorkCall* c = request.add_calls();
    c->set_phase(phase);
    c->set_run(run);
    c->set_model(kSeedModel);
    c->set_layer(layer);
    c->set_call(kind);
    c->set_format(format);
    c->set_m(m);
    c->set_n(n);
    c->set_grad_input(grad_input);
    c->set_grad_weight(grad_weight);
    c->set_count(count);
  };
  add(v1::PHASE_ROLLOUT, "exp/a", first_layer, v1::WORK_CALL_KIND_FORWARD,
      v1::FORMAT_MXFP4_E2M1, 8, 0, false, false, 3);
  add(v1::PHASE_REWARD, "", second_layer, v1::WORK_CALL_KIND_FORWARD, v1::FORMAT_MXFP8_E4M3, 2,
      0, false, false, 1);
  add(v1::PHASE_UPDATE, "exp/b", first_layer, v1::WORK_CALL_KIND_BACKWARD, v1::FORMAT_BF16, 4,
      0, true, true, 2);
  add(v1::PHASE_UPDATE, "exp/b", second_layer, v1::WORK_CALL_KIND_BACKWARD,
      v1::FORMAT_MXFP8_E5M2, 4, 0, true, false, 1);
  add(v1::PHASE_UPDATE, "exp/b", first_layer, v1::WORK_CALL_KIND_BACKWARD, v1::FORMAT_INT8, 4,
      8, false, true, 1);
  return request;
}

struct SeedLayer {
  const char* name;
  int64_t out, in;
  bool bias;
};
inline constexpr SeedLayer kSeedLayers[] = {{"blocks.0.attn.q_proj", 32, 64, true},
                                            {"lm_head", 16, 32, false}};

// Deterministic values with a spread of magnitudes.
inline std::vector<float> SeedValues(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    v[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * (i % 7 == 3 ? 40.0f : 1.0f);
  }
  return v;
}

inline std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

inline v1::RegisterModelRequest SeedModel() {
  v1::RegisterModelRequest request;
  request.set_name(kSeedModel);
  for (const SeedLayer& l : kSeedLayers) {
    auto* spec = request.add_layers();
    spec->set_name(l.name);
    spec->set_out_features(l.out);
    spec->set_in_features(l.in);
    spec->set_bias(l.bias);
  }
  return request;
}

// The seed model's weights as a safetensors file (names as the layers').
inline void WriteSeedSafetensors(const std::filesystem::path& path) {
  std::string header = "{", data;
  uint32_t seed = 1;
  auto add = [&](absl::string_view name, const std::vector<float>& values,
                 absl::string_view shape) {
    const size_t begin = data.size();
    data += Bytes(values);
    absl::StrAppend(&header, header.size() > 1 ? ", " : "", "\"", name,
                    R"(": {"dtype": "F32", "shape": )", shape, R"(, "data_offsets": [)", begin,
                    ", ", data.size(), "]}");
  };
  for (const SeedLayer& l : kSeedLayers) {
    add(absl::StrCat(l.name, ".weight"), SeedValues(l.out * l.in, seed++),
        absl::StrCat("[", l.out, ", ", l.in, "]"));
    if (l.bias)
      add(absl::StrCat(l.name, ".bias"), SeedValues(l.out, seed++), absl::StrCat("[", l.out, "]"));
  }
  header += "}";
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << data;
}

inline v1::Tensor Matrix(const std::vector<float>& values, int64_t rows, int64_t cols) {
  v1::Tensor t;
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_dtype(v1::DTYPE_FP32);
  t.set_data(Bytes(values));
  return t;
}

inline v1::LayerForwardRequest SeedForward(v1::Format format) {
  v1::LayerForwardRequest r;
  r.set_model(kSeedModel);
  r.set_layer(kSeedLayers[0].name);
  r.set_phase(v1::PHASE_ROLLOUT);
  r.set_format(format);
  *r.mutable_input()->mutable_tensor() = Matrix(SeedValues(2 * 64, 9), 2, 64);
  return r;
}

inline v1::LayerBackwardRequest SeedBackward(bool with_input) {
  v1::LayerBackwardRequest r;
  r.set_model(kSeedModel);
  r.set_layer(kSeedLayers[0].name);
  r.set_phase(v1::PHASE_UPDATE);
  r.set_format(v1::FORMAT_MXFP8_E4M3);
  *r.mutable_grad_output() = Matrix(SeedValues(2 * 32, 10), 2, 32);
  if (with_input) *r.mutable_input() = Matrix(SeedValues(2 * 64, 11), 2, 64);
  return r;
}

inline v1::GemmRequest SeedGemm(v1::Format format) {
  v1::GemmRequest r;
  r.set_phase(v1::PHASE_REWARD);
  r.set_format(format);
  *r.mutable_a()->mutable_tensor() = Matrix(SeedValues(3 * 64, 12), 3, 64);
  *r.mutable_b()->mutable_tensor() = Matrix(SeedValues(64 * 5, 13), 64, 5);
  return r;
}

// The policy document every PutPolicy seed starts from.
inline constexpr char kSeedPolicy[] = R"({
  "name": "fuzz-policy",
  "description": "a seed",
  "defaults": {"rollout": "MXFP4", "reward": "MXFP8", "update": "FP16"},
  "rules": [
    {"phase": "*", "layers": "lm_head", "format": "FP16"},
    {"phase": "rollout", "layers": "@sensitive", "format": "MXFP8_E4M3"},
    {"phase": "reward", "layers": "@tolerant:0.8", "format": "MXFP8"},
    {"phase": "update", "layers": "@sensitive:.2", "format": "MXFP8"},
    {"phase": "update", "layers": "blocks.*.attn.?_proj", "format": "BF16"}
  ]
})";

}  // namespace mx_fuzz

// Writes the fuzz targets' seed corpus: valid inputs of every kind, from which
// the fuzzers mutate. usage: make_fuzz_seeds OUT_DIR (writes OUT_DIR/<target>/).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "mx/packed.h"
#include "proto/convert/formats.h"
#include "server/policy/policy.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

namespace fs = std::filesystem;
using namespace mx_fuzz;

fs::path out;
int written = 0;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(out / target);
  std::ofstream(out / target / name, std::ios::binary) << bytes;
  ++written;
}

int MethodIndex(const std::string& name) {
  for (size_t i = 0; i < std::size(kRpcMethods); ++i) {
    if (name == kRpcMethods[i].name) return static_cast<int>(i);
  }
  std::fprintf(stderr, "make_fuzz_seeds: no method %s\n", name.c_str());
  std::exit(1);
}

// fuzz_rpc's encoding: method index, then the message(s).
void Rpc(const std::string& seed, const std::string& method,
         const std::vector<const google::protobuf::Message*>& messages) {
  std::string bytes(1, static_cast<char>(MethodIndex(method)));
  const bool streaming = kRpcMethods[MethodIndex(method)].streaming;
  for (const auto* message : messages) {
    const std::string m = message->SerializeAsString();
    if (streaming) {
      bytes.push_back(static_cast<char>(m.size() & 0xff));
      bytes.push_back(static_cast<char>(m.size() >> 8));
    }
    bytes += m;
  }
  Write("rpc", seed, bytes);
}

// fuzz_energy's encoding: fuzz_rpc's stream without the method byte; times are
// relative to now (fuzz_energy shifts them), so these seeds never grow old.
void EnergySeeds() {
  std::vector<v1::EnergyInterval> intervals = SeedIntervals(-30);
  std::string bytes;
  for (const auto& interval : intervals) {
    const std::string m = interval.SerializeAsString();
    bytes.push_back(static_cast<char>(m.size() & 0xff));
    bytes.push_back(static_cast<char>(m.size() >> 8));
    bytes += m;
  }
  Write("energy", "phases", bytes);
  // One interval at the bound: --max-power-watts (10 kW) × (1 s + 0.25 s).
  v1::EnergyInterval edge = intervals[0];
  edge.set_start_seconds(-20);
  edge.set_end_seconds(-19);
  edge.set_joules(12500);
  const std::string m = edge.SerializeAsString();
  Write("energy", "edge", std::string{static_cast<char>(m.size()), 0} + m);
}

// fuzz_work's encoding: a ReportWorkRequest as it is.
void WorkSeeds() {
  Write("work", "phases", SeedWork(kSeedLayers[0].name, kSeedLayers[1].name).SerializeAsString());
  v1::ReportWorkRequest one;
  *one.add_calls() = SeedWork(kSeedLayers[0].name, kSeedLayers[1].name).calls(2);
  Write("work", "backward", one.SerializeAsString());
}

void RpcSeeds() {
  v1::GemmRequest gemm = SeedGemm(v1::FORMAT_MXFP4_E2M1);
  Rpc("gemm_mxfp4", "/mxserve.v1.Compute/Gemm", {&gemm});
  v1::GemmRequest gemm32 = SeedGemm(v1::FORMAT_FP32);
  gemm32.set_format_b(v1::FORMAT_MXFP8_E5M2);
  gemm32.set_rounding(v1::ROUNDING_NEAREST_AWAY);
  Rpc("gemm_mixed", "/mxserve.v1.Compute/Gemm", {&gemm32});
  v1::GemmRequest packed = SeedGemm(v1::FORMAT_MXFP6_E3M2);
  mx::QuantizedMatrix qa = *mx::QuantizeRows(SeedValues(3 * 64, 12), 3, 64, mx::Format::kMxfp6E3m2);
  auto* pa = packed.mutable_a()->mutable_packed();
  pa->set_format(v1::FORMAT_MXFP6_E3M2);
  pa->set_rows(3);
  pa->set_cols(64);
  pa->set_elements(std::string(qa.elements.begin(), qa.elements.end()));
  pa->set_block_scales(std::string(qa.block_scales.begin(), qa.block_scales.end()));
  Rpc("gemm_packed", "/mxserve.v1.Compute/Gemm", {&packed});

  v1::LayerForwardRequest by_policy = SeedForward(v1::FORMAT_UNSPECIFIED);
  v1::LayerForwardRequest mxfp8 = SeedForward(v1::FORMAT_MXFP8_E4M3);
  v1::LayerForwardRequest int8 = SeedForward(v1::FORMAT_INT8);
  Rpc("forward_policy", "/mxserve.v1.Compute/LayerForward", {&by_policy});
  Rpc("forward_mxfp8", "/mxserve.v1.Compute/LayerForward", {&mxfp8});
  Rpc("forward_int8", "/mxserve.v1.Compute/LayerForward", {&int8});
  v1::LayerBackwardRequest with = SeedBackward(true), without = SeedBackward(false);
  Rpc("backward_input", "/mxserve.v1.Compute/LayerBackward", {&with});
  Rpc("backward", "/mxserve.v1.Compute/LayerBackward", {&without});

  v1::StreamRequest s1, s2, s3;
  s1.set_request_id(1);
  *s1.mutable_gemm() = gemm;
  s2.set_request_id(2);
  *s2.mutable_forward() = mxfp8;
  s3.set_request_id(3);
  *s3.mutable_backward() = with;
  Rpc("stream", "/mxserve.v1.Compute/Stream", {&s1, &s2, &s3});

  // Run tags: each kind of compute request booked under a run, and a stream
  // whose requests belong to different runs (and none).
  v1::GemmRequest tagged_gemm = gemm;
  tagged_gemm.set_run("exp/fp16-baseline");
  Rpc("gemm_run", "/mxserve.v1.Compute/Gemm", {&tagged_gemm});
  v1::LayerForwardRequest tagged_forward = mxfp8;
  tagged_forward.set_run("exp/policy-B:1");
  Rpc("forward_run", "/mxserve.v1.Compute/LayerForward", {&tagged_forward});
  v1::LayerBackwardRequest rows = with;
  *rows.mutable_grad_output() = Matrix(SeedValues(2 * 8, 14), 2, 8);
  rows.mutable_weight_rows()->set_begin(8);
  rows.mutable_weight_rows()->set_end(16);
  Rpc("backward_weight_rows", "/mxserve.v1.Compute/LayerBackward", {&rows});
  v1::LayerBackwardRequest tagged_backward = with;
  tagged_backward.set_run("exp/policy-B:1");
  Rpc("backward_run", "/mxserve.v1.Compute/LayerBackward", {&tagged_backward});
  v1::LayerBackwardRequest accumulate = with;
  accumulate.set_accumulate_grad(true);
  Rpc("backward_accumulate", "/mxserve.v1.Compute/LayerBackward", {&accumulate});
  v1::StepOptimizerRequest step;
  step.set_model(kSeedModel);
  step.mutable_adamw()->set_lr(1e-3);
  step.mutable_adamw()->set_beta1(0.9);
  step.mutable_adamw()->set_beta2(0.999);
  step.mutable_adamw()->set_eps(1e-8);
  step.mutable_adamw()->set_weight_decay(0.01);
  step.set_max_grad_norm(1.0);
  step.mutable_warm_up()->set_copies(v1::WarmUp::COPIES_NONE);
  Rpc("step_optimizer", "/mxserve.v1.Models/StepOptimizer", {&step});
  v1::DownloadWeightsRequest download;
  download.set_model(kSeedModel);
  download.set_layer(kSeedLayers[0].name);
  download.set_offset_elements(3);
  download.set_max_elements(17);
  download.set_dtype(v1::DTYPE_BF16);
  Rpc("download", "/mxserve.v1.Models/DownloadWeights", {&download});
  v1::LayersForwardRequest fused;
  *fused.mutable_request() = by_policy;
  fused.mutable_request()->clear_layer();
  fused.add_layers(kSeedLayers[0].name);
  fused.add_layers(kSeedLayers[0].name);
  Rpc("layers_forward", "/mxserve.v1.Compute/LayersForward", {&fused});
  v1::StreamRequest t1 = s1, t2 = s2, t3 = s3;
  t1.mutable_gemm()->set_run("a");
  t2.mutable_forward()->set_run("b");
  Rpc("stream_runs", "/mxserve.v1.Compute/Stream", {&t1, &t2, &t3});

  v1::RegisterModelRequest reg;
  reg.set_name("fuzz-model");
  reg.set_policy("B-balanced");
  auto* spec = reg.add_layers();
  spec->set_name("fc");
  spec->set_out_features(8);
  spec->set_in_features(32);
  spec->set_bias(true);
  Rpc("register", "/mxserve.v1.Models/RegisterModel", {&reg});
  v1::RegisterModelRequest leased = reg;  // a short name and a lease
  leased.set_name("fuzz-leased");
  leased.set_policy("C");
  leased.set_lease_seconds(1);
  Rpc("register_leased", "/mxserve.v1.Models/RegisterModel", {&leased});

  std::vector<v1::WeightChunk> chunks(3);
  const SeedLayer& head = kSeedLayers[1];
  const std::vector<float> w = SeedValues(head.out * head.in, 21);
  for (int i = 0; i < 2; ++i) {
    chunks[i].set_model(kSeedModel);
    chunks[i].set_layer(head.name);
    chunks[i].set_role(v1::TENSOR_ROLE_WEIGHT);
    chunks[i].set_dtype(v1::DTYPE_FP32);
    chunks[i].set_offset_elements(i * w.size() / 2);
    chunks[i].set_data(Bytes(
        std::vector<float>(w.begin() + i * w.size() / 2, w.begin() + (i + 1) * w.size() / 2)));
  }
  chunks[1].set_publish(true);
  // The first chunk says the tensor's shape (WeightChunk.shape), as the clients' do.
  chunks[0].add_shape(head.out);
  chunks[0].add_shape(head.in);
  Rpc("upload", "/mxserve.v1.Models/UploadWeights", {&chunks[0], &chunks[1]});

  v1::LoadSafetensorsRequest load;
  load.set_model(kSeedModel);
  load.set_path("m.safetensors");
  load.set_publish(true);
  Rpc("load", "/mxserve.v1.Models/LoadSafetensors", {&load});
  v1::PublishVersionRequest publish;
  publish.set_model(kSeedModel);
  Rpc("publish", "/mxserve.v1.Models/PublishVersion", {&publish});
  v1::ListModelsRequest list;
  Rpc("list", "/mxserve.v1.Models/ListModels", {&list});
  v1::ListModelsRequest page;  // a page of one, after a name
  page.set_page_size(1);
  page.set_page_token("a");
  Rpc("list_page", "/mxserve.v1.Models/ListModels", {&page});
  v1::DescribeModelRequest describe;
  describe.set_name(kSeedModel);
  Rpc("describe", "/mxserve.v1.Models/DescribeModel", {&describe});
  v1::DeleteModelRequest del;
  del.set_name("fuzz-model");
  Rpc("delete", "/mxserve.v1.Models/DeleteModel", {&del});

  v1::PutPolicyRequest put;
  put.set_json(kSeedPolicy);
  Rpc("put_policy", "/mxserve.v1.Policies/PutPolicy", {&put});
  v1::GetPolicyRequest get;
  get.set_name("D-phase-adaptive");
  Rpc("get_policy", "/mxserve.v1.Policies/GetPolicy", {&get});
  v1::ListPoliciesRequest policies;
  Rpc("list_policies", "/mxserve.v1.Policies/ListPolicies", {&policies});
  v1::DeletePolicyRequest delete_policy;
  delete_policy.set_name("fuzz-policy");
  Rpc("delete_policy", "/mxserve.v1.Policies/DeletePolicy", {&delete_policy});
  v1::SetActivePolicyRequest activate;
  activate.set_model(kSeedModel);
  activate.set_policy("fuzz-policy");
  Rpc("activate", "/mxserve.v1.Policies/SetActivePolicy", {&activate});
  v1::ResolvePolicyRequest resolve;
  resolve.set_model(kSeedModel);
  Rpc("resolve", "/mxserve.v1.Policies/ResolvePolicy", {&resolve});

  // Timestamps near the time the seeds are written: old seeds are refused as
  // implausible, which the fuzzer explores too.
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::vector<v1::PowerSample> samples(3);
  for (int i = 0; i < 3; ++i) {
    samples[i].set_source("fuzz_gpu");
    samples[i].set_device("cuda:0");
    samples[i].set_phase(static_cast<v1::Phase>(1 + i));
    samples[i].set_timestamp_seconds(now + i * 0.1);
    samples[i].set_watts(100 + 10 * i);
  }
  Rpc("power", "/mxserve.v1.Telemetry/ReportPower", {&samples[0], &samples[1], &samples[2]});
  // The same device working for two runs in turn.
  samples[1].set_run("exp/policy-B:1");
  samples[2].set_run("exp/fp16-baseline");
  Rpc("power_runs", "/mxserve.v1.Telemetry/ReportPower", {&samples[0], &samples[1], &samples[2]});
  std::vector<v1::EnergyInterval> intervals = SeedIntervals(now);
  Rpc("energy_intervals", "/mxserve.v1.Telemetry/ReportEnergy",
      {&intervals[0], &intervals[1], &intervals[2]});
  const v1::ReportWorkRequest work = SeedWork(kSeedLayers[0].name, kSeedLayers[1].name);
  Rpc("report_work", "/mxserve.v1.Telemetry/ReportWork", {&work});
  v1::GetEnergyReportRequest report;
  report.set_since_seconds(now - 60);
  Rpc("energy", "/mxserve.v1.Telemetry/GetEnergyReport", {&report});
  v1::GetEnergyReportRequest run_report;
  run_report.set_run("exp/policy-B:1");
  Rpc("energy_run", "/mxserve.v1.Telemetry/GetEnergyReport", {&run_report});

  // Profiles: a calibrated profile of the seed model (inputs and gradients for
  // its first layer, inputs alone for the second), then what reads it.
  v1::ProfileRequest config;
  config.mutable_config()->set_model(kSeedModel);
  config.mutable_config()->add_formats(v1::FORMAT_MXFP4_E2M1);
  config.mutable_config()->add_formats(v1::FORMAT_INT8);
  config.mutable_config()->set_batch_tokens(16);
  std::vector<v1::ProfileRequest> batches(2);
  for (int i = 0; i < 2; ++i) {
    const SeedLayer& layer = kSeedLayers[i];
    v1::CalibrationBatch* batch = batches[i].mutable_batch();
    batch->set_layer(layer.name);
    *batch->mutable_inputs() = Matrix(SeedValues(2 * layer.in, 40 + i), 2, layer.in);
    if (i == 0) {
      *batch->mutable_output_grads() = Matrix(SeedValues(2 * layer.out, 50), 2, layer.out);
    }
  }
  Rpc("profile", "/mxserve.v1.Profiles/ProfileModel", {&config, &batches[0], &batches[1]});
  Rpc("profile_weights", "/mxserve.v1.Profiles/ProfileModel", {&config});
  v1::GetProfileRequest get_profile;
  get_profile.set_model(kSeedModel);
  Rpc("get_profile", "/mxserve.v1.Profiles/GetProfile", {&get_profile});
  v1::ListProfilesRequest list_profiles;
  Rpc("list_profiles", "/mxserve.v1.Profiles/ListProfiles", {&list_profiles});
  v1::ExportProfileRequest export_profile;
  export_profile.set_model(kSeedModel);
  Rpc("export_profile", "/mxserve.v1.Profiles/ExportProfile", {&export_profile});
  v1::DeleteProfileRequest delete_profile;
  delete_profile.set_model(kSeedModel);
  delete_profile.set_weight_version(1);
  Rpc("delete_profile", "/mxserve.v1.Profiles/DeleteProfile", {&delete_profile});
  v1::GeneratePolicyRequest fraction;
  fraction.set_model(kSeedModel);
  fraction.set_name("fuzz-generated");
  fraction.set_kind(v1::GENERATION_KIND_FRACTION);
  fraction.set_low(v1::FORMAT_MXFP4_E2M1);
  fraction.add_fractions()->set_value(0.5);
  Rpc("generate_fraction", "/mxserve.v1.Profiles/GeneratePolicy", {&fraction});
  v1::GeneratePolicyRequest budget;
  budget.set_model(kSeedModel);
  budget.set_name("fuzz-budget");
  budget.set_kind(v1::GENERATION_KIND_BUDGET);
  budget.add_groups("*.q_proj|lm_*");
  v1::PhaseValue* relative = budget.add_relative_budgets();
  relative->set_phase(v1::PHASE_ROLLOUT);
  relative->set_value(0.6);
  budget.add_phases(v1::PHASE_ROLLOUT);
  budget.set_dry_run(true);
  Rpc("generate_budget", "/mxserve.v1.Profiles/GeneratePolicy", {&budget});
}

void SafetensorsSeeds() {
  const fs::path path = out / "seed.safetensors.tmp";
  WriteSeedSafetensors(path);
  std::ifstream in(path, std::ios::binary);
  Write("safetensors", "model", std::string(std::istreambuf_iterator<char>(in), {}));
  fs::remove(path);
  std::string bf16 =
      R"({"__metadata__": {"format": "pt"}, "t": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})";
  const uint64_t length = bf16.size();
  std::string file(reinterpret_cast<const char*>(&length), 8);
  file.append(bf16);
  file.append(8, '\x3f');
  Write("safetensors", "bf16", file);
}

void PolicySeeds() {
  Write("policy", "seed", kSeedPolicy);
  for (const mxserve::Policy& policy : mxserve::BuiltinPolicies()) {
    Write("policy", policy.name, mxserve::PolicyToJson(policy));
  }
}

void OperandSeeds() {
  for (int f = 0; f < mx::kFormatCount; ++f) {
    const auto format = static_cast<mx::Format>(f);
    mx::QuantizedMatrix q = *mx::QuantizeRows(SeedValues(2 * 70, 30 + f), 2, 70, format);
    v1::PackedOperand packed;
    packed.set_format(mxserve::ToProto(format));
    packed.set_rows(q.rows);
    packed.set_cols(q.cols);
    packed.set_elements(std::string(q.elements.begin(), q.elements.end()));
    packed.set_block_scales(std::string(q.block_scales.begin(), q.block_scales.end()));
    for (float s : q.row_scales) packed.add_row_scales(s);
    std::string packed_input(1, '\0');
    packed_input.append(packed.SerializeAsString());
    Write("operands", "packed_" + std::to_string(f), packed_input);
    v1::Tensor dense = Matrix(SeedValues(3 * 40, 50 + f), 3, 40);
    if (f % 3 == 1) {  // a BF16 tensor: half the bytes of the FP32 values
      dense.set_dtype(v1::DTYPE_BF16);
      dense.mutable_data()->resize(dense.data().size() / 2);
    }
    std::string dense_input = {'\1', static_cast<char>(f)};
    dense_input.append(dense.SerializeAsString());
    Write("operands", "dense_" + std::to_string(f), dense_input);
  }
}

}  // namespace

// --auth-tokens files: roles, comments, certificate names, odd spacing.
void AuthTokenSeeds() {
  Write("auth_tokens", "basic",
        "# TOKEN PRINCIPAL ROLE\n"
        "4f9c2e0b7d1a8e3f alice train\n"
        "b2e7c9d4f0a13e8b bob compute  # a reader\n"
        "\n"
        "cert:ci-runner ci admin\n");
  Write("auth_tokens", "spacing", "\t tok-1\troot\t admin\r\ntok-2 root admin");
  Write("auth_tokens", "duplicate", "same a train\nsame b train\n");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  out = argv[1];
  RpcSeeds();
  EnergySeeds();
  WorkSeeds();
  SafetensorsSeeds();
  PolicySeeds();
  OperandSeeds();
  AuthTokenSeeds();
  std::printf("make_fuzz_seeds: %d seeds in %s\n", written, out.c_str());
  return 0;
}

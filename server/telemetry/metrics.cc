#include "server/telemetry/metrics.h"

#include "absl/strings/str_cat.h"

namespace mxserve {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
  return *buckets;
}

constexpr std::array<absl::string_view, static_cast<int>(Rpc::kCount)> kRpcNames = {
    "Gemm",           "LayerForward",  "LayerBackward",   "Stream",
    "RegisterModel",  "UploadWeights", "LoadSafetensors", "PublishVersion",
    "ListModels",     "DescribeModel", "DeleteModel",     "PutPolicy",
    "GetPolicy",      "ListPolicies",  "DeletePolicy",    "SetActivePolicy",
    "ResolvePolicy",  "ReportPower",   "GetEnergyReport", "ProfileModel",
    "GetProfile",     "ListProfiles",  "ExportProfile",   "DeleteProfile",
    "GeneratePolicy", "ReportEnergy",  "ReportWork",      "StepOptimizer",
    "DownloadWeights", "LayersForward",
};

constexpr absl::string_view kModelSource = "fpga_model";

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace

absl::string_view RpcName(Rpc rpc) { return kRpcNames[static_cast<int>(rpc)]; }

Metrics::Metrics(std::string backend)
    : backend_(std::move(backend)), registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  requests_family_ = &BuildCounter()
                          .Name("mxserve_requests_total")
                          .Help("Compute requests served successfully, by rpc, phase and format")
                          .Register(*registry_);
  latency_family_ = &BuildHistogram()
                         .Name("mxserve_request_duration_seconds")
                         .Help("Compute request latency in the daemon, arrival to response")
                         .Register(*registry_);
  flops_family_ = &BuildCounter()
                       .Name("mxserve_flops_total")
                       .Help("Floating-point operations (2·M·N·K per GEMM) served")
                       .Register(*registry_);
  bytes_family_ = &BuildCounter()
                       .Name("mxserve_bytes_moved_total")
                       .Help(
                           "Bytes the FPGA datapath moves for the served GEMMs (packed operands "
                           "in, FP32 out), per the FPGA model")
                       .Register(*registry_);
  status_family_ = &BuildCounter()
                        .Name("mxserve_rpc_completed_total")
                        .Help("Every finished RPC, by rpc and gRPC status code")
                        .Register(*registry_);
  quantizations_family_ = &BuildCounter()
                               .Name("mxserve_weight_quantizations_total")
                               .Help(
                                   "Weight copies quantized (each layer, version and format "
                                   "once; later requests reuse them)")
                               .Register(*registry_);
  energy_family_ = &BuildCounter()
                        .Name("mxserve_energy_joules_total")
                        .Help("Energy by source (fpga_model, fpga, gpu_baseline, ...) and phase")
                        .Register(*registry_);
  busy_family_ = &BuildCounter()
                      .Name("mxserve_busy_seconds_total")
                      .Help("Seconds a device was busy, by source and phase")
                      .Register(*registry_);
  request_energy_family_ =
      &BuildCounter()
           .Name("mxserve_request_energy_joules_total")
           .Help(
               "Device energy of the served compute requests by source (fpga_model; fpga where "
               "the board measures power), phase and the weight's format; summed over format "
               "it is mxserve_energy_joules_total of that source")
           .Register(*registry_);
  model_energy_family_ =
      &BuildCounter()
           .Name("mxserve_model_energy_joules_total")
           .Help(
               "fpga_model energy of each model's layer calls (served, or reported with "
               "ReportWork), by phase; the first 32 models named have their own series, later "
               "ones model=\"other\"")
           .Register(*registry_);
  emulated_family_ =
      &BuildCounter()
           .Name("mxserve_emulated_calls_total")
           .Help(
               "Layer calls clients computed themselves and reported (Telemetry.ReportWork), by "
               "phase, format and call (forward, backward); their FLOPs, bytes and fpga_model "
               "energy are in the same counters as the served requests'")
           .Register(*registry_);
  power_family_ = &BuildGauge()
                       .Name("mxserve_power_watts")
                       .Help("Last reported power, by source and device")
                       .Register(*registry_);
  for (Phase phase : kAllPhases) {
    model_energy_[static_cast<int>(phase)] = Energy(std::string(kModelSource), phase);
  }
  auto& queue_family = BuildHistogram()
                           .Name("mxserve_queue_duration_seconds")
                           .Help("Time compute requests waited in the scheduler's queue")
                           .Register(*registry_);
  for (Phase phase : kAllPhases) {
    queue_[static_cast<int>(phase)] =
        &queue_family.Add({{"phase", std::string(PhaseName(phase))}}, LatencyBuckets());
  }
  evictions_ = &BuildCounter()
                    .Name("mxserve_weight_evictions_total")
                    .Help(
                        "Quantized weight copies evicted, least recently used first, to make "
                        "room within --weight-memory-bytes (made again on their next use)")
                    .Register(*registry_)
                    .Add({});
  batch_size_ = &BuildHistogram()
                     .Name("mxserve_batch_size")
                     .Help("Requests fused into one backend GEMM")
                     .Register(*registry_)
                     .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64});
  queue_depth_ = &BuildGauge()
                      .Name("mxserve_queue_depth")
                      .Help("Compute requests waiting in the scheduler's queue")
                      .Register(*registry_)
                      .Add({});
  weight_bytes_ =
      &BuildGauge()
           .Name("mxserve_weight_bytes")
           .Help("Bytes held for weights: FP32 masters, staged tensors, quantized copies")
           .Register(*registry_)
           .Add({});
  models_ =
      &BuildGauge().Name("mxserve_models").Help("Registered models").Register(*registry_).Add({});
  connections_ = &BuildGauge()
                      .Name("mxserve_connections")
                      .Help("gRPC connections open (at most --max-connections)")
                      .Register(*registry_)
                      .Add({});
  auto& refused = BuildCounter()
                      .Name("mxserve_connections_refused_total")
                      .Help(
                          "gRPC connections closed as soon as accepted, by reason: "
                          "max_connections (--max-connections open already) or descriptors "
                          "(the open-file limit reached)")
                      .Register(*registry_);
  refused_limit_ = &refused.Add({{"reason", "max_connections"}});
  refused_descriptors_ = &refused.Add({{"reason", "descriptors"}});
  BuildGauge()
      .Name("mxserve_build_info")
      .Help("Always 1; the labels say what is running")
      .Register(*registry_)
      .Add({{"version", MXSERVE_VERSION}, {"backend", backend_}})
      .Set(1);
}

Metrics::ComputeSeries* Metrics::Compute(Rpc rpc, Phase phase, mx::Format format) {
  const int index = (static_cast<int>(rpc) * 3 + static_cast<int>(phase)) * mx::kFormatCount +
                    static_cast<int>(format);
  if (ComputeSeries* s = compute_[index].load(std::memory_order_acquire)) return s;
  MutexLock lock(&mu_);
  if (ComputeSeries* s = compute_[index].load(std::memory_order_acquire)) return s;
  const prometheus::Labels labels = {{"rpc", std::string(RpcName(rpc))},
                                     {"phase", std::string(PhaseName(phase))},
                                     {"format", std::string(mx::FormatName(format))},
                                     {"backend", backend_}};
  const prometheus::Labels work_labels = {{"phase", std::string(PhaseName(phase))},
                                          {"format", std::string(mx::FormatName(format))}};
  auto series = std::make_unique<ComputeSeries>(ComputeSeries{
      .requests = &requests_family_->Add(labels),
      .latency = &latency_family_->Add(labels, LatencyBuckets()),
      .flops = &flops_family_->Add(work_labels),
      .bytes = &bytes_family_->Add(work_labels),
      .model_joules =
          &request_energy_family_->Add({{"source", std::string(kModelSource)},
                                        {"phase", std::string(PhaseName(phase))},
                                        {"format", std::string(mx::FormatName(format))}}),
  });
  ComputeSeries* raw = series.get();
  compute_storage_[{static_cast<int>(rpc), static_cast<int>(phase), static_cast<int>(format)}] =
      std::move(series);
  compute_[index].store(raw, std::memory_order_release);
  return raw;
}

Metrics::EnergySeries* Metrics::Energy(const std::string& source, Phase phase) {
  MutexLock lock(&mu_);
  for (Phase p : kAllPhases) {
    auto& slot = energy_[{source, p}];
    if (slot) continue;
    const prometheus::Labels labels = {{"source", source}, {"phase", std::string(PhaseName(p))}};
    slot = std::make_unique<EnergySeries>(
        EnergySeries{.joules = &energy_family_->Add(labels), .busy = &busy_family_->Add(labels)});
  }
  return energy_[{source, phase}].get();
}

void Metrics::RecordCompute(const ComputeRecord& r) {
  ComputeSeries* series = Compute(r.rpc, r.phase, r.format);
  series->requests->Increment();
  series->latency->Observe(r.latency_seconds);
  queue_[static_cast<int>(r.phase)]->Observe(r.queue_seconds);
  RecordModelWork(*series, r);
}

void Metrics::RecordModelWork(const ComputeSeries& series, const ComputeRecord& r) {
  series.flops->Increment(r.flops);
  series.bytes->Increment(r.bytes);
  series.model_joules->Increment(r.model_joules);
  EnergySeries* energy = model_energy_[static_cast<int>(r.phase)];
  energy->joules->Increment(r.model_joules);
  energy->busy->Increment(r.model_seconds);
}

void Metrics::RecordEmulatedCompute(const ComputeRecord& r, uint64_t times) {
  const ComputeSeries* series = Compute(r.rpc, r.phase, r.format);
  // One call at a time: the counters' doubles come out as if each had been served.
  for (uint64_t i = 0; i < times; ++i) RecordModelWork(*series, r);
  EmulatedCalls(r.rpc, r.phase, r.format)->Increment(static_cast<double>(times));
}

prometheus::Counter* Metrics::EmulatedCalls(Rpc rpc, Phase phase, mx::Format format) {
  const bool backward = rpc == Rpc::kLayerBackward;
  const int index = ((backward ? 1 : 0) * 3 + static_cast<int>(phase)) * mx::kFormatCount +
                    static_cast<int>(format);
  if (prometheus::Counter* c = emulated_[index].load(std::memory_order_acquire)) return c;
  MutexLock lock(&mu_);
  if (prometheus::Counter* c = emulated_[index].load(std::memory_order_acquire)) return c;
  prometheus::Counter* counter =
      &emulated_family_->Add({{"phase", std::string(PhaseName(phase))},
                              {"format", std::string(mx::FormatName(format))},
                              {"call", backward ? "backward" : "forward"}});
  emulated_[index].store(counter, std::memory_order_release);
  return counter;
}

void Metrics::RecordBatch(int size) { batch_size_->Observe(size); }

void Metrics::RecordStatus(Rpc rpc, absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c < 0 || c >= kCodes) return;
  const int index = static_cast<int>(rpc) * kCodes + c;
  prometheus::Counter* counter = status_[index].load(std::memory_order_acquire);
  if (counter == nullptr) {
    MutexLock lock(&mu_);
    counter = &status_family_->Add({{"rpc", std::string(RpcName(rpc))}, {"code", CodeName(code)}});
    status_[index].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void Metrics::RecordQuantization(mx::Format format) {
  const int index = static_cast<int>(format);
  prometheus::Counter* counter = quantizations_[index].load(std::memory_order_acquire);
  if (counter == nullptr) {
    MutexLock lock(&mu_);
    counter = &quantizations_family_->Add({{"format", std::string(mx::FormatName(format))}});
    quantizations_[index].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void Metrics::AddEnergy(const std::string& source, Phase phase, double joules,
                        double busy_seconds) {
  EnergySeries* series = Energy(source, phase);
  series->joules->Increment(joules);
  series->busy->Increment(busy_seconds);
}

void Metrics::DeclareEnergySource(const std::string& source) { Energy(source, Phase::kRollout); }

void Metrics::RecordModelEnergy(const std::string& model, Phase phase, double joules,
                                uint64_t times) {
  if (!model_energy_on_.load(std::memory_order_relaxed)) return;
  MutexLock lock(&per_model_mu_);
  auto found = per_model_energy_.find(model);
  if (found == per_model_energy_.end()) {
    const std::string label = per_model_energy_.size() < kMaxModelLabels ? model : "other";
    found = per_model_energy_.find(label);
    if (found == per_model_energy_.end()) {
      std::array<prometheus::Counter*, 3> series{};
      for (Phase p : {Phase::kRollout, Phase::kReward, Phase::kUpdate}) {
        series[static_cast<size_t>(p)] =
            &model_energy_family_->Add({{"model", label}, {"phase", std::string(PhaseName(p))}});
      }
      found = per_model_energy_.emplace(label, series).first;
    }
  }
  prometheus::Counter* counter = found->second[static_cast<size_t>(phase)];
  for (uint64_t i = 0; i < times; ++i) counter->Increment(joules);
}

void Metrics::RecordBoardEnergy(Phase phase, mx::Format format, double joules,
                                double busy_seconds) {
  AddEnergy("fpga", phase, joules, busy_seconds);
  const int index = static_cast<int>(phase) * mx::kFormatCount + static_cast<int>(format);
  prometheus::Counter* counter = board_energy_[index].load(std::memory_order_acquire);
  if (counter == nullptr) {
    MutexLock lock(&mu_);
    counter = &request_energy_family_->Add({{"source", "fpga"},
                                            {"phase", std::string(PhaseName(phase))},
                                            {"format", std::string(mx::FormatName(format))}});
    board_energy_[index].store(counter, std::memory_order_release);
  }
  counter->Increment(joules);
}

void Metrics::SetPower(const std::string& source, const std::string& device, double watts) {
  MutexLock lock(&mu_);
  auto& gauge = power_[{source, device}];
  if (gauge == nullptr) gauge = &power_family_->Add({{"source", source}, {"device", device}});
  gauge->Set(watts);
}

}  // namespace mxserve

// The daemon's Prometheus metrics (prefix mxserve_, base units, low-cardinality
// labels rpc/phase/format/backend/source/code). Handles for the hot path — one
// per (rpc, phase, format) and per (source, phase) — are created on first use
// and then read from fixed arrays, so serving a request never looks a metric up
// by its labels.
//
// The list of families with their meaning is in server/README.md ("Metrics").
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/base/mutex.h"
#include "server/base/phase.h"

namespace mxserve {

// Every RPC the daemon serves, for the `rpc` label.
enum class Rpc : int {
  kGemm,
  kLayerForward,
  kLayerBackward,
  kStream,
  kRegisterModel,
  kUploadWeights,
  kLoadSafetensors,
  kPublishVersion,
  kListModels,
  kDescribeModel,
  kDeleteModel,
  kPutPolicy,
  kGetPolicy,
  kListPolicies,
  kDeletePolicy,
  kSetActivePolicy,
  kResolvePolicy,
  kReportPower,
  kGetEnergyReport,
  kProfileModel,
  kGetProfile,
  kListProfiles,
  kExportProfile,
  kDeleteProfile,
  kGeneratePolicy,
  kReportEnergy,
  kReportWork,
  kStepOptimizer,
  kDownloadWeights,
  kLayersForward,
  kCount,
};
absl::string_view RpcName(Rpc rpc);

// The work of one completed compute request.
struct ComputeRecord {
  Rpc rpc;  // kGemm, kLayerForward or kLayerBackward
  Phase phase;
  mx::Format format;
  double latency_seconds = 0;  // arrival to response
  double queue_seconds = 0;
  double flops = 0;
  double bytes = 0;          // bytes the FPGA model moves for it
  double model_seconds = 0;  // the FPGA model's time and energy
  double model_joules = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string backend);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // Counts, latency, queue time, FLOPs, bytes, and the fpga_model energy.
  void RecordCompute(const ComputeRecord& record);
  // `times` layer calls a client computed itself and reported (ReportWork;
  // record.rpc kLayerForward or kLayerBackward, the call they stand for): each
  // adds RecordCompute's FLOPs, bytes and fpga_model energy, one call after
  // another, and counts in mxserve_emulated_calls_total. No request count,
  // latency or queue time: nothing ran or waited here.
  void RecordEmulatedCompute(const ComputeRecord& record, uint64_t times);
  void RecordBatch(int size);
  // Every finished RPC, by status code.
  void RecordStatus(Rpc rpc, absl::StatusCode code);
  void RecordQuantization(mx::Format format);
  // Quantized weight copies evicted to make room (copy_cache.h).
  void RecordEvictions(int copies) { evictions_->Increment(copies); }

  void SetQueueDepth(double depth) { queue_depth_->Set(depth); }
  void SetWeightBytes(double bytes) { weight_bytes_->Set(bytes); }
  void SetModels(double models) { models_->Set(models); }
  // The gRPC port's connections (listener.h): open now, and one refused for
  // `reason` ("max_connections", "descriptors").
  void SetConnections(double open) { connections_->Set(open); }
  void RecordConnectionRefused(const char* reason) {
    (reason == std::string_view("descriptors") ? refused_descriptors_ : refused_limit_)
        ->Increment();
  }

  // Energy and busy time from measured power (ReportPower). A source's series
  // are made for all three phases at once, at zero, on its first use or on
  // DeclareEnergySource: a counter first scraped at zero lets increase() over a
  // range count everything it gained (one first seen at 5 J loses those 5 J).
  void AddEnergy(const std::string& source, Phase phase, double joules, double busy_seconds);
  void DeclareEnergySource(const std::string& source);
  // The board's measured energy of one compute request (fpga backend): energy and
  // busy time of source fpga, and its share by the weight's format.
  void RecordBoardEnergy(Phase phase, mx::Format format, double joules, double busy_seconds);
  void SetPower(const std::string& source, const std::string& device, double watts);
  // The fpga_model energy of one model's layer calls, served or reported
  // (mxserve_model_energy_joules_total{model, phase}), once enabled (mxserved
  // --metrics-model-energy; it names models in /metrics). The first
  // kMaxModelLabels models named get a label value of their own, every later
  // one "other": the series stay bounded whatever clients register.
  void EnableModelEnergy(bool on) { model_energy_on_ = on; }
  // `times` over, one addition after another (as RecordEmulatedCompute).
  void RecordModelEnergy(const std::string& model, Phase phase, double joules,
                         uint64_t times = 1);
  static constexpr size_t kMaxModelLabels = 32;

 private:
  static constexpr int kRpcs = static_cast<int>(Rpc::kCount);
  static constexpr int kCodes = 17;
  static constexpr int kComputeRpcs = 3;
  struct ComputeSeries {
    prometheus::Counter* requests;
    prometheus::Histogram* latency;
    prometheus::Counter* flops;
    prometheus::Counter* bytes;
    prometheus::Counter* model_joules;  // source fpga_model, by phase and format
  };
  struct EnergySeries {
    prometheus::Counter* joules;
    prometheus::Counter* busy;
  };
  ComputeSeries* Compute(Rpc rpc, Phase phase, mx::Format format);
  // What a served and an emulated call both add: FLOPs, bytes, fpga_model energy.
  void RecordModelWork(const ComputeSeries& series, const ComputeRecord& record);
  prometheus::Counter* EmulatedCalls(Rpc rpc, Phase phase, mx::Format format);
  EnergySeries* Energy(const std::string& source, Phase phase);

  const std::string backend_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_family_;
  prometheus::Family<prometheus::Histogram>* latency_family_;
  prometheus::Family<prometheus::Counter>* flops_family_;
  prometheus::Family<prometheus::Counter>* bytes_family_;
  prometheus::Family<prometheus::Counter>* status_family_;
  prometheus::Family<prometheus::Counter>* quantizations_family_;
  prometheus::Family<prometheus::Counter>* energy_family_;
  prometheus::Family<prometheus::Counter>* busy_family_;
  prometheus::Family<prometheus::Counter>* request_energy_family_;
  prometheus::Family<prometheus::Gauge>* power_family_;
  prometheus::Family<prometheus::Counter>* emulated_family_;
  prometheus::Family<prometheus::Counter>* model_energy_family_;
  std::atomic<bool> model_energy_on_{false};
  Mutex per_model_mu_;
  // mxserve_model_energy_joules_total's series per model label, by phase.
  std::map<std::string, std::array<prometheus::Counter*, 3>, std::less<>> per_model_energy_
      ABSL_GUARDED_BY(per_model_mu_);
  std::array<prometheus::Histogram*, 3> queue_;  // per phase
  prometheus::Histogram* batch_size_;
  prometheus::Counter* evictions_;
  prometheus::Gauge* queue_depth_;
  prometheus::Gauge* weight_bytes_;
  prometheus::Gauge* models_;
  prometheus::Gauge* connections_;
  prometheus::Counter* refused_limit_;
  prometheus::Counter* refused_descriptors_;

  Mutex mu_;  // guards creation of the lazily made series below
  std::array<std::atomic<ComputeSeries*>, kComputeRpcs * 3 * mx::kFormatCount> compute_{};
  std::array<std::atomic<prometheus::Counter*>, kRpcs * kCodes> status_{};
  std::array<std::atomic<prometheus::Counter*>, mx::kFormatCount> quantizations_{};
  // mxserve_emulated_calls_total per (call: forward, backward; phase; format).
  std::array<std::atomic<prometheus::Counter*>, 2 * 3 * mx::kFormatCount> emulated_{};
  std::array<EnergySeries*, 3> model_energy_{};  // source fpga_model, made at start
  std::array<std::atomic<prometheus::Counter*>, 3 * mx::kFormatCount> board_energy_{};
  std::map<std::tuple<std::string, Phase>, std::unique_ptr<EnergySeries>> energy_
      ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<int, int, int>, std::unique_ptr<ComputeSeries>> compute_storage_
      ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string>, prometheus::Gauge*> power_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve

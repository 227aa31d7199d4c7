// Small helpers for the daemon's integration tests: tensors to and from the
// wire, deterministic test data, registering a model with weights, the
// reference results a served model must answer with, and what the daemon
// booked for the FPGA model's energy.
#pragma once

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fpga/model/energy_model.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "mx/format.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "mxserve/v1/compute.grpc.pb.h"
#include "mxserve/v1/models.grpc.pb.h"
#include "mxserve/v1/policies.grpc.pb.h"
#include "mxserve/v1/telemetry.grpc.pb.h"
#include "proto/convert/formats.h"
#include "proto/convert/enums.h"
#include "tests/daemon/daemon_process.h"
#include "tests/same_bits.h"

namespace mx_test {

namespace v1 = mxserve::v1;

// A gRPC status has this code and its message contains `text`.
#define EXPECT_STATUS(status, code, text)                                              \
  do {                                                                                 \
    const grpc::Status s_ = (status);                                                  \
    EXPECT_EQ(s_.error_code(), grpc::StatusCode::code) << s_.error_message();          \
    EXPECT_NE(s_.error_message().find(text), std::string::npos) << s_.error_message(); \
  } while (0)

// Unix time now, in seconds: the clock of power samples and energy reports.
inline double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline v1::Tensor Matrix(const std::vector<float>& values, int64_t rows, int64_t cols) {
  v1::Tensor t;
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_dtype(v1::DTYPE_FP32);
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return t;
}

inline std::vector<float> Floats(const v1::Tensor& t) {
  std::vector<float> out(t.data().size() / 4);
  if (!out.empty()) std::memcpy(out.data(), t.data().data(), out.size() * 4);
  return out;
}

// Activation-like values: mostly small, some outliers, a spread of magnitudes.
inline std::vector<float> TestValues(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = normal(rng) * scale;
    if (i % 37 == 5) v[i] *= 20.0f;
  }
  return v;
}

// Bit-for-bit equality of two float vectors, with the first differing index.
// (tests/same_bits.h's Identical, as a gtest assertion that says where).
inline ::testing::AssertionResult SameBits(const std::vector<float>& got,
                                           const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  if (const std::optional<size_t> i = FirstDifference(got, want)) {
    return ::testing::AssertionFailure()
           << "element " << *i << ": got " << got[*i] << " (0x" << std::hex
           << std::bit_cast<uint32_t>(got[*i]) << "), want " << want[*i] << " (0x"
           << std::bit_cast<uint32_t>(want[*i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

struct TestLayer {
  std::string name;
  int64_t out = 0, in = 0;
  bool bias = false;
  std::vector<float> weight, bias_values;
};

inline TestLayer MakeLayer(const std::string& name, int64_t out, int64_t in, bool bias,
                           uint32_t seed) {
  TestLayer l{name, out, in, bias, TestValues(static_cast<size_t>(out * in), seed, 0.05f), {}};
  if (bias) l.bias_values = TestValues(static_cast<size_t>(out), seed + 1, 0.1f);
  return l;
}

// Sends `authorization: Bearer <token>` metadata unless `token` is empty.
inline void Authorize(grpc::ClientContext& context, const std::string& token) {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
}

inline grpc::Status Register(grpc::Channel* channel, const std::string& model,
                             const std::vector<TestLayer>& layers, const std::string& policy = "",
                             const std::string& token = "") {
  v1::RegisterModelRequest request;
  request.set_name(model);
  request.set_policy(policy);
  for (const auto& l : layers) {
    auto* spec = request.add_layers();
    spec->set_name(l.name);
    spec->set_out_features(l.out);
    spec->set_in_features(l.in);
    spec->set_bias(l.bias);
  }
  grpc::ClientContext context;
  Authorize(context, token);
  v1::ModelInfo info;
  return v1::Models::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}))
      ->RegisterModel(&context, request, &info);
}

// Uploads every layer's tensors in chunks of `chunk` elements, optionally publishing.
inline grpc::Status Upload(grpc::Channel* channel, const std::string& model,
                           const std::vector<TestLayer>& layers, bool publish,
                           v1::UploadWeightsResponse* response, size_t chunk = 1000,
                           const std::string& token = "") {
  auto stub = v1::Models::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext context;
  Authorize(context, token);
  auto writer = stub->UploadWeights(&context, response);
  auto send = [&](const TestLayer& l, const std::vector<float>& values, v1::TensorRole role) {
    for (size_t at = 0; at < values.size(); at += chunk) {
      const size_t n = std::min(chunk, values.size() - at);
      v1::WeightChunk c;
      c.set_model(model);
      c.set_layer(l.name);
      c.set_role(role);
      c.set_dtype(v1::DTYPE_FP32);
      c.set_offset_elements(at);
      c.set_data(std::string(reinterpret_cast<const char*>(values.data() + at), n * 4));
      c.set_publish(publish);
      if (!writer->Write(c)) return;
    }
  };
  for (const auto& l : layers) {
    send(l, l.weight, v1::TENSOR_ROLE_WEIGHT);
    if (l.bias) send(l, l.bias_values, v1::TENSOR_ROLE_BIAS);
  }
  writer->WritesDone();
  return writer->Finish();
}

inline grpc::Status RegisterAndPublish(grpc::Channel* channel, const std::string& model,
                                       const std::vector<TestLayer>& layers,
                                       const std::string& policy = "") {
  grpc::Status s = Register(channel, model, layers, policy);
  if (!s.ok()) return s;
  v1::UploadWeightsResponse response;
  return Upload(channel, model, layers, /*publish=*/true, &response);
}

// The wire format of mx::Format value `mx_format` (0 .. mx::kFormatCount - 1).
inline v1::Format Wire(int mx_format) {
  return mxserve::ToProto(static_cast<mx::Format>(mx_format));
}

// C = A·B with A (m × k) and B (k × n) as FP32 tensors; format_b left
// unspecified means the same as `format`.
inline v1::GemmRequest GemmRequest(v1::Phase phase, v1::Format format, const std::vector<float>& a,
                                   const std::vector<float>& b, int64_t m, int64_t k, int64_t n,
                                   v1::Format format_b = v1::FORMAT_UNSPECIFIED) {
  v1::GemmRequest request;
  request.set_phase(phase);
  request.set_format(format);
  if (format_b != v1::FORMAT_UNSPECIFIED) request.set_format_b(format_b);
  *request.mutable_a()->mutable_tensor() = Matrix(a, m, k);
  *request.mutable_b()->mutable_tensor() = Matrix(b, k, n);
  return request;
}

// A LayerForward of `x` (m × layer.in, FP32) in an explicit format.
inline v1::LayerForwardRequest ForwardRequest(const std::string& model, const TestLayer& layer,
                                              v1::Phase phase, int mx_format,
                                              const std::vector<float>& x, int64_t m) {
  v1::LayerForwardRequest request;
  request.set_model(model);
  request.set_layer(layer.name);
  request.set_phase(phase);
  request.set_format(Wire(mx_format));
  *request.mutable_input()->mutable_tensor() = Matrix(x, m, layer.in);
  return request;
}

// Sends every request at once, asynchronously, so that a batching daemon can fuse
// them, and waits for all; the statuses and responses come back in request order.
struct ForwardResult {
  grpc::Status status;
  v1::LayerForwardResponse response;
};
inline std::vector<ForwardResult> ForwardAllAtOnce(
    const std::shared_ptr<grpc::Channel>& channel,
    const std::vector<v1::LayerForwardRequest>& requests) {
  struct Call {
    grpc::ClientContext context;
    v1::LayerForwardResponse response;
    std::promise<grpc::Status> done;
  };
  auto stub = v1::Compute::NewStub(channel);
  std::vector<std::unique_ptr<Call>> calls;
  for (const v1::LayerForwardRequest& request : requests) {
    Call* call = calls.emplace_back(std::make_unique<Call>()).get();
    stub->async()->LayerForward(&call->context, &request, &call->response,
                                [call](grpc::Status s) { call->done.set_value(std::move(s)); });
  }
  std::vector<ForwardResult> results;
  for (const auto& call : calls) {
    grpc::Status status = call->done.get_future().get();
    results.push_back({std::move(status), std::move(call->response)});
  }
  return results;
}

// The reference Y = X·Wᵀ + b of `layer` in `format`: X (m × layer.in) and W
// quantized along their rows.
inline std::vector<float> ReferenceForward(const TestLayer& layer, const std::vector<float>& x,
                                           int64_t m, mx::Format format) {
  auto qx = mx::QuantizeRows(x, m, layer.in, format);
  auto qw = mx::QuantizeRows(layer.weight, layer.out, layer.in, format);
  return *mx::ReferenceLinear(*qx, *qw, layer.bias_values);
}

// The daemon still answers a LayerForward of `layer` in `model` (two rows,
// rollout, MXFP8 E4M3) with the reference bits: nothing it held was lost.
inline void ExpectServesReference(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& model, const TestLayer& layer) {
  const auto x = TestValues(2 * layer.in, 72);
  constexpr mx::Format kFormat = mx::Format::kMxfp8E4m3;
  v1::LayerForwardResponse response;
  grpc::ClientContext context;
  const grpc::Status s = v1::Compute::NewStub(channel)->LayerForward(
      &context, ForwardRequest(model, layer, v1::PHASE_ROLLOUT, static_cast<int>(kFormat), x, 2),
      &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(SameBits(Floats(response.output()), ReferenceForward(layer, x, 2, kFormat)));
}

// A LayerBackward of `grad_output` (m × layer.out, FP32) in an explicit format;
// with `input` (m × layer.in) it asks for grad_weight too.
inline v1::LayerBackwardRequest BackwardRequest(const std::string& model, const TestLayer& layer,
                                                v1::Phase phase, int mx_format,
                                                const std::vector<float>& grad_output,
                                                const std::optional<std::vector<float>>& input,
                                                int64_t m) {
  v1::LayerBackwardRequest request;
  request.set_model(model);
  request.set_layer(layer.name);
  request.set_phase(phase);
  request.set_format(Wire(mx_format));
  *request.mutable_grad_output() = Matrix(grad_output, m, layer.out);
  if (input) *request.mutable_input() = Matrix(*input, m, layer.in);
  return request;
}

// ---------------------------------------------------------------------------
// Energy: what the daemon booked for the FPGA model.

// The entry of `source` and `phase` in `report`, or null.
inline const v1::EnergyEntry* FindEnergyEntry(const v1::EnergyReport& report,
                                              const std::string& source, v1::Phase phase) {
  for (const auto& e : report.entries()) {
    if (e.source() == source && e.phase() == phase) return &e;
  }
  return nullptr;
}
// The entry would point into a report about to be destroyed: keep the report in a
// variable first.
const v1::EnergyEntry* FindEnergyEntry(v1::EnergyReport&& report, const std::string& source,
                                       v1::Phase phase) = delete;

// The work of two estimates together (a request that runs two GEMMs, or several
// requests), field by field.
inline fpga_model::GemmEstimate Plus(const fpga_model::GemmEstimate& a,
                                     const fpga_model::GemmEstimate& b) {
  return {.macs = a.macs + b.macs,
          .cycles = a.cycles + b.cycles,
          .bytes = a.bytes + b.bytes,
          .seconds = a.seconds + b.seconds,
          .joules = a.joules + b.joules};
}

// |got − want| ≤ relative·|want|: the same terms, added up in another order or
// printed in decimal by the metrics exposition.
inline ::testing::AssertionResult NearlyEqual(double got, double want, double relative = 1e-12) {
  if (std::abs(got - want) <= relative * std::abs(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << got << ", want " << want << " (off by " << got - want << ")";
}

// What the daemon has booked for the FPGA model in one phase: the "fpga_model"
// entry of its energy report and its Prometheus counters (bytes and FLOPs of
// the phase and one format). Absent entries and series read 0.
struct ModelBooks {
  double report_joules = 0;
  double report_seconds = 0;
  uint64_t report_requests = 0;
  double metric_joules = 0;   // mxserve_energy_joules_total{source="fpga_model"}
  double metric_seconds = 0;  // mxserve_busy_seconds_total{source="fpga_model"}
  double metric_bytes = 0;    // mxserve_bytes_moved_total
  double metric_flops = 0;    // mxserve_flops_total
};

inline ModelBooks ReadModelBooks(const DaemonProcess& daemon, v1::Phase phase, mx::Format format) {
  ModelBooks books;
  grpc::ClientContext context;
  v1::EnergyReport report;
  const grpc::Status s =
      v1::Telemetry::NewStub(daemon.channel())->GetEnergyReport(&context, {}, &report);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (const v1::EnergyEntry* e = FindEnergyEntry(report, "fpga_model", phase)) {
    books.report_joules = e->joules();
    books.report_seconds = e->busy_seconds();
    books.report_requests = e->requests();
  }
  const std::string m = ScrapeMetrics(daemon.metrics_address());
  EXPECT_FALSE(m.empty()) << "no metrics from " << daemon.metrics_address();
  auto counter = [&](const std::string& series) {
    const double value = MetricValue(m, series);
    return value < 0 ? 0 : value;
  };
  const std::string work = "{format=\"" + std::string(mx::FormatName(format)) + "\",phase=\"" +
                           mxserve::WireName(phase) + "\"}";
  const std::string energy = "{phase=\"" + mxserve::WireName(phase) + "\",source=\"fpga_model\"}";
  books.metric_joules = counter("mxserve_energy_joules_total" + energy);
  books.metric_seconds = counter("mxserve_busy_seconds_total" + energy);
  books.metric_bytes = counter("mxserve_bytes_moved_total" + work);
  books.metric_flops = counter("mxserve_flops_total" + work);
  return books;
}

// From `before` to `after` the books grew by exactly `estimate`, over `requests`
// requests: the report's joules, busy seconds and requests, the joules and
// busy-seconds counters, the bytes moved, and FLOPs of 2 per multiply-accumulate.
inline void ExpectBooked(const ModelBooks& before, const ModelBooks& after,
                         const fpga_model::GemmEstimate& estimate, uint64_t requests) {
  EXPECT_GT(estimate.joules, 0);
  EXPECT_TRUE(NearlyEqual(after.report_joules - before.report_joules, estimate.joules))
      << "energy report: joules";
  EXPECT_TRUE(NearlyEqual(after.report_seconds - before.report_seconds, estimate.seconds))
      << "energy report: busy seconds";
  EXPECT_EQ(after.report_requests - before.report_requests, requests) << "energy report: requests";
  EXPECT_TRUE(NearlyEqual(after.metric_joules - before.metric_joules, estimate.joules))
      << "mxserve_energy_joules_total";
  EXPECT_TRUE(NearlyEqual(after.metric_seconds - before.metric_seconds, estimate.seconds))
      << "mxserve_busy_seconds_total";
  EXPECT_TRUE(NearlyEqual(after.metric_bytes - before.metric_bytes, estimate.bytes))
      << "mxserve_bytes_moved_total";
  EXPECT_TRUE(NearlyEqual(after.metric_flops - before.metric_flops, 2 * estimate.macs))
      << "mxserve_flops_total";
}

// A response's ExecutionInfo carries exactly the estimate of its work.
inline void ExpectInfoIs(const v1::ExecutionInfo& info, const fpga_model::GemmEstimate& estimate) {
  EXPECT_GT(estimate.joules, 0);
  EXPECT_EQ(info.model_seconds(), estimate.seconds);
  EXPECT_EQ(info.model_joules(), estimate.joules);
}

}  // namespace mx_test

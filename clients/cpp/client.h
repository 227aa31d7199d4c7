// mxclient::Client: synchronous calls to every RPC of mxserved — Compute, Models,
// Policies, Telemetry and grpc.health.v1 — over one channel. Errors come back as
// absl::Status with the gRPC code and the daemon's message unchanged.
//
//   mxclient::Client client({.address = "127.0.0.1:50051"});
//   MX_ASSIGN_OR_RETURN(auto info, client.DescribeModel("policy"));
//
// Thread-safe: one Client may serve any number of threads. Compute.Stream lives
// in compute_stream.h (Client::OpenStream).
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "mxserve/v1/compute.grpc.pb.h"
#include "mxserve/v1/models.grpc.pb.h"
#include "mxserve/v1/policies.grpc.pb.h"
#include "mxserve/v1/profiles.grpc.pb.h"
#include "mxserve/v1/telemetry.grpc.pb.h"

namespace mxclient {

namespace v1 = ::mxserve::v1;
class ComputeStream;

struct ClientOptions {
  // A gRPC target: "host:port", several daemons as "ipv4:10.0.0.1:50051,10.0.0.2:50051",
  // or a name resolving to several, e.g. a headless Service's
  // "dns:///mxserved.mxserve.svc.cluster.local:50051" (deploy/k8s).
  std::string address = "127.0.0.1:50051";
  // Deadline of each unary or client-streaming call, from its start;
  // absl::InfiniteDuration() for none. Compute.Stream sessions have no deadline.
  absl::Duration timeout = absl::Seconds(60);
  // Largest message sent or received (channel args GRPC_ARG_MAX_SEND_MESSAGE_LENGTH
  // and GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH); gRPC's default receive limit is 4 MiB,
  // less than one large layer's weights or outputs.
  int max_message_bytes = 256 << 20;
  // gRPC load-balancing policy: round_robin spreads calls over every address the
  // target resolves to (one address: no difference); "" leaves gRPC's default,
  // pick_first. Models and policies live in the daemon that took their calls:
  // register, upload and put on each daemon (a Client per address) before
  // spreading calls that use them over a round_robin channel.
  std::string load_balancing_policy = "round_robin";
  // TLS: with tls_ca_file (PEM CA bundle the daemon's certificate must chain
  // to) the channel speaks TLS; tls_cert_file and tls_key_file (both or
  // neither, and only with TLS) present a client certificate, for a daemon run
  // with --tls-client-ca. All empty: plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Sent as `authorization: Bearer <token>` metadata on every call (over TLS,
  // or plaintext for a loopback daemon); empty: none.
  std::string token;
};

// Reads the TLS files of `options` (an error names the field and the file) and
// checks their combination.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const ClientOptions& options);

// The largest weight chunk UploadWeights sends (whole FP32 elements).
inline constexpr size_t kMaxWeightChunkBytes = size_t{1} << 20;

// One tensor for UploadWeights: a layer's weight ([out_features, in_features]) or
// bias ([out_features]), FP32, row-major.
struct WeightTensor {
  std::string layer = {};
  v1::TensorRole role = v1::TENSOR_ROLE_WEIGHT;
  std::span<const float> values = {};
};

class Client {
 public:
  // The TLS files are read here: Create says when one cannot be read; the
  // constructor aborts with that message.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // Blocks until the channel is connected or `timeout` passes (the channel
  // otherwise connects lazily, on the first call).
  absl::Status WaitForConnected(absl::Duration timeout);

  // grpc.health.v1.Health.Check: the serving status of `service` ("" = the server).
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
      const std::string& service = "");

  // Compute.
  absl::StatusOr<v1::GemmResponse> Gemm(const v1::GemmRequest& request);
  absl::StatusOr<v1::LayerForwardResponse> LayerForward(const v1::LayerForwardRequest& request);
  absl::StatusOr<v1::LayerBackwardResponse> LayerBackward(const v1::LayerBackwardRequest& request);
  // LayerForward without blocking: `done` runs once, on a gRPC thread, when the
  // call ends. `request` is shared, so concurrent calls can send one message.
  // The Client's destructor waits for every such call to finish.
  void LayerForwardAsync(std::shared_ptr<const v1::LayerForwardRequest> request,
                         std::function<void(absl::StatusOr<v1::LayerForwardResponse>)> done);
  // Compute.Stream, see compute_stream.h. The stream must be destroyed before
  // the Client.
  absl::StatusOr<std::unique_ptr<ComputeStream>> OpenStream();

  // Models.
  absl::StatusOr<v1::ModelInfo> RegisterModel(const v1::RegisterModelRequest& request);
  // One UploadWeights stream carrying `tensors` of `model` in FP32 chunks of at
  // most `max_chunk_bytes` (rounded down to whole elements); `publish` makes the
  // staged weights the next version when the stream completes.
  absl::StatusOr<v1::UploadWeightsResponse> UploadWeights(
      const std::string& model, std::span<const WeightTensor> tensors, bool publish,
      size_t max_chunk_bytes = kMaxWeightChunkBytes);
  // The raw form: sends `chunks` as they are, in order.
  absl::StatusOr<v1::UploadWeightsResponse> UploadWeightChunks(
      std::span<const v1::WeightChunk> chunks);
  absl::StatusOr<v1::UploadWeightsResponse> LoadSafetensors(
      const v1::LoadSafetensorsRequest& request);
  absl::StatusOr<v1::ModelInfo> PublishVersion(const std::string& model);
  // Every model, in name order: the daemon's pages joined (no next_page_token).
  absl::StatusOr<v1::ListModelsResponse> ListModels();
  absl::StatusOr<v1::ModelInfo> DescribeModel(const std::string& model);
  absl::StatusOr<v1::DeleteModelResponse> DeleteModel(const std::string& model);

  // Policies.
  absl::StatusOr<v1::PolicyInfo> PutPolicy(const std::string& json);
  absl::StatusOr<v1::PolicyInfo> GetPolicy(const std::string& name);
  absl::StatusOr<v1::ListPoliciesResponse> ListPolicies();
  absl::Status DeletePolicy(const std::string& name);
  // Returns the model's previous policy.
  absl::StatusOr<std::string> SetActivePolicy(const std::string& model, const std::string& policy);
  // `policy` empty: the model's active policy.
  absl::StatusOr<v1::ResolvePolicyResponse> ResolvePolicy(const std::string& model,
                                                          const std::string& policy = "");

  // Profiles.
  // One ProfileModel stream: `config`, then `batches` (none: a weight-only
  // profile). Returns the profile the daemon keeps.
  absl::StatusOr<v1::Profile> ProfileModel(const v1::ProfileConfig& config,
                                           std::span<const v1::CalibrationBatch> batches = {});
  // `version` 0: the model's newest profile.
  absl::StatusOr<v1::Profile> GetProfile(const std::string& model, uint64_t version = 0);
  absl::StatusOr<v1::ListProfilesResponse> ListProfiles(const std::string& model = "");
  // The profile as CSV (a header row, one row per layer and format).
  absl::StatusOr<std::string> ExportProfile(const std::string& model, uint64_t version = 0);
  absl::StatusOr<v1::GeneratePolicyResponse> GeneratePolicy(
      const v1::GeneratePolicyRequest& request);

  // Telemetry.
  absl::StatusOr<v1::ReportPowerResponse> ReportPower(std::span<const v1::PowerSample> samples);
  // `since_unix_seconds` 0: since the daemon started. `run` empty: every run
  // together; otherwise only the energy booked under that run tag, the tag a
  // compute request or power sample carries in its own `run` field (set on the
  // request, as its phase is).
  absl::StatusOr<v1::EnergyReport> GetEnergyReport(double since_unix_seconds = 0,
                                                   const std::string& run = "");

 private:
  // A context carrying the per-call deadline.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  // LayerForwardAsync calls whose ClientContext still exists. Each context holds
  // a reference to the channel; gRPC 1.51 must not see a channel's last reference
  // dropped on one of its callback threads (the shared callback queue would try
  // to join the thread it runs on, grpc/grpc#32584), so ~Client waits for them.
  std::mutex async_mu_;
  std::condition_variable async_cv_;
  int async_in_flight_ = 0;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::unique_ptr<v1::Compute::Stub> compute_;
  std::unique_ptr<v1::Models::Stub> models_;
  std::unique_ptr<v1::Policies::Stub> policies_;
  std::unique_ptr<v1::Telemetry::Stub> telemetry_;
  std::unique_ptr<v1::Profiles::Stub> profiles_;
};

}  // namespace mxclient

#include "clients/cpp/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/cpp/compute_stream.h"
#include "clients/cpp/grpc_status.h"
#include "mx/read_file.h"

namespace mxclient {
namespace {

// A synchronous unary call through a generated stub method.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Unary(Stub* stub,
                               grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                            Response*),
                               grpc::ClientContext* context, const Request& request) {
  Response response;
  const grpc::Status status = (stub->*method)(context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

// The PEM text of `path`, which must hold a block of `kind` ("CERTIFICATE", or
// "PRIVATE KEY" for any key's "-----BEGIN ... PRIVATE KEY-----"): gRPC took any
// file and failed at the first call with "UNAVAILABLE: empty address list"
// after its own log lines, naming neither the flag nor the file.
absl::StatusOr<std::string> ReadPem(const char* field, const std::string& path,
                                    absl::string_view kind) {
  const absl::StatusOr<std::string> read = mx::ReadWholeFile(path);
  if (!read.ok() || read->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot read '", path,
                     "' (missing, unreadable, empty or a directory)"));
  }
  const std::string& pem = *read;
  for (size_t begin = pem.find("-----BEGIN "); begin != std::string::npos;
       begin = pem.find("-----BEGIN ", begin + 11)) {
    const size_t end = pem.find("-----", begin + 11);
    if (end == std::string::npos) break;
    if (absl::StrContains(absl::string_view(pem).substr(begin, end - begin), kind)) return pem;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' holds no PEM ",
                                                 absl::AsciiStrToLower(kind), " (a -----BEGIN ",
                                                 kind, "----- block)"));
}

// Adds `authorization: Bearer <token>` to every call's metadata. An interceptor,
// not call credentials: gRPC sends those over TLS only, and a token must reach
// a plaintext loopback daemon too.
class BearerToken : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(const std::string& value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    methods->Proceed();
  }

 private:
  const std::string& value_;  // owned by the factory, which the channel keeps
};

class BearerTokenFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(value_);
  }

 private:
  const std::string value_;
};

// Everything a callback LayerForward needs until its reaction has run.
struct AsyncForwardCall {
  grpc::ClientContext context;
  std::shared_ptr<const v1::LayerForwardRequest> request;
  v1::LayerForwardResponse response;
  std::function<void(absl::StatusOr<v1::LayerForwardResponse>)> done;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const ClientOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file: give both (a client certificate and its key) or neither");
  }
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_cert_file: a client certificate needs TLS, so tls_ca_file too");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  auto ca = ReadPem("tls_ca_file", options.tls_ca_file, "CERTIFICATE");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = std::move(*ca);
  if (!options.tls_cert_file.empty()) {
    auto cert = ReadPem("tls_cert_file", options.tls_cert_file, "CERTIFICATE");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem("tls_key_file", options.tls_key_file, "PRIVATE KEY");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = std::move(*cert);
    ssl.pem_private_key = std::move(*key);
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentialsFor(options);
  if (!credentials.ok()) return credentials.status();
  return std::make_unique<Client>(std::move(options));
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentialsFor(options_);
  if (!credentials.ok()) {
    std::fprintf(stderr, "mxclient::Client: %s\n",
                 std::string(credentials.status().message()).c_str());
    std::abort();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  if (!options_.load_balancing_policy.empty()) {
    args.SetLoadBalancingPolicyName(options_.load_balancing_policy);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options_.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenFactory>(options_.token));
  }
  channel_ = grpc::experimental::CreateCustomChannelWithInterceptors(options_.address, *credentials,
                                                                     args, std::move(interceptors));
  health_ = grpc::health::v1::Health::NewStub(channel_);
  compute_ = v1::Compute::NewStub(channel_);
  models_ = v1::Models::NewStub(channel_);
  policies_ = v1::Policies::NewStub(channel_);
  telemetry_ = v1::Telemetry::NewStub(channel_);
  profiles_ = v1::Profiles::NewStub(channel_);
}

Client::~Client() {
  std::unique_lock lock(async_mu_);
  async_cv_.wait(lock, [this] { return async_in_flight_ == 0; });
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (options_.timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  }
  return context;
}

absl::Status Client::WaitForConnected(absl::Duration timeout) {
  if (channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("cannot connect to ", options_.address, " within ",
                                             absl::FormatDuration(timeout)));
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::CheckHealth(
    const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  auto context = NewContext();
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> response =
      Unary(health_.get(), &grpc::health::v1::Health::Stub::Check, context.get(), request);
  if (!response.ok()) return response.status();
  return response->status();
}

absl::StatusOr<v1::GemmResponse> Client::Gemm(const v1::GemmRequest& request) {
  auto context = NewContext();
  return Unary(compute_.get(), &v1::Compute::Stub::Gemm, context.get(), request);
}

absl::StatusOr<v1::LayerForwardResponse> Client::LayerForward(
    const v1::LayerForwardRequest& request) {
  auto context = NewContext();
  return Unary(compute_.get(), &v1::Compute::Stub::LayerForward, context.get(), request);
}

absl::StatusOr<v1::LayerBackwardResponse> Client::LayerBackward(
    const v1::LayerBackwardRequest& request) {
  auto context = NewContext();
  return Unary(compute_.get(), &v1::Compute::Stub::LayerBackward, context.get(), request);
}

void Client::LayerForwardAsync(std::shared_ptr<const v1::LayerForwardRequest> request,
                               std::function<void(absl::StatusOr<v1::LayerForwardResponse>)> done) {
  auto* call = new AsyncForwardCall;
  call->request = std::move(request);
  call->done = std::move(done);
  if (options_.timeout != absl::InfiniteDuration()) {
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  }
  {
    std::lock_guard lock(async_mu_);
    ++async_in_flight_;
  }
  compute_->async()->LayerForward(&call->context, call->request.get(), &call->response,
                                  [this, call](grpc::Status status) {
                                    {
                                      std::unique_ptr<AsyncForwardCall> owned(call);
                                      if (status.ok()) {
                                        owned->done(std::move(owned->response));
                                      } else {
                                        owned->done(FromGrpcStatus(status));
                                      }
                                    }  // the context, and its channel reference, are gone
                                    std::lock_guard lock(async_mu_);
                                    if (--async_in_flight_ == 0) async_cv_.notify_all();
                                  });
}

absl::StatusOr<std::unique_ptr<ComputeStream>> Client::OpenStream() {
  return ComputeStream::Open(compute_.get());
}

absl::StatusOr<v1::ModelInfo> Client::RegisterModel(const v1::RegisterModelRequest& request) {
  auto context = NewContext();
  return Unary(models_.get(), &v1::Models::Stub::RegisterModel, context.get(), request);
}

absl::StatusOr<v1::UploadWeightsResponse> Client::UploadWeights(
    const std::string& model, std::span<const WeightTensor> tensors, bool publish,
    size_t max_chunk_bytes) {
  if (tensors.empty()) {
    return absl::InvalidArgumentError("UploadWeights: no tensors to upload");
  }
  const size_t chunk_elements = std::max<size_t>(1, max_chunk_bytes / sizeof(float));
  auto context = NewContext();
  v1::UploadWeightsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::WeightChunk>> writer =
      models_->UploadWeights(context.get(), &response);
  v1::WeightChunk chunk;
  bool stream_open = true;
  for (const WeightTensor& tensor : tensors) {
    // An empty tensor still sends one (empty) chunk, so the daemon sees it.
    size_t offset = 0;
    do {
      const size_t count = std::min(chunk_elements, tensor.values.size() - offset);
      chunk.set_model(model);
      chunk.set_layer(tensor.layer);
      chunk.set_role(tensor.role);
      chunk.set_dtype(v1::DTYPE_FP32);
      chunk.set_offset_elements(offset);
      chunk.set_data(reinterpret_cast<const char*>(tensor.values.data() + offset),
                     count * sizeof(float));
      chunk.set_publish(publish);
      // A failed write means the daemon ended the call; Finish says why.
      stream_open = writer->Write(chunk);
      offset += count;
    } while (stream_open && offset < tensor.values.size());
    if (!stream_open) break;
  }
  if (stream_open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::UploadWeightsResponse> Client::UploadWeightChunks(
    std::span<const v1::WeightChunk> chunks) {
  auto context = NewContext();
  v1::UploadWeightsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::WeightChunk>> writer =
      models_->UploadWeights(context.get(), &response);
  bool stream_open = true;
  for (const v1::WeightChunk& chunk : chunks) {
    if (!(stream_open = writer->Write(chunk))) break;
  }
  if (stream_open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::UploadWeightsResponse> Client::LoadSafetensors(
    const v1::LoadSafetensorsRequest& request) {
  auto context = NewContext();
  return Unary(models_.get(), &v1::Models::Stub::LoadSafetensors, context.get(), request);
}

absl::StatusOr<v1::ModelInfo> Client::PublishVersion(const std::string& model) {
  v1::PublishVersionRequest request;
  request.set_model(model);
  auto context = NewContext();
  return Unary(models_.get(), &v1::Models::Stub::PublishVersion, context.get(), request);
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels() {
  v1::ListModelsResponse all;
  v1::ListModelsRequest request;
  do {
    auto context = NewContext();
    absl::StatusOr<v1::ListModelsResponse> page =
        Unary(models_.get(), &v1::Models::Stub::ListModels, context.get(), request);
    if (!page.ok()) return page.status();
    for (v1::ModelInfo& model : *page->mutable_models()) all.add_models()->Swap(&model);
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::ModelInfo> Client::DescribeModel(const std::string& model) {
  v1::DescribeModelRequest request;
  request.set_name(model);
  auto context = NewContext();
  return Unary(models_.get(), &v1::Models::Stub::DescribeModel, context.get(), request);
}

absl::StatusOr<v1::DeleteModelResponse> Client::DeleteModel(const std::string& model) {
  v1::DeleteModelRequest request;
  request.set_name(model);
  auto context = NewContext();
  return Unary(models_.get(), &v1::Models::Stub::DeleteModel, context.get(), request);
}

absl::StatusOr<v1::PolicyInfo> Client::PutPolicy(const std::string& json) {
  v1::PutPolicyRequest request;
  request.set_json(json);
  auto context = NewContext();
  return Unary(policies_.get(), &v1::Policies::Stub::PutPolicy, context.get(), request);
}

absl::StatusOr<v1::PolicyInfo> Client::GetPolicy(const std::string& name) {
  v1::GetPolicyRequest request;
  request.set_name(name);
  auto context = NewContext();
  return Unary(policies_.get(), &v1::Policies::Stub::GetPolicy, context.get(), request);
}

absl::StatusOr<v1::ListPoliciesResponse> Client::ListPolicies() {
  auto context = NewContext();
  return Unary(policies_.get(), &v1::Policies::Stub::ListPolicies, context.get(),
               v1::ListPoliciesRequest());
}

absl::Status Client::DeletePolicy(const std::string& name) {
  v1::DeletePolicyRequest request;
  request.set_name(name);
  auto context = NewContext();
  return Unary(policies_.get(), &v1::Policies::Stub::DeletePolicy, context.get(), request).status();
}

absl::StatusOr<std::string> Client::SetActivePolicy(const std::string& model,
                                                    const std::string& policy) {
  v1::SetActivePolicyRequest request;
  request.set_model(model);
  request.set_policy(policy);
  auto context = NewContext();
  absl::StatusOr<v1::SetActivePolicyResponse> response =
      Unary(policies_.get(), &v1::Policies::Stub::SetActivePolicy, context.get(), request);
  if (!response.ok()) return response.status();
  return response->previous_policy();
}

absl::StatusOr<v1::ResolvePolicyResponse> Client::ResolvePolicy(const std::string& model,
                                                                const std::string& policy) {
  v1::ResolvePolicyRequest request;
  request.set_model(model);
  request.set_policy(policy);
  auto context = NewContext();
  return Unary(policies_.get(), &v1::Policies::Stub::ResolvePolicy, context.get(), request);
}

absl::StatusOr<v1::ReportPowerResponse> Client::ReportPower(
    std::span<const v1::PowerSample> samples) {
  auto context = NewContext();
  v1::ReportPowerResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PowerSample>> writer =
      telemetry_->ReportPower(context.get(), &response);
  bool stream_open = true;
  for (const v1::PowerSample& sample : samples) {
    if (!(stream_open = writer->Write(sample))) break;
  }
  if (stream_open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::EnergyReport> Client::GetEnergyReport(double since_unix_seconds,
                                                         const std::string& run) {
  v1::GetEnergyReportRequest request;
  request.set_since_seconds(since_unix_seconds);
  request.set_run(run);
  auto context = NewContext();
  return Unary(telemetry_.get(), &v1::Telemetry::Stub::GetEnergyReport, context.get(), request);
}

absl::StatusOr<v1::Profile> Client::ProfileModel(const v1::ProfileConfig& config,
                                                 std::span<const v1::CalibrationBatch> batches) {
  auto context = NewContext();
  v1::Profile profile;
  std::unique_ptr<grpc::ClientWriter<v1::ProfileRequest>> writer =
      profiles_->ProfileModel(context.get(), &profile);
  v1::ProfileRequest request;
  *request.mutable_config() = config;
  bool stream_open = writer->Write(request);
  for (const v1::CalibrationBatch& batch : batches) {
    if (!stream_open) break;
    *request.mutable_batch() = batch;
    stream_open = writer->Write(request);
  }
  if (stream_open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return profile;
}

absl::StatusOr<v1::Profile> Client::GetProfile(const std::string& model, uint64_t version) {
  v1::GetProfileRequest request;
  request.set_model(model);
  request.set_weight_version(version);
  auto context = NewContext();
  return Unary(profiles_.get(), &v1::Profiles::Stub::GetProfile, context.get(), request);
}

absl::StatusOr<v1::ListProfilesResponse> Client::ListProfiles(const std::string& model) {
  v1::ListProfilesRequest request;
  request.set_model(model);
  auto context = NewContext();
  return Unary(profiles_.get(), &v1::Profiles::Stub::ListProfiles, context.get(), request);
}

absl::StatusOr<std::string> Client::ExportProfile(const std::string& model, uint64_t version) {
  v1::ExportProfileRequest request;
  request.set_model(model);
  request.set_weight_version(version);
  auto context = NewContext();
  absl::StatusOr<v1::ExportProfileResponse> response =
      Unary(profiles_.get(), &v1::Profiles::Stub::ExportProfile, context.get(), request);
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_csv());
}

absl::StatusOr<v1::GeneratePolicyResponse> Client::GeneratePolicy(
    const v1::GeneratePolicyRequest& request) {
  auto context = NewContext();
  return Unary(profiles_.get(), &v1::Profiles::Stub::GeneratePolicy, context.get(), request);
}

}  // namespace mxclient

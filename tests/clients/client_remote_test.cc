// The C++ client library against a real mxserved on 127.0.0.1 (started and
// stopped by tests/daemon/daemon_process.h): status codes, chunked uploads, sync
// and async LayerForward, Compute.Stream sessions, deadlines.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "clients/cpp/client.h"
#include "clients/cpp/compute_stream.h"
#include "clients/cpp/tensor.h"
#include "tests/daemon/daemon_process.h"

namespace {

namespace v1 = ::mxserve::v1;

std::vector<float> RandomFloats(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

class ClientAgainstDaemon : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new mx_test::DaemonProcess({"--backend", "cpu", "--workers", "2"});
  }
  static void TearDownTestSuite() { mx_test::StopSuiteDaemon(daemon_); }
  void SetUp() override {
    ASSERT_TRUE(daemon_->ok());
    client_ = std::make_unique<mxclient::Client>(
        mxclient::ClientOptions{.address = daemon_->grpc_address()});
  }

  // A model with one layer `proj` of out×in, seeded weights, published.
  std::vector<float> RegisterWithWeights(const std::string& model, int64_t out, int64_t in) {
    v1::RegisterModelRequest request;
    request.set_name(model);
    v1::LayerSpec* layer = request.add_layers();
    layer->set_name("proj");
    layer->set_out_features(out);
    layer->set_in_features(in);
    EXPECT_TRUE(client_->RegisterModel(request).ok());
    std::vector<float> weight = RandomFloats(static_cast<size_t>(out * in), 3);
    const mxclient::WeightTensor tensors[] = {{.layer = "proj", .values = weight}};
    absl::StatusOr<v1::UploadWeightsResponse> upload =
        client_->UploadWeights(model, tensors, /*publish=*/true);
    EXPECT_TRUE(upload.ok()) << upload.status();
    if (upload.ok()) {
      EXPECT_EQ(upload->weight_version(), 1u);
    }
    return weight;
  }

  static v1::LayerForwardRequest Forward(const std::string& model, const std::string& layer,
                                         const std::vector<float>& x, int64_t m, int64_t k) {
    v1::LayerForwardRequest request;
    request.set_model(model);
    request.set_layer(layer);
    request.set_phase(v1::PHASE_ROLLOUT);
    request.set_format(v1::FORMAT_MXFP4_E2M1);
    *request.mutable_input()->mutable_tensor() = mxclient::MakeFloat32Tensor(x, {m, k}).value();
    return request;
  }

  static mx_test::DaemonProcess* daemon_;
  std::unique_ptr<mxclient::Client> client_;
};

mx_test::DaemonProcess* ClientAgainstDaemon::daemon_ = nullptr;

TEST_F(ClientAgainstDaemon, HealthAndStatusCodes) {
  EXPECT_EQ(client_->CheckHealth().value(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(client_->CheckHealth("mxserve.v1.Models").value(),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(client_->CheckHealth("nope").status().code(), absl::StatusCode::kNotFound);
  const absl::Status missing = client_->DescribeModel("no-such-model").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("no-such-model"), std::string::npos) << missing;

  mxclient::Client unreachable({.address = "127.0.0.1:1", .timeout = absl::Seconds(5)});
  EXPECT_EQ(unreachable.ListModels().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ClientAgainstDaemon, UploadInChunksThenForwardSyncAndAsyncAgree) {
  // 600 × 512 FP32 is 1.2 MB: two chunks of at most 1 MiB.
  const std::vector<float> weight = RegisterWithWeights("chunky", 600, 512);
  const v1::ModelInfo info = client_->DescribeModel("chunky").value();
  EXPECT_EQ(info.weight_version(), 1u);

  const std::vector<float> x = RandomFloats(3 * 512, 4);
  const v1::LayerForwardRequest request = Forward("chunky", "proj", x, 3, 512);
  absl::StatusOr<v1::LayerForwardResponse> sync = client_->LayerForward(request);
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(sync->info().format(), v1::FORMAT_MXFP4_E2M1);
  const std::vector<float> y = mxclient::TensorToFloats(sync->output(), {3, 600}).value();

  std::promise<absl::StatusOr<v1::LayerForwardResponse>> async_result;
  client_->LayerForwardAsync(std::make_shared<const v1::LayerForwardRequest>(request),
                             [&](absl::StatusOr<v1::LayerForwardResponse> response) {
                               async_result.set_value(std::move(response));
                             });
  absl::StatusOr<v1::LayerForwardResponse> async = async_result.get_future().get();
  ASSERT_TRUE(async.ok()) << async.status();
  EXPECT_EQ(mxclient::TensorToFloats(async->output(), {3, 600}).value(), y);
  EXPECT_TRUE(client_->DeleteModel("chunky").ok());
}

// ProfileModel's stream with calibration batches, then what reads the profile
// and a policy generated from it.
TEST_F(ClientAgainstDaemon, ProfileWithCalibrationThenGenerate) {
  RegisterWithWeights("client-profiled", 16, 64);
  v1::ProfileConfig config;
  config.set_model("client-profiled");
  config.add_formats(v1::FORMAT_MXFP4_E2M1);
  config.add_formats(v1::FORMAT_MXFP8_E4M3);
  std::vector<v1::CalibrationBatch> batches(2);
  for (int i = 0; i < 2; ++i) {
    batches[i].set_layer("proj");
    *batches[i].mutable_inputs() =
        mxclient::MakeFloat32Tensor(RandomFloats(3 * 64, 10 + i), {3, 64}).value();
    *batches[i].mutable_output_grads() =
        mxclient::MakeFloat32Tensor(RandomFloats(3 * 16, 20 + i), {3, 16}).value();
  }
  absl::StatusOr<v1::Profile> profile = client_->ProfileModel(config, batches);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->source(), v1::PROFILE_SOURCE_GRADIENTS);
  EXPECT_EQ(profile->tokens(), 6u);
  ASSERT_EQ(profile->layers_size(), 1);
  EXPECT_GT(profile->layers(0).scores(0).rel_error(), profile->layers(0).scores(1).rel_error());
  EXPECT_TRUE(profile->layers(0).scores(0).has_fisher());

  absl::StatusOr<v1::Profile> kept = client_->GetProfile("client-profiled");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->SerializeAsString(), profile->SerializeAsString());
  absl::StatusOr<std::string> csv = client_->ExportProfile("client-profiled");
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(std::count(csv->begin(), csv->end(), '\n'), 3);  // header + 1 layer × 2 formats
  absl::StatusOr<v1::ListProfilesResponse> list = client_->ListProfiles("client-profiled");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->profiles_size(), 1);

  v1::GeneratePolicyRequest request;
  request.set_model("client-profiled");
  request.set_name("client-generated");
  request.set_kind(v1::GENERATION_KIND_FRACTION);
  request.set_low(v1::FORMAT_MXFP4_E2M1);
  request.add_fractions()->set_value(1.0);
  request.set_dry_run(true);
  absl::StatusOr<v1::GeneratePolicyResponse> generated = client_->GeneratePolicy(request);
  ASSERT_TRUE(generated.ok()) << generated.status();
  ASSERT_EQ(generated->entries_size(), 3);
  for (const auto& entry : generated->entries()) EXPECT_EQ(entry.format(), v1::FORMAT_MXFP4_E2M1);

  // A stream the daemon refuses comes back as its status.
  batches[1].set_layer("nope");
  absl::StatusOr<v1::Profile> refused = client_->ProfileModel(config, batches);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_TRUE(client_->DeleteModel("client-profiled").ok());
}

TEST_F(ClientAgainstDaemon, StreamAnswersEveryRequestByIdErrorsIncluded) {
  RegisterWithWeights("streamed", 64, 96);
  const std::vector<float> x = RandomFloats(2 * 96, 5);
  const v1::LayerForwardResponse expected =
      client_->LayerForward(Forward("streamed", "proj", x, 2, 96)).value();

  std::unique_ptr<mxclient::ComputeStream> stream = client_->OpenStream().value();
  std::mutex mu;
  std::map<uint64_t, absl::StatusOr<v1::StreamResponse>> outcomes;
  std::vector<uint64_t> good_ids;
  uint64_t bad_id = 0;
  for (int i = 0; i < 20; ++i) {
    v1::StreamRequest request;
    const bool bad = i == 7;
    *request.mutable_forward() = Forward("streamed", bad ? "no_such_layer" : "proj", x, 2, 96);
    absl::StatusOr<uint64_t> id =
        stream->Submit(request, [&mu, &outcomes](absl::StatusOr<v1::StreamResponse> r) {
          std::lock_guard lock(mu);
          const uint64_t key = r.ok() ? r->request_id() : 0;
          outcomes.emplace(key == 0 ? 1000 + outcomes.size() : key, std::move(r));
        });
    ASSERT_TRUE(id.ok()) << id.status();
    (bad ? bad_id : good_ids.emplace_back()) = *id;
  }
  // A caller-chosen id, and a blocking call on the same stream.
  v1::StreamRequest chosen;
  chosen.set_request_id(424242);
  *chosen.mutable_forward() = Forward("streamed", "proj", x, 2, 96);
  absl::StatusOr<v1::StreamResponse> call = stream->Call(chosen);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request_id(), 424242u);

  EXPECT_TRUE(stream->Close().ok());
  EXPECT_EQ(stream->InFlight(), 0u);
  EXPECT_EQ(outcomes.size(), 20u);
  for (const uint64_t id : good_ids) {
    ASSERT_TRUE(outcomes.contains(id)) << id;
    ASSERT_TRUE(outcomes.at(id).ok()) << outcomes.at(id).status();
    EXPECT_EQ(outcomes.at(id)->forward().output().data(), expected.output().data());
  }
  EXPECT_FALSE(outcomes.contains(bad_id));
  int failures = 0;
  for (const auto& [key, outcome] : outcomes) {
    if (!outcome.ok()) {
      ++failures;
      EXPECT_EQ(outcome.status().code(), absl::StatusCode::kNotFound) << outcome.status();
      EXPECT_NE(outcome.status().message().find("no_such_layer"), std::string::npos);
    }
  }
  EXPECT_EQ(failures, 1);
  // Closed: no more submissions.
  EXPECT_EQ(stream->Submit(chosen, [](auto) {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client_->DeleteModel("streamed").ok());
}

// A run tag is a request field, as the phase is; GetEnergyReport reads one run.
TEST_F(ClientAgainstDaemon, RunTagsGoOnTheRequestAndFilterTheEnergyReport) {
  RegisterWithWeights("tagged", 32, 64);
  const std::vector<float> x = RandomFloats(3 * 64, 6);
  v1::LayerForwardRequest request = Forward("tagged", "proj", x, 3, 64);
  request.set_run("client-test/run-1");
  const v1::LayerForwardResponse unary = client_->LayerForward(request).value();
  // The same request on a stream, booked under the same run.
  std::unique_ptr<mxclient::ComputeStream> stream = client_->OpenStream().value();
  v1::StreamRequest streamed;
  *streamed.mutable_forward() = request;
  const absl::StatusOr<v1::StreamResponse> answer = stream->Call(streamed);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(stream->Close().ok());

  const v1::EnergyReport report = client_->GetEnergyReport(0, "client-test/run-1").value();
  EXPECT_EQ(report.run(), "client-test/run-1");
  ASSERT_EQ(report.entries_size(), 1);
  EXPECT_EQ(report.entries(0).source(), "fpga_model");
  EXPECT_EQ(report.entries(0).phase(), v1::PHASE_ROLLOUT);
  EXPECT_EQ(report.entries(0).requests(), 2u);
  EXPECT_EQ(report.entries(0).joules(),
            unary.info().model_joules() + answer->forward().info().model_joules());
  EXPECT_EQ(client_->GetEnergyReport(0, "client-test/other").value().entries_size(), 0);
  // The daemon's rule, its message naming the field.
  const absl::StatusOr<v1::EnergyReport> bad = client_->GetEnergyReport(0, "a b");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("run: expected 1-64 characters"), std::string::npos)
      << bad.status();
  EXPECT_TRUE(client_->DeleteModel("tagged").ok());
}

TEST_F(ClientAgainstDaemon, DestroyingAnOpenStreamCancelsIt) {
  std::unique_ptr<mxclient::ComputeStream> stream = client_->OpenStream().value();
  stream.reset();  // must neither hang nor crash
  SUCCEED();
}

TEST_F(ClientAgainstDaemon, DeadlinesComeBackAsDeadlineExceeded) {
  // 17 MB of operands and a 0.5 GFLOP GEMM cannot make a 1 ms deadline.
  v1::GemmRequest request;
  request.set_phase(v1::PHASE_UPDATE);
  request.set_format(v1::FORMAT_FP32);
  *request.mutable_a()->mutable_tensor() =
      mxclient::MakeFloat32Tensor(RandomFloats(64 * 4096, 1), {64, 4096}).value();
  *request.mutable_b()->mutable_tensor() =
      mxclient::MakeFloat32Tensor(RandomFloats(4096 * 1024, 2), {4096, 1024}).value();
  mxclient::Client hurried({.address = daemon_->grpc_address(), .timeout = absl::Milliseconds(1)});
  EXPECT_EQ(hurried.Gemm(request).status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Gemm calls a daemon has served, from its /metrics (0 before the first).
double GemmsServed(const mx_test::DaemonProcess& daemon) {
  const double value = mx_test::MetricValue(
      mx_test::ScrapeMetrics(daemon.metrics_address()),
      R"(mxserve_requests_total{backend="cpu",format="FP32",phase="rollout",rpc="Gemm"})");
  return value < 0 ? 0 : value;
}

// One target naming two daemons, as a headless Service's DNS name resolves to
// every pod (deploy/k8s): the client's round_robin spreads calls over both,
// while pick_first (mxctl's choice) sends them all to one.
// The daemon answers ListModels in pages under --max-message-bytes; the client
// follows next_page_token and gives every model in one response.
TEST(ClientListModels, JoinsTheDaemonsPages) {
  mx_test::DaemonProcess daemon({"--max-message-bytes", "64K"});
  ASSERT_TRUE(daemon.ok());
  mxclient::Client client(mxclient::ClientOptions{.address = daemon.grpc_address()});
  for (int m = 0; m < 7; ++m) {  // about 17 KB of ModelInfo each: three a page
    v1::RegisterModelRequest request;
    request.set_name(absl::StrCat("m", 6 - m));
    for (int l = 0; l < 80; ++l) {
      v1::LayerSpec* layer = request.add_layers();
      layer->set_name(absl::StrCat(std::string(200, static_cast<char>('a' + m)), l));
      layer->set_out_features(1);
      layer->set_in_features(1);
    }
    ASSERT_TRUE(client.RegisterModel(request).ok());
  }
  const absl::StatusOr<v1::ListModelsResponse> all = client.ListModels();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->models_size(), 7);
  for (int m = 0; m < 7; ++m) EXPECT_EQ(all->models(m).name(), absl::StrCat("m", m));
  EXPECT_EQ(all->next_page_token(), "");
}

TEST(ClientLoadBalancing, RoundRobinSpreadsCallsOverEveryDaemonOfTheTarget) {
  mx_test::DaemonProcess first({"--backend", "cpu", "--workers", "1"});
  mx_test::DaemonProcess second({"--backend", "cpu", "--workers", "1"});
  ASSERT_TRUE(first.ok() && second.ok());
  const std::string target =
      absl::StrCat("ipv4:", first.grpc_address(), ",", second.grpc_address());
  v1::GemmRequest request;
  request.set_phase(v1::PHASE_ROLLOUT);
  request.set_format(v1::FORMAT_FP32);
  *request.mutable_a()->mutable_tensor() =
      mxclient::MakeFloat32Tensor(RandomFloats(4 * 32, 1), {4, 32}).value();
  *request.mutable_b()->mutable_tensor() =
      mxclient::MakeFloat32Tensor(RandomFloats(32 * 8, 2), {32, 8}).value();
  constexpr int kCalls = 20;
  for (const bool pick_first : {false, true}) {
    SCOPED_TRACE(pick_first ? "pick_first" : "the default, round_robin");
    mxclient::ClientOptions options{.address = target};
    if (pick_first) options.load_balancing_policy = "pick_first";
    const double before[] = {GemmsServed(first), GemmsServed(second)};
    {
      mxclient::Client client(options);
      ASSERT_TRUE(client.WaitForConnected(absl::Seconds(10)).ok());
      for (int call = 0; call < kCalls; ++call) {
        absl::StatusOr<v1::GemmResponse> response = client.Gemm(request);
        ASSERT_TRUE(response.ok()) << response.status();
      }
    }
    const double served[] = {GemmsServed(first) - before[0], GemmsServed(second) - before[1]};
    EXPECT_EQ(served[0] + served[1], kCalls);
    if (pick_first) {
      EXPECT_TRUE(served[0] == 0 || served[1] == 0) << served[0] << " and " << served[1];
    } else {
      EXPECT_GT(served[0], 0);
      EXPECT_GT(served[1], 0);
    }
  }
  EXPECT_EQ(first.Stop(), 0) << first.Log();
  EXPECT_EQ(second.Stop(), 0) << second.Log();
}

}  // namespace

// Authorization over the real daemon (server/rpc/access.h): every RPC for every
// role as the daemon's table says, the ownership scenario of issue 21 (another
// trainer overwrites, deletes), the quotas exactly at their limits, and the
// health service open without credentials.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "mxserve/v1/compute.grpc.pb.h"
#include "mxserve/v1/models.grpc.pb.h"
#include "mxserve/v1/policies.grpc.pb.h"
#include "server/options.h"
#include "server/rpc/access.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/raw_call.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace mx_test {
namespace {

using mxserve::Role;
using mxserve::Rpc;

constexpr char kAlice[] = "tok-alice-7f3e";  // train
constexpr char kBob[] = "tok-bob-91ac";      // train
constexpr char kCarol[] = "tok-carol-44d0";  // compute
constexpr char kRoot[] = "tok-root-0b5e";    // admin

// A tokens file in a fresh directory, removed with it.
class TokensFile {
 public:
  TokensFile() {
    dir_ = std::filesystem::temp_directory_path() /
           ("mxserve_auth_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    std::ofstream(path()) << "# test principals\n"
                          << kAlice << " alice train\n"
                          << kBob << " bob train\n"
                          << kCarol << " carol compute\n"
                          << kRoot << " root admin\n";
  }
  ~TokensFile() { std::filesystem::remove_all(dir_); }
  std::string path() const { return (dir_ / "tokens").string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
};

std::string MethodName(const char* path) {
  const std::string full(path);
  return full.substr(full.rfind('/') + 1);
}

// The calls the ownership and quota tests make as one principal or another
// (`token`).
grpc::Status DeleteModelAs(const std::shared_ptr<grpc::Channel>& channel, const char* token,
                           const std::string& name) {
  grpc::ClientContext context;
  Authorize(context, token);
  v1::DeleteModelRequest request;
  request.set_name(name);
  v1::DeleteModelResponse response;
  return v1::Models::NewStub(channel)->DeleteModel(&context, request, &response);
}

grpc::Status DeletePolicyAs(const std::shared_ptr<grpc::Channel>& channel, const char* token,
                            const std::string& name) {
  grpc::ClientContext context;
  Authorize(context, token);
  v1::DeletePolicyRequest request;
  request.set_name(name);
  v1::DeletePolicyResponse response;
  return v1::Policies::NewStub(channel)->DeletePolicy(&context, request, &response);
}

grpc::Status PutPolicyAs(const std::shared_ptr<grpc::Channel>& channel, const char* token,
                         const std::string& json, v1::PolicyInfo* info) {
  grpc::ClientContext context;
  Authorize(context, token);
  v1::PutPolicyRequest request;
  request.set_json(json);
  return v1::Policies::NewStub(channel)->PutPolicy(&context, request, info);
}

Rpc RpcNamed(const std::string& name) {
  for (int i = 0; i < static_cast<int>(Rpc::kCount); ++i) {
    if (mxserve::RpcName(static_cast<Rpc>(i)) == name) return static_cast<Rpc>(i);
  }
  ADD_FAILURE() << "no Rpc named " << name;
  return Rpc::kCount;
}

class AuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokens_ = new TokensFile;
    daemon_ = new DaemonProcess({"--auth-tokens", tokens_->path()});
  }
  static void TearDownTestSuite() {
    StopSuiteDaemon(daemon_);
    delete tokens_;
    tokens_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(daemon_->ok()); }

  static inline TokensFile* tokens_ = nullptr;
  static inline DaemonProcess* daemon_ = nullptr;
};

// Every RPC with a minimal valid request (the empty message: each field at its
// default; streams send none), as each kind of caller. "Allowed" is any status
// but UNAUTHENTICATED and PERMISSION_DENIED: the request itself may still be
// refused for what it says.
TEST_F(AuthTest, EveryRpcForEveryRoleAsTheTableSays) {
  struct Caller {
    std::string label, token;
    std::optional<Role> role;  // none: not authenticated
  };
  const std::vector<Caller> callers = {{"no token", "", std::nullopt},
                                       {"wrong token", "tok-nobody", std::nullopt},
                                       {"compute", kCarol, Role::kCompute},
                                       {"train", kAlice, Role::kTrain},
                                       {"admin", kRoot, Role::kAdmin}};
  int checked = 0;
  for (const auto& method : mx_fuzz::kRpcMethods) {
    const std::string name = MethodName(method.name);
    const mxserve::AccessRule rule = mxserve::RuleOf(RpcNamed(name));
    const std::vector<std::string> messages =
        method.streaming ? std::vector<std::string>{} : std::vector<std::string>{""};
    for (const Caller& caller : callers) {
      SCOPED_TRACE(name + " as " + caller.label);
      const grpc::Status status =
          RawCall(daemon_->channel(), method.name, messages, 30, caller.token).status;
      if (!caller.role) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(), caller.token.empty()
                                                                  ? "no credentials"
                                                                  : "not one of --auth-tokens"))
            << status.error_message();
      } else if (*caller.role < rule.role) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << status.error_message();
        EXPECT_TRUE(absl::StrContains(
            status.error_message(),
            name + " needs role " +
                (rule.owned == mxserve::Owned::kNothing ? std::string(mxserve::RoleName(rule.role))
                                                        : std::string("admin or the")) +
                ""))
            << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(), "principal 'carol' has role compute"))
            << status.error_message();
      } else {
        EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << status.error_message();
        EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(Rpc::kCount) * 5);
  // The daemon kept serving.
  EXPECT_TRUE(
      RawCall(daemon_->channel(), "/mxserve.v1.Models/ListModels", {""}, 30, kCarol).status.ok());
}

TEST_F(AuthTest, HealthNeedsNoCredentials) {
  const RawResult result = RawCall(daemon_->channel(), "/grpc.health.v1.Health/Check", {""});
  EXPECT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.responses.size(), 1u);
}

TEST_F(AuthTest, MalformedAuthorizationIsUnauthenticated) {
  grpc::ClientContext context;
  context.AddMetadata("authorization", std::string("Basic ") + kRoot);
  v1::ListModelsResponse response;
  const grpc::Status status =
      v1::Models::NewStub(daemon_->channel())->ListModels(&context, {}, &response);
  EXPECT_STATUS(status, UNAUTHENTICATED, "authorization: expected `Bearer <token>`");
}

// The issue's scenario: bob, a trainer too, overwrites alice's weights, deletes
// her policy and her model. Each fails naming alice; alice and an admin succeed.
TEST_F(AuthTest, OwnershipScenario) {
  const std::vector<TestLayer> layers = {MakeLayer("fc", 8, 16, true, 21)};
  ASSERT_TRUE(Register(daemon_->channel().get(), "alice-model", layers, "", kAlice).ok());
  v1::UploadWeightsResponse uploaded;
  ASSERT_TRUE(
      Upload(daemon_->channel().get(), "alice-model", layers, true, &uploaded, 1000, kAlice).ok());
  auto models = v1::Models::NewStub(daemon_->channel());
  auto policies = v1::Policies::NewStub(daemon_->channel());
  auto compute = v1::Compute::NewStub(daemon_->channel());

  // Owners are shown.
  {
    grpc::ClientContext context;
    Authorize(context, kCarol);
    v1::DescribeModelRequest request;
    request.set_name("alice-model");
    v1::ModelInfo info;
    ASSERT_TRUE(models->DescribeModel(&context, request, &info).ok());
    EXPECT_EQ(info.owner(), "alice");
    grpc::ClientContext list_context;
    Authorize(list_context, kBob);
    v1::ListModelsResponse list;
    ASSERT_TRUE(models->ListModels(&list_context, {}, &list).ok());
    bool found = false;
    for (const auto& m : list.models()) {
      if (m.name() == "alice-model") found = m.owner() == "alice";
    }
    EXPECT_TRUE(found);
  }

  // Bob may compute with alice's model...
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::LayerForwardResponse out;
    const grpc::Status s = compute->LayerForward(
        &context,
        ForwardRequest("alice-model", layers[0], v1::PHASE_ROLLOUT, 0, TestValues(2 * 16, 3), 2),
        &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // ...and take gradients of it, but not add them to what her model will become
  // (LayerBackward.accumulate_grad: the daemon's optimizer steps them); she may.
  {
    v1::LayerBackwardRequest request =
        BackwardRequest("alice-model", layers[0], v1::PHASE_UPDATE, static_cast<int>(mx::Format::kFp32),
                        TestValues(2 * 8, 4), TestValues(2 * 16, 5), 2);
    request.set_accumulate_grad(true);
    v1::LayerBackwardResponse out;
    grpc::ClientContext bob;
    Authorize(bob, kBob);
    EXPECT_STATUS(compute->LayerBackward(&bob, request, &out), PERMISSION_DENIED,
                  "accumulate_grad: model 'alice-model' belongs to 'alice'; only its owner (or an "
                  "admin) adds to its gradients");
    grpc::ClientContext alice;
    Authorize(alice, kAlice);
    const grpc::Status s = compute->LayerBackward(&alice, request, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // ...but not overwrite her weights: nothing is staged.
  std::vector<TestLayer> zeros = layers;
  std::fill(zeros[0].weight.begin(), zeros[0].weight.end(), 0.0f);
  {
    v1::UploadWeightsResponse response;
    EXPECT_STATUS(
        Upload(daemon_->channel().get(), "alice-model", zeros, true, &response, 1000, kBob),
        PERMISSION_DENIED, "model 'alice-model' belongs to 'alice'");
    grpc::ClientContext context;
    Authorize(context, kRoot);
    v1::DescribeModelRequest request;
    request.set_name("alice-model");
    v1::ModelInfo info;
    ASSERT_TRUE(models->DescribeModel(&context, request, &info).ok());
    EXPECT_EQ(info.weight_version(), 1u);
    EXPECT_EQ(info.staged_tensors(), 0u);
  }
  // Publish, policy activation, profiles of her model.
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::PublishVersionRequest request;
    request.set_model("alice-model");
    v1::ModelInfo info;
    EXPECT_STATUS(models->PublishVersion(&context, request, &info), PERMISSION_DENIED,
                  "PublishVersion: model 'alice-model' belongs to 'alice'");
  }
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::SetActivePolicyRequest request;
    request.set_model("alice-model");
    request.set_policy("fp16");
    v1::SetActivePolicyResponse response;
    EXPECT_STATUS(policies->SetActivePolicy(&context, request, &response), PERMISSION_DENIED,
                  "belongs to 'alice'");
  }
  // Alice's policy: bob may read it, not replace or delete it.
  const std::string policy_json =
      R"({"name": "alice-policy", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})";
  {
    v1::PolicyInfo info;
    const grpc::Status s = PutPolicyAs(daemon_->channel(), kAlice, policy_json, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(info.owner(), "alice");
  }
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::GetPolicyRequest request;
    request.set_name("alice-policy");
    v1::PolicyInfo info;
    ASSERT_TRUE(policies->GetPolicy(&context, request, &info).ok());
    EXPECT_EQ(info.owner(), "alice");
  }
  {
    v1::PolicyInfo info;
    EXPECT_STATUS(PutPolicyAs(daemon_->channel(), kBob, policy_json, &info), PERMISSION_DENIED,
                  "PutPolicy: policy 'alice-policy' belongs to 'alice'");
  }
  EXPECT_STATUS(DeletePolicyAs(daemon_->channel(), kBob, "alice-policy"), PERMISSION_DENIED,
                "DeletePolicy: policy 'alice-policy' belongs to 'alice'");
  // Bob may not delete her model; it still serves.
  EXPECT_STATUS(DeleteModelAs(daemon_->channel(), kBob, "alice-model"), PERMISSION_DENIED,
                "DeleteModel: model 'alice-model' belongs to 'alice'");
  EXPECT_STATUS(DeleteModelAs(daemon_->channel(), kCarol, "alice-model"), PERMISSION_DENIED,
                "DeleteModel needs role admin or the model's owner with role train; principal "
                "'carol' has role compute");
  // Alice overwrites her own weights and deletes her policy.
  {
    v1::UploadWeightsResponse response;
    const grpc::Status s =
        Upload(daemon_->channel().get(), "alice-model", zeros, true, &response, 1000, kAlice);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.weight_version(), 2u);
  }
  {
    const grpc::Status s = DeletePolicyAs(daemon_->channel(), kAlice, "alice-policy");
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // An admin may change anything: it replaces bob's policy and deletes alice's model.
  {
    v1::PolicyInfo info;
    ASSERT_TRUE(
        PutPolicyAs(
            daemon_->channel(), kBob,
            R"({"name": "bob-policy", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})",
            &info)
            .ok());
    const grpc::Status s = DeletePolicyAs(daemon_->channel(), kRoot, "bob-policy");
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  {
    const grpc::Status s = DeleteModelAs(daemon_->channel(), kRoot, "alice-model");
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Alice deletes a model of her own.
  ASSERT_TRUE(Register(daemon_->channel().get(), "alice-model-2", layers, "", kAlice).ok());
  {
    const grpc::Status s = DeleteModelAs(daemon_->channel(), kAlice, "alice-model-2");
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  const std::string log = daemon_->AwaitLog("model_deleted model=alice-model owner=alice by=root");
  EXPECT_TRUE(absl::StrContains(log, "model_registered model=alice-model owner=alice")) << log;
  EXPECT_TRUE(absl::StrContains(log, "model_deleted model=alice-model owner=alice by=root"));
}

// Quotas: N allowed, N+1 refused naming the flag, nothing half-done.
class QuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        std::vector<std::string>{"--auth-tokens", tokens_.path(), "--quota-models", "2",
                                 "--quota-weight-bytes", "128", "--quota-inflight", "2"});
    ASSERT_TRUE(daemon_->ok());
  }
  v1::ModelInfo Describe(const std::string& name) {
    grpc::ClientContext context;
    Authorize(context, kRoot);
    v1::DescribeModelRequest request;
    request.set_name(name);
    v1::ModelInfo info;
    EXPECT_TRUE(
        v1::Models::NewStub(daemon_->channel())->DescribeModel(&context, request, &info).ok());
    return info;
  }
  TokensFile tokens_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(QuotaTest, ModelsAtTheLimit) {
  const std::vector<TestLayer> layers = {MakeLayer("fc", 1, 1, false, 1)};
  grpc::Channel* channel = daemon_->channel().get();
  ASSERT_TRUE(Register(channel, "a1", layers, "", kAlice).ok());
  ASSERT_TRUE(Register(channel, "a2", layers, "", kAlice).ok());
  EXPECT_STATUS(Register(channel, "a3", layers, "", kAlice), RESOURCE_EXHAUSTED,
                "--quota-models: principal 'alice' has 2 models, the limit is 2");
  // Nothing registered; another principal has its own count.
  grpc::ClientContext context;
  Authorize(context, kRoot);
  v1::ListModelsResponse list;
  ASSERT_TRUE(v1::Models::NewStub(daemon_->channel())->ListModels(&context, {}, &list).ok());
  EXPECT_EQ(list.models_size(), 2);
  EXPECT_TRUE(Register(channel, "b1", layers, "", kBob).ok());
  // A deleted model frees its place.
  ASSERT_TRUE(DeleteModelAs(daemon_->channel(), kAlice, "a1").ok());
  EXPECT_TRUE(Register(channel, "a3", layers, "", kAlice).ok());
}

TEST_F(QuotaTest, WeightBytesAtTheLimit) {
  // Two 4x4 FP32 layers: 64 bytes each, 128 together, the limit.
  const std::vector<TestLayer> layers = {MakeLayer("a", 4, 4, false, 1),
                                         MakeLayer("b", 4, 4, false, 2)};
  const std::vector<TestLayer> tiny = {MakeLayer("c", 1, 1, false, 3)};
  grpc::Channel* channel = daemon_->channel().get();
  ASSERT_TRUE(Register(channel, "w1", layers, "", kBob).ok());
  ASSERT_TRUE(Register(channel, "w2", tiny, "", kBob).ok());
  v1::UploadWeightsResponse response;
  const grpc::Status exact = Upload(channel, "w1", layers, false, &response, 1000, kBob);
  ASSERT_TRUE(exact.ok()) << exact.error_message();
  EXPECT_EQ(Describe("w1").weight_bytes(), 128u);
  // Four bytes more, on another of bob's models: refused, nothing staged.
  EXPECT_STATUS(Upload(channel, "w2", tiny, false, &response, 1000, kBob), RESOURCE_EXHAUSTED,
                "--quota-weight-bytes: principal 'bob' holds 128 bytes of weights (FP32, "
                "staged and published; cached copies are not charged); staging 4 more would "
                "make 132, the limit is 128; nothing was staged");
  EXPECT_EQ(Describe("w2").staged_tensors(), 0u);
  EXPECT_EQ(Describe("w2").weight_bytes(), 0u);
  // Replacing staged tensors counts the new ones only: still at the limit.
  const grpc::Status again = Upload(channel, "w1", layers, false, &response, 1000, kBob);
  EXPECT_TRUE(again.ok()) << again.error_message();
  // Alice's quota is her own.
  ASSERT_TRUE(Register(channel, "x", tiny, "", kAlice).ok());
  EXPECT_TRUE(Upload(channel, "x", tiny, false, &response, 1000, kAlice).ok());
}

TEST_F(QuotaTest, InflightAtTheLimit) {
  auto stub = v1::Compute::NewStub(daemon_->channel());
  // Two open streams of carol's, each seen answering (so admitted).
  struct Open {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamResponse>> stream;
  };
  std::vector<std::unique_ptr<Open>> open;
  for (int i = 0; i < 2; ++i) {
    auto o = std::make_unique<Open>();
    Authorize(o->context, kCarol);
    o->stream = stub->Stream(&o->context);
    v1::StreamRequest request;
    request.set_request_id(1);
    ASSERT_TRUE(o->stream->Write(request));
    v1::StreamResponse response;
    ASSERT_TRUE(o->stream->Read(&response)) << i;
    open.push_back(std::move(o));
  }
  auto list = [&](const char* token) {
    grpc::ClientContext context;
    Authorize(context, token);
    v1::ListModelsResponse response;
    return v1::Models::NewStub(daemon_->channel())->ListModels(&context, {}, &response);
  };
  EXPECT_STATUS(list(kCarol), RESOURCE_EXHAUSTED,
                "--quota-inflight: principal 'carol' has 2 requests in flight, the limit is 2");
  EXPECT_TRUE(list(kAlice).ok());  // others are not held up
  // One stream ends: carol may call again at once (a call stops counting when
  // it is answered, before the client has its status, not when gRPC is done
  // with it a moment later).
  open[0]->stream->WritesDone();
  EXPECT_TRUE(open[0]->stream->Finish().ok());
  const grpc::Status status = list(kCarol);
  EXPECT_TRUE(status.ok()) << status.error_message();
  // So calls one after another never find the previous one still counted:
  // with one stream open, carol has exactly one place left, call after call.
  for (int i = 0; i < 200; ++i) {
    const grpc::Status again = list(kCarol);
    ASSERT_TRUE(again.ok()) << i << ": " << again.error_message();
  }
  open[1]->stream->WritesDone();
  EXPECT_TRUE(open[1]->stream->Finish().ok());
}

// Issue 32, item 3: a compute-role reader's forwards in every format make
// cached copies of alice's model worth more than her whole weight quota. They
// are the daemon's cache, not hers: her next upload still fits (it used to fail
// RESOURCE_EXHAUSTED until she deleted the model), and what she is charged for
// (ModelInfo.quota_bytes) is her FP32 masters alone.
TEST(QuotaCopiesTest, AReadersCopiesNeverLockTheOwnerOut) {
  TokensFile tokens;
  // A 64x64 FP32 layer is 16384 bytes: a version and the next one's upload fit.
  DaemonProcess daemon({"--auth-tokens", tokens.path(), "--quota-weight-bytes", "40000"});
  ASSERT_TRUE(daemon.ok());
  grpc::Channel* channel = daemon.channel().get();
  const std::vector<TestLayer> layers = {MakeLayer("fc", 64, 64, false, 7)};
  constexpr uint64_t kMaster = 64 * 64 * 4;
  ASSERT_TRUE(Register(channel, "alice-model", layers, "", kAlice).ok());
  v1::UploadWeightsResponse uploaded;
  const grpc::Status first = Upload(channel, "alice-model", layers, true, &uploaded, 1000, kAlice);
  ASSERT_TRUE(first.ok()) << first.error_message();
  auto describe = [&] {
    grpc::ClientContext context;
    Authorize(context, kRoot);
    v1::DescribeModelRequest request;
    request.set_name("alice-model");
    v1::ModelInfo info;
    EXPECT_TRUE(v1::Models::NewStub(daemon.channel())->DescribeModel(&context, request, &info).ok());
    return info;
  };
  // Carol (compute) runs a forward in every format.
  for (int f = 0; f < mx::kFormatCount; ++f) {
    v1::LayerForwardRequest request = ForwardRequest("alice-model", layers[0], v1::PHASE_ROLLOUT,
                                                     f, TestValues(2 * 64, 8 + f), 2);
    grpc::ClientContext context;
    Authorize(context, kCarol);
    v1::LayerForwardResponse response;
    const grpc::Status s =
        v1::Compute::NewStub(daemon.channel())->LayerForward(&context, request, &response);
    ASSERT_TRUE(s.ok()) << f << ": " << s.error_message();
  }
  const v1::ModelInfo with_copies = describe();
  EXPECT_EQ(with_copies.layers(0).cached_formats_size(), mx::kFormatCount);
  EXPECT_GT(with_copies.weight_bytes(), 40000u);  // more than her quota, all held
  EXPECT_EQ(with_copies.quota_bytes(), kMaster);  // of which she is charged her master
  // Her next version: charged 16384 published + 16384 staged, within 40000.
  std::vector<TestLayer> next = layers;
  next[0].weight = TestValues(64 * 64, 30, 0.05f);
  const grpc::Status again = Upload(channel, "alice-model", next, true, &uploaded, 1000, kAlice);
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(uploaded.weight_version(), 2u);
  EXPECT_EQ(describe().quota_bytes(), kMaster);
  // The quota still holds for what she does upload: a second model's staging
  // would make 32768 + 16384.
  ASSERT_TRUE(Register(channel, "alice-2", layers, "", kAlice).ok());
  ASSERT_TRUE(Upload(channel, "alice-2", layers, false, &uploaded, 1000, kAlice).ok());
  ASSERT_TRUE(Register(channel, "alice-3", layers, "", kAlice).ok());
  EXPECT_STATUS(Upload(channel, "alice-3", layers, false, &uploaded, 1000, kAlice),
                RESOURCE_EXHAUSTED,
                "--quota-weight-bytes: principal 'alice' holds 32768 bytes of weights (FP32, "
                "staged and published; cached copies are not charged); staging 16384 more would "
                "make 49152, the limit is 40000; nothing was staged");
}

// Issue 32, item 5: run tags have owners. Alice's run is hers: another
// principal's tagged Gemm, ReportEnergy or ReportWork into it is refused naming
// the run (not her), and reading it is refused too; her report does not move.
// Carol creating --max-energy-runs new tags folds carol's own runs, not alice's.
// An admin may book into and read any run.
class RunOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.ok()); }

  grpc::Status Gemm(const char* token, const std::string& run, double* joules = nullptr) {
    v1::GemmRequest request =
        GemmRequest(v1::PHASE_ROLLOUT, v1::FORMAT_MXFP8_E4M3, TestValues(4 * 64, 120),
                    TestValues(64 * 8, 121), 4, 64, 8);
    request.set_run(run);
    grpc::ClientContext context;
    Authorize(context, token);
    v1::GemmResponse response;
    const grpc::Status s =
        v1::Compute::NewStub(daemon_.channel())->Gemm(&context, request, &response);
    if (joules != nullptr) *joules = response.info().model_joules();
    return s;
  }
  grpc::Status Report(const char* token, const std::string& run, v1::EnergyReport* report) {
    v1::GetEnergyReportRequest request;
    request.set_run(run);
    grpc::ClientContext context;
    Authorize(context, token);
    return v1::Telemetry::NewStub(daemon_.channel())->GetEnergyReport(&context, request, report);
  }
  v1::EnergyReport ReportOf(const std::string& run) {
    v1::EnergyReport report;
    const grpc::Status s = Report(kAlice, run, &report);
    EXPECT_TRUE(s.ok()) << s.error_message();
    report.clear_until_seconds();  // the one field that moves
    return report;
  }

  static constexpr char kRefused[] =
      "run 'alice-exp' belongs to another principal (a run tag is bound to the principal that "
      "first booked into it); choose a tag of your own";
  TokensFile tokens_;
  DaemonProcess daemon_{{"--auth-tokens", tokens_.path(), "--max-energy-runs", "3", "--workers",
                         "1"}};
};

TEST_F(RunOwnerTest, AnotherPrincipalCanNeitherBookIntoNorReadMyRun) {
  double one = 0;
  ASSERT_TRUE(Gemm(kAlice, "alice-exp", &one).ok());
  ASSERT_GT(one, 0);
  const v1::EnergyReport mine = ReportOf("alice-exp");
  ASSERT_EQ(mine.entries_size(), 1) << mine.DebugString();
  EXPECT_EQ(mine.entries(0).requests(), 1u);

  // A tagged Gemm (unary and on a stream), as carol (compute).
  EXPECT_STATUS(Gemm(kCarol, "alice-exp"), PERMISSION_DENIED,
                std::string("run: ") + kRefused);
  {
    grpc::ClientContext context;
    Authorize(context, kCarol);
    auto stream = v1::Compute::NewStub(daemon_.channel())->Stream(&context);
    v1::StreamRequest request;
    request.set_request_id(7);
    *request.mutable_gemm() =
        GemmRequest(v1::PHASE_ROLLOUT, v1::FORMAT_MXFP8_E4M3, TestValues(4 * 64, 120),
                    TestValues(64 * 8, 121), 4, 64, 8);
    request.mutable_gemm()->set_run("alice-exp");
    ASSERT_TRUE(stream->Write(request));
    v1::StreamResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.status_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(response.status_message(), std::string("run: ") + kRefused);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  // Measured energy, as bob (train): the stream ends at the interval, naming it.
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::ReportEnergyResponse response;
    auto writer = v1::Telemetry::NewStub(daemon_.channel())->ReportEnergy(&context, &response);
    const double t = std::floor(UnixNow()) - 10;
    v1::EnergyInterval interval;
    interval.set_source("gpu_baseline");
    interval.set_device("cuda:0");
    interval.set_phase(v1::PHASE_ROLLOUT);
    interval.set_start_seconds(t);
    interval.set_end_seconds(t + 1);
    interval.set_joules(100);
    interval.set_run("bob-exp");  // his own: accepted
    ASSERT_TRUE(writer->Write(interval));
    interval.set_start_seconds(t + 1);
    interval.set_end_seconds(t + 2);
    interval.set_run("alice-exp");
    writer->Write(interval);
    writer->WritesDone();
    EXPECT_STATUS(writer->Finish(), PERMISSION_DENIED,
                  std::string("intervals[1].run: ") + kRefused);
    EXPECT_EQ(response.intervals_accepted(), 0u);  // no response message on an error
  }
  // Reported work, as carol: nothing of the message is booked.
  ASSERT_TRUE(Register(daemon_.channel().get(), "alice-model",
                       {MakeLayer("fc", 8, 64, false, 3)}, "", kAlice)
                  .ok());
  {
    v1::ReportWorkRequest request;
    for (const char* run : {"carol-exp", "alice-exp"}) {
      v1::WorkCall* call = request.add_calls();
      call->set_phase(v1::PHASE_ROLLOUT);
      call->set_run(run);
      call->set_model("alice-model");
      call->set_layer("fc");
      call->set_call(v1::WORK_CALL_KIND_FORWARD);
      call->set_format(v1::FORMAT_MXFP8_E4M3);
      call->set_m(4);
      call->set_count(1);
    }
    grpc::ClientContext context;
    Authorize(context, kCarol);
    v1::ReportWorkResponse response;
    EXPECT_STATUS(v1::Telemetry::NewStub(daemon_.channel())->ReportWork(&context, request, &response),
                  PERMISSION_DENIED, std::string("calls[1].run: ") + kRefused);
  }
  // Reading it.
  {
    v1::EnergyReport report;
    EXPECT_STATUS(Report(kBob, "alice-exp", &report), PERMISSION_DENIED,
                  std::string("run: ") + kRefused);
    EXPECT_EQ(report.entries_size(), 0);
  }
  // Her report is what it was, to the bit.
  EXPECT_EQ(ReportOf("alice-exp").SerializeAsString(), mine.SerializeAsString());
  // Carol's ReportWork booked nothing, not even its own call.
  {
    v1::EnergyReport report;
    ASSERT_TRUE(Report(kCarol, "carol-exp", &report).ok());
    EXPECT_EQ(report.entries_size(), 0);
  }
  // An admin may read it, and book into it; it stays alice's.
  {
    v1::EnergyReport report;
    ASSERT_TRUE(Report(kRoot, "alice-exp", &report).ok());
    EXPECT_EQ(report.entries_size(), 1);
  }
  ASSERT_TRUE(Gemm(kRoot, "alice-exp").ok());
  EXPECT_EQ(ReportOf("alice-exp").entries(0).requests(), 2u);
  EXPECT_STATUS(Gemm(kCarol, "alice-exp"), PERMISSION_DENIED, "belongs to another principal");
}

TEST_F(RunOwnerTest, AnotherPrincipalsNewTagsDoNotFoldMyRun) {
  ASSERT_TRUE(Gemm(kAlice, "alice-exp").ok());
  const v1::EnergyReport mine = ReportOf("alice-exp");
  ASSERT_EQ(mine.entries_size(), 1);
  // --max-energy-runs 3: carol's ten new tags fold carol's own least recent ones.
  for (int i = 0; i < 10; ++i) {
    const grpc::Status s = Gemm(kCarol, "carol-" + std::to_string(i));
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
  }
  EXPECT_EQ(ReportOf("alice-exp").SerializeAsString(), mine.SerializeAsString());
  v1::EnergyReport newest, folded;
  ASSERT_TRUE(Report(kCarol, "carol-9", &newest).ok());
  EXPECT_EQ(newest.entries_size(), 1);
  ASSERT_TRUE(Report(kCarol, "carol-8", &newest).ok());
  EXPECT_EQ(newest.entries_size(), 1);
  ASSERT_TRUE(Report(kCarol, "carol-7", &folded).ok());
  EXPECT_EQ(folded.entries_size(), 0);  // folded: two of carol's and alice's are held
  // Every run together still counts all eleven.
  v1::EnergyReport all;
  ASSERT_TRUE(Report(kCarol, "", &all).ok());
  ASSERT_EQ(all.entries_size(), 1);
  EXPECT_EQ(all.entries(0).requests(), 11u);
}

// Also seen in issue 32: an admin's PutPolicy over alice's policy took its
// ownership (it stays hers now), and bob activating alice's policy on his
// model pinned it against her DeletePolicy (now bob's model goes back to the
// default policy; her own models still keep a policy they use from going).
TEST_F(AuthTest, ReplacingOrActivatingAnothersPolicyDoesNotTakeIt) {
  auto policies = v1::Policies::NewStub(daemon_->channel());
  const std::vector<TestLayer> layers = {MakeLayer("fc", 4, 8, false, 1)};
  const std::string json =
      R"({"name": "alice-pinned", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})";
  v1::PolicyInfo info;
  ASSERT_TRUE(PutPolicyAs(daemon_->channel(), kAlice, json, &info).ok());
  // Root replaces it: still alice's, and alice may still change it.
  const std::string replaced =
      R"({"name": "alice-pinned", "defaults": {"rollout": "BF16", "reward": "BF16", "update": "BF16"}})";
  ASSERT_TRUE(PutPolicyAs(daemon_->channel(), kRoot, replaced, &info).ok());
  EXPECT_EQ(info.owner(), "alice");
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::GetPolicyRequest request;
    request.set_name("alice-pinned");
    ASSERT_TRUE(policies->GetPolicy(&context, request, &info).ok());
    EXPECT_EQ(info.owner(), "alice");
    EXPECT_NE(info.json().find("BF16"), std::string::npos);
  }
  EXPECT_STATUS(PutPolicyAs(daemon_->channel(), kBob, json, &info), PERMISSION_DENIED,
                "PutPolicy: policy 'alice-pinned' belongs to 'alice'");
  ASSERT_TRUE(PutPolicyAs(daemon_->channel(), kAlice, json, &info).ok());
  EXPECT_EQ(info.owner(), "alice");

  // Bob activates it on his model, and registers another with it.
  ASSERT_TRUE(Register(daemon_->channel().get(), "bob-pinner", layers, "", kBob).ok());
  ASSERT_TRUE(Register(daemon_->channel().get(), "bob-pinner-2", layers, "alice-pinned", kBob).ok());
  {
    grpc::ClientContext context;
    Authorize(context, kBob);
    v1::SetActivePolicyRequest request;
    request.set_model("bob-pinner");
    request.set_policy("alice-pinned");
    v1::SetActivePolicyResponse response;
    ASSERT_TRUE(policies->SetActivePolicy(&context, request, &response).ok());
  }
  // Her own model using it keeps it from going...
  ASSERT_TRUE(Register(daemon_->channel().get(), "alice-user", layers, "alice-pinned", kAlice).ok());
  EXPECT_STATUS(DeletePolicyAs(daemon_->channel(), kAlice, "alice-pinned"), FAILED_PRECONDITION,
                "name: policy 'alice-pinned' is in use (the active policy of one of its owner's "
                "models, or the daemon's --default-policy)");
  auto policy_of = [&](const std::string& model) {
    grpc::ClientContext context;
    Authorize(context, kRoot);
    v1::DescribeModelRequest request;
    request.set_name(model);
    v1::ModelInfo described;
    EXPECT_TRUE(v1::Models::NewStub(daemon_->channel())
                    ->DescribeModel(&context, request, &described)
                    .ok());
    return described.policy();
  };
  EXPECT_EQ(policy_of("bob-pinner"), "alice-pinned");  // refused: nothing changed
  ASSERT_TRUE(DeleteModelAs(daemon_->channel(), kAlice, "alice-user").ok());
  // ...bob's do not: they go back to the default policy.
  {
    grpc::ClientContext context;
    Authorize(context, kAlice);
    v1::DeletePolicyRequest request;
    request.set_name("alice-pinned");
    v1::DeletePolicyResponse response;
    const grpc::Status s = policies->DeletePolicy(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(std::vector<std::string>(response.models_reset().begin(),
                                       response.models_reset().end()),
              (std::vector<std::string>{"bob-pinner", "bob-pinner-2"}));
  }
  EXPECT_EQ(policy_of("bob-pinner"), mxserve::DaemonOptions{}.default_policy);
  EXPECT_EQ(policy_of("bob-pinner-2"), mxserve::DaemonOptions{}.default_policy);
  ASSERT_TRUE(DeleteModelAs(daemon_->channel(), kBob, "bob-pinner").ok());
  ASSERT_TRUE(DeleteModelAs(daemon_->channel(), kBob, "bob-pinner-2").ok());
}

// A bad tokens file stops the start, naming the file and line.
TEST(AuthStart, BadTokensFileIsRefused) {
  const std::string path = ::testing::TempDir() + "/mxserve_bad_tokens";
  std::ofstream(path) << "# ok\ntok-a alice train\ntok-b bob superuser\n";
  const std::string command = std::string(MXSERVED_PATH) +
                              " --listen 127.0.0.1:0 --metrics-listen off --auth-tokens " + path +
                              " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_NE(status, 0);
  EXPECT_TRUE(absl::StrContains(output, "--auth-tokens: " + path +
                                            ":3: ROLE: expected compute, train or admin, got "
                                            "\\'superuser\\'") ||
              absl::StrContains(output, path + ":3: ROLE: expected compute, train or admin"))
      << output;
  std::filesystem::remove(path);
}

// Without --auth-tokens every caller is "anonymous" (role admin), tokens or not.
TEST(AuthDefault, EveryoneIsAnonymousAdmin) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ok());
  const std::vector<TestLayer> layers = {MakeLayer("fc", 1, 1, false, 1)};
  ASSERT_TRUE(Register(daemon.channel().get(), "m", layers).ok());
  ASSERT_TRUE(Register(daemon.channel().get(), "n", layers, "", "any-token").ok());
  grpc::ClientContext context;
  v1::ListModelsResponse list;
  ASSERT_TRUE(v1::Models::NewStub(daemon.channel())->ListModels(&context, {}, &list).ok());
  ASSERT_EQ(list.models_size(), 2);
  for (const auto& m : list.models()) EXPECT_EQ(m.owner(), "anonymous");
}

}  // namespace
}  // namespace mx_test

// Bad input of every kind gets the right status code and a message naming the
// field, and the daemon keeps serving with its state intact.
#include "absl/strings/str_join.h"
#include "mx/packed.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

class ErrorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess({"--workers", "1", "--max-message-bytes", "256K"});
    ASSERT_TRUE(daemon_->ok());
    layer_ = new TestLayer(MakeLayer("blocks.1.mlp.down_proj", 16, 64, true, 71));
    ASSERT_TRUE(RegisterAndPublish(daemon_->channel().get(), "m", {*layer_}).ok());
  }
  static void TearDownTestSuite() {
    StopSuiteDaemon(daemon_);
    delete layer_;
  }
  void TearDown() override { ExpectStillServing(); }

  // After every test: the model still answers with the reference bits.
  void ExpectStillServing() { ExpectServesReference(daemon_->channel(), "m", *layer_); }

  static v1::LayerForwardRequest Forward(const std::vector<float>& x, int64_t m) {
    v1::LayerForwardRequest r;
    r.set_model("m");
    r.set_layer(layer_->name);
    r.set_phase(v1::PHASE_ROLLOUT);
    r.set_format(v1::FORMAT_MXFP8_E4M3);
    *r.mutable_input()->mutable_tensor() = Matrix(x, m, 64);
    return r;
  }

  static grpc::Status Call(const v1::LayerForwardRequest& request) {
    grpc::ClientContext context;
    v1::LayerForwardResponse response;
    return v1::Compute::NewStub(daemon_->channel())->LayerForward(&context, request, &response);
  }

  static DaemonProcess* daemon_;
  static TestLayer* layer_;
};
DaemonProcess* ErrorsTest::daemon_ = nullptr;
TestLayer* ErrorsTest::layer_ = nullptr;

TEST_F(ErrorsTest, LayerForwardRequests) {
  const auto x = TestValues(2 * 64, 1);
  v1::LayerForwardRequest r = Forward(x, 2);
  r.set_model("ghost");
  EXPECT_STATUS(Call(r), NOT_FOUND, "model: no model named 'ghost'");
  r = Forward(x, 2);
  r.set_layer("blocks.1.mlp.up_proj");
  EXPECT_STATUS(Call(r), NOT_FOUND, "layer: model 'm' has no layer 'blocks.1.mlp.up_proj'");
  r = Forward(x, 2);
  r.set_format(static_cast<v1::Format>(42));
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "format: unknown format value 42");
  r = Forward(x, 2);
  r.set_phase(v1::PHASE_UNSPECIFIED);
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "phase: required");
  r.set_phase(static_cast<v1::Phase>(9));
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "phase: unknown phase value 9");
  r = Forward(TestValues(2 * 48, 1), 2);
  r.mutable_input()->mutable_tensor()->set_shape(1, 48);
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT,
                "input.tensor.shape: expected [M, 64] (columns: in_features of layer "
                "'blocks.1.mlp.down_proj'), got [2, 48]");
  r = Forward(x, 2);
  r.mutable_input()->mutable_tensor()->mutable_data()->resize(100);
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT,
                "input.tensor.data: expected 512 bytes (2 x 64 FP32), got 100");
  r = Forward(x, 2);
  r.mutable_input()->mutable_tensor()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT,
                "input.tensor.dtype: expected DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16");
  r = Forward(x, 2);
  r.mutable_input()->mutable_tensor()->set_dtype(v1::DTYPE_BF16);  // 512 bytes are 2×128 BF16
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "input.tensor.data: expected 256 bytes (2 x 64 BF16)");
  r = Forward(x, 2);
  r.clear_input();
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "input: required");
  r = Forward(x, 2);
  r.set_min_weight_version(7);
  EXPECT_STATUS(Call(r), FAILED_PRECONDITION,
                "min_weight_version: model 'm' is at weight version 1");
}

TEST_F(ErrorsTest, PackedOperands) {
  const auto x = TestValues(2 * 64, 2);
  const auto q = *mx::QuantizeRows(x, 2, 64, mx::Format::kMxfp4E2m1);
  v1::LayerForwardRequest r = Forward(x, 2);
  r.set_format(v1::FORMAT_UNSPECIFIED);
  auto* p = r.mutable_input()->mutable_packed();
  p->set_format(v1::FORMAT_MXFP4_E2M1);
  p->set_rows(2);
  p->set_cols(64);
  p->set_elements(std::string(q.elements.begin(), q.elements.end() - 1));
  p->set_block_scales(std::string(q.block_scales.begin(), q.block_scales.end()));
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "input.packed.elements: expected 64 bytes");
  p->set_elements(std::string(q.elements.begin(), q.elements.end()));
  p->set_block_scales("\x01");
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "input.packed.block_scales: expected 4 bytes");
  p->set_block_scales(std::string(q.block_scales.begin(), q.block_scales.end()));
  p->set_cols(32);
  EXPECT_STATUS(Call(r), INVALID_ARGUMENT, "input.packed.cols: expected 64 cols");
  p->set_cols(64);
  EXPECT_TRUE(Call(r).ok());
}

TEST_F(ErrorsTest, GemmRequests) {
  auto stub = v1::Compute::NewStub(daemon_->channel());
  v1::GemmRequest g;
  g.set_phase(v1::PHASE_ROLLOUT);
  *g.mutable_a()->mutable_tensor() = Matrix(TestValues(6, 1), 2, 3);
  *g.mutable_b()->mutable_tensor() = Matrix(TestValues(8, 1), 4, 2);
  grpc::ClientContext c1;
  v1::GemmResponse response;
  EXPECT_STATUS(stub->Gemm(&c1, g, &response), INVALID_ARGUMENT, "format: required for Gemm");
  g.set_format(v1::FORMAT_MXFP4_E2M1);
  grpc::ClientContext c2;
  EXPECT_STATUS(stub->Gemm(&c2, g, &response), INVALID_ARGUMENT,
                "b.tensor.shape: expected [3, N] (rows: K, the columns of a), got [4, 2]");
  // The result would not fit in one message: the request says so up front.
  g.set_format(v1::FORMAT_FP32);
  *g.mutable_a()->mutable_tensor() = Matrix(TestValues(300, 1), 300, 1);
  *g.mutable_b()->mutable_tensor() = Matrix(TestValues(300, 1), 1, 300);
  grpc::ClientContext c3;
  EXPECT_STATUS(stub->Gemm(&c3, g, &response), RESOURCE_EXHAUSTED,
                "would exceed the maximum message size of 262144 bytes");
}

TEST_F(ErrorsTest, OversizedMessageIsRefusedByTheTransport) {
  const auto x = TestValues(2000 * 64, 3);  // 512 KB > 256 KB
  EXPECT_STATUS(Call(Forward(x, 2000)), RESOURCE_EXHAUSTED, "Received message larger than max");
}

TEST_F(ErrorsTest, MalformedPoliciesAndUnknownNames) {
  auto policies = v1::Policies::NewStub(daemon_->channel());
  v1::PolicyInfo info;
  struct Case {
    std::string json, message;
  } cases[] = {
      {"{not json", "json: "},
      {R"({"name": "p", "defaults": {"rollout": "MXFP5", "reward": "FP16", "update": "FP16"}})",
       "policy.defaults.rollout: unknown format 'MXFP5'"},
      {R"({"name": "p", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"},
           "rules": [{"phase": "training", "layers": "*", "format": "FP16"}]})",
       "policy.rules[0].phase"},
  };
  for (const auto& c : cases) {
    grpc::ClientContext context;
    v1::PutPolicyRequest put;
    put.set_json(c.json);
    EXPECT_STATUS(policies->PutPolicy(&context, put, &info), INVALID_ARGUMENT, c.message);
  }
  grpc::ClientContext c1;
  v1::PutPolicyRequest builtin;
  builtin.set_json(
      R"({"name": "B-balanced", "defaults": {"rollout": "FP16", "reward": "FP16", "update": "FP16"}})");
  EXPECT_STATUS(policies->PutPolicy(&c1, builtin, &info), FAILED_PRECONDITION, "built-in");
  grpc::ClientContext c2;
  v1::SetActivePolicyRequest activate;
  activate.set_model("m");
  activate.set_policy("nope");
  v1::SetActivePolicyResponse activated;
  EXPECT_STATUS(policies->SetActivePolicy(&c2, activate, &activated), NOT_FOUND,
                "policy: no policy named 'nope'");
  grpc::ClientContext c3;
  v1::RegisterModelRequest reg;
  reg.set_name("bad name!");
  v1::ModelInfo model;
  EXPECT_STATUS(v1::Models::NewStub(daemon_->channel())->RegisterModel(&c3, reg, &model),
                INVALID_ARGUMENT, "name: 'bad name!' is not a model name");
  grpc::ClientContext c4;
  reg.set_name("m");
  auto* spec = reg.add_layers();
  spec->set_name("x");
  spec->set_out_features(4);
  spec->set_in_features(4);
  EXPECT_STATUS(v1::Models::NewStub(daemon_->channel())->RegisterModel(&c4, reg, &model),
                ALREADY_EXISTS, "name: a model named 'm' exists");
  grpc::ClientContext c5;
  reg.set_name("zero");
  spec->set_in_features(0);
  EXPECT_STATUS(v1::Models::NewStub(daemon_->channel())->RegisterModel(&c5, reg, &model),
                INVALID_ARGUMENT, "layers[0].in_features: expected 1 to");
}

TEST_F(ErrorsTest, TruncatedAndMalformedUploadsStageNothing) {
  auto models = v1::Models::NewStub(daemon_->channel());
  auto upload = [&](std::vector<v1::WeightChunk> chunks) {
    grpc::ClientContext context;
    v1::UploadWeightsResponse response;
    auto writer = models->UploadWeights(&context, &response);
    for (const auto& c : chunks) writer->Write(c);
    writer->WritesDone();
    return writer->Finish();
  };
  auto chunk = [&](uint64_t offset, size_t count, v1::DType dtype = v1::DTYPE_FP32) {
    v1::WeightChunk c;
    c.set_model("m");
    c.set_layer(layer_->name);
    c.set_role(v1::TENSOR_ROLE_WEIGHT);
    c.set_dtype(dtype);
    c.set_offset_elements(offset);
    // The weight's own values where the chunk lies inside it, zeros past its end
    // (a chunk that falls outside the tensor is one of the cases).
    std::vector<float> values(count, 0.0f);
    for (size_t i = 0; i < count && offset + i < layer_->weight.size(); ++i) {
      values[i] = layer_->weight[offset + i];
    }
    c.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                           count * (dtype == v1::DTYPE_FP32 ? 4 : 2)));
    c.set_publish(true);
    return c;
  };
  // Half the weight, then the stream ends.
  EXPECT_STATUS(upload({chunk(0, 512)}), INVALID_ARGUMENT,
                "data: tensor 'blocks.1.mlp.down_proj.weight' is incomplete: elements from 512 of "
                "1024 were not received");
  EXPECT_STATUS(upload({chunk(0, 600), chunk(512, 512)}), INVALID_ARGUMENT, "overlap");
  EXPECT_STATUS(upload({chunk(0, 512), chunk(512, 512, v1::DTYPE_BF16)}), INVALID_ARGUMENT,
                "chunks[1].dtype: tensor 'blocks.1.mlp.down_proj.weight' started as DTYPE_FP32");
  EXPECT_STATUS(upload({chunk(1000, 100)}), INVALID_ARGUMENT,
                "chunks[0].offset_elements: elements [1000, 1100) fall outside");
  // The element count of a transposed or flattened W is right; its shape is
  // not (the Python client uploaded W.T and answered wrongly ever after).
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {layer_->in, layer_->out}, {layer_->out * layer_->in}, {1, layer_->out, layer_->in}}) {
    v1::WeightChunk shaped = chunk(0, 1024);
    for (int64_t d : shape) shaped.add_shape(d);
    EXPECT_STATUS(upload({shaped}), INVALID_ARGUMENT,
                  absl::StrCat("chunks[0].shape: tensor 'blocks.1.mlp.down_proj.weight' is [",
                               layer_->out, ", ", layer_->in,
                               "] (out_features, in_features), got [",
                               absl::StrJoin(shape, ", "), "]; nothing was staged"));
  }
  v1::WeightChunk other = chunk(0, 1024);
  other.set_layer("nope");
  EXPECT_STATUS(upload({other}), NOT_FOUND, "chunks[0].layer: model 'm' has no layer 'nope'");
  EXPECT_STATUS(upload({}), INVALID_ARGUMENT, "chunks: the stream held no chunk");
  grpc::ClientContext context;
  v1::DescribeModelRequest describe;
  describe.set_name("m");
  v1::ModelInfo info;
  ASSERT_TRUE(models->DescribeModel(&context, describe, &info).ok());
  EXPECT_EQ(info.staged_tensors(), 0u);
  EXPECT_EQ(info.weight_version(), 1u);
}

TEST_F(ErrorsTest, PowerSamplesAreValidated) {
  auto telemetry = v1::Telemetry::NewStub(daemon_->channel());
  grpc::ClientContext context;
  v1::ReportPowerResponse response;
  auto writer = telemetry->ReportPower(&context, &response);
  v1::PowerSample s;
  s.set_source("gpu_baseline");
  s.set_device("cuda:0");
  s.set_phase(v1::PHASE_ROLLOUT);
  const double now = UnixNow();
  s.set_timestamp_seconds(now - 10);
  s.set_watts(100);
  writer->Write(s);
  s.set_timestamp_seconds(now - 11);
  writer->Write(s);
  writer->WritesDone();
  EXPECT_STATUS(writer->Finish(), INVALID_ARGUMENT, "is earlier than the previous sample");
  EXPECT_EQ(response.samples_accepted(), 0u);  // the response of a failed call is not sent
}

}  // namespace
}  // namespace mx_test

// `mxserved --backend hls-sim`: the FPGA kernel's C++ behind the real daemon
// answers with the reference's bits and says which datapath ran.
#include "absl/strings/str_cat.h"
#include "mx/format.h"
#include "mx/reference_gemm.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

const char* Datapath(mx::Format f) {
  switch (f) {
    case mx::Format::kMxfp8E4m3:
    case mx::Format::kMxfp8E5m2:
      return "hls/mx_wide";
    case mx::Format::kMxfp6E3m2:
    case mx::Format::kMxfp6E2m3:
    case mx::Format::kMxfp4E2m1:
    case mx::Format::kMxint8:
      return "hls/mx_integer";
    case mx::Format::kInt8:
      return "hls/int8";
    case mx::Format::kNvfp4:
      return "hls/nv_blocks";
    default:
      return "hls/float";
  }
}

class HlsSimTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess({"--backend", "hls-sim", "--workers", "2"});
    ASSERT_TRUE(daemon_->ok());
    // 130 outputs: more than one 128-column tile of the PE array; K = 80 is ragged.
    layer_ = new TestLayer(MakeLayer("model.layers.0.self_attn.q_proj", 130, 80, true, 17));
    ASSERT_TRUE(RegisterAndPublish(daemon_->channel().get(), "m", {*layer_}).ok());
  }
  static void TearDownTestSuite() {
    StopSuiteDaemon(daemon_);
    delete layer_;
  }
  std::unique_ptr<v1::Compute::Stub> Stub() { return v1::Compute::NewStub(daemon_->channel()); }

  static DaemonProcess* daemon_;
  static TestLayer* layer_;
};
DaemonProcess* HlsSimTest::daemon_ = nullptr;
TestLayer* HlsSimTest::layer_ = nullptr;

TEST_F(HlsSimTest, LayerForwardEqualsReferenceForEveryFormat) {
  const int64_t m = 3;
  const auto x = TestValues(m * layer_->in, 21);
  for (int f = 0; f < mx::kFormatCount; ++f) {
    const auto format = static_cast<mx::Format>(f);
    SCOPED_TRACE(mx::FormatName(format));
    const v1::LayerForwardRequest request = ForwardRequest("m", *layer_, v1::PHASE_REWARD, f, x, m);
    grpc::ClientContext context;
    v1::LayerForwardResponse response;
    const grpc::Status status = Stub()->LayerForward(&context, request, &response);
    if (format == mx::Format::kLoBcq) {  // not in the kernel: refused by name, nothing computed
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
      EXPECT_EQ(status.error_message(),
                "format: LO_BCQ is not in the FPGA kernel (--backend hls-sim): its float "
                "path has no codebook selector per 8 elements; --backend cpu and the torch "
                "emulator compute it exactly (fpga/README.md)");
      continue;
    }
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(SameBits(Floats(response.output()), ReferenceForward(*layer_, x, m, format)));
    EXPECT_EQ(response.info().backend(), "hls-sim");
    EXPECT_EQ(response.info().kernel(), Datapath(format));
  }
}

// The scale rules are the host's (it quantizes, the kernel decodes E8M0 scales
// whatever rule chose them): every rule's Gemm is the reference's on the card's
// C++ too. A row with a saturating block maximum makes the rules differ.
TEST_F(HlsSimTest, EveryScaleRuleGivesTheReferenceBits) {
  const int64_t m = 2, k = 64, n = 33;
  auto a = TestValues(m * k, 26);
  const auto b = TestValues(k * n, 27);
  a[0] = 7.9f;  // MXFP4: floor clamps it to 6, the other rules take scale 2
  for (const mx::ScaleRule rule : mx::kAllScaleRules) {
    SCOPED_TRACE(mx::ScaleRuleName(rule));
    v1::GemmRequest request =
        GemmRequest(v1::PHASE_UPDATE, v1::FORMAT_MXFP4_E2M1, a, b, m, k, n, v1::FORMAT_MXFP4_E2M1);
    request.set_scale_rule(mxserve::ToProto(rule));
    grpc::ClientContext context;
    v1::GemmResponse response;
    ASSERT_TRUE(Stub()->Gemm(&context, request, &response).ok());
    const mx::QuantizeOptions options{.scale_rule = rule};
    EXPECT_TRUE(SameBits(Floats(response.c()),
                         *mx::ReferenceGemm(a, mx::Format::kMxfp4E2m1, b, mx::Format::kMxfp4E2m1,
                                            m, k, n, options)));
    EXPECT_EQ(response.info().backend(), "hls-sim");
  }
}

// A Gemm with a LO_BCQ operand on either side is refused by name, and the daemon
// goes on serving the same request in a format the kernel has.
TEST_F(HlsSimTest, LoBcqIsRefusedNamingTheBackendsThatServeIt) {
  const int64_t m = 2, k = 64, n = 3;
  const auto a = TestValues(m * k, 28), b = TestValues(k * n, 29);
  for (const auto& [fa, fb] : {std::pair{v1::FORMAT_LO_BCQ, v1::FORMAT_FP16},
                               std::pair{v1::FORMAT_FP16, v1::FORMAT_LO_BCQ}}) {
    grpc::ClientContext context;
    v1::GemmResponse response;
    const grpc::Status status =
        Stub()->Gemm(&context, GemmRequest(v1::PHASE_ROLLOUT, fa, a, b, m, k, n, fb), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
    EXPECT_EQ(status.error_message(),
              "format: LO_BCQ is not in the FPGA kernel (--backend hls-sim): its float path has no "
              "codebook selector per 8 elements; --backend cpu and the torch emulator compute it "
              "exactly (fpga/README.md)");
  }
  grpc::ClientContext context;
  v1::GemmResponse response;
  ASSERT_TRUE(Stub()
                  ->Gemm(&context,
                         GemmRequest(v1::PHASE_ROLLOUT, v1::FORMAT_FP16, a, b, m, k, n,
                                     v1::FORMAT_FP16),
                         &response)
                  .ok());
  EXPECT_TRUE(SameBits(Floats(response.c()), *mx::ReferenceGemm(a, mx::Format::kFp16, b,
                                                               mx::Format::kFp16, m, k, n)));
}

TEST_F(HlsSimTest, MixedGemmAndBackwardEqualReference) {
  const int64_t m = 2, k = 45, n = 129;
  const auto a = TestValues(m * k, 22), b = TestValues(k * n, 23);
  const v1::GemmRequest request =
      GemmRequest(v1::PHASE_UPDATE, v1::FORMAT_MXFP4_E2M1, a, b, m, k, n, v1::FORMAT_MXFP8_E5M2);
  grpc::ClientContext context;
  v1::GemmResponse response;
  ASSERT_TRUE(Stub()->Gemm(&context, request, &response).ok());
  EXPECT_TRUE(SameBits(Floats(response.c()), *mx::ReferenceGemm(a, mx::Format::kMxfp4E2m1, b,
                                                                mx::Format::kMxfp8E5m2, m, k, n)));
  EXPECT_EQ(response.info().kernel(), "hls/mx_wide");

  const int64_t rows = 4;
  const auto dy = TestValues(rows * layer_->out, 24), x = TestValues(rows * layer_->in, 25);
  v1::LayerBackwardRequest backward;
  backward.set_model("m");
  backward.set_layer(layer_->name);
  backward.set_phase(v1::PHASE_UPDATE);
  backward.set_format(v1::FORMAT_MXFP6_E3M2);
  *backward.mutable_grad_output() = Matrix(dy, rows, layer_->out);
  *backward.mutable_input() = Matrix(x, rows, layer_->in);
  grpc::ClientContext backward_context;
  v1::LayerBackwardResponse grads;
  ASSERT_TRUE(Stub()->LayerBackward(&backward_context, backward, &grads).ok());
  EXPECT_TRUE(SameBits(Floats(grads.grad_input()),
                       *mx::ReferenceGemm(dy, mx::Format::kMxfp6E3m2, layer_->weight,
                                          mx::Format::kMxfp6E3m2, rows, layer_->out, layer_->in)));
}

// K past the on-chip W tile: refused by name, and the daemon keeps serving.
TEST_F(HlsSimTest, KBeyondTheWTileIsRefusedByName) {
  const int64_t k = 16400;
  v1::GemmRequest request = GemmRequest(v1::PHASE_ROLLOUT, v1::FORMAT_MXFP4_E2M1, TestValues(k, 26),
                                        TestValues(k, 27), 1, k, 1);
  grpc::ClientContext context;
  v1::GemmResponse response;
  const grpc::Status status = Stub()->Gemm(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "K: the FPGA kernel holds 1 to 16384 columns in its on-chip W tile, got 16400");
  *request.mutable_a()->mutable_tensor() = Matrix(TestValues(64, 26), 1, 64);
  *request.mutable_b()->mutable_tensor() = Matrix(TestValues(64, 27), 64, 1);
  grpc::ClientContext again;
  EXPECT_TRUE(Stub()->Gemm(&again, request, &response).ok());
}

// grad_weight = grad_outputᵀ·input sums over the batch, which the FPGA takes as
// K: past its W tile the answer names the rows and how to fit, not a "K" the
// request does not have (found by a black-box test).
TEST_F(HlsSimTest, ABackwardBatchBeyondTheWTileNamesItsRows) {
  const int64_t rows = 16400;
  v1::LayerBackwardRequest backward;
  backward.set_model("m");
  backward.set_layer(layer_->name);
  backward.set_phase(v1::PHASE_UPDATE);
  backward.set_format(v1::FORMAT_MXFP4_E2M1);
  backward.mutable_weight_rows()->set_begin(0);  // grad_weight alone: no grad_input first
  backward.mutable_weight_rows()->set_end(2);
  *backward.mutable_grad_output() = Matrix(TestValues(rows * 2, 28), rows, 2);
  *backward.mutable_input() = Matrix(TestValues(rows * layer_->in, 29), rows, layer_->in);
  grpc::ClientContext context;
  v1::LayerBackwardResponse grads;
  const grpc::Status status = Stub()->LayerBackward(&context, backward, &grads);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "grad_output.shape[0], input.shape[0]: grad_weight = grad_outputᵀ·input sums over "
            "these 16400 rows, which this backend takes as its GEMM's K (the FPGA kernel holds 1 "
            "to 16384 columns in its on-chip W tile, got 16400); split the rows across "
            "LayerBackward calls (accumulate_grad sums their grad_weight)");
  // 16384 rows fit.
  const int64_t fit = 16384;
  *backward.mutable_grad_output() = Matrix(TestValues(fit * 2, 28), fit, 2);
  *backward.mutable_input() = Matrix(TestValues(fit * layer_->in, 29), fit, layer_->in);
  grpc::ClientContext again;
  const grpc::Status ok = Stub()->LayerBackward(&again, backward, &grads);
  EXPECT_TRUE(ok.ok()) << ok.error_code() << " " << ok.error_message();
  EXPECT_EQ(grads.grad_weight().shape(0), 2);
}

// A layer whose K is past the W tile is refused when its weight would be
// prepared: with the same message, and nothing is laid out or charged for it.
TEST_F(HlsSimTest, ALayerBeyondTheWTileIsRefusedBeforeItIsPrepared) {
  const int64_t k = 16400;
  const TestLayer wide = MakeLayer("wide", 2, k, false, 31);
  ASSERT_TRUE(RegisterAndPublish(daemon_->channel().get(), "wide", {wide}).ok());
  auto models = v1::Models::NewStub(daemon_->channel());
  auto describe = [&] {
    grpc::ClientContext context;
    v1::DescribeModelRequest request;
    request.set_name("wide");
    v1::ModelInfo info;
    EXPECT_TRUE(models->DescribeModel(&context, request, &info).ok());
    return info;
  };
  const uint64_t masters = describe().weight_bytes();
  EXPECT_EQ(masters, uint64_t{2} * k * sizeof(float));

  grpc::ClientContext context;
  v1::LayerForwardResponse response;
  const grpc::Status status = Stub()->LayerForward(
      &context,
      ForwardRequest("wide", wide, v1::PHASE_ROLLOUT, static_cast<int>(mx::Format::kMxfp4E2m1),
                     TestValues(k, 32), 1),
      &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "K: the FPGA kernel holds 1 to 16384 columns in its on-chip W tile, got 16400");
  const v1::ModelInfo after = describe();
  EXPECT_EQ(after.layers(0).cached_formats_size(), 0);
  EXPECT_EQ(after.weight_bytes(), masters);
}

}  // namespace
}  // namespace mx_test

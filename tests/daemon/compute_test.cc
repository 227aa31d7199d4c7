// Compute results from the real daemon equal the mx/ reference bit for bit, for
// every format, through unary calls and through Compute.Stream — BF16 within
// the float paths' bound instead (tests/float_bound.h: pair instructions).
#include <map>

#include "absl/strings/str_cat.h"
#include "mx/element.h"
#include "mx/format.h"
#include "mx/kernels/cpu_features.h"
#include "mx/kernels/linear.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"
#include "tests/float_bound.h"

namespace mx_test {
namespace {

// The kernel mx/kernels runs for a format with itself at this machine's best
// level: "<level>/<kind>", the level being the best one up to it that has the
// kind (on AVX-512, MXFP8 and INT8 run avx2), from the kernels' own table.
std::string ExpectedKernel(mx::Format f) {
  return mx::kernels::KernelNameFor(f, f, mx::kernels::AvailableIsas().back());
}

// A Gemm's C (a: m × k, b: k × n) as the contract asks: the reference's bits,
// BF16 within the float bound.
::testing::AssertionResult MeetsContract(const std::vector<float>& c, const std::vector<float>& a,
                                         const std::vector<float>& b, int64_t m, int64_t k,
                                         int64_t n, mx::Format format) {
  if (format == mx::Format::kBf16) {
    return WithinFloatBound(c, a, Transposed(b, k, n), {}, m, k, n, format);
  }
  return SameBits(c, *mx::ReferenceGemm(a, format, b, format, m, k, n));
}
// The same for a LayerForward of `layer`.
::testing::AssertionResult MeetsContract(const std::vector<float>& y, const TestLayer& layer,
                                         const std::vector<float>& x, int64_t m,
                                         mx::Format format) {
  if (format == mx::Format::kBf16) {
    return WithinFloatBound(y, x, layer.weight, layer.bias_values, m, layer.in, layer.out, format);
  }
  return SameBits(y, ReferenceForward(layer, x, m, format));
}

class ComputeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new DaemonProcess({"--workers", "2"});
    ASSERT_TRUE(daemon_->ok());
    layer_ = new TestLayer(MakeLayer("model.layers.0.mlp.up_proj", 12, 80, true, 7));
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
DaemonProcess* ComputeTest::daemon_ = nullptr;
TestLayer* ComputeTest::layer_ = nullptr;

TEST_F(ComputeTest, GemmEqualsReferenceForEveryFormat) {
  const int64_t m = 5, k = 70, n = 9;  // K is not a multiple of 32
  const auto a = TestValues(m * k, 1), b = TestValues(k * n, 2);
  for (int f = 0; f < mx::kFormatCount; ++f) {
    const auto format = static_cast<mx::Format>(f);
    SCOPED_TRACE(mx::FormatName(format));
    const v1::GemmRequest request = GemmRequest(v1::PHASE_UPDATE, Wire(f), a, b, m, k, n);
    grpc::ClientContext context;
    v1::GemmResponse response;
    ASSERT_TRUE(Stub()->Gemm(&context, request, &response).ok());
    EXPECT_TRUE(MeetsContract(Floats(response.c()), a, b, m, k, n, format));
    EXPECT_EQ(response.c().shape(0), m);
    EXPECT_EQ(response.c().shape(1), n);
    EXPECT_EQ(response.info().format(), Wire(f));
    EXPECT_EQ(response.info().backend(), "cpu");
    EXPECT_GT(response.info().model_joules(), 0);
    EXPECT_GT(response.info().model_seconds(), 0);
  }
}

TEST_F(ComputeTest, GemmMixedFormatsAndRoundingAway) {
  const int64_t m = 3, k = 64, n = 4;
  const auto a = TestValues(m * k, 3), b = TestValues(k * n, 4);
  v1::GemmRequest request =
      GemmRequest(v1::PHASE_ROLLOUT, v1::FORMAT_MXFP4_E2M1, a, b, m, k, n, v1::FORMAT_MXFP8_E4M3);
  request.set_rounding(v1::ROUNDING_NEAREST_AWAY);
  grpc::ClientContext context;
  v1::GemmResponse response;
  ASSERT_TRUE(Stub()->Gemm(&context, request, &response).ok());
  mx::QuantizeOptions away;
  away.rounding = mx::Rounding::kNearestAway;
  EXPECT_TRUE(SameBits(
      Floats(response.c()),
      *mx::ReferenceGemm(a, mx::Format::kMxfp4E2m1, b, mx::Format::kMxfp8E4m3, m, k, n, away)));
  EXPECT_EQ(response.info().weight_format(), v1::FORMAT_MXFP8_E4M3);
}

TEST_F(ComputeTest, LayerForwardEqualsReferenceForEveryFormat) {
  const int64_t m = 3;
  const auto x = TestValues(m * layer_->in, 5);
  for (int f = 0; f < mx::kFormatCount; ++f) {
    const auto format = static_cast<mx::Format>(f);
    SCOPED_TRACE(mx::FormatName(format));
    const v1::LayerForwardRequest request =
        ForwardRequest("m", *layer_, v1::PHASE_ROLLOUT, f, x, m);
    grpc::ClientContext context;
    v1::LayerForwardResponse response;
    ASSERT_TRUE(Stub()->LayerForward(&context, request, &response).ok());
    EXPECT_TRUE(MeetsContract(Floats(response.output()), *layer_, x, m, format));
    EXPECT_EQ(response.info().weight_version(), 1u);
    EXPECT_EQ(response.info().format(), Wire(f));
    EXPECT_EQ(response.info().weight_format(), Wire(f));
    // The CPU backend ran the fast kernels at this machine's best level, not the
    // reference (the daemon inherits no MX_ISA here).
    EXPECT_EQ(response.info().kernel(), ExpectedKernel(format));
  }
}

TEST_F(ComputeTest, PackedAndBf16InputsGiveTheSameBitsAsFp32) {
  const int64_t m = 2;
  const auto x = TestValues(m * layer_->in, 6);
  const auto packed = *mx::QuantizeRows(x, m, layer_->in, mx::Format::kMxfp4E2m1);
  v1::LayerForwardRequest request;
  request.set_model("m");
  request.set_layer(layer_->name);
  request.set_phase(v1::PHASE_ROLLOUT);
  request.set_format(v1::FORMAT_MXFP4_E2M1);
  auto* p = request.mutable_input()->mutable_packed();
  p->set_format(v1::FORMAT_MXFP4_E2M1);
  p->set_rows(m);
  p->set_cols(layer_->in);
  p->set_elements(std::string(packed.elements.begin(), packed.elements.end()));
  p->set_block_scales(std::string(packed.block_scales.begin(), packed.block_scales.end()));
  grpc::ClientContext context;
  v1::LayerForwardResponse response;
  ASSERT_TRUE(Stub()->LayerForward(&context, request, &response).ok());
  EXPECT_TRUE(
      SameBits(Floats(response.output()), ReferenceForward(*layer_, x, m, mx::Format::kMxfp4E2m1)));

  // BF16 input: the values widen exactly, so the result equals FP32 input of the
  // same (BF16-representable) values.
  std::vector<uint16_t> codes(x.size());
  std::vector<float> widened(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    codes[i] = mx::FloatToBf16(x[i]);
    widened[i] = mx::Bf16ToFloat(codes[i]);
  }
  v1::LayerForwardRequest bf16 = request;
  auto* t = bf16.mutable_input()->mutable_tensor();
  t->add_shape(m);
  t->add_shape(layer_->in);
  t->set_dtype(v1::DTYPE_BF16);
  t->set_data(std::string(reinterpret_cast<const char*>(codes.data()), codes.size() * 2));
  grpc::ClientContext context2;
  ASSERT_TRUE(Stub()->LayerForward(&context2, bf16, &response).ok());
  EXPECT_TRUE(SameBits(Floats(response.output()),
                       ReferenceForward(*layer_, widened, m, mx::Format::kMxfp4E2m1)));
}

std::vector<float> Transpose(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
  }
  return t;
}

TEST_F(ComputeTest, LayerBackwardEqualsReference) {
  const int64_t m = 4, n = layer_->out, k = layer_->in;
  const auto dy = TestValues(m * n, 8), x = TestValues(m * k, 9);
  for (auto format : {mx::Format::kMxfp8E4m3, mx::Format::kMxfp4E2m1, mx::Format::kMxint8,
                      mx::Format::kInt8, mx::Format::kFp16, mx::Format::kFp32}) {
    SCOPED_TRACE(mx::FormatName(format));
    v1::LayerBackwardRequest request;
    request.set_model("m");
    request.set_layer(layer_->name);
    request.set_phase(v1::PHASE_UPDATE);
    request.set_format(mxserve::ToProto(format));
    *request.mutable_grad_output() = Matrix(dy, m, n);
    *request.mutable_input() = Matrix(x, m, k);
    grpc::ClientContext context;
    v1::LayerBackwardResponse response;
    ASSERT_TRUE(Stub()->LayerBackward(&context, request, &response).ok());
    // grad_input = dY·W: C = A·B with A = dY (M×N), B = W (N×K).
    EXPECT_TRUE(SameBits(Floats(response.grad_input()),
                         *mx::ReferenceGemm(dy, format, layer_->weight, format, m, n, k)));
    // grad_weight = dYᵀ·X: A = dYᵀ (N×M), B = X (M×K).
    EXPECT_TRUE(SameBits(Floats(response.grad_weight()),
                         *mx::ReferenceGemm(Transpose(dy, m, n), format, x, format, n, m, k)));
    std::vector<float> bias(n, 0.0f);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) bias[c] += dy[r * n + c];
    }
    EXPECT_TRUE(SameBits(Floats(response.grad_bias()), bias));
  }
}

// A layer too large for one message is split: grad_weight by weight_rows (its
// rows depend on their own columns of dY only) and grad_input along M (its rows on
// their own rows of dY only). Every slice equals the same rows of the unsplit
// answer, bit for bit, in every format.
TEST_F(ComputeTest, SplitBackwardsAreSlicesOfTheWholeBitForBit) {
  const int64_t m = 5, n = layer_->out, k = layer_->in;
  const auto dy = TestValues(m * n, 31), x = TestValues(m * k, 32);
  for (int f = 0; f < mx::kFormatCount; ++f) {
    SCOPED_TRACE(mx::FormatName(static_cast<mx::Format>(f)));
    v1::LayerBackwardResponse whole;
    {
      grpc::ClientContext context;
      ASSERT_TRUE(Stub()
                      ->LayerBackward(&context,
                                      BackwardRequest("m", *layer_, v1::PHASE_UPDATE, f, dy, x, m),
                                      &whole)
                      .ok());
    }
    const std::vector<float> grad_weight = Floats(whole.grad_weight());
    const std::vector<float> grad_bias = Floats(whole.grad_bias());
    const std::vector<float> grad_input = Floats(whole.grad_input());
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 5}, {5, 12}, {11, 12}}) {
      SCOPED_TRACE(absl::StrCat("weight_rows [", begin, ", ", end, ")"));
      std::vector<float> columns;
      for (int64_t r = 0; r < m; ++r) {
        columns.insert(columns.end(), dy.begin() + r * n + begin, dy.begin() + r * n + end);
      }
      v1::LayerBackwardRequest request = BackwardRequest("m", *layer_, v1::PHASE_UPDATE, f, dy, x, m);
      *request.mutable_grad_output() = Matrix(columns, m, end - begin);
      request.mutable_weight_rows()->set_begin(begin);
      request.mutable_weight_rows()->set_end(end);
      grpc::ClientContext context;
      v1::LayerBackwardResponse slice;
      const grpc::Status status = Stub()->LayerBackward(&context, request, &slice);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_FALSE(slice.has_grad_input());
      EXPECT_EQ(slice.grad_weight().shape(0), end - begin);
      // NVFP4's tensor scale is the operand's: a slice's columns of dY are a
      // tensor of their own (mx/README.md), equal to the whole's only where
      // their amax is; the slice is then the unsplit call on those columns.
      std::vector<float> want(grad_weight.begin() + begin * k, grad_weight.begin() + end * k);
      if (f == static_cast<int>(mx::Format::kNvfp4)) {
        const mx::QuantizedMatrix dyt =
            *mx::QuantizeColumns(columns, m, end - begin, mx::Format::kNvfp4);
        const mx::QuantizedMatrix xt = *mx::QuantizeColumns(x, m, k, mx::Format::kNvfp4);
        want = *mx::ReferenceLinear(dyt, xt);
      }
      EXPECT_TRUE(SameBits(Floats(slice.grad_weight()), want));
      EXPECT_TRUE(SameBits(Floats(slice.grad_bias()),
                           std::vector<float>(grad_bias.begin() + begin, grad_bias.begin() + end)));
    }
    // grad_input of rows [2, 5) alone.
    const std::vector<float> tail(dy.begin() + 2 * n, dy.end());
    grpc::ClientContext context;
    v1::LayerBackwardResponse rows;
    ASSERT_TRUE(
        Stub()
            ->LayerBackward(&context,
                            BackwardRequest("m", *layer_, v1::PHASE_UPDATE, f, tail, std::nullopt, 3),
                            &rows)
            .ok());
    EXPECT_TRUE(SameBits(Floats(rows.grad_input()),
                         std::vector<float>(grad_input.begin() + 2 * k, grad_input.end())));
  }
}

// An update-phase call makes its weight copy in slices of rows, for that call
// only (server/model/registry.h, CopyUse::kUpdate); a layer of more than 8 Mi
// weights takes two or more. Its bits are those of a whole copy: the one a
// rollout call caches.
TEST_F(ComputeTest, AnUpdateCallOnALargeLayerIsSlicedBitForBit) {
  const TestLayer big = MakeLayer("model.layers.0.mlp.down_proj", 4160, 2048, true, 40);
  ASSERT_TRUE(RegisterAndPublish(daemon_->channel().get(), "big", {big}).ok());
  const int64_t m = 3;
  const auto x = TestValues(m * big.in, 41), dy = TestValues(m * big.out, 42);
  for (mx::Format format : {mx::Format::kMxfp6E2m3, mx::Format::kInt8, mx::Format::kFp32}) {
    SCOPED_TRACE(mx::FormatName(format));
    const int f = static_cast<int>(format);
    auto forward = [&](v1::Phase phase) {
      grpc::ClientContext context;
      v1::LayerForwardResponse y;
      const grpc::Status s =
          Stub()->LayerForward(&context, ForwardRequest("big", big, phase, f, x, m), &y);
      EXPECT_TRUE(s.ok()) << s.error_message();
      return Floats(y.output());
    };
    auto grad_input = [&](v1::Phase phase) {
      grpc::ClientContext context;
      v1::LayerBackwardResponse g;
      const grpc::Status s = Stub()->LayerBackward(
          &context, BackwardRequest("big", big, phase, f, dy, std::nullopt, m), &g);
      EXPECT_TRUE(s.ok()) << s.error_message();
      return Floats(g.grad_input());
    };
    const std::vector<float> sliced = forward(v1::PHASE_UPDATE);
    if (format == mx::Format::kMxfp6E2m3) {  // the reference once: it is slow
      const auto qx = mx::QuantizeRows(x, m, big.in, format).value();
      const auto qw = mx::QuantizeRows(big.weight, big.out, big.in, format).value();
      EXPECT_TRUE(SameBits(sliced, *mx::ReferenceLinear(qx, qw, big.bias_values)));
    }
    ASSERT_EQ(sliced.size(), static_cast<size_t>(m * big.out));
    EXPECT_TRUE(SameBits(sliced, forward(v1::PHASE_ROLLOUT)));  // a cached copy
    EXPECT_TRUE(SameBits(sliced, forward(v1::PHASE_UPDATE)));   // still sliced
    const std::vector<float> sliced_t = grad_input(v1::PHASE_UPDATE);
    EXPECT_TRUE(SameBits(sliced_t, grad_input(v1::PHASE_ROLLOUT)));  // cached transposed
    ASSERT_EQ(sliced_t.size(), static_cast<size_t>(m * big.in));
  }
  grpc::ClientContext deleting;
  v1::DeleteModelRequest request;
  request.set_name("big");
  v1::DeleteModelResponse deleted;
  ASSERT_TRUE(
      v1::Models::NewStub(daemon_->channel())->DeleteModel(&deleting, request, &deleted).ok());
}

TEST_F(ComputeTest, StreamAnswersEveryRequestWithReferenceBits) {
  auto stub = Stub();
  grpc::ClientContext context;
  auto stream = stub->Stream(&context);
  const int64_t m = 2, k = 40, n = 3;
  const auto a = TestValues(m * k, 10), b = TestValues(k * n, 11);
  const auto x = TestValues(m * layer_->in, 12);
  std::map<uint64_t, int> format_of;
  uint64_t id = 100;
  for (int f = 0; f < mx::kFormatCount; ++f) {
    v1::StreamRequest gemm;
    gemm.set_request_id(id);
    format_of[id++] = f;
    gemm.mutable_gemm()->set_phase(v1::PHASE_REWARD);
    gemm.mutable_gemm()->set_format(Wire(f));
    *gemm.mutable_gemm()->mutable_a()->mutable_tensor() = Matrix(a, m, k);
    *gemm.mutable_gemm()->mutable_b()->mutable_tensor() = Matrix(b, k, n);
    ASSERT_TRUE(stream->Write(gemm));
    v1::StreamRequest forward;
    forward.set_request_id(id);
    format_of[id++] = f;
    forward.mutable_forward()->set_model("m");
    forward.mutable_forward()->set_layer(layer_->name);
    forward.mutable_forward()->set_phase(v1::PHASE_ROLLOUT);
    forward.mutable_forward()->set_format(Wire(f));
    *forward.mutable_forward()->mutable_input()->mutable_tensor() = Matrix(x, m, layer_->in);
    ASSERT_TRUE(stream->Write(forward));
  }
  v1::StreamRequest bad;  // one failing request answers alone
  bad.set_request_id(999);
  bad.mutable_forward()->set_model("nope");
  bad.mutable_forward()->set_layer("x");
  bad.mutable_forward()->set_phase(v1::PHASE_ROLLOUT);
  ASSERT_TRUE(stream->Write(bad));
  stream->WritesDone();
  v1::StreamResponse response;
  int answered = 0;
  while (stream->Read(&response)) {
    ++answered;
    if (response.request_id() == 999) {
      EXPECT_EQ(response.status_code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_NE(response.status_message().find("model: no model named 'nope'"), std::string::npos)
          << response.status_message();
      continue;
    }
    ASSERT_EQ(response.status_code(), 0) << response.status_message();
    const auto format = static_cast<mx::Format>(format_of.at(response.request_id()));
    if (response.has_gemm()) {
      EXPECT_TRUE(MeetsContract(Floats(response.gemm().c()), a, b, m, k, n, format));
    } else {
      ASSERT_TRUE(response.has_forward());
      EXPECT_TRUE(MeetsContract(Floats(response.forward().output()), *layer_, x, m, format));
    }
  }
  EXPECT_EQ(answered, 2 * mx::kFormatCount + 1);
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace mx_test

namespace mx_test {
namespace {

// --bf16-sums exact: BF16 × BF16 in the reference's order on every CPU, so
// its bits, through the float kind's kernel (and a LayerForward too).
TEST(Bf16SumsTest, ExactGivesTheReferenceBits) {
  DaemonProcess daemon({"--bf16-sums", "exact", "--workers", "1"});
  ASSERT_TRUE(daemon.ok());
  const int bf16 = static_cast<int>(mx::Format::kBf16);
  const int64_t m = 9, k = 300, n = 40;
  const auto a = TestValues(m * k, 30), b = TestValues(k * n, 31);
  auto stub = v1::Compute::NewStub(daemon.channel());
  grpc::ClientContext context;
  v1::GemmResponse response;
  ASSERT_TRUE(
      stub->Gemm(&context, GemmRequest(v1::PHASE_UPDATE, Wire(bf16), a, b, m, k, n), &response)
          .ok());
  EXPECT_TRUE(SameBits(Floats(response.c()),
                       *mx::ReferenceGemm(a, mx::Format::kBf16, b, mx::Format::kBf16, m, k, n)));
  const std::string float_kernel = mx::kernels::KernelNameFor(
      mx::Format::kFp32, mx::Format::kBf16, mx::kernels::AvailableIsas().back());
  EXPECT_EQ(response.info().kernel(), float_kernel);

  const TestLayer layer = MakeLayer("fc", 40, 64, true, 32);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}).ok());
  const auto x = TestValues(5 * 64, 33);
  grpc::ClientContext forward_context;
  v1::LayerForwardResponse forward;
  ASSERT_TRUE(stub->LayerForward(&forward_context,
                                 ForwardRequest("m", layer, v1::PHASE_ROLLOUT, bf16, x, 5),
                                 &forward)
                  .ok());
  EXPECT_TRUE(SameBits(Floats(forward.output()), ReferenceForward(layer, x, 5, mx::Format::kBf16)));
  EXPECT_EQ(forward.info().kernel(), float_kernel);
}

TEST(NullBackendTest, AnswersZerosOfTheRightShapeWithoutComputing) {
  DaemonProcess daemon({"--backend", "null", "--workers", "1"});
  ASSERT_TRUE(daemon.ok());
  const TestLayer layer = MakeLayer("fc", 40, 64, true, 3);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}, "fp16-baseline").ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  v1::LayerForwardRequest forward;
  forward.set_model("m");
  forward.set_layer("fc");
  forward.set_phase(v1::PHASE_ROLLOUT);
  forward.set_format(v1::FORMAT_MXFP4_E2M1);
  *forward.mutable_input()->mutable_tensor() = Matrix(TestValues(3 * 64, 4), 3, 64);
  grpc::ClientContext c1;
  v1::LayerForwardResponse response;
  ASSERT_TRUE(stub->LayerForward(&c1, forward, &response).ok());
  EXPECT_EQ(response.output().shape(0), 3);
  EXPECT_EQ(response.output().shape(1), 40);
  EXPECT_EQ(Floats(response.output()), std::vector<float>(3 * 40, 0.0f));
  EXPECT_EQ(response.info().backend(), "null");
  EXPECT_EQ(response.info().compute_seconds(), 0);
  EXPECT_GT(response.info().model_joules(), 0);  // the FPGA model still says what it would cost
  // Validation is the same as with a real backend.
  forward.mutable_input()->mutable_tensor()->set_shape(1, 32);
  grpc::ClientContext c2;
  EXPECT_EQ(stub->LayerForward(&c2, forward, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Nothing was quantized: no weight copy beyond the policy's warm FP16 one.
  const std::string m = ScrapeMetrics(daemon.metrics_address());
  EXPECT_EQ(MetricValue(m, "mxserve_weight_quantizations_total{format=\"MXFP4_E2M1\"}"), -1);
  EXPECT_EQ(MetricValue(m,
                        "mxserve_requests_total{backend=\"null\",format=\"MXFP4_E2M1\","
                        "phase=\"rollout\",rpc=\"LayerForward\"}"),
            1);
  // ... but no energy is booked for work that did not run: the counters stay at
  // zero and the energy report has no fpga_model joules.
  EXPECT_EQ(MetricValue(m, "mxserve_energy_joules_total{phase=\"rollout\",source=\"fpga_model\"}"),
            0);
  EXPECT_EQ(MetricValue(m, "mxserve_busy_seconds_total{phase=\"rollout\",source=\"fpga_model\"}"),
            0);
  auto telemetry = v1::Telemetry::NewStub(daemon.channel());
  grpc::ClientContext c3;
  v1::EnergyReport report;
  ASSERT_TRUE(telemetry->GetEnergyReport(&c3, {}, &report).ok());
  for (const auto& e : report.entries()) EXPECT_EQ(e.joules(), 0) << e.source();
}

}  // namespace
}  // namespace mx_test

// Every kind of compute request books the FPGA model's estimate of exactly the
// GEMMs it ran, the same in all three books: its ExecutionInfo (model_seconds,
// model_joules), the energy report's "fpga_model" entry for its phase, and the
// Prometheus counters (joules, busy seconds, bytes moved, FLOPs). The estimate
// is computed here with fpga_model::EstimateGemm and the daemon's parameters:
// the daemon runs with its default --energy-model, the copy of
// fpga/model/energy_model.json built into it, which is the file loaded below.
//
// LayerBackward with its input once booked 0 J: its two estimates were summed
// positionally into a struct that had gained a field, and no test compared the
// books with the model.
#include <map>
#include <memory>

#include "fpga/model/energy_model.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

fpga_model::EnergyModelParams DaemonEnergyModel() {
  const auto params = fpga_model::LoadEnergyModel(std::string(MXSERVE_SOURCE_DIR) +
                                                  "/fpga/model/energy_model.json");
  EXPECT_TRUE(params.ok()) << params.status();
  return params.ok() ? *params : fpga_model::EnergyModelParams{};
}

int Int(mx::Format f) { return static_cast<int>(f); }

class EnergyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.ok());
    ASSERT_TRUE(RegisterAndPublish(daemon_.channel().get(), "m", {layer_}).ok());
  }
  fpga_model::GemmEstimate Estimate(mx::Format x, mx::Format w, int64_t m, int64_t n,
                                    int64_t k) const {
    return fpga_model::EstimateGemm(params_, x, w, m, n, k);
  }

  const fpga_model::EnergyModelParams params_ = DaemonEnergyModel();
  // 130 outputs: two tiles of the 128 PE columns; 96 inputs: three blocks of 32.
  const TestLayer layer_ = MakeLayer("model.layers.3.mlp.down_proj", 130, 96, true, 90);
  DaemonProcess daemon_{{"--workers", "2"}};
};

// C (5 × 130) = A (5 × 70) · B (70 × 130), A in MXFP4 and B in MXFP8: the
// estimate of X = A in A's format and W = Bᵀ in B's; the counters of the
// phase and A's format.
TEST_F(EnergyTest, Gemm) {
  const int64_t m = 5, k = 70, n = 130;
  const auto fa = mx::Format::kMxfp4E2m1, fb = mx::Format::kMxfp8E4m3;
  const auto estimate = Estimate(fa, fb, m, n, k);
  const ModelBooks before = ReadModelBooks(daemon_, v1::PHASE_REWARD, fa);
  grpc::ClientContext context;
  v1::GemmResponse response;
  ASSERT_TRUE(v1::Compute::NewStub(daemon_.channel())
                  ->Gemm(&context,
                         GemmRequest(v1::PHASE_REWARD, Wire(Int(fa)), TestValues(m * k, 91),
                                     TestValues(k * n, 92), m, k, n, Wire(Int(fb))),
                         &response)
                  .ok());
  ExpectInfoIs(response.info(), estimate);
  ExpectBooked(before, ReadModelBooks(daemon_, v1::PHASE_REWARD, fa), estimate, 1);
}

// Y (9 × 130) = X (9 × 96) · Wᵀ: M = 9 rows, two tiles of the 8 PE rows.
TEST_F(EnergyTest, LayerForward) {
  const int64_t m = 9;
  const auto f = mx::Format::kMxint8;
  const auto estimate = Estimate(f, f, m, layer_.out, layer_.in);
  const ModelBooks before = ReadModelBooks(daemon_, v1::PHASE_ROLLOUT, f);
  grpc::ClientContext context;
  v1::LayerForwardResponse response;
  ASSERT_TRUE(v1::Compute::NewStub(daemon_.channel())
                  ->LayerForward(&context,
                                 ForwardRequest("m", layer_, v1::PHASE_ROLLOUT, Int(f),
                                                TestValues(m * layer_.in, 93), m),
                                 &response)
                  .ok());
  EXPECT_EQ(response.info().batch_size(), 1u);
  ExpectInfoIs(response.info(), estimate);
  ExpectBooked(before, ReadModelBooks(daemon_, v1::PHASE_ROLLOUT, f), estimate, 1);
}

// Without the input, one GEMM: grad_input (M × in) = dY (M × out) · W (out × in),
// i.e. X = dY with K = out, and N = in.
TEST_F(EnergyTest, LayerBackwardWithoutInput) {
  const int64_t m = 6;
  const auto f = mx::Format::kMxfp6E2m3;
  const auto estimate = Estimate(f, f, m, layer_.in, layer_.out);
  const ModelBooks before = ReadModelBooks(daemon_, v1::PHASE_UPDATE, f);
  grpc::ClientContext context;
  v1::LayerBackwardResponse response;
  ASSERT_TRUE(v1::Compute::NewStub(daemon_.channel())
                  ->LayerBackward(&context,
                                  BackwardRequest("m", layer_, v1::PHASE_UPDATE, Int(f),
                                                  TestValues(m * layer_.out, 94), std::nullopt, m),
                                  &response)
                  .ok());
  EXPECT_FALSE(response.has_grad_weight());
  ExpectInfoIs(response.info(), estimate);
  ExpectBooked(before, ReadModelBooks(daemon_, v1::PHASE_UPDATE, f), estimate, 1);
}

// With the input, two GEMMs: grad_input as above, and grad_weight (out × in) =
// dYᵀ (out × M) · X (M × in), i.e. M = out rows, K = M, N = in. One request.
TEST_F(EnergyTest, LayerBackwardWithInput) {
  const int64_t m = 6;
  const auto f = mx::Format::kMxfp8E4m3;
  const auto grad_input = Estimate(f, f, m, layer_.in, layer_.out);
  const auto grad_weight = Estimate(f, f, layer_.out, layer_.in, m);
  const auto estimate = Plus(grad_input, grad_weight);
  const ModelBooks before = ReadModelBooks(daemon_, v1::PHASE_UPDATE, f);
  grpc::ClientContext context;
  v1::LayerBackwardResponse response;
  ASSERT_TRUE(v1::Compute::NewStub(daemon_.channel())
                  ->LayerBackward(&context,
                                  BackwardRequest("m", layer_, v1::PHASE_UPDATE, Int(f),
                                                  TestValues(m * layer_.out, 95),
                                                  TestValues(m * layer_.in, 96), m),
                                  &response)
                  .ok());
  EXPECT_TRUE(response.has_grad_weight());
  ExpectInfoIs(response.info(), estimate);
  ExpectBooked(before, ReadModelBooks(daemon_, v1::PHASE_UPDATE, f), estimate, 1);
}

// A weight_rows slice runs one GEMM: its rows of grad_weight, (end - begin) × in
// = dY[:, begin:end]ᵀ · X, and no grad_input. The slices of a split backward book
// what their GEMMs did, so they add up to the unsplit grad_weight's estimate.
TEST_F(EnergyTest, LayerBackwardWeightRows) {
  const int64_t m = 6, rows = 5;
  const auto f = mx::Format::kMxint8;
  const auto estimate = Estimate(f, f, rows, layer_.in, m);
  const ModelBooks before = ReadModelBooks(daemon_, v1::PHASE_UPDATE, f);
  v1::LayerBackwardRequest request = BackwardRequest(
      "m", layer_, v1::PHASE_UPDATE, Int(f), TestValues(m * layer_.out, 97), TestValues(m * layer_.in, 98), m);
  *request.mutable_grad_output() = Matrix(TestValues(m * rows, 99), m, rows);
  request.mutable_weight_rows()->set_begin(1);
  request.mutable_weight_rows()->set_end(1 + rows);
  grpc::ClientContext context;
  v1::LayerBackwardResponse response;
  const grpc::Status status =
      v1::Compute::NewStub(daemon_.channel())->LayerBackward(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(response.has_grad_input());
  ExpectInfoIs(response.info(), estimate);
  ExpectBooked(before, ReadModelBooks(daemon_, v1::PHASE_UPDATE, f), estimate, 1);
}

// A fused batch runs one GEMM of the members' stacked rows, but each member is
// booked as if it had run alone: the estimate of its own rows (M = its rows, the
// layer's N and K), in its ExecutionInfo and once in the ledger and counters.
// The batch's books are the sum of its members' estimates, not the estimate of
// the fused GEMM (which loads W once and fills the PE rows better).
//
// One worker, a window far longer than the test, and a maximum batch of exactly
// the requests sent: the worker that takes the first request keeps its batch
// open until all three have joined, then runs them as one.
TEST(EnergyBatchTest, BatchedLayerForward) {
  constexpr int kRequests = 3;
  DaemonProcess daemon({"--workers", "1", "--batch-window-us", "10000000", "--max-batch",
                        std::to_string(kRequests)});
  ASSERT_TRUE(daemon.ok());
  const TestLayer layer = MakeLayer("model.layers.5.self_attn.q_proj", 130, 96, false, 97);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}).ok());
  const auto params = DaemonEnergyModel();
  const auto f = mx::Format::kMxfp8E5m2;
  const ModelBooks before = ReadModelBooks(daemon, v1::PHASE_REWARD, f);

  const int64_t rows[kRequests] = {1, 2, 5};
  std::vector<v1::LayerForwardRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(ForwardRequest("m", layer, v1::PHASE_REWARD, Int(f),
                                      TestValues(rows[i] * layer.in, 98 + i), rows[i]));
  }
  const std::vector<ForwardResult> results = ForwardAllAtOnce(daemon.channel(), requests);
  fpga_model::GemmEstimate total;
  int64_t total_rows = 0;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    const auto own = fpga_model::EstimateGemm(params, f, f, rows[i], layer.out, layer.in);
    EXPECT_EQ(results[i].response.info().batch_size(), static_cast<uint32_t>(kRequests));
    ExpectInfoIs(results[i].response.info(), own);
    total = Plus(total, own);
    total_rows += rows[i];
  }
  ExpectBooked(before, ReadModelBooks(daemon, v1::PHASE_REWARD, f), total, kRequests);
  // The rule is visible here: the fused GEMM's own estimate is another number.
  EXPECT_NE(fpga_model::EstimateGemm(params, f, f, total_rows, layer.out, layer.in).joules,
            total.joules);
}

// Compute.Stream books each request as the unary call of its kind would: a
// Gemm (reward), a LayerForward (rollout), and two LayerBackwards, without and
// with the input (update), on one stream.
TEST_F(EnergyTest, Stream) {
  const int64_t m = 3, k = 64, n = 40;
  const auto fg = mx::Format::kMxfp6E3m2, ff = mx::Format::kBf16, fb = mx::Format::kMxfp4E2m1;
  const std::map<uint64_t, fpga_model::GemmEstimate> expected = {
      {1, Estimate(fg, fg, m, n, k)},
      {2, Estimate(ff, ff, m, layer_.out, layer_.in)},
      {3, Estimate(fb, fb, m, layer_.in, layer_.out)},
      {4, Plus(Estimate(fb, fb, m, layer_.in, layer_.out),
               Estimate(fb, fb, layer_.out, layer_.in, m))}};
  const ModelBooks reward_before = ReadModelBooks(daemon_, v1::PHASE_REWARD, fg);
  const ModelBooks rollout_before = ReadModelBooks(daemon_, v1::PHASE_ROLLOUT, ff);
  const ModelBooks update_before = ReadModelBooks(daemon_, v1::PHASE_UPDATE, fb);

  grpc::ClientContext context;
  auto stream = v1::Compute::NewStub(daemon_.channel())->Stream(&context);
  v1::StreamRequest request;
  request.set_request_id(1);
  *request.mutable_gemm() = GemmRequest(v1::PHASE_REWARD, Wire(Int(fg)), TestValues(m * k, 101),
                                        TestValues(k * n, 102), m, k, n);
  ASSERT_TRUE(stream->Write(request));
  request.set_request_id(2);
  *request.mutable_forward() =
      ForwardRequest("m", layer_, v1::PHASE_ROLLOUT, Int(ff), TestValues(m * layer_.in, 103), m);
  ASSERT_TRUE(stream->Write(request));
  request.set_request_id(3);
  *request.mutable_backward() = BackwardRequest("m", layer_, v1::PHASE_UPDATE, Int(fb),
                                                TestValues(m * layer_.out, 104), std::nullopt, m);
  ASSERT_TRUE(stream->Write(request));
  request.set_request_id(4);
  *request.mutable_backward() =
      BackwardRequest("m", layer_, v1::PHASE_UPDATE, Int(fb), TestValues(m * layer_.out, 105),
                      TestValues(m * layer_.in, 106), m);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  std::map<uint64_t, v1::StreamResponse> answers;
  v1::StreamResponse response;
  while (stream->Read(&response)) answers[response.request_id()] = response;
  const grpc::Status finished = stream->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  ASSERT_EQ(answers.size(), expected.size());
  for (const auto& [id, answer] : answers) {
    SCOPED_TRACE(id);
    ASSERT_EQ(answer.status_code(), 0) << answer.status_message();
    const v1::ExecutionInfo& info = id == 1   ? answer.gemm().info()
                                    : id == 2 ? answer.forward().info()
                                              : answer.backward().info();
    ExpectInfoIs(info, expected.at(id));
  }
  EXPECT_FALSE(answers[3].backward().has_grad_weight());
  EXPECT_TRUE(answers[4].backward().has_grad_weight());
  {
    SCOPED_TRACE("reward: the Gemm");
    ExpectBooked(reward_before, ReadModelBooks(daemon_, v1::PHASE_REWARD, fg), expected.at(1), 1);
  }
  {
    SCOPED_TRACE("rollout: the LayerForward");
    ExpectBooked(rollout_before, ReadModelBooks(daemon_, v1::PHASE_ROLLOUT, ff), expected.at(2), 1);
  }
  SCOPED_TRACE("update: the two LayerBackwards");
  ExpectBooked(update_before, ReadModelBooks(daemon_, v1::PHASE_UPDATE, fb),
               Plus(expected.at(3), expected.at(4)), 2);
}

}  // namespace
}  // namespace mx_test

// The scheduler seen from outside: batching gives the bits of unbatched runs and
// never mixes formats or weight versions; a full queue answers
// RESOURCE_EXHAUSTED; expired work is not computed; shutdown finishes in-flight
// requests.
#include <chrono>
#include <future>
#include <thread>

#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

struct Call {
  grpc::ClientContext context;
  v1::LayerForwardRequest request;
  v1::LayerForwardResponse response;
  std::promise<grpc::Status> done;
};

// Starts a LayerForward without waiting for it.
std::unique_ptr<Call> Start(v1::Compute::Stub* stub, const std::string& layer, v1::Format format,
                            const std::vector<float>& x, int64_t m, int64_t k,
                            uint64_t min_version = 0) {
  auto call = std::make_unique<Call>();
  call->request.set_model("m");
  call->request.set_layer(layer);
  call->request.set_phase(v1::PHASE_ROLLOUT);
  call->request.set_format(format);
  call->request.set_min_weight_version(min_version);
  *call->request.mutable_input()->mutable_tensor() = Matrix(x, m, k);
  Call* raw = call.get();
  stub->async()->LayerForward(&raw->context, &raw->request, &raw->response,
                              [raw](grpc::Status s) { raw->done.set_value(s); });
  return call;
}

TEST(SchedulingTest, BatchedRequestsGetTheirOwnUnbatchedBits) {
  // One worker and a long window: requests arriving together are fused.
  DaemonProcess daemon({"--workers", "1", "--batch-window-us", "300000", "--max-batch", "8"});
  ASSERT_TRUE(daemon.ok());
  const TestLayer layer = MakeLayer("blocks.0.attn.q_proj", 24, 96, true, 21);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}).ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  std::vector<std::unique_ptr<Call>> calls;
  std::vector<std::vector<float>> inputs;
  std::vector<v1::Format> formats;
  for (int i = 0; i < 8; ++i) {
    // Two formats interleaved: each batch must hold one of them only.
    const v1::Format format = i % 2 == 0 ? v1::FORMAT_MXFP4_E2M1 : v1::FORMAT_MXFP8_E4M3;
    const int64_t m = 1 + i % 3;
    inputs.push_back(TestValues(m * layer.in, 100 + i));
    formats.push_back(format);
    calls.push_back(Start(stub.get(), layer.name, format, inputs.back(), m, layer.in));
  }
  int fused = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    ASSERT_TRUE(calls[i]->done.get_future().get().ok());
    const int64_t m = 1 + i % 3;
    const mx::Format format = *mxserve::ToMx(formats[i]);
    EXPECT_TRUE(SameBits(Floats(calls[i]->response.output()),
                         ReferenceForward(layer, inputs[i], m, format)))
        << "request " << i;
    EXPECT_EQ(calls[i]->response.info().format(), formats[i]);
    EXPECT_LE(calls[i]->response.info().batch_size(), 4u) << "a batch mixed formats";
    if (calls[i]->response.info().batch_size() > 1) ++fused;
  }
  EXPECT_GE(fused, 4) << "the batching window fused nothing";
}

TEST(SchedulingTest, BatchesNeverMixWeightVersions) {
  DaemonProcess daemon({"--workers", "1", "--batch-window-us", "400000", "--max-batch", "8"});
  ASSERT_TRUE(daemon.ok());
  TestLayer v1_layer = MakeLayer("l", 16, 64, false, 31);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {v1_layer}).ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  const auto x = TestValues(2 * 64, 32);
  auto old_call = Start(stub.get(), "l", v1::FORMAT_MXFP8_E4M3, x, 2, 64);
  // The first request holds version 1 once it is queued (it looked its layer up
  // first); on a loaded machine that can take longer than the upload below.
  const auto queued_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (MetricValue(ScrapeMetrics(daemon.metrics_address()), "mxserve_queue_depth") < 1 &&
         std::chrono::steady_clock::now() < queued_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Publish version 2 while the first request waits in its batching window.
  TestLayer v2_layer = MakeLayer("l", 16, 64, false, 33);
  v1::UploadWeightsResponse uploaded;
  auto upload = std::async(std::launch::async, [&] {
    return Upload(daemon.channel().get(), "m", {v2_layer}, true, &uploaded);
  });
  // Wait until version 2 is visible, then send a request that needs it.
  auto new_call = Start(stub.get(), "l", v1::FORMAT_MXFP8_E4M3, x, 2, 64, /*min_version=*/2);
  // Retried on a time budget, not a count of tries: a loaded machine (ctest -j2)
  // can take longer than 50 quick refusals to publish.
  grpc::Status new_status = new_call->done.get_future().get();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!new_status.ok() && std::chrono::steady_clock::now() < give_up) {
    ASSERT_EQ(new_status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    new_call = Start(stub.get(), "l", v1::FORMAT_MXFP8_E4M3, x, 2, 64, 2);
    new_status = new_call->done.get_future().get();
  }
  ASSERT_TRUE(new_status.ok()) << new_status.error_message();
  ASSERT_TRUE(old_call->done.get_future().get().ok());
  ASSERT_TRUE(upload.get().ok());
  EXPECT_EQ(old_call->response.info().weight_version(), 1u);
  EXPECT_EQ(new_call->response.info().weight_version(), 2u);
  EXPECT_TRUE(SameBits(Floats(old_call->response.output()),
                       ReferenceForward(v1_layer, x, 2, mx::Format::kMxfp8E4m3)));
  EXPECT_TRUE(SameBits(Floats(new_call->response.output()),
                       ReferenceForward(v2_layer, x, 2, mx::Format::kMxfp8E4m3)));
}

// A Gemm big enough to keep the single reference worker busy for a while
// (about 0.15 s here; `m` rows more make it longer).
v1::GemmRequest SlowGemm(int64_t m = 256) {
  const int64_t k = 512, n = 256;
  v1::GemmRequest request;
  request.set_phase(v1::PHASE_UPDATE);
  request.set_format(v1::FORMAT_FP32);
  *request.mutable_a()->mutable_tensor() = Matrix(TestValues(m * k, 1), m, k);
  *request.mutable_b()->mutable_tensor() = Matrix(TestValues(k * n, 2), k, n);
  return request;
}

struct GemmCall {
  grpc::ClientContext context;
  v1::GemmRequest request;
  v1::GemmResponse response;
  std::promise<grpc::Status> done;
};

std::unique_ptr<GemmCall> StartGemm(v1::Compute::Stub* stub, const v1::GemmRequest& request,
                                    double timeout_seconds = 0) {
  auto call = std::make_unique<GemmCall>();
  call->request = request;
  if (timeout_seconds > 0) {
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::milliseconds(int64_t(timeout_seconds * 1000)));
  }
  GemmCall* raw = call.get();
  stub->async()->Gemm(&raw->context, &raw->request, &raw->response,
                      [raw](grpc::Status s) { raw->done.set_value(s); });
  return call;
}

// These tests need a request that keeps the one worker busy for a while. The
// fast kernels finish any message-sized FP32 Gemm in milliseconds, so the daemon
// runs its scalar kernels (MX_ISA=scalar, inherited by the child process).
struct ScalarKernels {
  ScalarKernels() { setenv("MX_ISA", "scalar", 1); }
  ~ScalarKernels() { unsetenv("MX_ISA"); }
};

TEST(SchedulingTest, FullQueueAnswersResourceExhaustedAndExpiredWorkIsDropped) {
  ScalarKernels scalar;
  DaemonProcess daemon({"--workers", "1", "--queue-size", "2"});
  ASSERT_TRUE(daemon.ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  const v1::GemmRequest slow = SlowGemm();
  std::vector<std::unique_ptr<GemmCall>> calls;
  for (int i = 0; i < 6; ++i) calls.push_back(StartGemm(stub.get(), slow));
  int ok = 0, exhausted = 0;
  for (auto& call : calls) {
    grpc::Status s = call->done.get_future().get();
    if (s.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
      EXPECT_NE(s.error_message().find("--queue-size"), std::string::npos) << s.error_message();
      ++exhausted;
    }
  }
  EXPECT_GE(ok, 2);
  EXPECT_GE(exhausted, 1);

  // Behind a slow request, one with a short deadline expires in the queue and is
  // not computed: only the slow request adds FLOPs.
  const std::string before = ScrapeMetrics(daemon.metrics_address());
  const std::string series =
      "mxserve_requests_total{backend=\"cpu\",format=\"FP32\",phase=\"update\",rpc=\"Gemm\"}";
  const double served_before = std::max(0.0, MetricValue(before, series));
  auto blocker = StartGemm(stub.get(), SlowGemm(1024));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the blocker runs first
  auto hurried = StartGemm(stub.get(), slow, /*timeout_seconds=*/0.05);
  EXPECT_EQ(hurried->done.get_future().get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(blocker->done.get_future().get().ok());
  // The daemon answers the expired item when the worker reaches it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string after;
  while (std::chrono::steady_clock::now() < until) {
    after = ScrapeMetrics(daemon.metrics_address());
    if (MetricValue(after,
                    "mxserve_rpc_completed_total{code=\"DEADLINE_EXCEEDED\",rpc=\"Gemm\"}") >= 1 ||
        MetricValue(after, "mxserve_rpc_completed_total{code=\"CANCELLED\",rpc=\"Gemm\"}") >= 1) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(MetricValue(after, series), served_before + 1) << after;
}

TEST(SchedulingTest, CancelledWorkIsNotComputed) {
  ScalarKernels scalar;
  DaemonProcess daemon({"--workers", "1"});
  ASSERT_TRUE(daemon.ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  const v1::GemmRequest slow = SlowGemm();
  // The blocker (about 0.6 s) surely runs before the doomed request arrives.
  auto blocker = StartGemm(stub.get(), SlowGemm(1024));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto doomed = StartGemm(stub.get(), slow);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  doomed->context.TryCancel();
  EXPECT_EQ(doomed->done.get_future().get().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(blocker->done.get_future().get().ok());
  const std::string served =
      "mxserve_requests_total{backend=\"cpu\",format=\"FP32\",phase=\"update\",rpc=\"Gemm\"}";
  const std::string cancelled = "mxserve_rpc_completed_total{code=\"CANCELLED\",rpc=\"Gemm\"}";
  std::string m;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    m = ScrapeMetrics(daemon.metrics_address());
    if (MetricValue(m, cancelled) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(MetricValue(m, cancelled), 1) << m;
  EXPECT_EQ(MetricValue(m, served), 1) << "the cancelled Gemm was computed";
}

TEST(SchedulingTest, ShutdownFinishesInFlightRequests) {
  DaemonProcess daemon({"--workers", "1"});
  ASSERT_TRUE(daemon.ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  const v1::GemmRequest slow = SlowGemm();
  std::vector<std::unique_ptr<GemmCall>> calls;
  for (int i = 0; i < 3; ++i) calls.push_back(StartGemm(stub.get(), slow));
  // Let all three arrive before the signal (a late one is refused as new work
  // after it, which is right): one running, two queued. A depth of 2 read once
  // can also be the first two queued before the idle worker took the first
  // (seen under ASan): the worker takes it within milliseconds, so the depth
  // must read 2 twice, 50 ms apart (a Gemm runs about 0.15 s). If the first
  // ends before the third arrives the depth never reads 2, and the wait's end
  // still finds all three in.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int twice = 0; twice < 2 && std::chrono::steady_clock::now() < until;) {
    const bool two = MetricValue(ScrapeMetrics(daemon.metrics_address()), "mxserve_queue_depth") == 2;
    twice = two ? twice + 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(two ? 50 : 10));
  }
  EXPECT_EQ(daemon.Stop(), 0);
  for (auto& call : calls) {
    grpc::Status s = call->done.get_future().get();
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
    ASSERT_EQ(call->response.c().shape_size(), 2);
    EXPECT_EQ(call->response.c().shape(0), 256);
  }
  const std::string log = daemon.Log();
  EXPECT_NE(log.find("event=stopping signal=SIGTERM"), std::string::npos) << log;
  EXPECT_NE(log.find("event=stopped"), std::string::npos) << log;
}

}  // namespace
}  // namespace mx_test

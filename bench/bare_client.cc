// bare_client: the load generator of `mxctl bench` pointed at bare_server — the
// same closed loop, the same measuring and reporting code (load_generator.h,
// load_report.h), the same message sizes — so its figures are the bare-gRPC
// baseline mxserved's are compared with (bench/overhead.sh).
//
//   bare_client --server HOST:PORT --m M --k K --n N [--concurrency C]
//               [--duration 10s] [--warmup 1s] [--json] [--timeout 60s]
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "bench/bare.grpc.pb.h"
#include "clients/cpp/flags.h"
#include "clients/cpp/load_flags.h"
#include "clients/cpp/load_generator.h"
#include "clients/cpp/load_report.h"
#include "mx/status_macros.h"

namespace {

namespace bare = ::mxbench::bare::v1;

constexpr int kMaxMessageBytes = 256 << 20;

// Everything one callback call needs until its reaction has run.
struct Call {
  grpc::ClientContext context;
  bare::ForwardResponse response;
};

absl::Status Run(const std::vector<std::string>& args) {
  MX_ASSIGN_OR_RETURN(
      auto flags, mxctl::Flags::Parse(
                      args, mxctl::FlagSpec{.values = mxctl::WithLoadFlags({"server", "timeout"}),
                                            .switches = {"json"}}));
  MX_ASSIGN_OR_RETURN(auto server, flags.Require("server"));
  MX_ASSIGN_OR_RETURN(mxctl::LoadRun run, mxctl::ParseLoadFlags(flags));
  const int64_t m = run.m, k = run.k, n = run.n;
  mxclient::LoadOptions load = run.load;
  MX_ASSIGN_OR_RETURN(auto timeout, flags.DurationOr("timeout", absl::Seconds(60)));

  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  channel_args.SetMaxSendMessageSize(kMaxMessageBytes);
  const std::unique_ptr<bare::Bare::Stub> stub = bare::Bare::NewStub(
      grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), channel_args));

  // The same input mxctl bench sends: M×K uniform values, fixed seed.
  auto request = std::make_shared<bare::ForwardRequest>();
  request->set_model("bare");
  request->set_layer("bench");
  request->set_phase(1);
  request->set_format(5);
  request->set_out_features(n);
  std::vector<float> input(static_cast<size_t>(m * k));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : input) v = uniform(rng);
  bare::Tensor* tensor = request->mutable_input();
  tensor->add_shape(m);
  tensor->add_shape(k);
  tensor->set_dtype(1);
  tensor->set_data(reinterpret_cast<const char*>(input.data()), input.size() * sizeof(float));

  std::mutex error_mu;
  grpc::Status first_error;
  const mxclient::LoadResult result = mxclient::RunLoad(load, [&](std::function<void(bool)> done) {
    auto* call = new Call;
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    stub->async()->Forward(&call->context, request.get(), &call->response,
                           [&, call, done](grpc::Status status) {
                             delete call;
                             if (!status.ok()) {
                               std::lock_guard lock(error_mu);
                               if (first_error.ok()) first_error = status;
                             }
                             done(status.ok());
                           });
  });

  const mxclient::LoadDescription description = {
      .target = "bare Forward", .m = m, .n = n, .k = k, .concurrency = load.concurrency};
  if (flags.Switch("json")) {
    std::printf("%s\n", mxclient::LoadReportJson(result, description).c_str());
  } else {
    std::fputs(mxclient::LoadReportText(result, description).c_str(), stdout);
  }
  if (result.errors > 0) {
    return absl::UnavailableError(
        absl::StrCat(result.errors, " requests failed; the first: ", first_error.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const absl::Status status = Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!status.ok()) {
    std::fprintf(stderr, "bare_client: error: %s\n", std::string(status.message()).c_str());
    return absl::IsInvalidArgument(status) ? 2 : 1;
  }
  return 0;
}

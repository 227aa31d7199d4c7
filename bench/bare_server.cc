// bare_server: a gRPC server that answers bare.v1.Bare/Forward with zeros of the
// requested size and does nothing else — the floor under mxserved's latency and
// the ceiling over its throughput for the same messages (bench/overhead.sh).
//
//   bare_server [--listen 127.0.0.1:0] [--max-output-bytes 256M]
//
// Prints `listening grpc=HOST:PORT` on stdout once it serves; SIGTERM or SIGINT
// stop it (exit 0). Uses the callback API, as mxserved does.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/bare.grpc.pb.h"
#include "clients/cpp/flags.h"
#include "mx/status_macros.h"

namespace {

namespace bare = ::mxbench::bare::v1;

constexpr int kMaxMessageBytes = 256 << 20;

class BareService final : public bare::Bare::CallbackService {
 public:
  explicit BareService(size_t max_output_bytes)
      : zeros_(static_cast<char*>(std::calloc(max_output_bytes, 1))),
        max_output_bytes_(max_output_bytes) {}
  ~BareService() override { std::free(zeros_); }

  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const bare::ForwardRequest* request,
                                    bare::ForwardResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const bare::Tensor& input = request->input();
    const int64_t n = request->out_features();
    if (input.shape_size() != 2 || input.shape(0) < 1 || input.shape(1) < 1 || n < 1 ||
        input.data().size() != static_cast<size_t>(input.shape(0) * input.shape(1) * 4)) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "input: expected shape [M, K] with M*K*4 bytes, out_features > 0"));
      return reactor;
    }
    const int64_t m = input.shape(0);
    const size_t bytes = static_cast<size_t>(m * n * 4);
    if (bytes > max_output_bytes_) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("output of ", bytes, " bytes exceeds --max-output-bytes ",
                                    max_output_bytes_)));
      return reactor;
    }
    bare::Tensor* output = response->mutable_output();
    output->add_shape(m);
    output->add_shape(n);
    output->set_dtype(1);
    output->set_data(zeros_, bytes);
    response->set_backend("bare");
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  // calloc'd: untouched pages read as zeros without costing memory up front.
  char* zeros_;
  size_t max_output_bytes_;
};

absl::Status Run(const std::vector<std::string>& args) {
  MX_ASSIGN_OR_RETURN(auto flags, mxctl::Flags::Parse(args, {"listen", "max-output-bytes"}));
  const std::string listen = flags.Get("listen").value_or("127.0.0.1:0");
  MX_ASSIGN_OR_RETURN(auto max_output_bytes,
                      flags.IntOr("max-output-bytes", kMaxMessageBytes, 1, kMaxMessageBytes));
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: expected HOST:PORT, got '", listen, "'"));
  }

  // Signals are taken by sigwait below; threads gRPC starts inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  BareService service(static_cast<size_t>(max_output_bytes));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on '", listen, "'"));
  }
  std::printf("listening grpc=%s:%d\n", listen.substr(0, colon).c_str(), port);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const absl::Status status = Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!status.ok()) {
    std::fprintf(stderr, "bare_server: error: %s\n", std::string(status.message()).c_str());
    return 2;
  }
  return 0;
}

// Fuzz target: every RPC of the daemon, through its real services, in this
// process, over loopback TCP as a real client calls (gRPC's in-process
// transport completes a send only when the peer reads it, which a client of
// a daemon that stopped reading would never see).
//
// Input: the first byte picks the method (kMethods); the rest is what the
// client sends. A unary method gets the rest as its one message; a streaming
// method gets a sequence of messages, each preceded by a 2-byte little-endian
// length. The daemon (cpu backend, one worker, 64 KiB messages, a --model-dir
// holding a safetensors file, room for 4 run tags) has a model "m" with published weights, so
// forwards, backwards and loads reach the kernels, not just the validators.
//
// What counts as a failure: a crash or a sanitizer report in the daemon, or a
// status gRPC should never produce from our handlers (UNIMPLEMENTED on a known
// method, UNKNOWN, INTERNAL).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mxserve/v1/models.pb.h"
#include "server/daemon.h"
#include "server/telemetry/log.h"
#include "tests/daemon/raw_call.h"
#include "tests/fuzz/fuzz_daemon.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using mx_fuzz::kRpcMethods;

std::shared_ptr<grpc::Channel> channel;
uint64_t runs = 0;

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_rpc: %s\n", what.c_str());
  std::abort();
}

// Sends `message` to a unary method and insists on OK (the setup's own calls).
void Must(const char* method, const google::protobuf::Message& message) {
  const mx_test::RawResult result =
      mx_test::RawCall(channel, method, {message.SerializeAsString()});
  if (!result.status.ok()) Fail(std::string(method) + ": " + result.status.error_message());
}

void Setup() {
  const auto dir =
      std::filesystem::temp_directory_path() / ("mxserve_fuzz_rpc_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  mx_fuzz::WriteSeedSafetensors(dir / "m.safetensors");
  channel = mx_fuzz::StartFuzzDaemon("fuzz_rpc", [&](mxserve::DaemonOptions& options) {
    options.queue_size = 64;
    options.max_message_bytes = 64 << 10;
    options.weight_memory_bytes = 64 << 20;
    options.model_dirs = {dir.string()};
  });
  Must("/mxserve.v1.Models/RegisterModel", mx_fuzz::SeedModel());
  mxserve::v1::LoadSafetensorsRequest load;
  load.set_model(mx_fuzz::kSeedModel);
  load.set_path("m.safetensors");
  load.set_publish(true);
  Must("/mxserve.v1.Models/LoadSafetensors", load);
}

// Keeps state from piling up over millions of inputs: every other model goes.
void Prune() {
  mxserve::v1::ListModelsResponse models;
  const mx_test::RawResult list = mx_test::RawCall(channel, "/mxserve.v1.Models/ListModels", {""});
  if (list.responses.empty() || !models.ParseFromString(list.responses[0])) return;
  for (const auto& model : models.models()) {
    if (model.name() == mx_fuzz::kSeedModel) continue;
    mxserve::v1::DeleteModelRequest request;
    request.set_name(model.name());
    mx_test::RawCall(channel, "/mxserve.v1.Models/DeleteModel", {request.SerializeAsString()});
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const mx_fuzz::RpcMethod& method = kRpcMethods[data[0] % std::size(kRpcMethods)];
  std::vector<std::string> messages;
  const char* rest = reinterpret_cast<const char*>(data + 1);
  size_t left = size - 1;
  if (!method.streaming) {
    messages.emplace_back(rest, left);
  } else {
    while (left >= 2) {
      const size_t length = std::min<size_t>(left - 2, uint8_t(rest[0]) | uint8_t(rest[1]) << 8);
      messages.emplace_back(rest + 2, length);
      rest += 2 + length;
      left -= 2 + length;
    }
  }
  const mx_test::RawResult result = mx_test::RawCall(channel, method.name, messages, 5.0);
  switch (result.status.error_code()) {
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DEADLINE_EXCEEDED:  // 5 s: a call the daemon never ended
      Fail(std::string(method.name) + " answered " + std::to_string(result.status.error_code()) +
           ": " + result.status.error_message());
    default:
      break;
  }
  if (++runs % 1000 == 0) Prune();
  return 0;
}

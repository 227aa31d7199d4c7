// `mxctl bench`: a load generator against the daemon. It registers a throwaway
// model with one N×K layer, uploads seeded random weights, keeps C LayerForward
// requests of an M×K input in flight (unary callback calls, or one Compute.Stream
// with --stream) for the duration, deletes the model, and reports requests/s,
// GFLOP/s and latency percentiles. The measuring itself is load_generator.h's.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/common_flags.h"
#include "clients/cpp/compute_stream.h"
#include "clients/cpp/load_flags.h"
#include "clients/cpp/load_generator.h"
#include "clients/cpp/load_report.h"
#include "clients/cpp/tensor.h"
#include "clients/cpp/wire_names.h"
#include "mx/status_macros.h"

namespace mxctl {
namespace {

namespace v1 = ::mxserve::v1;

constexpr char kLayer[] = "bench";
constexpr uint32_t kWeightSeed = 20240601;
constexpr uint32_t kInputSeed = 7;

std::atomic<bool> interrupted{false};
void OnInterrupt(int) { interrupted.store(true); }

std::vector<float> RandomValues(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}

// The first failure's message, for the report.
class FirstError {
 public:
  void Record(const absl::Status& status) {
    std::lock_guard lock(mu_);
    if (first_.ok()) first_ = status;
  }
  absl::Status Get() {
    std::lock_guard lock(mu_);
    return first_;
  }

 private:
  std::mutex mu_;
  absl::Status first_;
};

// Registers the model and publishes its weights. Sets `registered` once the model
// exists, so the caller deletes it then (and only then: a name clash is not ours).
absl::Status SetUpModel(mxclient::Client& client, const std::string& model, int64_t n, int64_t k,
                        bool& registered) {
  v1::RegisterModelRequest request;
  request.set_name(model);
  v1::LayerSpec* layer = request.add_layers();
  layer->set_name(kLayer);
  layer->set_out_features(n);
  layer->set_in_features(k);
  absl::StatusOr<v1::ModelInfo> info = client.RegisterModel(request);
  if (!info.ok()) return ServerError("Models.RegisterModel", info.status());
  registered = true;
  const std::vector<float> weight = RandomValues(static_cast<size_t>(n * k), kWeightSeed);
  const mxclient::WeightTensor tensors[] = {{.layer = kLayer, .values = weight}};
  absl::StatusOr<v1::UploadWeightsResponse> upload =
      client.UploadWeights(model, tensors, /*publish=*/true);
  if (!upload.ok()) return ServerError("Models.UploadWeights", upload.status());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBench(const RemoteContext& remote, const Args& args) {
  MX_ASSIGN_OR_RETURN(
      auto flags, Flags::Parse(args, FlagSpec{.values = WithLoadFlags({"phase", "format", "run"}),
                                              .switches = {"stream", "json"}}));
  MX_ASSIGN_OR_RETURN(auto phase, PhaseFlag(flags, v1::PHASE_ROLLOUT));
  MX_ASSIGN_OR_RETURN(auto format, WireFormatFlag(flags, "format"));
  MX_ASSIGN_OR_RETURN(LoadRun run, ParseLoadFlags(flags));
  const int64_t m = run.m, k = run.k, n = run.n;
  mxclient::LoadOptions load = run.load;
  load.interrupt = &interrupted;
  const bool stream = flags.Switch("stream");
  const bool json = flags.Switch("json");

  const std::string model = absl::StrCat("mxctl-bench-", getpid());
  auto request = std::make_shared<v1::LayerForwardRequest>();
  request->set_model(model);
  request->set_layer(kLayer);
  request->set_phase(phase);
  request->set_run(RunFlag(flags));
  request->set_format(format);
  const std::vector<float> input = RandomValues(static_cast<size_t>(m * k), kInputSeed);
  MX_ASSIGN_OR_RETURN(*request->mutable_input()->mutable_tensor(),
                      mxclient::MakeFloat32Tensor(input, {m, k}));

  const auto client = MakeClient(remote);
  bool registered = false;
  absl::Status setup = SetUpModel(*client, model, n, k, registered);
  absl::Status run_status;
  mxclient::LoadResult result;
  FirstError first_error;
  if (setup.ok()) {
    void (*previous_handler)(int) = std::signal(SIGINT, OnInterrupt);
    if (stream) {
      absl::StatusOr<std::unique_ptr<mxclient::ComputeStream>> session = client->OpenStream();
      if (!session.ok()) {
        run_status = ServerError("Compute.Stream", session.status());
      } else {
        v1::StreamRequest message;
        *message.mutable_forward() = *request;
        mxclient::ComputeStream& s = **session;
        result = mxclient::RunLoad(load, [&](std::function<void(bool)> done) {
          const absl::StatusOr<uint64_t> id =
              s.Submit(message, [&first_error, done](absl::StatusOr<v1::StreamResponse> r) {
                if (!r.ok()) first_error.Record(r.status());
                done(r.ok());
              });
          if (!id.ok()) {
            first_error.Record(id.status());
            done(false);
          }
        });
        const absl::Status closed = s.Close();
        if (!closed.ok()) run_status = ServerError("Compute.Stream", closed);
      }
    } else {
      std::shared_ptr<const v1::LayerForwardRequest> shared = request;
      result = mxclient::RunLoad(load, [&](std::function<void(bool)> done) {
        client->LayerForwardAsync(shared,
                                  [&first_error, done](absl::StatusOr<v1::LayerForwardResponse> r) {
                                    if (!r.ok()) first_error.Record(r.status());
                                    done(r.ok());
                                  });
      });
    }
    std::signal(SIGINT, previous_handler);
  }
  absl::Status deleted;
  if (registered) deleted = client->DeleteModel(model).status();
  MX_RETURN_IF_ERROR(setup);
  MX_RETURN_IF_ERROR(run_status);
  if (!deleted.ok()) return ServerError("Models.DeleteModel", deleted);

  const mxclient::LoadDescription description = {
      .target = stream ? "mxserved Compute.Stream(forward)" : "mxserved Compute.LayerForward",
      .m = m,
      .n = n,
      .k = k,
      .concurrency = load.concurrency,
      .format = mxclient::WireFormatName(format),
      .phase = mxserve::WireName(phase),
      .stream = stream,
  };
  if (json) {
    std::printf("%s\n", mxclient::LoadReportJson(result, description).c_str());
  } else {
    std::fputs(mxclient::LoadReportText(result, description).c_str(), stdout);
  }
  const absl::Status error = first_error.Get();
  if (result.errors > 0 && result.requests == 0) {
    return ServerError("Compute.LayerForward", error);
  }
  if (result.errors > 0) {
    std::fprintf(stderr, "mxctl: warning: %llu requests failed; the first with %s: %s\n",
                 static_cast<unsigned long long>(result.errors),
                 absl::StatusCodeToString(error.code()).c_str(),
                 std::string(error.message()).c_str());
  }
  return absl::OkStatus();
}

}  // namespace mxctl

// `mxctl forward`: Y = X·Wᵀ (+ bias) for one registered layer on the daemon
// (Compute.LayerForward), X and Y as raw float32 files; prints how it ran.
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/common_flags.h"
#include "clients/cpp/raw_io.h"
#include "clients/cpp/tensor.h"
#include "mx/status_macros.h"

namespace mxctl {

namespace v1 = ::mxserve::v1;

absl::Status RunForward(const RemoteContext& remote, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, {"model", "layer", "phase", "format", "input",
                                                      "m", "output", "min-weight-version", "run"}));
  MX_ASSIGN_OR_RETURN(auto model, flags.Require("model"));
  MX_ASSIGN_OR_RETURN(auto layer, flags.Require("layer"));
  MX_RETURN_IF_ERROR(flags.Require("phase").status());
  MX_ASSIGN_OR_RETURN(auto phase, PhaseFlag(flags, v1::PHASE_UNSPECIFIED));
  MX_ASSIGN_OR_RETURN(auto format, WireFormatFlag(flags, "format"));
  MX_ASSIGN_OR_RETURN(auto input_path, flags.Require("input"));
  MX_ASSIGN_OR_RETURN(auto output_path, flags.Require("output"));
  MX_ASSIGN_OR_RETURN(auto m, flags.RequireInt("m", 1, int64_t{1} << 24));
  MX_ASSIGN_OR_RETURN(auto min_version,
                      flags.IntOr("min-weight-version", 0, 0, std::numeric_limits<int64_t>::max()));
  MX_ASSIGN_OR_RETURN(auto x, ReadFloat32File(input_path, "--input"));
  if (x.empty() || x.size() % m != 0) {
    return UsageError(absl::StrCat("--input: '", input_path, "' holds ", x.size(),
                                   " floats, not M*K for M = ", m, " and a whole K >= 1"));
  }
  const int64_t k = static_cast<int64_t>(x.size()) / m;

  v1::LayerForwardRequest request;
  request.set_model(model);
  request.set_layer(layer);
  request.set_phase(phase);
  request.set_run(RunFlag(flags));
  request.set_format(format);
  request.set_min_weight_version(static_cast<uint64_t>(min_version));
  MX_ASSIGN_OR_RETURN(*request.mutable_input()->mutable_tensor(),
                      mxclient::MakeFloat32Tensor(x, {m, k}));
  const auto client = MakeClient(remote);
  absl::StatusOr<v1::LayerForwardResponse> response = client->LayerForward(request);
  if (!response.ok()) return ServerError("Compute.LayerForward", response.status());
  const v1::Tensor& output = response->output();
  if (output.shape_size() != 2 || output.shape(0) != m) {
    return ServerError("Compute.LayerForward",
                       absl::InternalError(absl::StrCat(
                           "output shape ",
                           mxclient::ShapeString(
                               {output.shape().data(), static_cast<size_t>(output.shape_size())}),
                           ", expected [", m, ", out_features]")));
  }
  absl::StatusOr<std::vector<float>> y = mxclient::TensorToFloats(output);
  if (!y.ok())
    return ServerError("Compute.LayerForward", absl::InternalError(y.status().message()));
  MX_RETURN_IF_ERROR(WriteFloat32File(output_path, *y));
  std::printf("output  [%lld, %lld] -> %s\n", static_cast<long long>(m),
              static_cast<long long>(output.shape(1)), output_path.c_str());
  std::fputs(FormatExecutionInfo(response->info()).c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace mxctl

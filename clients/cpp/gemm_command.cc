// `mxctl gemm`: C = A·B on raw float32 files, with the reference GEMM (the
// numerics contract) or, when --server is given, on the daemon (Compute.Gemm),
// whichever backend it runs (`mxserved --backend hls-sim` for the FPGA kernel's
// C++). Both write the same C: every backend is held to the reference's bits.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "clients/cpp/cli_status.h"
#include "clients/cpp/commands.h"
#include "clients/cpp/common_flags.h"
#include "clients/cpp/raw_io.h"
#include "clients/cpp/tensor.h"
#include "clients/cpp/wire_names.h"
#include "mx/reference_gemm.h"
#include "mx/status_macros.h"
#include "proto/convert/formats.h"

namespace mxctl {
namespace {

namespace v1 = ::mxserve::v1;

struct GemmInputs {
  mx::Format format_a;
  mx::Format format_b;
  mx::QuantizeOptions options;
  v1::Phase phase;
  std::string run;
  int64_t m, k, n;
  std::vector<float> a, b;
  std::string output_path;
};

absl::StatusOr<GemmInputs> ReadInputs(const Args& args) {
  MX_ASSIGN_OR_RETURN(
      auto flags, Flags::Parse(args, {"format", "format-b", "rounding", "seed", "scale-rule", "a", "b", "m",
                                      "k", "n", "output", "phase", "run"}));
  GemmInputs in;
  MX_ASSIGN_OR_RETURN(in.format_a, FormatFlag(flags, "format"));
  in.format_b = in.format_a;
  if (flags.Has("format-b")) {
    MX_ASSIGN_OR_RETURN(in.format_b, FormatFlag(flags, "format-b"));
  }
  MX_ASSIGN_OR_RETURN(in.options, QuantizeOptionsFromFlags(flags));
  // Accepted locally too (and ignored), so one command line works both ways.
  MX_ASSIGN_OR_RETURN(in.phase, PhaseFlag(flags, v1::PHASE_ROLLOUT));
  in.run = RunFlag(flags);
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  MX_ASSIGN_OR_RETURN(in.m, flags.RequireInt("m", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(in.k, flags.RequireInt("k", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(in.n, flags.RequireInt("n", 1, kMaxDim));
  MX_ASSIGN_OR_RETURN(auto a_path, flags.Require("a"));
  MX_ASSIGN_OR_RETURN(auto b_path, flags.Require("b"));
  MX_ASSIGN_OR_RETURN(in.output_path, flags.Require("output"));
  MX_ASSIGN_OR_RETURN(in.a, ReadFloat32File(a_path, "--a"));
  MX_ASSIGN_OR_RETURN(in.b, ReadFloat32File(b_path, "--b"));
  if (static_cast<int64_t>(in.a.size()) != in.m * in.k) {
    return UsageError(absl::StrCat("--a: '", a_path, "' holds ", in.a.size(),
                                   " floats, expected M*K = ", in.m, "*", in.k, " = ",
                                   in.m * in.k));
  }
  if (static_cast<int64_t>(in.b.size()) != in.k * in.n) {
    return UsageError(absl::StrCat("--b: '", b_path, "' holds ", in.b.size(),
                                   " floats, expected K*N = ", in.k, "*", in.n, " = ",
                                   in.k * in.n));
  }
  return in;
}

absl::Status RemoteGemm(const RemoteContext& remote, const GemmInputs& in) {
  v1::GemmRequest request;
  request.set_phase(in.phase);
  request.set_run(in.run);
  request.set_format(mxserve::ToProto(in.format_a));
  request.set_format_b(mxserve::ToProto(in.format_b));
  request.set_rounding(mxserve::ToProto(in.options.rounding));
  if (in.options.rounding == mx::Rounding::kStochastic) request.set_seed(in.options.seed);
  request.set_scale_rule(mxserve::ToProto(in.options.scale_rule));
  MX_ASSIGN_OR_RETURN(*request.mutable_a()->mutable_tensor(),
                      mxclient::MakeFloat32Tensor(in.a, {in.m, in.k}));
  MX_ASSIGN_OR_RETURN(*request.mutable_b()->mutable_tensor(),
                      mxclient::MakeFloat32Tensor(in.b, {in.k, in.n}));
  const auto client = MakeClient(remote);
  absl::StatusOr<v1::GemmResponse> response = client->Gemm(request);
  if (!response.ok()) return ServerError("Compute.Gemm", response.status());
  absl::StatusOr<std::vector<float>> c = mxclient::TensorToFloats(response->c(), {in.m, in.n});
  if (!c.ok()) return ServerError("Compute.Gemm", absl::InternalError(c.status().message()));
  MX_RETURN_IF_ERROR(WriteFloat32File(in.output_path, *c));
  std::fputs(FormatExecutionInfo(response->info()).c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGemm(const RemoteContext& remote, const Args& args) {
  MX_ASSIGN_OR_RETURN(auto in, ReadInputs(args));
  if (remote.server_given) return RemoteGemm(remote, in);
  MX_ASSIGN_OR_RETURN(auto c, mx::ReferenceGemm(in.a, in.format_a, in.b, in.format_b, in.m, in.k,
                                                in.n, in.options));
  return WriteFloat32File(in.output_path, c);
}

}  // namespace mxctl

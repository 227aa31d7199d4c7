// mxctl's subcommands, one entry point each. `args` are the words after the
// subcommand (with --server already taken out). A failed RPC comes back as a
// ServerError (exit 1), anything else as a usage or input error (exit 2); see
// cli_status.h.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/cpp/flags.h"
#include "clients/cpp/remote.h"
#include "mxserve/v1/policies.pb.h"

namespace mxctl {

using Args = std::vector<std::string>;

// Local.
absl::Status RunQuantize(const Args& args);
// On the daemon when --server was given, with the reference GEMM otherwise.
absl::Status RunGemm(const RemoteContext& remote, const Args& args);

// Remote.
// Returns the exit status: 0 only when the daemon reports SERVING.
absl::StatusOr<int> RunHealth(const RemoteContext& remote, const Args& args);
absl::Status RunModels(const RemoteContext& remote, const Args& args);
absl::Status RunPolicy(const RemoteContext& remote, const Args& args);
// Their subcommands, also checked by `mxctl models|policy VERB --help`.
extern const Subcommands kModelsSubcommands;
extern const Subcommands kPolicySubcommands;
// The phase × layer → format table of ResolvePolicy or GeneratePolicy entries,
// formatted for printing; `show_rules` adds "(rule N)" where a rule chose.
std::string PhaseLayerTable(
    const google::protobuf::RepeatedPtrField<mxserve::v1::ResolvedFormat>& entries,
    bool show_rules);
// `policy generate`, from RunPolicy.
absl::Status RunPolicyGenerate(mxclient::Client& client, const Args& args);
absl::Status RunProfile(const RemoteContext& remote, const Args& args);
absl::Status RunEnergy(const RemoteContext& remote, const Args& args);
absl::Status RunForward(const RemoteContext& remote, const Args& args);
absl::Status RunBench(const RemoteContext& remote, const Args& args);

}  // namespace mxctl

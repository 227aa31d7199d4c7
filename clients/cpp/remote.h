// What every remote mxctl subcommand shares: where the daemon is (--server, before
// or after the subcommand), the per-call timeout, and how an ExecutionInfo prints.
#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "clients/cpp/client.h"
#include "mxserve/v1/common.pb.h"

namespace mxctl {

inline constexpr char kDefaultServer[] = "127.0.0.1:50051";

struct RemoteContext {
  std::string server = kDefaultServer;
  bool server_given = false;                   // --server was on the command line
  absl::Duration timeout = absl::Seconds(60);  // --timeout, per RPC
};

std::unique_ptr<mxclient::Client> MakeClient(const RemoteContext& context);

// "format  MXFP4_E2M1 (weights MXFP4_E2M1)", "backend cpu", … one per line.
std::string FormatExecutionInfo(const mxserve::v1::ExecutionInfo& info);

// "1.5 MiB", "312 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace mxctl

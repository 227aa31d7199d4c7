// Who may call what: the caller's principal and role (from the --auth-tokens
// file, by bearer token or mTLS certificate), the one table of the role each
// RPC needs, ownership of models and policies, and the per-principal quotas.
//
// Every RPC passes Access::Admit when its CallRecord is made (call.h), before
// any of its messages is parsed; the handlers of RPCs that name a model or a
// policy then call CheckOwner. Without --auth-tokens every caller is
// "anonymous" with role admin, as before the file existed. gRPC's health
// service and reflection do not pass here: they stay open.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "server/base/auth_tokens.h"
#include "server/base/mutex.h"
#include "server/telemetry/metrics.h"

namespace mxserve {

// What an RPC names that has an owner.
enum class Owned { kNothing, kModel, kPolicy };

struct AccessRule {
  Role role;  // the least role that may call it
  // Below admin, the caller must own this (the model or policy the request
  // names; PutPolicy: only when it replaces one).
  Owned owned;
};

// The table: the rule of every RPC. server/README.md ("Principals and roles")
// carries the same table; tests/server/rpc/access_test.cc checks they agree.
AccessRule RuleOf(Rpc rpc);

// The table as the README writes it: "minimum role" and "below admin" columns.
std::string OwnedText(Owned owned);

struct Quotas {
  uint64_t weight_bytes = 0;  // --quota-weight-bytes; 0: unlimited
  int64_t inflight = 0;       // --quota-inflight
  int64_t models = 0;         // --quota-models
};

class Access {
 public:
  // `tokens`: none for a daemon without --auth-tokens.
  Access(std::optional<AuthTokens> tokens, Quotas quotas)
      : tokens_(std::move(tokens)), quotas_(quotas) {}

  const Quotas& quotas() const { return quotas_; }

  // The caller of `context`, allowed `rpc` by its role: UNAUTHENTICATED without
  // (known) credentials, PERMISSION_DENIED naming the role needed.
  absl::StatusOr<Principal> Admit(Rpc rpc, const grpc::ServerContextBase& context) const;

  // Below admin, for an RPC whose rule names an owned thing: PERMISSION_DENIED
  // unless `who` is `owner`. `what` names it: "model 'm'", "policy 'p'".
  absl::Status CheckOwner(Rpc rpc, const Principal& who, absl::string_view owner,
                          absl::string_view what) const;

  // --quota-inflight: counts a call of `who` from admission until EndCall;
  // RESOURCE_EXHAUSTED (counting nothing) when `who` already has the limit.
  absl::Status BeginCall(const Principal& who) const;
  void EndCall(const Principal& who) const;

 private:
  std::optional<AuthTokens> tokens_;
  Quotas quotas_;
  mutable Mutex mu_;
  mutable std::map<std::string, int64_t, std::less<>> inflight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve

#include "server/policies_service.h"

#include "absl/strings/str_cat.h"
#include "mx/status_macros.h"
#include "server/log.h"
#include "server/wire.h"

namespace mxserve {
namespace {

void FillPolicyInfo(const StoredPolicy& stored, v1::PolicyInfo* info) {
  info->set_name(stored.policy->name);
  info->set_json(PolicyToJson(*stored.policy));
  info->set_builtin(stored.builtin);
}

}  // namespace

grpc::ServerUnaryReactor* PoliciesService::Answer(grpc::CallbackServerContext* context, Rpc rpc,
                                                  const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  core_.metrics->RecordStatus(rpc, status.code());
  reactor->Finish(ToGrpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* PoliciesService::PutPolicy(grpc::CallbackServerContext* context,
                                                     const v1::PutPolicyRequest* request,
                                                     v1::PolicyInfo* response) {
  absl::StatusOr<StoredPolicy> stored = core_.policies->Put(request->json());
  if (stored.ok()) {
    FillPolicyInfo(*stored, response);
    Log(LogLevel::kInfo, "policy_put", {{"policy", stored->policy->name}});
  }
  return Answer(context, Rpc::kPutPolicy, stored.status());
}

grpc::ServerUnaryReactor* PoliciesService::GetPolicy(grpc::CallbackServerContext* context,
                                                     const v1::GetPolicyRequest* request,
                                                     v1::PolicyInfo* response) {
  absl::StatusOr<StoredPolicy> stored = core_.policies->Get(request->name());
  if (stored.ok()) FillPolicyInfo(*stored, response);
  return Answer(context, Rpc::kGetPolicy, stored.status());
}

grpc::ServerUnaryReactor* PoliciesService::ListPolicies(grpc::CallbackServerContext* context,
                                                        const v1::ListPoliciesRequest*,
                                                        v1::ListPoliciesResponse* response) {
  for (const StoredPolicy& stored : core_.policies->List()) {
    FillPolicyInfo(stored, response->add_policies());
  }
  return Answer(context, Rpc::kListPolicies, absl::OkStatus());
}

grpc::ServerUnaryReactor* PoliciesService::DeletePolicy(grpc::CallbackServerContext* context,
                                                        const v1::DeletePolicyRequest* request,
                                                        v1::DeletePolicyResponse*) {
  absl::Status status = core_.policies->Delete(request->name(), [this](absl::string_view name) {
    return name == core_.default_policy || core_.registry->PolicyInUse(name);
  });
  if (status.ok()) Log(LogLevel::kInfo, "policy_deleted", {{"policy", request->name()}});
  return Answer(context, Rpc::kDeletePolicy, status);
}

grpc::ServerUnaryReactor* PoliciesService::SetActivePolicy(
    grpc::CallbackServerContext* context, const v1::SetActivePolicyRequest* request,
    v1::SetActivePolicyResponse* response) {
  absl::Status status = core_.policies->Get(request->policy(), "policy").status();
  if (status.ok()) {
    absl::StatusOr<std::string> previous =
        core_.registry->SetPolicy(request->model(), request->policy());
    status = previous.status();
    if (previous.ok()) {
      response->set_previous_policy(*previous);
      Log(LogLevel::kInfo, "policy_activated",
          {{"model", request->model()}, {"policy", request->policy()}, {"previous", *previous}});
    }
  }
  return Answer(context, Rpc::kSetActivePolicy, status);
}

grpc::ServerUnaryReactor* PoliciesService::ResolvePolicy(grpc::CallbackServerContext* context,
                                                         const v1::ResolvePolicyRequest* request,
                                                         v1::ResolvePolicyResponse* response) {
  auto resolve = [&]() -> absl::Status {
    MX_ASSIGN_OR_RETURN(ModelSummary model, core_.registry->Describe(request->model()));
    const std::string name = request->policy().empty() ? model.policy : request->policy();
    MX_ASSIGN_OR_RETURN(StoredPolicy stored, core_.policies->Get(name, "policy"));
    response->set_policy(name);
    for (Phase phase : kAllPhases) {
      for (const auto& layer : model.layers) {
        const ResolvedFormat resolved =
            Resolve(*stored.policy, phase, layer.spec.name, layer.sensitive);
        v1::ResolvedFormat* entry = response->add_entries();
        entry->set_phase(ToProto(phase));
        entry->set_layer(layer.spec.name);
        entry->set_format(ToProto(resolved.format));
        entry->set_rule(resolved.rule);
      }
    }
    return absl::OkStatus();
  };
  return Answer(context, Rpc::kResolvePolicy, resolve());
}

}  // namespace mxserve

#include "server/rpc/policies_service.h"

#include "absl/strings/str_cat.h"
#include "mx/status_macros.h"
#include "server/compute/wire.h"
#include "server/rpc/call.h"
#include "server/telemetry/log.h"

namespace mxserve {
namespace {

void FillPolicyInfo(const StoredPolicy& stored, v1::PolicyInfo* info) {
  info->set_name(stored.policy->name);
  info->set_json(PolicyToJson(*stored.policy));
  info->set_builtin(stored.builtin);
  info->set_owner(stored.owner);
}

}  // namespace

grpc::ServerUnaryReactor* PoliciesService::PutPolicy(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return ServeNow<v1::PutPolicyRequest, v1::PolicyInfo>(
      core_, Rpc::kPutPolicy, context, request, response,
      [this](const auto& r, auto* out, const CallRecord& record) { return Put(r, out, record); });
}

grpc::ServerUnaryReactor* PoliciesService::GetPolicy(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return ServeNow<v1::GetPolicyRequest, v1::PolicyInfo>(
      core_, Rpc::kGetPolicy, context, request, response,
      [this](const auto& r, auto* out) { return Get(r, out); });
}

grpc::ServerUnaryReactor* PoliciesService::ListPolicies(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return ServeNow<v1::ListPoliciesRequest, v1::ListPoliciesResponse>(
      core_, Rpc::kListPolicies, context, request, response,
      [this](const auto&, auto* out) { return List(out); });
}

grpc::ServerUnaryReactor* PoliciesService::DeletePolicy(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return ServeNow<v1::DeletePolicyRequest, v1::DeletePolicyResponse>(
      core_, Rpc::kDeletePolicy, context, request, response,
      [this](const auto& r, auto* out, const CallRecord& record) {
        return Delete(r, out, record);
      });
}

grpc::ServerUnaryReactor* PoliciesService::SetActivePolicy(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return ServeNow<v1::SetActivePolicyRequest, v1::SetActivePolicyResponse>(
      core_, Rpc::kSetActivePolicy, context, request, response,
      [this](const auto& r, auto* out, const CallRecord& record) {
        return SetActive(r, out, record);
      });
}

grpc::ServerUnaryReactor* PoliciesService::ResolvePolicy(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeNow<v1::ResolvePolicyRequest, v1::ResolvePolicyResponse>(
      core_, Rpc::kResolvePolicy, context, request, response,
      [this](const auto& r, auto* out) { return Resolve(r, out); });
}

absl::Status PoliciesService::Put(const v1::PutPolicyRequest& request, v1::PolicyInfo* response,
                                  const CallRecord& record) {
  MX_ASSIGN_OR_RETURN(StoredPolicy stored,
                      core_.policies->Put(request.json(), record.principal().name,
                                          [&](const StoredPolicy& existing) {
                                            return record.MayChangePolicy(existing);
                                          }));
  FillPolicyInfo(stored, response);
  Log(LogLevel::kInfo, "policy_put",
      {{"policy", stored.policy->name}, {"owner", stored.owner}, {"by", record.principal().name}});
  return absl::OkStatus();
}

absl::Status PoliciesService::Get(const v1::GetPolicyRequest& request, v1::PolicyInfo* response) {
  MX_ASSIGN_OR_RETURN(StoredPolicy stored, core_.policies->Get(request.name()));
  FillPolicyInfo(stored, response);
  return absl::OkStatus();
}

absl::Status PoliciesService::List(v1::ListPoliciesResponse* response) {
  for (const StoredPolicy& stored : core_.policies->List()) {
    FillPolicyInfo(stored, response->add_policies());
  }
  return absl::OkStatus();
}

absl::Status PoliciesService::Delete(const v1::DeletePolicyRequest& request,
                                     v1::DeletePolicyResponse* response,
                                     const CallRecord& record) {
  // Another principal that activated an owned policy does not pin it: its
  // models go back to --default-policy (issue 32). The owner's own models, and
  // any model for a policy without an owner, still keep it from going.
  std::vector<std::string> reset;
  MX_RETURN_IF_ERROR(core_.policies->Delete(
      request.name(),
      [&](const StoredPolicy& policy) {
        return policy.policy->name == core_.default_policy ||
               !core_.registry->ReleasePolicy(policy.policy->name, policy.owner,
                                              core_.default_policy, reset);
      },
      [&](const StoredPolicy& existing) { return record.MayChangePolicy(existing); }));
  for (const std::string& model : reset) {
    response->add_models_reset(model);
    Log(LogLevel::kInfo, "policy_activated",
        {{"model", model}, {"policy", core_.default_policy}, {"previous", request.name()},
         {"reason", "policy_deleted"}});
  }
  Log(LogLevel::kInfo, "policy_deleted",
      {{"policy", request.name()}, {"by", record.principal().name},
       {"models_reset", absl::StrCat(reset.size())}});
  return absl::OkStatus();
}

absl::Status PoliciesService::SetActive(const v1::SetActivePolicyRequest& request,
                                        v1::SetActivePolicyResponse* response,
                                        const CallRecord& record) {
  MX_RETURN_IF_ERROR(record.CheckModelOwner(request.model()));
  MX_ASSIGN_OR_RETURN(StoredPolicy stored, core_.policies->Get(request.policy(), "policy"));
  const std::string& policy = stored.policy->name;  // the full name of a short one
  MX_ASSIGN_OR_RETURN(std::string previous, core_.registry->SetPolicy(request.model(), policy));
  response->set_previous_policy(previous);
  Log(LogLevel::kInfo, "policy_activated",
      {{"model", request.model()}, {"policy", policy}, {"previous", previous}});
  return absl::OkStatus();
}

absl::Status PoliciesService::Resolve(const v1::ResolvePolicyRequest& request,
                                      v1::ResolvePolicyResponse* response) {
  MX_ASSIGN_OR_RETURN(ModelSummary model, core_.registry->Describe(request.model()));
  const std::string name = request.policy().empty() ? model.policy : request.policy();
  MX_ASSIGN_OR_RETURN(StoredPolicy stored, core_.policies->Get(name, "policy"));
  response->set_policy(stored.policy->name);
  for (Phase phase : kAllPhases) {
    for (const auto& layer : model.layers) {
      const ResolvedFormat resolved =
          ::mxserve::Resolve(*stored.policy, phase, layer.spec.name, layer.tolerance);
      v1::ResolvedFormat* entry = response->add_entries();
      entry->set_phase(ToProto(phase));
      entry->set_layer(layer.spec.name);
      entry->set_format(ToProto(resolved.format));
      entry->set_rule(resolved.rule);
      entry->set_scale_rule(ToProto(stored.policy->scale_rules[static_cast<size_t>(phase)]));
      entry->set_rounding(ToProto(stored.policy->roundings[static_cast<size_t>(phase)]));
    }
  }
  return absl::OkStatus();
}

}  // namespace mxserve

// mxserve.v1.Policies: the policy catalogue and each model's active policy.
#pragma once

#include "mxserve/v1/policies.grpc.pb.h"
#include "server/core.h"

namespace mxserve {

class PoliciesService final : public v1::Policies::CallbackService {
 public:
  explicit PoliciesService(const Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* PutPolicy(grpc::CallbackServerContext* context,
                                      const v1::PutPolicyRequest* request,
                                      v1::PolicyInfo* response) override;
  grpc::ServerUnaryReactor* GetPolicy(grpc::CallbackServerContext* context,
                                      const v1::GetPolicyRequest* request,
                                      v1::PolicyInfo* response) override;
  grpc::ServerUnaryReactor* ListPolicies(grpc::CallbackServerContext* context,
                                         const v1::ListPoliciesRequest* request,
                                         v1::ListPoliciesResponse* response) override;
  grpc::ServerUnaryReactor* DeletePolicy(grpc::CallbackServerContext* context,
                                         const v1::DeletePolicyRequest* request,
                                         v1::DeletePolicyResponse* response) override;
  grpc::ServerUnaryReactor* SetActivePolicy(grpc::CallbackServerContext* context,
                                            const v1::SetActivePolicyRequest* request,
                                            v1::SetActivePolicyResponse* response) override;
  grpc::ServerUnaryReactor* ResolvePolicy(grpc::CallbackServerContext* context,
                                          const v1::ResolvePolicyRequest* request,
                                          v1::ResolvePolicyResponse* response) override;

 private:
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, Rpc rpc,
                                   const absl::Status& status);
  const Core& core_;
};

}  // namespace mxserve

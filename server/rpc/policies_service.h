// mxserve.v1.Policies: the policy catalogue and each model's active policy.
#pragma once

#include "mxserve/v1/policies.grpc.pb.h"
#include "server/rpc/core.h"

namespace mxserve {

class CallRecord;  // call.h

using RawPoliciesService = v1::Policies::WithRawCallbackMethod_PutPolicy<
    v1::Policies::WithRawCallbackMethod_GetPolicy<v1::Policies::WithRawCallbackMethod_ListPolicies<
        v1::Policies::WithRawCallbackMethod_DeletePolicy<
            v1::Policies::WithRawCallbackMethod_SetActivePolicy<
                v1::Policies::WithRawCallbackMethod_ResolvePolicy<v1::Policies::Service>>>>>>;

// Messages are taken raw and parsed in call.h; every call is answered at once.
class PoliciesService final : public RawPoliciesService {
 public:
  explicit PoliciesService(const Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* PutPolicy(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetPolicy(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListPolicies(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeletePolicy(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetActivePolicy(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ResolvePolicy(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

 private:
  absl::Status Put(const v1::PutPolicyRequest& request, v1::PolicyInfo* response,
                   const CallRecord& record);
  absl::Status Get(const v1::GetPolicyRequest& request, v1::PolicyInfo* response);
  absl::Status List(v1::ListPoliciesResponse* response);
  absl::Status Delete(const v1::DeletePolicyRequest& request, v1::DeletePolicyResponse* response,
                      const CallRecord& record);
  absl::Status SetActive(const v1::SetActivePolicyRequest& request,
                         v1::SetActivePolicyResponse* response, const CallRecord& record);
  absl::Status Resolve(const v1::ResolvePolicyRequest& request,
                       v1::ResolvePolicyResponse* response);

  const Core& core_;
};

}  // namespace mxserve

// mxserve.v1.Compute on gRPC's callback API. Handlers validate and submit work to
// the scheduler and return at once; a worker answers the call when it is done.
#pragma once

#include "mxserve/v1/compute.grpc.pb.h"
#include "server/core.h"

namespace mxserve {

class ComputeService final : public v1::Compute::CallbackService {
 public:
  explicit ComputeService(const Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* Gemm(grpc::CallbackServerContext* context,
                                 const v1::GemmRequest* request,
                                 v1::GemmResponse* response) override;
  grpc::ServerUnaryReactor* LayerForward(grpc::CallbackServerContext* context,
                                         const v1::LayerForwardRequest* request,
                                         v1::LayerForwardResponse* response) override;
  grpc::ServerUnaryReactor* LayerBackward(grpc::CallbackServerContext* context,
                                          const v1::LayerBackwardRequest* request,
                                          v1::LayerBackwardResponse* response) override;
  grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* Stream(
      grpc::CallbackServerContext* context) override;

 private:
  const Core& core_;
};

}  // namespace mxserve

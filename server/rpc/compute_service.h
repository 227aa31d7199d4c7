// mxserve.v1.Compute on gRPC's callback API, its messages taken raw (call.h).
// Handlers validate and submit work to the scheduler and return at once; a
// worker answers the call when it is done.
#pragma once

#include "mxserve/v1/compute.grpc.pb.h"
#include "server/rpc/core.h"

namespace mxserve {

using RawComputeService =
    v1::Compute::WithRawCallbackMethod_Gemm<v1::Compute::WithRawCallbackMethod_LayerForward<
        v1::Compute::WithRawCallbackMethod_LayerBackward<v1::Compute::WithRawCallbackMethod_Stream<
            v1::Compute::WithRawCallbackMethod_LayersForward<v1::Compute::Service>>>>>;

class ComputeService final : public RawComputeService {
 public:
  explicit ComputeService(const Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* Gemm(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LayerForward(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LayerBackward(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LayersForward(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* context) override;

 private:
  const Core& core_;
};

}  // namespace mxserve

// mxserve.v1.Models: registering models, staging and publishing weights.
#pragma once

#include "mxserve/v1/models.grpc.pb.h"
#include "server/rpc/core.h"

namespace mxserve {

using RawModelsService =
    v1::Models::WithRawCallbackMethod_RegisterModel<v1::Models::WithRawCallbackMethod_UploadWeights<
        v1::Models::WithRawCallbackMethod_LoadSafetensors<
            v1::Models::WithRawCallbackMethod_PublishVersion<
                v1::Models::WithRawCallbackMethod_ListModels<
                    v1::Models::WithRawCallbackMethod_DescribeModel<
                        v1::Models::WithRawCallbackMethod_DeleteModel<v1::Models::Service>>>>>>>;

// Messages are taken raw and parsed in call.h.
class ModelsService final : public RawModelsService {
 public:
  explicit ModelsService(const Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadWeights(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LoadSafetensors(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PublishVersion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DescribeModel(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteModel(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

 private:
  // LoadSafetensors' work, on a worker: stages (and maybe publishes) the file's tensors.
  absl::Status Load(const v1::LoadSafetensorsRequest& request, v1::UploadWeightsResponse* response);

  const Core& core_;
};

// Publishes the staged weights of `model` as a new version, then warms it.
void PublishAndWarm(const Core& core, const std::string& model,
                    std::function<void(absl::StatusOr<uint64_t>)> done);

// On a worker, quantizes every layer that changed in version `published` into
// the formats its active policy uses; then calls `done(published)`. Shared by
// PublishVersion and the publish flag of uploads and safetensors loads.
void Warm(const Core& core, const std::string& model, uint64_t published,
          std::function<void(uint64_t)> done);

}  // namespace mxserve

// mxserve.v1.Models: registering models, staging and publishing weights.
#pragma once

#include "mxserve/v1/models.grpc.pb.h"
#include "server/core.h"

namespace mxserve {

class ModelsService final : public v1::Models::CallbackService {
 public:
  explicit ModelsService(const Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* context,
                                          const v1::RegisterModelRequest* request,
                                          v1::ModelInfo* response) override;
  grpc::ServerReadReactor<v1::WeightChunk>* UploadWeights(
      grpc::CallbackServerContext* context, v1::UploadWeightsResponse* response) override;
  grpc::ServerUnaryReactor* LoadSafetensors(grpc::CallbackServerContext* context,
                                            const v1::LoadSafetensorsRequest* request,
                                            v1::UploadWeightsResponse* response) override;
  grpc::ServerUnaryReactor* PublishVersion(grpc::CallbackServerContext* context,
                                           const v1::PublishVersionRequest* request,
                                           v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeModel(grpc::CallbackServerContext* context,
                                          const v1::DescribeModelRequest* request,
                                          v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* DeleteModel(grpc::CallbackServerContext* context,
                                        const v1::DeleteModelRequest* request,
                                        v1::DeleteModelResponse* response) override;

 private:
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

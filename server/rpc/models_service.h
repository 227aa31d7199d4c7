// mxserve.v1.Models: registering models, staging and publishing weights.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "mx/format.h"
#include "mxserve/v1/models.grpc.pb.h"
#include "server/rpc/core.h"

namespace mxserve {

using RawModelsService = v1::Models::WithRawCallbackMethod_RegisterModel<
    v1::Models::WithRawCallbackMethod_UploadWeights<v1::Models::WithRawCallbackMethod_LoadSafetensors<
        v1::Models::WithRawCallbackMethod_PublishVersion<v1::Models::WithRawCallbackMethod_ListModels<
            v1::Models::WithRawCallbackMethod_DescribeModel<
                v1::Models::WithRawCallbackMethod_DeleteModel<
                    v1::Models::WithRawCallbackMethod_StepOptimizer<
                        v1::Models::WithRawCallbackMethod_DownloadWeights<
                            v1::Models::Service>>>>>>>>>;

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
  grpc::ServerUnaryReactor* StepOptimizer(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DownloadWeights(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;

 private:
  // LoadSafetensors' work, on a worker: stages (and maybe publishes) the file's tensors.
  absl::Status Load(const v1::LoadSafetensorsRequest& request, v1::UploadWeightsResponse* response);

  const Core& core_;
};

// What a publish warms (v1::WarmUp).
struct WarmUpSpec {
  enum class Copies { kPrevious, kNone, kFormats };
  Copies copies = Copies::kPrevious;
  std::vector<mx::Format> formats;  // kFormats
  bool background = false;          // answer before the warm-up
};
// INVALID_ARGUMENT naming `field` (e.g. "warm_up") for an unknown enum value,
// or COPIES_FORMATS without 1 to 16 specified formats.
absl::StatusOr<WarmUpSpec> ParseWarmUp(const v1::WarmUp& warm_up, absl::string_view field);

// Publishes the staged weights of `model` as a new version, then warms it.
void PublishAndWarm(const Core& core, const std::string& model, const WarmUpSpec& warm_up,
                    std::function<void(absl::StatusOr<uint64_t>)> done);

// On a worker, quantizes every layer that changed in version `published` into
// what `warm_up` asks for (by default the copies requests used of its previous
// version); calls `done(published)` when that is done, or at once with
// `warm_up.background` (or nothing to warm). Shared by PublishVersion,
// StepOptimizer and the publish flag of uploads and safetensors loads.
void Warm(const Core& core, std::string model, uint64_t published, WarmUpSpec warm_up,
          std::function<void(uint64_t)> done);

}  // namespace mxserve

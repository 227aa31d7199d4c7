// The compute requests as scheduler work: validation and format resolution happen
// here, on the calling (gRPC) thread, and are cheap; quantizing activations and
// the GEMM itself happen in WorkItem::Run on a worker thread.
//
// Each Prepare* either returns an item to submit or an error naming the request
// field. The item fills `response` and calls `done` exactly once.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "mxserve/v1/compute.pb.h"
#include "server/compute/context.h"

namespace mxserve {

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareGemm(const ComputeContext& core,
                                                      const v1::GemmRequest& request,
                                                      v1::GemmResponse* response, CallInfo call,
                                                      Done done);

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareForward(const ComputeContext& core,
                                                         const v1::LayerForwardRequest& request,
                                                         v1::LayerForwardResponse* response,
                                                         CallInfo call, Done done);

absl::StatusOr<std::unique_ptr<WorkItem>> PrepareBackward(const ComputeContext& core,
                                                          const v1::LayerBackwardRequest& request,
                                                          v1::LayerBackwardResponse* response,
                                                          CallInfo call, Done done);

// The format the model's active policy gives (phase, layer), or the explicit one.
absl::StatusOr<mx::Format> ResolveLayerFormat(const ComputeContext& core, const LayerView& view,
                                              Phase phase, v1::Format requested);

}  // namespace mxserve

// mxserve.v1.Profiles: sensitivity profiles from calibration streams, and the
// policies generated from them (server/profile/).
#pragma once

#include <atomic>

#include "mxserve/v1/profiles.grpc.pb.h"
#include "server/rpc/core.h"

namespace mxserve {

class CallRecord;  // call.h

using RawProfilesService = v1::Profiles::WithRawCallbackMethod_ProfileModel<
    v1::Profiles::WithRawCallbackMethod_GetProfile<v1::Profiles::WithRawCallbackMethod_ListProfiles<
        v1::Profiles::WithRawCallbackMethod_ExportProfile<
            v1::Profiles::WithRawCallbackMethod_DeleteProfile<
                v1::Profiles::WithRawCallbackMethod_GeneratePolicy<v1::Profiles::Service>>>>>>;

// Messages are taken raw and parsed in call.h. Profile batches and policy
// generation run on the profiler's queue; the rest is answered at once.
class ProfilesService final : public RawProfilesService {
 public:
  explicit ProfilesService(const Core& core) : core_(core) {}

  // Shutdown's first step for this service, in place of shutting the profiler
  // down at the signal: new ProfileModel streams and GeneratePolicy calls are
  // refused (UNAVAILABLE) from here, while streams already open keep sending
  // batches to the profiler and may complete within --grace-seconds, as uploads
  // may. The daemon shuts the profiler down once those calls ended or were
  // cancelled at the grace (their queued work then fails without running).
  void StopAccepting() { stopping_.store(true, std::memory_order_relaxed); }

  grpc::ServerReadReactor<grpc::ByteBuffer>* ProfileModel(grpc::CallbackServerContext* context,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetProfile(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListProfiles(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ExportProfile(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteProfile(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GeneratePolicy(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;

 private:
  absl::Status Generate(const v1::GeneratePolicyRequest& request,
                        v1::GeneratePolicyResponse* response, const CallRecord& record);

  const Core& core_;
  std::atomic<bool> stopping_{false};
};

}  // namespace mxserve

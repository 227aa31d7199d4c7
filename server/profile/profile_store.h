// The profiles the daemon keeps, per (model, weight version): in memory, at most
// kMaxProfilesPerModel versions per model (the oldest goes first), dropped with
// their model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/base/mutex.h"
#include "server/profile/profile.h"

namespace mxserve {

inline constexpr size_t kMaxProfilesPerModel = 8;

class ProfileStore {
 public:
  // Keeps `profile`, replacing one of the same (model, version).
  void Put(std::shared_ptr<const Profile> profile);
  // version 0: the model's newest. NOT_FOUND naming `field` ("model" or
  // "weight_version") and what there is.
  absl::StatusOr<std::shared_ptr<const Profile>> Get(absl::string_view model,
                                                     uint64_t version) const;
  // Every profile of `model` (empty: of every model), by model then version.
  std::vector<std::shared_ptr<const Profile>> List(absl::string_view model) const;
  // version 0: every profile of the model. Returns how many went; NOT_FOUND when
  // a version was named and is not kept.
  absl::StatusOr<uint32_t> Delete(absl::string_view model, uint64_t version);

 private:
  using Key = std::pair<std::string, uint64_t>;
  mutable Mutex mu_;
  std::map<Key, std::shared_ptr<const Profile>, std::less<>> profiles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve

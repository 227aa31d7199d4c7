#include "server/profile/profile_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/quote.h"

namespace mxserve {

void ProfileStore::Put(std::shared_ptr<const Profile> profile) {
  MutexLock lock(&mu_);
  const std::string model = profile->model;
  profiles_[Key(model, profile->weight_version)] = std::move(profile);
  auto first = profiles_.lower_bound(Key(model, 0));
  auto end = profiles_.upper_bound(Key(model, UINT64_MAX));
  size_t count = std::distance(first, end);
  while (count-- > kMaxProfilesPerModel) first = profiles_.erase(first);
}

absl::StatusOr<std::shared_ptr<const Profile>> ProfileStore::Get(absl::string_view model,
                                                                 uint64_t version) const {
  MutexLock lock(&mu_);
  const std::string name(model);
  auto first = profiles_.lower_bound(Key(name, 0));
  auto end = profiles_.upper_bound(Key(name, UINT64_MAX));
  if (first == end) {
    return absl::NotFoundError(absl::StrCat("model: no profile of model ", Quote(model),
                                            "; profile it first (ProfileModel)"));
  }
  if (version == 0) return std::prev(end)->second;
  auto it = profiles_.find(Key(name, version));
  if (it != profiles_.end()) return it->second;
  std::vector<uint64_t> kept;
  for (auto i = first; i != end; ++i) kept.push_back(i->first.second);
  return absl::NotFoundError(absl::StrCat("weight_version: model ", Quote(model),
                                          " has no profile of version ", version,
                                          "; profiled versions: ", absl::StrJoin(kept, ", ")));
}

std::vector<std::shared_ptr<const Profile>> ProfileStore::List(absl::string_view model) const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const Profile>> out;
  for (const auto& [key, profile] : profiles_) {
    if (model.empty() || key.first == model) out.push_back(profile);
  }
  return out;
}

absl::StatusOr<uint32_t> ProfileStore::Delete(absl::string_view model, uint64_t version) {
  MutexLock lock(&mu_);
  const std::string name(model);
  if (version != 0) {
    if (profiles_.erase(Key(name, version)) == 0) {
      return absl::NotFoundError(absl::StrCat("weight_version: model ", Quote(model),
                                              " has no profile of version ", version));
    }
    return 1;
  }
  auto first = profiles_.lower_bound(Key(name, 0));
  auto end = profiles_.upper_bound(Key(name, UINT64_MAX));
  const auto count = static_cast<uint32_t>(std::distance(first, end));
  profiles_.erase(first, end);
  return count;
}

}  // namespace mxserve

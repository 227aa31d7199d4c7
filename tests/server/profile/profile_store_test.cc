// The profile store: newest-first lookups, the per-model cap, deletion, and the
// errors that name what is kept.
#include "server/profile/profile_store.h"

#include <gtest/gtest.h>

#include <memory>

namespace mxserve {
namespace {

std::shared_ptr<const Profile> Made(const std::string& model, uint64_t version) {
  auto p = std::make_shared<Profile>();
  p->model = model;
  p->weight_version = version;
  return p;
}

TEST(ProfileStore, KeepsTheNewestVersionsPerModelAndDeletesThem) {
  ProfileStore store;
  for (uint64_t v = 1; v <= kMaxProfilesPerModel + 2; ++v) store.Put(Made("m", v));
  store.Put(Made("other", 3));
  std::vector<std::shared_ptr<const Profile>> kept = store.List("m");
  ASSERT_EQ(kept.size(), kMaxProfilesPerModel);
  EXPECT_EQ(kept.front()->weight_version, 3u);  // 1 and 2 went first
  EXPECT_EQ(kept.back()->weight_version, kMaxProfilesPerModel + 2);
  EXPECT_EQ(store.List("").size(), kMaxProfilesPerModel + 1);

  EXPECT_EQ((*store.Get("m", 0))->weight_version, kMaxProfilesPerModel + 2);  // newest
  EXPECT_EQ((*store.Get("m", 5))->weight_version, 5u);
  absl::StatusOr<std::shared_ptr<const Profile>> gone = store.Get("m", 1);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message(),
            "weight_version: model 'm' has no profile of version 1; profiled versions: 3, 4, 5, "
            "6, 7, 8, 9, 10");
  EXPECT_EQ(store.Get("none", 0).status().code(), absl::StatusCode::kNotFound);

  // Replacing a version keeps one profile of it.
  store.Put(Made("m", 5));
  EXPECT_EQ(store.List("m").size(), kMaxProfilesPerModel);

  EXPECT_EQ(*store.Delete("m", 4), 1u);
  EXPECT_EQ(store.Delete("m", 4).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store.Delete("m", 0), kMaxProfilesPerModel - 1);
  EXPECT_TRUE(store.List("m").empty());
  EXPECT_EQ(store.List("").size(), 1u);  // the other model's stays
}

}  // namespace
}  // namespace mxserve

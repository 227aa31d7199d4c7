// The policies the daemon knows: the built-in presets plus user policies, kept in
// memory and, when --policy-dir is set, persisted there as <name>.json (loaded at
// start, written on Put, removed on Delete).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/base/mutex.h"
#include "server/policy/policy.h"

namespace mxserve {

struct StoredPolicy {
  std::shared_ptr<const Policy> policy;
  bool builtin = false;
  // The principal that put it; "" for built-ins and policies loaded from the
  // policy directory (the files do not record one).
  std::string owner;
};

// Whether the caller may replace or delete `existing` (ownership, access.h):
// OK, or the refusal to answer with.
using MayChange = absl::FunctionRef<absl::Status(const StoredPolicy& existing)>;

class PolicyStore {
 public:
  // Loads every *.json in `dir` (empty: no persistence). A bad file fails the
  // start with its path and the parser's message.
  static absl::StatusOr<std::unique_ptr<PolicyStore>> Create(const std::string& dir);

  // INVALID_ARGUMENT for bad JSON; PERMISSION_DENIED-free: replacing a built-in is
  // FAILED_PRECONDITION. Returns the stored policy.
  // `owner` puts it; replacing one another principal put needs `may_change`.
  // A replaced policy keeps its owner (an admin's Put over alice's policy
  // leaves it alice's).
  absl::StatusOr<StoredPolicy> Put(absl::string_view json, const std::string& owner = "");
  absl::StatusOr<StoredPolicy> Put(absl::string_view json, const std::string& owner,
                                   MayChange may_change);
  // NOT_FOUND naming `field`.
  absl::StatusOr<StoredPolicy> Get(absl::string_view name, absl::string_view field = "name") const;
  std::vector<StoredPolicy> List() const;
  // FAILED_PRECONDITION for a built-in or while `in_use(policy)` says it cannot
  // go (a model that must keep it uses it); `in_use` runs under the store's
  // lock, just before the removal, so it may also release the policy's other
  // users. `may_change` (if given) decides first, for a user policy.
  using InUse = absl::FunctionRef<bool(const StoredPolicy& policy)>;
  absl::Status Delete(absl::string_view name, InUse in_use);
  absl::Status Delete(absl::string_view name, InUse in_use, MayChange may_change);

 private:
  explicit PolicyStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  mutable Mutex mu_;
  std::map<std::string, StoredPolicy, std::less<>> policies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mxserve

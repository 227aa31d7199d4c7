#include "server/policy/policy_store.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/quote.h"

namespace mxserve {
namespace {

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PolicyStore>> PolicyStore::Create(const std::string& dir) {
  std::unique_ptr<PolicyStore> store(new PolicyStore(dir));
  // Not shared yet, but locking costs nothing here and keeps the analysis exact.
  MutexLock lock(&store->mu_);
  for (const Policy& policy : BuiltinPolicies()) {
    store->policies_[policy.name] = {std::make_shared<const Policy>(policy), true, ""};
  }
  if (dir.empty()) return store;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--policy-dir: cannot create '", dir, "': ", error.message()));
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json")
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return text.status();
    absl::StatusOr<Policy> policy = ParsePolicyJson(*text);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": ", policy.status().message()));
    }
    if (CanonicalPolicyName(policy->name) != policy->name ||
        (store->policies_.contains(policy->name) && store->policies_[policy->name].builtin)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": '", policy->name, "' is a built-in policy name"));
    }
    const std::string name = policy->name;
    store->policies_[name] = {std::make_shared<const Policy>(*std::move(policy)), false, ""};
  }
  return store;
}

absl::StatusOr<StoredPolicy> PolicyStore::Put(absl::string_view json, const std::string& owner) {
  return Put(json, owner, [](const StoredPolicy&) { return absl::OkStatus(); });
}

absl::StatusOr<StoredPolicy> PolicyStore::Put(absl::string_view json, const std::string& owner,
                                              MayChange may_change) {
  absl::StatusOr<Policy> parsed = ParsePolicyJson(json);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("json: ", parsed.status().message()));
  }
  MutexLock lock(&mu_);
  if (auto it = policies_.find(parsed->name); it != policies_.end() && it->second.builtin) {
    return absl::FailedPreconditionError(absl::StrCat(
        "json: policy.name: '", parsed->name, "' is a built-in policy and cannot be replaced"));
  }
  if (const absl::string_view full = CanonicalPolicyName(parsed->name); full != parsed->name) {
    return absl::FailedPreconditionError(absl::StrCat("json: policy.name: '", parsed->name,
                                                      "' is the short name of the built-in '", full,
                                                      "' and cannot be replaced"));
  }
  std::string stored_owner = owner;
  if (auto it = policies_.find(parsed->name); it != policies_.end()) {
    if (absl::Status s = may_change(it->second); !s.ok()) return s;
    stored_owner = it->second.owner;  // replacing is not taking (issue 32)
  }
  if (!dir_.empty()) {
    const auto path = std::filesystem::path(dir_) / absl::StrCat(parsed->name, ".json");
    const auto temp = std::filesystem::path(dir_) / absl::StrCat(".", parsed->name, ".json.tmp");
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out << PolicyToJson(*parsed) << "\n";
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", temp.string()));
    }
    std::error_code error;
    std::filesystem::rename(temp, path, error);
    if (error) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  }
  const std::string name = parsed->name;
  StoredPolicy stored{std::make_shared<const Policy>(*std::move(parsed)), false, stored_owner};
  policies_[name] = stored;
  return stored;
}

absl::StatusOr<StoredPolicy> PolicyStore::Get(absl::string_view name,
                                              absl::string_view field) const {
  MutexLock lock(&mu_);
  auto it = policies_.find(CanonicalPolicyName(name));
  if (it == policies_.end()) {
    // Only the built-ins are named: other users' policy names are theirs.
    std::vector<std::string> builtins;
    for (const Policy& policy : BuiltinPolicies()) builtins.push_back(policy.name);
    return absl::NotFoundError(absl::StrCat(field, ": no policy named ", Quote(name),
                                            "; built in: ", absl::StrJoin(builtins, ", "),
                                            " (ListPolicies lists every policy)"));
  }
  return it->second;
}

std::vector<StoredPolicy> PolicyStore::List() const {
  MutexLock lock(&mu_);
  std::vector<StoredPolicy> out;
  for (const auto& [name, stored] : policies_) out.push_back(stored);
  return out;
}

absl::Status PolicyStore::Delete(absl::string_view name, InUse in_use) {
  return Delete(name, in_use, [](const StoredPolicy&) { return absl::OkStatus(); });
}

absl::Status PolicyStore::Delete(absl::string_view name, InUse in_use, MayChange may_change) {
  MutexLock lock(&mu_);
  auto it = policies_.find(CanonicalPolicyName(name));
  if (it == policies_.end()) {
    return absl::NotFoundError(absl::StrCat("name: no policy named ", Quote(name)));
  }
  if (it->second.builtin) {
    return absl::FailedPreconditionError(
        absl::StrCat("name: ", Quote(name), " is a built-in policy and cannot be deleted"));
  }
  if (absl::Status s = may_change(it->second); !s.ok()) return s;
  if (in_use(it->second)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "name: policy ", Quote(name),
        it->second.owner.empty()
            ? " is in use (a model's active policy, or the daemon's --default-policy)"
            : " is in use (the active policy of one of its owner's models, or the daemon's "
              "--default-policy)"));
  }
  if (!dir_.empty()) {
    std::error_code error;
    std::filesystem::remove(std::filesystem::path(dir_) / absl::StrCat(name, ".json"), error);
  }
  policies_.erase(it);
  return absl::OkStatus();
}

}  // namespace mxserve

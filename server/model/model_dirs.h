// The directories Models.LoadSafetensors may read from: --model-dir, repeatable.
//
// A client names a file on the daemon's host; without this, any file the daemon
// can read could be loaded into the caller's model and read back through
// forward passes. So a path is accepted only inside an operator-given directory,
// and the check holds against "..", symbolic links and races: the file is opened
// first and the path of what was opened (/proc/self/fd) is what is checked.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/base/unique_fd.h"

namespace mxserve {

class ModelDirs {
 public:
  // Resolves each directory (symbolic links, ".."); INVALID_ARGUMENT naming
  // --model-dir for one that is not an existing directory.
  static absl::StatusOr<ModelDirs> Create(const std::vector<std::string>& dirs);

  bool empty() const { return dirs_.empty(); }
  const std::vector<std::filesystem::path>& dirs() const { return dirs_; }

  // Opens `path` read-only. An absolute path must lie inside one of the
  // directories; a relative one is looked up in each, in order. Errors name
  // `field`:
  //   FAILED_PRECONDITION  no --model-dir was given: file loading is off
  //   PERMISSION_DENIED    outside every directory, decided from the path alone
  //                        (so the answer says nothing about files there), or a
  //                        symbolic link inside that leads out
  //   NOT_FOUND            no such file inside
  //   INVALID_ARGUMENT     not a regular file
  absl::StatusOr<UniqueFd> Open(absl::string_view path, absl::string_view field) const;

 private:
  std::vector<std::filesystem::path> dirs_;     // canonical
  std::vector<std::filesystem::path> spelled_;  // as given, made absolute
};

}  // namespace mxserve

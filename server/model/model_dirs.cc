#include "server/model/model_dirs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/quote.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

// True when `path` (lexically normal, absolute) is `dir` or below it.
bool Inside(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

// The path of the file an open descriptor refers to.
fs::path OpenedPath(int fd) {
  std::error_code error;
  fs::path path = fs::read_symlink(absl::StrCat("/proc/self/fd/", fd), error);
  return error ? fs::path() : path;
}

}  // namespace

absl::StatusOr<ModelDirs> ModelDirs::Create(const std::vector<std::string>& dirs) {
  ModelDirs out;
  for (const std::string& dir : dirs) {
    std::error_code error;
    fs::path canonical = fs::canonical(dir, error);
    if (error || !fs::is_directory(canonical, error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-dir: ", Quote(dir), " is not an existing directory"));
    }
    out.dirs_.push_back(std::move(canonical));
    out.spelled_.push_back(fs::absolute(dir, error).lexically_normal());
  }
  return out;
}

absl::StatusOr<UniqueFd> ModelDirs::Open(absl::string_view path, absl::string_view field) const {
  if (dirs_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field,
        ": loading files is off: the daemon was started without --model-dir (give it the "
        "directories clients may load from)"));
  }
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": required (a file inside a --model-dir, absolute or relative to it)"));
  }
  const auto outside = [&] {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": ", Quote(path), " is not inside a directory the daemon may load ",
        "from (--model-dir: ",
        absl::StrJoin(dirs_, ", ",
                      [](std::string* out, const fs::path& p) { out->append(p.string()); }),
        ")"));
  };
  if (path.empty() || path.find('\0') != absl::string_view::npos) return outside();
  const fs::path given{std::string(path)};
  std::vector<fs::path> candidates;
  if (given.is_absolute()) {
    const fs::path normal = given.lexically_normal();
    // Inside a directory as the operator spelled it or as it resolves.
    for (size_t i = 0; i < dirs_.size() && candidates.empty(); ++i) {
      if (Inside(normal, dirs_[i]) || Inside(normal, spelled_[i])) candidates.push_back(normal);
    }
    if (candidates.empty()) return outside();
  } else {
    for (const fs::path& dir : dirs_) {
      const fs::path joined = (dir / given).lexically_normal();
      if (Inside(joined, dir)) candidates.push_back(joined);
    }
    if (candidates.empty()) return outside();
  }
  for (const fs::path& candidate : candidates) {
    UniqueFd fd(::open(candidate.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) {
      if (errno == ENOENT || errno == ENOTDIR) continue;
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": ", Quote(path), " cannot be opened by the daemon"));
    }
    // What was opened, after every symbolic link: it must still be inside.
    const fs::path opened = OpenedPath(fd.get());
    bool inside = false;
    for (const fs::path& dir : dirs_) inside = inside || (!opened.empty() && Inside(opened, dir));
    if (!inside) return outside();
    struct stat info;
    if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", Quote(path), " is not a regular file"));
    }
    return fd;
  }
  return absl::NotFoundError(
      absl::StrCat(field, ": no file ", Quote(path), " in the daemon's --model-dir"));
}

}  // namespace mxserve

// Reads a whole file named on a command line or in a config, for every module.
//
// std::ifstream opens a directory without complaint, and libstdc++ then throws
// std::ios_failure from the first read (EISDIR) through istreambuf_iterator or
// a JSON parser's stream adapter: `mxserved --energy-model DIR` and `mxctl
// quantize --input DIR` aborted. This refuses what is not a file before
// reading, and reports a failed read as a status. The message names the path
// and why; the caller puts its flag in front.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace mx {

// The bytes of `path`: NOT_FOUND "cannot read '<path>': <reason>" where it
// cannot be opened or read, INVALID_ARGUMENT "'<path>' is a directory, not a
// file". Pipes and character devices are read to their end.
inline absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const auto failed = [&](int error) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': ", std::strerror(error)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return failed(errno);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return failed(errno);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a directory, not a file"));
  }
  std::string bytes;
  if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return failed(errno);
    if (got == 0) return bytes;
    bytes.append(buffer, static_cast<size_t>(got));
  }
}

}  // namespace mx

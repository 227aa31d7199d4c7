#include "server/telemetry/log.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mxserve {
namespace {

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void AppendValue(std::string& line, absl::string_view value) {
  const bool plain = !value.empty() && value.find_first_of(" \"=\t\n") == absl::string_view::npos;
  if (plain) {
    line.append(value.data(), value.size());
    return;
  }
  line.push_back('"');
  for (char c : value) {
    if (c == '"' || c == '\\') line.push_back('\\');
    if (c == '\n') {
      line.append("\\n");
      continue;
    }
    line.push_back(c);
  }
  line.push_back('"');
}

}  // namespace

std::string FormatLogLine(LogLevel level, absl::string_view event, const LogFields& fields) {
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " level=", LevelName(level), " event=");
  AppendValue(line, event);
  for (const auto& [key, value] : fields) {
    line.push_back(' ');
    line.append(key);
    line.push_back('=');
    AppendValue(line, value);
  }
  return line;
}

namespace {
std::atomic<bool> logging{true};
}  // namespace

void SetLogging(bool enabled) { logging.store(enabled, std::memory_order_relaxed); }

void Log(LogLevel level, absl::string_view event, const LogFields& fields) {
  if (!logging.load(std::memory_order_relaxed)) return;
  std::string line = FormatLogLine(level, event, fields);
  line.push_back('\n');
  // One write per line keeps lines from different threads whole.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace mxserve

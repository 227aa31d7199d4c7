// Structured log lines on stderr, one event per line, logfmt style:
//
//   ts=2026-11-21T02:30:00.123Z level=info event=listening grpc=127.0.0.1:50051
//
// Values holding spaces, quotes or '=' are quoted. Tests and scripts read these
// lines (the `listening` event gives the ports the daemon got).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace mxserve {

enum class LogLevel { kInfo, kWarning, kError };

using LogFields = std::vector<std::pair<std::string, std::string>>;

// Formats one line (without the trailing newline); exposed for tests.
std::string FormatLogLine(LogLevel level, absl::string_view event, const LogFields& fields);

// Writes one line to stderr atomically (one write call).
void Log(LogLevel level, absl::string_view event, const LogFields& fields = {});

// Turns logging off (or on again), for a process that embeds a daemon and
// calls it millions of times: the fuzz targets.
void SetLogging(bool enabled);

}  // namespace mxserve

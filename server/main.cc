// mxserved: the mxserve daemon. See `mxserved --help` and server/README.md.
//
// SIGTERM and SIGINT are taken by sigwait, so the shutdown runs as ordinary
// code, not in a signal handler; so is SIGHUP, which reloads the TLS files.
// The shutdown is bounded: --grace-seconds from the signal, queued work is
// cancelled and open calls are answered UNAVAILABLE (Daemon::Shutdown), and
// kExitMargin later the process exits even if a computation is still running
// (kernels are not interruptible; its client has had its answer).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mx/kernels/cpu_features.h"
#include "server/daemon.h"
#include "server/listener.h"
#include "server/options.h"
#include "server/telemetry/log.h"

namespace {

// How long after the grace the process may take to exit: the cancelled calls'
// answers (0.4 s at most) and their drain (0.2 s, Daemon::Shutdown), gRPC's
// cancellation of the open calls and the last log lines.
constexpr std::chrono::milliseconds kExitMargin(1000);

}  // namespace

int main(int argc, char** argv) {
  using mxserve::Log;
  using mxserve::LogLevel;
  absl::StatusOr<mxserve::ParsedCommandLine> parsed =
      mxserve::ParseCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) {
    std::fprintf(stderr, "mxserved: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(mxserve::HelpText().c_str(), stdout);
    return 0;
  }
  if (parsed->version) {
    std::printf("mxserved %s\n", MXSERVE_VERSION);
    return 0;
  }
  const mxserve::DaemonOptions& options = parsed->options;

  // Every thread made from here on inherits the blocked set.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Log(LogLevel::kInfo, "starting",
      {{"version", MXSERVE_VERSION},
       {"backend", options.backend},
       {"workers", absl::StrCat(options.workers)},
       {"kernel_threads", absl::StrCat(options.kernel_threads)},
       {"kernels", std::string(mx::kernels::IsaName(mx::kernels::DefaultIsa()))},
       {"default_policy", options.default_policy}});
  // Descriptors run out at the soft limit, often 1024: raise it to the hard one.
  mxserve::RaiseOpenFileLimit();
  absl::StatusOr<std::unique_ptr<mxserve::Daemon>> daemon = mxserve::Daemon::Start(options);
  if (!daemon.ok()) {
    Log(LogLevel::kError, "start_failed", {{"message", std::string(daemon.status().message())}});
    return 1;
  }
  Log(LogLevel::kInfo, "listening",
      {{"grpc", (*daemon)->grpc_address()},
       {"metrics", (*daemon)->metrics_address().empty() ? "off" : (*daemon)->metrics_address()},
       {"tls", options.tls_cert.empty()        ? "off"
               : options.tls_client_ca.empty() ? "on"
                                               : "mutual"}});

  int signal_number = 0;
  while (sigwait(&signals, &signal_number) == 0 && signal_number == SIGHUP) {
    if (options.tls_cert.empty()) {
      Log(LogLevel::kInfo, "sighup_ignored", {{"message", "TLS is off: nothing to reload"}});
    } else if (absl::Status reloaded = (*daemon)->ReloadTls(); reloaded.ok()) {
      Log(LogLevel::kInfo, "tls_reloaded",
          {{"cert", options.tls_cert},
           {"client_ca", options.tls_client_ca.empty() ? "none" : options.tls_client_ca}});
    } else {
      Log(LogLevel::kError, "tls_reload_failed",
          {{"message", std::string(reloaded.message())}, {"kept", "the previous certificates"}});
    }
  }
  Log(LogLevel::kInfo, "stopping",
      {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"},
       {"grace_seconds", absl::StrCat(options.grace_seconds)}});
  const auto exit_by = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds * 1000)) +
                       kExitMargin;
  std::promise<void> stopped;
  std::thread([&] {
    (*daemon)->Shutdown();
    stopped.set_value();
  }).detach();  // never joined: the process exits below, stopped or not
  if (stopped.get_future().wait_until(exit_by) == std::future_status::ready) {
    Log(LogLevel::kInfo, "stopped");
  } else {
    Log(LogLevel::kWarning, "stopped",
        {{"abandoned", "computations still running at the end of the grace"}});
  }
  // Every call is answered. Skip the remaining destructors (and, past the grace,
  // the workers still computing): the metrics web server's orderly stop alone
  // polls for 1-2 s.
  std::fflush(nullptr);
  _exit(0);
}

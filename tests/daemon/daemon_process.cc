#include "tests/daemon/daemon_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"

namespace mx_test {
namespace {

std::string Field(const std::string& line, const std::string& key) {
  const std::string needle = " " + key;  // key includes '='
  size_t at = line.find(needle);
  if (at == std::string::npos) return "";
  at += needle.size();
  return line.substr(at, line.find(' ', at) - at);
}

}  // namespace

DaemonProcess::DaemonProcess(std::vector<std::string> flags, int open_file_limit) {
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return;
  }
  std::vector<std::string> args = {MXSERVED_PATH, "--listen", "127.0.0.1:0", "--metrics-listen",
                                   "127.0.0.1:0"};
  args.insert(args.end(), flags.begin(), flags.end());
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDERR_FILENO);
    if (open_file_limit > 0) {
      const rlimit limit{rlim_t(open_file_limit), rlim_t(open_file_limit)};
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    }
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  reader_ = std::thread([this, fd = fds[0]] { ReadLoop(fd); });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard lock(mu_);
      if (!grpc_address_.empty()) break;
    }
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      stopped_ = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard lock(mu_);
  if (grpc_address_.empty()) {
    ADD_FAILURE() << "mxserved did not start; its log:\n" << log_;
    return;
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  channel_args.SetMaxSendMessageSize(256 << 20);
  channel_ =
      grpc::CreateCustomChannel(grpc_address_, grpc::InsecureChannelCredentials(), channel_args);
}

void DaemonProcess::ReadLoop(int fd) {
  char buffer[4096];
  std::string partial;
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    std::lock_guard lock(mu_);
    log_.append(buffer, static_cast<size_t>(n));
    partial.append(buffer, static_cast<size_t>(n));
    size_t newline;
    while ((newline = partial.find('\n')) != std::string::npos) {
      const std::string line = partial.substr(0, newline);
      partial.erase(0, newline + 1);
      if (line.find(" event=listening ") != std::string::npos) {
        metrics_address_ = Field(line + " ", "metrics=");
        grpc_address_ = Field(line + " ", "grpc=");
      }
    }
  }
  close(fd);
}

int DaemonProcess::Stop(double timeout_seconds) {
  if (pid_ <= 0 || stopped_) return 0;
  stopped_ = true;
  kill(pid_, SIGTERM);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      if (reader_.joinable()) reader_.join();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  if (reader_.joinable()) reader_.join();
  return -1;
}

DaemonProcess::~DaemonProcess() {
  channel_.reset();
  if (pid_ > 0 && !stopped_) Stop();
  if (reader_.joinable()) reader_.join();
}

std::string DaemonProcess::Log() const {
  std::lock_guard lock(mu_);
  return log_;
}

std::string DaemonProcess::AwaitLog(const std::string& needle,
                                    std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string log = Log();
    if (log.find(needle) != std::string::npos || std::chrono::steady_clock::now() >= deadline) {
      return log;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string ScrapeMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  const int port = std::atoi(address.substr(colon + 1).c_str());
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[8192];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) response.append(buffer, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

double MetricValue(const std::string& exposition, const std::string& series) {
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return -1;
}

double AwaitMetric(const std::string& address, const std::string& series, double want,
                   double timeout_seconds) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  double value = -1;
  while (true) {
    value = MetricValue(ScrapeMetrics(address), series);
    if (value == want || std::chrono::steady_clock::now() >= until) return value;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void StopSuiteDaemon(DaemonProcess*& daemon) {
  if (daemon != nullptr && daemon->ok()) {
    EXPECT_EQ(daemon->Stop(), 0) << daemon->Log();
  }
  delete daemon;
  daemon = nullptr;
}

}  // namespace mx_test

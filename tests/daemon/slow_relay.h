// A client that reads slowly, for the daemon's tests: a TCP relay on 127.0.0.1
// between one client connection and a target port that passes the target's
// bytes on at a fixed rate, through a small receive buffer (bytes the other
// way pass at once). Behind it, the daemon finishes a call with much of a large
// answer still in its kernel's send queue, and the client's HTTP/2 window
// updates keep arriving while it drains: the case in which closing the
// connection at once makes the kernel reset it and drop the answer's tail.
//
// One connection, then it stops. A reset from either side is passed on as a
// reset, an orderly close as one. The destructor stops the relay within about
// 50 ms, or one chunk's time at the rate (16 KiB: 1 s at 16 KB/s).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace mx_test {

class SlowRelay {
 public:
  SlowRelay(int target_port, int64_t bytes_per_second)
      : target_port_(target_port), bytes_per_second_(bytes_per_second) {
    listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address = Loopback(0);
    if (listen_ < 0 || bind(listen_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listen_, 1) != 0) {
      return;
    }
    socklen_t length = sizeof(address);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~SlowRelay() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (int fd : {listen_, client_, target_}) {
      if (fd >= 0) close(fd);
    }
  }
  SlowRelay(const SlowRelay&) = delete;
  SlowRelay& operator=(const SlowRelay&) = delete;

  // The port to connect to; 0 if the relay could not listen.
  int port() const { return port_; }
  // True once the target reset the connection (ECONNRESET on a read from it).
  bool target_reset() const { return target_reset_; }

 private:
  static constexpr int kPollMs = 50;
  static constexpr int kChunk = 16 << 10;

  static sockaddr_in Loopback(int port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
  }
  // Closes `fd` with a reset (SO_LINGER 0).
  static void Reset(int& fd) {
    const linger now{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    close(fd);
    fd = -1;
  }
  static bool SendAll(int fd, const char* data, size_t size) {
    while (size > 0) {
      const ssize_t sent = send(fd, data, size, MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent <= 0) return false;
      data += sent;
      size -= static_cast<size_t>(sent);
    }
    return true;
  }

  void Run() {
    pollfd waiting{listen_, POLLIN, 0};
    while (!stop_ && poll(&waiting, 1, kPollMs) <= 0) {
    }
    if (stop_) return;
    client_ = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    target_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // Small before connect, so the window the target sees stays small.
    const int small = 64 << 10;
    setsockopt(target_, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    const sockaddr_in target = Loopback(target_port_);
    if (client_ < 0 || target_ < 0 ||
        connect(target_, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
      return;
    }
    std::vector<char> buffer(kChunk);
    // Each way stays open until its sender closes; a reset ends both.
    bool up = true, down = true;  // client → target, target → client
    while (!stop_ && (up || down)) {
      pollfd fds[2] = {{up ? client_ : -1, POLLIN, 0}, {down ? target_ : -1, POLLIN, 0}};
      if (poll(fds, 2, kPollMs) <= 0) continue;
      if (fds[0].revents != 0) {  // at once
        const ssize_t got = recv(client_, buffer.data(), buffer.size(), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return Reset(target_);
        if (got == 0 || !SendAll(target_, buffer.data(), static_cast<size_t>(got))) {
          shutdown(target_, SHUT_WR);
          up = false;
        }
      }
      if (fds[1].revents != 0) {  // at the rate
        const ssize_t got = recv(target_, buffer.data(), buffer.size(), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
          target_reset_ = errno == ECONNRESET;
          return Reset(client_);
        }
        if (got == 0 || !SendAll(client_, buffer.data(), static_cast<size_t>(got))) {
          shutdown(client_, SHUT_WR);
          down = false;
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(got * 1000000 / bytes_per_second_));
      }
    }
  }

  const int target_port_;
  const int64_t bytes_per_second_;
  int listen_ = -1, client_ = -1, target_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, target_reset_{false};
  std::thread thread_;
};

}  // namespace mx_test

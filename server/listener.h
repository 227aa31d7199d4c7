// The gRPC port's listener, owned by the daemon rather than by gRPC.
//
// gRPC 1.51 (Debian 12's) gives up on a listening socket for good at the first
// accept() that fails with anything but EAGAIN/ECONNABORTED: one moment of
// descriptor exhaustion (EMFILE) left the daemon up but deaf until restarted.
// So the daemon accepts connections itself and hands each to gRPC through an
// external connection acceptor, which runs the same handshake (TLS included),
// channel arguments and timeouts as a port gRPC listens on. Here:
//
//   - an accept that fails for want of descriptors (EMFILE, ENFILE) or kernel
//     memory is retried after a short pause, never fatal. One descriptor is
//     held in reserve: when the table is full it is released to accept and at
//     once close the oldest waiting connection (its client sees a reset and
//     retries), so the backlog does not hold dead connections while the
//     table drains;
//   - at most `max_connections` connections are open at once (--max-connections);
//     one beyond that is accepted and closed at once;
//   - counts for /metrics: connections open, and refused by reason.
//
// A connection counts as open until gRPC closes its descriptor; gRPC does not say
// when, so the listener remembers each descriptor with its socket's inode and,
// when the limit is near and once a second, forgets those whose descriptor is
// closed or now names another file.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server_builder.h"
#include "server/base/unique_fd.h"

namespace mxserve {

class Listener {
 public:
  struct Options {
    int max_connections = 1024;  // open at once; at least 1
    // Told the open count (after each change it notices) and each refusal,
    // from the accepting thread; either may be empty.
    std::function<void(int64_t open)> on_open;
    std::function<void(const char* reason)> on_refused;  // "max_connections", "descriptors"
  };

  // Binds and listens on `address` ("host:port", "[v6]:port"; a host that
  // resolves to several addresses gets a socket on each; port 0 picks a free
  // port, the same on every socket). UNAVAILABLE naming --listen when nothing
  // could be bound.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& address,
                                                        Options options);
  ~Listener();  // Stop()

  int port() const { return port_; }
  int64_t open_connections() const { return open_.load(std::memory_order_relaxed); }

  // Starts accepting on a thread of its own; each connection goes to
  // `acceptor` (which must belong to a started server).
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Stops accepting and closes the listening sockets (new connections are
  // refused by the kernel); the connections already handed to gRPC are gRPC's.
  // Idempotent.
  void Stop();
  // Stops accepting (Stop), then waits until the kernel has sent every byte written to each
  // open connection and its peer has acknowledged it (SIOCOUTQ is 0), or until
  // `deadline`. Returns the bytes still queued then, 0 when all left. Closing a
  // socket whose queue is not empty loses its tail: the peer's next segment
  // (an HTTP/2 window update, say) finds the socket closed, and the kernel
  // answers with a reset and drops what it had not sent.
  int64_t AwaitSent(std::chrono::steady_clock::time_point deadline);

 private:
  Listener(std::vector<UniqueFd> sockets, int port, Options options);
  void Loop();
  // Accepts what is waiting on `socket`; false when it stopped for want of
  // descriptors or memory (the loop then pauses).
  bool AcceptAll(int socket);
  void Admit(int socket, int fd);
  // Releases the reserve descriptor to accept and close one waiting connection.
  void ShedOne(int socket);
  // Forgets the connections whose descriptor gRPC has closed.
  void Prune();
  // Tells open_ and on_open the count of connections_.
  void PublishOpen();

  std::vector<UniqueFd> sockets_;
  const int port_;
  const Options options_;
  UniqueFd wake_;     // eventfd: Stop() wakes the loop
  UniqueFd reserve_;  // /dev/null, released when the descriptor table is full
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unordered_map<int, uint64_t> connections_;  // fd → socket inode; loop thread only
  std::atomic<int64_t> open_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // Rate limits for the log lines of the loop thread.
  int64_t last_exhausted_log_ = -3600, last_refused_log_ = -3600;
  uint64_t shed_since_log_ = 0, refused_since_log_ = 0;
};

// True for "host:port" or "[v6]:port" with a port in [0, 65535]: the forms Bind
// takes (--metrics-listen is checked against them when parsed).
bool ValidHostPort(const std::string& address);

// Raises this process's soft RLIMIT_NOFILE to its hard limit (capped at what
// the kernel allows one process, fs.nr_open); logs the limit before and after.
// Returns the soft limit now in force.
uint64_t RaiseOpenFileLimit();

// The soft RLIMIT_NOFILE now in force.
uint64_t OpenFileLimit();

}  // namespace mxserve

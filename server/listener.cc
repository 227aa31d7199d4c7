#include "server/listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/telemetry/log.h"

namespace mxserve {
namespace {

// Pause after an accept failed for want of descriptors or memory.
constexpr int kBackoffMs = 50;
// At most one log line of each kind per this many seconds.
constexpr int64_t kLogEverySeconds = 10;

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "host:port" or "[v6]:port" → host (no brackets) and port; false if malformed.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return false;
    }
    *host = address.substr(1, close - 1);
    *port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return false;
    *host = address.substr(0, colon);
    *port = address.substr(colon + 1);
    if (host->find(':') != std::string::npos) return false;  // v6 needs brackets
  }
  int number;
  return absl::SimpleAtoi(*port, &number) && number >= 0 && number <= 65535;
}

void SetPort(sockaddr* address, int port) {
  if (address->sa_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (address->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

int BoundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return 0;
  if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  return 0;
}

// The inode of `fd`'s file, or 0 when `fd` is not open.
uint64_t InodeOf(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& address,
                                                         Options options) {
  std::string host, port_text;
  if (!SplitHostPort(address, &host, &port_text)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen: expected HOST:PORT or [IPV6]:PORT with a port in [0, 65535], got '", address,
        "'"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints,
                              &found);
      error != 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot resolve '", host, "': ", gai_strerror(error)));
  }
  std::vector<UniqueFd> sockets;
  int port = 0;
  std::string last_error;
  for (addrinfo* at = found; at != nullptr; at = at->ai_next) {
    UniqueFd fd(socket(at->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last_error = std::strerror(errno);
      continue;
    }
    const int on = 1, off = 0;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    // "[::]" takes IPv4 too, as gRPC's own listener does.
    if (at->ai_family == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    if (port != 0) SetPort(at->ai_addr, port);  // port 0: every socket gets the first one's
    if (bind(fd.get(), at->ai_addr, at->ai_addrlen) != 0 || listen(fd.get(), SOMAXCONN) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    port = BoundPort(fd.get());
    sockets.push_back(std::move(fd));
  }
  freeaddrinfo(found);
  if (sockets.empty()) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on '", address, "': ", last_error));
  }
  return std::unique_ptr<Listener>(new Listener(std::move(sockets), port, std::move(options)));
}

Listener::Listener(std::vector<UniqueFd> sockets, int port, Options options)
    : sockets_(std::move(sockets)),
      port_(port),
      options_(std::move(options)),
      wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      reserve_(open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

Listener::~Listener() { Stop(); }

void Listener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  thread_ = std::thread([this] { Loop(); });
}

void Listener::Stop() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
    thread_.join();
  }
  sockets_.clear();
}

void Listener::Loop() {
  std::vector<pollfd> polled;
  for (const UniqueFd& socket : sockets_) polled.push_back({socket.get(), POLLIN, 0});
  polled.push_back({wake_.get(), POLLIN, 0});
  int64_t last_prune = NowSeconds();
  bool paused = false;
  while (!stop_.load()) {
    // Paused: only the wake descriptor, for kBackoffMs, before accepting again.
    const int ready = poll(polled.data() + (paused ? sockets_.size() : 0),
                           paused ? 1 : polled.size(), paused ? kBackoffMs : 1000);
    paused = false;
    if (stop_.load()) break;
    if (ready > 0) {
      for (size_t i = 0; i < sockets_.size(); ++i) {
        if ((polled[i].revents & POLLIN) && !AcceptAll(polled[i].fd)) paused = true;
        polled[i].revents = 0;
      }
    }
    if (NowSeconds() != last_prune) {
      last_prune = NowSeconds();
      Prune();
    }
  }
}

bool Listener::AcceptAll(int socket) {
  // A bounded number per wake-up, so one busy socket cannot starve the others.
  for (int i = 0; i < 256; ++i) {
    const int fd = accept4(socket, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(socket, fd);
      continue;
    }
    switch (errno) {
      case EAGAIN:
        return true;
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
        continue;
      case EMFILE:
      case ENFILE:
        ShedOne(socket);
        return false;
      default:  // ENOBUFS, ENOMEM, or anything else: pause and try again
        if (NowSeconds() - last_exhausted_log_ >= kLogEverySeconds) {
          last_exhausted_log_ = NowSeconds();
          Log(LogLevel::kWarning, "accept_failed",
              {{"message", std::strerror(errno)}, {"action", "retrying"}});
        }
        return false;
    }
  }
  return true;
}

void Listener::ShedOne(int socket) {
  const int error = errno;
  if (reserve_.valid()) {
    reserve_ = UniqueFd();
    if (int fd = accept4(socket, nullptr, nullptr, SOCK_CLOEXEC); fd >= 0) {
      ++shed_since_log_;
      if (options_.on_refused) options_.on_refused("descriptors");
      close(fd);
    }
    reserve_ = UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  Prune();
  if (NowSeconds() - last_exhausted_log_ >= kLogEverySeconds) {
    last_exhausted_log_ = NowSeconds();
    Log(LogLevel::kWarning, "descriptors_exhausted",
        {{"message", std::strerror(error)},
         {"open_file_limit", absl::StrCat(OpenFileLimit())},
         {"connections", absl::StrCat(open_.load())},
         {"shed", absl::StrCat(shed_since_log_)},
         {"action", "waiting connections are closed until descriptors free up; see "
                    "--max-connections"}});
    shed_since_log_ = 0;
  }
}

void Listener::Admit(int socket, int fd) {
  if (connections_.size() >= static_cast<size_t>(options_.max_connections)) Prune();
  if (connections_.size() >= static_cast<size_t>(options_.max_connections)) {
    // Counted and logged before the close, so a client that sees its
    // connection end finds it counted.
    ++refused_since_log_;
    if (options_.on_refused) options_.on_refused("max_connections");
    if (NowSeconds() - last_refused_log_ >= kLogEverySeconds) {
      last_refused_log_ = NowSeconds();
      Log(LogLevel::kWarning, "connection_refused",
          {{"reason", "max_connections"},
           {"max_connections", absl::StrCat(options_.max_connections)},
           {"refused", absl::StrCat(refused_since_log_)}});
      refused_since_log_ = 0;
    }
    close(fd);
    return;
  }
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  connections_[fd] = InodeOf(fd);
  PublishOpen();
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
  connection.listener_fd = socket;
  connection.fd = fd;
  acceptor_->HandleNewConnection(&connection);
}

int64_t Listener::AwaitSent(std::chrono::steady_clock::time_point deadline) {
  Stop();
  // The loop thread has ended, so connections_ is this thread's. gRPC may
  // close a descriptor meanwhile and the number be reused: the inode is checked
  // after the queue is read, so a count is only ever taken from our socket.
  auto queued = [this] {
    int64_t bytes = 0;
    std::erase_if(connections_, [&](const auto& entry) {
      const auto& [fd, inode] = entry;
      int unsent = 0;
      const bool read = ioctl(fd, SIOCOUTQ, &unsent) == 0;
      if (InodeOf(fd) != inode) return true;
      if (read) bytes += unsent;
      return false;
    });
    return bytes;
  };
  int64_t bytes = queued();
  while (bytes > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    bytes = queued();
  }
  return bytes;
}

void Listener::Prune() {
  const size_t before = connections_.size();
  std::erase_if(connections_, [](const auto& entry) {
    const auto& [fd, inode] = entry;
    return InodeOf(fd) != inode;
  });
  if (connections_.size() != before) PublishOpen();
}

void Listener::PublishOpen() {
  open_.store(static_cast<int64_t>(connections_.size()), std::memory_order_relaxed);
  if (options_.on_open) options_.on_open(open_.load(std::memory_order_relaxed));
}

bool ValidHostPort(const std::string& address) {
  std::string host, port;
  return SplitHostPort(address, &host, &port);
}

uint64_t OpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  return limit.rlim_cur == RLIM_INFINITY ? uint64_t{1} << 20 : limit.rlim_cur;
}

uint64_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  const rlim_t before = limit.rlim_cur;
  rlim_t target = limit.rlim_max;
  // An unlimited hard limit cannot be the soft one: the kernel caps a process
  // at fs.nr_open.
  uint64_t nr_open = 0;
  if (std::ifstream file("/proc/sys/fs/nr_open"); file >> nr_open && nr_open > 0) {
    if (target == RLIM_INFINITY || target > nr_open) target = nr_open;
  }
  if (target > before) {
    limit.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      Log(LogLevel::kWarning, "open_file_limit",
          {{"soft", absl::StrCat(before)},
           {"hard", absl::StrCat(limit.rlim_max)},
           {"message", absl::StrCat("could not raise the soft limit: ", std::strerror(errno))}});
      return before;
    }
  }
  Log(LogLevel::kInfo, "open_file_limit",
      {{"soft_before", absl::StrCat(before)},
       {"soft", absl::StrCat(OpenFileLimit())},
       {"hard", limit.rlim_max == RLIM_INFINITY ? "unlimited" : absl::StrCat(limit.rlim_max)}});
  return OpenFileLimit();
}

}  // namespace mxserve

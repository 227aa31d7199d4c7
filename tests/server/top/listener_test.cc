// The daemon's own listener (server/listener.h) without gRPC: what --listen
// accepts, the errors that name it, and the open-file limit helpers.
#include "server/listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace mxserve {
namespace {

TEST(Listener, BindsAFreePortOnLoopback) {
  auto listener = Listener::Bind("127.0.0.1:0", {});
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_GT((*listener)->port(), 0);
  EXPECT_EQ((*listener)->open_connections(), 0);
  // A name that resolves works too, and gets the same kind of port.
  auto named = Listener::Bind("localhost:0", {});
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_GT((*named)->port(), 0);
}

TEST(Listener, ABusyPortIsUnavailableNamingTheFlag) {
  auto first = Listener::Bind("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = Listener::Bind(address, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(),
            "--listen: cannot listen on '" + address + "': Address already in use");
  // Stopped, the port is free again.
  (*first)->Stop();
  (*first)->Stop();  // idempotent
  EXPECT_TRUE(Listener::Bind(address, {}).ok());
}

TEST(Listener, MalformedAddressesNameTheFlagAndTheForm) {
  for (const char* address :
       {"", "50051", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
        "127.0.0.1:http", "::1:50051", "[::1]", "[::1]50051", "[::1:50051"}) {
    auto listener = Listener::Bind(address, {});
    ASSERT_FALSE(listener.ok()) << address;
    EXPECT_EQ(listener.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_EQ(listener.status().message(),
              std::string("--listen: expected HOST:PORT or [IPV6]:PORT with a port in "
                          "[0, 65535], got '") +
                  address + "'");
  }
}

TEST(Listener, TheOpenFileLimitIsRaisedToTheHardLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max > 64) {
    rlimit lowered{64, saved.rlim_max};
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
    EXPECT_EQ(OpenFileLimit(), 64u);
  }
  const uint64_t raised = RaiseOpenFileLimit();
  EXPECT_EQ(raised, OpenFileLimit());
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  if (saved.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(now.rlim_cur, saved.rlim_max);
  }
  EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace mxserve

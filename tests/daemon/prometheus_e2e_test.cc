// End to end with the real Prometheus server (Debian's `prometheus` package):
// it scrapes a real mxserved, and its query API returns the request counts and
// energy that the traffic produced.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/daemon/api_util.h"
#include "tests/daemon/daemon_process.h"

namespace mx_test {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// GET path on 127.0.0.1:port; the body, empty on failure.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) < 0) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[8192];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) response.append(buffer, size_t(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.0 200", 0) != 0 && response.rfind("HTTP/1.1 200", 0) != 0) return "";
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of an instant query with one result, or -1.
double Query(int port, const std::string& promql) {
  std::string escaped;
  for (unsigned char c : promql) {
    if (isalnum(c) || c == '_') {
      escaped += static_cast<char>(c);
    } else {
      absl::StrAppend(&escaped, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  const std::string body = HttpGet(port, "/api/v1/query?query=" + escaped);
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (json.is_discarded() || json["status"] != "success") return -1;
  const auto& result = json["data"]["result"];
  if (result.size() != 1) return -1;
  return std::stod(result[0]["value"][1].get<std::string>());
}

class PrometheusProcess {
 public:
  explicit PrometheusProcess(const std::string& target) {
    dir_ = absl::StrCat(::testing::TempDir(), "/mxserve_prometheus_", getpid());
    std::filesystem::create_directories(dir_);
    const std::string config = dir_ + "/prometheus.yml";
    std::ofstream(config) << "global:\n  scrape_interval: 1s\n"
                          << "scrape_configs:\n  - job_name: mxserved\n"
                          << "    static_configs:\n      - targets: ['" << target << "']\n";
    port_ = FreePort();
    pid_ = fork();
    if (pid_ == 0) {
      const std::string log = dir_ + "/prometheus.log";
      freopen(log.c_str(), "w", stderr);
      freopen(log.c_str(), "a", stdout);
      const std::string config_flag = "--config.file=" + config;
      const std::string storage = "--storage.tsdb.path=" + dir_ + "/data";
      const std::string listen = absl::StrCat("--web.listen-address=127.0.0.1:", port_);
      execl(kPrometheus, kPrometheus, config_flag.c_str(), storage.c_str(), listen.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~PrometheusProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status;
      waitpid(pid_, &status, 0);
    }
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }
  int port() const { return port_; }
  std::string Log() const {
    std::ifstream in(dir_ + "/prometheus.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Polls `condition` every 200 ms for up to `seconds`.
template <typename F>
bool Eventually(F condition, double seconds) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

TEST(PrometheusEndToEnd, ScrapedCountsAndEnergyMatchTheTraffic) {
  ASSERT_TRUE(std::filesystem::exists(kPrometheus))
      << kPrometheus << " is missing: scripts/deps.sh installs Debian's prometheus package";
  DaemonProcess daemon({"--workers", "2"});
  ASSERT_TRUE(daemon.ok());
  PrometheusProcess prometheus(daemon.metrics_address());
  ASSERT_TRUE(Eventually([&] { return !HttpGet(prometheus.port(), "/-/ready").empty(); }, 60))
      << prometheus.Log();

  const TestLayer layer = MakeLayer("model.layers.4.mlp.down_proj", 32, 64, false, 91);
  ASSERT_TRUE(RegisterAndPublish(daemon.channel().get(), "m", {layer}, "C-aggressive").ok());
  auto stub = v1::Compute::NewStub(daemon.channel());
  const auto x = TestValues(8 * 64, 92);
  for (v1::Phase phase : {v1::PHASE_ROLLOUT, v1::PHASE_REWARD}) {
    for (int i = 0; i < (phase == v1::PHASE_ROLLOUT ? 6 : 4); ++i) {
      v1::LayerForwardRequest r;
      r.set_model("m");
      r.set_layer(layer.name);
      r.set_phase(phase);
      *r.mutable_input()->mutable_tensor() = Matrix(x, 8, 64);
      grpc::ClientContext context;
      v1::LayerForwardResponse response;
      ASSERT_TRUE(stub->LayerForward(&context, r, &response).ok());
    }
  }
  const std::string rollout =
      R"(mxserve_requests_total{job="mxserved",rpc="LayerForward",phase="rollout",format="MXFP4_E2M1"})";
  const std::string reward =
      R"(mxserve_requests_total{job="mxserved",rpc="LayerForward",phase="reward",format="MXFP4_E2M1"})";
  EXPECT_TRUE(Eventually(
      [&] {
        return Query(prometheus.port(), rollout) == 6 && Query(prometheus.port(), reward) == 4;
      },
      30))
      << "rollout " << Query(prometheus.port(), rollout) << ", reward "
      << Query(prometheus.port(), reward) << "\n"
      << prometheus.Log();
  EXPECT_GT(Query(prometheus.port(),
                  R"(mxserve_energy_joules_total{source="fpga_model",phase="rollout"})"),
            0);
  EXPECT_EQ(Query(prometheus.port(), R"(up{job="mxserved"})"), 1);
}

}  // namespace
}  // namespace mx_test

// mxserved's flags: parsing, errors that name the flag, the config file, --help.
#include "server/options.h"

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mxserve {
namespace {

TEST(Options, DefaultsBindToLoopback) {
  auto parsed = ParseCommandLine({});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->options.listen, "127.0.0.1:50051");
  EXPECT_EQ(parsed->options.metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(parsed->options.default_policy, "D-phase-adaptive");
  EXPECT_EQ(parsed->options.backend, "cpu");
}

TEST(Options, BothSpellingsAndSizes) {
  auto parsed = ParseCommandLine({"--workers=3", "--backend", "null", "--max-message-bytes", "16M",
                                  "--weight-memory-bytes=2GiB", "--grace-seconds", "0.5",
                                  "--update-copies", "cache"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->options.cache_update_copies);
  EXPECT_FALSE(ParseCommandLine({})->options.cache_update_copies);
  EXPECT_EQ(parsed->options.workers, 3);
  EXPECT_EQ(parsed->options.backend, "null");
  EXPECT_EQ(parsed->options.max_message_bytes, 16 << 20);
  EXPECT_EQ(parsed->options.weight_memory_bytes, uint64_t{2} << 30);
  EXPECT_EQ(parsed->options.grace_seconds, 0.5);
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("3K"), 3072u);
}

TEST(Options, ModelDirsRepeatAndPowerBounds) {
  auto parsed = ParseCommandLine({"--model-dir", "/srv/a", "--model-dir=/srv/b", "--power-sources",
                                  "gpu_baseline, lab", "--max-power-series", "8",
                                  "--max-power-watts", "700"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.model_dirs, (std::vector<std::string>{"/srv/a", "/srv/b"}));
  EXPECT_EQ(parsed->options.power_sources, (std::vector<std::string>{"gpu_baseline", "lab"}));
  EXPECT_EQ(parsed->options.max_power_series, 8);
  EXPECT_EQ(parsed->options.max_power_watts, 700);
  EXPECT_TRUE(ParseCommandLine({}).value().options.model_dirs.empty());  // loading off
  EXPECT_EQ(ParseCommandLine({"--max-power-watts", "-1"}).status().message(),
            "--max-power-watts: expected watts in (0, 1e7], got '-1'");
  // A config file gives a repeatable flag as a list; the command line replaces it.
  const std::string path = ::testing::TempDir() + "/mxserved_model_dirs.json";
  std::ofstream(path) << R"({"model-dir": ["/srv/x", "/srv/y"], "max-power-series": 2})";
  parsed = ParseCommandLine({"--config", path});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.model_dirs, (std::vector<std::string>{"/srv/x", "/srv/y"}));
  parsed = ParseCommandLine({"--config", path, "--model-dir", "/srv/z"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.model_dirs, (std::vector<std::string>{"/srv/z"}));
  EXPECT_EQ(parsed->options.max_power_series, 2);
}

TEST(Options, AuthAndQuotas) {
  const DaemonOptions defaults = ParseCommandLine({}).value().options;
  EXPECT_EQ(defaults.auth_tokens, "");  // no authentication: everyone is admin
  EXPECT_EQ(defaults.quota_weight_bytes, 0u);
  EXPECT_EQ(defaults.quota_inflight, 0);
  EXPECT_EQ(defaults.quota_models, 0);
  auto parsed = ParseCommandLine({"--auth-tokens", "/run/secrets/tokens", "--quota-weight-bytes",
                                  "2G", "--quota-inflight=16", "--quota-models", "3"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.auth_tokens, "/run/secrets/tokens");
  EXPECT_EQ(parsed->options.quota_weight_bytes, uint64_t{2} << 30);
  EXPECT_EQ(parsed->options.quota_inflight, 16);
  EXPECT_EQ(parsed->options.quota_models, 3);
  EXPECT_EQ(ParseCommandLine({"--auth-tokens="}).status().message(),
            "--auth-tokens: expected a file, got ''");
  EXPECT_EQ(ParseCommandLine({"--quota-models", "-1"}).status().message(),
            "--quota-models: expected an integer in [0, 1073741824], got '-1'");
  EXPECT_EQ(ParseCommandLine({"--quota-inflight", "many"}).status().message(),
            "--quota-inflight: expected an integer in [0, 1073741824], got 'many'");
  EXPECT_EQ(ParseCommandLine({"--quota-weight-bytes", "8Q"}).status().message(),
            "--quota-weight-bytes: expected a byte size such as 512M or 8G, got '8Q'");
  EXPECT_NE(HelpText().find("--auth-tokens FILE"), std::string::npos);
}

TEST(Options, MaxEnergyRunsIsBounded) {
  EXPECT_EQ(ParseCommandLine({}).value().options.max_energy_runs, 1024);
  auto parsed = ParseCommandLine({"--max-energy-runs", "3"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.max_energy_runs, 3);
  // At least one run: 0 would leave a tagged request nowhere to be booked apart.
  EXPECT_EQ(ParseCommandLine({"--max-energy-runs", "0"}).status().message(),
            "--max-energy-runs: expected an integer in [1, 65536], got '0'");
  EXPECT_EQ(ParseCommandLine({"--max-energy-runs", "65537"}).status().message(),
            "--max-energy-runs: expected an integer in [1, 65536], got '65537'");
  EXPECT_NE(HelpText().find("--max-energy-runs N"), std::string::npos);
  parsed = ParseCommandLine({"--max-energy-models", "7"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.max_energy_models, 7);
  EXPECT_EQ(ParseCommandLine({"--max-energy-models", "0"}).status().message(),
            "--max-energy-models: expected an integer in [1, 65536], got '0'");
  EXPECT_NE(HelpText().find("--max-energy-models N"), std::string::npos);
  EXPECT_FALSE(ParseCommandLine({}).value().options.metrics_model_energy);
  EXPECT_TRUE(ParseCommandLine({"--metrics-model-energy", "true"})
                  .value()
                  .options.metrics_model_energy);
  EXPECT_EQ(ParseCommandLine({"--metrics-model-energy", "yes"}).status().message(),
            "--metrics-model-energy: expected true or false, got 'yes'");
}

TEST(Options, TlsFlagsComeInTheirCombinationsAndNameTheFlag) {
  const std::string cert = ::testing::TempDir() + "/mxserved_options_cert.pem";
  std::ofstream(cert) << "-----BEGIN CERTIFICATE-----\n";
  auto parsed = ParseCommandLine({"--tls-cert", cert, "--tls-key", cert, "--tls-client-ca", cert});
  ASSERT_TRUE(parsed.ok()) << parsed.status();  // the contents are the daemon's to check
  EXPECT_EQ(parsed->options.tls_client_ca, cert);
  EXPECT_TRUE(parsed->options.reflection);
  EXPECT_EQ(ParseCommandLine({"--tls-cert", cert}).status().message(),
            "--tls-cert: needs --tls-key (its private key)");
  EXPECT_EQ(ParseCommandLine({"--tls-key", cert}).status().message(),
            "--tls-key: needs --tls-cert (its certificate chain)");
  EXPECT_EQ(ParseCommandLine({"--tls-client-ca", cert}).status().message(),
            "--tls-client-ca: needs --tls-cert and --tls-key: mutual TLS is TLS with client "
            "certificates");
  EXPECT_EQ(ParseCommandLine({"--tls-cert", cert, "--tls-key", "/nonexistent/key.pem"})
                .status()
                .message(),
            "--tls-key: cannot read '/nonexistent/key.pem' (missing, unreadable or empty)");
  EXPECT_FALSE(ParseCommandLine({"--reflection=false"}).value().options.reflection);
  EXPECT_EQ(ParseCommandLine({"--reflection", "no"}).status().message(),
            "--reflection: expected true or false, got 'no'");
  EXPECT_TRUE(ParseCommandLine({"--tls-cert", cert, "--help"}).value().help);
}

// Without XRT the fpga backend is not built; asking for it says so and names the
// alternative, before anything starts.
TEST(Options, FpgaBackendNeedsXrt) {
  auto parsed = ParseCommandLine({"--backend", "fpga", "--xclbin", "mx_gemm.xclbin"});
#ifdef MXSERVE_HAVE_XRT
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.xclbin, "mx_gemm.xclbin");
#else
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "--backend: this build has no fpga backend (CMake found no XRT; see fpga/README.md); "
            "--backend hls-sim runs the same kernel on the host");
#endif
}

// A file under the test's temporary directory holding `text`; its path.
std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Options, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--workers", "many"}, "--workers: expected an integer in [0, 1024], got 'many'"},
      {{"--backend=gpu"},
       "--backend: unknown backend 'gpu'; expected one of cpu, hls-sim, fpga, null"},
      {{"--fpga-device=-1"}, "--fpga-device: expected an integer in [0, 63], got '-1'"},
      // Both were ignored with another backend: the board's daemon served the CPU.
      {{"--xclbin=/opt/mx_gemm.xclbin"},
       "--xclbin: only the fpga backend loads an xclbin; --backend is 'cpu'"},
      {{"--backend=hls-sim", "--fpga-device=1"},
       "--fpga-device: only the fpga backend opens a device; --backend is 'hls-sim'"},
      {{"--queue-size"}, "--queue-size: missing value"},
      {{"--colour=red"}, "--colour: unknown flag (mxserved --help lists them)"},
      {{"serve"}, "unexpected argument 'serve'"},
      {{"--max-message-bytes=1"}, "--max-message-bytes: expected a size from 4K to 2G-1"},
      {{"--weight-memory-bytes=lots"}, "--weight-memory-bytes: expected a byte size"},
      {{"--update-copies=keep"}, "--update-copies: expected slice or cache, got 'keep'"},
      {{"--bf16-sums=fast"}, "--bf16-sums: expected pairs or exact, got 'fast'"},
      {{"--config=/nonexistent.json"}, "--config: cannot open '/nonexistent.json'"},
      // A directory read as empty: "not valid JSON ... unexpected end of input".
      {{"--config=" + ::testing::TempDir()}, "' is a directory, not a file"},
      {{absl::StrCat("--config=", WriteTemp("broken.json", "{\"workers\": 4,\n\"listen\" 1}"))},
       "broken.json' is not valid JSON: parse error at line 2, column 10: syntax error while "
       "parsing object separator - unexpected number literal"},
      {{absl::StrCat("--config=", WriteTemp("list.json", "[1]"))},
       "list.json' is not a JSON object"},
      // CivetServer's "null context when constructing CivetServer" named no form.
      {{"--metrics-listen=OFF"},
       "--metrics-listen: expected HOST:PORT, [IPV6]:PORT or PORT (a port in [0, 65535]; several "
       "with commas), or off, got 'OFF'"},
      {{"--metrics-listen=127.0.0.1:9464,"}, "--metrics-listen: expected HOST:PORT"},
      {{"--metrics-listen=127.0.0.1:99999"}, "--metrics-listen: expected HOST:PORT"},
      {{"--metrics-listen="}, "--metrics-listen: expected HOST:PORT"},
      // The metrics server took the port first and the daemon blamed --listen.
      {{"--listen=127.0.0.1:47123", "--metrics-listen=127.0.0.1:47123"},
       "--metrics-listen: '127.0.0.1:47123' takes --listen's port 47123 ('127.0.0.1:47123'); "
       "give /metrics a port of its own"},
      {{"--listen=0.0.0.0:50051", "--metrics-listen=127.0.0.1:9464,[::1]:50051"},
       "--metrics-listen: '[::1]:50051' takes --listen's port 50051"},
      {{"--listen=[::1]:7000", "--metrics-listen=7000"},
       "--metrics-listen: '7000' takes --listen's port 7000"},
      {{"--config=a.json", "--config", "b.json"},
       "--config: given twice ('a.json', then 'b.json'); one file holds every setting"},
      {{"--config="}, "--config: expected a file, got ''"},
      {{"--power-sources=gpu_baseline,fpga"},
       "--power-sources: 'fpga' is the daemon's own (fpga, fpga_model): clients cannot report it"},
      {{"--power-sources=a b"},
       "--power-sources: expected names of 1-64 characters of [A-Za-z0-9_.:/-], got 'a b'"},
  };
  for (const auto& c : cases) {
    auto parsed = ParseCommandLine(c.args);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message), absl::string_view::npos)
        << parsed.status().message();
  }
}

TEST(Options, MetricsMayShareAPortNumberOnAnotherInterfaceOrPortZero) {
  for (const auto& [listen, metrics] : std::vector<std::pair<std::string, std::string>>{
           {"127.0.0.1:7000", "127.0.0.2:7000"},  // another address, the same port number
           {"127.0.0.1:0", "127.0.0.1:0"},        // two free ports, picked apart
           {"127.0.0.1:7000", "off"},
           {"127.0.0.1:7000", "127.0.0.1:7001"}}) {
    auto parsed = ParseCommandLine({"--listen", listen, "--metrics-listen", metrics});
    EXPECT_TRUE(parsed.ok()) << listen << " " << metrics << ": " << parsed.status();
  }
}

TEST(Options, MetricsListenTakesWhatCivetServerTakes) {
  for (const char* address : {"off", "127.0.0.1:0", "[::1]:9464", "localhost:9464", "9464",
                              "127.0.0.1:9464,[::1]:9464"}) {
    auto parsed = ParseCommandLine({absl::StrCat("--metrics-listen=", address)});
    ASSERT_TRUE(parsed.ok()) << address << ": " << parsed.status();
    EXPECT_EQ(parsed->options.metrics_listen, address);
  }
}

TEST(Options, ConfigFileThenCommandLine) {
  const std::string path = ::testing::TempDir() + "/mxserved_options_test.json";
  std::ofstream(path) << R"({"workers": 4, "listen": "127.0.0.1:6000", "max-batch": 8})";
  auto parsed = ParseCommandLine({"--workers=2", "--config", path});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->options.workers, 2);  // the command line wins, wherever it stands
  EXPECT_EQ(parsed->options.listen, "127.0.0.1:6000");
  EXPECT_EQ(parsed->options.max_batch, 8);
  std::ofstream(path) << R"({"workerz": 4})";
  auto bad = ParseCommandLine({"--config", path});
  EXPECT_NE(bad.status().message().find("unknown setting 'workerz'"), absl::string_view::npos);
  // A JSON boolean is the flag's true or false (it was "expected a string or a
  // number"; a black-box test), and only a boolean flag takes one.
  std::ofstream(path) << R"({"reflection": false})";
  auto boolean = ParseCommandLine({"--config", path});
  ASSERT_TRUE(boolean.ok()) << boolean.status();
  EXPECT_FALSE(boolean->options.reflection);
  std::ofstream(path) << R"({"workers": true})";
  EXPECT_EQ(ParseCommandLine({"--config", path}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A repeated setting was the last one's, silently.
  std::ofstream(path) << R"({"workers": 4, "workers": 2})";
  auto twice = ParseCommandLine({"--config", path});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find(
                "': setting 'workers' is given twice (a list takes an array)"),
            absl::string_view::npos)
      << twice.status();
}

TEST(Options, HelpListsEveryFlagWithItsDefault) {
  const std::string help = HelpText();
  for (const char* line :
       {"--listen ADDR", "default: 127.0.0.1:50051", "--metrics-listen ADDR", "--backend NAME",
        "--workers N", "--queue-size N", "default: 1024", "--batch-window-us US", "--max-batch N",
        "--max-message-bytes BYTES", "default: 64M", "--weight-memory-bytes BYTES", "default: 8G",
        "--policy-dir DIR", "--default-policy NAME", "--energy-model FILE", "--grace-seconds S",
        "--config FILE"}) {
    EXPECT_NE(help.find(line), std::string::npos) << line;
  }
  std::istringstream lines(help);
  for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 80u) << l;
}

// server/README.md's flag table ("Every flag, its meaning and its default") and
// --help name the same flags: a flag added to one is added to the other.
TEST(Options, TheReadmeFlagTableAndHelpNameTheSameFlags) {
  std::set<std::string> in_help;
  std::istringstream help(HelpText());
  const std::regex help_flag("^  --([a-z0-9-]+)");
  for (std::string line; std::getline(help, line);) {
    std::smatch m;
    if (std::regex_search(line, m, help_flag)) in_help.insert(m[1]);
  }
  std::ifstream readme(MXSERVE_SOURCE_DIR "/server/README.md");
  ASSERT_TRUE(readme) << "cannot read server/README.md";
  std::set<std::string> in_readme;
  bool in_table = false;
  const std::regex readme_flag("`--([a-z0-9-]+)");
  for (std::string line; std::getline(readme, line);) {
    if (line.find("Every flag, its meaning and its default") != std::string::npos) in_table = true;
    if (!in_table) continue;
    if (line.rfind("| `--", 0) != 0) {
      if (!in_readme.empty() && line.rfind("|", 0) != 0) break;  // the table ended
      continue;
    }
    const std::string first_cell = line.substr(0, line.find(" | "));
    for (std::sregex_iterator it(first_cell.begin(), first_cell.end(), readme_flag), end;
         it != end; ++it) {
      in_readme.insert((*it)[1]);
    }
  }
  in_help.erase("help");
  in_help.erase("version");
  EXPECT_EQ(in_readme, in_help);
  EXPECT_GE(in_help.size(), 30u);
}

}  // namespace
}  // namespace mxserve

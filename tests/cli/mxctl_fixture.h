// Running mxctl as a user does, for the CLI suites: a scratch directory per test,
// the real binary through the shell, its exit code and both streams captured.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mx_test {

struct MxctlResult {
  int exit_code;
  std::string out;
  std::string err;
};

class MxctlTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "mxctl_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // `mxctl ARGS`, stdout and stderr into the scratch directory.
  MxctlResult RunMxctl(const std::string& args) const {
    const std::string command =
        std::string(MXCTL_PATH) + " " + args + " >" + Path("stdout") + " 2>" + Path("stderr");
    const int status = std::system(command.c_str());
    const auto slurp = [](const std::string& p) {
      std::ifstream in(p);
      std::stringstream s;
      s << in.rdbuf();
      return s.str();
    };
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(Path("stdout")),
            slurp(Path("stderr"))};
  }

  // Raw little-endian float32 files in the scratch directory.
  void WriteFloats(const std::string& name, const std::vector<float>& values) const {
    std::ofstream out(Path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(float)));
  }
  std::vector<float> ReadFloats(const std::string& name) const {
    std::ifstream in(Path(name), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> values(bytes.size() / 4);
    std::memcpy(values.data(), bytes.data(), values.size() * 4);
    return values;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace mx_test

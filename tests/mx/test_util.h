// Helpers shared by the mx tests: file reading, the golden manifest, and the
// "bits equal, zeros compared as numbers" rule of the golden README.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "mx/format.h"

namespace mx {
// gtest prints parameters in test listings (and so in CTest's names): by name.
inline void PrintTo(Format format, std::ostream* os) { *os << FormatName(format); }
}  // namespace mx

namespace mx_test {

// A golden case as a test parameter, printed by its id rather than its JSON.
struct GoldenCase {
  nlohmann::json json;
  const nlohmann::json& operator[](const char* key) const { return json[key]; }
};
inline void PrintTo(const GoldenCase& c, std::ostream* os) {
  *os << c.json["id"].get<std::string>();
}

// The build's golden directory, or $MXSERVE_GOLDEN_DIR where it is set: the
// test binaries then run on a machine without this checkout (bench/cpu_check.sh).
inline const std::string kGoldenDir = [] {
  const char* dir = std::getenv("MXSERVE_GOLDEN_DIR");
  return std::string(dir && *dir ? dir : MXSERVE_GOLDEN_DIR);
}();

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<float> ReadFloats(const std::string& path) {
  const std::vector<uint8_t> bytes = ReadBytes(path);
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), values.size() * 4);
  return values;
}

// The golden rule: identical bits, except that +0 and -0 count as equal and any
// NaN equals any NaN.
inline bool SameValue(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == 0.0f && b == 0.0f) return true;
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// The manifest's cases, or an empty list when the golden directory is missing
// (the ManifestIsPresent test then fails and says where it looked).
inline std::vector<GoldenCase> GoldenCases(const std::string& op) {
  std::ifstream in(kGoldenDir + "/manifest.json");
  if (!in) return {};
  const nlohmann::json manifest = nlohmann::json::parse(in);
  std::vector<GoldenCase> selected;
  for (const auto& c : manifest["cases"]) {
    if (c["op"] == op) selected.push_back({c});
  }
  return selected;
}

inline std::string CaseFile(const GoldenCase& c, const char* key) {
  return kGoldenDir + "/" + c.json["files"][key]["path"].get<std::string>();
}

// The golden README's bound on a matmul output (item 7): K·2^-23·(|Aq| @ |Bq|)[i][j]
// for row-major Aq (M×K) and Bq (K×N).
inline double GoldenGemmBound(const std::vector<float>& aq, const std::vector<float>& bq, int64_t k,
                              int64_t n, int64_t i, int64_t j) {
  double magnitude = 0.0;
  for (int64_t t = 0; t < k; ++t) magnitude += std::fabs(double{aq[i * k + t]} * bq[t * n + j]);
  return static_cast<double>(k) * std::ldexp(1.0, -23) * magnitude;
}

// gtest parameter names must be alphanumeric.
inline std::string TestName(const std::string& id) {
  std::string name;
  for (char ch : id) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

}  // namespace mx_test

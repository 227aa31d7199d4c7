// The repository's own golden files (tests/golden/*.json, each written by the
// generator beside it): FP32 values travel as 8-digit hex bit patterns, so NaN
// payloads, signed zeros and subnormals survive the JSON.
#pragma once

#include <bit>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace mx_test {

inline std::vector<float> HexFloats(const nlohmann::json& hexes) {
  std::vector<float> out;
  for (const auto& h : hexes) {
    out.push_back(
        std::bit_cast<float>(static_cast<uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16))));
  }
  return out;
}

// A case's optional list (e.g. "bias"): empty for null.
inline std::vector<float> HexFloatsOrEmpty(const nlohmann::json& hexes) {
  return hexes.is_null() ? std::vector<float>{} : HexFloats(hexes);
}

// The parsed file, or an empty object when it cannot be read (the caller's
// count of cases then fails, naming what is missing).
inline nlohmann::json LoadGolden(const std::string& path) {
  std::ifstream in(path);
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

}  // namespace mx_test

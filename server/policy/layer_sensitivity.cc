#include "server/policy/layer_sensitivity.h"

#include <algorithm>
#include <array>
#include <map>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace mxserve {
namespace {

// Name fragments of attention projections across common model families:
// Llama/Qwen (self_attn.q_proj ...), GPT-2 (attn.c_attn, attn.c_proj), BERT
// (attention.self.query ...), and fused qkv layers.
constexpr std::array<absl::string_view, 8> kAttentionMarkers = {
    "attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv", "out_proj"};

}  // namespace

bool IsAttentionProjection(absl::string_view layer) {
  const std::string lower = absl::AsciiStrToLower(layer);
  return std::any_of(kAttentionMarkers.begin(), kAttentionMarkers.end(),
                     [&](absl::string_view marker) { return absl::StrContains(lower, marker); });
}

int BlockIndex(absl::string_view layer) {
  for (absl::string_view part : absl::StrSplit(layer, '.')) {
    int index = 0;
    if (!part.empty() && absl::ascii_isdigit(part[0]) && absl::SimpleAtoi(part, &index)) {
      return index;
    }
  }
  return -1;
}

std::vector<uint32_t> ToleranceRanks(const std::vector<std::string>& layers,
                                     const std::vector<std::string>& measured) {
  int first = -1, last = -1;
  for (const std::string& layer : layers) {
    const int block = BlockIndex(layer);
    if (block < 0) continue;
    first = first < 0 ? block : std::min(first, block);
    last = std::max(last, block);
  }
  // Sensitivity by the tiers of the header, higher = less tolerant.
  std::vector<int> sensitivity(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const int block = BlockIndex(layers[i]);
    const bool attention = IsAttentionProjection(layers[i]);
    if (block < 0) {
      sensitivity[i] = 4;
    } else if (block == first || block == last) {
      sensitivity[i] = attention ? 3 : 2;
    } else {
      sensitivity[i] = attention ? 1 : 0;
    }
  }
  // Most tolerant first; within a tier the earlier layer first.
  std::vector<uint32_t> order(layers.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return sensitivity[a] < sensitivity[b]; });

  if (!measured.empty()) {
    std::map<absl::string_view, size_t> measured_at;  // name → place in `measured`
    for (size_t i = 0; i < measured.size(); ++i) measured_at.emplace(measured[i], i);
    // The ranks measured layers hold, refilled with them in measured order.
    std::vector<size_t> slots;
    std::vector<std::pair<size_t, uint32_t>> by_measure;  // (place in measured, layer)
    for (size_t rank = 0; rank < order.size(); ++rank) {
      const auto it = measured_at.find(layers[order[rank]]);
      if (it == measured_at.end()) continue;
      slots.push_back(rank);
      by_measure.emplace_back(it->second, order[rank]);
    }
    std::sort(by_measure.begin(), by_measure.end());
    for (size_t i = 0; i < slots.size(); ++i) order[slots[i]] = by_measure[i].second;
  }

  std::vector<uint32_t> ranks(layers.size());
  for (size_t rank = 0; rank < order.size(); ++rank)
    ranks[order[rank]] = static_cast<uint32_t>(rank);
  return ranks;
}

}  // namespace mxserve

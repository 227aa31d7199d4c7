#include "server/policy/layer_sensitivity.h"

#include <algorithm>
#include <array>

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

bool IsAttentionProjection(absl::string_view layer) {
  const std::string lower = absl::AsciiStrToLower(layer);
  return std::any_of(kAttentionMarkers.begin(), kAttentionMarkers.end(),
                     [&](absl::string_view marker) { return absl::StrContains(lower, marker); });
}

}  // namespace

int BlockIndex(absl::string_view layer) {
  for (absl::string_view part : absl::StrSplit(layer, '.')) {
    int index = 0;
    if (!part.empty() && absl::ascii_isdigit(part[0]) && absl::SimpleAtoi(part, &index)) {
      return index;
    }
  }
  return -1;
}

std::vector<bool> DefaultSensitiveLayers(const std::vector<std::string>& layers) {
  int first = -1, last = -1;
  for (const std::string& layer : layers) {
    const int block = BlockIndex(layer);
    if (block < 0) continue;
    first = first < 0 ? block : std::min(first, block);
    last = std::max(last, block);
  }
  std::vector<bool> sensitive(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const int block = BlockIndex(layers[i]);
    sensitive[i] = block < 0 || block == first || block == last || IsAttentionProjection(layers[i]);
  }
  return sensitive;
}

}  // namespace mxserve

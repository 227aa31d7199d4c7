// Which layers of a model count as sensitive to quantization when no measured
// sensitivity profile is given (DESIGN.md, "Policies"): the first and last
// transformer blocks, the attention projections, and layers outside the blocks
// (embeddings, the LM head).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mxserve {

// The block index of a layer: its first dot-separated component that is a
// number ("model.layers.3.mlp.up_proj" → 3), or -1 when it has none.
int BlockIndex(absl::string_view layer);

// One flag per layer name, in order.
std::vector<bool> DefaultSensitiveLayers(const std::vector<std::string>& layers);

}  // namespace mxserve

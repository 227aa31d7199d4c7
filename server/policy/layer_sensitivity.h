// How tolerant each layer of a model is to quantization, as a ranking (rank 0 =
// the most tolerant). Policy rules "@tolerant:F" / "@sensitive:F" select by it
// (policy.h). A measured sensitivity profile orders the layers it covers
// (server/profile/generate.h, ProfileToleranceOrder); without one, or for layers
// it does not cover, the built-in ranking below does (DESIGN.md, "Policies").
//
// The built-in ranking, least tolerant first, in four tiers:
//   1. layers outside the transformer blocks (no block index: the LM head, value
//      and reward heads, embedding-like projections): they touch every token's
//      logits or score directly, and nothing downstream averages their error out;
//   2. the first and last blocks (attention before MLP): the first block sees raw
//      embeddings, the last feeds the head, the blocks the sensitivity
//      literature (and the origin, ORIGIN.md) keeps precise;
//   3. attention projections of the middle blocks: errors in q/k move softmax
//      logits, which quantization-aware work finds more fragile than MLPs;
//   4. MLPs of the middle blocks: the most tolerant.
// Within a tier, layers keep the model's order with the later layer counted less
// tolerant (deterministic; a tie has no better evidence either way).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mxserve {

// The block index of a layer: its first dot-separated component that is a
// number ("model.layers.3.mlp.up_proj" → 3), or -1 when it has none.
int BlockIndex(absl::string_view layer);

// Whether the name is an attention projection (q/k/v/o, fused qkv, GPT-2's
// attn.c_attn / attn.c_proj, BERT's attention.*).
bool IsAttentionProjection(absl::string_view layer);

// Each layer's tolerance rank (0 = most tolerant), a permutation of 0..n-1.
// `measured`: layer names most tolerant first (a profile's order; may cover
// only some layers; names the model lacks, and repeats, are ignored). The
// built-in ranking comes first; then the measured layers are reordered among
// the ranks they hold, by measurement. So a profile of every layer gives the
// measured order exactly, and a partial one (say, only the LM head) cannot lift
// a layer past unmeasured ones the built-in ranking counts more tolerant.
std::vector<uint32_t> ToleranceRanks(const std::vector<std::string>& layers,
                                     const std::vector<std::string>& measured = {});

}  // namespace mxserve

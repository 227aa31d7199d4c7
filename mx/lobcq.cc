#include "mx/lobcq.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace mx {
namespace {

// mxserve.torch.lobcq.default_codebooks(seed=35): entries ascending, codebooks
// in lexicographic order. tests/golden/lobcq.json pins them.
constexpr std::array<LoBcqCodebook, 16> kDefault = {{
    {{-31, -23, -18, -14, -10, -7, -4, -1, 1, 4, 7, 10, 14, 18, 23, 31}},
    {{-31, -23, -17, -13, -9, -6, -3, -1, 1, 3, 6, 9, 13, 17, 23, 31}},
    {{-29, -24, -19, -15, -11, -8, -4, -1, 1, 4, 7, 11, 15, 19, 24, 29}},
    {{-26, -22, -18, -14, -10, -7, -4, -1, 1, 4, 7, 10, 14, 18, 22, 26}},
    {{-24, -20, -16, -12, -9, -6, -4, -1, 1, 4, 6, 9, 12, 16, 20, 24}},
    {{-22, -19, -15, -12, -9, -6, -4, -1, 1, 3, 6, 9, 12, 15, 19, 22}},
    {{-21, -18, -14, -11, -8, -6, -3, -1, 1, 3, 6, 8, 11, 14, 18, 21}},
    {{-19, -16, -13, -10, -8, -5, -3, -1, 1, 3, 5, 8, 10, 13, 16, 19}},
    {{-18, -15, -12, -10, -7, -5, -3, -1, 1, 3, 5, 7, 10, 12, 15, 18}},
    {{-16, -14, -11, -9, -7, -5, -3, -1, 1, 3, 5, 7, 9, 11, 14, 16}},
    {{-15, -13, -11, -8, -6, -4, -3, -1, 1, 3, 4, 6, 8, 11, 13, 15}},
    {{-14, -12, -10, -8, -6, -4, -2, -1, 1, 2, 4, 6, 8, 10, 12, 14}},
    {{-13, -11, -9, -7, -5, -4, -2, -1, 1, 2, 4, 5, 7, 9, 11, 13}},
    {{-11, -10, -8, -6, -5, -3, -2, -1, 1, 2, 3, 5, 6, 8, 10, 11}},
    {{-10, -8, -7, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 7, 8, 10}},
    {{-7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8}},
}};

constexpr bool EntriesAreInt6() {
  for (const LoBcqCodebook& book : kDefault) {
    for (int8_t e : book) {
      if (e < -kLoBcqEntryMax || e > kLoBcqEntryMax) return false;
    }
  }
  return true;
}
static_assert(EntriesAreInt6());

}  // namespace

std::span<const LoBcqCodebook> DefaultLoBcqCodebooks() { return kDefault; }

absl::Status ValidateLoBcq(const LoBcqGeometry& g, std::span<const LoBcqCodebook> codebooks) {
  if (g.block_len < 1 || g.block_len > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_len: expected 1 to 64, got ", g.block_len));
  }
  if (g.array_len < g.block_len || g.array_len > kLoBcqMaxArray || g.array_len % g.block_len) {
    return absl::InvalidArgumentError(absl::StrCat("array_len: expected a multiple of block_len (",
                                                   g.block_len, ") up to ", kLoBcqMaxArray,
                                                   ", got ", g.array_len));
  }
  if (g.codebooks < 1 || g.codebooks > kLoBcqMaxCodebooks) {
    return absl::InvalidArgumentError(
        absl::StrCat("codebooks: expected 1 to 16 codebooks, got ", g.codebooks));
  }
  if (static_cast<int>(codebooks.size()) != g.codebooks) {
    return absl::InvalidArgumentError(absl::StrCat("codebooks: expected ", g.codebooks,
                                                   " codebooks, got ", codebooks.size()));
  }
  for (size_t j = 0; j < codebooks.size(); ++j) {
    for (int k = 0; k < 16; ++k) {
      if (std::abs(codebooks[j][k]) > kLoBcqEntryMax) {
        return absl::InvalidArgumentError(absl::StrCat("codebooks[", j, "][", k,
                                                       "]: expected an INT6 entry in [-31, 31], got ",
                                                       codebooks[j][k]));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<float> QuantizeLoBcqArray(const LoBcqGeometry& g,
                                         std::span<const LoBcqCodebook> codebooks,
                                         std::span<const float> values, std::span<uint8_t> codes,
                                         std::span<uint8_t> selectors) {
  if (absl::Status s = ValidateLoBcq(g, codebooks); !s.ok()) return s;
  if (values.size() > static_cast<size_t>(g.array_len)) {
    return absl::InvalidArgumentError(absl::StrCat("values: expected at most array_len (",
                                                   g.array_len, "), got ", values.size()));
  }
  if (codes.size() != values.size() ||
      selectors.size() != static_cast<size_t>(g.blocks_per_array())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codes, selectors: expected ", values.size(), " and ", g.blocks_per_array(), ", got ",
        codes.size(), " and ", selectors.size()));
  }
  std::fill(selectors.begin(), selectors.end(), 0);
  float amax = 0.0f;
  for (float v : values) {
    if (!std::isfinite(v)) {
      std::fill(codes.begin(), codes.end(), 0);
      return std::numeric_limits<float>::quiet_NaN();
    }
    amax = std::max(amax, std::fabs(v));
  }
  const float scale = amax / static_cast<float>(kLoBcqEntryMax);
  std::array<int64_t, kLoBcqMaxArray> t{};
  for (size_t i = 0; i < values.size(); ++i) {
    if (scale > 0.0f) {
      const float y = std::clamp(values[i] / scale, -32.0f, 32.0f);
      t[i] = static_cast<int64_t>(std::nearbyint(y * static_cast<float>(kLoBcqGrid)));
    }
  }
  // Per block, each codebook's nearest entries and their summed squared
  // distance; the first strictly smaller sum (entry, codebook) wins, so ties go
  // to the lowest index. The winning codebook's codes are kept as found.
  for (int b = 0; b * g.block_len < static_cast<int>(values.size()); ++b) {
    const int begin = b * g.block_len;
    const int end = std::min<int>(begin + g.block_len, static_cast<int>(values.size()));
    int64_t best_sum = std::numeric_limits<int64_t>::max();
    std::array<uint8_t, 64> block_codes;  // block_len <= 64
    for (int j = 0; j < g.codebooks; ++j) {
      int64_t sum = 0;
      for (int i = begin; i < end; ++i) {
        int best = 0;
        int64_t best_err = std::numeric_limits<int64_t>::max();
        for (int k = 0; k < 16; ++k) {
          const int64_t d = t[i] - int64_t{kLoBcqGrid} * codebooks[j][k];
          if (d * d < best_err) best = k, best_err = d * d;
        }
        block_codes[i - begin] = static_cast<uint8_t>(best);
        sum += best_err;
      }
      if (sum < best_sum) {
        best_sum = sum;
        selectors[b] = static_cast<uint8_t>(j);
        std::copy(block_codes.begin(), block_codes.begin() + (end - begin), codes.begin() + begin);
      }
    }
  }
  return scale;
}

}  // namespace mx

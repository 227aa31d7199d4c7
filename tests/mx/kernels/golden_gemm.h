// The float-path GEMM cases of a golden file (tests/golden/codebook.json,
// lobcq.json: {"id", "format_a", "format_b", "m", "k", "n", "a", "b", "bias",
// "c"}), each reproduced bit for bit by the reference Linear and GEMM and by the
// fast kernels at every ISA level this CPU runs, on a pool; the packed weight
// gives its operand back unchanged.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mx/kernels/cpu_features.h"
#include "mx/kernels/linear.h"
#include "mx/kernels/thread_pool.h"
#include "mx/packed.h"
#include "mx/reference_gemm.h"
#include "nlohmann/json.hpp"
#include "tests/golden_json.h"
#include "tests/same_bits.h"

namespace mx_test {

inline void ExpectEveryGoldenGemm(const nlohmann::json& cases) {
  mx::kernels::ThreadPool pool(2);
  for (const nlohmann::json& c : cases) {
    const std::string id = c.at("id");
    const mx::Format fa = mx::ParseFormat(c.at("format_a").get<std::string>()).value();
    const mx::Format fb = mx::ParseFormat(c.at("format_b").get<std::string>()).value();
    const int64_t m = c.at("m"), k = c.at("k"), n = c.at("n");
    const std::vector<float> a = HexFloats(c.at("a")), b = HexFloats(c.at("b"));
    const std::vector<float> want = HexFloats(c.at("c")), bias = HexFloatsOrEmpty(c.at("bias"));
    const mx::QuantizedMatrix qa = *mx::QuantizeRows(a, m, k, fa);
    const mx::QuantizedMatrix qb = *mx::QuantizeColumns(b, k, n, fb);
    EXPECT_TRUE(SameBitsAll(*mx::ReferenceLinear(qa, qb, bias), want)) << id;
    if (bias.empty()) {
      EXPECT_TRUE(SameBitsAll(*mx::ReferenceGemm(a, fa, b, fb, m, k, n), want)) << id;
    }
    const mx::kernels::PackedWeight w = *mx::kernels::PackedWeight::Pack(qb);
    for (const mx::kernels::Isa isa : mx::kernels::AvailableIsas()) {
      std::vector<float> y(m * n);
      const auto info = mx::kernels::Linear(qa, w, bias, y, {.isa = isa, .pool = &pool});
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_TRUE(SameBitsAll(y, want)) << id << " " << info->name;
    }
    const mx::QuantizedMatrix back = w.Unpacked();
    EXPECT_EQ(back.elements, qb.elements) << id;
    EXPECT_EQ(back.block_scales, qb.block_scales) << id;
  }
}

}  // namespace mx_test

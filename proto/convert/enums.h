// The one rule that names a wire enum value for people, for every enum of
// mxserve.v1, read from the generated descriptors: the value's name lower-cased
// without its enum's prefix, the enum's type name in UPPER_SNAKE_CASE (a word
// starts at a capital after a lower-case letter or digit) and "_"
// (PHASE_ROLLOUT → "rollout", SCORE_REL_ERROR → "rel_error", COST_METRIC_TIME →
// "time", DTYPE_BF16 → "bf16"). The daemon's metric labels and messages, mxctl's flags and the Python
// client (mxserve/_wire.py) all follow it; mxserve_format_table prints every
// enum's names so clients/python/tests/test_enums.py pins the Python side, and
// tests/proto_test.cc pins this one.
//
// EnumMap ties an enum of the daemon's own (server::Phase, profile::ScoreKind, …)
// to its wire enum by that name, so no room writes a value-by-value table.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace mxserve {

using google::protobuf::EnumDescriptor;

// "PHASE_" for mxserve.v1.Phase, "COST_METRIC_" for CostMetric, "DTYPE_" for DType.
std::string WireEnumPrefix(const EnumDescriptor& e);

// The rule's name of `number`; "<type lower-cased>#N" ("phase#9") for a number
// outside the enum.
std::string WireName(const EnumDescriptor& e, int number);

// The number a person's `text` names: the short name or the full wire name, any
// case; nullopt for anything else.
std::optional<int> ParseWireName(const EnumDescriptor& e, absl::string_view text);

// The values for a message's "expected …": "rollout, reward or update" (short)
// or "PHASE_ROLLOUT, PHASE_REWARD or PHASE_UPDATE" (full), in declaration order
// (number order in mxserve.v1), without the enum's <PREFIX>UNSPECIFIED (which
// no field accepts as a choice) unless `with_unspecified`.
std::string WireNameList(const EnumDescriptor& e, bool full, bool with_unspecified = false);

// "a, b or c".
std::string JoinWithOr(const std::vector<std::string>& names);

// EnumMap's answer to an own name no wire value has: a message, then abort.
[[noreturn]] void AbortUnknownWireName(const EnumDescriptor& e, absl::string_view name);

template <typename E>
const EnumDescriptor& DescriptorOf() {
  return *google::protobuf::GetEnumDescriptor<E>();
}
template <typename E>
std::string WireName(E value) {
  return WireName(DescriptorOf<E>(), static_cast<int>(value));
}
template <typename E>
std::optional<E> ParseWireName(absl::string_view text) {
  const std::optional<int> number = ParseWireName(DescriptorOf<E>(), text);
  if (!number) return std::nullopt;
  return static_cast<E>(*number);
}

// An enum of the daemon's own, `Own`, tied to the wire enum `Wire` by name:
// `all` lists every value of Own and `name` gives each its name, which must be
// the rule's name of one wire value (the constructor aborts otherwise: a build
// error in all but name, caught by the first test that makes the map).
template <typename Own, typename Wire>
class EnumMap {
 public:
  template <typename Name>
  EnumMap(std::span<const Own> all, Name name) {
    for (const Own own : all) {
      const std::optional<Wire> wire = ParseWireName<Wire>(name(own));
      if (!wire) AbortUnknownWireName(DescriptorOf<Wire>(), name(own));
      pairs_.push_back({own, *wire});
    }
  }
  // The wire value of `own`.
  Wire ToWire(Own own) const {
    for (const Pair& p : pairs_) {
      if (p.own == own) return p.wire;
    }
    return static_cast<Wire>(0);
  }
  // "REFERENCE_FP32 or REFERENCE_FP64": the wire names FromWire takes, in the
  // order of `all`, for a message's "expected …".
  std::string WireNames() const {
    std::vector<std::string> names;
    for (const Pair& p : pairs_) names.push_back(DescriptorOf<Wire>().FindValueByNumber(p.wire)->name());
    return JoinWithOr(names);
  }
  // The own value of `wire`; nullopt for a wire value Own has no name for
  // (UNSPECIFIED, or a number outside the enum).
  std::optional<Own> FromWire(Wire wire) const {
    for (const Pair& p : pairs_) {
      if (p.wire == wire) return p.own;
    }
    return std::nullopt;
  }

 private:
  struct Pair {
    Own own;
    Wire wire;
  };
  std::vector<Pair> pairs_;  // a handful: a scan beats a map
};

}  // namespace mxserve

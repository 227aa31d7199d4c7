// A small command-line flag reader for mxctl's subcommands: `--name value` or
// `--name=value`, every flag declared up front so a typo is an error, not a no-op.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mxctl {

class Flags {
 public:
  // `known` lists the flag names without dashes. Fails on an unknown flag, a flag
  // without a value, a repeated flag, or a stray positional argument.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::vector<std::string>& known);

  bool Has(const std::string& name) const { return values_.contains(name); }
  std::optional<std::string> Get(const std::string& name) const;
  absl::StatusOr<std::string> Require(const std::string& name) const;
  // A required integer in [min, max]; the error names the flag.
  absl::StatusOr<int64_t> RequireInt(const std::string& name, int64_t min, int64_t max) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace mxctl

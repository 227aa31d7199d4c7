// A small command-line flag reader for mxctl's subcommands: `--name value` or
// `--name=value`, every flag declared up front so a typo is an error, not a no-op.
// Switches (`--json`) take no value; repeatable flags (`--layer`) may be given
// more than once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mxctl {

// The flags a subcommand accepts, names without dashes.
struct FlagSpec {
  std::vector<std::string> values = {};      // `--name value`, at most once
  std::vector<std::string> switches = {};    // `--name` alone (or `--name=true|false`)
  std::vector<std::string> repeatable = {};  // `--name value`, any number of times
};

class Flags {
 public:
  // `known` lists the flag names without dashes. Fails on an unknown flag, a flag
  // without a value, a repeated flag, or a stray positional argument.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::vector<std::string>& known);
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args, const FlagSpec& spec);

  bool Has(const std::string& name) const { return values_.contains(name); }
  std::optional<std::string> Get(const std::string& name) const;
  // Every value of a repeatable flag, in command-line order.
  std::vector<std::string> GetAll(const std::string& name) const;
  // Whether a switch was given (and not as `--name=false`).
  bool Switch(const std::string& name) const;
  absl::StatusOr<std::string> Require(const std::string& name) const;
  // A required integer in [min, max]; the error names the flag.
  absl::StatusOr<int64_t> RequireInt(const std::string& name, int64_t min, int64_t max) const;
  // An optional integer in [min, max], `fallback` when the flag is absent.
  absl::StatusOr<int64_t> IntOr(const std::string& name, int64_t fallback, int64_t min,
                                int64_t max) const;
  // An optional duration ("10s", "500ms", "1m", or plain seconds such as "2.5"),
  // at least zero; `fallback` when the flag is absent.
  absl::StatusOr<absl::Duration> DurationOr(const std::string& name, absl::Duration fallback) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// Removes and returns the first word of `args` when it is not a flag (a
// subcommand's positional operand, e.g. `policy get NAME`).
std::optional<std::string> TakeWord(std::vector<std::string>& args);

// A command's subcommands (`models list`, `policy get`), named once for its
// usage errors and for `mxctl COMMAND VERB --help`.
struct Subcommands {
  const char* command;             // "models"
  std::vector<std::string> verbs;  // in the order the messages list them

  // "list, register, ... or delete".
  std::string List() const;
  // "models: expected list, register, ... or delete".
  absl::Status Missing() const;
  // "models: unknown subcommand 'bogus'; expected list, register, ... or delete".
  absl::Status Unknown(const std::string& verb) const;
  // OK where `args` names no subcommand (its first word is absent or a flag) or
  // one of these; Unknown otherwise.
  absl::Status Check(std::vector<std::string> args) const;
};

}  // namespace mxctl

// Early returns for absl::Status / absl::StatusOr, shared by every module.
//
//   MX_RETURN_IF_ERROR(WriteFile(path, data));
//   MX_ASSIGN_OR_RETURN(auto flags, Flags::Parse(args, known));   // declares
//   MX_ASSIGN_OR_RETURN(policy.name, StringField(json, "name"));  // assigns
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MX_STATUS_CONCAT_INNER(a, b) a##b
#define MX_STATUS_CONCAT(a, b) MX_STATUS_CONCAT_INNER(a, b)

#define MX_RETURN_IF_ERROR(expr)                                                \
  if (::absl::Status MX_STATUS_CONCAT(status_, __LINE__) = (expr);             \
      !MX_STATUS_CONCAT(status_, __LINE__).ok())                               \
  return MX_STATUS_CONCAT(status_, __LINE__)

#define MX_ASSIGN_OR_RETURN(lhs, expr) \
  MX_ASSIGN_OR_RETURN_IMPL(MX_STATUS_CONCAT(status_or_, __LINE__), lhs, expr)
#define MX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

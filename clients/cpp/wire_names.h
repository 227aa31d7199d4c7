// Names of the wire enums (Phase, Format) as people type and read them. The
// mapping between the wire Format and mx::Format is proto/convert/formats.h, the
// phase names proto/convert/enums.h.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "mxserve/v1/common.pb.h"
#include "proto/convert/formats.h"
#include "proto/convert/enums.h"

namespace mxclient {

namespace v1 = ::mxserve::v1;

// "rollout", "reward", "update" (any case), or the wire names "PHASE_ROLLOUT", ….
absl::StatusOr<v1::Phase> ParsePhase(absl::string_view name);
// Phase names: mxserve::PhaseName (proto/convert/enums.h).

// A format name as mxctl accepts it (mx::ParseFormat), or "policy"/"auto" for
// FORMAT_UNSPECIFIED (let the model's active policy choose).
absl::StatusOr<v1::Format> ParseWireFormat(absl::string_view name);
// "MXFP4_E2M1", …; "policy" for FORMAT_UNSPECIFIED.
std::string WireFormatName(v1::Format format);

}  // namespace mxclient

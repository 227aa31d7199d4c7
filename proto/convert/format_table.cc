// mxserve_format_table: the C++ format table and the names of every wire enum as
// JSON, for the Python client's tests that its own tables match
// (clients/python/tests/test_wire.py, test_enums.py):
//   {"formats": [{"name": "MXFP8_E4M3", "wire": 1, "wire_name": "FORMAT_MXFP8_E4M3"}, ...],
//    "aliases": {"MXFP8": "MXFP8_E4M3", ...},
//    "enums": {"mxserve.v1.Phase": {"0": "unspecified", "1": "rollout", ...}, ...}}
// Formats in mx::Format order, enums by file then declaration; every name is a
// plain identifier, so nothing needs escaping.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "mx/format.h"
#include "mxserve/v1/common.pb.h"
#include "mxserve/v1/compute.pb.h"
#include "mxserve/v1/models.pb.h"
#include "mxserve/v1/policies.pb.h"
#include "mxserve/v1/profiles.pb.h"
#include "mxserve/v1/telemetry.pb.h"
#include "proto/convert/enums.h"
#include "proto/convert/formats.h"

namespace {

// Every .proto file of the API, through a message each declares.
const google::protobuf::FileDescriptor* const kApiFiles[] = {
    mxserve::v1::Tensor::descriptor()->file(),
    mxserve::v1::GemmRequest::descriptor()->file(),
    mxserve::v1::RegisterModelRequest::descriptor()->file(),
    mxserve::v1::PutPolicyRequest::descriptor()->file(),
    mxserve::v1::ProfileRequest::descriptor()->file(),
    mxserve::v1::ReportWorkRequest::descriptor()->file(),
};

}  // namespace

int main() {
  std::string json = "{\"formats\": [";
  for (const mx::FormatTraits& t : mx::AllFormats()) {
    const mxserve::v1::Format wire = mxserve::ToProto(t.format);
    absl::StrAppend(&json, &t == mx::AllFormats().data() ? "" : ", ", "{\"name\": \"", t.name,
                    "\", \"wire\": ", static_cast<int>(wire), ", \"wire_name\": \"",
                    mxserve::v1::Format_Name(wire), "\"}");
  }
  absl::StrAppend(&json, "], \"aliases\": {");
  for (const mx::FormatAlias& a : mx::FormatAliases()) {
    absl::StrAppend(&json, &a == mx::FormatAliases().data() ? "" : ", ", "\"", a.name, "\": \"",
                    mx::FormatName(a.format), "\"");
  }
  absl::StrAppend(&json, "}, \"enums\": {");
  const char* enum_separator = "";
  for (const google::protobuf::FileDescriptor* file : kApiFiles) {
    for (int i = 0; i < file->enum_type_count(); ++i) {
      const google::protobuf::EnumDescriptor& e = *file->enum_type(i);
      absl::StrAppend(&json, enum_separator, "\"", e.full_name(), "\": {");
      enum_separator = ", ";
      for (int v = 0; v < e.value_count(); ++v) {
        const int number = e.value(v)->number();
        absl::StrAppend(&json, v == 0 ? "" : ", ", "\"", number, "\": \"",
                        mxserve::WireName(e, number), "\"");
      }
      absl::StrAppend(&json, "}");
    }
  }
  absl::StrAppend(&json, "}}\n");
  std::fputs(json.c_str(), stdout);
  return 0;
}

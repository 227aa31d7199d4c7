// mxserve_format_table: the C++ format table as JSON, for the Python client's test
// that its own table matches (clients/python/tests/test_wire.py):
//   {"formats": [{"name": "MXFP8_E4M3", "wire": 1, "wire_name": "FORMAT_MXFP8_E4M3"}, ...],
//    "aliases": {"MXFP8": "MXFP8_E4M3", ...}}
// Formats in mx::Format order; every name is a plain identifier, so nothing needs escaping.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "mx/format.h"
#include "proto/convert/formats.h"

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
  absl::StrAppend(&json, "}}\n");
  std::fputs(json.c_str(), stdout);
  return 0;
}

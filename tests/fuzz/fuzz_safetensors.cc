// Fuzz target: the safetensors reader. The input is read both as a header (the
// JSON parser and its checks) and as a whole file (length field, header, data
// ranges). Whatever the reader accepts it must be able to read back: every
// tensor it lists lies inside the file and widens to exactly its element count.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "mx/format.h"
#include "server/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  (void)mxserve::ParseSafetensorsHeader(input, 1 << 16);

  mxserve::UniqueFd fd(::memfd_create("safetensors", MFD_CLOEXEC));
  if (!fd.valid() || ::write(fd.get(), data, size) != static_cast<ssize_t>(size)) std::abort();
  auto file = mxserve::SafetensorsFile::Read(std::move(fd), "fuzz");
  if (!file.ok()) return 0;
  uint64_t previous_end = 0;
  for (const mxserve::SafetensorsTensor& t : file->tensors()) {
    if (t.begin < previous_end) std::abort();  // overlaps must have been refused
    previous_end = t.end;
    if (t.end - t.begin > (1u << 20)) continue;
    auto values = file->ReadFloat32(t.name);
    if (!values.ok()) std::abort();
    const uint64_t width = mx::Traits(t.dtype).element_bits / 8;
    if (values->size() != (t.end - t.begin) / width) std::abort();
  }
  return 0;
}

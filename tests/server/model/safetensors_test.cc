// Safetensors reading on small files the test writes, valid and broken.
#include "server/model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "mx/element.h"
#include "server/model/model_dirs.h"

namespace mxserve {
namespace {

class Safetensors : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "safetensors.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes length (little-endian u64, or `length_override`), header and data.
  std::string Write(const std::string& header, const std::string& data,
                    int64_t length_override = -1) {
    // Appends, not "f" + std::string: GCC 12 warns falsely (-Wrestrict) on the latter.
    std::string name = std::to_string(count_++);
    name.append(".safetensors");
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    uint64_t length = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
    out << header << data;
    return path;
  }

  std::filesystem::path dir_;
  int count_ = 0;
};

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

TEST_F(Safetensors, ReadsF32Bf16AndF16Tensors) {
  const std::vector<float> w = {1.0f, -2.0f, 0.5f, 3.25f, 0.0f, -0.125f};
  const std::vector<uint16_t> b = {mx::FloatToBf16(1.5f), mx::FloatToBf16(-3.0f)};
  const std::vector<uint16_t> h = {mx::FloatToFp16(0.25f), mx::FloatToFp16(-65504.0f)};
  const std::string header =
      R"({"__metadata__": {"format": "pt"},
          "layer.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
          "layer.bias": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
          "other": {"dtype": "F16", "shape": [2], "data_offsets": [28, 32]}})";
  const std::string path = Write(header, Bytes(w) + Bytes(b) + Bytes(h));
  const SafetensorsFile file = SafetensorsFile::Open(path).value();
  ASSERT_EQ(file.tensors().size(), 3u);
  const SafetensorsTensor* weight = file.Find("layer.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(weight->dtype, mx::Format::kFp32);
  EXPECT_EQ(file.ReadFloat32("layer.weight").value(), w);
  EXPECT_EQ(file.ReadFloat32("layer.bias").value(), (std::vector<float>{1.5f, -3.0f}));
  EXPECT_EQ(file.ReadFloat32("other").value(), (std::vector<float>{0.25f, -65504.0f}));
  EXPECT_EQ(file.ReadFloat32("missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(Safetensors, BrokenFilesAreRejectedWithTheReason) {
  const std::string ok_entry = R"("t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::string data(8, '\0');
  const std::pair<std::string, std::string> cases[] = {
      {Write("", "", 1000),
       "not a safetensors file (its header length field exceeds the file's 8 bytes or the "
       "104857600-byte limit)"},
      {Write("{" + ok_entry, data),
       "safetensors header: not valid JSON: parse error at line 1, column 61: syntax error while "
       "parsing object - unexpected end of input"},
      {Write("[1]", data), "safetensors header: not a JSON object"},
      {Write(R"({"t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", data),
       "tensor 't': dtype 'I64' unsupported; expected F32, BF16 or F16"},
      {Write(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", data),
       "tensor 't': 8 bytes of data for 3 F32 elements"},
      {Write(R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", data),
       "tensor 't': data_offsets [0, 16) outside the 8-byte data section"},
      {Write(R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data),
       "tensor 't': shape must hold non-negative integers"},
      {Write(R"({"t": {"dtype": "F32", "shape": [2]}})", data),
       "tensor 't': expected an object with dtype, shape and data_offsets"},
  };
  for (const auto& [path, reason] : cases) {
    const auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << reason;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(file.status().message().find(reason), absl::string_view::npos) << file.status();
  }
  // Shorter than the length prefix itself.
  const std::string tiny = (dir_ / "tiny").string();
  std::ofstream(tiny) << "abc";
  EXPECT_NE(SafetensorsFile::Open(tiny).status().message().find("shorter than the 8-byte"),
            absl::string_view::npos);
  EXPECT_EQ(SafetensorsFile::Open((dir_ / "absent").string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(SafetensorsFile::Open(Write("{" + ok_entry + "}", data)).ok());
}

TEST_F(Safetensors, ErrorsNeverRepeatTheFilesBytes) {
  // The first 8 bytes of /etc/shadow read as a header length: "root:*:2".
  const std::string path = (dir_ / "shadow").string();
  std::ofstream(path) << "root:*:20000:0:99999:7:::\n";
  uint64_t as_length;
  std::memcpy(&as_length, "root:*:2", 8);
  const absl::Status s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().find(std::to_string(as_length)), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find("root"), absl::string_view::npos) << s;
  // A header that is broken JSON: its position is named, none of its text (the
  // JSON parser's own message quotes what it last read).
  for (const std::string header : {R"({"secret-a1": 1 "b"})", R"({"secret-a1" 1})",
                                   "{\"secret-a1\": tru}", "[\"secret-a1\""}) {
    const absl::StatusOr<std::vector<SafetensorsTensor>> parsed =
        ParseSafetensorsHeader(header, 0);
    ASSERT_FALSE(parsed.ok()) << header;
    EXPECT_NE(parsed.status().message().find("parse error at line 1, column "),
              absl::string_view::npos) << parsed.status();
    EXPECT_EQ(parsed.status().message().find("secret"), absl::string_view::npos)
        << parsed.status();
  }
}

TEST(SafetensorsHeader, OverlappingRangesAreRefused) {
  // The format forbids tensors that share bytes, in any order in the header.
  const auto parsed = ParseSafetensorsHeader(
      R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
          "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
      12);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find(
                "tensors 'a' and 'b' overlap (data_offsets [0, 8) and [4, 12))"),
            absl::string_view::npos)
      << parsed.status();
  // Adjacent ranges and empty tensors at a boundary are fine; order is by data.
  const auto fine = ParseSafetensorsHeader(
      R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
          "e": {"dtype": "F16", "shape": [0], "data_offsets": [8, 8]},
          "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
      16);
  ASSERT_TRUE(fine.ok()) << fine.status();
  ASSERT_EQ(fine->size(), 3u);
  EXPECT_EQ((*fine)[0].name, "a");
  EXPECT_EQ((*fine)[2].name, "b");
}

// nlohmann keeps the last of a repeated key: a tensor listed twice loaded as
// the second listing (found by a black-box test).
TEST(SafetensorsHeader, ARepeatedNameOrFieldIsRefused) {
  const auto twice = ParseSafetensorsHeader(
      R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
      12);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.status().message(),
            "safetensors header: 'w' is given twice; each tensor and field may appear once");
  const auto field = ParseSafetensorsHeader(
      R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "dtype": "F16"}})", 8);
  ASSERT_FALSE(field.ok());
  EXPECT_EQ(field.status().message(),
            "safetensors header: 'w.dtype' is given twice; each tensor and field may appear once");
}

TEST(SafetensorsHeader, HugeShapesDoNotWrap) {
  // 2^32 · 2^32 elements wrapped to 0 in unchecked arithmetic and matched 0 bytes.
  const auto parsed = ParseSafetensorsHeader(
      R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("too many elements"), absl::string_view::npos)
      << parsed.status();
}

class ModelDirsTest : public Safetensors {};

TEST_F(ModelDirsTest, OpensOnlyInsideTheDirectoriesAsSpelledOrResolved) {
  std::filesystem::create_directory(dir_ / "models");
  std::filesystem::create_directory_symlink(dir_ / "models", dir_ / "alias");
  std::ofstream(dir_ / "models" / "w.safetensors") << "x";
  std::ofstream(dir_ / "outside.safetensors") << "x";
  auto dirs = ModelDirs::Create({(dir_ / "alias").string()});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  EXPECT_TRUE(dirs->Open("w.safetensors", "path").ok());
  EXPECT_TRUE(dirs->Open((dir_ / "alias" / "w.safetensors").string(), "path").ok());
  EXPECT_TRUE(dirs->Open((dir_ / "models" / "w.safetensors").string(), "path").ok());
  for (const std::string& path :
       {(dir_ / "outside.safetensors").string(), std::string("../outside.safetensors"),
        (dir_ / "alias" / ".." / "outside.safetensors").string()}) {
    EXPECT_EQ(dirs->Open(path, "path").status().code(), absl::StatusCode::kPermissionDenied)
        << path;
  }
  // An empty path was PERMISSION_DENIED ("not inside..."): it is missing.
  const absl::Status empty = dirs->Open("", "path").status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(),
            "path: required (a file inside a --model-dir, absolute or relative to it)");
  EXPECT_EQ(ModelDirs::Create({(dir_ / "absent").string()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelDirs::Create({}).value().Open("x", "path").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mxserve

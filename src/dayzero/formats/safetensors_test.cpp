#include "dayzero/formats/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace dz::formats {
namespace safetensors_test {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The 8-byte little-endian length, the header as given, then the data buffer.
std::string file_bytes(std::string_view header, std::string_view data = "") {
  std::string bytes(8, '\0');
  uint64_t header_bytes = header.size();
  for (int i = 0; i < 8; ++i)
    bytes[size_t(i)] = static_cast<char>((header_bytes >> (8 * i)) & 0xFF);
  return bytes.append(header).append(data);
}

std::string entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  uint64_t begin, uint64_t end) {
  return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype,
                     shape, begin, end);
}

Status validate(const std::string& bytes) {
  return SafetensorsFile::validate(std::as_bytes(std::span(bytes.data(), bytes.size())),
                                   "x.safetensors");
}

// Validates header + data and expects the exact error message after "x.safetensors: ".
void expect_error(std::string_view header, std::string_view data, StatusCode code,
                  std::string_view message) {
  Status status = validate(file_bytes(header, data));
  EXPECT_EQ(status.code(), code) << status.to_string();
  EXPECT_EQ(status.message(), fmt::format("x.safetensors: {}", message));
}

std::string random_bytes(std::mt19937& rng, size_t num_bytes) {
  std::string bytes(num_bytes, '\0');
  for (auto& byte : bytes) byte = static_cast<char>(rng() & 0xFF);
  return bytes;
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("dz_st_test_{}_{}", ::getpid(), std::random_device{}());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::string path = (path_ / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return path;
  }

 private:
  std::filesystem::path path_;
};

constexpr std::string_view kAccepted =
    "BF16, F16, F32, F8_E4M3, F8_E5M2, F8_E8M0, U8, I8, I32, I64, BOOL";

TEST(SafetensorsFile, OpensAndViewsRandomTensors) {
  std::mt19937 rng(1234);
  struct Spec {
    std::string name, dtype, shape;
    DType expected_dtype;
    Shape expected_shape;
    size_t num_bytes;
  };
  // Header order differs from name order and from offset order on purpose.
  std::vector<Spec> specs = {
      {"z.weight", "F32", "[3,5]", DType::kF32, {3, 5}, 60},
      {"a.bias", "BF16", "[7]", DType::kBF16, {7}, 14},
      {"m.codes", "F8_E4M3", "[2,3,4]", DType::kF8E4M3, {2, 3, 4}, 24},
      {"m.scale", "F8_E8M0", "[3]", DType::kF8E8M0, {3}, 3},
      {"ids", "I64", "[2]", DType::kI64, {2}, 16},
      {"mask", "BOOL", "[1,3]", DType::kBool, {1, 3}, 3},
      {"empty", "F32", "[0,4]", DType::kF32, {0, 4}, 0},
      {"step", "I32", "[]", DType::kI32, {}, 4},
      {"e5", "F8_E5M2", "[5]", DType::kF8E5M2, {5}, 5},
      {"h", "F16", "[1]", DType::kF16, {1}, 2},
      {"u", "U8", "[2]", DType::kU8, {2}, 2},
      {"i", "I8", "[1,1,1,1,1,1]", DType::kI8, {1, 1, 1, 1, 1, 1}, 1},
  };
  std::vector<std::string> contents;
  std::vector<uint64_t> begins(specs.size());
  // Lay the data out in reverse header order.
  std::string data;
  for (size_t i = specs.size(); i-- > 0;) {
    begins[i] = data.size();
    contents.insert(contents.begin(), random_bytes(rng, specs[i].num_bytes));
    data += contents.front();
  }
  std::string header = R"({"__metadata__":{"format":"pt","note":"ü"},)";
  for (size_t i = 0; i < specs.size(); ++i) {
    header += entry(specs[i].name, specs[i].dtype, specs[i].shape, begins[i],
                    begins[i] + specs[i].num_bytes);
    header += i + 1 < specs.size() ? "," : "}";
  }
  header.append((8 - header.size() % 8) % 8, ' ');  // writers pad the header with spaces

  TempDir dir;
  std::string path = dir.write("model.safetensors", file_bytes(header, data));
  Result<SafetensorsFile> file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->data_offset_bytes(), 8 + header.size());
  EXPECT_EQ(file->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "ü"}}));
  ASSERT_EQ(file->tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& info = file->tensors()[i];
    SCOPED_TRACE(specs[i].name);
    EXPECT_EQ(info.name, specs[i].name);
    EXPECT_EQ(info.dtype, specs[i].expected_dtype);
    EXPECT_EQ(info.shape, specs[i].expected_shape);
    EXPECT_EQ(info.data_begin_bytes, begins[i]);
    EXPECT_EQ(info.size_bytes, specs[i].num_bytes);
    EXPECT_EQ(file->find(specs[i].name), &info);
    auto bytes = file->tensor_bytes(info);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), contents[i]);
    TensorView view = file->view(info);
    EXPECT_EQ(view.data(), bytes.data());
    EXPECT_EQ(view.dtype(), specs[i].expected_dtype);
    EXPECT_EQ(view.shape(), specs[i].expected_shape);
    EXPECT_EQ(view.size_bytes(), int64_t(specs[i].num_bytes));
  }
  EXPECT_EQ(file->find("missing"), nullptr);
  // The scalar reads back as one I32.
  const TensorInfo* step = file->find("step");
  int32_t step_value;
  std::memcpy(&step_value, file->tensor_bytes(*step).data(), 4);
  int32_t expected_step;
  std::memcpy(&expected_step, contents[7].data(), 4);
  EXPECT_EQ(step_value, expected_step);
  EXPECT_EQ(file->view(*step).rank(), 0);
  EXPECT_EQ(file->view(*step).num_elems(), 1);
}

TEST(SafetensorsFile, MoveKeepsViewsValid) {
  std::mt19937 rng(7);
  std::string data = random_bytes(rng, 12);
  TempDir dir;
  std::string path =
      dir.write("m.safetensors", file_bytes("{" + entry("w", "F32", "[3]", 0, 12) + "}", data));
  Result<SafetensorsFile> opened = SafetensorsFile::open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  SafetensorsFile file = std::move(opened).value();
  auto bytes = file.tensor_bytes(*file.find("w"));
  EXPECT_EQ(std::memcmp(bytes.data(), data.data(), 12), 0);
}

TEST(SafetensorsFile, AcceptsWhitespaceAroundTheHeader) {
  std::string header = " \t\r\n{" + entry("w", "U8", "[4]", 0, 4) + "}\n  \t ";
  EXPECT_TRUE(validate(file_bytes(header, "abcd")).ok());
}

TEST(SafetensorsFile, AcceptsAnEmptyFileAndZeroSizeTensorsAnywhere) {
  EXPECT_TRUE(validate(file_bytes("{}")).ok());
  EXPECT_TRUE(validate(file_bytes("{}        ")).ok());
  // Empty tensors at the start, in the middle (sharing BEGIN with a full one) and at the end.
  std::string header = "{" + entry("a", "F32", "[0]", 0, 0) + "," + entry("b", "U8", "[2]", 0, 2) +
                       "," + entry("c", "F16", "[3,0]", 2, 2) + "," +
                       entry("d", "U8", "[1]", 2, 3) + "," + entry("e", "I64", "[0]", 3, 3) + "}";
  EXPECT_TRUE(validate(file_bytes(header, "xyz")).ok());
}

TEST(SafetensorsFile, ReportsMisalignedTensors) {
  std::mt19937 rng(3);
  std::string data = random_bytes(rng, 1 + 8);
  std::string header =
      "{" + entry("b", "U8", "[1]", 0, 1) + "," + entry("f", "F32", "[2]", 1, 9) + "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  TempDir dir;
  Result<SafetensorsFile> file =
      SafetensorsFile::open(dir.write("m.safetensors", file_bytes(header, data)));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_TRUE(file->is_aligned(*file->find("b")));
  EXPECT_FALSE(file->is_aligned(*file->find("f")));
  EXPECT_EQ(std::memcmp(file->tensor_bytes(*file->find("f")).data(), data.data() + 1, 8), 0);
}

TEST(SafetensorsFile, OpenNamesAMissingFile) {
  Result<SafetensorsFile> file = SafetensorsFile::open("/nonexistent/dir/model.safetensors");
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), StartsWith("/nonexistent/dir/model.safetensors: "));
}

TEST(SafetensorsFile, OpenErrorsNameThePath) {
  TempDir dir;
  std::string path = dir.write("bad.safetensors", file_bytes("{}", "zz"));
  Result<SafetensorsFile> file = SafetensorsFile::open(path);
  EXPECT_EQ(file.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(file.status().message(),
            path + ": header lists no tensors, but the data buffer holds 2 bytes");
}

// §3.1 item 1.

TEST(SafetensorsFile, RefusesAFileShorterThanTheLength) {
  Status status = validate(std::string(5, '\0'));
  EXPECT_EQ(status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(status.message(),
            "x.safetensors: file is 5 bytes, too short for the 8-byte header length");
  EXPECT_EQ(validate("").message(),
            "x.safetensors: file is 0 bytes, too short for the 8-byte header length");
}

TEST(SafetensorsFile, RefusesAHeaderAboveTheLimit) {
  std::string bytes = file_bytes("{}");
  uint64_t header_bytes = 100'000'001;
  std::memcpy(bytes.data(), &header_bytes, 8);  // x86-64 is little-endian
  Status status = validate(bytes);
  EXPECT_EQ(status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(status.message(),
            "x.safetensors: header length 100000001 exceeds the limit of 100000000 bytes");
  header_bytes = ~uint64_t{0};
  std::memcpy(bytes.data(), &header_bytes, 8);
  EXPECT_THAT(validate(bytes).message(), HasSubstr("header length 18446744073709551615 exceeds"));
}

TEST(SafetensorsFile, RefusesAHeaderLongerThanTheFile) {
  std::string bytes = file_bytes(std::string(20, ' '));
  uint64_t header_bytes = 100;
  std::memcpy(bytes.data(), &header_bytes, 8);
  Status status = validate(bytes);
  EXPECT_EQ(status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(status.message(),
            "x.safetensors: header length 100 needs 8 + 100 = 108 bytes, but the file is 28 bytes");
}

// §3.1 item 2.

TEST(SafetensorsFile, RefusesInvalidUtf8) {
  expect_error("{\"a\xff\":1}", "", StatusCode::kCorrupt,
               "header is not valid UTF-8 (byte 0xFF at header offset 3)");
  expect_error("{\"\xc0\xaf\":1}", "", StatusCode::kCorrupt,  // overlong '/'
               "header is not valid UTF-8 (byte 0xC0 at header offset 2)");
  expect_error("{\"\xed\xa0\x80\":1}", "", StatusCode::kCorrupt,  // a UTF-16 surrogate
               "header is not valid UTF-8 (byte 0xED at header offset 2)");
  expect_error("{\"\xe2\x82", "", StatusCode::kCorrupt,  // cut short
               "header is not valid UTF-8 (byte 0xE2 at header offset 2)");
}

TEST(SafetensorsFile, RefusesBadJson) {
  for (std::string header : {R"({"a": })", R"({"a": {}} x)", "", R"({"a": 1e999})",
                             R"({"a": "\ud800"})", "{\"a\": \"\x01\"}"}) {
    Status status = validate(file_bytes(header));
    EXPECT_EQ(status.code(), StatusCode::kCorrupt) << header;
    EXPECT_THAT(status.message(), StartsWith("x.safetensors: header is not valid JSON: "))
        << header;
  }
  EXPECT_EQ(
      validate(file_bytes(R"({"a": })")).message(),
      "x.safetensors: header is not valid JSON: parse error at line 1, column 7: syntax error "
      "while parsing value - unexpected '}'; expected '[', '{', or a literal");
}

TEST(SafetensorsFile, RefusesAByteOrderMark) {
  expect_error("\xef\xbb\xbf{}", "", StatusCode::kCorrupt,
               "header is not valid JSON: it starts with a byte order mark (EF BB BF)");
}

TEST(SafetensorsFile, RefusesAHeaderThatIsNotAnObject) {
  expect_error("[1, 2]", "", StatusCode::kCorrupt, "header is an array, expected a JSON object");
  expect_error(" \"text\" ", "", StatusCode::kCorrupt,
               "header is a string, expected a JSON object");
  expect_error("12", "", StatusCode::kCorrupt, "header is a number, expected a JSON object");
  // Found by the fuzzer: a duplicate key below a non-object root.
  expect_error(R"([{"a":1,"a":2}])", "", StatusCode::kCorrupt,
               "header is an array, expected a JSON object");
}

TEST(SafetensorsFile, RefusesDuplicateKeys) {
  std::string a = entry("a", "U8", "[1]", 0, 1);
  expect_error("{" + a + "," + a + "}", "x", StatusCode::kCorrupt, "header lists key \"a\" twice");
  expect_error(R"({"a":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}})", "x",
               StatusCode::kCorrupt, "tensor \"a\": duplicate key \"dtype\"");
  expect_error(R"({"__metadata__":{"k":"1","k":"2"}})", "", StatusCode::kCorrupt,
               "__metadata__: duplicate key \"k\"");
}

TEST(SafetensorsFile, RefusesNonStringMetadata) {
  expect_error(R"({"__metadata__":{"format":"pt","layers":61}})", "", StatusCode::kCorrupt,
               "__metadata__: \"layers\" is 61, expected a string");
  expect_error(R"({"__metadata__":{"x":["a"]}})", "", StatusCode::kCorrupt,
               "__metadata__: \"x\" is an array, expected a string");
  expect_error(R"({"__metadata__":"pt"})", "", StatusCode::kCorrupt,
               "__metadata__ is a string, expected an object of strings");
}

// §3.1 item 3.

TEST(SafetensorsFile, RefusesMissingAndExtraFields) {
  expect_error(R"({"a":{"dtype":"U8","shape":[1]}})", "x", StatusCode::kCorrupt,
               "tensor \"a\": missing field \"data_offsets\" (expected exactly dtype, shape, "
               "data_offsets)");
  expect_error(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", "x", StatusCode::kCorrupt,
               "tensor \"a\": missing field \"dtype\" (expected exactly dtype, shape, "
               "data_offsets)");
  expect_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"align":8}})", "x",
               StatusCode::kCorrupt,
               "tensor \"a\": unexpected field \"align\" (expected exactly dtype, shape, "
               "data_offsets)");
  expect_error(R"({"a":[1]})", "", StatusCode::kCorrupt,
               "tensor \"a\": entry is an array, expected an object with dtype, shape, "
               "data_offsets");
  expect_error(R"({"a":{"dtype":8,"shape":[1],"data_offsets":[0,1]}})", "x", StatusCode::kCorrupt,
               "tensor \"a\": dtype is 8, expected a string");
}

TEST(SafetensorsFile, RefusesBadShapes) {
  expect_error("{" + entry("a", "U8", "[2,-1]", 0, 1) + "}", "x", StatusCode::kCorrupt,
               "tensor \"a\": shape[1] is -1, expected a non-negative integer");
  expect_error("{" + entry("a", "U8", "[1.0]", 0, 1) + "}", "x", StatusCode::kCorrupt,
               "tensor \"a\": shape[0] is 1.0, expected a non-negative integer");
  expect_error("{" + entry("a", "U8", "[\"1\"]", 0, 1) + "}", "x", StatusCode::kCorrupt,
               "tensor \"a\": shape[0] is \"1\", expected a non-negative integer");
  expect_error("{" + entry("a", "U8", "[18446744073709551616]", 0, 1) + "}", "x",
               StatusCode::kCorrupt,
               "tensor \"a\": shape[0] is 1.8446744073709552e+19, expected a non-negative integer");
  expect_error("{" + entry("a", "U8", "7", 0, 1) + "}", "x", StatusCode::kCorrupt,
               "tensor \"a\": shape is 7, expected an array of non-negative integers");
}

TEST(SafetensorsFile, RefusesBadOffsets) {
  expect_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "x",
               StatusCode::kCorrupt,
               "tensor \"a\": data_offsets[0] is -1, expected a non-negative "
               "integer");
  expect_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.5]}})", "x",
               StatusCode::kCorrupt,
               "tensor \"a\": data_offsets[1] is 1.5, expected a "
               "non-negative integer");
  expect_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", "x",
               StatusCode::kCorrupt,
               "tensor \"a\": data_offsets is an array of 3 entries, expected [BEGIN, END]");
  expect_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":{"b":0}}})", "x",
               StatusCode::kCorrupt,
               "tensor \"a\": data_offsets is an object, expected [BEGIN, END]");
}

TEST(SafetensorsFile, RefusesUnknownDtypes) {
  expect_error("{" + entry("a", "F7", "[1]", 0, 1) + "}", "x", StatusCode::kCorrupt,
               fmt::format("tensor \"a\": unknown dtype \"F7\", expected a safetensors dtype "
                           "(dayzero reads {})",
                           kAccepted));
  expect_error("{" + entry("a", "f32", "[1]", 0, 4) + "}", "abcd", StatusCode::kCorrupt,
               fmt::format("tensor \"a\": unknown dtype \"f32\", expected a safetensors dtype "
                           "(dayzero reads {})",
                           kAccepted));
}

// §3.1 item 4.

TEST(SafetensorsFile, RefusesAWrongByteSize) {
  // The example from docs/formats.md §3.1. Sizes are checked before the tiling, so no data is
  // needed.
  expect_error("{" +
                   entry("model.layers.3.self_attn.kv_b_proj.weight", "F8_E4M3", "[32768, 512]", 0,
                         16777200) +
                   "}",
               "", StatusCode::kCorrupt,
               "tensor \"model.layers.3.self_attn.kv_b_proj.weight\": data_offsets [0, 16777200] "
               "hold 16777200 bytes, shape [32768, 512] × F8_E4M3 needs 16777216");
  expect_error("{" + entry("a", "BF16", "[]", 4, 8) + "}", "", StatusCode::kCorrupt,
               "tensor \"a\": data_offsets [4, 8] hold 4 bytes, shape [] × BF16 needs 2");
  expect_error("{" + entry("a", "U8", "[4]", 8, 4) + "}", "", StatusCode::kCorrupt,
               "tensor \"a\": data_offsets [8, 4] end before they begin");
}

TEST(SafetensorsFile, RefusesSizesThatOverflow) {
  expect_error("{" + entry("a", "U8", "[4294967296,4294967296]", 0, 0) + "}", "",
               StatusCode::kCorrupt,
               "tensor \"a\": shape [4294967296, 4294967296]: element count overflows 64 bits");
  expect_error("{" + entry("a", "F32", "[4611686018427387904]", 0, 0) + "}", "",
               StatusCode::kCorrupt,
               "tensor \"a\": shape [4611686018427387904] × F32: bit count overflows 64 bits");
  expect_error("{" + entry("a", "F32", "[9223372036854775808,0]", 0, 0) + "}", "",
               StatusCode::kCorrupt,
               "tensor \"a\": shape [9223372036854775808, 0] has dimension 9223372036854775808, "
               "above the limit 2^63 - 1");
}

TEST(SafetensorsFile, RefusesSubByteTensorsThatEndMidByte) {
  expect_error("{" + entry("a", "F4", "[3]", 0, 2) + "}", "xy", StatusCode::kCorrupt,
               "tensor \"a\": shape [3] × F4 is 12 bits, not a whole number of bytes");
  expect_error("{" + entry("a", "F6_E2M3", "[2,3]", 0, 5) + "}", "xyzzy", StatusCode::kCorrupt,
               "tensor \"a\": shape [2, 3] × F6_E2M3 is 36 bits, not a whole number of bytes");
  // Whole bytes pass the size check and are then refused as a dtype.
  expect_error("{" + entry("a", "F4", "[2,3]", 0, 3) + "}", "xyz", StatusCode::kUnsupported,
               fmt::format("tensor \"a\": unsupported dtype F4 (dayzero reads {})", kAccepted));
}

// §3.1 item 5.

TEST(SafetensorsFile, RefusesOverlap) {
  std::string header =
      "{" + entry("a", "U8", "[16]", 0, 16) + "," + entry("b", "U8", "[16]", 8, 24) + "}";
  expect_error(header, std::string(24, 'd'), StatusCode::kCorrupt,
               "tensor \"b\": data_offsets [8, 24] overlap tensor \"a\" at [0, 16]");
  // Two tensors on the same bytes.
  header = "{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "I8", "[4]", 0, 4) + "}";
  expect_error(header, "abcd", StatusCode::kCorrupt,
               "tensor \"b\": data_offsets [0, 4] overlap tensor \"a\" at [0, 4]");
}

TEST(SafetensorsFile, RefusesHoles) {
  std::string header =
      "{" + entry("a", "U8", "[16]", 0, 16) + "," + entry("b", "U8", "[16]", 20, 36) + "}";
  expect_error(header, std::string(36, 'd'), StatusCode::kCorrupt,
               "tensor \"b\": data_offsets [20, 36] leave a hole of 4 bytes after tensor \"a\", "
               "which ends at 16");
  expect_error("{" + entry("a", "U8", "[16]", 4, 20) + "}", std::string(20, 'd'),
               StatusCode::kCorrupt,
               "tensor \"a\": data_offsets [4, 20] leave a hole of 4 bytes at the start of the "
               "data buffer (the first tensor must begin at 0)");
}

TEST(SafetensorsFile, RefusesOffsetsPastTheBuffer) {
  expect_error("{" + entry("a", "U8", "[16]", 0, 16) + "}", std::string(8, 'd'),
               StatusCode::kCorrupt,
               "tensor \"a\": data_offsets [0, 16] run past the end of the data buffer (8 bytes)");
  expect_error("{" + entry("a", "U8", "[0]", 9, 9) + "}", std::string(8, 'd'), StatusCode::kCorrupt,
               "tensor \"a\": data_offsets [9, 9] run past the end of the data buffer (8 bytes)");
}

TEST(SafetensorsFile, RefusesTrailingBytes) {
  expect_error("{" + entry("a", "U8", "[16]", 0, 16) + "}", std::string(20, 'd'),
               StatusCode::kCorrupt,
               "tensor \"a\": the last tensor ends at 16, but the data buffer holds 20 bytes (4 "
               "trailing bytes)");
  expect_error("{}", "abc", StatusCode::kCorrupt,
               "header lists no tensors, but the data buffer holds 3 bytes");
}

// Refusals of well-formed files.

TEST(SafetensorsFile, RefusesUnsupportedDtypesByName) {
  for (auto [dtype, num_bytes] : std::vector<std::pair<std::string, int>>{{"F8_E4M3FNUZ", 4},
                                                                          {"F8_E5M2FNUZ", 4},
                                                                          {"F64", 32},
                                                                          {"C64", 32},
                                                                          {"U16", 8},
                                                                          {"I16", 8},
                                                                          {"U32", 16},
                                                                          {"U64", 32},
                                                                          {"F6_E3M2", 3}}) {
    std::string header = "{" + entry("w.scale", dtype, "[4]", 0, uint64_t(num_bytes)) + "}";
    expect_error(header, std::string(size_t(num_bytes), 'd'), StatusCode::kUnsupported,
                 fmt::format("tensor \"w.scale\": unsupported dtype {} (dayzero reads {})", dtype,
                             kAccepted));
  }
}

TEST(SafetensorsFile, RefusesRanksAboveTheMaximum) {
  expect_error(
      "{" + entry("a", "U8", "[1,1,1,1,1,1,2]", 0, 2) + "}", "ab", StatusCode::kUnsupported,
      "tensor \"a\": shape [1, 1, 1, 1, 1, 1, 2] has rank 7, above dayzero's maximum of 6");
}

TEST(SafetensorsFile, ChecksStepsInOrder) {
  // A bad size (item 4) is reported before the overlap (item 5) even though the overlap comes first
  // in header order, and a malformed entry (item 3) before either.
  std::string header = "{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 2, 6) +
                       "," + entry("c", "U8", "[4]", 6, 9) + "}";
  expect_error(header, std::string(9, 'd'), StatusCode::kCorrupt,
               "tensor \"c\": data_offsets [6, 9] hold 3 bytes, shape [4] × U8 needs 4");
  header.insert(header.size() - 1, R"(,"d":{"dtype":"U8"})");
  expect_error(header, std::string(9, 'd'), StatusCode::kCorrupt,
               "tensor \"d\": missing field \"shape\" (expected exactly dtype, shape, "
               "data_offsets)");
  // A refused dtype is reported only once the file is known to be well-formed.
  header = "{" + entry("a", "F64", "[1]", 0, 8) + "," + entry("b", "U8", "[4]", 8, 12) + "}";
  expect_error(header, std::string(13, 'd'), StatusCode::kCorrupt,
               "tensor \"b\": the last tensor ends at 12, but the data buffer holds 13 bytes (1 "
               "trailing bytes)");
}

}  // namespace safetensors_test
}  // namespace dz::formats

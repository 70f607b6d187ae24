#include "dayzero/formats/npy.h"

#include <cstring>
#include <fstream>

#include <fmt/format.h>

namespace dz::formats {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kPreambleBytes = 10;  // magic (6) + version (2) + header length (2)
constexpr size_t kAlignment = 64;

std::string shape_tuple(const Shape& shape) {
  if (shape.rank() == 1) return fmt::format("({},)", shape[0]);
  std::string out = "(";
  for (int i = 0; i < shape.rank(); ++i) out += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return out + ")";
}

}  // namespace

std::string encode_npy_f32(std::span<const float> data, const Shape& shape) {
  DZ_CHECK(static_cast<int64_t>(data.size()) == shape.num_elems(), "{} values for shape {}",
           data.size(), shape.to_string());
  std::string dict =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}", shape_tuple(shape));
  // Pad with spaces so that preamble + header (ending in '\n') is a multiple of 64.
  size_t header_bytes = dict.size() + 1;
  header_bytes += (kAlignment - (kPreambleBytes + header_bytes) % kAlignment) % kAlignment;
  DZ_CHECK(header_bytes <= 0xFFFF, "npy header too long");
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header_bytes & 0xFF);
  out += static_cast<char>(header_bytes >> 8);
  out += dict;
  out.append(header_bytes - dict.size() - 1, ' ');
  out += '\n';
  const size_t data_offset = out.size();
  out.resize(data_offset + data.size_bytes());
  // An empty span may have a null pointer, which memcpy must not see even for zero bytes.
  if (!data.empty())
    std::memcpy(out.data() + data_offset, data.data(), data.size_bytes());  // x86: little-endian
  return out;
}

Status write_npy_f32(const std::string& path, std::span<const float> data, const Shape& shape) {
  std::string bytes = encode_npy_f32(data, shape);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return make_error(StatusCode::kIo, "{}: cannot open for writing", path);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return make_error(StatusCode::kIo, "{}: write failed", path);
  return Status::ok_status();
}

Result<NpyF32> decode_npy_f32(std::string_view bytes) {
  auto corrupt = [](std::string_view what) {
    return Status(StatusCode::kCorrupt, fmt::format("npy: {}", what));
  };
  if (bytes.size() < kPreambleBytes || bytes.substr(0, 6) != kMagic)
    return corrupt("missing the \\x93NUMPY magic");
  if (bytes[6] != 1 || bytes[7] != 0) return corrupt("only version 1.0 is read");
  size_t header_bytes = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  if (bytes.size() < kPreambleBytes + header_bytes) return corrupt("truncated header");
  std::string_view header = bytes.substr(kPreambleBytes, header_bytes);
  if (header.find("'descr': '<f4'") == std::string_view::npos) return corrupt("descr is not '<f4'");
  if (header.find("'fortran_order': False") == std::string_view::npos)
    return corrupt("fortran_order is not False");
  size_t open = header.find("'shape': (");
  size_t close = header.find(')', open);
  if (open == std::string_view::npos || close == std::string_view::npos)
    return corrupt("no shape tuple");
  NpyF32 out;
  std::string_view dims = header.substr(open + 10, close - open - 10);
  while (!dims.empty()) {
    size_t comma = dims.find(',');
    std::string item(dims.substr(0, comma));
    dims = comma == std::string_view::npos ? std::string_view() : dims.substr(comma + 1);
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    try {
      out.shape.push_back(std::stoll(item));
    } catch (const std::exception&) {
      return corrupt(fmt::format("bad shape entry \"{}\"", item));
    }
  }
  std::string_view data = bytes.substr(kPreambleBytes + header_bytes);
  if (static_cast<int64_t>(data.size()) != out.shape.num_elems() * 4)
    return corrupt(fmt::format("{} data bytes for shape {}", data.size(), out.shape.to_string()));
  out.data.resize(data.size() / 4);
  if (!data.empty()) std::memcpy(out.data.data(), data.data(), data.size());
  return out;
}

}  // namespace dz::formats

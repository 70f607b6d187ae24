#include "dayzero/formats/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "dayzero/formats/json_text.h"

namespace dz::formats {
namespace {

using Json = nlohmann::json;

// Every dtype string of the safetensors spec, with its width. `dtype` is empty for the ones dayzero
// refuses (docs/formats.md §3.1): they still get their size checked, so a broken file reads as
// broken.
struct DTypeSpec {
  std::string_view name;
  uint64_t bits;
  std::optional<DType> dtype;
};

constexpr std::array kDTypeSpecs = {
    DTypeSpec{"BF16", 16, DType::kBF16},
    DTypeSpec{"F16", 16, DType::kF16},
    DTypeSpec{"F32", 32, DType::kF32},
    DTypeSpec{"F8_E4M3", 8, DType::kF8E4M3},
    DTypeSpec{"F8_E5M2", 8, DType::kF8E5M2},
    DTypeSpec{"F8_E8M0", 8, DType::kF8E8M0},
    DTypeSpec{"U8", 8, DType::kU8},
    DTypeSpec{"I8", 8, DType::kI8},
    DTypeSpec{"I32", 32, DType::kI32},
    DTypeSpec{"I64", 64, DType::kI64},
    DTypeSpec{"BOOL", 8, DType::kBool},
    DTypeSpec{"F8_E4M3FNUZ", 8, std::nullopt},
    DTypeSpec{"F8_E5M2FNUZ", 8, std::nullopt},
    DTypeSpec{"F4", 4, std::nullopt},
    DTypeSpec{"F6_E2M3", 6, std::nullopt},
    DTypeSpec{"F6_E3M2", 6, std::nullopt},
    DTypeSpec{"F64", 64, std::nullopt},
    DTypeSpec{"C64", 64, std::nullopt},
    DTypeSpec{"U16", 16, std::nullopt},
    DTypeSpec{"I16", 16, std::nullopt},
    DTypeSpec{"U32", 32, std::nullopt},
    DTypeSpec{"U64", 64, std::nullopt},
};
constexpr std::string_view kAcceptedDTypes =
    "BF16, F16, F32, F8_E4M3, F8_E5M2, F8_E8M0, U8, I8, I32, I64, BOOL";

const DTypeSpec* find_dtype_spec(std::string_view name) {
  for (const auto& spec : kDTypeSpecs)
    if (spec.name == name) return &spec;
  return nullptr;
}

// One header entry after the field checks (§3.1 item 3), before its sizes are known.
struct Entry {
  std::string name;
  const DTypeSpec* spec = nullptr;
  std::vector<uint64_t> dims;
  uint64_t begin_bytes = 0;
  uint64_t end_bytes = 0;
  uint64_t size_bytes = 0;
};

struct ParsedHeader {
  uint64_t data_offset_bytes = 0;
  std::vector<Entry> entries;  // header order
  std::map<std::string, std::string> metadata;
};

template <typename... Args>
Status file_error(StatusCode code, std::string_view file, fmt::format_string<Args...> format,
                  Args&&... args) {
  return Status(code,
                fmt::format("{}: {}", file, fmt::format(format, std::forward<Args>(args)...)));
}

template <typename... Args>
Status tensor_error(StatusCode code, std::string_view file, std::string_view tensor,
                    fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format("{}: tensor \"{}\": {}", file, tensor,
                                  fmt::format(format, std::forward<Args>(args)...)));
}

std::string format_dims(const std::vector<uint64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

// Offset of the first byte that is not part of well-formed UTF-8 (no overlongs, no surrogates, at
// most U+10FFFF), or nullopt.
std::optional<size_t> find_invalid_utf8(std::span<const unsigned char> text) {
  size_t i = 0;
  while (i < text.size()) {
    unsigned char lead = text[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    uint32_t code_point;
    uint32_t min_code_point;
    if ((lead & 0xE0) == 0xC0) {
      length = 2, code_point = lead & 0x1Fu, min_code_point = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, code_point = lead & 0x0Fu, min_code_point = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, code_point = lead & 0x07u, min_code_point = 0x10000;
    } else {
      return i;
    }
    if (text.size() - i < length) return i;
    for (size_t k = 1; k < length; ++k) {
      if ((text[i + k] & 0xC0) != 0x80) return i;
      code_point = (code_point << 6) | (text[i + k] & 0x3Fu);
    }
    if (code_point < min_code_point || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF))
      return i;
    i += length;
  }
  return std::nullopt;
}

// Watches the parser's events: nlohmann::json keeps the last of two equal keys without a word, so
// duplicates are found here. Also records the top-level keys in header order (json sorts them).
struct KeyWatcher {
  struct Frame {
    bool is_object;
    std::unordered_set<std::string> keys;
  };
  std::vector<Frame> frames;
  std::vector<std::string> root_keys;
  std::optional<std::pair<std::string, std::string>> duplicate;  // (tensor or "", key)

  bool on_event(Json::parse_event_t event, const Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        frames.push_back({true, {}});
        break;
      case Json::parse_event_t::array_start:
        frames.push_back({false, {}});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        // Only an object root has tensor names; any other root is refused before duplicates.
        bool object_root = frames.front().is_object;
        bool at_root = object_root && frames.size() == 1;
        if (at_root) root_keys.push_back(key);
        if (!frames.back().keys.insert(key).second && !duplicate)
          duplicate.emplace(at_root || !object_root ? std::string() : root_keys.back(), key);
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  }
};

// A shape entry or offset: a non-negative JSON integer ("-0" included, as serde reads it).
std::optional<uint64_t> as_count(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0)
    return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

// §3.1 item 2: UTF-8, one JSON object, no duplicate keys, string metadata. Fills the metadata and
// returns the parsed object with its keys in header order.
Status parse_json(std::string_view file, std::span<const std::byte> header_bytes, Json& root,
                  std::vector<std::string>& root_keys,
                  std::map<std::string, std::string>& metadata) {
  auto text =
      std::span(reinterpret_cast<const unsigned char*>(header_bytes.data()), header_bytes.size());
  if (auto bad = find_invalid_utf8(text))
    return file_error(StatusCode::kCorrupt, file,
                      "header is not valid UTF-8 (byte 0x{:02X} at header offset {})", text[*bad],
                      *bad);
  // nlohmann::json skips a leading byte order mark; JSON (RFC 8259 §8.1) and the reference reader
  // do not.
  if (text.size() >= 3 && text[0] == 0xEF && text[1] == 0xBB && text[2] == 0xBF)
    return file_error(StatusCode::kCorrupt, file,
                      "header is not valid JSON: it starts with a byte order mark (EF BB BF)");
  KeyWatcher watcher;
  try {
    const auto* begin = reinterpret_cast<const char*>(header_bytes.data());
    root = Json::parse(
        begin, begin + header_bytes.size(),
        [&watcher](int, Json::parse_event_t event, Json& parsed) {
          return watcher.on_event(event, parsed);
        },
        /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::exception& error) {
    // what() is "[json.exception.parse_error.101] parse error at ..."; keep the readable part.
    std::string_view what = error.what();
    if (auto close = what.find("] "); what.starts_with("[json.") && close != what.npos)
      what.remove_prefix(close + 2);
    return file_error(StatusCode::kCorrupt, file, "header is not valid JSON: {}", what);
  }
  if (!root.is_object())
    return file_error(StatusCode::kCorrupt, file, "header is {}, expected a JSON object",
                      json_kind(root));
  if (watcher.duplicate) {
    const auto& [tensor, key] = *watcher.duplicate;
    if (tensor.empty())
      return file_error(StatusCode::kCorrupt, file, "header lists key \"{}\" twice", key);
    if (tensor == "__metadata__")
      return file_error(StatusCode::kCorrupt, file, "__metadata__: duplicate key \"{}\"", key);
    return tensor_error(StatusCode::kCorrupt, file, tensor, "duplicate key \"{}\"", key);
  }
  root_keys = std::move(watcher.root_keys);
  if (auto it = root.find("__metadata__"); it != root.end()) {
    if (!it->is_object())
      return file_error(StatusCode::kCorrupt, file,
                        "__metadata__ is {}, expected an object of strings", json_kind(*it));
    for (const auto& [key, value] : it->items()) {
      if (!value.is_string())
        return file_error(StatusCode::kCorrupt, file,
                          "__metadata__: \"{}\" is {}, expected a string", key,
                          json_scalar_or_kind(value));
      metadata.emplace(key, value.get<std::string>());
    }
  }
  return {};
}

// §3.1 item 3: exactly dtype, shape, data_offsets; non-negative integers; a known dtype string.
Result<Entry> parse_entry(std::string_view file, const std::string& name, const Json& value) {
  constexpr std::array<std::string_view, 3> kFields = {"dtype", "shape", "data_offsets"};
  if (!value.is_object())
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "entry is {}, expected an object with dtype, shape, data_offsets",
                        json_scalar_or_kind(value));
  for (auto field : kFields)
    if (!value.contains(field))
      return tensor_error(StatusCode::kCorrupt, file, name,
                          "missing field \"{}\" (expected exactly dtype, shape, data_offsets)",
                          field);
  for (const auto& [key, unused] : value.items())
    if (std::find(kFields.begin(), kFields.end(), key) == kFields.end())
      return tensor_error(StatusCode::kCorrupt, file, name,
                          "unexpected field \"{}\" (expected exactly dtype, shape, data_offsets)",
                          key);
  Entry entry;
  entry.name = name;
  const Json& dtype = value["dtype"];
  if (!dtype.is_string())
    return tensor_error(StatusCode::kCorrupt, file, name, "dtype is {}, expected a string",
                        json_scalar_or_kind(dtype));
  entry.spec = find_dtype_spec(dtype.get_ref<const std::string&>());
  if (entry.spec == nullptr)
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "unknown dtype {}, expected a safetensors dtype (dayzero reads {})",
                        dtype.dump(), kAcceptedDTypes);

  const Json& shape = value["shape"];
  if (!shape.is_array())
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "shape is {}, expected an array of non-negative integers",
                        json_scalar_or_kind(shape));
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    auto dim = as_count(shape[axis]);
    if (!dim)
      return tensor_error(StatusCode::kCorrupt, file, name,
                          "shape[{}] is {}, expected a non-negative integer", axis,
                          json_scalar_or_kind(shape[axis]));
    entry.dims.push_back(*dim);
  }

  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "data_offsets is {}{}, expected [BEGIN, END]", json_scalar_or_kind(offsets),
                        offsets.is_array() ? fmt::format(" of {} entries", offsets.size()) : "");
  for (size_t i = 0; i < 2; ++i)
    if (!as_count(offsets[i]))
      return tensor_error(StatusCode::kCorrupt, file, name,
                          "data_offsets[{}] is {}, expected a non-negative integer", i,
                          json_scalar_or_kind(offsets[i]));
  entry.begin_bytes = *as_count(offsets[0]);
  entry.end_bytes = *as_count(offsets[1]);
  return entry;
}

// §3.1 item 4: element count and byte size without overflow; END − BEGIN == byte size.
Status check_size(std::string_view file, Entry& entry) {
  const auto& name = entry.name;
  uint64_t num_elems = 1;
  for (uint64_t dim : entry.dims) {
    // Shape holds int64 dims; a dim this large can only pass next to a zero dim.
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return tensor_error(StatusCode::kCorrupt, file, name,
                          "shape {} has dimension {}, above the limit 2^63 - 1",
                          format_dims(entry.dims), dim);
    if (__builtin_mul_overflow(num_elems, dim, &num_elems))
      return tensor_error(StatusCode::kCorrupt, file, name,
                          "shape {}: element count overflows 64 bits", format_dims(entry.dims));
  }
  uint64_t num_bits;
  if (__builtin_mul_overflow(num_elems, entry.spec->bits, &num_bits))
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "shape {} × {}: bit count overflows 64 bits", format_dims(entry.dims),
                        entry.spec->name);
  if (num_bits % 8 != 0)
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "shape {} × {} is {} bits, not a whole number of bytes",
                        format_dims(entry.dims), entry.spec->name, num_bits);
  entry.size_bytes = num_bits / 8;
  if (entry.end_bytes < entry.begin_bytes)
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "data_offsets [{}, {}] end before they begin", entry.begin_bytes,
                        entry.end_bytes);
  if (entry.end_bytes - entry.begin_bytes != entry.size_bytes)
    return tensor_error(StatusCode::kCorrupt, file, name,
                        "data_offsets [{}, {}] hold {} bytes, shape {} × {} needs {}",
                        entry.begin_bytes, entry.end_bytes, entry.end_bytes - entry.begin_bytes,
                        format_dims(entry.dims), entry.spec->name, entry.size_bytes);
  return {};
}

// §3.1 item 5: sorted by BEGIN, the tensors tile the data buffer exactly.
Status check_tiling(std::string_view file, const std::vector<Entry>& entries,
                    uint64_t data_size_bytes) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Ties on BEGIN (zero-size tensors) put the empty one first, so it does not count as overlap.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(entries[a].begin_bytes, entries[a].end_bytes) <
           std::pair(entries[b].begin_bytes, entries[b].end_bytes);
  });
  uint64_t expected_begin = 0;
  const Entry* previous = nullptr;
  for (size_t index : order) {
    const Entry& entry = entries[index];
    if (entry.begin_bytes < expected_begin)
      return tensor_error(StatusCode::kCorrupt, file, entry.name,
                          "data_offsets [{}, {}] overlap tensor \"{}\" at [{}, {}]",
                          entry.begin_bytes, entry.end_bytes, previous->name, previous->begin_bytes,
                          previous->end_bytes);
    if (entry.end_bytes > data_size_bytes)
      return tensor_error(StatusCode::kCorrupt, file, entry.name,
                          "data_offsets [{}, {}] run past the end of the data buffer ({} bytes)",
                          entry.begin_bytes, entry.end_bytes, data_size_bytes);
    if (entry.begin_bytes > expected_begin) {
      if (previous == nullptr)
        return tensor_error(StatusCode::kCorrupt, file, entry.name,
                            "data_offsets [{}, {}] leave a hole of {} bytes at the start of the "
                            "data buffer (the first tensor must begin at 0)",
                            entry.begin_bytes, entry.end_bytes, entry.begin_bytes);
      return tensor_error(StatusCode::kCorrupt, file, entry.name,
                          "data_offsets [{}, {}] leave a hole of {} bytes after tensor \"{}\", "
                          "which ends at {}",
                          entry.begin_bytes, entry.end_bytes, entry.begin_bytes - expected_begin,
                          previous->name, expected_begin);
    }
    expected_begin = entry.end_bytes;
    previous = &entry;
  }
  if (expected_begin != data_size_bytes) {
    if (previous == nullptr)
      return file_error(StatusCode::kCorrupt, file,
                        "header lists no tensors, but the data buffer holds {} bytes",
                        data_size_bytes);
    return tensor_error(StatusCode::kCorrupt, file, previous->name,
                        "the last tensor ends at {}, but the data buffer holds {} bytes ({} "
                        "trailing bytes)",
                        expected_begin, data_size_bytes, data_size_bytes - expected_begin);
  }
  return {};
}

Result<ParsedHeader> parse_header(std::span<const std::byte> file_bytes, std::string_view file) {
  // §3.1 item 1: the length prefix and the header fit in the file.
  if (file_bytes.size() < 8)
    return file_error(StatusCode::kCorrupt, file,
                      "file is {} bytes, too short for the 8-byte header length",
                      file_bytes.size());
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i)
    header_bytes = (header_bytes << 8) | std::to_integer<uint64_t>(file_bytes[size_t(i)]);
  if (header_bytes > kMaxHeaderBytes)
    return file_error(StatusCode::kCorrupt, file, "header length {} exceeds the limit of {} bytes",
                      header_bytes, kMaxHeaderBytes);
  if (8 + header_bytes > file_bytes.size())
    return file_error(StatusCode::kCorrupt, file,
                      "header length {} needs 8 + {} = {} bytes, but the file is {} bytes",
                      header_bytes, header_bytes, 8 + header_bytes, file_bytes.size());

  ParsedHeader parsed;
  parsed.data_offset_bytes = 8 + header_bytes;
  Json root;
  std::vector<std::string> root_keys;
  DZ_RETURN_IF_ERROR(
      parse_json(file, file_bytes.subspan(8, header_bytes), root, root_keys, parsed.metadata));

  for (const auto& name : root_keys) {
    if (name == "__metadata__") continue;
    DZ_ASSIGN_OR_RETURN(Entry entry, parse_entry(file, name, root[name]));
    parsed.entries.push_back(std::move(entry));
  }
  for (auto& entry : parsed.entries) DZ_RETURN_IF_ERROR(check_size(file, entry));
  DZ_RETURN_IF_ERROR(
      check_tiling(file, parsed.entries, file_bytes.size() - parsed.data_offset_bytes));

  // The file is well-formed; now refuse what the engine does not run.
  for (const auto& entry : parsed.entries) {
    if (!entry.spec->dtype)
      return tensor_error(StatusCode::kUnsupported, file, entry.name,
                          "unsupported dtype {} (dayzero reads {})", entry.spec->name,
                          kAcceptedDTypes);
    if (entry.dims.size() > static_cast<size_t>(kMaxRank))
      return tensor_error(StatusCode::kUnsupported, file, entry.name,
                          "shape {} has rank {}, above dayzero's maximum of {}",
                          format_dims(entry.dims), entry.dims.size(), kMaxRank);
  }
  return parsed;
}

}  // namespace

Status SafetensorsFile::validate(std::span<const std::byte> file_bytes,
                                 std::string_view file_name) {
  return parse_header(file_bytes, file_name).status();
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  DZ_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  DZ_ASSIGN_OR_RETURN(ParsedHeader parsed, parse_header(mapped.bytes(), path));
  SafetensorsFile file;
  file.file_ = std::move(mapped);
  file.data_offset_bytes_ = parsed.data_offset_bytes;
  file.metadata_ = std::move(parsed.metadata);
  file.tensors_.reserve(parsed.entries.size());
  for (auto& entry : parsed.entries) {
    Shape shape;
    for (uint64_t dim : entry.dims) shape.push_back(static_cast<int64_t>(dim));
    file.index_by_name_.emplace(entry.name, file.tensors_.size());
    file.tensors_.push_back(TensorInfo{.name = std::move(entry.name),
                                       .dtype = *entry.spec->dtype,
                                       .shape = shape,
                                       .data_begin_bytes = entry.begin_bytes,
                                       .size_bytes = entry.size_bytes});
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_by_name_.find(name);
  return it == index_by_name_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::tensor_bytes(const TensorInfo& info) const {
  DZ_CHECK(data_offset_bytes_ + info.data_begin_bytes + info.size_bytes <= file_.size_bytes(),
           "tensor \"{}\" is not from {}", info.name, path());
  return file_.bytes().subspan(data_offset_bytes_ + info.data_begin_bytes, info.size_bytes);
}

TensorView SafetensorsFile::view(const TensorInfo& info) const {
  // TensorView has no const flavour; the mapping is PROT_READ, so a stray write faults loudly.
  auto* data = const_cast<std::byte*>(tensor_bytes(info).data());
  return TensorView(data, info.dtype, info.shape);
}

bool SafetensorsFile::is_aligned(const TensorInfo& info) const {
  auto element_bytes = static_cast<uintptr_t>(std::max(1, dtype_bits(info.dtype) / 8));
  return reinterpret_cast<uintptr_t>(tensor_bytes(info).data()) % element_bytes == 0;
}

}  // namespace dz::formats

#pragma once
// A validated, memory-mapped safetensors file (docs/formats.md §3.1). Opening checks the whole
// header and the tiling of the data buffer, so every TensorInfo of an open file is in range and
// sized right.
//
// Layout: u64 N (little-endian), N bytes of UTF-8 JSON, then the data buffer. The JSON maps each
// tensor name to {"dtype", "shape", "data_offsets": [BEGIN, END]}, offsets relative to the buffer.

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/dtype.h"
#include "dayzero/core/mapped_file.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"

namespace dz::formats {

// The reference library's header limit (huggingface/safetensors: safetensors/src/tensor.rs).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;                // PyTorch order
  uint64_t data_begin_bytes;  // offset in the data buffer (as in the header's data_offsets)
  uint64_t size_bytes;
};

class SafetensorsFile {  // move-only; owns a MappedFile
 public:
  // Maps and validates `path`; errors name the file (as given) and the tensor.
  static Result<SafetensorsFile> open(const std::string& path);
  // Parses and validates a header without a file (the fuzz entry point). `file_bytes` is taken as
  // the whole file: the data buffer must end exactly at its end. `file_name` is used in messages.
  static Status validate(std::span<const std::byte> file_bytes, std::string_view file_name);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  // The tensor's bytes inside the mapping; `info` must come from this file.
  std::span<const std::byte> tensor_bytes(const TensorInfo& info) const;
  // A read-only view into the mapping (the pages are PROT_READ: writing through it faults). The
  // data may be misaligned for the dtype (§3.1 item 6); check is_aligned before reading it as T.
  TensorView view(const TensorInfo& info) const;
  // Whether the tensor's first byte is aligned to its element size.
  bool is_aligned(const TensorInfo& info) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }
  // Offset of the data buffer in the file: 8 + N.
  uint64_t data_offset_bytes() const { return data_offset_bytes_; }

 private:
  SafetensorsFile() = default;

  MappedFile file_;
  uint64_t data_offset_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_by_name_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dz::formats

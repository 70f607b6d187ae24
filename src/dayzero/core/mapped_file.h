#pragma once
// A read-only memory-mapped file. Move-only; the mapping lives as long as the object.

#include <cstddef>
#include <span>
#include <string>

#include "dayzero/core/status.h"

namespace dz {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_bytes_}; }
  const std::byte* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  const std::string& path() const { return path_; }

 private:
  void unmap();

  const std::byte* data_ = nullptr;
  size_t size_bytes_ = 0;
  std::string path_;
};

}  // namespace dz

#include "dayzero/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace dz {

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    auto code = errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIo;
    return make_error(code, "{}: cannot open: {}", path, std::strerror(errno));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return make_error(StatusCode::kIo, "{}: not a regular file", path);
  }
  MappedFile file;
  file.path_ = path;
  file.size_bytes_ = static_cast<size_t>(info.st_size);
  if (file.size_bytes_ > 0) {
    void* addr = ::mmap(nullptr, file.size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return make_error(StatusCode::kIo, "{}: mmap failed: {}", path, std::strerror(err));
    }
    file.data_ = static_cast<const std::byte*>(addr);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

void MappedFile::unmap() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_bytes_);
  data_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace dz

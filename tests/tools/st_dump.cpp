// dz_st_dump PATH: prints each tensor of a safetensors file (header order) or of a checkpoint
// folder (name order) as one JSON line {"name", "dtype", "shape", "fnv1a64"}, the hash of its bytes
// as 16 hex digits; a file's metadata comes first as {"metadata": {...}}. On error it prints the
// Status to stderr and exits 1. python/tests/test_safetensors_io.py uses it to check the C++ reader
// against the Python writer.

#include <cstdio>
#include <filesystem>
#include <span>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dayzero/formats/checkpoint.h"
#include "dayzero/formats/safetensors.h"

namespace {

// 64-bit FNV-1a: tiny, and easy to recompute in Python.
uint64_t fnv1a64(std::span<const std::byte> bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (std::byte byte : bytes) {
    hash ^= std::to_integer<uint64_t>(byte);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void print_tensor(const dz::formats::SafetensorsFile& file, const dz::formats::TensorInfo& info) {
  nlohmann::json line;
  line["name"] = info.name;
  line["dtype"] = dz::dtype_name(info.dtype);
  line["shape"] = nlohmann::json::array();
  for (int axis = 0; axis < info.shape.rank(); ++axis) line["shape"].push_back(info.shape[axis]);
  line["fnv1a64"] = fmt::format("{:016x}", fnv1a64(file.tensor_bytes(info)));
  std::puts(line.dump().c_str());
}

int fail(const dz::Status& status) {
  std::fprintf(stderr, "%s\n", status.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FILE.safetensors|CHECKPOINT_DIR\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  if (std::filesystem::is_directory(path)) {
    auto checkpoint = dz::formats::Checkpoint::open(path);
    if (!checkpoint.ok()) return fail(checkpoint.status());
    for (const auto& tensor : checkpoint->tensors()) print_tensor(*tensor.file, *tensor.info);
    return 0;
  }
  auto file = dz::formats::SafetensorsFile::open(path);
  if (!file.ok()) return fail(file.status());
  nlohmann::json metadata;
  metadata["metadata"] = file->metadata();
  std::puts(metadata.dump().c_str());
  for (const auto& info : file->tensors()) print_tensor(*file, info);
  return 0;
}

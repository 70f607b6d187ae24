#pragma once
// A Hugging Face checkpoint folder: model.safetensors, or model.safetensors.index.json plus the
// shards it names (docs/formats.md §3.1, "Sharded checkpoints"). Opening validates every shard and
// the index against them, so every tensor found here is readable.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/formats/safetensors.h"

namespace dz::formats {

inline constexpr std::string_view kSingleFileName = "model.safetensors";
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

// Borrowed pointers into the Checkpoint that returned it; valid while that Checkpoint lives.
struct CheckpointTensor {
  const TensorInfo* info;
  const SafetensorsFile* file;
};

class Checkpoint {  // move-only: CheckpointTensor points into files_
 public:
  // Prefers model.safetensors when both files exist, as transformers does.
  static Result<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  size_t num_tensors() const { return by_name_.size(); }
  std::optional<CheckpointTensor> find(std::string_view name) const;
  std::vector<CheckpointTensor> tensors() const;                        // all, sorted by name
  const std::vector<SafetensorsFile>& files() const { return files_; }  // shards sorted by name

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, CheckpointTensor, std::less<>> by_name_;
};

}  // namespace dz::formats

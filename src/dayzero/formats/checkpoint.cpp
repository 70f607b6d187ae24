#include "dayzero/formats/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "dayzero/formats/json_text.h"

namespace dz::formats {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A shard must sit in the checkpoint folder itself: an index must not reach outside it.
bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name.find('/') == name.npos && name.find("..") == name.npos &&
         name.find('\0') == name.npos && name != ".";
}

Result<Json> read_index(const std::string& index_path) {
  std::ifstream stream(index_path, std::ios::binary);
  if (!stream) return make_error(StatusCode::kIo, "{}: cannot read", index_path);
  std::stringstream text;
  text << stream.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::exception& error) {
    std::string_view what = error.what();
    if (auto close = what.find("] "); what.starts_with("[json.") && close != what.npos)
      what.remove_prefix(close + 2);
    return make_error(StatusCode::kCorrupt, "{}: not valid JSON: {}", index_path, what);
  }
}

// Logged, not fatal: producers may count total_size differently (docs/formats.md §3.1, unverified).
void compare_total_size(const std::string& index_path, const Json& index, uint64_t sum_bytes) {
  auto metadata = index.find("metadata");
  if (metadata == index.end() || !metadata->is_object()) return;
  auto total = metadata->find("total_size");
  if (total == metadata->end()) return;
  if (!total->is_number_unsigned()) {
    spdlog::warn("{}: metadata.total_size is {}, expected a byte count", index_path,
                 json_scalar_or_kind(*total));
    return;
  }
  if (total->get<uint64_t>() != sum_bytes)
    spdlog::warn("{}: metadata.total_size is {}, but the shards' tensors hold {} bytes", index_path,
                 total->get<uint64_t>(), sum_bytes);
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error))
    return make_error(StatusCode::kNotFound, "{}: not a directory", dir);
  const std::string single_path = (fs::path(dir) / kSingleFileName).string();
  const std::string index_path = (fs::path(dir) / kIndexFileName).string();

  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  if (fs::exists(single_path, error)) {
    DZ_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single_path));
    checkpoint.files_.push_back(std::move(file));
    const SafetensorsFile& only = checkpoint.files_.front();
    for (const auto& info : only.tensors())
      checkpoint.by_name_.emplace(info.name, CheckpointTensor{&info, &only});
    return checkpoint;
  }
  if (!fs::exists(index_path, error))
    return make_error(StatusCode::kNotFound, "{}: holds neither {} nor {}", dir, kSingleFileName,
                      kIndexFileName);

  DZ_ASSIGN_OR_RETURN(Json index, read_index(index_path));
  if (!index.is_object())
    return make_error(StatusCode::kCorrupt, "{}: is {}, expected a JSON object", index_path,
                      json_kind(index));
  auto weight_map = index.find("weight_map");
  if (weight_map == index.end())
    return make_error(StatusCode::kCorrupt, "{}: missing \"weight_map\"", index_path);
  if (!weight_map->is_object())
    return make_error(StatusCode::kCorrupt,
                      "{}: \"weight_map\" is {}, expected an object of tensor name → shard file",
                      index_path, json_kind(*weight_map));

  // Shard names first: plain file names only.
  std::set<std::string> shard_names;
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string())
      return make_error(StatusCode::kCorrupt,
                        "{}: weight_map[\"{}\"] is {}, expected a shard file name", index_path,
                        tensor, json_scalar_or_kind(shard));
    const auto& name = shard.get_ref<const std::string&>();
    if (!is_plain_file_name(name))
      return make_error(StatusCode::kCorrupt,
                        "{}: weight_map[\"{}\"] names shard \"{}\", expected a plain file name in "
                        "the checkpoint folder (no '/', no '..')",
                        index_path, tensor, name);
    shard_names.insert(name);
  }

  // Every shard exists and validates. files_ never grows after this, so pointers into it hold.
  std::map<std::string, size_t, std::less<>> shard_index;
  checkpoint.files_.reserve(shard_names.size());
  for (const auto& name : shard_names) {
    const std::string shard_path = (fs::path(dir) / name).string();
    if (!fs::exists(shard_path, error))
      return make_error(StatusCode::kNotFound, "{}: shard \"{}\" named in weight_map is missing",
                        index_path, name);
    DZ_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(shard_path));
    shard_index.emplace(name, checkpoint.files_.size());
    checkpoint.files_.push_back(std::move(file));
  }

  // Every weight_map entry is in its shard.
  for (const auto& [tensor, shard] : weight_map->items()) {
    const auto& name = shard.get_ref<const std::string&>();
    if (checkpoint.files_[shard_index.find(name)->second].find(tensor) == nullptr)
      return make_error(StatusCode::kCorrupt,
                        "{}: weight_map puts tensor \"{}\" in shard \"{}\", which does not hold it",
                        index_path, tensor, name);
  }

  // No tensor in two shards.
  std::map<std::string_view, const SafetensorsFile*> holder;
  for (const auto& file : checkpoint.files_) {
    for (const auto& info : file.tensors()) {
      auto [it, inserted] = holder.emplace(info.name, &file);
      if (!inserted)
        return make_error(StatusCode::kCorrupt,
                          "{}: tensor \"{}\" appears in two shards, {} and {}", index_path,
                          info.name, it->second->path(), file.path());
    }
  }

  // Every shard tensor is listed, in the weight_map, under that shard.
  uint64_t sum_bytes = 0;
  for (const auto& file : checkpoint.files_) {
    for (const auto& info : file.tensors()) {
      if (!weight_map->contains(info.name))
        return make_error(StatusCode::kCorrupt,
                          "{}: tensor \"{}\" is not listed in the weight_map of {}", file.path(),
                          info.name, index_path);
      checkpoint.by_name_.emplace(info.name, CheckpointTensor{&info, &file});
      sum_bytes += info.size_bytes;
    }
  }
  compare_total_size(index_path, index, sum_bytes);
  return checkpoint;
}

std::optional<CheckpointTensor> Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<CheckpointTensor> Checkpoint::tensors() const {
  std::vector<CheckpointTensor> all;
  all.reserve(by_name_.size());
  for (const auto& [name, tensor] : by_name_) all.push_back(tensor);
  return all;
}

}  // namespace dz::formats

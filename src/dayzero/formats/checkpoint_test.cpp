#include "dayzero/formats/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace dz::formats {
namespace checkpoint_test {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct U8Tensor {
  std::string name;
  std::string bytes;  // a U8 tensor of shape [bytes.size()]
};

// A valid safetensors file holding U8 tensors back to back, header padded to 8 bytes.
std::string safetensors_bytes(const std::vector<U8Tensor>& tensors) {
  std::string header = "{";
  std::string data;
  for (const auto& tensor : tensors) {
    if (header.size() > 1) header += ",";
    header +=
        fmt::format(R"("{}":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}})", tensor.name,
                    tensor.bytes.size(), data.size(), data.size() + tensor.bytes.size());
    data += tensor.bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  uint64_t header_bytes = header.size();
  std::memcpy(bytes.data(), &header_bytes, 8);  // x86-64 is little-endian
  return bytes + header + data;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            fmt::format("dz_ckpt_test_{}_{}", ::getpid(), std::random_device{}()))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary)
        .write(bytes.data(), std::streamsize(bytes.size()));
  }
  std::string random_bytes(size_t num_bytes) {
    std::string bytes(num_bytes, '\0');
    for (auto& byte : bytes) byte = static_cast<char>(rng_() & 0xFF);
    return bytes;
  }
  // Three tensors in two shards, and an index for them.
  void write_sharded() {
    a_ = random_bytes(5), b_ = random_bytes(3), c_ = random_bytes(7);
    write("model-00001-of-00002.safetensors", safetensors_bytes({{"b", b_}, {"a", a_}}));
    write("model-00002-of-00002.safetensors", safetensors_bytes({{"c", c_}}));
    write_index(R"({"metadata":{"total_size":15},"weight_map":{)"
                R"("a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
                R"("c":"model-00002-of-00002.safetensors"}})");
  }
  void write_index(const std::string& text) { write("model.safetensors.index.json", text); }
  std::string index_path() const { return dir_ + "/model.safetensors.index.json"; }
  static std::string bytes_of(const CheckpointTensor& tensor) {
    auto bytes = tensor.file->tensor_bytes(*tensor.info);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  std::string dir_;
  std::mt19937 rng_{99};
  std::string a_, b_, c_;
};

TEST_F(CheckpointTest, OpensASingleFile) {
  std::string w = random_bytes(6);
  write("model.safetensors", safetensors_bytes({{"w", w}}));
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->dir(), dir_);
  EXPECT_EQ(checkpoint->num_tensors(), 1u);
  ASSERT_EQ(checkpoint->files().size(), 1u);
  auto tensor = checkpoint->find("w");
  ASSERT_TRUE(tensor.has_value());
  EXPECT_EQ(bytes_of(*tensor), w);
  EXPECT_FALSE(checkpoint->find("v").has_value());
}

TEST_F(CheckpointTest, OpensShardsAndFindsEveryTensor) {
  write_sharded();
  Result<Checkpoint> opened = Checkpoint::open(dir_);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Checkpoint checkpoint = std::move(opened).value();  // pointers survive the move
  EXPECT_EQ(checkpoint.num_tensors(), 3u);
  ASSERT_EQ(checkpoint.files().size(), 2u);
  EXPECT_EQ(checkpoint.files()[0].path(), dir_ + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(checkpoint.files()[1].path(), dir_ + "/model-00002-of-00002.safetensors");
  auto all = checkpoint.tensors();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].info->name, "a");
  EXPECT_EQ(all[1].info->name, "b");
  EXPECT_EQ(all[2].info->name, "c");
  EXPECT_EQ(bytes_of(all[0]), a_);
  EXPECT_EQ(bytes_of(all[1]), b_);
  EXPECT_EQ(bytes_of(all[2]), c_);
  EXPECT_EQ(all[2].file, &checkpoint.files()[1]);
  EXPECT_EQ(checkpoint.find("b")->info, all[1].info);
  EXPECT_EQ(checkpoint.find("c")->info->shape, (Shape{7}));
}

TEST_F(CheckpointTest, ToleratesAWrongTotalSize) {
  write_sharded();
  write_index(R"({"metadata":{"total_size":999},"weight_map":{)"
              R"("a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
              R"("c":"model-00002-of-00002.safetensors"}})");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->num_tensors(), 3u);
}

TEST_F(CheckpointTest, PrefersTheSingleFile) {
  write_sharded();
  write("model.safetensors", safetensors_bytes({{"only", random_bytes(2)}}));
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->num_tensors(), 1u);
  EXPECT_TRUE(checkpoint->find("only").has_value());
}

TEST_F(CheckpointTest, RefusesAFolderWithoutWeights) {
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(checkpoint.status().message(),
            dir_ + ": holds neither model.safetensors nor model.safetensors.index.json");
  checkpoint = Checkpoint::open(dir_ + "/nope");
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(checkpoint.status().message(), dir_ + "/nope: not a directory");
}

TEST_F(CheckpointTest, PassesOnShardErrors) {
  write("model.safetensors", "short");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(checkpoint.status().message(),
            dir_ + "/model.safetensors: file is 5 bytes, too short for the 8-byte header length");
}

TEST_F(CheckpointTest, RefusesAMissingShard) {
  write_sharded();
  std::filesystem::remove(dir_ + "/model-00002-of-00002.safetensors");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(
      checkpoint.status().message(),
      index_path() + ": shard \"model-00002-of-00002.safetensors\" named in weight_map is missing");
}

TEST_F(CheckpointTest, RefusesAnInvalidShard) {
  write_sharded();
  write("model-00002-of-00002.safetensors", safetensors_bytes({{"c", c_}}) + "x");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(checkpoint.status().message(),
            dir_ +
                "/model-00002-of-00002.safetensors: tensor \"c\": the last tensor ends at 7, "
                "but the data buffer holds 8 bytes (1 trailing bytes)");
}

TEST_F(CheckpointTest, RefusesATensorInTwoShards) {
  write_sharded();
  write("model-00002-of-00002.safetensors", safetensors_bytes({{"a", a_}, {"c", c_}}));
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(checkpoint.status().message(), index_path() + ": tensor \"a\" appears in two shards, " +
                                               dir_ + "/model-00001-of-00002.safetensors and " +
                                               dir_ + "/model-00002-of-00002.safetensors");
}

TEST_F(CheckpointTest, RefusesAWeightMapEntryMissingFromItsShard) {
  write_sharded();
  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors",)"
              R"("b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(checkpoint.status().message(),
            index_path() +
                ": weight_map puts tensor \"b\" in shard "
                "\"model-00002-of-00002.safetensors\", which does not hold it");
}

TEST_F(CheckpointTest, RefusesAShardTensorMissingFromTheWeightMap) {
  write_sharded();
  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors",)"
              R"("c":"model-00002-of-00002.safetensors"}})");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(checkpoint.status().message(),
            dir_ +
                "/model-00001-of-00002.safetensors: tensor \"b\" is not listed in the "
                "weight_map of " +
                index_path());
}

TEST_F(CheckpointTest, RefusesShardNamesOutsideTheFolder) {
  write_sharded();
  for (std::string name : {"../x.safetensors", "sub/x.safetensors", "..", "", "/etc/passwd"}) {
    write_index(R"({"weight_map":{"a":")" + name + R"("}})");
    Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
    EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt) << name;
    EXPECT_EQ(checkpoint.status().message(),
              index_path() + ": weight_map[\"a\"] names shard \"" + name +
                  "\", expected a plain file name in the checkpoint folder (no '/', no '..')");
  }
}

TEST_F(CheckpointTest, RefusesAMalformedIndex) {
  write_sharded();
  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors",})");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(checkpoint.status().message(), StartsWith(index_path() + ": not valid JSON: "));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("parse error"));

  write_index(R"([1])");
  EXPECT_EQ(Checkpoint::open(dir_).status().message(),
            index_path() + ": is an array, expected a JSON object");
  write_index(R"({"metadata":{}})");
  EXPECT_EQ(Checkpoint::open(dir_).status().message(), index_path() + ": missing \"weight_map\"");
  write_index(R"({"weight_map":[]})");
  EXPECT_EQ(Checkpoint::open(dir_).status().message(),
            index_path() +
                ": \"weight_map\" is an array, expected an object of tensor name → "
                "shard file");
  write_index(R"({"weight_map":{"a":3}})");
  EXPECT_EQ(Checkpoint::open(dir_).status().message(),
            index_path() + ": weight_map[\"a\"] is 3, expected a shard file name");
}

}  // namespace checkpoint_test
}  // namespace dz::formats

#include "dayzero/model/weight_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "dayzero/formats/codecs.h"

namespace dz::model {
namespace weight_loader_test {

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors spelling
  std::vector<int64_t> shape;
  std::string bytes;
};

// A safetensors file; `skew_bytes` of padding before the first tensor make every 2- and 4-byte
// tensor misaligned when odd.
std::string safetensors_bytes(const std::vector<RawTensor>& tensors, size_t skew_bytes) {
  std::string header = "{";
  std::string data(skew_bytes, '\0');
  if (skew_bytes > 0)
    header += fmt::format(R"("pad":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}})",
                          skew_bytes, skew_bytes);
  for (const RawTensor& t : tensors) {
    if (header.size() > 1) header += ",";
    header +=
        fmt::format(R"("{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t.name, t.dtype,
                    fmt::join(t.shape, ","), data.size(), data.size() + t.bytes.size());
    data += t.bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t header_bytes = header.size();
  std::memcpy(out.data(), &header_bytes, 8);
  return out + header + data;
}

template <typename T>
std::string as_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

class WeightLoaderTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            fmt::format("dz_weight_loader_test_{}_{}", ::getpid(), std::random_device{}()))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<float> random_floats(size_t count) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(count);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  // BF16 codes of random values, and the values they hold.
  std::pair<std::string, std::vector<float>> random_bf16(size_t count) {
    std::vector<uint16_t> codes;
    std::vector<float> values;
    for (float x : random_floats(count)) {
      codes.push_back(formats::encode_bf16(x));
      values.push_back(formats::decode_bf16(codes.back()));
    }
    return {as_bytes(codes), values};
  }

  formats::Checkpoint open(const std::vector<RawTensor>& tensors) {
    std::string bytes = safetensors_bytes(tensors, GetParam());
    std::ofstream(dir_ + "/model.safetensors", std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    Result<formats::Checkpoint> checkpoint = formats::Checkpoint::open(dir_);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
    return std::move(checkpoint).value();
  }

  std::string dir_;
  std::mt19937 rng_{GetParam() + 11};
};

TEST_P(WeightLoaderTest, FloatsWidenEveryDtypeExactly) {
  auto [bf16_bytes, bf16_values] = random_bf16(37);
  std::vector<float> f32 = random_floats(5);
  std::vector<uint16_t> f16_codes;
  std::vector<float> f16_values;
  for (float x : random_floats(9)) {
    f16_codes.push_back(formats::encode_fp16(x));
    f16_values.push_back(formats::decode_fp16(f16_codes.back()));
  }
  formats::Checkpoint ckpt = open({{"a", "BF16", {37}, bf16_bytes},
                                   {"b", "F32", {5}, as_bytes(f32)},
                                   {"c", "F16", {3, 3}, as_bytes(f16_codes)}});
  WeightLoader loader(ckpt, {});
  EXPECT_EQ(*loader.floats("a", 37), bf16_values);
  EXPECT_EQ(*loader.floats("b", 5), f32);
  EXPECT_EQ(*loader.floats("c", 9), f16_values);
  EXPECT_EQ(loader.floats("a", 36).status().message(),
            "tensor \"a\": has 37 elements ([37]), expected 36");
  EXPECT_EQ(loader.floats("zz", 1).status().message(),
            fmt::format("tensor \"zz\": missing from the checkpoint in {}", dir_));
}

TEST_P(WeightLoaderTest, PlainLinearHoldsTheStoredValues) {
  auto [bytes, values] = random_bf16(7 * 13);
  formats::Checkpoint ckpt = open({{"m.weight", "BF16", {7, 13}, bytes}});
  Result<kernels::LinearWeight> linear = WeightLoader(ckpt, {}).linear("m");
  ASSERT_TRUE(linear.ok()) << linear.status().to_string();
  EXPECT_EQ(linear->out_features(), 7);
  EXPECT_EQ(linear->in_features(), 13);
  EXPECT_FALSE(linear->is_fp8_block());
  std::vector<float> dense(7 * 13);
  linear->dequantize(dense.data());
  EXPECT_EQ(dense, values);
}

TEST_P(WeightLoaderTest, Fp8LinearDequantizesPerBlockWithPartialEdgeTiles) {
  // [130, 200] in 128×128 blocks: scale_inv [2, 2], the last row and column tiles partial.
  const int64_t out = 130, in = 200;
  std::vector<uint8_t> codes(static_cast<size_t>(out * in));
  for (uint8_t& c : codes) {
    do c = static_cast<uint8_t>(rng_() & 0xFF);
    while ((c & 0x7F) == 0x7F);  // no NaN
  }
  std::vector<float> scale = {0.5f, 0.013f, 3.0f, 0.25f};  // not all powers of two
  formats::Checkpoint ckpt = open({{"m.weight", "F8_E4M3", {out, in}, as_bytes(codes)},
                                   {"m.weight_scale_inv", "F32", {2, 2}, as_bytes(scale)}});
  formats::QuantizationConfig quant;
  quant.method = formats::QuantMethod::kFp8Block;
  quant.block_rows = 128;
  quant.block_cols = 128;
  Result<kernels::LinearWeight> linear = WeightLoader(ckpt, quant).linear("m");
  ASSERT_TRUE(linear.ok()) << linear.status().to_string();
  EXPECT_TRUE(linear->is_fp8_block());
  std::vector<float> dense(static_cast<size_t>(out * in));
  linear->dequantize(dense.data());
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      const auto k = static_cast<size_t>(i * in + j);
      ASSERT_EQ(dense[k], formats::decode_e4m3_int(codes[k]) *
                              scale[static_cast<size_t>(i / 128 * 2 + j / 128)])
          << i << "," << j;
    }
}

TEST_P(WeightLoaderTest, Fp8WeightWithoutScaleIsRefusedByName) {
  std::vector<uint8_t> codes(4, 0x38);
  formats::Checkpoint ckpt = open({{"m.weight", "F8_E4M3", {2, 2}, as_bytes(codes)}});
  EXPECT_EQ(WeightLoader(ckpt, {}).linear("m").status().message(),
            fmt::format("tensor \"m.weight_scale_inv\": missing from the checkpoint in {}", dir_));
}

formats::QuantizationConfig mxfp4_config() {
  formats::QuantizationConfig quant;
  quant.method = formats::QuantMethod::kMxfp4CompressedTensors;
  quant.group_size = 32;
  return quant;
}

TEST_P(WeightLoaderTest, Mxfp4LinearLoadsPackedNibblesAndScales) {
  // [5, 96]: packed [5, 48], scales [5, 3]; every nibble value, scale codes incl. 0 and 254.
  const int64_t out = 5, in = 96;
  std::vector<uint8_t> packed(static_cast<size_t>(out * in / 2));
  std::vector<uint8_t> scales(static_cast<size_t>(out * in / 32));
  for (uint8_t& b : packed) b = static_cast<uint8_t>(rng_() & 0xFF);
  for (uint8_t& c : scales) c = static_cast<uint8_t>(100 + rng_() % 40);
  scales[1] = 0;
  scales[7] = 254;
  for (const char* scale_dtype : {"U8", "F8_E8M0"}) {
    SCOPED_TRACE(scale_dtype);
    formats::Checkpoint ckpt =
        open({{"m.weight_packed", "U8", {out, in / 2}, as_bytes(packed)},
              {"m.weight_scale", scale_dtype, {out, in / 32}, as_bytes(scales)},
              {"plain.weight", "BF16", {2, 3}, random_bf16(6).first}});
    WeightLoader loader(ckpt, mxfp4_config());
    Result<kernels::LinearWeight> linear = loader.linear("m");
    ASSERT_TRUE(linear.ok()) << linear.status().to_string();
    EXPECT_TRUE(linear->is_mxfp4());
    EXPECT_EQ(linear->out_features(), out);
    EXPECT_EQ(linear->in_features(), in);
    std::vector<float> dense(static_cast<size_t>(out * in));
    linear->dequantize(dense.data());
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j) {
        const auto k = static_cast<size_t>(i * in + j);
        const uint8_t byte = packed[k / 2];
        ASSERT_EQ(dense[k], formats::decode_e2m1_int(
                                static_cast<uint8_t>(j % 2 == 0 ? byte & 0xF : byte >> 4)) *
                                formats::decode_e8m0_int(scales[k / 32]))
            << i << "," << j;
      }
    // Unquantized modules of the same checkpoint still load as plain weights.
    Result<kernels::LinearWeight> plain = loader.linear("plain");
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    EXPECT_FALSE(plain->is_mxfp4());
  }
}

TEST_P(WeightLoaderTest, Mxfp4LinearErrorsNameTheTensor) {
  std::vector<uint8_t> packed(4 * 32, 0x21);
  std::vector<uint8_t> scales(4 * 2, 127);
  std::vector<uint8_t> nan_scales = scales;
  nan_scales[3] = 0xFF;
  formats::Checkpoint ckpt =
      open({{"ok.weight_packed", "U8", {4, 32}, as_bytes(packed)},
            {"ok.weight_scale", "U8", {4, 2}, as_bytes(scales)},
            {"nan.weight_packed", "U8", {4, 32}, as_bytes(packed)},
            {"nan.weight_scale", "U8", {4, 2}, as_bytes(nan_scales)},
            {"noscale.weight_packed", "U8", {4, 32}, as_bytes(packed)},
            {"shape.weight_packed", "U8", {4, 32}, as_bytes(packed)},
            {"shape.weight_scale", "U8", {2, 4}, as_bytes(scales)},
            {"nvfp4.weight_packed", "U8", {4, 32}, as_bytes(packed)},
            {"nvfp4.weight_scale", "U8", {4, 2}, as_bytes(scales)},
            {"nvfp4.weight_global_scale", "F32", {1}, as_bytes(std::vector<float>{1.0f})}});
  WeightLoader loader(ckpt, mxfp4_config());
  EXPECT_TRUE(loader.linear("ok").ok());
  EXPECT_EQ(loader.linear("nan").status().message(),
            "tensor \"nan.weight_packed\": MXFP4 weight_scale: E8M0 scale code 0xFF (NaN) at "
            "index [1, 1] (element 3 of [4, 2])");
  EXPECT_EQ(
      loader.linear("noscale").status().message(),
      fmt::format("tensor \"noscale.weight_scale\": missing from the checkpoint in {}", dir_));
  EXPECT_EQ(loader.linear("shape").status().message(),
            "tensor \"shape.weight_packed\": MXFP4 weight_scale: expected shape [4, 2] (one code "
            "per 32 inputs) for weight_packed [4, 32], found [2, 4]");
  EXPECT_EQ(loader.linear("nvfp4").status().message(),
            "tensor \"nvfp4.weight_global_scale\": MXFP4 with a global scale or zero point is "
            "another scheme (NVFP4, asymmetric); not supported");
  EXPECT_EQ(WeightLoader(ckpt, {}).linear("ok").status().message(),
            "tensor \"ok.weight_packed\": packed MXFP4 weights need a compressed-tensors "
            "mxfp4-pack-quantized quantization_config");
}

TEST_P(WeightLoaderTest, EmbeddingLooksUpRowsAndComparesBytes) {
  auto [bytes, values] = random_bf16(6 * 4);
  formats::Checkpoint ckpt = open({{"e", "BF16", {6, 4}, bytes},
                                   {"copy", "BF16", {6, 4}, bytes},
                                   {"other", "BF16", {6, 4}, random_bf16(24).first}});
  WeightLoader loader(ckpt, {});
  Result<Embedding> e = loader.embedding("e");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->num_rows(), 6);
  EXPECT_EQ(e->dim(), 4);
  std::vector<int32_t> ids = {5, 0, 5, 2};
  std::vector<float> rows(ids.size() * 4);
  e->lookup(ids, rows.data());
  for (size_t t = 0; t < ids.size(); ++t)
    for (size_t j = 0; j < 4; ++j)
      EXPECT_EQ(rows[t * 4 + j], values[static_cast<size_t>(ids[t]) * 4 + j]);
  EXPECT_TRUE(loader.same_bytes("e", "copy"));
  EXPECT_FALSE(loader.same_bytes("e", "other"));
  EXPECT_FALSE(loader.same_bytes("e", "missing"));
}

// Skew 0: every tensor aligned; skew 1: every BF16/F32 tensor misaligned in the mapping.

// The part one rank reads of a [out, in] weight: rows (column-parallel) or columns (row-parallel)
// of the whole weight, exactly, in every format.
std::vector<float> slice_of_dense(const std::vector<float>& dense, int64_t out, int64_t in,
                                  const TensorSlice& slice) {
  std::vector<float> part;
  const int64_t size = slice.axis == 0 ? out : in;
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      const int64_t at = slice.axis == 0 ? i : j;
      if (at >= slice.begin(size) && at < slice.end(size)) part.push_back(dense[i * in + j]);
    }
  return part;
}

void expect_slices_match(const WeightLoader& loader, int64_t out, int64_t in, int ways) {
  Result<kernels::LinearWeight> whole = loader.linear("m");
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  std::vector<float> dense(static_cast<size_t>(out * in));
  whole->dequantize(dense.data());
  for (int axis : {0, 1})
    for (int index = 0; index < ways; ++index) {
      const TensorSlice slice{.axis = axis, .index = index, .ways = ways};
      SCOPED_TRACE(::testing::Message() << "axis " << axis << " part " << index << "/" << ways);
      Result<kernels::LinearWeight> part = loader.linear("m", slice);
      ASSERT_TRUE(part.ok()) << part.status().to_string();
      EXPECT_EQ(part->out_features(), axis == 0 ? out / ways : out);
      EXPECT_EQ(part->in_features(), axis == 1 ? in / ways : in);
      std::vector<float> got(static_cast<size_t>(part->out_features() * part->in_features()));
      part->dequantize(got.data());
      EXPECT_EQ(got, slice_of_dense(dense, out, in, slice));
    }
}

TEST_P(WeightLoaderTest, SlicesOfEveryFormatAreTheRowsAndColumnsOfTheWhole) {
  {
    SCOPED_TRACE("BF16");
    formats::Checkpoint ckpt = open({{"m.weight", "BF16", {8, 12}, random_bf16(96).first}});
    expect_slices_match(WeightLoader(ckpt, {}), 8, 12, 2);
    expect_slices_match(WeightLoader(ckpt, {}), 8, 12, 4);
  }
  {
    // [256, 512] in 128 x 128 blocks, distinct scales: 4 ways cut columns on block boundaries,
    // rows inside one block each (64 rows), both kept exactly.
    SCOPED_TRACE("FP8");
    const int64_t out = 256, in = 512;
    std::vector<uint8_t> codes(static_cast<size_t>(out * in));
    for (uint8_t& c : codes) {
      do c = static_cast<uint8_t>(rng_() & 0xFF);
      while ((c & 0x7F) == 0x7F);
    }
    std::vector<float> scale = {0.5f, 0.25f, 2.0f, 0.125f, 4.0f, 1.0f, 0.0625f, 8.0f};
    formats::Checkpoint ckpt = open({{"m.weight", "F8_E4M3", {out, in}, as_bytes(codes)},
                                     {"m.weight_scale_inv", "F32", {2, 4}, as_bytes(scale)}});
    formats::QuantizationConfig quant;
    quant.method = formats::QuantMethod::kFp8Block;
    quant.block_rows = 128;
    quant.block_cols = 128;
    expect_slices_match(WeightLoader(ckpt, quant), out, in, 2);
    expect_slices_match(WeightLoader(ckpt, quant), out, in, 4);
    // 3 ways of 512 columns do not divide; 8 ways of 256 rows would be fine, 6 do not divide.
    EXPECT_NE(WeightLoader(ckpt, quant)
                  .linear("m", {.axis = 1, .index = 0, .ways = 3})
                  .status()
                  .message()
                  .find("does not split into 3 equal parts"),
              std::string::npos);
  }
  {
    SCOPED_TRACE("FP8 cut inside a block");
    // [4, 384] columns in 3 ways of 128: fine; [4, 192] in 2 ways of 96 columns: the second part
    // starts at column 96 and crosses into block 1 at 128.
    std::vector<uint8_t> codes(4 * 192, 0x38);
    std::vector<float> scale = {1.0f, 2.0f};
    formats::Checkpoint ckpt = open({{"m.weight", "F8_E4M3", {4, 192}, as_bytes(codes)},
                                     {"m.weight_scale_inv", "F32", {1, 2}, as_bytes(scale)}});
    formats::QuantizationConfig quant;
    quant.method = formats::QuantMethod::kFp8Block;
    quant.block_rows = 128;
    quant.block_cols = 128;
    EXPECT_EQ(WeightLoader(ckpt, quant)
                  .linear("m", {.axis = 1, .index = 1, .ways = 2})
                  .status()
                  .message(),
              "tensor \"m.weight\": columns [96, 192) of this rank cut a 128-wide FP8 scale block");
  }
  {
    SCOPED_TRACE("MXFP4");
    const int64_t out = 4, in = 128;
    std::vector<uint8_t> packed(static_cast<size_t>(out * in / 2));
    std::vector<uint8_t> scales(static_cast<size_t>(out * in / 32));
    for (uint8_t& b : packed) b = static_cast<uint8_t>(rng_() & 0xFF);
    for (uint8_t& c : scales) c = static_cast<uint8_t>(110 + rng_() % 30);
    formats::Checkpoint ckpt = open({{"m.weight_packed", "U8", {out, in / 2}, as_bytes(packed)},
                                     {"m.weight_scale", "U8", {out, in / 32}, as_bytes(scales)}});
    expect_slices_match(WeightLoader(ckpt, mxfp4_config()), out, in, 2);
    expect_slices_match(WeightLoader(ckpt, mxfp4_config()), out, in, 4);
  }
}

TEST_P(WeightLoaderTest, FloatSlicesAndEmbeddingRows) {
  auto [bytes, values] = random_bf16(2 * 6 * 3);
  formats::Checkpoint ckpt =
      open({{"v", "BF16", {2, 6, 3}, bytes}, {"e", "BF16", {6, 3}, bytes.substr(0, 36)}});
  WeightLoader loader(ckpt, {});
  // Axis 1 of [2, 6, 3] in 3 parts: part 1 is channels 2-3 of both outer rows.
  Result<std::vector<float>> part =
      loader.floats("v", Shape{2, 6, 3}, {.axis = 1, .index = 1, .ways = 3});
  ASSERT_TRUE(part.ok()) << part.status().to_string();
  std::vector<float> expected;
  for (int o = 0; o < 2; ++o)
    for (int c = 2; c < 4; ++c)
      for (int i = 0; i < 3; ++i)
        expected.push_back(values[static_cast<size_t>((o * 6 + c) * 3 + i)]);
  EXPECT_EQ(*part, expected);
  // Rows 3-5 of a 6-row table: other ids read as zeros.
  Result<Embedding> table = loader.embedding("e", {.axis = 0, .index = 1, .ways = 2});
  ASSERT_TRUE(table.ok());
  std::vector<int32_t> ids = {1, 4};
  std::vector<float> rows(6);
  table->lookup(ids, rows.data());
  EXPECT_EQ(std::vector<float>(rows.begin(), rows.begin() + 3), std::vector<float>(3, 0.0f));
  EXPECT_EQ(std::vector<float>(rows.begin() + 3, rows.end()),
            std::vector<float>(values.begin() + 12, values.begin() + 15));
}

INSTANTIATE_TEST_SUITE_P(Alignment, WeightLoaderTest, ::testing::Values(0u, 1u));

}  // namespace weight_loader_test
}  // namespace dz::model

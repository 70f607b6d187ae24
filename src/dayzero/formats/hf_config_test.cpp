#include "dayzero/formats/hf_config.h"

#include <gtest/gtest.h>

namespace dz::formats {
namespace hf_config_test {

ConfigObject parse_ok(std::string_view text) {
  auto obj = ConfigObject::parse(text, "config.json");
  EXPECT_TRUE(obj.ok()) << obj.status().to_string();
  return std::move(obj).value();
}

TEST(HfConfig, ReadsTypedFields) {
  ConfigObject obj = parse_ok(R"({"a": 7, "b": 1e-5, "c": true, "d": "x", "n": null,
                                  "l": [1, 2, 3], "s": ["p", "q"], "o": {"k": 2}})");
  EXPECT_EQ(*obj.required_int("a"), 7);
  EXPECT_EQ(*obj.required_positive_int("a"), 7);
  EXPECT_DOUBLE_EQ(*obj.required_number("b"), 1e-5);
  EXPECT_DOUBLE_EQ(*obj.required_number("a"), 7.0);  // integers are numbers
  EXPECT_TRUE(*obj.required_bool("c"));
  EXPECT_EQ(*obj.required_string("d"), "x");
  EXPECT_FALSE(obj.has("n"));  // null means unset
  EXPECT_FALSE(obj.optional_positive_int("n")->has_value());
  EXPECT_EQ(*obj.optional_non_negative_int("missing", 5), 5);
  EXPECT_EQ(*obj.required_positive_int_list("l"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(*obj.optional_string_list("s"), (std::vector<std::string>{"p", "q"}));
  auto nested = obj.required_object("o");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->path(), "o");
  EXPECT_EQ(nested->field_path("k"), "o.k");
  EXPECT_EQ(*nested->required_int("k"), 2);
}

TEST(HfConfig, ErrorsNameFileAndJsonPath) {
  ConfigObject obj = parse_ok(
      R"({"text_config": {"linear_attn_config": {"kda_layers": [1, 2, 3, "x"]}}, "h": -3,
          "f": "1.5", "b": 1, "i": 2.5})");
  auto inner = obj.required_object("text_config")->required_object("linear_attn_config");
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(inner->required_positive_int_list("kda_layers").status().message(),
            "config.json: field \"text_config.linear_attn_config.kda_layers[3]\": expected a "
            "positive integer, found \"x\"");
  EXPECT_EQ(obj.required_positive_int("h").status().message(),
            "config.json: field \"h\": expected a positive integer, found -3");
  EXPECT_EQ(obj.required_number("f").status().message(),
            "config.json: field \"f\": expected a number, found \"1.5\"");
  EXPECT_EQ(obj.required_bool("b").status().message(),
            "config.json: field \"b\": expected true or false, found 1");
  EXPECT_EQ(obj.required_int("i").status().message(),
            "config.json: field \"i\": expected an integer, found 2.5");
  EXPECT_EQ(obj.required_int("hidden_size").status().message(),
            "config.json: field \"hidden_size\": required field is missing");
  EXPECT_EQ(obj.required_object("h").status().message(),
            "config.json: field \"h\": expected an object, found -3");
}

TEST(HfConfig, RefusesBadJsonAndNonObjects) {
  auto bad = ConfigObject::parse("{\"a\": 1,", "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(bad.status().message().starts_with("config.json: invalid JSON: "))
      << bad.status().message();
  auto list = ConfigObject::parse("[1, 2]", "config.json");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().message(), "config.json: expected a JSON object at the top, found [1,2]");
  auto missing = ConfigObject::load("/nonexistent/dir/config.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(HfConfig, IntegerOutOfRangeIsRefused) {
  ConfigObject obj = parse_ok(R"({"a": 18446744073709551615})");
  EXPECT_EQ(obj.required_int("a").status().message(),
            "config.json: field \"a\": expected an integer, found 18446744073709551615");
}

TEST(HfConfig, HugeIntegersAreRefusedBeforeTheyReachShapes) {
  ConfigObject obj = parse_ok(R"({"a": 16777217, "l": [1, 16777217]})");
  EXPECT_EQ(obj.required_positive_int("a").status().message(),
            "config.json: field \"a\": 16777217 exceeds the limit 16777216");
  EXPECT_EQ(obj.required_positive_int_list("l").status().message(),
            "config.json: field \"l[1]\": expected a positive integer, found 16777217");
}

TEST(HfConfig, ParsesYarnRopeScaling) {
  ConfigObject obj = parse_ok(R"({"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                  "type": "yarn"})");
  auto rope = parse_rope_scaling(obj);
  ASSERT_TRUE(rope.ok()) << rope.status().to_string();
  EXPECT_EQ(rope->type, "yarn");
  EXPECT_DOUBLE_EQ(rope->factor, 40.0);
  EXPECT_EQ(rope->original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(rope->beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(rope->beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(rope->mscale_all_dim, 1.0);
  auto linear = parse_rope_scaling(parse_ok(R"({"rope_type": "linear", "factor": 2})"));
  EXPECT_EQ(
      linear.status().message(),
      "config.json: field \"rope_type\": unsupported rope scaling \"linear\" (supported: yarn)");
}

constexpr const char* kFp8 = R"({"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]})";

TEST(HfConfig, ParsesFp8BlockQuantization) {
  auto q = parse_quantization_config(parse_ok(kFp8));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->method, QuantMethod::kFp8Block);
  EXPECT_EQ(q->block_rows, 128);
  EXPECT_EQ(q->block_cols, 128);
  EXPECT_EQ(q->scale_fmt, "ue8m0");
  auto plain = parse_quantization_config(parse_ok(
      R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "weight_block_size": [64, 32]})"));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->scale_fmt.has_value());
  EXPECT_EQ(plain->block_cols, 32);
}

TEST(HfConfig, RefusesUnsupportedFp8Variants) {
  auto expect_error = [](std::string_view text, std::string_view message) {
    auto q = parse_quantization_config(parse_ok(text));
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.status().message(), message);
  };
  expect_error(R"({"activation_scheme": "dynamic", "fmt": "e5m2", "quant_method": "fp8",
                   "weight_block_size": [128, 128]})",
               "config.json: field \"fmt\": unsupported FP8 format \"e5m2\" (supported: e4m3)");
  expect_error(
      R"({"activation_scheme": "static", "fmt": "e4m3", "quant_method": "fp8",
                   "weight_block_size": [128, 128]})",
      "config.json: field \"activation_scheme\": unsupported \"static\" (supported: dynamic)");
  expect_error(R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                   "weight_block_size": [128]})",
               "config.json: field \"weight_block_size\": expected two positive integers [rows, "
               "cols], found [128]");
  expect_error(R"({"quant_method": "awq"})",
               "config.json: field \"quant_method\": unsupported \"awq\" (supported: fp8, "
               "compressed-tensors, mxfp4)");
}

constexpr const char* kMxfp4 = R"({
  "config_groups": {"group_0": {"input_activations": null, "output_activations": null,
    "targets": ["Linear"], "weights": {"group_size": 32, "num_bits": 4, "strategy": "group",
    "symmetric": true, "type": "float"}}},
  "format": "mxfp4-pack-quantized", "kv_cache_scheme": null,
  "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "language_model.lm_head"],
  "quant_method": "compressed-tensors", "quantization_status": "compressed"})";

TEST(HfConfig, ParsesCompressedTensorsMxfp4AndMatchesIgnoreList) {
  auto q = parse_quantization_config(parse_ok(kMxfp4));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->method, QuantMethod::kMxfp4CompressedTensors);
  EXPECT_EQ(q->group_size, 32);
  EXPECT_EQ(q->ignore.size(), 3u);
  EXPECT_TRUE(q->ignores("language_model.model.layers.3.self_attn.q_a_proj"));
  EXPECT_TRUE(q->ignores("language_model.model.layers.1.block_sparse_moe.shared_experts.up_proj"));
  EXPECT_TRUE(q->ignores("language_model.lm_head"));
  EXPECT_FALSE(q->ignores("lm_head"));  // plain entries must equal the module name
  EXPECT_FALSE(q->ignores("language_model.model.layers.1.block_sparse_moe.experts.0.w1"));
}

TEST(HfConfig, RefusesOtherCompressedTensorsSchemes) {
  auto with = [](std::string_view from, std::string_view to) {
    std::string text = kMxfp4;
    text.replace(text.find(from), from.size(), to);
    auto q = parse_quantization_config(parse_ok(text));
    return q.ok() ? std::string() : q.status().message();
  };
  EXPECT_EQ(with("\"num_bits\": 4", "\"num_bits\": 8"),
            "config.json: field \"config_groups.group_0.weights.num_bits\": expected 4, found 8");
  EXPECT_EQ(
      with("\"group_size\": 32", "\"group_size\": 16"),
      "config.json: field \"config_groups.group_0.weights.group_size\": expected 32, found 16");
  EXPECT_EQ(with("\"type\": \"float\"", "\"type\": \"int\""),
            "config.json: field \"config_groups.group_0.weights.type\": expected \"float\", found "
            "\"int\"");
  EXPECT_EQ(with("\"input_activations\": null", "\"input_activations\": {\"num_bits\": 8}"),
            "config.json: field \"config_groups.group_0.input_activations\": activation "
            "quantization is not supported (expected null)");
  EXPECT_EQ(with("mxfp4-pack-quantized", "nvfp4-pack-quantized"),
            "config.json: field \"format\": expected \"mxfp4-pack-quantized\", found "
            "\"nvfp4-pack-quantized\"");
  // std::regex words its own message; only the prefix is ours.
  EXPECT_TRUE(with("\"re:.*self_attn.*\"", "\"re:(\"")
                  .starts_with("config.json: field \"ignore[0]\": invalid regular expression"));
}

TEST(HfConfig, ParsesGptOssMxfp4) {
  auto q = parse_quantization_config(
      parse_ok(R"({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                   "re:.*router.*", "lm_head"]})"));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->method, QuantMethod::kMxfp4GptOss);
  EXPECT_TRUE(q->ignores("model.layers.0.mlp.router"));
  EXPECT_TRUE(q->ignores("lm_head"));
  EXPECT_FALSE(q->ignores("model.layers.0.mlp.experts"));
}

}  // namespace hf_config_test
}  // namespace dz::formats

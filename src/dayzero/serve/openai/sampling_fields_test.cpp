#include "dayzero/serve/openai/sampling_fields.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace dz::serve::openai {
namespace sampling_fields_test {

using nlohmann::json;

// `extra` is spliced after "model": "m" (start it with a comma).
std::variant<SamplingFields, ApiError> parse(const std::string& extra,
                                             const ParseLimits& limits = {}) {
  const json body = json::parse(R"({"model":"m")" + extra + "}");
  SamplingFields fields;
  if (auto error = read_sampling_fields(body, limits, fields)) return *error;
  if (auto error = validate_sampling_fields(fields, limits)) return *error;
  return fields;
}

SamplingFields parse_ok(const std::string& extra, const ParseLimits& limits = {}) {
  auto result = parse(extra, limits);
  if (auto* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << extra << ": " << error->message;
    return {};
  }
  return std::get<SamplingFields>(result);
}

TEST(SamplingFields, DefaultsAreOpenAis) {
  const SamplingFields f = parse_ok("");
  EXPECT_EQ(f.model, "m");
  EXPECT_FALSE(f.stream);
  EXPECT_FALSE(f.stream_options.include_usage);
  EXPECT_FLOAT_EQ(f.sampling.temperature, 1.0f);
  EXPECT_FALSE(f.temperature_set);
  EXPECT_FLOAT_EQ(f.sampling.top_p, 1.0f);
  EXPECT_EQ(f.sampling.top_k, 0);
  EXPECT_FALSE(f.seed);
  EXPECT_FALSE(f.max_tokens);
  EXPECT_EQ(f.n, 1);
  EXPECT_TRUE(f.skip_special_tokens);
  EXPECT_EQ(f.priority, 0);
  EXPECT_TRUE(f.cache_salt.empty());
}

TEST(SamplingFields, ReadsEveryField) {
  const SamplingFields f = parse_ok(R"(,
      "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true},
      "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
      "presence_penalty": -0.5, "frequency_penalty": 1.5, "seed": 1234,
      "stop": ["###", "END"], "stop_token_ids": [7, 9], "ignore_eos": true,
      "include_stop_str_in_output": true, "min_tokens": 3, "max_tokens": 50, "n": 4,
      "logit_bias": {"15": -100, "2": 5.5}, "skip_special_tokens": false, "priority": -2,
      "cache_salt": "tenant-a", "user": "ignored", "unknown_field": {"x": 1})");
  EXPECT_TRUE(f.stream);
  EXPECT_TRUE(f.stream_options.include_usage);
  EXPECT_TRUE(f.stream_options.continuous_usage_stats);
  EXPECT_FLOAT_EQ(f.sampling.temperature, 0.7f);
  EXPECT_TRUE(f.temperature_set && f.top_p_set && f.top_k_set && f.min_p_set &&
              f.repetition_penalty_set);
  EXPECT_FLOAT_EQ(f.sampling.top_p, 0.9f);
  EXPECT_EQ(f.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(f.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(f.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(f.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(f.sampling.frequency_penalty, 1.5f);
  EXPECT_EQ(f.seed, 1234u);
  EXPECT_EQ(f.sampling.seed, 1234u);
  EXPECT_EQ(f.sampling.stop, (std::vector<std::string>{"###", "END"}));
  EXPECT_EQ(f.sampling.stop_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_TRUE(f.sampling.ignore_eos);
  EXPECT_TRUE(f.sampling.include_stop_str_in_output);
  EXPECT_EQ(f.sampling.min_tokens, 3);
  EXPECT_EQ(f.max_tokens, 50);
  EXPECT_EQ(f.n, 4);
  // nlohmann objects iterate in key order: "15" < "2".
  ASSERT_EQ(f.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(f.sampling.logit_bias[0], (std::pair<int32_t, float>{15, -100.0f}));
  EXPECT_EQ(f.sampling.logit_bias[1], (std::pair<int32_t, float>{2, 5.5f}));
  EXPECT_FALSE(f.skip_special_tokens);
  EXPECT_EQ(f.priority, -2);
  EXPECT_EQ(f.cache_salt, "tenant-a");
}

TEST(SamplingFields, NullMeansAbsent) {
  const SamplingFields f = parse_ok(R"(, "temperature": null, "stop": null, "seed": null,
      "max_tokens": null, "logit_bias": null, "stream_options": null, "n": null)");
  EXPECT_FALSE(f.temperature_set);
  EXPECT_TRUE(f.sampling.stop.empty());
  EXPECT_FALSE(f.seed);
  EXPECT_FALSE(f.max_tokens);
  EXPECT_EQ(f.n, 1);
}

TEST(SamplingFields, StopAsOneString) {
  EXPECT_EQ(parse_ok(R"(, "stop": "\n\n")").sampling.stop, (std::vector<std::string>{"\n\n"}));
}

TEST(SamplingFields, MaxCompletionTokensWinsOverMaxTokens) {
  EXPECT_EQ(parse_ok(R"(, "max_tokens": 10, "max_completion_tokens": 20)").max_tokens, 20);
  EXPECT_EQ(parse_ok(R"(, "max_completion_tokens": 20, "max_tokens": 10)").max_tokens, 20);
}

TEST(SamplingFields, SeedsTakeEveryInt64AndUint64) {
  EXPECT_EQ(parse_ok(R"(, "seed": -1)").seed, ~uint64_t{0});
  EXPECT_EQ(parse_ok(R"(, "seed": 18446744073709551615)").seed, ~uint64_t{0});
  EXPECT_EQ(parse_ok(R"(, "seed": 42.0)").seed, 42u);
}

TEST(SamplingFields, IntegralFloatsAreIntegers) {
  EXPECT_EQ(parse_ok(R"(, "n": 2.0, "top_k": 5.0)").n, 2);
  EXPECT_EQ(parse_ok(R"(, "top_k": -1)").sampling.top_k, -1);
}

TEST(SamplingFields, ZeroTemperatureIsGreedy) {
  const SamplingFields f = parse_ok(R"(, "temperature": 0)");
  EXPECT_TRUE(f.temperature_set);
  EXPECT_EQ(f.sampling.temperature, 0.0f);
}

TEST(SamplingFields, VocabSizeChecksTokenIds) {
  const ParseLimits limits{.vocab_size = 100};
  parse_ok(R"(, "logit_bias": {"99": 1}, "stop_token_ids": [99])", limits);
  auto bias = parse(R"(, "logit_bias": {"100": 1})", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bias));
  EXPECT_EQ(std::get<ApiError>(bias).param, "logit_bias");
  auto stop = parse(R"(, "stop_token_ids": [100])", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(stop));
  EXPECT_EQ(std::get<ApiError>(stop).param, "stop_token_ids");
}

struct BadCase {
  const char* extra;
  const char* param;
  const char* message;  // the exact message
};

TEST(SamplingFields, BadValuesGive400NamingTheField) {
  const BadCase cases[] = {
      {R"(, "stream": "yes")", "stream", "stream: expected a boolean, got a string"},
      {R"(, "stream_options": [])", "stream_options",
       "stream_options: expected an object, got an array"},
      {R"(, "stream_options": {"include_usage": 1})", "stream_options.include_usage",
       "stream_options.include_usage: expected a boolean, got an integer"},
      {R"(, "temperature": "hot")", "temperature", "temperature: expected a number, got a string"},
      {R"(, "temperature": -0.5)", "temperature",
       "temperature must be a finite number >= 0, got -0.5"},
      {R"(, "temperature": 1e300)", "temperature",
       "temperature must be a finite number, got 1e+300"},
      {R"(, "top_p": 0)", "top_p", "top_p must be in (0, 1], got 0"},
      {R"(, "top_p": 1.5)", "top_p", "top_p must be in (0, 1], got 1.5"},
      {R"(, "top_k": -2)", "top_k", "top_k must be -1 or 0 (off) or a positive count, got -2"},
      {R"(, "top_k": 1.5)", "top_k",
       "top_k: expected an integer in [-2147483648, 2147483647], got 1.5"},
      {R"(, "top_k": 3000000000)", "top_k",
       "top_k must be in [-2147483648, 2147483647], got 3000000000"},
      {R"(, "min_p": 2)", "min_p", "min_p must be in [0, 1], got 2"},
      {R"(, "repetition_penalty": 0)", "repetition_penalty",
       "repetition_penalty must be a finite number > 0, got 0"},
      {R"(, "presence_penalty": 3)", "presence_penalty",
       "presence_penalty must be in [-2, 2], got 3"},
      {R"(, "frequency_penalty": -2.5)", "frequency_penalty",
       "frequency_penalty must be in [-2, 2], got -2.5"},
      {R"(, "seed": "1")", "seed", "seed: expected an integer, got a string"},
      {R"(, "seed": 1.5)", "seed", "seed: expected an integer, got a number"},
      {R"(, "stop": 5)", "stop", "stop: expected a string or a list of strings, got an integer"},
      {R"(, "stop": ["a", 5])", "stop",
       "stop: expected a string or a list of strings, got an integer"},
      {R"(, "stop": [""])", "stop", "stop: stop strings must not be empty"},
      {R"(, "stop_token_ids": 5)", "stop_token_ids",
       "stop_token_ids: expected a list of token ids, got an integer"},
      {R"(, "stop_token_ids": [-1])", "stop_token_ids",
       "stop_token_ids: expected token ids, got -1"},
      {R"(, "logit_bias": [1])", "logit_bias",
       "logit_bias: expected an object of token id to bias, got an array"},
      {R"(, "logit_bias": {"abc": 1})", "logit_bias",
       "logit_bias keys must be token ids, got \"abc\""},
      {R"(, "logit_bias": {"-3": 1})", "logit_bias",
       "logit_bias keys must be token ids, got \"-3\""},
      {R"(, "logit_bias": {"3": "x"})", "logit_bias",
       "logit_bias of token 3: expected a number, got a string"},
      {R"(, "logit_bias": {"3": 101})", "logit_bias",
       "logit_bias of token 3 must be in [-100, 100], got 101"},
      {R"(, "logit_bias": {"3": 1e300})", "logit_bias",
       "logit_bias of token 3 must be in [-100, 100], got 1e+300"},
      {R"(, "ignore_eos": 0)", "ignore_eos", "ignore_eos: expected a boolean, got an integer"},
      {R"(, "min_tokens": -1)", "min_tokens",
       "min_tokens must be in [0, 9223372036854775807], got -1"},
      {R"(, "max_tokens": 0)", "max_tokens",
       "max_tokens must be in [1, 9223372036854775807], got 0"},
      {R"(, "max_tokens": "5")", "max_tokens", "max_tokens: expected an integer, got a string"},
      {R"(, "max_completion_tokens": -4)", "max_completion_tokens",
       "max_completion_tokens must be in [1, 9223372036854775807], got -4"},
      {R"(, "min_tokens": 9, "max_tokens": 8)", "min_tokens",
       "min_tokens (9) must not exceed max_tokens (8)"},
      {R"(, "n": 0)", "n", "n must be in [1, 16], got 0"},
      {R"(, "n": 17)", "n", "n must be in [1, 16], got 17"},
      {R"(, "skip_special_tokens": "no")", "skip_special_tokens",
       "skip_special_tokens: expected a boolean, got a string"},
      {R"(, "priority": 1.5)", "priority",
       "priority: expected an integer in [-2147483648, 2147483647], got 1.5"},
      {R"(, "cache_salt": 5)", "cache_salt", "cache_salt: expected a string, got an integer"},
      {R"(, "cache_salt": "")", "cache_salt", "cache_salt must be a non-empty string when given"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.extra);
    auto result = parse(c.extra);
    ASSERT_TRUE(std::holds_alternative<ApiError>(result));
    const ApiError& error = std::get<ApiError>(result);
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.code, "invalid_value");
    EXPECT_EQ(error.param, c.param);
    EXPECT_EQ(error.message, c.message);
  }
}

TEST(SamplingFields, StopLimits) {
  const ParseLimits limits{.max_stop_strings = 2, .max_stop_string_bytes = 3};
  parse_ok(R"(, "stop": ["abc", "de"])", limits);
  auto many = parse(R"(, "stop": ["a", "b", "c"])", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(many));
  EXPECT_EQ(std::get<ApiError>(many).message, "stop has 3 strings, at most 2 are allowed");
  auto is_long = parse(R"(, "stop": "abcd")", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(is_long));
  EXPECT_EQ(std::get<ApiError>(is_long).message, "stop strings must be at most 3 bytes, got 4");
}

TEST(SamplingFields, LogitBiasAndStopIdLimits) {
  const ParseLimits limits{.max_stop_token_ids = 1, .max_logit_bias = 1};
  auto bias = parse(R"(, "logit_bias": {"1": 1, "2": 2})", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bias));
  EXPECT_EQ(std::get<ApiError>(bias).message, "logit_bias has 2 entries, at most 1");
  auto ids = parse(R"(, "stop_token_ids": [1, 2])", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(ids));
  EXPECT_EQ(std::get<ApiError>(ids).message, "stop_token_ids has 2 ids, at most 1");
}

TEST(SamplingFields, ModelIsRequiredAndAString) {
  SamplingFields fields;
  auto missing = read_sampling_fields(json::parse("{}"), {}, fields);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->param, "model");
  EXPECT_EQ(missing->message, "model is required");
  auto wrong = read_sampling_fields(json::parse(R"({"model": 3})"), {}, fields);
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->param, "model");
  EXPECT_EQ(wrong->message, "model: expected a string, got an integer");
}

}  // namespace sampling_fields_test
}  // namespace dz::serve::openai

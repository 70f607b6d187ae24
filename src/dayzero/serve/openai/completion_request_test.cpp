#include "dayzero/serve/openai/completion_request.h"

#include <gtest/gtest.h>

#include <string>

namespace dz::serve::openai {
namespace completion_request_test {

CompletionRequest parse_ok(const std::string& body, const ParseLimits& limits = {}) {
  auto result = parse_completion_request(body, limits);
  if (auto* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << body << ": " << error->message;
    return {};
  }
  return std::get<CompletionRequest>(std::move(result));
}

ApiError parse_error(const std::string& body, const ParseLimits& limits = {}) {
  auto result = parse_completion_request(body, limits);
  if (!std::holds_alternative<ApiError>(result)) {
    ADD_FAILURE() << body << ": parsed";
    return {};
  }
  return std::get<ApiError>(result);
}

std::string body_with(const std::string& rest) {
  return R"({"model": "m", )" + rest + "}";
}

using Ids = std::vector<int32_t>;

TEST(CompletionRequest, TextPrompt) {
  const CompletionRequest request = parse_ok(body_with(R"("prompt": "Once upon")"));
  EXPECT_EQ(request.fields.model, "m");
  ASSERT_EQ(request.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(request.prompts[0]), "Once upon");
  EXPECT_FALSE(request.echo);
  EXPECT_FALSE(request.fields.sampling.logprobs);
}

TEST(CompletionRequest, EveryPromptShape) {
  const CompletionRequest strings = parse_ok(body_with(R"("prompt": ["a", "b c"])"));
  ASSERT_EQ(strings.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::string>(strings.prompts[1]), "b c");
  const CompletionRequest ids = parse_ok(body_with(R"("prompt": [1, 2, 3])"));
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_EQ(std::get<Ids>(ids.prompts[0]), (Ids{1, 2, 3}));
  const CompletionRequest lists = parse_ok(body_with(R"("prompt": [[1], [2, 3]])"));
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(std::get<Ids>(lists.prompts[0]), (Ids{1}));
  EXPECT_EQ(std::get<Ids>(lists.prompts[1]), (Ids{2, 3}));
}

TEST(CompletionRequest, EchoLogprobsAndSharedFields) {
  const CompletionRequest request = parse_ok(body_with(
      R"("prompt": "x", "echo": true, "logprobs": 3, "max_tokens": 7, "best_of": 1,
         "suffix": null, "n": 2, "stop": "\n")"));
  EXPECT_TRUE(request.echo);
  EXPECT_TRUE(request.fields.sampling.logprobs);
  EXPECT_EQ(request.fields.sampling.top_logprobs, 3);
  EXPECT_EQ(request.fields.max_tokens, 7);
  EXPECT_EQ(request.fields.n, 2);
  EXPECT_EQ(request.fields.sampling.stop, (std::vector<std::string>{"\n"}));
  const CompletionRequest zero = parse_ok(body_with(R"("prompt": "x", "logprobs": 0)"));
  EXPECT_TRUE(zero.fields.sampling.logprobs);
  EXPECT_EQ(zero.fields.sampling.top_logprobs, 0);
}

TEST(CompletionRequest, LogprobsCapFollowsTheLimit) {
  const ParseLimits limits{.max_completion_logprobs = 20};
  EXPECT_EQ(
      parse_ok(body_with(R"("prompt": "x", "logprobs": 20)"), limits).fields.sampling.top_logprobs,
      20);
}

TEST(CompletionRequest, VocabSizeChecksPromptIds) {
  const ParseLimits limits{.vocab_size = 10};
  parse_ok(body_with(R"("prompt": [0, 9])"), limits);
  const ApiError flat = parse_error(body_with(R"("prompt": [0, 10])"), limits);
  EXPECT_EQ(flat.param, "prompt");
  EXPECT_EQ(flat.message, "prompt: token id 10 is outside the vocabulary [0, 9]");
  const ApiError nested = parse_error(body_with(R"("prompt": [[1], [2, 10]])"), limits);
  EXPECT_EQ(nested.param, "prompt[1]");
  EXPECT_EQ(nested.message, "prompt[1]: token id 10 is outside the vocabulary [0, 9]");
}

TEST(CompletionRequest, TooManyPrompts) {
  const ParseLimits limits{.max_prompts = 2};
  parse_ok(body_with(R"("prompt": ["a", "b"])"), limits);
  parse_ok(body_with(R"("prompt": [1, 2, 3, 4])"), limits);  // one prompt of four ids
  const ApiError error = parse_error(body_with(R"("prompt": ["a", "b", "c"])"), limits);
  EXPECT_EQ(error.param, "prompt");
  EXPECT_EQ(error.message, "prompt has 3 entries, at most 2 are allowed");
}

struct BadCase {
  std::string body;
  std::string param;
  std::string message;
};

TEST(CompletionRequest, BadRequestsGive400NamingTheField) {
  const BadCase cases[] = {
      {R"({"prompt": "x"})", "model", "model is required"},
      {R"({"model": "m"})", "prompt", "prompt is required"},
      {body_with(R"("prompt": null)"), "prompt", "prompt is required"},
      {body_with(R"("prompt": "")"), "prompt", "prompt must not be empty"},
      {body_with(R"("prompt": [])"), "prompt", "prompt must not be an empty list"},
      {body_with(R"("prompt": 5)"), "prompt",
       "prompt: expected a string, a list of strings, a list of token ids or a list of lists, "
       "got an integer"},
      {body_with(R"("prompt": ["a", 1])"), "prompt[1]",
       "prompt[1]: expected a string (the list holds strings), got an integer"},
      {body_with(R"("prompt": ["a", ""])"), "prompt[1]", "prompt[1] must not be empty"},
      {body_with(R"("prompt": [1, "a"])"), "prompt", "prompt: expected token ids, got a string"},
      {body_with(R"("prompt": [1, -1])"), "prompt",
       "prompt: token id -1 is outside the vocabulary [0, 2147483647]"},
      {body_with(R"("prompt": [1, 1.5])"), "prompt", "prompt: expected token ids, got a number"},
      {body_with(R"("prompt": [[1], "a"])"), "prompt[1]",
       "prompt[1]: expected a list of token ids (the list holds lists), got a string"},
      {body_with(R"("prompt": [[1], []])"), "prompt[1]",
       "prompt[1]: a token-id prompt must not be empty"},
      {body_with(R"("prompt": [{"a": 1}])"), "prompt[0]",
       "prompt[0]: expected a list of token ids (the list holds lists), got an object"},
      {body_with(R"("prompt": "x", "echo": 1)"), "echo",
       "echo: expected a boolean, got an integer"},
      {body_with(R"("prompt": "x", "logprobs": true)"), "logprobs",
       "logprobs: expected an integer, got a boolean"},
      {body_with(R"("prompt": "x", "logprobs": 6)"), "logprobs",
       "logprobs must be in [0, 5], got 6"},
      {body_with(R"("prompt": "x", "logprobs": -1)"), "logprobs",
       "logprobs must be in [0, 5], got -1"},
      {body_with(R"("prompt": "x", "suffix": "end")"), "suffix", "suffix is not supported"},
      {body_with(R"("prompt": "x", "best_of": 2)"), "best_of", "best_of is not supported (only 1)"},
      {body_with(R"("prompt": "x", "temperature": -1)"), "temperature",
       "temperature must be a finite number >= 0, got -1"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError error = parse_error(c.body);
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.code, "invalid_value");
    EXPECT_EQ(error.param, c.param);
    EXPECT_EQ(error.message, c.message);
  }
}

TEST(CompletionRequest, BadJson) {
  const ApiError error = parse_error(R"({"model": "m", "prompt": "x",})");
  EXPECT_EQ(error.http_status, 400);
  EXPECT_FALSE(error.param);
  EXPECT_NE(error.message.find("not valid JSON (at byte"), std::string::npos) << error.message;
  const ApiError huge = parse_error(R"({"model": "m", "prompt": "x", "temperature": 1e400})");
  EXPECT_NE(huge.message.find("not valid JSON"), std::string::npos) << huge.message;
}

}  // namespace completion_request_test
}  // namespace dz::serve::openai

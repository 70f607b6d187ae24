#include "dayzero/serve/openai/response_common.h"

#include <gtest/gtest.h>

#include <limits>

namespace dz::serve::openai {
namespace response_common_test {

using nlohmann::json;

TEST(ResponseCommon, SseFraming) {
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_keep_alive(), ": keep-alive\n\n");
  EXPECT_EQ(sse_error(ApiError::internal("boom")),
            "data: {\"error\":{\"code\":null,\"message\":\"boom\",\"param\":null,"
            "\"type\":\"internal_error\"}}\n\n");
}

TEST(ResponseCommon, DumpReplacesInvalidUtf8) {
  EXPECT_EQ(dump_json(json("a\xff")), "\"a\xef\xbf\xbd\"");
}

TEST(ResponseCommon, ResponseIdsAreFreshHex) {
  const std::string a = make_response_id("chatcmpl-");
  const std::string b = make_response_id("chatcmpl-");
  ASSERT_EQ(a.size(), 9u + 32u);
  EXPECT_EQ(a.substr(0, 9), "chatcmpl-");
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 9), std::string::npos);
  EXPECT_NE(a, b);
  EXPECT_EQ(make_response_id("cmpl-").substr(0, 5), "cmpl-");
}

TEST(ResponseCommon, Usage) {
  EXPECT_EQ(usage_json({.prompt_tokens = 10, .completion_tokens = 5, .cached_tokens = 8}),
            json::parse(R"({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                "prompt_tokens_details": {"cached_tokens": 8}})"));
}

TEST(ResponseCommon, TokenTextAndLogprob) {
  const runtime::TokenBytesFn bytes = [](int32_t id) -> std::optional<std::string> {
    if (id == 7) return std::string("\xc3");
    return std::nullopt;
  };
  const TokenText text = token_text(bytes, 7);
  EXPECT_EQ(text.text, "\xef\xbf\xbd");
  EXPECT_EQ(text.bytes, "\xc3");
  EXPECT_EQ(token_text(bytes, 8).text, "");
  EXPECT_EQ(token_text({}, 7).bytes, "");
  EXPECT_EQ(json_logprob(-1.5f), -1.5);
  EXPECT_EQ(json_logprob(-std::numeric_limits<float>::infinity()), -9999.0);
  EXPECT_EQ(json_logprob(std::numeric_limits<float>::quiet_NaN()), -9999.0);
}

TEST(ResponseCommon, CodePoints) {
  EXPECT_EQ(num_code_points(""), 0);
  EXPECT_EQ(num_code_points("abc"), 3);
  EXPECT_EQ(num_code_points("\xe2\x82\xac\xf0\x9f\x98\x80x"), 3);
}

}  // namespace response_common_test
}  // namespace dz::serve::openai

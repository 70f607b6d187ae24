#include "dayzero/serve/openai/api_error.h"

#include <gtest/gtest.h>

namespace dz::serve::openai {
namespace api_error_test {

using nlohmann::json;

TEST(ApiError, ToJsonHasOpenAiShapeWithNulls) {
  const ApiError error = ApiError::internal("engine failed");
  EXPECT_EQ(error.to_json(), json::parse(R"({"error":{"message":"engine failed",
      "type":"internal_error","param":null,"code":null}})"));
}

TEST(ApiError, InvalidValueNamesParamAndCode) {
  const ApiError error = ApiError::invalid_value("temperature", "bad");
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.to_json(), json::parse(R"({"error":{"message":"bad",
      "type":"invalid_request_error","param":"temperature","code":"invalid_value"}})"));
}

TEST(ApiError, FactoriesHaveTheStatusTypeAndCodeOfTheTable) {
  struct Case {
    ApiError error;
    int http_status;
    const char* type;
    std::optional<std::string> code;
    std::optional<std::string> param;
  };
  const Case cases[] = {
      {ApiError::invalid_json("x"), 400, "invalid_request_error", "invalid_value", std::nullopt},
      {ApiError::context_length_exceeded("messages", "x"), 400, "invalid_request_error",
       "context_length_exceeded", "messages"},
      {ApiError::model_not_found("m"), 404, "invalid_request_error", "model_not_found", "model"},
      {ApiError::body_too_large(11, 10), 413, "invalid_request_error", std::nullopt, std::nullopt},
      {ApiError::not_found("x"), 404, "invalid_request_error", "not_found", std::nullopt},
      {ApiError::unauthorized(), 401, "authentication_error", "invalid_api_key", std::nullopt},
      {ApiError::overloaded("x"), 503, "server_overloaded", std::nullopt, std::nullopt},
      {ApiError::service_unavailable("x"), 503, "service_unavailable", std::nullopt, std::nullopt},
      {ApiError::internal("x"), 500, "internal_error", std::nullopt, std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error.message);
    EXPECT_EQ(c.error.http_status, c.http_status);
    EXPECT_EQ(c.error.type, c.type);
    EXPECT_EQ(c.error.code, c.code);
    EXPECT_EQ(c.error.param, c.param);
  }
  EXPECT_EQ(ApiError::model_not_found("gpt-9").message, "The model `gpt-9` does not exist.");
  EXPECT_EQ(ApiError::body_too_large(11, 10).message,
            "The request body is 11 bytes, above the limit of 10 bytes.");
}

TEST(ApiError, FromStatusMapsCodes) {
  const ApiError bad = ApiError::from_status(Status(StatusCode::kInvalidArgument, "no"), "prompt");
  EXPECT_EQ(bad.http_status, 400);
  EXPECT_EQ(bad.param, "prompt");
  EXPECT_EQ(bad.message, "no");
  EXPECT_FALSE(ApiError::from_status(Status(StatusCode::kInvalidArgument, "no")).param);
  const ApiError full = ApiError::from_status(Status(StatusCode::kResourceExhausted, "full"));
  EXPECT_EQ(full.http_status, 503);
  EXPECT_EQ(full.type, "server_overloaded");
  const ApiError other = ApiError::from_status(Status(StatusCode::kInternal, "boom"));
  EXPECT_EQ(other.http_status, 500);
  EXPECT_EQ(other.type, "internal_error");
}

}  // namespace api_error_test
}  // namespace dz::serve::openai

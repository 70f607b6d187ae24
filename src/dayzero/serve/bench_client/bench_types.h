#pragma once
// What `dayzero bench serve` sends and what it measures for each request. Field meanings follow
// vLLM's benchmark client (vllm-project/vllm: vllm/benchmarks/lib/endpoint_request_func.py,
// RequestFuncOutput) so that saved results compare with `vllm bench serve`; times are seconds.

#include <cstdint>
#include <string>
#include <vector>

namespace dz::serve {

enum class ApiKind {
  kCompletions,      // POST /v1/completions: choices[0].text
  kChatCompletions,  // POST /v1/chat/completions: choices[0].delta.content
};

// One prompt of a dataset.
struct BenchRequest {
  std::vector<int32_t> prompt_ids;  // sent as a token-id prompt to /v1/completions
  std::string prompt_text;          // sent as the user message to /v1/chat/completions
  int64_t prompt_len = 0;           // tokens, as generated; the server's usage overrides it
  int64_t output_len = 0;           // max_tokens
};

struct RequestResult {
  bool success = false;
  std::string error;          // why it failed: HTTP status and body, transport error, bad stream
  int http_status = 0;        // 0 when no response came back
  double start_s = 0;         // when it was sent, from the start of the run
  double queue_s = 0;         // arrival → sent: time waiting for a free --max-concurrency slot
  double ttft_s = 0;          // sent → first chunk with generated text
  double latency_s = 0;       // E2EL: sent → last chunk with choices
  std::vector<double> itl_s;  // gaps between successive chunks with generated text
  std::string generated_text;
  int64_t prompt_len = 0;            // usage.prompt_tokens when reported, else the dataset's
  int64_t cached_tokens = -1;        // usage.prompt_tokens_details.cached_tokens, -1 if absent
  int64_t usage_output_tokens = -1;  // usage.completion_tokens, -1 if absent
  int64_t retokenized_tokens = -1;   // tokens of generated_text, -1 without a tokenizer
  int64_t num_content_chunks = 0;
};

// The output length vLLM's calculate_metrics uses: usage.completion_tokens when the server sent a
// positive one, else the re-tokenized count, else 1.
inline int64_t output_tokens(const RequestResult& r) {
  if (r.usage_output_tokens > 0) return r.usage_output_tokens;
  if (r.retokenized_tokens >= 0) return r.retokenized_tokens;
  return 1;
}

}  // namespace dz::serve

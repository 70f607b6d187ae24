#pragma once
// Stop strings over streamed text (docs/serving.md §3). After each token only the new text plus the
// previous max_stop_len - 1 characters is searched, so the work per token is bounded. A match cuts
// the output before the stop string (or after it with include_stop_str_in_output); text that might
// still be the start of a stop string is held back from the stream until it cannot be.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dz::runtime {

enum class FinishReason : uint8_t {
  kNone,    // still running
  kStop,    // EOS, a stop id (no text added) or a stop string
  kLength,  // max_tokens or the context limit
};

// "stop", "length", or "" for kNone: the OpenAI finish_reason strings.
std::string_view finish_reason_name(FinishReason reason);

class StopMatcher {
 public:
  // stops must be non-empty strings (validate_sampling_params checks).
  explicit StopMatcher(std::vector<std::string> stops, bool include_stop_str_in_output = false);

  // Appends the text of one token; returns what may be streamed now. Once a stop string matched,
  // stopped() is true and further pushes return nothing.
  std::string push(std::string_view new_text);

  // The held-back text, at the end of a completion that did not stop on a string.
  std::string finish();

  bool stopped() const { return matched_ >= 0; }
  // The stop string that matched; empty when none.
  std::string_view matched_stop() const;
  // All text streamed so far (held-back text excluded).
  std::string_view emitted() const { return std::string_view(text_).substr(0, num_emitted_); }

 private:
  // The length of the longest suffix of text_ that is a proper prefix of some stop string.
  size_t num_possible_stop_chars() const;

  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_stop_len_ = 0;
  std::string text_;  // output so far, cut at the stop string once one matched
  size_t num_emitted_ = 0;
  int64_t matched_ = -1;  // index into stops_
};

}  // namespace dz::runtime

#include "dayzero/runtime/stop_strings.h"

#include <algorithm>

#include "dayzero/core/check.h"

namespace dz::runtime {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kNone:
      break;
  }
  return "";
}

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop_str_in_output)
    : stops_(std::move(stops)), include_stop_(include_stop_str_in_output) {
  for (const std::string& s : stops_) {
    DZ_CHECK(!s.empty(), "empty stop string");
    max_stop_len_ = std::max(max_stop_len_, s.size());
  }
}

std::string_view StopMatcher::matched_stop() const {
  return matched_ < 0 ? std::string_view() : stops_[static_cast<size_t>(matched_)];
}

size_t StopMatcher::num_possible_stop_chars() const {
  const std::string_view text(text_);
  const size_t longest = std::min(text.size(), max_stop_len_ == 0 ? 0 : max_stop_len_ - 1);
  for (size_t len = longest; len > 0; --len) {
    const std::string_view tail = text.substr(text.size() - len);
    for (const std::string& s : stops_)
      if (s.size() > len && std::string_view(s).substr(0, len) == tail) return len;
  }
  return 0;
}

std::string StopMatcher::push(std::string_view new_text) {
  if (stopped() || new_text.empty()) return {};
  const size_t old_size = text_.size();
  text_.append(new_text);
  if (stops_.empty()) {
    std::string out = text_.substr(num_emitted_);
    num_emitted_ = text_.size();
    return out;
  }
  // A match wholly inside the old text would have been found before; one that ends in the new
  // text starts at most max_stop_len - 1 characters before it.
  const size_t window = old_size - std::min(old_size, max_stop_len_ - 1);
  size_t best_pos = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = text_.find(stops_[i], window);
    if (pos < best_pos) {  // the earliest match wins; at one position, the first listed
      best_pos = pos;
      matched_ = static_cast<int64_t>(i);
    }
  }
  size_t end = 0;
  if (best_pos != std::string::npos) {
    end = best_pos + (include_stop_ ? stops_[static_cast<size_t>(matched_)].size() : 0);
    text_.resize(end);
  } else {
    end = text_.size() - num_possible_stop_chars();
  }
  // A match starts inside the held-back tail or the new text, so nothing past it was streamed.
  DZ_CHECK(end >= num_emitted_, "stop matcher streamed text it should have held back");
  std::string out = text_.substr(num_emitted_, end - num_emitted_);
  num_emitted_ = end;
  return out;
}

std::string StopMatcher::finish() {
  std::string out = text_.substr(num_emitted_);
  num_emitted_ = text_.size();
  return out;
}

}  // namespace dz::runtime

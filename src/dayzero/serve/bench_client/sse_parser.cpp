#include "dayzero/serve/bench_client/sse_parser.h"

#include <utility>

namespace dz::serve {

void SseParser::feed(std::string_view bytes, const EventCallback& on_event) {
  for (char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // the LF of a CRLF split from its CR, or in the same read
    }
    if (c == '\r') {
      after_cr_ = true;
      end_line(on_event);
    } else if (c == '\n') {
      end_line(on_event);
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::finish(const EventCallback& on_event) {
  if (!line_.empty()) end_line(on_event);
  dispatch(on_event);
  after_cr_ = false;
}

void SseParser::end_line(const EventCallback& on_event) {
  std::string line = std::move(line_);
  line_.clear();
  if (line.empty()) {
    dispatch(on_event);
    return;
  }
  if (line.front() == ':') {
    ++num_comments_;
    return;
  }
  size_t colon = line.find(':');
  std::string_view field = std::string_view(line).substr(0, colon);
  std::string_view value;
  if (colon != std::string::npos) {
    value = std::string_view(line).substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) pending_.data.push_back('\n');
    pending_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    pending_.event = std::string(value);
  }
  // "id", "retry" and unknown fields do not matter to a benchmark and are ignored, as the
  // standard ignores unknown fields.
}

void SseParser::dispatch(const EventCallback& on_event) {
  // The standard dispatches only events with data; a lone "event:" line is dropped.
  if (has_data_) on_event(std::move(pending_));
  pending_ = SseEvent{};
  has_data_ = false;
}

}  // namespace dz::serve

#pragma once
// Incremental Server-Sent Events parser for the load client (`dayzero bench serve`). The HTTP
// client hands over the body in whatever pieces the socket reads return, so an event, a line and
// even a CRLF pair may be split anywhere; the parser keeps the unfinished tail between calls.
// Follows the WHATWG event-stream rules: lines end in LF, CRLF or CR; "data:" lines join with
// '\n'; one space after the colon is dropped; a blank line dispatches; ':' lines are comments.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace dz::serve {

struct SseEvent {
  std::string event;  // the "event:" field; empty for the default "message" type
  std::string data;   // the "data:" lines joined by '\n'
};

class SseParser {
 public:
  using EventCallback = std::function<void(SseEvent&&)>;

  // Parses `bytes`, calling `on_event` for every event completed by them.
  void feed(std::string_view bytes, const EventCallback& on_event);

  // At the end of the body: an event whose data lines were not closed by a blank line is
  // dispatched (the standard would drop it; servers that omit the final blank line are common
  // enough that a benchmark should not lose their last chunk). Resets the parser.
  void finish(const EventCallback& on_event);

  // Comment lines (": keep-alive") seen so far.
  int64_t num_comments() const { return num_comments_; }

 private:
  void end_line(const EventCallback& on_event);
  void dispatch(const EventCallback& on_event);

  std::string line_;       // the current line, not yet terminated
  bool after_cr_ = false;  // the last byte was CR: a following LF belongs to it
  SseEvent pending_;       // fields of the event being built
  bool has_data_ = false;  // pending_ has at least one data line
  int64_t num_comments_ = 0;
};

}  // namespace dz::serve

#pragma once
// Turns the SSE events of one streamed OpenAI response into a RequestResult: TTFT, inter-token
// gaps, end-to-end latency, generated text and usage. Pure (the caller passes the arrival time of
// every event), so the arithmetic is unit-tested without sockets.
//
// Timing rules (docs/serving.md §6; vLLM's endpoint_request_func.py):
//  - TTFT: sent → the first chunk whose choice carries non-empty generated text. A role-only
//    delta or an empty text does not count (vLLM counts any chunk with choices; our server sends
//    the role delta before the prefill has produced a token, so counting it would hide the
//    prefill).
//  - ITL: every gap between successive chunks with generated text (a chunk may hold several
//    tokens; TPOT evens that out).
//  - E2EL: sent → the last chunk with choices (the finish_reason chunk included; the usage-only
//    chunk and [DONE] are not), as vLLM.

#include <chrono>
#include <string>

#include "dayzero/serve/bench_client/bench_types.h"
#include "dayzero/serve/bench_client/sse_parser.h"

namespace dz::serve {

class StreamAccumulator {
 public:
  using Clock = std::chrono::steady_clock;

  StreamAccumulator(ApiKind kind, Clock::time_point sent) : kind_(kind), sent_(sent) {}

  // One event received at `now`. After an error event or a malformed chunk, later events are
  // ignored.
  void on_event(const SseEvent& event, Clock::time_point now);

  // The stream failed underneath (transport error, timeout): recorded unless an error is set.
  void fail(std::string error);

  bool failed() const { return !error_.empty(); }
  bool done() const { return done_; }

  // Moves the measurements into `out` (success, error, ttft, itl, latency, text, usage). A stream
  // with no generated text, or one that ended without `data: [DONE]`, fails.
  void finish(RequestResult& out);

 private:
  double seconds_since_sent(Clock::time_point t) const {
    return std::chrono::duration<double>(t - sent_).count();
  }

  ApiKind kind_;
  Clock::time_point sent_;
  Clock::time_point last_content_{};
  Clock::time_point last_choice_{};
  bool has_content_ = false;
  bool has_choice_ = false;
  bool done_ = false;
  std::string error_;
  RequestResult partial_;  // ttft, itl, text, usage fields as they arrive
};

}  // namespace dz::serve

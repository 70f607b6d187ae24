#include "dayzero/serve/bench_client/sse_parser.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dz::serve {
namespace sse_parser_test {

struct Parsed {
  std::vector<SseEvent> events;
  int64_t num_comments = 0;
};

// Feeds `pieces` one call each, then finishes.
Parsed parse(const std::vector<std::string>& pieces) {
  SseParser parser;
  Parsed out;
  auto collect = [&](SseEvent&& e) { out.events.push_back(std::move(e)); };
  for (const std::string& piece : pieces) parser.feed(piece, collect);
  parser.finish(collect);
  out.num_comments = parser.num_comments();
  return out;
}

void expect_same(const Parsed& a, const Parsed& b, const std::string& where) {
  ASSERT_EQ(a.events.size(), b.events.size()) << where;
  for (size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].data, b.events[i].data) << where << " event " << i;
    EXPECT_EQ(a.events[i].event, b.events[i].event) << where << " event " << i;
  }
  EXPECT_EQ(a.num_comments, b.num_comments) << where;
}

// An OpenAI-style stream with every feature the parser handles: a keep-alive comment, CRLF and
// CR line ends, a multi-line data field, an error event and [DONE].
const std::string kStream =
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"text\":\"Hel\"}]}\n\n"
    "data: {\"choices\":[{\"text\":\"lo\"}]}\r\n\r\n"
    "data: {\"a\":\r"
    "data: 1}\r\r"
    "event: error\n"
    "data: {\"error\":{\"message\":\"boom\"}}\n\n"
    ":another comment\r\n"
    "data:[DONE]\n\n";

TEST(SseParser, WholeStream) {
  Parsed p = parse({kStream});
  ASSERT_EQ(p.events.size(), 5u);
  EXPECT_EQ(p.events[0].data, "{\"choices\":[{\"text\":\"Hel\"}]}");
  EXPECT_EQ(p.events[1].data, "{\"choices\":[{\"text\":\"lo\"}]}");
  EXPECT_EQ(p.events[2].data, "{\"a\":\n1}");  // two data lines join with '\n'
  EXPECT_EQ(p.events[3].event, "error");
  EXPECT_EQ(p.events[3].data, "{\"error\":{\"message\":\"boom\"}}");
  EXPECT_EQ(p.events[4].data, "[DONE]");  // "data:" without the space
  EXPECT_EQ(p.events[4].event, "");       // the event field does not carry over
  EXPECT_EQ(p.num_comments, 2);
}

TEST(SseParser, SplitAtEveryBytePosition) {
  Parsed whole = parse({kStream});
  for (size_t cut = 0; cut <= kStream.size(); ++cut)
    expect_same(parse({kStream.substr(0, cut), kStream.substr(cut)}), whole,
                "cut at " + std::to_string(cut));
  for (size_t a = 0; a <= kStream.size(); a += 7)
    for (size_t b = a; b <= kStream.size(); b += 5)
      expect_same(parse({kStream.substr(0, a), kStream.substr(a, b - a), kStream.substr(b)}), whole,
                  "cuts at " + std::to_string(a) + ", " + std::to_string(b));
  std::vector<std::string> bytes;
  for (char c : kStream) bytes.emplace_back(1, c);
  expect_same(parse(bytes), whole, "byte by byte");
}

TEST(SseParser, EventsArriveWhenTheirBlankLineDoes) {
  SseParser parser;
  std::vector<std::string> seen;
  auto collect = [&](SseEvent&& e) { seen.push_back(e.data); };
  parser.feed("data: one\n", collect);
  EXPECT_TRUE(seen.empty());  // the event is not complete before its blank line
  parser.feed("\ndata: tw", collect);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "one");
  parser.feed("o\r", collect);  // CR ends the line; a LF may follow in the next read
  parser.feed("\n", collect);   // ... and is not a second (blank) line
  EXPECT_EQ(seen.size(), 1u);
  parser.feed("\r\n", collect);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], "two");
}

TEST(SseParser, FieldsWithoutDataAreNotDispatched) {
  Parsed p = parse({"event: ping\n\nid: 7\nretry: 10\n\n: c\n\n"});
  EXPECT_TRUE(p.events.empty());
  EXPECT_EQ(p.num_comments, 1);
}

TEST(SseParser, DataWithoutColonIsAnEmptyLine) {
  Parsed p = parse({"data\ndata\n\n", "data:  two spaces\n\n"});
  ASSERT_EQ(p.events.size(), 2u);
  EXPECT_EQ(p.events[0].data, "\n");
  EXPECT_EQ(p.events[1].data, " two spaces");  // only one space is dropped
}

TEST(SseParser, FinishFlushesAnUnterminatedEvent) {
  Parsed p = parse({"data: [DONE]"});
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_EQ(p.events[0].data, "[DONE]");
  Parsed q = parse({"data: x\n"});
  ASSERT_EQ(q.events.size(), 1u);
  EXPECT_EQ(q.events[0].data, "x");
  EXPECT_TRUE(parse({""}).events.empty());
}

}  // namespace sse_parser_test
}  // namespace dz::serve

#pragma once
// Streams detokenized bytes as text: a token may end in the middle of a UTF-8 character (byte-level
// BPE splits characters across tokens), so the bytes of an incomplete trailing character are held
// back until the next token completes it. Bytes that can never form a character (a random or
// partly trained BPE emits them freely) become U+FFFD, one per maximal invalid subpart, as
// Python's errors="replace" and HF decode do: what leaves the stream is always valid UTF-8, which
// terminals, pipes decoding UTF-8 and JSON need.

#include <string>
#include <string_view>

namespace dz::runtime {

class Utf8Stream {
 public:
  // Appends `bytes` and returns what can be shown now.
  std::string push(std::string_view bytes);
  // Returns whatever is still held: an incomplete character at the end of the stream is U+FFFD.
  std::string finish();

 private:
  std::string pending_;
};

// Length of the tail of `bytes` that is the start of a valid multi-byte character still missing
// continuation bytes (0 when the text ends on a boundary).
size_t incomplete_utf8_tail(std::string_view bytes);
// `bytes` with every maximal invalid subpart (RFC 3629; Unicode §3.9 "U+FFFD substitution of
// maximal subparts") replaced by U+FFFD.
std::string replace_invalid_utf8(std::string_view bytes);

}  // namespace dz::runtime

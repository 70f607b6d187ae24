#pragma once
// Streams detokenized bytes as text: a token may end in the middle of a UTF-8 character (byte-level
// BPE splits characters across tokens), so the bytes of an incomplete trailing character are held
// back until the next token completes it. Invalid bytes pass through unchanged (the terminal or
// the JSON encoder decides how to show them); only a valid-so-far incomplete tail is held.

#include <string>
#include <string_view>

namespace dz::runtime {

class Utf8Stream {
 public:
  // Appends `bytes` and returns what can be shown now.
  std::string push(std::string_view bytes);
  // Returns whatever is still held (an incomplete character at the end of the stream).
  std::string finish();

 private:
  std::string pending_;
};

// Length of the tail of `bytes` that is the start of a valid multi-byte character still missing
// continuation bytes (0 when the text ends on a boundary).
size_t incomplete_utf8_tail(std::string_view bytes);

}  // namespace dz::runtime

#pragma once
// Pieces shared by the two tokenizer formats: GPT-2's byte <-> printable-character map, the BPE
// merge loop, a hash map keyed by bytes that accepts string_view lookups, and the splitter that
// finds added/special tokens in text before pre-tokenization.

#include <cstdint>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dz::serve {

// ---- byte-level alphabet ------------------------------------------------------------------------

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order (space -> U+0120 'Ġ'). Vocab files store byte-level tokens in this form.
uint32_t byte_to_code_point(uint8_t byte);
// The byte a code point stands for, or nullopt if it is not one of the 256.
std::optional<uint8_t> code_point_to_byte(uint32_t code_point);
// "Ġthe" -> " the"; nullopt if a character is not in the byte-level alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view token);
// " the" -> "Ġthe".
std::string bytes_to_byte_level(std::string_view bytes);

// ---- lookup by bytes ----------------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using BytesToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// ---- BPE merge loop -----------------------------------------------------------------------------

struct Merge {
  int32_t rank = -1;  // -1: the pair does not merge
  int32_t id = -1;    // the merged token
};

// Merges adjacent parts of a piece, lowest rank first and leftmost among equal ranks, until no
// pair merges: the order HF tokenizers (Word::merge_all) and tiktoken (byte_pair_merge) both use.
// `ids` holds the id of each initial part (one per byte) and is rewritten with the final ids.
// `merge_of(left_id, right_id, begin, mid, end)` gives the merge of parts [begin, mid) and
// [mid, end) (byte offsets in the piece). O(n log n) in the piece length, so a 100k-byte
// whitespace run is fine.
template <typename MergeOf>
void bpe_merge(std::vector<int32_t>& ids, MergeOf&& merge_of) {
  const int num_parts = static_cast<int>(ids.size());
  if (num_parts < 2) return;
  struct Part {
    int32_t id;
    int next;  // index of the next live part, or num_parts
    int prev;  // index of the previous live part, or -1
    bool alive;
  };
  std::vector<Part> parts(num_parts);
  for (int k = 0; k < num_parts; ++k) parts[k] = {ids[k], k + 1, k - 1, true};
  // A candidate merge of part `pos` with the part after it, as it was when pushed.
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int pos) {
    int next = parts[pos].next;
    if (next >= num_parts) return;
    int end = parts[next].next;
    Merge merge = merge_of(parts[pos].id, parts[next].id, pos, next, end);
    if (merge.rank >= 0) queue.push({merge.rank, pos, parts[pos].id, parts[next].id, merge.id});
  };
  for (int k = 0; k + 1 < num_parts; ++k) push(k);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Part& left = parts[top.pos];
    if (!left.alive || left.next >= num_parts || left.id != top.left_id) continue;
    Part& right = parts[left.next];
    if (right.id != top.right_id) continue;
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (left.next < num_parts) parts[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  ids.clear();
  for (int k = 0; k < num_parts; k = parts[k].next) ids.push_back(parts[k].id);
}

// ---- added / special tokens ---------------------------------------------------------------------

struct AddedTokenSpec {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;  // only match between non-word characters
  bool lstrip = false;       // swallow whitespace on the left
  bool rstrip = false;       // swallow whitespace on the right
};

// A run of text, or one added token.
struct TextSegment {
  std::string_view text;
  int32_t token_id = -1;  // >= 0 for a token
};

// Finds added tokens leftmost-longest (as the aho-corasick matcher in HF tokenizers), with a byte
// trie so every position costs at most the longest token's length.
class AddedTokenSplitter {
 public:
  AddedTokenSplitter() = default;
  explicit AddedTokenSplitter(std::vector<AddedTokenSpec> tokens);

  // Special tokens are skipped when `allow_special` is false (their text stays text).
  std::vector<TextSegment> split(std::string_view text, bool allow_special) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int>> children;  // sorted by byte
    int token = -1;                                 // index into tokens_
  };
  int child(int node, uint8_t byte) const;

  std::vector<AddedTokenSpec> tokens_;
  std::vector<Node> nodes_;
};

}  // namespace dz::serve

"""Byte-level BPE trainer and encoder for dayzero's demo model (issue 7), in plain Python.

The result is a standard Hugging Face `tokenizer.json` (model BPE, ByteLevel pre-tokenizer with
GPT-2's regex, ByteLevel decoder, special added tokens) that dayzero's HfTokenizer loads.

Pre-tokenization is GPT-2's pattern, which HF's ByteLevel step applies when use_regex is true:
  's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
Python's `re` has no \\p{..}, so the classes are spelled out from `unicodedata` (L* and N*
general categories) and \\s is the Unicode White_Space property (what Rust's regex and PCRE2
with UCP match), not Python's str.isspace (which adds U+001C..U+001F). Characters whose category
differs between Python's Unicode version and the engine's PCRE2 would split differently; the
corpus is English, so this does not arise there.

Training: words (pre-tokens) are counted once; each distinct word is a list of token ids. Pair
counts are kept incrementally: a merge only revisits the words that hold the merged pair (an
index from pair to words), and a max-heap with lazy deletion finds the next best pair. Ties on
count are broken by the pair's bytes (smaller left bytes first, then smaller right bytes), so
the result depends only on the word counts, not on dict or set order.

CLI: /usr/bin/python3 -m dayzero_ref.bpe_train --out DIR [--vocab-size 4096] [--cache DIR]
"""

from __future__ import annotations

import argparse
import collections
import functools
import heapq
import json
import re
import sys
import time
import unicodedata
from pathlib import Path

kSpecialTokens = ("<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|end|>")
kDefaultVocabSize = 4096
# Unicode White_Space (PropList.txt): what \s means to Rust regex and to PCRE2 with UCP.
kWhiteSpace = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000")


@functools.lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 bytes to printable characters (no spaces/controls)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
            list(range(ord("®"), ord("ÿ") + 1)))
    out = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def token_to_bytes(token: str) -> bytes:
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(inverse[c] for c in token)


def bytes_to_token(data: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def _class_ranges(predicate) -> str:
    """A regex class body (no brackets) of every code point where predicate(category) holds."""
    parts = []
    start = None
    for cp in range(0x110000 + 1):
        inside = cp < 0x110000 and predicate(unicodedata.category(chr(cp)))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            end = cp - 1
            parts.append(re.escape(chr(start)) if start == end else
                         f"{re.escape(chr(start))}-{re.escape(chr(end))}")
            start = None
    return "".join(parts)


@functools.lru_cache(maxsize=None)
def pretokenize_regex() -> re.Pattern:
    letters = _class_ranges(lambda cat: cat.startswith("L"))
    numbers = _class_ranges(lambda cat: cat.startswith("N"))
    space = kWhiteSpace
    pattern = (rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+"
               rf"| ?[^{space}{letters}{numbers}]+|[{space}]+(?![^{space}])|[{space}]+")
    return re.compile(pattern)


def pretokenize(text: str) -> list[str]:
    return pretokenize_regex().findall(text)


def count_words(texts) -> collections.Counter:
    """Counts of the pre-tokens of every text (each text is pre-tokenized on its own)."""
    counts: collections.Counter = collections.Counter()
    regex = pretokenize_regex()
    for text in texts:
        counts.update(regex.findall(text))
    return counts


class _PairKey:
    """Heap entry ordering: higher count first, then smaller (left bytes, right bytes)."""
    __slots__ = ("count", "left", "right", "pair")

    def __init__(self, count, left, right, pair):
        self.count, self.left, self.right, self.pair = count, left, right, pair

    def __lt__(self, other):
        if self.count != other.count:
            return self.count > other.count
        return (self.left, self.right) < (other.left, other.right)


def train_bpe(word_counts: dict[str, int], vocab_size: int,
              special_tokens=kSpecialTokens, min_frequency: int = 2,
              log=None) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Returns (the bytes of every id, merges as (left id, right id) in rank order).

    Ids: the special tokens first (0 .. len(special_tokens)-1; their entry is their UTF-8 text),
    then the 256 bytes in byte order, then one token per merge in merge order. Stops at
    vocab_size or when the best pair occurs fewer than min_frequency times.
    """
    num_special = len(special_tokens)
    if vocab_size < num_special + 256:
        raise ValueError(f"vocab_size {vocab_size} < {num_special} special tokens + 256 bytes")
    token_bytes: list[bytes] = [s.encode("utf-8") for s in special_tokens]
    token_bytes += [bytes([b]) for b in range(256)]
    words = []
    freqs = []
    for word in sorted(word_counts):  # sorted: the word order (hence everything) is fixed
        words.append([num_special + b for b in word.encode("utf-8")])
        freqs.append(word_counts[word])

    pair_counts: dict[tuple[int, int], int] = collections.defaultdict(int)
    where: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for index, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freq
            where[pair].add(index)

    def entry(pair):
        return _PairKey(pair_counts[pair], token_bytes[pair[0]], token_bytes[pair[1]], pair)

    heap = [entry(pair) for pair in pair_counts]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(token_bytes) < vocab_size and heap:
        top = heapq.heappop(heap)
        if pair_counts.get(top.pair, 0) != top.count:
            continue  # stale: the pair's count changed since this entry was pushed
        if top.count < min_frequency:
            break
        left, right = top.pair
        new_id = len(token_bytes)
        token_bytes.append(token_bytes[left] + token_bytes[right])
        merges.append(top.pair)
        changed = set()
        for index in sorted(where.pop(top.pair, ())):
            word = words[index]
            if len(word) < 2:
                continue
            freq = freqs[index]
            merged = []
            k = 0
            hit = False
            while k < len(word):
                if k + 1 < len(word) and word[k] == left and word[k + 1] == right:
                    merged.append(new_id)
                    k += 2
                    hit = True
                else:
                    merged.append(word[k])
                    k += 1
            if not hit:
                continue  # `where` is not pruned when a word loses a pair
            for pair in zip(word, word[1:]):
                pair_counts[pair] -= freq
                changed.add(pair)
            for pair in zip(merged, merged[1:]):
                pair_counts[pair] += freq
                where[pair].add(index)
                changed.add(pair)
            words[index] = merged
        pair_counts.pop(top.pair, None)
        changed.discard(top.pair)
        for pair in changed:
            if pair_counts[pair] > 0:
                heapq.heappush(heap, entry(pair))
            else:
                del pair_counts[pair]
        if log and len(merges) % 500 == 0:
            log(f"{len(merges)} merges, vocab {len(token_bytes)}, last count {top.count}")
    return token_bytes, merges


class ByteLevelBpe:
    """Encoder/decoder over a trained vocabulary; the reference the tests compare against."""

    def __init__(self, token_bytes: list[bytes], merges: list[tuple[int, int]],
                 special_tokens=kSpecialTokens):
        self.token_bytes = list(token_bytes)
        self.special_tokens = tuple(special_tokens)
        self.special_ids = {s: i for i, s in enumerate(self.special_tokens)}
        self.num_special = len(self.special_tokens)
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.merged = {pair: self.num_special + 256 + rank for rank, pair in enumerate(merges)}
        self.merges = list(merges)
        self._cache: dict[str, list[int]] = {}
        if self.special_tokens:
            self._special_re = re.compile("|".join(re.escape(s) for s in
                                                   sorted(self.special_tokens, key=len,
                                                          reverse=True)))
        else:
            self._special_re = None

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def _bpe(self, piece: str) -> list[int]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        ids = [self.num_special + b for b in piece.encode("utf-8")]
        while len(ids) > 1:
            best_rank, best_at = None, -1
            for k in range(len(ids) - 1):
                rank = self.ranks.get((ids[k], ids[k + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_at = rank, k
            if best_rank is None:
                break
            pair = (ids[best_at], ids[best_at + 1])
            out = []
            k = 0
            while k < len(ids):  # every occurrence of the pair, left to right
                if k + 1 < len(ids) and (ids[k], ids[k + 1]) == pair:
                    out.append(self.merged[pair])
                    k += 2
                else:
                    out.append(ids[k])
                    k += 1
            ids = out
        if len(self._cache) < 200_000:
            self._cache[piece] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        ids = []
        for piece in pretokenize(text):
            ids.extend(self._bpe(piece))
        return ids

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Like HF's encode without post-processing: special tokens in the text become their ids
        when allow_special, otherwise they are encoded as ordinary text."""
        if not allow_special or self._special_re is None:
            return self.encode_ordinary(text)
        ids, at = [], 0
        for match in self._special_re.finditer(text):
            ids.extend(self.encode_ordinary(text[at:match.start()]))
            ids.append(self.special_ids[match.group(0)])
            at = match.end()
        ids.extend(self.encode_ordinary(text[at:]))
        return ids

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids)

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ---- tokenizer.json ----

    def to_hf_json(self) -> dict:
        vocab = {}
        for token_id in range(self.num_special, len(self.token_bytes)):
            vocab[bytes_to_token(self.token_bytes[token_id])] = token_id
        for token_id, special in enumerate(self.special_tokens):
            vocab[special] = token_id
        merges = [f"{bytes_to_token(self.token_bytes[a])} {bytes_to_token(self.token_bytes[b])}"
                  for a, b in self.merges]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": True}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}
                for i, s in enumerate(self.special_tokens)
            ],
            "normalizer": None,
            "pre_tokenizer": byte_level,
            "post_processor": dict(byte_level),
            "decoder": dict(byte_level),
            "model": {
                "type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None,
                "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
                "merges": merges,
            },
        }

    def tokenizer_config(self) -> dict:
        """A minimal tokenizer_config.json (what HF's and the npm tokenizers read beside it)."""
        added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True}
                 for i, s in enumerate(self.special_tokens)}
        names = set(self.special_tokens)
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|bos|>" if "<|bos|>" in names else None,
            "eos_token": "<|eos|>" if "<|eos|>" in names else None,
            "pad_token": "<|pad|>" if "<|pad|>" in names else None,
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 30,
            "added_tokens_decoder": added,
        }

    def save(self, out_dir: Path) -> Path:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "tokenizer.json"
        path.write_text(json.dumps(self.to_hf_json(), ensure_ascii=False, indent=1) + "\n",
                        encoding="utf-8")
        (out_dir / "tokenizer_config.json").write_text(
            json.dumps(self.tokenizer_config(), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> "ByteLevelBpe":
        """Reads a tokenizer.json written by save() (special tokens first, then bytes, merges)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        specials = [t["content"] for t in sorted(data["added_tokens"], key=lambda t: t["id"])]
        vocab = data["model"]["vocab"]
        token_bytes: list[bytes] = [b""] * len(vocab)
        for token, token_id in vocab.items():
            token_bytes[token_id] = (token.encode("utf-8") if token_id < len(specials)
                                     else token_to_bytes(token))
        ids = {token: token_id for token, token_id in vocab.items()}
        merges = [tuple(ids[part] for part in m.split(" ")) for m in data["model"]["merges"]]
        return cls(token_bytes, merges, specials)


def train_from_texts(texts, vocab_size: int = kDefaultVocabSize, log=None) -> ByteLevelBpe:
    counts = count_words(texts)
    token_bytes, merges = train_bpe(counts, vocab_size, log=log)
    return ByteLevelBpe(token_bytes, merges)


def main() -> None:
    from dayzero_ref import corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json")
    parser.add_argument("--vocab-size", type=int, default=kDefaultVocabSize)
    parser.add_argument("--cache", type=Path, default=None, help="corpus cache folder")
    args = parser.parse_args()

    def log(message):
        print(f"[{time.monotonic() - start:7.1f}s] {message}", file=sys.stderr, flush=True)

    start = time.monotonic()
    docs, _ = corpus.load_corpus(args.cache)
    train, held = corpus.split_corpus(docs)
    log(f"corpus: {len(train)} training documents, {len(held)} held out")
    counts = count_words(d.text for d in train)
    log(f"{len(counts)} distinct pre-tokens, {sum(counts.values())} in all")
    token_bytes, merges = train_bpe(counts, args.vocab_size, log=log)
    tok = ByteLevelBpe(token_bytes, merges)
    train_seconds = time.monotonic() - start
    path = tok.save(args.out)
    held_words = sum(len(d.text.split()) for d in held)
    held_tokens = sum(len(tok.encode_ordinary(d.text)) for d in held)
    held_bytes = sum(len(d.text.encode("utf-8")) for d in held)
    log(f"wrote {path} ({path.stat().st_size} bytes): vocab {tok.vocab_size}, "
        f"{len(merges)} merges, trained in {train_seconds:.1f}s")
    log(f"held-out: {held_tokens} tokens, {held_words} words, "
        f"{held_tokens / held_words:.3f} tokens/word, {held_bytes / held_tokens:.3f} bytes/token")


if __name__ == "__main__":
    main()

"""Small tokenizer files in the layouts real checkpoints ship, for tests.

A byte-level BPE is trained (pure Python, deterministic from the seed) on a built-in sample with
ASCII, accented Latin, Greek, Cyrillic, CJK, kana, Hangul, emoji (with ZWJ sequences and skin
tones), digits and code, so merges exist for all of them. It is written out two ways:

- ``write_hf_tokenizer``: a HF ``tokenizer.json`` shaped like DeepSeek-V3's (Sequence of three
  isolating Splits, then ByteLevel without its regex; ByteLevel decoder; fullwidth-bar special
  tokens), plus a ``tokenizer_config.json``;
- ``write_tiktoken_tokenizer``: a Kimi-style ``tiktoken.model`` (base64 token, rank) with a
  ``tokenizer_config.json`` whose ``added_tokens_decoder`` numbers the specials after the ranks.

The split patterns below are the published ones; training only uses a rough Python splitter,
which is fine: any merge list makes a valid tokenizer, and the tests compare implementations on
the written files.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import unicodedata

# DeepSeek-V3 / V3.2 tokenizer.json pre_tokenizer: Split(Isolated) x 3, then ByteLevel with
# use_regex false. The second class holds CJK ideographs U+4E00..U+9FA5 and the kana blocks.
DEEPSEEK_SPLIT_PATTERNS = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

# TikTokenTokenizer.pat_str in Kimi's tokenization_kimi.py (K2, Linear, K3).
KIMI_PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
KIMI_NUM_RESERVED_SPECIAL_TOKENS = 256

# DeepSeek's specials (fullwidth bars U+FF5C, lower one-eighth blocks U+2581).
DEEPSEEK_SPECIAL_TOKENS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁end｜>",
]
# Added but not special in DeepSeek-V3.1+: matched in user text too.
DEEPSEEK_ADDED_TOKENS = ["<think>", "</think>"]

# Kimi's specials by offset from the first special id (the number of ranks), after the layout of
# Kimi-K2's tokenizer_config.json; the other offsets get "<|reserved_token_{id}|>".
KIMI_SPECIAL_TOKENS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
    17: "<|im_middle|>", 18: "<|media_start|>", 19: "<|media_content|>", 20: "<|media_end|>",
    21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]",
}

SAMPLE_TEXT = [
    "The quick brown fox jumps over the lazy dog. It's what they'd've wanted, isn't it?",
    "Hello, world! Tokenizers split text into pieces; the model only ever sees their ids.",
    "In 2024 the run took 3,141,592 steps at 1.5e-4 learning rate and 0.1 weight decay.",
    "Call +1 (555) 010-9999 before 12:30 on 2025-06-01, or email help@example.com.",
    "def encode(text: str) -> list[int]:\n    return [vocab[t] for t in split(text)]\n",
    "for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; }  // 4 spaces, then a tab:\t!",
    "Ça va? Où est la bibliothèque? Déjà vu, naïve café, crème brûlée à la française.",
    "Straße, Größe, Übermäßig schön: Füße über Brücken. ¿Qué tal, señor? ¡Mañana!",
    "Tiếng Việt có dấu: Xin chào, cảm ơn bạn rất nhiều. Đường phố Hà Nội.",
    "Ελληνικά: Καλημέρα κόσμε. Русский: Привет, мир! Как дела? Українська: Дякую.",
    "中文：你好，世界！今天天气很好，我们去公园散步吧。机器学习和深度学习。",
    "深度求索的模型使用混合专家架构，每个词元只激活一部分参数。北京、上海、广州。",
    "日本語：こんにちは、世界。カタカナとひらがなと漢字を混ぜて書きます。東京タワー。",
    "한국어: 안녕하세요, 세계! 오늘은 날씨가 좋네요. 감사합니다.",
    "Emoji: 😀😃😄 👍🏽 ❤️ 🇫🇷🇯🇵 👨‍👩‍👧‍👦 👩🏾‍💻 🧑‍🚀 ✨🎉 — mixed with text 🙂 ok?",
    "Numbers: 0 1 12 123 1234 12345 123456 3.14159 2.71828 ١٢٣ ४२ 一二三 ⅷ ½",
    "Whitespace   runs    and\n\nnewlines\r\n  indented\n\t\ttabs   \n    end",
    "Mixed 混合 text with English and 中文 and 日本語 and emoji 🚀 and numbers 42.",
    "<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;",
    "ASCII art: ==== ---- **** //// \\\\\\\\ |||| ____ ~~~~ ^^^^ #### @@@@",
    "Quotes: “smart” ‘single’ «guillemets» „German“ 「日本」 『二重』 (parentheses) [brackets]",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level vocab files."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    mapping, shifted = {}, 256
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(shifted)
            shifted += 1
    return mapping


def _char_class(ch: str) -> str:
    if ch.isspace():
        return "space"
    if "\u4e00" <= ch <= "\u9fff" or "\u3040" <= ch <= "\u30ff":
        return "cjk"
    category = unicodedata.category(ch)
    if category[0] in "LM":
        return "letter"
    if category[0] == "N":
        return "digit"
    return "other"


def _training_pieces(text: str) -> list[str]:
    """A rough pre-tokenizer for training: letter runs with one leading space, digits in threes,
    CJK runs, punctuation runs, whitespace runs."""
    pieces, current, current_class = [], "", None
    for ch in text:
        cls = _char_class(ch)
        joins = cls == current_class and not (cls == "digit" and len(current) >= 3)
        if current == " " and cls in ("letter", "other"):
            joins = True  # " word" keeps its space, as the real patterns do
        if joins:
            current += ch
        else:
            if current:
                pieces.append(current)
            current = ch
        current_class = cls
    if current:
        pieces.append(current)
    return pieces


def train_bpe(num_merges: int, seed: int = 0) -> list[tuple[bytes, bytes]]:
    """Byte-level BPE merges on SAMPLE_TEXT. The seed shuffles and re-weights the sample lines;
    ties between equally frequent pairs go to the smaller pair bytes, so the result depends on
    nothing but the seed."""
    rng = random.Random(seed)
    lines = list(SAMPLE_TEXT)
    rng.shuffle(lines)
    word_counts: collections.Counter[tuple[bytes, ...]] = collections.Counter()
    for line in lines:
        weight = rng.randint(1, 4)
        # Fine pieces give the usual merges; whole space-separated chunks add merges across
        # pre-tokenizer boundaries ("，世", "o!"), which only come out when an implementation
        # splits differently from the reference, so the tests see pre-tokenizer mistakes.
        for piece in _training_pieces(line) + line.split():
            word_counts[tuple(bytes([b]) for b in piece.encode("utf-8"))] += weight
    words = list(word_counts.items())
    merges: list[tuple[bytes, bytes]] = []
    while len(merges) < num_merges:
        pair_counts: collections.Counter[tuple[bytes, bytes]] = collections.Counter()
        for symbols, count in words:
            for left, right in zip(symbols, symbols[1:]):
                pair_counts[(left, right)] += count
        if not pair_counts:
            break
        best = min(pair_counts.items(), key=lambda item: (-item[1], item[0]))[0]
        merges.append(best)
        merged = best[0] + best[1]
        new_words = []
        for symbols, count in words:
            out, k = [], 0
            while k < len(symbols):
                if k + 1 < len(symbols) and (symbols[k], symbols[k + 1]) == best:
                    out.append(merged)
                    k += 2
                else:
                    out.append(symbols[k])
                    k += 1
            new_words.append((tuple(out), count))
        words = new_words
    return merges


def _unique_merges(merges: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Drops merges whose result repeats an earlier token (possible when two splits of the same
    bytes both get merged), so every merge adds one token."""
    seen = {bytes([b]) for b in range(256)}
    out = []
    for left, right in merges:
        if left + right not in seen:
            seen.add(left + right)
            out.append((left, right))
    return out


def write_hf_tokenizer(out_dir, vocab_size: int, seed: int = 0,
                       special_tokens: list[str] = DEEPSEEK_SPECIAL_TOKENS,
                       added_tokens: list[str] = DEEPSEEK_ADDED_TOKENS,
                       merges_as_lists: bool = False) -> None:
    """Writes tokenizer.json + tokenizer_config.json. `vocab_size` counts every id: the first
    three special tokens take ids 0..2 (DeepSeek's BOS, EOS, pad, which are also in model.vocab),
    then the 256 bytes, the merges, the other special tokens and the non-special added tokens.
    `merges_as_lists` writes merges as ["a", "b"] (tokenizers >= 0.20) instead of "a b"."""
    head, tail = special_tokens[:3], special_tokens[3:] + added_tokens
    num_merges = vocab_size - len(head) - 256 - len(tail)
    if num_merges < 1:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges")
    merges = _unique_merges(train_bpe(num_merges, seed))
    b2u = bytes_to_unicode()
    as_text = lambda token: "".join(b2u[b] for b in token)  # noqa: E731
    vocab = {token: i for i, token in enumerate(head)}
    for byte in range(256):
        vocab[b2u[byte]] = len(vocab)
    for left, right in merges:
        vocab[as_text(left + right)] = len(vocab)
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for t in head]
    for token in tail:
        special = token in special_tokens
        added.append({"id": len(vocab) + len(added) - len(head), "content": token,
                      "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": not special, "special": special})
    merge_list = [[as_text(l), as_text(r)] if merges_as_lists else f"{as_text(l)} {as_text(r)}"
                  for l, r in merges]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}
                for p in DEEPSEEK_SPLIT_PATTERNS
            ] + [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": merge_list,
        },
    }
    config = {
        "add_bos_token": False, "add_eos_token": False, "bos_token": head[0] if head else None,
        "eos_token": head[1] if len(head) > 1 else None, "clean_up_tokenization_spaces": False,
        "legacy": True, "model_max_length": 131072, "tokenizer_class": "LlamaTokenizerFast",
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)


# The chat template of the Kimi-style tiny checkpoints: Moonshot's Kimi-K2-Instruct template, the
# same text as tests/data/chat_templates/moonshotai-Kimi-K2.jinja (test_chat_templates checks),
# so `dayzero serve` and `dayzero chat-template` run on them as on the real Kimi checkpoints.
KIMI_CHAT_TEMPLATE = (
    '{% if tools -%}\n'
    "    {{ '<|im_system|>tool_declare<|im_middle|>' -}}\n"
    '    {{- tools | tojson -}}\n'
    "    {{ '<|im_end|>' -}}\n"
    '{%- endif -%}\n'
    '\n'
    '{%- for message in messages -%}\n'
    "  {%- if loop.first and messages[0]['role'] != 'system' -%}\n"
    "    {{ '<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>' }}\n"
    '  {%- endif -%}\n'
    "  {%- if message['role'] == 'system' -%}\n"
    "    {{ '<|im_system|>system<|im_middle|>' }}\n"
    "  {%- elif message['role'] == 'user' -%}\n"
    "    {{ '<|im_user|>user<|im_middle|>' }}\n"
    "  {%- elif message['role'] == 'assistant' -%}\n"
    "    {{ '<|im_assistant|>assistant<|im_middle|>' }}\n"
    "  {%- elif message['role'] == 'tool' -%}\n"
    "    {{ '<|im_system|>tool<|im_middle|>' }}\n"
    '  {%- endif -%}\n'
    '\n'
    "  {%- if message['content'] is string -%}\n"
    "    {{- message['content'] + '<|im_end|>' -}}\n"
    '  {%- else -%}\n'
    "    {%- for content in message['content'] -%}\n"
    "      {%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}\n"
    "        {{ '<|media_start|>image<|media_content|><|media_pad|><|media_end|>' }}\n"
    '      {%- else -%}\n'
    "        {{ content['text'] }}\n"
    '      {%- endif -%}\n'
    '    {%- endfor -%}\n'
    "    {{ '<|im_end|>' }}\n"
    '  {%- endif -%}\n'
    '{%- endfor -%}\n'
    '\n'
    '{%- if add_generation_prompt -%}\n'
    "  {{ '<|im_assistant|>assistant<|im_middle|>' }}\n"
    '{%- endif -%}'
)


def kimi_special_tokens(num_ranks: int, config: dict | None = None) -> dict[str, int]:
    """Special token -> id as TikTokenTokenizer.__init__ builds it from added_tokens_decoder."""
    named = {int(k): v["content"] for k, v in (config or {}).get("added_tokens_decoder", {}).items()}
    return {named.get(i, f"<|reserved_token_{i}|>"): i
            for i in range(num_ranks, num_ranks + KIMI_NUM_RESERVED_SPECIAL_TOKENS)}


def write_tiktoken_tokenizer(out_dir, vocab_size: int, seed: int = 0,
                             media_begin: str = "<|media_start|>") -> None:
    """Writes tiktoken.model + tokenizer_config.json. `vocab_size` is the number of ranks (the
    lines of tiktoken.model: 256 bytes and the merges); the 256 special ids follow them.
    media_begin: the name of special offset 18 (Kimi-K2's "<|media_start|>"; K2.5 and K3 call it
    "<|media_begin|>"), in the table and in the chat template's image part."""
    num_merges = vocab_size - 256
    if num_merges < 1:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges")
    merges = _unique_merges(train_bpe(num_merges, seed))
    tokens = [bytes([b]) for b in range(256)] + [left + right for left, right in merges]
    num_ranks = len(tokens)
    decoder = {
        str(num_ranks + offset): {"content": content, "lstrip": False, "normalized": False,
                                  "rstrip": False, "single_word": False, "special": True}
        for offset, content in sorted({**KIMI_SPECIAL_TOKENS, 18: media_begin}.items())
    }
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                      "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                      "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False, "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
        "chat_template": KIMI_CHAT_TEMPLATE.replace("<|media_start|>", media_begin),
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tiktoken.model"), "w", encoding="ascii") as f:
        for rank, token in enumerate(tokens):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)

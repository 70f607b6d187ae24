// Encodes strings with the independent npm tokenizers, for python/tests/test_tokenizers.py.
//   node encode.mjs SPEC.json
// SPEC: {"kind": "hf" | "tiktoken", "dir": DIR, "texts": [...], "allow_special": bool,
//        "pat_str": "..." (tiktoken only), "num_reserved_special_tokens": 256 (tiktoken only)}
// Prints [{"ids": [...], "decoded_hex": "..."}] for each text.
//  - hf: @huggingface/tokenizers from DIR/tokenizer.json + DIR/tokenizer_config.json; with
//    allow_special false the special added tokens are dropped before construction, so their
//    text is encoded as ordinary text (what HF's encode_special_tokens does).
//  - tiktoken: tiktoken/lite's Tiktoken(ranks, specials, pat_str) from DIR/tiktoken.model, with the
//    special ids TikTokenTokenizer (tokenization_kimi.py) derives from tokenizer_config.json.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { Tiktoken } from "tiktoken/lite";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const results = [];

if (spec.kind === "hf") {
  const json = JSON.parse(readFileSync(join(spec.dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(readFileSync(join(spec.dir, "tokenizer_config.json"), "utf8"));
  if (!spec.allow_special) json.added_tokens = json.added_tokens.filter((t) => !t.special);
  const tokenizer = new Tokenizer(json, config);
  for (const text of spec.texts) {
    const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    const decoded =
      ids.length === 0
        ? ""
        : tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    results.push({ ids, decoded_hex: hex(new TextEncoder().encode(decoded)) });
  }
} else if (spec.kind === "tiktoken") {
  const ranks = readFileSync(join(spec.dir, "tiktoken.model"), "utf8");
  const config = JSON.parse(readFileSync(join(spec.dir, "tokenizer_config.json"), "utf8"));
  const numRanks = ranks.split("\n").filter((line) => line.length > 0).length;
  const named = config.added_tokens_decoder ?? {};
  const specials = {};
  for (let id = numRanks; id < numRanks + (spec.num_reserved_special_tokens ?? 256); ++id) {
    specials[named[String(id)]?.content ?? `<|reserved_token_${id}|>`] = id;
  }
  const encoder = new Tiktoken(ranks, specials, spec.pat_str);
  for (const text of spec.texts) {
    const ids = Array.from(spec.allow_special ? encoder.encode(text, "all") : encoder.encode_ordinary(text));
    results.push({ ids, decoded_hex: hex(encoder.decode(Uint32Array.from(ids))) });
  }
  encoder.free();
} else {
  throw new Error(`unknown kind ${spec.kind}`);
}
process.stdout.write(JSON.stringify(results) + "\n");

"""The llama.cpp peer's model (docs/performance.md "The peer"): a synthetic `deepseek2` GGUF with
random weights in exactly the shape of a dayzero bench config, and that config with the GGUF's
vocabulary, so that one file (bench/configs/deepseek-v2-lite-shape.json) defines the shape both
engines run.

    PYTHONPATH=LLAMA_DIR/gguf-py /usr/bin/python3 bench/peer_gguf.py \
        [--config bench/configs/deepseek-v2-lite-shape.json] [--vocab-size 512] \
        [--gguf OUT.gguf] [--dayzero-config OUT.json] [--check-gguf IN.gguf]

--gguf writes the model (6.2 GiB for the V2-Lite shape, about a minute): Q4_0 routed experts, Q8_0
every other matrix (embedding and output included), F32 norms and router. --dayzero-config writes
the config with `vocab_size` replaced (dayzero keeps its own formats: FP8 block weights, MXFP4
experts). --check-gguf refuses a GGUF whose metadata differs from the config's shape. Only
--gguf and --check-gguf need `gguf` (from llama.cpp's gguf-py) and numpy.

The shape, in llama.cpp's terms: MLA stored as MQA (one KV head of kv_lora + rope, split k_b/v_b
per head), `leading_dense_block_count` = first_dense_layers, the shared experts as one MLP of
num_shared_experts x moe_intermediate_size, softmax gating (dayzero's synthetic builder routes with
sigmoid + bias, the same cost per token). The tokenizer is a GPT-2 style byte-level BPE: two control
tokens, the 256 byte symbols, then merges of frequent letter pairs up to the vocabulary size.

Random quantized blocks are drawn with zero-mean integer codes (Q8_0: -127..127, Q4_0: nibbles 1..15,
i.e. -7..7). Codes uniform over the full range (-128..127, -8..7) have a negative mean; every
product then adds the same offset to the hidden state, which grows to dominate it and sends every
token to the same experts, and decode would read far fewer expert bytes than a real model.
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from dayzero_ref.bpe_train import bytes_to_unicode  # noqa: E402  (stdlib only)

kRepo = Path(__file__).resolve().parents[1]
kDefaultConfig = kRepo / "bench" / "configs" / "deepseek-v2-lite-shape.json"
kWeightStd = 0.02  # dequantized std of every random matrix
kQ8Max = 127       # Q8_0 codes drawn from -kQ8Max..kQ8Max
kQ4Max = 7         # Q4_0 values drawn from -kQ4Max..kQ4Max (nibble - 8)
kContextLength = 163840  # DeepSeek-V2-Lite's max_position_embeddings
kControlTokens = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]


def fail(message):
    raise SystemExit(f"peer_gguf.py: {message}")


class Shape:
    """The fields of a dayzero synthetic config the GGUF needs, refused by name when absent."""

    def __init__(self, config, vocab_size):
        def field(obj, key, where):
            if key not in obj:
                fail(f"{where}: no field \"{key}\"")
            return obj[key]

        if field(config, "mixer_pattern", "config") != ["mla"]:
            fail(f"config: mixer_pattern {config['mixer_pattern']} — the deepseek2 GGUF has MLA "
                 "in every layer (\"mla\" only)")
        mla = field(config, "mla", "config")
        ffn = field(config, "ffn", "config")
        if field(ffn, "kind", "ffn") != "moe":
            fail("config: ffn.kind must be \"moe\"")
        self.vocab_size = vocab_size
        self.hidden_size = field(config, "hidden_size", "config")
        self.num_layers = field(config, "num_layers", "config")
        self.num_heads = field(mla, "num_heads", "mla")
        self.q_lora_rank = field(mla, "q_lora_rank", "mla")
        self.kv_lora_rank = field(mla, "kv_lora_rank", "mla")
        self.qk_nope_head_dim = field(mla, "qk_nope_head_dim", "mla")
        self.qk_rope_head_dim = field(mla, "qk_rope_head_dim", "mla")
        self.v_head_dim = field(mla, "v_head_dim", "mla")
        self.first_dense_layers = field(ffn, "first_dense_layers", "ffn")
        self.intermediate_size = field(ffn, "intermediate_size", "ffn")
        self.num_experts = field(ffn, "num_experts", "ffn")
        self.num_experts_per_tok = field(ffn, "num_experts_per_tok", "ffn")
        self.moe_intermediate_size = field(ffn, "moe_intermediate_size", "ffn")
        self.num_shared_experts = field(ffn, "num_shared_experts", "ffn")
        if self.q_lora_rank <= 0:
            fail("config: mla.q_lora_rank must be positive (the GGUF stores q_a / q_b)")

    def tensors(self):
        """(name, ne, kind) for every tensor in file order; ne is ggml's order (the contiguous
        axis first, the reverse of PyTorch's); kind is "norm", "router", "expert" or "matrix"."""
        d = self.hidden_size
        h = self.num_heads
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        shared = self.num_shared_experts * self.moe_intermediate_size
        out = [("token_embd.weight", (d, self.vocab_size), "matrix"),
               ("output_norm.weight", (d,), "norm"),
               ("output.weight", (d, self.vocab_size), "matrix")]
        for layer in range(self.num_layers):
            p = f"blk.{layer}."
            out += [
                (p + "attn_norm.weight", (d,), "norm"),
                (p + "attn_q_a_norm.weight", (self.q_lora_rank,), "norm"),
                (p + "attn_kv_a_norm.weight", (self.kv_lora_rank,), "norm"),
                (p + "attn_q_a.weight", (d, self.q_lora_rank), "matrix"),
                (p + "attn_q_b.weight", (self.q_lora_rank, h * qk), "matrix"),
                (p + "attn_kv_a_mqa.weight", (d, self.kv_lora_rank + self.qk_rope_head_dim),
                 "matrix"),
                (p + "attn_k_b.weight", (self.qk_nope_head_dim, self.kv_lora_rank, h), "matrix"),
                (p + "attn_v_b.weight", (self.kv_lora_rank, self.v_head_dim, h), "matrix"),
                (p + "attn_output.weight", (h * self.v_head_dim, d), "matrix"),
                (p + "ffn_norm.weight", (d,), "norm"),
            ]
            if layer < self.first_dense_layers:
                out += [(p + "ffn_gate.weight", (d, self.intermediate_size), "matrix"),
                        (p + "ffn_down.weight", (self.intermediate_size, d), "matrix"),
                        (p + "ffn_up.weight", (d, self.intermediate_size), "matrix")]
            else:
                e, f = self.num_experts, self.moe_intermediate_size
                out += [(p + "ffn_gate_inp.weight", (d, e), "router"),
                        (p + "ffn_gate_exps.weight", (d, f, e), "expert"),
                        (p + "ffn_down_exps.weight", (f, d, e), "expert"),
                        (p + "ffn_up_exps.weight", (d, f, e), "expert"),
                        (p + "ffn_gate_shexp.weight", (d, shared), "matrix"),
                        (p + "ffn_down_shexp.weight", (shared, d), "matrix"),
                        (p + "ffn_up_shexp.weight", (d, shared), "matrix")]
        return out

    def metadata(self):
        """The GGUF keys (without the `deepseek2.` prefix) --check-gguf compares."""
        return {
            "block_count": self.num_layers,
            "embedding_length": self.hidden_size,
            "feed_forward_length": self.intermediate_size,
            "attention.head_count": self.num_heads,
            "attention.q_lora_rank": self.q_lora_rank,
            "attention.kv_lora_rank": self.kv_lora_rank,
            "attention.key_length_mla": self.qk_nope_head_dim + self.qk_rope_head_dim,
            "attention.value_length_mla": self.v_head_dim,
            "rope.dimension_count": self.qk_rope_head_dim,
            "expert_count": self.num_experts,
            "expert_used_count": self.num_experts_per_tok,
            "expert_feed_forward_length": self.moe_intermediate_size,
            "expert_shared_count": self.num_shared_experts,
            "leading_dense_block_count": self.first_dense_layers,
            "vocab_size": self.vocab_size,
        }


def tokenizer(vocab_size):
    """(tokens, is_control, merges): control tokens, byte symbols, then letter-pair merges (space +
    letter first, then letter pairs in English frequency order) until vocab_size tokens."""
    symbols = bytes_to_unicode()  # GPT-2's printable stand-in for each byte
    tokens = list(kControlTokens) + [symbols[b] for b in range(256)]
    letters = "etaoinsrhldcumfpgwybvkxjqz"
    space = symbols[ord(" ")]
    pairs = [(space, c) for c in letters] + [(a, b) for a in letters for b in letters]
    need = vocab_size - len(tokens)
    if need < 0 or need > len(pairs):
        fail(f"--vocab-size {vocab_size}: the byte-level tokenizer holds "
             f"{len(tokens)}..{len(tokens) + len(pairs)} tokens")
    merges = [f"{a} {b}" for a, b in pairs[:need]]
    tokens += [a + b for a, b in pairs[:need]]
    return tokens, len(kControlTokens), merges


def write_gguf(shape, path, seed):
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(seed)
    qtype = {"expert": Q.Q4_0, "matrix": Q.Q8_0}

    def nbytes(ne, kind):
        count = math.prod(ne)
        if kind in ("norm", "router"):
            return count * 4
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype[kind]]
        if ne[0] % block:
            fail(f"a row of {ne[0]} is not a whole number of {block}-element blocks")
        return count // block * block_bytes

    def quantized(ne, kind):
        """Random blocks, as uint8 [*reversed(ne[1:]), row bytes]: an fp16 scale then the codes."""
        rows = math.prod(ne[1:])
        blocks_per_row = ne[0] // 32
        num_blocks = rows * blocks_per_row
        if qtype[kind] == Q.Q8_0:
            codes = rng.integers(-kQ8Max, kQ8Max + 1, size=(num_blocks, 32), dtype=np.int8)
            payload = codes.view(np.uint8)
            code_std = math.sqrt(kQ8Max * (kQ8Max + 1) / 3)
        else:
            # Q4_0 block: element j in the low nibble of byte j, element j + 16 in the high one.
            nibbles = rng.integers(8 - kQ4Max, 8 + kQ4Max + 1, size=(num_blocks, 32),
                                   dtype=np.uint8)
            payload = nibbles[:, :16] | (nibbles[:, 16:] << 4)
            code_std = math.sqrt(kQ4Max * (kQ4Max + 1) / 3)
        scale = np.full((num_blocks, 1), kWeightStd / code_std, dtype="<f2").view(np.uint8)
        blocks = np.concatenate([scale, payload], axis=1)
        return blocks.reshape(*reversed(ne[1:]), blocks_per_row * blocks.shape[1])

    def data(ne, kind):
        torch_shape = tuple(reversed(ne))
        if kind == "norm":
            return np.ones(torch_shape, dtype=np.float32)
        if kind == "router":
            return rng.standard_normal(torch_shape, dtype=np.float32) * np.float32(kWeightStd)
        return quantized(ne, kind)

    tokens, num_control, merges = tokenizer(shape.vocab_size)
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    writer.add_name("dayzero-peer-deepseek2-synthetic")
    writer.add_context_length(kContextLength)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(shape.num_experts)
    writer.add_expert_used_count(shape.num_experts_per_tok)
    writer.add_leading_dense_block_count(shape.first_dense_layers)
    writer.add_vocab_size(shape.vocab_size)
    writer.add_q_lora_rank(shape.q_lora_rank)
    writer.add_kv_lora_rank(shape.kv_lora_rank)
    # The cache as MQA: the key is the latent plus the shared rope part, the value the latent.
    writer.add_key_length(shape.kv_lora_rank + shape.qk_rope_head_dim)
    writer.add_value_length(shape.kv_lora_rank)
    writer.add_key_length_mla(shape.qk_nope_head_dim + shape.qk_rope_head_dim)
    writer.add_value_length_mla(shape.v_head_dim)
    writer.add_expert_feed_forward_length(shape.moe_intermediate_size)
    writer.add_expert_shared_count(shape.num_shared_experts)
    writer.add_expert_weights_scale(1.0)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_rope_dimension_count(shape.qk_rope_head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("deepseek-llm")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * num_control +
                           [gguf.TokenType.NORMAL] * (len(tokens) - num_control))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    plan = shape.tensors()
    total_bytes = 0
    for name, ne, kind in plan:
        size = nbytes(ne, kind)
        total_bytes += size
        torch_shape = tuple(reversed(ne))
        if kind in ("norm", "router"):
            writer.add_tensor_info(name, torch_shape, np.dtype(np.float32), size)
        else:
            byte_shape = (*torch_shape[:-1], size // math.prod(ne[1:]))
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), size,
                                   raw_dtype=qtype[kind])
    print(f"peer_gguf.py: {path}: {len(plan)} tensors, {total_bytes / 2**30:.2f} GiB",
          file=sys.stderr, flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, (name, ne, kind) in enumerate(plan):
        writer.write_tensor_data(data(ne, kind))
        if name.endswith("ffn_up_exps.weight"):
            print(f"  {name} ({index + 1}/{len(plan)} tensors)", file=sys.stderr, flush=True)
    writer.close()


def check_gguf(shape, path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.get_field("general.architecture")
    if arch is None or arch.contents() != "deepseek2":
        fail(f"{path}: not a deepseek2 GGUF")
    for key, want in shape.metadata().items():
        field = reader.get_field(f"deepseek2.{key}")
        have = None if field is None else field.contents()
        if have != want:
            fail(f"{path}: deepseek2.{key} is {have}, the config's shape has {want} "
                 "(delete the file to have it written again)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=kDefaultConfig)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--gguf", type=Path, help="write the llama.cpp model here")
    parser.add_argument("--dayzero-config", type=Path, help="write the config with --vocab-size")
    parser.add_argument("--check-gguf", type=Path, help="refuse a GGUF of another shape")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    if not (args.gguf or args.dayzero_config or args.check_gguf):
        parser.error("nothing to do: give --gguf, --dayzero-config and/or --check-gguf")
    try:
        config = json.loads(args.config.read_text())
    except (OSError, ValueError) as error:
        fail(f"{args.config}: {error}")
    if args.dayzero_config:
        derived = dict(config)
        derived["description"] = (f"{args.config.name} with a {args.vocab_size}-token vocabulary "
                                  "(the llama.cpp peer's GGUF, bench/peer_gguf.py); written by "
                                  "bench/peer_gguf.py, do not edit")
        derived["vocab_size"] = args.vocab_size
        args.dayzero_config.write_text(json.dumps(derived, indent=1) + "\n")
    if args.gguf or args.check_gguf:
        shape = Shape(config, args.vocab_size)
        try:
            import gguf  # noqa: F401
        except ImportError:
            fail("no module gguf: put llama.cpp's gguf-py on PYTHONPATH (PYTHONPATH=LLAMA_DIR/gguf-py)")
        if args.gguf:
            write_gguf(shape, args.gguf, args.seed)
        check_gguf(shape, args.check_gguf or args.gguf)


if __name__ == "__main__":
    main()

"""Independent check of `dayzero inspect --json` (used by tests/inspect_test.sh).

    inspect_check.py check DIR INSPECT_JSON   compare the counts with this file's own
    inspect_check.py drop DIR TENSOR          rewrite DIR's single-file checkpoint without TENSOR
    inspect_check.py copy DIR SRC DST         ... with a copy of SRC named DST
    inspect_check.py retype DIR TENSOR DTYPE  ... with TENSOR re-tagged as DTYPE (zero bytes)

Parameter counts come from closed-form formulas over config.json (docs/models.md §7), written here without
looking at the C++ tensor tables; byte and dtype counts come from the safetensors headers, read here
with struct + json (not with dayzero_ref). Logical parameters: an FP8 weight counts its elements, an
MXFP4 weight_packed two per byte, scale tensors (weight_scale_inv, weight_scale) none.
"""

import json
import os
import struct
import sys
from collections import defaultdict


def headers(directory):
    """name -> (dtype, shape, num_bytes) over every safetensors file of the folder."""
    out = {}
    for file_name in sorted(os.listdir(directory)):
        if not file_name.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, file_name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            out[name] = (entry["dtype"], tuple(entry["shape"]), end - begin)
    return out


def stored_params(name, shape):
    count = 1
    for dim in shape:
        count *= dim
    if name.endswith(".weight_scale_inv") or name.endswith(".weight_scale"):
        return 0
    if name.endswith(".weight_packed"):
        return 2 * count
    return count


def deepseek_counts(c):
    d, h, v = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    rq, rkv = c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    ni, di = c["index_n_heads"], c["index_head_dim"]
    attn = rq * d + rq + h * (nope + rope) * rq + (rkv + rope) * d + rkv + h * (nope + vd) * rkv + d * h * vd
    indexer = ni * di * rq + di * d + 2 * di + ni * d
    expert = 3 * c["moe_intermediate_size"] * d
    num_e = c["n_routed_experts"]
    moe = num_e * d + num_e + num_e * expert + c["n_shared_experts"] * expert
    dense = 3 * c["intermediate_size"] * d
    layers = c["num_hidden_layers"]
    num_dense = c["first_k_dense_replace"]
    main = (layers * (attn + indexer + 2 * d) + num_dense * dense + (layers - num_dense) * moe
            + 2 * v * d + d)
    mtp = c["num_nextn_predict_layers"] * (attn + indexer + 2 * d + moe + 3 * d + 2 * d * d + 2 * v * d)
    routed = (layers - num_dense) * num_e * expert
    active = main - v * d - routed + routed * c["num_experts_per_tok"] // num_e
    return {"total_params": main + mtp, "mtp_params": mtp, "active_params": active,
            "routed_params": routed}


def kimi_counts(c):
    d, h, v = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    la = c["linear_attn_config"]
    kh, hd = la["num_heads"], la["head_dim"]
    width = kh * hd
    bounded = "gate_lower_bound" in la
    kda = (3 * width * d + 3 * width * la["short_conv_kernel_size"] + hd * d + width * hd + kh * d
           + (hd if bounded else kh) + width + hd + d * width)
    kda += width * d if la.get("use_full_rank_gate") else hd * d + width * hd
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    rq = c.get("q_lora_rank")
    mla = (rq * d + rq + h * qk * rq if rq else h * qk * d)
    mla += (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * d + c["kv_lora_rank"]
    mla += h * (c["qk_nope_head_dim"] + c["v_head_dim"]) * c["kv_lora_rank"] + d * h * c["v_head_dim"]
    if c.get("mla_use_output_gate"):
        mla += h * c["v_head_dim"] * d
    num_e, mi = c["num_experts"], c["moe_intermediate_size"]
    latent = c.get("routed_expert_hidden_size")
    expert = 3 * mi * (latent or d)
    moe = num_e * d + num_e + num_e * expert + 3 * mi * c["num_shared_experts"] * d
    if latent:
        moe += 2 * latent * d + (latent if c.get("latent_moe_use_norm") else 0)
    layers = c["num_hidden_layers"]
    num_dense = c["first_k_dense_replace"]
    num_kda = len(la["kda_layers"])
    res = 4 * d if c.get("attn_res_block_size") else 0
    total = (num_kda * kda + (layers - num_kda) * mla + layers * (2 * d + res)
             + num_dense * 3 * c["intermediate_size"] * d + (layers - num_dense) * moe
             + 2 * v * d + d + (2 * d if res else 0))
    routed = (layers - num_dense) * num_e * expert
    active = total - v * d - routed + routed * c["num_experts_per_token"] // num_e
    return {"total_params": total, "mtp_params": 0, "active_params": active, "routed_params": routed}


def vision_counts(vc):
    """Kimi-K3's tower and projector (docs/vision.md §3): conv, position table, blocks, final
    norm, projector and its post-norm; no biases."""
    d, p, q, i = (vc["vt_hidden_size"], vc["patch_size"], vc["qkv_hidden_size"],
                  vc["vt_intermediate_size"])
    block = 2 * d + 3 * q * d + d * q + 2 * i * d
    merged = 4 * d
    return (d * 3 * p * p + vc["init_pos_emb_height"] * vc["init_pos_emb_width"] * d
            + vc["vt_num_hidden_layers"] * block + d + merged * merged
            + vc["text_hidden_size"] * merged + vc["text_hidden_size"])


def check(directory, inspect_json):
    config = json.load(open(os.path.join(directory, "config.json")))
    report = json.load(open(inspect_json))
    if config["model_type"] == "deepseek_v32":
        expected = deepseek_counts(config)
    else:
        expected = kimi_counts(config.get("text_config", config))
        if "vision_config" in config:  # counted in the total and in every token's active share
            vision = vision_counts(config["vision_config"])
            expected["total_params"] += vision
            expected["active_params"] += vision
    problems = []

    def compare(what, got, want):
        if got != want:
            problems.append(f"{what}: inspect says {got}, expected {want}")

    for key in ("total_params", "mtp_params", "active_params"):
        compare(key, report[key], expected[key])
    compare("routed_experts params", report["by_component"]["routed_experts"]["params"],
            expected["routed_params"])
    tensors = headers(directory)
    by_dtype = defaultdict(lambda: [0, 0, 0])
    for name, (dtype, shape, num_bytes) in tensors.items():
        row = by_dtype[dtype]
        row[0] += stored_params(name, shape)
        row[1] += num_bytes
        row[2] += 1
    compare("num_tensors", report["num_tensors"], len(tensors))
    compare("total_bytes", report["total_bytes"], sum(t[2] for t in tensors.values()))
    compare("total_params from headers", report["total_params"],
            sum(stored_params(n, t[1]) for n, t in tensors.items()))
    compare("dtypes", sorted(report["by_dtype"]), sorted(by_dtype))
    for dtype, (params, num_bytes, count) in by_dtype.items():
        got = report["by_dtype"].get(dtype, {})
        compare(f"{dtype} params", got.get("params"), params)
        compare(f"{dtype} bytes", got.get("bytes"), num_bytes)
        compare(f"{dtype} tensors", got.get("tensors"), count)
    scale_bytes = sum(t[2] for n, t in tensors.items() if stored_params(n, t[1]) == 0)
    compare("scales bytes", report["by_component"].get("scales", {}).get("bytes", 0), scale_bytes)
    compare("component bytes sum", sum(r["bytes"] for r in report["by_component"].values()),
            report["total_bytes"])
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{config['model_type']}: {report['total_params']} params, {report['active_params']} active, "
          f"{len(tensors)} tensors agree")
    return 0


def rewrite(directory, edit):
    """Loads DIR's model.safetensors, applies edit(tensors), writes it back."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    from dayzero_ref import safetensors_io  # the writer is not what is being checked here

    path = os.path.join(directory, "model.safetensors")
    tensors = safetensors_io.load_file(path)
    edit(tensors, safetensors_io)
    safetensors_io.save_file(path, tensors, {"format": "pt"})
    return 0


def retype(tensors, st, name, dtype):
    """Re-tags `name` as `dtype`, resizing its bytes to match (zero-filled)."""
    old = tensors[name]
    tensors[name] = st.RawTensor(dtype, old.shape, bytes(st.num_bytes(dtype, old.shape)))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    if command == "drop":
        sys.exit(rewrite(sys.argv[2], lambda t, st: t.pop(sys.argv[3])))
    if command == "copy":
        sys.exit(rewrite(sys.argv[2], lambda t, st: t.__setitem__(sys.argv[4], t[sys.argv[3]])))
    if command == "retype":
        sys.exit(rewrite(sys.argv[2], lambda t, st: retype(t, st, sys.argv[3], sys.argv[4])))
    sys.exit(f"unknown command {command}")

"""Reads and writes safetensors files for tests, without the safetensors package (docs/formats.md §3.1).

torch 1.13 has no float8 dtypes, so a tensor travels as a RawTensor: the safetensors dtype tag, the shape
(PyTorch order) and the raw little-endian bytes in C order. `raw()` makes one from a torch tensor; pass
uint8 codes with dtype="F8_E4M3" (or "F8_E5M2", "F8_E8M0") for float8 data.

Files are laid out as the reference library lays them out (huggingface/safetensors:
safetensors/src/tensor.rs, `prepare`): tensors sorted by descending element width, then by name, so each
starts aligned to its element size; the JSON header padded with spaces to a multiple of 8 bytes, so the
data buffer starts 8-aligned. The writer also accepts the dtypes dayzero refuses (F64, F4, ...), so that
tests can check the refusal.
"""

import json
import math
import os
import struct
from collections import namedtuple

import torch

RawTensor = namedtuple("RawTensor", "dtype shape data")

# Bits per element of every safetensors dtype tag.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32, "U64": 64, "I64": 64,
    "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# The tags dayzero's C++ reader accepts (the rest it refuses by name).
ACCEPTED_DTYPES = ("BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "F8_E8M0", "U8", "I8", "I32", "I64",
                   "BOOL")

_TAG_OF_TORCH = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
    torch.float64: "F64", torch.complex64: "C64",
}
_TORCH_OF_TAG = {tag: dtype for dtype, tag in _TAG_OF_TORCH.items()}
_TORCH_OF_TAG.update({"F8_E4M3": torch.uint8, "F8_E5M2": torch.uint8, "F8_E8M0": torch.uint8,
                      "F8_E4M3FNUZ": torch.uint8, "F8_E5M2FNUZ": torch.uint8})

INDEX_FILE_NAME = "model.safetensors.index.json"


def num_bytes(dtype, shape):
    """Bytes of a tensor; sub-byte dtypes must fill whole bytes."""
    if dtype not in DTYPE_BITS:
        raise ValueError(f"unknown safetensors dtype {dtype!r}")
    bits = DTYPE_BITS[dtype] * math.prod(shape)
    if bits % 8:
        raise ValueError(f"shape {list(shape)} x {dtype} is {bits} bits, not whole bytes")
    return bits // 8


def raw(t, dtype=None):
    """A RawTensor from a torch tensor. `dtype` overrides the tag; it must have the same width."""
    if t.dtype not in _TAG_OF_TORCH:
        raise ValueError(f"no safetensors tag for torch dtype {t.dtype}")
    tag = _TAG_OF_TORCH[t.dtype]
    if dtype is None:
        dtype = tag
    elif dtype not in DTYPE_BITS or DTYPE_BITS[dtype] != DTYPE_BITS[tag]:
        raise ValueError(f"cannot tag a {t.dtype} tensor as {dtype!r}: element widths differ")
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; the bits are the same
        t = t.view(torch.int16)
    array = t.numpy()
    data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    return RawTensor(dtype, tuple(int(d) for d in t.shape), data)


def to_torch(r):
    """The torch tensor of a RawTensor (float8 tags come back as uint8 codes)."""
    if r.dtype not in _TORCH_OF_TAG:
        raise ValueError(f"torch 1.13 has no dtype for {r.dtype}")
    dtype = _TORCH_OF_TAG[r.dtype]
    if len(r.data) == 0:
        return torch.empty(r.shape, dtype=dtype)
    return torch.frombuffer(bytearray(r.data), dtype=dtype).reshape(r.shape)


def _as_raw(name, value):
    if isinstance(value, torch.Tensor):
        value = raw(value)
    if not isinstance(value, RawTensor):
        raise TypeError(f"tensor {name!r}: expected a RawTensor or torch.Tensor, got {type(value)}")
    shape = tuple(value.shape)
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r}: shape {list(shape)} must hold non-negative ints")
    expected = num_bytes(value.dtype, shape)
    if len(value.data) != expected:
        raise ValueError(f"tensor {name!r}: {len(value.data)} bytes, shape {list(shape)} x "
                         f"{value.dtype} needs {expected}")
    return RawTensor(value.dtype, shape, bytes(value.data))


def save_file(path, tensors, metadata=None):
    """Writes one safetensors file. `tensors` maps names to RawTensor or torch.Tensor."""
    items = {name: _as_raw(name, value) for name, value in tensors.items()}
    if "__metadata__" in items:
        raise ValueError("'__metadata__' is reserved and cannot name a tensor")
    header = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    order = sorted(items, key=lambda name: (-DTYPE_BITS[items[name].dtype], name))
    offset = 0
    for name in order:
        r = items[name]
        header[name] = {"dtype": r.dtype, "shape": list(r.shape),
                        "data_offsets": [offset, offset + len(r.data)]}
        offset += len(r.data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            f.write(items[name].data)


def shard_file_name(index, num_shards):
    return f"model-{index + 1:05d}-of-{num_shards:05d}.safetensors"


def save_sharded(out_dir, tensors, max_shard_bytes, metadata=None):
    """Writes model-0000i-of-0000N.safetensors and model.safetensors.index.json into out_dir.

    Tensors go to shards in name order; a shard closes before a tensor that would push it past
    max_shard_bytes (a tensor larger than that gets a shard of its own). `metadata` goes into every
    shard's __metadata__; the index carries metadata.total_size and the weight_map, as transformers
    writes them. Returns the paths of the shards, in order.
    """
    items = {name: _as_raw(name, value) for name, value in tensors.items()}
    shards = [[]]
    shard_bytes = 0
    for name in sorted(items):
        size = len(items[name].data)
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(name)
        shard_bytes += size
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    weight_map = {}
    for i, names in enumerate(shards):
        file_name = shard_file_name(i, len(shards))
        path = os.path.join(out_dir, file_name)
        save_file(path, {name: items[name] for name in names}, metadata)
        paths.append(path)
        weight_map.update({name: file_name for name in names})
    index = {"metadata": {"total_size": sum(len(r.data) for r in items.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, INDEX_FILE_NAME), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return paths


def _refuse_duplicates(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in the header")
        result[key] = value
    return result


def read_header(path):
    """(header dict in file order, offset of the data buffer). Checks the layout like the C++ reader,
    less thoroughly: it is a test helper, not the oracle for the refusals."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, too short")
    (header_bytes,) = struct.unpack("<Q", blob[:8])
    if 8 + header_bytes > len(blob):
        raise ValueError(f"{path}: header length {header_bytes} runs past the file")
    header = json.loads(blob[8:8 + header_bytes].decode("utf-8"),
                        object_pairs_hook=_refuse_duplicates)
    return header, 8 + header_bytes, blob


def load_metadata(path):
    header, _, _ = read_header(path)
    return header.get("__metadata__", {})


def load_file(path):
    """Reads every tensor of a safetensors file, in header order: {name: RawTensor}."""
    header, data_offset, blob = read_header(path)
    data_bytes = len(blob) - data_offset
    tensors = {}
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{path}: tensor {name!r}: fields {sorted(entry)}")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - begin != num_bytes(entry["dtype"], shape) or not 0 <= begin <= end <= data_bytes:
            raise ValueError(f"{path}: tensor {name!r}: bad data_offsets [{begin}, {end}]")
        spans.append((begin, end))
        tensors[name] = RawTensor(entry["dtype"], shape,
                                  blob[data_offset + begin:data_offset + end])
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise ValueError(f"{path}: data buffer has a hole or overlap at {position}")
        position = end
    if position != data_bytes:
        raise ValueError(f"{path}: {data_bytes - position} trailing bytes")
    return tensors

"""Bit-level emulation of dayzero's numeric formats, for torch 1.13 (which has no float8 dtypes).

Codes are integer tensors, values float32. Every function here reproduces src/dayzero/formats (and
kernels/hadamard_ref.cpp) bit for bit; python/tests/test_formats.py checks that against the C++ tool
dz_codec_dump and against an exact rational reference. Spec: docs/formats.md §1, §2, §3.3-3.5,
§4.1 and docs/models.md §1.4.

Conventions shared with the C++ codecs:
- NaN codes decode to the quiet NaN 0x7FC00000 carrying the code's sign.
- Encoders: BF16 NaN -> 0x7FC0; FP16 NaN -> 0x7E00 | sign; E4M3/E5M2 NaN -> 0x7F | sign;
  E2M1 has no NaN, NaN and +-Inf saturate to +-6.
- MX rules are named by formula in C++ (MxScaleRule); here by the short names of docs/formats.md §2.2:
  "floor" = floor(log2 amax) - emax, "rceil" = ceil(log2(amax / max_elem)),
  "ceil_emax" = ceil(log2 amax) - emax, "even" = floor(log2 p) - emax with p = amax rounded up to a
  power of two iff its significand >= 1.75.
"""

import functools
import math

import numpy as np
import torch

__all__ = [
    "encode_bf16", "decode_bf16", "round_to_bf16", "encode_fp16", "decode_fp16",
    "encode_e4m3", "decode_e4m3", "encode_e5m2", "decode_e5m2", "encode_e2m1", "decode_e2m1",
    "encode_e8m0", "decode_e8m0", "quantize_mx", "dequantize_mx", "mx_shared_exponent",
    "pack_fp4", "unpack_fp4", "quantize_fp8_block", "dequantize_fp8_block",
    "quantize_mxfp4_compressed_tensors", "dequantize_mxfp4_compressed_tensors",
    "quantize_mxfp4_gpt_oss", "dequantize_mxfp4_gpt_oss", "act_quant", "hadamard",
    "mxint8_exponent", "mxint8_fake_quant",
]

MX_BLOCK = 32
ACT_QUANT_GROUP = 128
# (max finite value, exponent of the max) of each MX element format.
_MX_ELEMS = {"e2m1": (6.0, 2), "e4m3": (448.0, 8), "e5m2": (57344.0, 15)}
_MX_RULES = ("floor", "rceil", "ceil_emax", "even")
_QUIET_NAN_BITS = 0x7FC00000


# --- bit helpers ---------------------------------------------------------------------------------

def _as_f32(x):
    x = torch.as_tensor(x)
    return x.to(torch.float32) if x.dtype != torch.float32 else x


def _f32_bits(x):
    """float32 tensor -> int64 tensor of its 32 bits (unsigned)."""
    return _as_f32(x).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _from_bits(bits):
    """int64 tensor of 32-bit patterns -> float32 tensor."""
    bits = torch.as_tensor(bits, dtype=torch.int64) & 0xFFFFFFFF
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)


def _pow2_f32(k):
    """2^k as float32 for an int64 tensor k in [-126, 127] (normal powers only)."""
    return _from_bits((k + 127) << 23)


def _full(like, value):
    return torch.full_like(like, value)


def _round_to_grid(absx, mant_bits, bias):
    """Round finite |x| >= 0 (float32) to nearest-even on the grid of a binary float with `mant_bits`
    mantissa bits and bias `bias`, with unbounded exponents above. Returns the int64 code of the
    rounded value; callers compare it with their largest finite code.

    Method (deliberately unlike the integer shifts of codecs.cpp): pick the binade E = max(floor(log2
    |x|), emin), scale |x| by 2^(mant_bits - E) (exact, a power of two) and let torch.round, which
    rounds half to even, do the rounding. A carry out of the binade lands on the next code by itself.
    """
    emin = 1 - bias
    e32 = _f32_bits(absx) >> 23
    binade = torch.clamp(e32 - 127, min=emin)
    count = torch.round(absx * _pow2_f32(mant_bits - binade)).to(torch.int64)
    return ((binade + bias) << mant_bits) + count - (1 << mant_bits)


def _finite_abs(x):
    absx = x.abs()
    return torch.where(torch.isfinite(absx), absx, torch.zeros_like(absx))


# --- scalar encoders and decoders ----------------------------------------------------------------

def encode_bf16(x):
    """float -> int32 BF16 codes, RNE; NaN -> 0x7FC0; overflow -> +-Inf; subnormals kept."""
    x = _as_f32(x)
    bits = _f32_bits(x)
    code = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return torch.where(torch.isnan(x), _full(code, 0x7FC0), code).to(torch.int32)


def decode_bf16(codes):
    return _from_bits((torch.as_tensor(codes).to(torch.int64) & 0xFFFF) << 16)


def round_to_bf16(x):
    """The nearest BF16 value (RNE), as float32."""
    return decode_bf16(encode_bf16(x))


def encode_fp16(x):
    """float -> int32 FP16 codes, IEEE RNE, overflow -> +-Inf (65520 -> Inf), NaN -> 0x7E00 | sign."""
    x = _as_f32(x)
    sign = (_f32_bits(x) >> 16) & 0x8000
    code = torch.clamp(_round_to_grid(_finite_abs(x), 10, 15), max=0x7C00)
    code = torch.where(torch.isinf(x), _full(code, 0x7C00), code)
    code = torch.where(torch.isnan(x), _full(code, 0x7E00), code)
    return (code | sign).to(torch.int32)


def encode_e4m3(x, saturate=True):
    """float -> uint8 E4M3 "fn" codes, RNE. saturate: |x| >= 448 (and Inf) -> +-448. Otherwise
    (PyTorch's plain cast) (448, 464] -> 448 and above, Inf included, -> NaN 0x7F | sign."""
    x = _as_f32(x)
    sign = (_f32_bits(x) >> 24) & 0x80
    absx = x.abs()
    code = _round_to_grid(_finite_abs(x), 3, 7)
    if saturate:
        code = torch.where(absx >= 448.0, _full(code, 0x7E), code)
    else:
        code = torch.where((code > 0x7E) | torch.isinf(x), _full(code, 0x7F), code)
    code = torch.where(torch.isnan(x), _full(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


def encode_e5m2(x, saturate=True):
    """float -> uint8 E5M2 codes, RNE straight from FP32. saturate: |x| >= 57344 -> +-57344;
    otherwise IEEE: |x| >= 61440 -> +-Inf (0x7C). NaN -> 0x7F | sign."""
    x = _as_f32(x)
    sign = (_f32_bits(x) >> 24) & 0x80
    absx = x.abs()
    code = torch.clamp(_round_to_grid(_finite_abs(x), 2, 15), max=0x7C)
    if saturate:
        code = torch.where(absx >= 57344.0, _full(code, 0x7B), code)
    else:
        code = torch.where(torch.isinf(x), _full(code, 0x7C), code)
    code = torch.where(torch.isnan(x), _full(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


def encode_e2m1(x):
    """float -> uint8 E2M1 codes 0..15 (bit 3 = sign), RNE, saturating at +-6 (NaN too)."""
    x = _as_f32(x)
    sign = (_f32_bits(x) >> 28) & 0x8
    code = torch.clamp(_round_to_grid(_finite_abs(x), 1, 1), max=0x7)
    code = torch.where(~torch.isfinite(x), _full(code, 0x7), code)
    return (code | sign).to(torch.uint8)


def encode_e8m0(exponent):
    """Integer exponent k (scale 2^k) -> uint8 code k + 127; k < -127 clamps to 0; k > 127 raises."""
    k = torch.as_tensor(exponent, dtype=torch.int64)
    if bool((k > 127).any()):
        raise ValueError(f"E8M0 exponent {int(k.max())} exceeds 127 (the block would be NaN)")
    return (torch.clamp(k, min=-127) + 127).to(torch.uint8)


def _table_from_values(values, nan_codes):
    """float32 table from exact Python floats; NaN codes get 0x7FC00000 with the code's sign."""
    bits = _f32_bits(torch.tensor([0.0 if v is None else v for v in values], dtype=torch.float64)
                     .to(torch.float32))
    for code, negative in nan_codes:
        bits[code] = _QUIET_NAN_BITS | (0x80000000 if negative else 0)
    return _from_bits(bits)


def _small_float_value(code, mant_bits, bias):
    """Value of a non-negative small-float code from the formulas of docs/formats.md §1.2."""
    e, m = code >> mant_bits, code & ((1 << mant_bits) - 1)
    if e == 0:
        return math.ldexp(m, 1 - bias - mant_bits)
    return math.ldexp((1 << mant_bits) + m, e - bias - mant_bits)


@functools.lru_cache(maxsize=None)
def _tables():
    def signed(code, sign_bit, mant_bits, bias):
        v = _small_float_value(code & (sign_bit - 1), mant_bits, bias)
        return -v if code & sign_bit else v

    e4m3 = [None if c & 0x7F == 0x7F else signed(c, 0x80, 3, 7) for c in range(256)]
    e5m2 = []
    for c in range(256):
        if (c >> 2) & 0x1F == 31:
            e5m2.append(None if c & 3 else (-math.inf if c & 0x80 else math.inf))
        else:
            e5m2.append(signed(c, 0x80, 2, 15))
    e8m0 = [math.ldexp(1.0, c - 127) for c in range(255)] + [None]
    e2m1 = [signed(c, 0x8, 1, 1) for c in range(16)]
    fp16 = []
    for c in range(65536):
        if (c >> 10) & 0x1F == 31:
            fp16.append(None if c & 0x3FF else (-math.inf if c & 0x8000 else math.inf))
        else:
            fp16.append(signed(c, 0x8000, 10, 15))
    return {
        "e4m3": _table_from_values(e4m3, [(0x7F, False), (0xFF, True)]),
        "e5m2": _table_from_values(e5m2, [(c, c >= 0x80) for c in range(256)
                                          if e5m2[c] is None]),
        "e8m0": _table_from_values(e8m0, [(0xFF, False)]),
        "e2m1": _table_from_values(e2m1, []),
        "fp16": _table_from_values(fp16, [(c, c >= 0x8000) for c in range(65536)
                                          if fp16[c] is None]),
    }


def _decode(table, codes, mask):
    return _tables()[table][torch.as_tensor(codes).to(torch.int64) & mask]


def decode_fp16(codes):
    return _decode("fp16", codes, 0xFFFF)


def decode_e4m3(codes):
    return _decode("e4m3", codes, 0xFF)


def decode_e5m2(codes):
    return _decode("e5m2", codes, 0xFF)


def decode_e8m0(codes):
    return _decode("e8m0", codes, 0xFF)


def decode_e2m1(codes):
    return _decode("e2m1", codes, 0xF)


_ENCODERS = {"e2m1": encode_e2m1, "e4m3": encode_e4m3, "e5m2": encode_e5m2}
_DECODERS = {"e2m1": decode_e2m1, "e4m3": decode_e4m3, "e5m2": decode_e5m2}


# --- MX blocks (docs/formats.md §2) -------------------------------------------------------------------

def _ceil_log2(v64):
    """ceil(log2 v) for a positive float64 tensor (frexp: v = f * 2^e, f in [0.5, 1))."""
    f, e = torch.frexp(v64)
    return torch.where(f == 0.5, e - 1, e).to(torch.int64)


def mx_shared_exponent(amax, elem, rule):
    """Shared exponent k (scale 2^k) of blocks with these finite amax values (float32 tensor), clamped
    to >= -127; amax == 0 gives -127."""
    if elem not in _MX_ELEMS or rule not in _MX_RULES:
        raise ValueError(f"unknown MX element {elem!r} or rule {rule!r}")
    max_elem, emax = _MX_ELEMS[elem]
    amax = _as_f32(amax)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    bits = _f32_bits(safe)
    if rule == "floor":
        k = (bits >> 23) - 127 - emax
    elif rule == "rceil":
        # FP64 quotient: amax has 24 significant bits and max_elem is 1.5 or 1.75 times a power of two,
        # so amax / max_elem is a power of two exactly or at least 2^-24 (relative) away from one.
        k = _ceil_log2(safe.to(torch.float64) / max_elem)
    elif rule == "ceil_emax":
        k = _ceil_log2(safe.to(torch.float64)) - emax
    else:  # "even": adding 1 << 21 carries into the exponent iff the significand is >= 1.75
        k = ((bits + (1 << 21)) >> 23) - 127 - emax
    k = torch.where(amax > 0, k, _full(k, -127))
    return torch.clamp(k, min=-127)


def quantize_mx(x, elem, rule):
    """x [..., K] (K % 32 == 0) -> (codes uint8 [..., K], scales uint8 [..., K/32]).

    Elements are x / 2^k (exact) encoded with saturation. A block holding NaN or +-Inf gets scale 0xFF
    and element codes 0x7F (E4M3, E5M2) or 0x7 (E2M1)."""
    x = _as_f32(x)
    if x.shape[-1] % MX_BLOCK:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of {MX_BLOCK}")
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    finite = torch.isfinite(blocks).all(dim=-1)
    amax = _finite_abs(blocks).amax(dim=-1)
    k = mx_shared_exponent(amax, elem, rule)
    codes = _ENCODERS[elem](blocks * _pow2_f32(-k).unsqueeze(-1)).to(torch.int64)
    nan_code = 0x7 if elem == "e2m1" else 0x7F
    codes = torch.where(finite.unsqueeze(-1), codes, _full(codes, nan_code))
    scales = torch.where(finite, k + 127, _full(k, 0xFF))
    return codes.to(torch.uint8).reshape(x.shape), scales.to(torch.uint8)


def dequantize_mx(codes, scales, elem):
    """codes [..., K], scales [..., K/32] -> float32 [..., K]: decode(code) * 2^(E - 127) in FP32."""
    values = _DECODERS[elem](codes)
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // MX_BLOCK, MX_BLOCK)
    return (blocks * decode_e8m0(scales).unsqueeze(-1)).reshape(values.shape)


def pack_fp4(codes):
    """E2M1 codes [..., K] -> uint8 [..., K/2]: even column in the low nibble, odd in the high."""
    codes = torch.as_tensor(codes).to(torch.int64)
    if codes.shape[-1] % 2:
        raise ValueError(f"last dimension {codes.shape[-1]} is odd")
    return ((codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)).to(torch.uint8)


def unpack_fp4(packed):
    """uint8 [..., K/2] -> E2M1 codes uint8 [..., K] (inverse of pack_fp4)."""
    packed = torch.as_tensor(packed).to(torch.int64)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1)
    return codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1]).to(torch.uint8)


def _require_finite(w, what):
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{what}: non-finite value at index {list(index)}")


def quantize_mxfp4_compressed_tensors(w):
    """w [out, in] -> (weight_packed uint8 [out, in/2], weight_scale uint8 [out, in/32]), EVEN rule
    (compressed-tensors' scale choice), RNE elements (docs/formats.md §3.4)."""
    w = _as_f32(w)
    if w.dim() != 2 or w.shape[1] % MX_BLOCK:
        raise ValueError(f"weight shape {list(w.shape)}: need [out, in] with in % 32 == 0")
    _require_finite(w, "quantize_mxfp4_compressed_tensors")
    codes, scales = quantize_mx(w, "e2m1", "even")
    return pack_fp4(codes), scales


def dequantize_mxfp4_compressed_tensors(weight_packed, weight_scale):
    return dequantize_mx(unpack_fp4(weight_packed), weight_scale, "e2m1")


def quantize_mxfp4_gpt_oss(w):
    """w [E, out, in] -> (blocks uint8 [E, out, in/32, 16], scales uint8 [E, out, in/32]), RCEIL rule
    (docs/formats.md §3.5): byte j of a block holds element 2j (low nibble) and 2j+1 (high nibble)."""
    w = _as_f32(w)
    if w.dim() != 3 or w.shape[2] % MX_BLOCK:
        raise ValueError(f"weight shape {list(w.shape)}: need [E, out, in] with in % 32 == 0")
    _require_finite(w, "quantize_mxfp4_gpt_oss")
    codes, scales = quantize_mx(w, "e2m1", "rceil")
    num_experts, num_rows, num_cols = w.shape
    return pack_fp4(codes).reshape(num_experts, num_rows, num_cols // MX_BLOCK, 16), scales


def dequantize_mxfp4_gpt_oss(blocks, scales):
    """blocks [E, out, in/32, 16], scales [E, out, in/32] -> float32 [E, out, in]."""
    blocks = torch.as_tensor(blocks)
    packed = blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * 16)
    return dequantize_mx(unpack_fp4(packed), scales, "e2m1")


# --- FP8 128x128 block-scaled weights (docs/formats.md §3.3) ------------------------------------------

def _expand_tiles(scale, num_rows, num_cols, block):
    return scale.repeat_interleave(block, dim=0)[:num_rows].repeat_interleave(block, dim=1)[:, :num_cols]


def quantize_fp8_block(w, block=128):
    """w [out, in] -> (codes uint8 [out, in], scale_inv float32 [ceil(out/block), ceil(in/block)]).

    Per tile (edge tiles partial): scale_inv = 2^k, k = ceil(log2(amax / 448)) (RCEIL), clamped to
    >= -126 so the scale stays an FP32 normal (an all-zero tile gets 2^-126). Codes are
    encode_e4m3(w / scale_inv) (exact division, never saturates). Dequant: decode * scale_inv[i//b, j//b]."""
    w = _as_f32(w)
    if w.dim() != 2:
        raise ValueError(f"weight shape {list(w.shape)}: need [out, in]")
    _require_finite(w, "quantize_fp8_block")
    num_rows, num_cols = w.shape
    tile_rows, tile_cols = -(-num_rows // block), -(-num_cols // block)
    padded = torch.zeros(tile_rows * block, tile_cols * block, dtype=torch.float32)
    padded[:num_rows, :num_cols] = w.abs()
    amax = padded.reshape(tile_rows, block, tile_cols, block).amax(dim=(1, 3))
    k = mx_shared_exponent(amax, "e4m3", "rceil").clamp(min=-126)
    scale_inv = _pow2_f32(k)
    codes = encode_e4m3(w * _expand_tiles(_pow2_f32(-k), num_rows, num_cols, block))
    return codes, scale_inv


def dequantize_fp8_block(codes, scale_inv, block=128):
    codes = torch.as_tensor(codes)
    num_rows, num_cols = codes.shape
    return decode_e4m3(codes) * _expand_tiles(_as_f32(scale_inv), num_rows, num_cols, block)


# --- DeepSeek act_quant (docs/formats.md §4.1) --------------------------------------------------------

_INV_E4M3_MAX = torch.tensor(np.float32(1.0) / np.float32(448.0), dtype=torch.float32)
_AMAX_FLOOR = torch.tensor(np.float32(1e-4), dtype=torch.float32)


def act_quant(x, scale_fmt="ue8m0"):
    """x [..., N] (N % 128 == 0; rounded to BF16 first, as the engine does) -> (codes uint8 [..., N],
    scales float32 [..., N/128]). scale_fmt "ue8m0": power-of-two scales; None: s = amax * fl32(1/448).
    A group holding NaN or +-Inf gets scale NaN and codes 0x7F."""
    if scale_fmt not in ("ue8m0", None):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}")
    x = round_to_bf16(x)
    if x.shape[-1] % ACT_QUANT_GROUP:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of {ACT_QUANT_GROUP}")
    groups = x.reshape(*x.shape[:-1], x.shape[-1] // ACT_QUANT_GROUP, ACT_QUANT_GROUP)
    finite = torch.isfinite(groups).all(dim=-1)
    amax = torch.maximum(_finite_abs(groups).amax(dim=-1), _AMAX_FLOOR)
    r = amax * _INV_E4M3_MAX
    if scale_fmt == "ue8m0":
        bits = _f32_bits(r)
        s = _from_bits(((bits >> 23) + ((bits & 0x7FFFFF) != 0).to(torch.int64)) << 23)
    else:
        s = r
    y = torch.clamp(groups / s.unsqueeze(-1), -448.0, 448.0)
    codes = encode_e4m3(y).to(torch.int64)
    codes = torch.where(finite.unsqueeze(-1), codes, _full(codes, 0x7F)).to(torch.uint8)
    scales = torch.where(finite, s, torch.full_like(s, math.nan))
    return codes.reshape(x.shape), scales


# --- Walsh-Hadamard (docs/models.md §1.4) -------------------------------------------------------------

def hadamard(x):
    """Orthonormal Sylvester Hadamard transform along the last axis (n a power of two), natural order,
    FP32 butterflies h = 1, 2, ..., n/2 then one multiply by fl32(1/sqrt(n)): bit-identical to
    dz::kernels::hadamard_ref."""
    x = _as_f32(x).clone()
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"n = {n} is not a power of two")
    lead = x.shape[:-1]
    h = 1
    while h < n:
        pairs = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(*lead, n)
        h *= 2
    return x * torch.tensor(np.float32(1.0 / math.sqrt(n)), dtype=torch.float32)


MXINT8_MIN_EXPONENT = -133


def mxint8_exponent(amax):
    """The MXINT8 block exponent e (scale 2^e) of each amax > 0 (docs/formats.md §2.5): the smallest
    e with amax <= 127 · 2^e, at least -133 (OCP's E8M0 floor less the elements' implicit 2^-6)."""
    a = torch.as_tensor(amax, dtype=torch.float64)
    mant, exp = torch.frexp(a)  # a = mant · 2^exp, mant in [0.5, 1)
    # 127 · 2^(exp - 7) = mant_max · 2^exp with mant_max = 127/128: e = exp - 7 unless mant exceeds.
    e = exp.to(torch.int64) - 7 + (mant > 127.0 / 128.0).to(torch.int64)
    return torch.clamp(e, min=MXINT8_MIN_EXPONENT)


def mxint8_fake_quant(x):
    """x [..., K] (K % 32 == 0) through MXINT8 and back, as the engine's 8-bit activations of MXFP4
    weights: per block of 32 along K, codes round-half-even(x / 2^e) in [-127, 127] times 2^e
    (exact in FP32). An all-zero block stays zero; a block with NaN or Inf becomes NaN."""
    x = _as_f32(x)
    if x.shape[-1] % MX_BLOCK:
        raise ValueError(f"mxint8_fake_quant: last dimension {x.shape[-1]} is not a multiple of 32")
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK).to(torch.float64)
    finite = torch.isfinite(blocks).all(dim=-1, keepdim=True)
    amax = torch.where(finite, blocks.abs(), torch.zeros_like(blocks)).amax(dim=-1, keepdim=True)
    scale = torch.ldexp(torch.ones_like(amax), mxint8_exponent(torch.where(amax > 0, amax, 1.0)))
    q = torch.round(blocks / scale)  # half to even
    out = torch.where(amax > 0, q * scale, torch.zeros_like(blocks))
    out = torch.where(finite, out, torch.full_like(blocks, float("nan")))
    return out.reshape(x.shape).to(torch.float32)


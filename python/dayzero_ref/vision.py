"""PyTorch reference of the Kimi-K3 image path: the published K3 HF image processor and the
MoonViT3d vision tower with its PatchMergerMLPV2 projector, K3 options only, images only (t = 1).
What it follows is written down in docs/vision.md (cited below by section).

    preprocess(image_bytes, load_processor_config(MODEL_DIR)) -> ProcessedImage
    VisionReference(MODEL_DIR).encode([ProcessedImage, ...]) -> [Σ num_tokens, text_hidden] FP32

Preprocessing (docs/vision.md §2: the K3 processor):
navit_resize_image plan, with the K3 loop that lowers in_patch_limit while the image would give
more than in_patch_limit // 4 tokens; PIL Image.resize(BICUBIC) in the image's own mode (PIL
premultiplies RGBA/LA and uses NEAREST for "P"/"1"); the transparent background filled after the
resize (chessboard); zero padding right/bottom to multiples of patch·merge; x = float32(u8/255),
x −= mean, x *= 1/std; patches [N, 3, p, p] row-major over the patch grid, CHW inside a patch.

Tower (docs/vision.md §3): FP32 math on the BF16 weights, with activations rounded to BF16
where a BF16 PyTorch model holds them: pixel_values (cast before the conv), conv output, the
interpolated position table, the sum, every norm output, every linear output, the RoPE output, the
attention output, the GELU outputs and each residual sum; softmax and RoPE in FP32.
  x = round(conv(pixels)) + pos (bilinear from the table unless the grid equals it), rounded
  block: h = x + wo(attn(rope(q), rope(k), v)), q/k/v = split(wqkv(norm0(x)));
         y = h + fc1(gelu_tanh(fc0(norm1(h))))             (RMSNorm eps = FP32 epsilon, no biases)
  final RMSNorm; 2×2 merge [TL|TR|BL|BR] per merged token (row-major merged grid);
  projector: post_norm(proj.2(gelu_erf(proj.0(merged))))    (RMSNorm eps projector_ln_eps)

Taps (`taps` dict, key (VISION_LAYER = −2, name) -> float32 numpy array, images concatenated in
order): pixel_values [N, 3·p·p] (FP32, before the BF16 cast, flattened (c, ky, kx)),
patch_embed [N, D] (after the position add), block{i}_out [N, D] for every block i,
final_norm [N, D], merged [T, 4D], projector_out [T, text_hidden].
"""

import dataclasses
import io
import json
import math
import os
from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from dayzero_ref import formats, safetensors_io
from dayzero_ref.ref_common import ReferenceBase, load_config, weight_files

VISION_LAYER = -2
TOWER_NORM_EPS = float(np.finfo(np.float32).eps)  # nn.RMSNorm(eps=None): 1.1920929e-07 (docs/vision.md §3)
ROPE_THETA = 10000.0
ROPE_MAX_SIDE = 512
TENSOR_PREFIXES = ("vision_tower.", "mm_projector.")
# The tap names, in order; block{i}_out follows patch_embed for every block i.
VISION_TAPS = ("pixel_values", "patch_embed", "final_norm", "merged", "projector_out")
# The K3 options this reference implements (docs/vision.md §3); anything else is refused.
K3_OPTIONS = {"norm_type": "rmsnorm", "pos_emb_type": "divided_fixed",
              "pos_emb_interpolation_mode": "bilinear", "merge_type": "sd2_tpool",
              "mm_projector_type": "patchmergerv2", "activation_func": "gelu_pytorch_tanh",
              "attn_bias": False, "linear_bias": False, "patch_embed_proj_bias": False}
IMAGE_PROMPT = "<|media_begin|>image {width}x{height}<|media_content|><|media_pad|><|media_end|>"


# ---------------------------------------------------------------- preprocessing (docs/vision.md §2)

@dataclasses.dataclass
class ProcessedImage:
    pixel_values: np.ndarray  # float32 [N, 3, p, p], N = grid_h·grid_w, row-major patch grid
    grid_h: int
    grid_w: int
    num_tokens: int           # grid_h·grid_w / merge²
    width: int                # the original (pre-resize) size
    height: int


ResizePlan = namedtuple("ResizePlan", "new_width new_height pad_width pad_height num_tokens")


def load_processor_config(model_dir):
    """The `media_proc_cfg` dict of MODEL_DIR/preprocessor_config.json."""
    with open(os.path.join(model_dir, "preprocessor_config.json"), encoding="utf-8") as f:
        return json.load(f)["media_proc_cfg"]


def image_prompt(width, height):
    """The K3 image marker (the processor's make_image_prompt), with the ORIGINAL width and height;
    its single <|media_pad|> stands for num_tokens placeholder ids."""
    return IMAGE_PROMPT.format(width=width, height=height)


def navit_resize(width, height, patch, merge, in_patch_limit, side_limit):
    """navit_resize_image (media_utils.py): the scale that keeps ≤ in_patch_limit patches and
    ≤ side_limit patches per side (never upscaling; int() truncates), then the zero padding to
    multiples of patch·merge and the resulting token count."""
    s1 = math.sqrt(in_patch_limit / (max(1.0, width // patch) * max(1.0, height // patch)))
    scale = min(1.0, s1, side_limit * patch / width, side_limit * patch / height)
    new_w = min(max(1, int(width * scale)), side_limit * patch)
    new_h = min(max(1, int(height * scale)), side_limit * patch)
    factor = merge * patch
    pad_w, pad_h = (factor - new_w % factor) % factor, (factor - new_h % factor) % factor
    tokens_h, tokens_w = (new_h + pad_h) // factor, (new_w + pad_w) // factor
    if max(tokens_h, tokens_w) * merge > side_limit:
        raise ValueError(f"{width}x{height}: {tokens_w}x{tokens_h} tokens exceed "
                         f"patch_limit_on_one_side {side_limit}")
    return ResizePlan(new_w, new_h, pad_w, pad_h, tokens_h * tokens_w)


def resize_plan(width, height, cfg):
    """The K3 processor's get_resize_config: navit_resize with in_patch_limit, and while that
    gives more than in_patch_limit // merge² tokens, limit = min(limit − 1, int(limit · max_tokens
    / num_tokens)) and again. (The IMAGE_MAX_TOKEN_NUM environment override is not read.)"""
    if cfg.get("fixed_output_tokens") is not None:
        raise ValueError("fixed_output_tokens is not supported (the token count follows the grid)")
    patch, merge = int(cfg["patch_size"]), int(cfg["merge_kernel_size"])
    limit = int(cfg["in_patch_limit"])
    max_tokens = limit // merge ** 2
    if max_tokens < 1:
        raise ValueError(f"in_patch_limit {limit} allows no token")
    while True:
        plan = navit_resize(width, height, patch, merge, limit,
                            int(cfg["patch_limit_on_one_side"]))
        if plan.num_tokens <= max_tokens:
            return plan
        limit = min(limit - 1, int(limit * max_tokens / plan.num_tokens))


def transparent_background(height, width, bg):
    """uint8 [H, W, 3] background of a TransparentBgConfig dict (media_utils.py defaults); the
    chessboard starts white and a square is gray where (y//S + x//S) % 2 == 1 (on_top_left) or 0."""
    pattern = bg.get("pattern", "black")
    if pattern in ("white", "black", "gray"):
        value = {"white": 255, "black": 0, "gray": 128}[pattern]
        return np.full((height, width, 3), value, np.uint8)
    if pattern != "chessboard":
        raise ValueError(f"transparent_bg_config pattern {pattern!r}")
    size = int(bg.get("chessboard_square_size", 16))
    gray_parity = 1 if bg.get("chessboard_square_on_top_left", True) else 0
    parity = (np.arange(height)[:, None] // size + np.arange(width)[None, :] // size) % 2
    board = np.where(parity == gray_parity, int(bg.get("chessboard_gray_value", 200)),
                     int(bg.get("chessboard_white_value", 255))).astype(np.uint8)
    return np.repeat(board[:, :, None], 3, axis=2)


def fill_transparent(image, bg):
    """fill_transparent_bg_with (media_utils.py) -> uint8 [H, W, 3]: config None → convert("RGB");
    RGB as is; no alpha band and no "transparency" info → convert("RGB"); otherwise RGBA composited
    over the background in float32, a = A/255: a·rgb + (1 − a)·bg, truncated to uint8."""
    if bg is None or image.mode == "RGB":
        return np.asarray(image.convert("RGB"))
    if "A" not in image.getbands() and "transparency" not in image.info:
        return np.asarray(image.convert("RGB"))
    rgba = np.asarray(image.convert("RGBA"))
    a = rgba[:, :, 3:].astype(np.float32) / 255.0
    out = a * rgba[:, :, :3] + (1 - a) * transparent_background(*rgba.shape[:2], bg)
    return out.astype(np.uint8)


def preprocess(image_bytes, cfg):
    """One encoded image file -> ProcessedImage, as the K3 processor (docs/vision.md §2): plan on the
    original size, PIL BICUBIC resize in the image's own mode, background fill at
    transparent_bg_fill_stage (K3: after_resize), zero pad right/bottom, normalize, patchify."""
    image = Image.open(io.BytesIO(image_bytes))
    width, height = image.size
    plan = resize_plan(width, height, cfg)
    bg = cfg.get("transparent_bg_config")
    if cfg.get("transparent_bg_fill_stage", "before_resize") == "before_resize":
        image = Image.fromarray(fill_transparent(image, bg))
    rgb = fill_transparent(image.resize((plan.new_width, plan.new_height), Image.BICUBIC), bg)
    rgb = np.pad(rgb, ((0, plan.pad_height), (0, plan.pad_width), (0, 0)))
    x = (rgb / 255.0).astype(np.float32)  # the processor's normalize(), in its numpy order
    x -= np.array(cfg["image_mean"])
    x *= 1.0 / np.array(cfg["image_std"])
    p = int(cfg["patch_size"])
    gh, gw = x.shape[0] // p, x.shape[1] // p
    patches = x.reshape(gh, p, gw, p, 3).transpose(0, 2, 4, 1, 3).reshape(gh * gw, 3, p, p)
    return ProcessedImage(np.ascontiguousarray(patches), gh, gw, plan.num_tokens, width, height)


# ---------------------------------------------------------------- 2-D RoPE (docs/vision.md §3)

def rope_table(grid_h, grid_w, head_dim):
    """complex64 [h·w, head_dim/2] for the row-major grid: entry 2k = cis(x·f_k) with x the
    column, entry 2k+1 = cis(y·f_k) with y the row, f_k = 1/10000^(4k/head_dim), FP32 angles."""
    if grid_h > ROPE_MAX_SIDE or grid_w > ROPE_MAX_SIDE:
        raise ValueError(f"grid {grid_h}x{grid_w} exceeds the RoPE table ({ROPE_MAX_SIDE})")
    freqs = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 4)[:head_dim // 4].float() / head_dim)
    ys, xs = torch.meshgrid(torch.arange(grid_h).float(), torch.arange(grid_w).float(),
                            indexing="ij")
    angles = torch.stack([torch.outer(xs.reshape(-1), freqs), torch.outer(ys.reshape(-1), freqs)],
                         dim=-1).reshape(grid_h * grid_w, head_dim // 2)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x, table):
    """x [L, heads, head_dim] -> rotated FP32: consecutive pairs (x[2j], x[2j+1]) as complex
    numbers times table [L, head_dim/2] (the same for every head)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * table[:, None, :]).reshape(x.shape)


# ---------------------------------------------------------------- the tower

def load_vision_tensors(model_dir):
    """name -> FP32 tensor for the `vision_tower.*` / `mm_projector.*` tensors (BF16 in the
    checkpoints); with an index, only the shards that hold them are read."""
    index = os.path.join(model_dir, safetensors_io.INDEX_FILE_NAME)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        paths = [os.path.join(model_dir, name) for name in
                 sorted({v for k, v in weight_map.items() if k.startswith(TENSOR_PREFIXES)})]
    else:
        paths = weight_files(model_dir)
    out = {}
    for path in paths:
        for name, r in safetensors_io.load_file(path).items():
            if not name.startswith(TENSOR_PREFIXES):
                continue
            if r.dtype not in ("BF16", "F16", "F32"):
                raise ValueError(f"{name}: unsupported dtype {r.dtype}")
            out[name] = safetensors_io.to_torch(r).float()
    return out


def expected_shapes(vc):
    """name -> shape of every K3 tower and projector tensor (docs/vision.md §3)."""
    d, q, inter, p = (vc["vt_hidden_size"], vc["qkv_hidden_size"], vc["vt_intermediate_size"],
                      vc["patch_size"])
    merged = vc["mm_hidden_size"] * math.prod(vc["merge_kernel_size"])
    t = "vision_tower."
    table = (vc["init_pos_emb_height"], vc["init_pos_emb_width"], d)
    out = {t + "patch_embed.proj.weight": (d, 3, p, p), t + "patch_embed.pos_emb.weight": table,
           t + "encoder.final_layernorm.weight": (d,),
           "mm_projector.proj.0.weight": (merged, merged),
           "mm_projector.proj.2.weight": (vc["text_hidden_size"], merged),
           "mm_projector.post_norm.weight": (vc["text_hidden_size"],)}
    for i in range(vc["vt_num_hidden_layers"]):
        b = f"{t}encoder.blocks.{i}."
        out.update({b + "norm0.weight": (d,), b + "norm1.weight": (d,),
                    b + "wqkv.weight": (3 * q, d), b + "wo.weight": (d, q),
                    b + "mlp.fc0.weight": (inter, d), b + "mlp.fc1.weight": (d, inter)})
    return out


class VisionReference(ReferenceBase):
    """The vision tower + projector of a kimi_k3 checkpoint folder (config.json's top-level
    `vision_config`). `noise` as ReferenceBase (perturbs every BF16 rounding point)."""

    def __init__(self, model_dir):
        top = load_config(model_dir)
        vc = top.get("vision_config")
        if not vc:
            raise ValueError(f"{model_dir}: config.json has no vision_config")
        for field, want in K3_OPTIONS.items():
            if vc.get(field) != want:
                raise ValueError(f"vision_config {field} = {vc.get(field)!r}: only the K3 value "
                                 f"{want!r} is implemented")
        if list(vc["merge_kernel_size"]) != [2, 2]:
            raise ValueError(f"merge_kernel_size {vc['merge_kernel_size']}: only [2, 2]")
        self.config = vc
        self.w = load_vision_tensors(model_dir)
        for name, shape in expected_shapes(vc).items():
            if name not in self.w:
                raise ValueError(f"{model_dir}: tensor {name} missing")
            if tuple(self.w[name].shape) != tuple(shape):
                raise ValueError(f"{name}: shape {list(self.w[name].shape)}, expected "
                                 f"{list(shape)}")
        self.heads = vc["vt_num_attention_heads"]
        self.head_dim = vc["qkv_hidden_size"] // self.heads
        self.num_layers = vc["vt_num_hidden_layers"]
        self.softmax_scale = float(np.float32(self.head_dim ** -0.5))
        self.projector_eps = float(vc.get("projector_ln_eps", 1e-5))

    @staticmethod
    def _tap(taps, layer_id, name, tensor):
        if taps is not None:
            taps[(layer_id, name)] = tensor.detach().to(torch.float32).numpy().copy()

    def position_table(self, grid_h, grid_w):
        """[h·w, D] row-major: the stored table when the grid equals its size, else F.interpolate
        bilinear (align_corners False, no antialias) in FP32 from the BF16 table, rounded."""
        table = self.w["vision_tower.patch_embed.pos_emb.weight"]
        if (grid_h, grid_w) == tuple(table.shape[:2]):
            return table.reshape(grid_h * grid_w, -1)
        out = F.interpolate(table.permute(2, 0, 1)[None], size=(grid_h, grid_w), mode="bilinear",
                            align_corners=False)
        return self._bf16(out[0].permute(1, 2, 0).reshape(grid_h * grid_w, -1))

    def _attention(self, p, x, spans, ropes):
        """Full (non-causal) attention inside each image's rows, nothing across images."""
        num_rows = x.shape[0]
        qkv = self._bf16(self._linear(x, p + "wqkv.weight")).reshape(num_rows, 3, self.heads, -1)
        out = torch.zeros(num_rows, self.heads, self.head_dim)
        for (begin, end), table in zip(spans, ropes):
            q = self._bf16(apply_rope(qkv[begin:end, 0], table))
            k = self._bf16(apply_rope(qkv[begin:end, 1], table))
            scores = torch.einsum("qhd,khd->hqk", q, k) * self.softmax_scale
            probs = torch.softmax(scores, dim=-1)
            out[begin:end] = torch.einsum("hqk,khd->qhd", probs, qkv[begin:end, 2])
        o = self._bf16(out.reshape(num_rows, -1))
        return self._bf16(self._linear(o, p + "wo.weight"))

    def _block(self, i, x, spans, ropes):
        p = f"vision_tower.encoder.blocks.{i}."
        h = self._bf16(x + self._attention(p, self._rms_norm(x, self.w[p + "norm0.weight"],
                                                             TOWER_NORM_EPS), spans, ropes))
        f = self._bf16(self._linear(self._rms_norm(h, self.w[p + "norm1.weight"], TOWER_NORM_EPS),
                                    p + "mlp.fc0.weight"))
        f = self._bf16(F.gelu(f, approximate="tanh"))
        return self._bf16(h + self._bf16(self._linear(f, p + "mlp.fc1.weight")))

    @staticmethod
    def merge(x, grid_h, grid_w):
        """sd2_tpool for t = 1 (docs/vision.md §3): [h·w, D] -> [(h/2)·(w/2), 4D], merged tokens row-major,
        each [TL | TR | BL | BR] of its 2×2 window."""
        if grid_h % 2 or grid_w % 2:
            raise ValueError(f"grid {grid_h}x{grid_w}: the 2x2 merge needs even sides")
        d = x.shape[-1]
        return (x.reshape(grid_h // 2, 2, grid_w // 2, 2, d).permute(0, 2, 1, 3, 4)
                .reshape(grid_h * grid_w // 4, 4 * d))

    def encode(self, images, taps=None):
        """images: ProcessedImage list -> image embeddings [Σ num_tokens, text_hidden] FP32
        (BF16-valued), the images' tokens in order."""
        if not images:
            raise ValueError("no images")
        d = self.config["vt_hidden_size"]
        spans, begin = [], 0
        for im in images:
            n = im.grid_h * im.grid_w
            if im.pixel_values.shape[0] != n or im.num_tokens * 4 != n:
                raise ValueError(f"image {im.width}x{im.height}: {im.pixel_values.shape[0]} "
                                 f"patches for grid {im.grid_h}x{im.grid_w}, {im.num_tokens} "
                                 "tokens")
            spans.append((begin, begin + n))
            begin += n
        pixels = torch.cat([torch.from_numpy(im.pixel_values).float().reshape(
            im.pixel_values.shape[0], -1) for im in images])
        self._tap(taps, VISION_LAYER, "pixel_values", pixels)
        conv = self.w["vision_tower.patch_embed.proj.weight"].reshape(d, -1)
        x = self._bf16(formats.round_to_bf16(pixels) @ conv.t())
        pos = torch.cat([self.position_table(im.grid_h, im.grid_w) for im in images])
        x = self._bf16(x + pos)
        self._tap(taps, VISION_LAYER, "patch_embed", x)
        ropes = [rope_table(im.grid_h, im.grid_w, self.head_dim) for im in images]
        for i in range(self.num_layers):
            x = self._block(i, x, spans, ropes)
            self._tap(taps, VISION_LAYER, f"block{i}_out", x)
        x = self._rms_norm(x, self.w["vision_tower.encoder.final_layernorm.weight"], TOWER_NORM_EPS)
        self._tap(taps, VISION_LAYER, "final_norm", x)
        merged = torch.cat([self.merge(x[b:e], im.grid_h, im.grid_w)
                            for (b, e), im in zip(spans, images)])
        self._tap(taps, VISION_LAYER, "merged", merged)
        y = self._bf16(F.gelu(self._bf16(self._linear(merged, "mm_projector.proj.0.weight"))))
        y = self._bf16(self._linear(y, "mm_projector.proj.2.weight"))
        y = self._rms_norm(y, self.w["mm_projector.post_norm.weight"], self.projector_eps)
        self._tap(taps, VISION_LAYER, "projector_out", y)
        return y

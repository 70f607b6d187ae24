"""Kimi-K3 image path (dayzero_ref.vision): the K3 preprocessing (resize plan and its K3 loop, PIL
resize in the image's mode, chessboard compositing of transparent pixels, grayscale and palette
images, padding, patch order), the tiny tower (taps, block-diagonal attention across images, the
[TL|TR|BL|BR] merge, the position table used as stored at its own size and interpolated otherwise,
2-D RoPE) and the image embeddings in the text reference and verify_dump --image."""

import io
import os
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from dayzero_ref import formats, kimi, make_tiny, test_prompts_kimi, verify_dump, vision

SEED = 1234
TINY = make_tiny.K3_TINY_PREPROCESSOR["media_proc_cfg"]
PATCH = 14


def png(image):
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def random_rgb(rng, width, height):
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def pixels_u8(processed):
    """The padded uint8 image [H, W, 3] back from the normalized patches (mean = std = 0.5)."""
    gh, gw = processed.grid_h, processed.grid_w
    x = processed.pixel_values.reshape(gh, gw, 3, PATCH, PATCH).transpose(0, 3, 1, 4, 2)
    return np.round((x.reshape(gh * PATCH, gw * PATCH, 3) / 2 + 0.5) * 255).astype(np.int64)


def chessboard(y, x):
    return 180 if (y // 8 + x // 8) % 2 else 255


class PreprocessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        print(f"\nPreprocessTest: numpy seed {SEED}")

    def setUp(self):
        self.rng = np.random.default_rng(SEED)

    def test_resize_plan(self):
        # (width, height) -> (new_w, new_h, pad_w, pad_h, tokens), worked out by hand for the tiny
        # config (96 patches, 24 tokens, 16 patches a side) and the published K3 one.
        cases = {(112, 112): (112, 112, 0, 0, 16),   # the 8x8 table, no resize
                 (50, 30): (50, 30, 6, 26, 4),       # small: padded only
                 (112, 168): (112, 168, 0, 0, 24),   # exactly 96 patches
                 (1000, 100): (224, 22, 0, 6, 8),    # the side limit: scale 224/1000
                 # s1 = sqrt(96/294): 171x114 -> 7x5 = 35 tokens > 24; the K3 loop: limit 65
                 (300, 200): (141, 94, 27, 18, 24),
                 # 137x137 -> 25 tokens; the loop goes on until 111x111 -> 4x4
                 (224, 224): (111, 111, 1, 1, 16)}
        for (w, h), want in cases.items():
            with self.subTest(size=(w, h)):
                self.assertEqual(tuple(vision.resize_plan(w, h, TINY)), want)
        self.assertEqual(vision.navit_resize(300, 200, 14, 2, 96, 16).num_tokens, 35)
        self.assertEqual(vision.navit_resize(224, 224, 14, 2, 96, 16).num_tokens, 25)
        k3 = dict(TINY, in_patch_limit=65536, patch_limit_on_one_side=512)
        self.assertEqual(tuple(vision.resize_plan(1920, 1080, k3)), (1920, 1080, 12, 12, 2691))
        self.assertGreater(vision.navit_resize(8000, 8000, 14, 2, 65536, 512).num_tokens, 16384)
        self.assertLessEqual(vision.resize_plan(8000, 8000, k3).num_tokens, 16384)

    def test_token_counts_grid_and_patch_order(self):
        for w, h in ((112, 112), (50, 30), (300, 200), (1000, 100), (17, 90)):
            with self.subTest(size=(w, h)):
                p = vision.preprocess(png(random_rgb(self.rng, w, h)), TINY)
                plan = vision.resize_plan(w, h, TINY)
                self.assertEqual((p.width, p.height), (w, h))
                self.assertEqual(p.grid_h * PATCH, plan.new_height + plan.pad_height)
                self.assertEqual(p.grid_w * PATCH, plan.new_width + plan.pad_width)
                self.assertEqual(p.num_tokens, p.grid_h * p.grid_w // 4)
                self.assertEqual(p.num_tokens, plan.num_tokens)
                self.assertLessEqual(p.num_tokens, 24)
                self.assertEqual(p.pixel_values.shape, (p.grid_h * p.grid_w, 3, PATCH, PATCH))
                self.assertEqual(p.pixel_values.dtype, np.float32)
                u8 = pixels_u8(p)  # zero padding right and bottom: -1.0 after normalization
                self.assertTrue(np.all(u8[plan.new_height:] == 0))
                self.assertTrue(np.all(u8[:, plan.new_width:] == 0))
        # no resize: every value is (u8/255 - 0.5)·2 at its (row, col, channel) of the image
        image = np.asarray(random_rgb(self.rng, 112, 112))
        p = vision.preprocess(png(Image.fromarray(image)), TINY)
        x = (image / 255.0).astype(np.float32)
        x -= 0.5
        x *= 2.0
        gw = p.grid_w
        for r, c, ch, ky, kx in ((0, 0, 0, 0, 0), (3, 5, 2, 13, 1), (7, 7, 1, 6, 13)):
            self.assertEqual(p.pixel_values[r * gw + c, ch, ky, kx],
                             x[r * PATCH + ky, c * PATCH + kx, ch])

    def test_rgba_composited_on_the_chessboard(self):
        rgba = np.zeros((56, 56, 4), dtype=np.uint8)
        rgba[..., :3] = (10, 200, 30)
        rgba[:, 28:, 3] = 255              # right half opaque
        rgba[40, 50, 3] = 0                # one transparent pixel in a gray square
        rgba[20, 20, 3] = 100              # partly transparent, in a white square
        rgba[20, 10, 3] = 100              # partly transparent, in a gray square
        p = vision.preprocess(png(Image.fromarray(rgba, "RGBA")), TINY)
        self.assertEqual((p.grid_h, p.grid_w, p.num_tokens), (4, 4, 4))
        u8 = pixels_u8(p)
        for y, x in ((0, 0), (0, 8), (8, 8), (9, 17), (40, 50), (55, 27)):
            self.assertEqual(list(u8[y, x]), [chessboard(y, x)] * 3, (y, x))
        self.assertEqual(list(u8[5, 30]), [10, 200, 30])
        a = np.float32(100) / np.float32(255.0)
        for y, x in ((20, 20), (20, 10)):
            want = (a * np.array([10, 200, 30], np.float32) + (1 - a) * chessboard(y, x))
            self.assertEqual(list(u8[y, x]), list(want.astype(np.uint8)))
        self.assertEqual((chessboard(20, 20), chessboard(20, 10)), (255, 180))

    def test_rgba_resized_premultiplied(self):
        # 300x200 -> 141x94: transparent pixels hold a garbage red that must not bleed (PIL resizes
        # RGBA premultiplied), an opaque blue half stays blue away from the edge.
        rgba = np.zeros((200, 300, 4), dtype=np.uint8)
        rgba[..., 0] = 255
        rgba[:, 150:] = (0, 0, 255, 255)
        p = vision.preprocess(png(Image.fromarray(rgba, "RGBA")), TINY)
        u8 = pixels_u8(p)
        for y, x in ((0, 0), (10, 60), (93, 8), (50, 40)):
            self.assertEqual(list(u8[y, x]), [chessboard(y, x)] * 3, (y, x))
        self.assertEqual(list(u8[50, 120]), [0, 0, 255])

    def test_grayscale_and_palette(self):
        gray = self.rng.integers(0, 256, (30, 50), dtype=np.uint8)
        p = vision.preprocess(png(Image.fromarray(gray, "L")), TINY)
        u8 = pixels_u8(p)
        for ch in range(3):
            self.assertTrue(np.array_equal(u8[:30, :50, ch], gray))
        # palette: downscaled NEAREST (only palette colours come out), then converted to RGB
        colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [250, 250, 0]], dtype=np.uint8)
        index = self.rng.integers(0, 4, (200, 300), dtype=np.uint8)
        pal = Image.fromarray(index, "P")
        pal.putpalette(colours.reshape(-1).tolist() + [0] * (768 - 12))
        p = vision.preprocess(png(pal), TINY)
        u8 = pixels_u8(p)[:94, :141].reshape(-1, 3)
        self.assertEqual({tuple(c) for c in u8} - {tuple(c) for c in colours.tolist()}, set())
        # palette with a transparent index: composited on the chessboard
        index = np.zeros((56, 56), dtype=np.uint8)
        index[:, 28:] = 2
        pal = Image.fromarray(index, "P")
        pal.putpalette(colours.reshape(-1).tolist() + [0] * (768 - 12))
        pal.info["transparency"] = 0
        data = png(pal)
        self.assertIn("transparency", Image.open(io.BytesIO(data)).info)
        u8 = pixels_u8(vision.preprocess(data, TINY))
        self.assertEqual(list(u8[0, 8]), [180] * 3)
        self.assertEqual(list(u8[0, 0]), [255] * 3)
        self.assertEqual(list(u8[0, 40]), [0, 0, 255])

    def test_image_prompt(self):
        self.assertEqual(vision.image_prompt(300, 200), "<|media_begin|>image 300x200"
                         "<|media_content|><|media_pad|><|media_end|>")


class VisionModelTest(unittest.TestCase):
    """The tiny kimi_k3 checkpoint (decisive text, plain vision draws), seed CHECKPOINT_SEED."""

    @classmethod
    def setUpClass(cls):
        print(f"\nVisionModelTest: checkpoint seed {test_prompts_kimi.CHECKPOINT_SEED}, numpy seed "
              f"{SEED}")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "kimi_k3")
        make_tiny.make_tiny("kimi_k3", cls.model_dir, seed=test_prompts_kimi.CHECKPOINT_SEED)
        cls.cfg = vision.load_processor_config(cls.model_dir)
        cls.ref = vision.VisionReference(cls.model_dir)
        rng = np.random.default_rng(SEED)
        cls.files = {size: png(random_rgb(rng, *size)) for size in
                     ((112, 112), (300, 200), (112, 168), (50, 30))}
        cls.images = {size: vision.preprocess(data, cls.cfg) for size, data in cls.files.items()}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def encode(self, sizes, taps=None):
        with torch.no_grad():
            return self.ref.encode([self.images[s] for s in sizes], taps)

    def test_config_and_processor_files(self):
        self.assertEqual(self.cfg, TINY)
        self.assertEqual(self.ref.head_dim, 64)
        self.assertAlmostEqual(vision.TOWER_NORM_EPS, 1.1920929e-07, delta=1e-14)

    def test_shapes_and_taps(self):
        sizes = ((300, 200), (112, 112))
        n = sum(self.images[s].grid_h * self.images[s].grid_w for s in sizes)
        t = sum(self.images[s].num_tokens for s in sizes)
        taps = {}
        y = self.encode(sizes, taps)
        self.assertEqual((n, t), (96 + 64, 24 + 16))
        self.assertEqual(tuple(y.shape), (t, 128))
        self.assertTrue(torch.equal(y, formats.round_to_bf16(y)))
        want = {"pixel_values": (n, 588), "patch_embed": (n, 64), "block0_out": (n, 64),
                "block1_out": (n, 64), "final_norm": (n, 64), "merged": (t, 256),
                "projector_out": (t, 128)}
        self.assertEqual({k: v.shape for k, v in taps.items()},
                         {(vision.VISION_LAYER, name): s for name, s in want.items()})
        for v in taps.values():
            self.assertEqual(v.dtype, np.float32)
            self.assertTrue(np.all(np.isfinite(v)))
        self.assertTrue(np.array_equal(taps[(-2, "projector_out")], y.numpy()))
        first = self.images[sizes[0]].pixel_values.reshape(96, -1)
        self.assertTrue(np.array_equal(taps[(-2, "pixel_values")][:96], first))

    def test_images_do_not_attend_to_each_other(self):
        sizes = ((300, 200), (112, 112), (50, 30))
        together = self.encode(sizes)
        alone = torch.cat([self.encode((s,)) for s in sizes])
        self.assertTrue(torch.equal(together, alone))

    def test_merge_order(self):
        taps = {}
        self.encode(((112, 168),), taps)  # grid 12 rows x 8 columns
        final, merged = taps[(-2, "final_norm")], taps[(-2, "merged")]
        gh, gw = 12, 8
        self.assertEqual(merged.shape, (gh * gw // 4, 256))
        for big_y in range(gh // 2):
            for big_x in range(gw // 2):
                row = lambda y, x: final[y * gw + x]  # noqa: E731
                want = np.concatenate([row(2 * big_y, 2 * big_x), row(2 * big_y, 2 * big_x + 1),
                                       row(2 * big_y + 1, 2 * big_x),
                                       row(2 * big_y + 1, 2 * big_x + 1)])
                self.assertTrue(np.array_equal(merged[big_y * (gw // 2) + big_x], want))

    def test_position_table(self):
        table = self.ref.w["vision_tower.patch_embed.pos_emb.weight"]
        with mock.patch.object(vision.F, "interpolate", side_effect=AssertionError("called")):
            self.assertTrue(torch.equal(self.ref.position_table(8, 8), table.reshape(64, 64)))
            taps = {}
            self.encode(((112, 112),), taps)  # grid 8x8: the table as stored, not interpolated
        pixels = formats.round_to_bf16(torch.from_numpy(self.images[(112, 112)].pixel_values))
        conv = F.conv2d(pixels, self.ref.w["vision_tower.patch_embed.proj.weight"], stride=PATCH)
        want = formats.round_to_bf16(formats.round_to_bf16(conv.reshape(64, 64))
                                     + table.reshape(64, 64))
        got = torch.from_numpy(taps[(-2, "patch_embed")])
        self.assertLess(float((got - want).abs().max()), 2 ** -6 * float(want.abs().max()))
        # grid 12x8: rows interpolated (src = (j + 0.5)·8/12 − 0.5, clamped at 0), columns as stored
        interp = self.ref.position_table(12, 8).reshape(12, 8, 64)
        t = table.double()
        for j in range(12):
            src = max(0.0, (j + 0.5) * 8 / 12 - 0.5)
            i0 = int(src)
            i1, lam = min(i0 + 1, 7), src - i0
            want = (1 - lam) * t[i0] + lam * t[i1]  # then rounded to BF16: within 2^-8 relative
            close = (interp[j] - want).abs() <= 2 ** -8 * want.abs() + 1e-6
            self.assertTrue(bool(close.all()), j)
        self.assertTrue(torch.equal(interp, formats.round_to_bf16(interp)))

    def test_rope(self):
        g = torch.Generator()
        g.manual_seed(SEED)
        table = vision.rope_table(2, 3, 64)
        self.assertEqual((tuple(table.shape), table.dtype), ((6, 32), torch.complex64))
        self.assertTrue(torch.equal(table[0], torch.ones(32, dtype=torch.complex64)))
        x = torch.randn(1, 2, 64, generator=g)
        self.assertTrue(torch.equal(vision.apply_rope(x, table[:1]), x))  # position 0: identity
        freqs = 1.0 / 10000.0 ** (torch.arange(16).double() * 4 / 64)
        angles = torch.angle(table[5]).double()  # row y = 1, column x = 2 (all angles < π)
        self.assertTrue(torch.allclose(angles[0::2], 2 * freqs, atol=1e-6))
        self.assertTrue(torch.allclose(angles[1::2], freqs, atol=1e-6))
        # pairs (2j, 2j+1) rotate: elements 0, 1 by x·f_0 = 2 rad, elements 2, 3 by y·f_0 = 1 rad
        y = vision.apply_rope(x.expand(6, 2, 64), table)[5, 0]
        c, s = np.cos(2.0), np.sin(2.0)
        self.assertAlmostEqual(float(y[0]), float(x[0, 0, 0] * c - x[0, 0, 1] * s), places=5)
        self.assertAlmostEqual(float(y[1]), float(x[0, 0, 0] * s + x[0, 0, 1] * c), places=5)
        c, s = np.cos(1.0), np.sin(1.0)
        self.assertAlmostEqual(float(y[2]), float(x[0, 0, 2] * c - x[0, 0, 3] * s), places=5)

    def test_image_embeddings_in_the_text_reference(self):
        text = kimi.KimiReference(self.model_dir)
        pad = text.top_config["media_placeholder_token_id"]
        image = self.images[(112, 112)]
        ids = test_prompts_kimi.PROMPTS[5] + [pad] * image.num_tokens + test_prompts_kimi.PROMPTS[5]
        positions = text.media_positions(ids)
        self.assertEqual(positions, list(range(5, 21)))
        with torch.no_grad():
            plain = text.forward(ids)
            emb = text.w["language_model.model.embed_tokens.weight"][pad]
            same = text.forward(ids, input_embeds=(positions, emb.expand(16, -1)))
            self.assertTrue(torch.equal(plain, same))
            with_image = text.forward(ids, input_embeds=(positions, self.encode(((112, 112),))))
        self.assertTrue(torch.equal(with_image[:5], plain[:5]))  # causal: nothing before moves
        self.assertFalse(torch.equal(with_image[5:], plain[5:]))
        with self.assertRaisesRegex(ValueError, "rows"):
            text.forward(ids, input_embeds=(positions[:3], emb.expand(16, -1)))

    def test_verify_dump_with_images(self):
        pad = make_tiny.KIMI_NUM_RANKS + 21
        ids = [3, 4] + [pad] * 16 + [5] + [pad] * 24 + [6]
        with tempfile.TemporaryDirectory() as out:
            paths = []
            for size in ((112, 112), (300, 200)):
                paths.append(os.path.join(out, f"{size[0]}x{size[1]}.png"))
                with open(paths[-1], "wb") as f:
                    f.write(self.files[size])
            dump = os.path.join(out, "dump")
            args = [self.model_dir, dump, "--token-ids", ",".join(map(str, ids)),
                    "--image", paths[0], "--image", paths[1]]
            self.assertEqual(verify_dump.main(args), 0)
            names = set(os.listdir(dump))
            for name in ("pixel_values", "patch_embed", "block0_out", "block1_out", "final_norm",
                         "merged", "projector_out"):
                self.assertIn(f"L-2.{name}.npy", names)
            self.assertIn("L0.kda_core.npy", names)
            self.assertIn("Lg.logits.npy", names)
            self.assertEqual(np.load(os.path.join(dump, "L-2.projector_out.npy")).shape, (40, 128))
            with torch.no_grad():
                want = self.encode(((112, 112), (300, 200))).numpy()
            self.assertTrue(np.array_equal(np.load(os.path.join(dump, "L-2.projector_out.npy")),
                                           want))
            bad = [self.model_dir, dump, "--token-ids", ",".join(map(str, ids[:-3])),
                   "--image", paths[0], "--image", paths[1]]
            self.assertEqual(verify_dump.main(bad), 1)
            with self.assertRaisesRegex(ValueError, r"holds 38 media placeholder ids .* need 40"):
                verify_dump.dump(self.model_dir, dump, ids[:-3], image_paths=paths)
            other = os.path.join(out, "kimi_linear")
            make_tiny.make_tiny("kimi_linear", other, seed=0)
            with self.assertRaisesRegex(ValueError, "--image needs a kimi_k3 checkpoint"):
                verify_dump.dump(other, dump, ids, image_paths=paths)


if __name__ == "__main__":
    unittest.main()

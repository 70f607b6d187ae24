"""Images through the engine on the tiny kimi_k3 checkpoint (docs/vision.md): `dayzero generate`
with images (a prompts file with "images", several requests at once) against the PyTorch
reference, and through every engine path that must not change the result.

1. Against the reference (dayzero_ref.vision + kimi, the reference's own preprocessing of the same
   files): teacher-forced logits of the engine's greedy tokens, median over positions of the
   relative L2 error < 2e-2 and argmax agreement >= 0.95 (docs/models.md §8.1), for images of
   several sizes and aspect ratios (padding, a resize, the position table used as stored), RGBA,
   greyscale and palette files, a JPEG, one and three images per request. `dayzero verify --image`
   finds 0 pixel values differing from the reference's preprocessing, PNG and JPEG (baseline,
   greyscale, progressive, 4:4:4). The tiny projector is shaped so
   that image positions decide routing and argmax as clearly as text (decisive_kimi).
2. Chunked prefill through the images (a step budget of 16 tokens cuts every image), and prefix-
   cache hits over an image, give the same tokens as one whole prefill; the same picture in
   another request is served from the cache, another picture of the same size is not.
3. Bad images are refused with a reason naming the file, before anything runs.
"""

import io
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch
from PIL import Image

from cli_support import DAYZERO, rel_l2_per_row, run_dayzero, skip_unless_built
from dayzero_ref import kimi, make_tiny, verify_dump, vision
from server_support import MPI_ENV, MPIRUN

REF_MEDIAN_REL_L2 = 2e-2
REF_ARGMAX_AGREEMENT = 0.95
SEED = 20261207


def write_images(folder):
    """name -> path of test images, drawn with SEED."""
    rng = np.random.default_rng(SEED)
    print(f"\ntest images: numpy seed {SEED}")
    paths = {}

    def save(name, image):
        paths[name] = os.path.join(folder, name)
        image.save(paths[name])

    save("rgb_56x84.png", Image.fromarray(rng.integers(0, 256, (84, 56, 3), dtype=np.uint8)))
    rgba = rng.integers(0, 256, (70, 50, 4), dtype=np.uint8)
    rgba[:20, :, 3] = 0  # a transparent band over the chessboard
    save("rgba_50x70.png", Image.fromarray(rgba, "RGBA"))
    grey = (np.linspace(0, 255, 300)[None, :] + rng.integers(0, 30, (200, 300))).clip(0, 255)
    save("grey_300x200.png", Image.fromarray(grey.astype(np.uint8), "L"))  # resized by the plan
    save("rgb_112x112.png", Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)))
    palette = Image.fromarray(rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)).quantize(16)
    save("palette_90x60.png", palette)
    other = rng.integers(0, 256, (84, 56, 3), dtype=np.uint8)  # same size as rgb_56x84
    save("other_56x84.png", Image.fromarray(other))
    # JPEG: baseline 4:2:0, greyscale, progressive 4:2:2, 4:4:4 (libjpeg-turbo on both sides).
    Image.fromarray(rng.integers(0, 256, (70, 90, 3), dtype=np.uint8)).save(
        os.path.join(folder, "rgb_90x70.jpg"), quality=90)
    Image.fromarray(grey.astype(np.uint8), "L").save(os.path.join(folder, "grey_300x200.jpg"),
                                                     quality=85)
    Image.fromarray(rng.integers(0, 256, (150, 130, 3), dtype=np.uint8)).save(
        os.path.join(folder, "progressive_130x150.jpg"), quality=75, progressive=True,
        subsampling=1)
    Image.fromarray(rng.integers(0, 256, (50, 60, 3), dtype=np.uint8)).save(
        os.path.join(folder, "s444_60x50.jpg"), quality=95, subsampling=0)
    for name in ("rgb_90x70.jpg", "grey_300x200.jpg", "progressive_130x150.jpg", "s444_60x50.jpg"):
        paths[name] = os.path.join(folder, name)
    return paths


class VisionEngineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, "k3")
        make_tiny.make_tiny("kimi_k3", cls.model, seed=0)
        cls.images = write_images(cls.tmp.name)
        cls.ref = kimi.KimiReference(cls.model, kv_cache_dtype="bf16")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def generate(self, lines, *flags):
        path = os.path.join(self.tmp.name, "prompts.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        logits_dir = os.path.join(self.tmp.name, "logits")
        result = run_dayzero("generate", "--model", self.model, "--prompts-file", path,
                             "--temperature", 0, "--max-tokens", 6, "--dump-logits", logits_dir,
                             *flags)
        self.assertEqual(result.returncode, 0, result.stderr)
        outputs = [json.loads(line) for line in result.stdout.splitlines()]
        for i, out in enumerate(outputs):
            out["logits"] = np.load(os.path.join(logits_dir, f"{i}.npy"))
        return outputs

    def generate_timing(self, line, *flags):
        """`generate --timing` of one prompts-file line: the timing JSON (last stderr line)."""
        result = run_dayzero("generate", "--model", self.model, "--prompt", line["prompt"],
                             *[x for path in line["images"] for x in ("--image", path)],
                             "--temperature", 0, "--max-tokens", 6, "--timing", *flags)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stderr.strip().splitlines()[-1])

    def image_tokens(self, name):
        """Tokens the processor makes of one image (the reference's count)."""
        with open(self.images[name], "rb") as f:
            cfg = vision.load_processor_config(self.model)
            return vision.preprocess(f.read(), cfg).num_tokens

    def reference_logits(self, prompt_ids, tokens, image_names):
        ids = list(prompt_ids) + list(tokens[:-1])
        taps = {}
        with torch.no_grad():
            embeds = verify_dump.image_embeddings(
                self.model, ids, [self.images[n] for n in image_names], taps) if image_names else None
            logits = self.ref.forward(ids, input_embeds=embeds)
        return logits[len(prompt_ids) - 1:].float().numpy()

    def test_image_requests_match_the_reference(self):
        cases = [["rgb_56x84.png"], ["rgba_50x70.png"], ["grey_300x200.png"],
                 ["rgb_112x112.png"], ["palette_90x60.png"], ["rgb_90x70.jpg"],
                 ["rgb_56x84.png", "grey_300x200.png", "rgba_50x70.png"]]
        lines = [{"prompt": "What is in the picture?", "images": [self.images[n] for n in c]}
                 for c in cases]
        lines.append({"prompt": "Text only, no picture at all."})
        outputs = self.generate(lines)
        for case, out in zip(cases + [[]], outputs):
            with self.subTest(images=case):
                self.assertEqual(out["finish_reason"], "length", out)
                ref = self.reference_logits(out["prompt_token_ids"], out["tokens"], case)
                rel = rel_l2_per_row(out["logits"], ref)
                agree = np.mean(out["logits"].argmax(-1) == ref.argmax(-1))
                self.assertLess(float(np.median(rel)), REF_MEDIAN_REL_L2, rel)
                self.assertGreaterEqual(agree, REF_ARGMAX_AGREEMENT)

    def test_verify_preprocessing_is_pixel_exact(self):
        """`dayzero verify --image`: 0 pixel values differ from the reference's preprocessing
        (Pillow, libjpeg-turbo) for every kind of file, then the vision and text rows pass."""
        names = ["rgb_56x84.png", "rgba_50x70.png", "grey_300x200.png", "palette_90x60.png",
                 "rgb_90x70.jpg", "grey_300x200.jpg", "progressive_130x150.jpg", "s444_60x50.jpg"]
        for group in (names[:4], names[4:]):
            with self.subTest(images=group):
                flags = [x for n in group for x in ("--image", self.images[n])]
                result = run_dayzero("verify", "--model", self.model, *flags, timeout=300)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
                pixels = [line for line in result.stdout.splitlines() if "vision pixels" in line]
                self.assertEqual(len(pixels), 1, result.stdout)
                self.assertRegex(pixels[0], r"values_beyond_equal\s+0\s.*PASS")

    def test_chunked_prefill_and_prefix_hits_give_the_same_tokens(self):
        three = [self.images[n] for n in ("rgb_56x84.png", "grey_300x200.png", "rgba_50x70.png")]
        lines = [{"prompt": "Compare the three pictures.", "images": three},
                 {"prompt": "Describe it.", "images": [self.images["rgb_112x112.png"]]}]
        whole = self.generate(lines)
        chunked = self.generate(lines, "--max-num-batched-tokens", 16, "--max-num-seqs", 1)
        for a, b in zip(whole, chunked):
            self.assertEqual(a["tokens"], b["tokens"])
        # An encoder budget of the largest image's tokens: no step encodes more, so the first
        # request's images take more encoder steps than without it (where the chunks alone, cut
        # at the recurrent-state checkpoints, decide), and the tokens stay the same.
        largest = max(self.image_tokens(n) for n in ("rgb_56x84.png", "grey_300x200.png",
                                                     "rgba_50x70.png"))
        free = self.generate_timing(lines[0])
        budgeted = self.generate_timing(lines[0], "--max-num-encoder-tokens", largest)
        self.assertGreater(free["vision"]["image_tokens"], largest)
        self.assertEqual(budgeted["vision"]["images"], 3)
        self.assertGreater(budgeted["vision"]["encode_steps"], free["vision"]["encode_steps"])
        self.assertEqual(budgeted["tokens"], free["tokens"])
        self.assertEqual(free["tokens"], whole[0]["tokens"][:len(free["tokens"])])
        result = run_dayzero("generate", "--model", self.model, "--prompt", "x", "--image",
                             self.images["grey_300x200.png"], "--max-num-encoder-tokens", 2)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("more than the 2 the encoder makes in one step", result.stderr)
        # One at a time so that the second finds the first's blocks: the same picture hits the
        # prefix cache (past the image), another picture of the same size must not.
        same = {"prompt": "What is in the picture? Answer briefly please.",
                "images": [self.images["rgb_56x84.png"]]}
        other = dict(same, images=[self.images["other_56x84.png"]])
        outputs = self.generate([same, same, other], "--max-num-seqs", 1,
                                "--block-size", 16)
        self.assertEqual(outputs[0]["tokens"], outputs[1]["tokens"])
        self.assertEqual(outputs[0]["prompt_token_ids"], outputs[2]["prompt_token_ids"])
        self.assertGreater(outputs[1]["cached_tokens"], 16, outputs[1])
        # The image's placeholders start the prompt's second block at the latest: nothing of it
        # or after it may come from the first request's cache.
        first_pad = outputs[2]["prompt_token_ids"].index(533)
        self.assertLessEqual(outputs[2]["cached_tokens"], first_pad // 16 * 16, outputs[2])
        ref = self.reference_logits(outputs[2]["prompt_token_ids"], outputs[2]["tokens"],
                                    ["other_56x84.png"])
        self.assertTrue(np.array_equal(outputs[2]["logits"].argmax(-1), ref.argmax(-1)))

    def test_bad_images_are_refused_naming_the_file(self):
        bad = os.path.join(self.tmp.name, "not_an_image.png")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("hello")
        truncated = os.path.join(self.tmp.name, "truncated.png")
        buf = io.BytesIO()
        Image.fromarray(np.zeros((64, 64, 3), np.uint8) + 7).save(buf, format="PNG")
        with open(truncated, "wb") as f:
            f.write(buf.getvalue()[:60])
        tiny = os.path.join(self.tmp.name, "one_pixel.png")
        Image.new("RGB", (1, 1)).save(tiny)
        for path, reason in ((bad, "not an image"), (truncated, "PNG"),
                             (tiny, "at least 14 pixels")):
            with self.subTest(path=os.path.basename(path)):
                result = run_dayzero("generate", "--model", self.model, "--prompt", "Hi",
                                     "--image", path, "--max-tokens", 2)
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(os.path.basename(path), result.stderr)
                self.assertIn(reason, result.stderr)
        result = run_dayzero("generate", "--model", self.model, "--prompt",
                             "two <|media_pad|> and <|media_pad|>", "--image",
                             self.images["rgb_56x84.png"], "--max-tokens", 2)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("2 <|media_pad|> for 1 images", result.stderr)

    def test_tensor_and_expert_parallel_match_and_context_parallel_refuses(self):
        """`mpirun -np N dayzero generate` with images: rank 0 encodes them and the step messages
        carry their rows, so --tp 2 and --tp 2 --ep 2 give the single process's greedy tokens;
        --cp 2 refuses images with a reason."""
        line = {"prompt": "Compare the pictures.",
                "images": [self.images["rgb_56x84.png"], self.images["rgb_90x70.jpg"]]}
        single = self.generate_timing(line)["tokens"]
        flags = [x for path in line["images"] for x in ("--image", path)]
        env = dict(os.environ, **MPI_ENV)
        for ranks, plan in ((2, ["--tp", "2"]), (4, ["--tp", "2", "--ep", "2"]), (2, ["--cp", "2"])):
            with self.subTest(plan=plan):
                result = subprocess.run(
                    [*MPIRUN, "-np", str(ranks), DAYZERO, "generate", "--model", self.model,
                     "--prompt", line["prompt"], *flags, "--temperature", "0", "--max-tokens", "6",
                     "--threads", "1", "--timing", *plan],
                    capture_output=True, text=True, timeout=300, env=env, check=False)
                if plan[0] == "--cp":
                    self.assertNotEqual(result.returncode, 0)
                    self.assertIn("images: not supported yet under context parallelism",
                                  result.stderr)
                    continue
                self.assertEqual(result.returncode, 0, result.stderr[-3000:])
                timing = [ln for ln in result.stderr.splitlines() if ln.startswith("{")]
                self.assertEqual(json.loads(timing[-1])["tokens"], single)


if __name__ == "__main__":
    unittest.main()

"""Images through `dayzero serve` (docs/serving.md §5.6, docs/vision.md) on the tiny kimi_k3
checkpoint, the engine in its worker process (the default), so images cross the worker protocol.

1. A chat request with image_url parts (data: URLs, PNG and JPEG, two images in one message, text
   around them) answers 200; its prompt is the text with K3's image text at each part's place and
   each image's placeholder widened to its token count: /tokenize counts exactly that, and
   usage.prompt_tokens agrees. The greedy tokens the server returns (with their logprobs) match the
   PyTorch reference's argmax on that prompt, teacher-forced (each chosen token the reference's
   argmax or within 0.02 of it; the log probabilities of the server's top 5 within 0.02 of the
   reference's).
2. Bad images (truncated, not an image, 1x1, a 20000x20000 bomb, a huge data URL, bad base64, a
   non-image data URL, file: and http(s) URLs without --allowed-media-domains) get 400 naming the
   field and the reason, while a long streaming request with an image runs beside them and
   finishes untouched; the server stays healthy.
3. --allowed-media-domains 127.0.0.1: an http URL on a local server is fetched and counts the same
   tokens as the same image sent inline; a host not in the list, a 404 and a redirect are 400.
4. A model without a vision tower answers an image part with 400.
"""

import base64
import functools
import http.server
import io
import json
import os
import tempfile
import threading
import unittest

import numpy as np
import torch
from PIL import Image

from cli_support import skip_unless_built
from dayzero_ref import kimi, make_tiny, verify_dump
from server_support import ServerProcess, read_until

SEED = 20261207
# Log probabilities, absolute: BF16 activations through the tiny model move them by ~1e-3.
LOGPROB_TOLERANCE = 0.02
MODEL = "k3"


def data_url(raw, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def encoded(image, fmt, **options):
    buf = io.BytesIO()
    image.save(buf, format=fmt, **options)
    return buf.getvalue()


def user_message(*parts):
    content = []
    for part in parts:
        if isinstance(part, str) and not part.startswith(("data:", "http", "file:")):
            content.append({"type": "text", "text": part})
        else:
            content.append({"type": "image_url", "image_url": {"url": part}})
    return [{"role": "user", "content": content}]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def do_GET(self):  # noqa: N802 (http.server's spelling)
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "/a.png")
            self.end_headers()
            return
        super().do_GET()


class ServerVisionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, MODEL)
        make_tiny.make_tiny("kimi_k3", cls.model, seed=0)
        rng = np.random.default_rng(SEED)
        print(f"\ntest images: numpy seed {SEED}")
        cls.png = encoded(Image.fromarray(rng.integers(0, 256, (84, 56, 3), dtype=np.uint8)), "PNG")
        cls.jpeg = encoded(Image.fromarray(rng.integers(0, 256, (70, 90, 3), dtype=np.uint8)),
                           "JPEG", quality=90)
        cls.files = os.path.join(cls.tmp.name, "files")
        os.makedirs(cls.files)
        with open(os.path.join(cls.files, "a.png"), "wb") as f:
            f.write(cls.png)
        handler = functools.partial(QuietHandler, directory=cls.files)
        cls.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        cls.http_thread = threading.Thread(target=cls.http.serve_forever, daemon=True)
        cls.http_thread.start()
        cls.server = ServerProcess(cls.model, "--max-model-len", 2048,
                                   "--allowed-media-domains", "127.0.0.1")
        cls.ref = kimi.KimiReference(cls.model, kv_cache_dtype="bf16")

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        cls.http.shutdown()
        cls.tmp.cleanup()
        assert code == 0, f"dayzero serve exited with {code}"

    def chat(self, messages, **fields):
        body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
        body.update(fields)
        return self.server.post_json("/v1/chat/completions", body, timeout=120)

    def tokenize(self, messages):
        status, _, body = self.server.post_json("/tokenize", {"model": MODEL,
                                                              "messages": messages})
        self.assertEqual(status, 200, body)
        return body["tokens"]

    def assert_400(self, messages, param, reason):
        status, _, body = self.chat(messages)
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], param, body)
        self.assertIn(reason, body["error"]["message"])

    def token_ids_by_bytes(self):
        """bytes -> id of the tiny checkpoint's vocabulary (tiktoken.model ranks, then the special
        tokens of tokenizer_config.json)."""
        ids = {}
        with open(os.path.join(self.model, "tiktoken.model"), encoding="ascii") as f:
            for line in f:
                text, rank = line.split()
                ids[base64.b64decode(text)] = int(rank)
        with open(os.path.join(self.model, "tokenizer_config.json"), encoding="utf-8") as f:
            for token_id, entry in json.load(f).get("added_tokens_decoder", {}).items():
                ids[entry["content"].encode()] = int(token_id)
        return ids

    def test_images_in_chat_match_the_reference(self):
        messages = user_message("Compare", data_url(self.png), "with",
                                data_url(self.jpeg, "image/jpeg"), "please.")
        prompt = self.tokenize(messages)
        text_only = self.tokenize(user_message("Compare", "with", "please."))
        # Two images: each one's K3 text plus its tokens (the tiny processor makes several).
        self.assertGreater(len(prompt) - len(text_only), 2 * 8)
        status, _, body = self.chat(messages, logprobs=True, top_logprobs=5)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["prompt_tokens"], len(prompt))
        content = body["choices"][0]["logprobs"]["content"]
        vocabulary = self.token_ids_by_bytes()
        chosen = [vocabulary[bytes(c["bytes"])] for c in content]
        # The reference on the prompt plus the server's tokens, teacher-forced, with its own
        # preprocessing (Pillow) of the same bytes.
        paths = []
        for name, raw in (("a.png", self.png), ("b.jpg", self.jpeg)):
            paths.append(os.path.join(self.tmp.name, name))
            with open(paths[-1], "wb") as f:
                f.write(raw)
        ids = prompt + chosen
        with torch.no_grad():
            embeds = verify_dump.image_embeddings(self.model, ids, paths, {})
            logits = self.ref.forward(ids, input_embeds=embeds)
        logprobs = torch.log_softmax(logits[len(prompt) - 1:-1].float(), -1)
        for i, (token, entry) in enumerate(zip(chosen, content)):
            # Greedy: the chosen token is the reference's argmax, or within a near-tie of it.
            self.assertLess(float(logprobs[i].max() - logprobs[i, token]), LOGPROB_TOLERANCE,
                            f"position {i}")
            # Each of the server's top 5 has the reference's log probability (measured: 3e-3 at
            # most; the same request without its image embeddings is 7e-2 off).
            for top in entry["top_logprobs"]:
                ref = float(logprobs[i, vocabulary[bytes(top["bytes"])]])
                self.assertAlmostEqual(top["logprob"], ref, delta=LOGPROB_TOLERANCE,
                                       msg=f"position {i}")

    def test_bad_images_get_400_and_disturb_nothing(self):
        grey = Image.fromarray(np.full((64, 64, 3), 7, np.uint8))
        good = encoded(grey, "PNG")
        bomb = bytearray(good)
        bomb[16:24] = (20000).to_bytes(4, "big") + (20000).to_bytes(4, "big")
        long_stream = self.server.open_stream("/v1/chat/completions", {
            "model": MODEL, "messages": user_message(data_url(self.png), "Go on."),
            "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}, timeout=120)
        param = "messages[0].content[0].image_url.url"
        cases = [
            (data_url(good[:len(good) // 2]), "PNG"),
            (data_url(b"hello, not an image at all"), "not an image"),
            (data_url(encoded(Image.new("RGB", (1, 1)), "PNG")), "at least 14 pixels"),
            (data_url(bytes(bomb)), "20000x20000"),
            (data_url(self.jpeg[:-200], "image/jpeg"), "truncated JPEG"),
            ("data:image/png;base64,@@@@", "not valid base64"),
            ("data:text/plain;base64,aGVsbG8=", "not an image type"),
            ("data:image/png,rawbytes", "only base64 data URLs"),
            ("file:///etc/passwd", "file URLs are not read"),
        ]
        for url, reason in cases:
            with self.subTest(reason=reason):
                self.assert_400(user_message(url, "What is it?"), param, reason)
        huge = "data:image/png;base64," + "A" * (70 << 20)
        status, _, body = self.chat(user_message(huge))
        self.assertIn(status, (400, 413), body)
        # The stream beside them finished whole.
        raw = read_until(long_stream, b"data: [DONE]")
        long_stream.close()
        self.assertIn(b" 200 OK", raw.split(b"\r\n", 1)[0])
        self.assertIn(b'"finish_reason":"length"', raw)
        self.assertIn(b"data: [DONE]", raw)
        self.assertEqual(self.server.get("/health", timeout=5)[0], 200)

    def test_remote_urls_only_from_allowed_domains(self):
        port = self.http.server_address[1]
        param = "messages[0].content[0].image_url.url"
        inline = self.tokenize(user_message(data_url(self.png), "Hi"))
        remote = self.tokenize(user_message(f"http://127.0.0.1:{port}/a.png", "Hi"))
        self.assertEqual(remote, inline)
        status, _, body = self.chat(user_message(f"http://127.0.0.1:{port}/a.png", "Hi"))
        self.assertEqual(status, 200, body)
        self.assert_400(user_message(f"http://localhost:{port}/a.png", "Hi"), param,
                        'the host "localhost" is not in --allowed-media-domains')
        self.assert_400(user_message(f"http://127.0.0.1:{port}/missing.png", "Hi"), param,
                        "answered HTTP 404")
        self.assert_400(user_message(f"http://127.0.0.1:{port}/moved.png", "Hi"), param,
                        "answered HTTP 302")


class TextOnlyModelTest(unittest.TestCase):
    def test_images_to_a_text_model_get_400(self):
        skip_unless_built()
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "kimi_linear")
            make_tiny.make_tiny("kimi_linear", model, seed=0)
            server = ServerProcess(model, "--max-model-len", 512)
            try:
                png = encoded(Image.fromarray(np.full((30, 30, 3), 9, np.uint8)), "PNG")
                status, _, body = server.post_json("/v1/chat/completions", {
                    "model": "kimi_linear", "messages": user_message(data_url(png), "Hi")})
                self.assertEqual(status, 400, body)
                self.assertIn("not supported by this model", body["error"]["message"])
                self.assertEqual(server.get("/health", timeout=5)[0], 200)
            finally:
                self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()

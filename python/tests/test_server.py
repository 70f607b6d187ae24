"""`dayzero serve` end to end (docs/serving.md §5, issue 6) on tiny generated checkpoints.

Server A: deepseek_v32 tiny (chat through the DeepSeek-V3.2 encoder), --max-request-bytes 65536.
  curl non-streaming and streaming (§5.3 event order, usage only when asked), the official
  `openai` npm client both ways, 8 concurrent requests, greedy /v1/completions == `dayzero
  generate`, n > 1, logprobs, tokenize/detokenize, every bad input of issue 6 item 5 with OpenAI's
  error JSON (and the server still serving), cancellation mid-stream and of a non-streaming
  request (running back to 0, KV usage back to 0), metrics moving.
Server B: kimi_linear tiny (Jinja chat template) with two API keys and --max-num-seqs 1
  --max-queued-requests 1: auth (401 / 200, /health public), chat through the template, and
  overload (503 server_overloaded with Retry-After in [1, 60]).
Every wait is bounded; the whole file runs in well under a minute on 2 cores.
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

from cli_support import SOURCE_DIR, run_dayzero, skip_or_fail, skip_unless_built
from dayzero_ref import make_tiny
from server_support import (SERVE_CP, SERVE_EP, SERVE_RANKS, ServerProcess, metric, read_head,
                            sse_events)

NPM_DIR = os.path.join(SOURCE_DIR, "tests", "npm")
MAX_MODEL_LEN = 4096
ENGINE_FLAGS = ("--max-model-len", MAX_MODEL_LEN, "--block-size", 16, "--num-blocks", 513,
                "--max-num-batched-tokens", 256)
# max_tokens of the requests that must still be running when the client leaves or the next request
# arrives: ~1 s of decoding on a tiny model (200 tokens took 60 ms and raced the test's polling).
LONG = 4000
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


def wait_until(predicate, timeout=5.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class ServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.v32 = os.path.join(cls.tmp.name, "deepseek_v32-tiny")
        cls.kimi = os.path.join(cls.tmp.name, "kimi_linear-tiny")
        make_tiny.make_tiny("deepseek_v32", cls.v32, seed=0)
        make_tiny.make_tiny("kimi_linear", cls.kimi, seed=0)
        cls.a = ServerProcess(cls.v32, *ENGINE_FLAGS, "--max-num-seqs", 8,
                              "--max-request-bytes", 65536)
        cls.model = "deepseek_v32-tiny"

    @classmethod
    def tearDownClass(cls):
        code = cls.a.stop()
        cls.tmp.cleanup()
        assert code == 0, f"dayzero serve exited with {code} on SIGTERM"

    def completion(self, **fields):
        body = {"model": self.model, "prompt": "hello world", "max_tokens": 8, "temperature": 0}
        body.update(fields)
        return self.a.post_json("/v1/completions", body)

    def assert_error(self, status, body, want_status, want_type="invalid_request_error",
                     code=None, param=None):
        self.assertEqual(status, want_status, body)
        self.assertEqual(set(body), {"error"})
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"})
        self.assertEqual(body["error"]["type"], want_type)
        if code is not None:
            self.assertEqual(body["error"]["code"], code)
        if param is not None:
            self.assertEqual(body["error"]["param"], param)

    # ---------------------------------------------------------------- curl

    def curl(self, path, body, *extra):
        proc = subprocess.run(["curl", "-sS", "--max-time", "30", "-N", "-H",
                               "Content-Type: application/json", "-d", json.dumps(body), *extra,
                               self.a.base_url + path],
                              capture_output=True, timeout=40, check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def test_curl_chat_non_streaming_and_streaming(self):
        if shutil.which("curl") is None:
            skip_or_fail("no curl (scripts/install-deps.sh installs it)")
        body = {"model": self.model, "messages": CHAT, "max_tokens": 8, "temperature": 0}
        whole = json.loads(self.curl("/v1/chat/completions", body))
        self.assertEqual(whole["object"], "chat.completion")
        self.assertTrue(whole["id"].startswith("chatcmpl-"))
        choice = whole["choices"][0]
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertIn(choice["finish_reason"], ("stop", "length"))
        usage = whole["usage"]
        self.assertGreater(usage["prompt_tokens"], 0)
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
        self.assertIn("cached_tokens", usage["prompt_tokens_details"])

        events = sse_events(self.curl("/v1/chat/completions", dict(body, stream=True)))
        self.assertEqual(events[-1], "[DONE]")
        chunks = events[:-1]
        self.assertEqual(chunks[0]["choices"][0]["delta"], {"role": "assistant", "content": ""})
        self.assertEqual(len({c["id"] for c in chunks}), 1)
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        self.assertTrue(all("usage" not in c for c in chunks), "usage sent unasked")
        self.assertEqual(chunks[-1]["choices"][0]["delta"], {})
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], choice["finish_reason"])
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        self.assertEqual(text, choice["message"]["content"])  # greedy: same answer

        events = sse_events(self.curl("/v1/chat/completions", dict(
            body, stream=True, stream_options={"include_usage": True})))
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["choices"], [])
        self.assertEqual(events[-2]["usage"]["completion_tokens"], usage["completion_tokens"])
        self.assertTrue(all(e["usage"] is None for e in events[:-2]))

    def test_completions_greedy_equals_generate(self):
        status, _, body = self.completion(max_tokens=12)
        self.assertEqual(status, 200, body)
        proc = run_dayzero("generate", "--model", self.v32, "--prompt", "hello world",
                           "--max-tokens", 12, "--threads", 1, "--temperature", 0, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        text = body["choices"][0]["text"]
        self.assertTrue(proc.stdout.startswith(text) and proc.stdout[len(text):] in ("", "\n"),
                        f"server {text!r} vs generate {proc.stdout!r}")
        # Streaming gives the same text.
        status, _, raw = self.a.request("POST", "/v1/completions", {
            "model": self.model, "prompt": "hello world", "max_tokens": 12, "temperature": 0,
            "stream": True})
        self.assertEqual(status, 200)
        events = sse_events(raw)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-1]), text)
        self.assertEqual(events[-2]["choices"][0]["finish_reason"],
                         body["choices"][0]["finish_reason"])

    def test_n_choices_logprobs_and_echo(self):
        status, _, body = self.completion(n=3, temperature=1.0, seed=5, logprobs=2, echo=True)
        self.assertEqual(status, 200, body)
        self.assertEqual([c["index"] for c in body["choices"]], [0, 1, 2])
        for choice in body["choices"]:
            self.assertTrue(choice["text"].startswith("hello world"))
            self.assertEqual(len(choice["logprobs"]["tokens"]), 8)
        self.assertEqual(body["usage"]["completion_tokens"], 24)
        again = self.completion(n=3, temperature=1.0, seed=5, logprobs=2, echo=True)[2]
        self.assertEqual([c["text"] for c in again["choices"]], [c["text"] for c in body["choices"]])

    def test_tokenize_detokenize(self):
        status, _, tok = self.a.post_json("/tokenize", {"model": self.model, "prompt": "hello world"})
        self.assertEqual(status, 200, tok)
        self.assertEqual(tok["count"], len(tok["tokens"]))
        self.assertEqual(tok["max_model_len"], MAX_MODEL_LEN)
        status, _, detok = self.a.post_json("/detokenize", {"model": self.model,
                                                             "tokens": tok["tokens"]})
        self.assertEqual((status, detok), (200, {"prompt": "hello world"}))
        status, _, chat = self.a.post_json("/tokenize", {"model": self.model, "messages": CHAT})
        self.assertEqual(status, 200, chat)
        self.assertGreater(chat["count"], tok["count"])

    def test_models_and_health(self):
        status, _, body = self.a.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        data = json.loads(body)["data"]
        self.assertEqual(data[0]["id"], self.model)
        self.assertEqual(data[0]["max_model_len"], MAX_MODEL_LEN)
        self.assertEqual(self.a.request("GET", "/health")[:1], (200,))

    # ---------------------------------------------------------------- openai npm client

    def test_openai_npm_client(self):
        if shutil.which("node") is None or not os.path.isdir(
                os.path.join(NPM_DIR, "node_modules", "openai")):
            skip_or_fail("node or tests/npm/node_modules/openai missing (install-deps.sh)")
        proc = subprocess.run(["node", os.path.join(NPM_DIR, "openai_client.mjs"),
                               self.a.base_url + "/v1", "unused", self.model, "chat"],
                              capture_output=True, text=True, timeout=60, check=False)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        out = json.loads(proc.stdout)
        whole = out["completion"]["choices"][0]
        self.assertEqual(out["completion_stream"]["text"], whole["text"])
        self.assertEqual(out["completion_stream"]["finish_reason"], whole["finish_reason"])
        chat = out["chat"]["choices"][0]
        self.assertEqual(out["chat_stream"]["role"], "assistant")
        self.assertEqual(out["chat_stream"]["content"], chat["message"]["content"])
        self.assertEqual(out["chat_stream"]["finish_reason"], chat["finish_reason"])
        self.assertEqual(out["chat_stream"]["usage"]["completion_tokens"],
                         out["chat"]["usage"]["completion_tokens"])
        self.assertEqual(len(out["chat_stream"]["ids"]), 1)
        self.assertEqual(out["models"][0]["id"], self.model)

    # ---------------------------------------------------------------- load, cancellation, metrics

    def test_concurrent_requests_all_complete(self):
        results = [None] * 8

        def one(i):
            results[i] = self.completion(prompt=f"request {i}", max_tokens=10, seed=i)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertLess(time.monotonic() - start, 60)
        for status, _, body in results:
            self.assertEqual(status, 200, body)
            self.assertIn(body["choices"][0]["finish_reason"], ("stop", "length"))

    def test_metrics_move(self):
        before = self.a.metrics()
        status, _, body = self.completion(max_tokens=5, ignore_eos=True)
        self.assertEqual(status, 200, body)
        after = self.a.metrics()
        for name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                     "vllm:e2e_request_latency_seconds_count",
                     "vllm:time_to_first_token_seconds_count",
                     "vllm:request_queue_time_seconds_count",
                     "vllm:request_prefill_time_seconds_count",
                     "vllm:request_decode_time_seconds_count",
                     "vllm:request_generation_tokens_count"):
            self.assertGreater(metric(after, name), metric(before, name), name)
        self.assertEqual(metric(after, "vllm:request_success_total", finished_reason="length"),
                         metric(before, "vllm:request_success_total", finished_reason="length") + 1)
        self.assertGreaterEqual(metric(after, "vllm:generation_tokens_total")
                                - metric(before, "vllm:generation_tokens_total"), 5)
        self.assertIn('model_name="deepseek_v32-tiny"', " ".join(after))
        dist = [k for k in after if k.startswith("vllm:dist_")]
        if SERVE_RANKS == 1:
            self.assertEqual(dist, [])
            return
        # Under --tp 2: layer 0's two all-reduces (attention, FFN) of [T, 256] FP32 per step, where
        # rank 0 receives 4 * 256 * T bytes each (docs/parallel.md §3), over every computed token.
        # Under --ep 2 as well the request ran in one of the two data-parallel groups: rank 0 took
        # part in its all-reduces only if it ran in rank 0's group; every rank took part in the
        # MoE layers' all-to-alls (layer 1 of the tiny DeepSeek is one) of every step.
        def delta(name, **labels):
            return metric(after, name, **labels) - metric(before, name, **labels)
        if SERVE_CP > 1:
            # Under --cp 2 alone: no all-reduce; layer 0's MLA and indexer gather the prompt's
            # history (or merge decode partials and candidates) over the two ranks every step.
            self.assertEqual(delta("vllm:dist_bytes_received_total", layer="0", op="all_reduce"),
                             0, dist)
            self.assertGreater(delta("vllm:dist_bytes_received_total", layer="0",
                                     op="all_gather"), 0, dist)
            self.assertGreaterEqual(delta("vllm:dist_collectives_total", layer="step",
                                          op="broadcast"), 2 * 5)
            return
        computed = (delta("vllm:prompt_tokens_total") - delta("vllm:prefix_cache_hits_total")
                    + delta("vllm:generation_tokens_total") - 1)
        reduced = delta("vllm:dist_bytes_received_total", layer="0", op="all_reduce")
        if SERVE_EP == 1:
            self.assertEqual(reduced, 2 * 4 * 256 * computed, dist)
        else:
            self.assertIn(reduced, (0, 2 * 4 * 256 * computed), dist)
            self.assertGreater(delta("vllm:dist_bytes_received_total", layer="1", op="all_to_all"),
                               0, dist)
        self.assertGreaterEqual(delta("vllm:dist_collectives_total", layer="step", op="broadcast"),
                                2 * 5)

    def assert_freed(self, cancelled_before):
        def freed():
            m = self.a.metrics()
            return (metric(m, "vllm:num_requests_running") == 0
                    and metric(m, "vllm:num_requests_waiting") == 0
                    and metric(m, "vllm:kv_cache_usage_perc") == 0
                    and metric(m, "vllm:requests_cancelled_total") > cancelled_before)
        self.assertTrue(wait_until(freed, timeout=5), self.a.metrics())

    def test_cancel_mid_stream_frees_the_request(self):
        before = metric(self.a.metrics(), "vllm:requests_cancelled_total")
        sock = self.a.open_stream("/v1/chat/completions", {
            "model": self.model, "messages": CHAT, "max_tokens": LONG, "ignore_eos": True,
            "temperature": 0, "stream": True})
        received = b""
        while received.count(b"data: ") < 3:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, "stream ended early")
            received += chunk
        self.assertNotIn(b"[DONE]", received)
        sock.close()
        self.assert_freed(before)

    def test_cancel_non_streaming_when_the_client_leaves(self):
        before = metric(self.a.metrics(), "vllm:requests_cancelled_total")
        sock = self.a.open_stream("/v1/completions", {
            "model": self.model, "prompt": "x", "max_tokens": LONG, "ignore_eos": True})
        self.assertTrue(wait_until(
            lambda: metric(self.a.metrics(), "vllm:num_requests_running") > 0, timeout=5))
        sock.close()
        self.assert_freed(before)

    # ---------------------------------------------------------------- bad input

    def test_bad_inputs_get_openai_errors_and_the_server_goes_on(self):
        post = lambda path, body: self.a.post_json(path, body)  # noqa: E731
        s, _, b = post("/v1/chat/completions", '{"model": "x", "messages": [')
        self.assert_error(s, b, 400, code="invalid_value")
        s, _, b = post("/v1/completions", "[1, 2]")
        self.assert_error(s, b, 400)
        s, _, b = post("/v1/chat/completions", {"model": self.model, "messages": CHAT,
                                                "temperature": "hot"})
        self.assert_error(s, b, 400, param="temperature")
        s, _, b = post("/v1/chat/completions", {"model": self.model, "messages": "hi"})
        self.assert_error(s, b, 400, param="messages")
        s, _, b = post("/v1/chat/completions", {"model": "gpt-4", "messages": CHAT})
        self.assert_error(s, b, 404, code="model_not_found", param="model")
        s, _, b = post("/v1/completions", {"model": self.model, "prompt": "x", "max_tokens": 10**6})
        self.assert_error(s, b, 400, code="context_length_exceeded")
        s, _, b = post("/v1/completions",
                       {"model": self.model, "prompt": "word " * (MAX_MODEL_LEN + 100)})
        self.assert_error(s, b, 400, code="context_length_exceeded")
        s, _, b = post("/v1/chat/completions", {"model": self.model,
                                                "messages": [{"role": "user", "content": "x"}] * 1100})
        self.assert_error(s, b, 400, param="messages")
        s, _, b = post("/v1/completions", {"model": self.model, "prompt": "x", "suffix": "y"})
        self.assert_error(s, b, 400)
        s, _, b = post("/v1/completions", {"model": self.model, "prompt": [100000]})
        self.assert_error(s, b, 400)
        s, _, b = post("/v1/completions", {"model": self.model, "prompt": "x" * 70000})
        self.assert_error(s, b, 413)
        s, _, b = post("/detokenize", {"model": self.model, "tokens": [-1]})
        self.assert_error(s, b, 400, param="tokens[0]")
        s, _, b = self.a.request("GET", "/v2/nothing")
        self.assert_error(s, json.loads(b), 404)
        # Still serving.
        status, _, body = self.completion(max_tokens=3)
        self.assertEqual(status, 200, body)


class ServerAuthOverloadTest(unittest.TestCase):
    """Server B: kimi_linear tiny, API keys, one running and one waiting request at most."""

    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "kimi_linear-tiny")
        make_tiny.make_tiny("kimi_linear", cls.dir, seed=0)
        cls.b = ServerProcess(cls.dir, *ENGINE_FLAGS, "--max-num-seqs", 1,
                              "--max-queued-requests", 1, "--api-key", "key-one",
                              "--api-key", "key-two", "--served-model-name", "kimi",
                              "--sse-keepalive", 0.05)

    @classmethod
    def tearDownClass(cls):
        code = cls.b.stop()
        cls.tmp.cleanup()
        assert code == 0, f"dayzero serve exited with {code} on SIGTERM"

    def test_auth(self):
        body = {"model": "kimi", "prompt": "hi", "max_tokens": 2}
        s, _, b = self.b.post_json("/v1/completions", body)
        self.assertEqual((s, b["error"]["type"], b["error"]["code"]),
                         (401, "authentication_error", "invalid_api_key"))
        s, _, b = self.b.post_json("/v1/completions", body, {"Authorization": "Bearer key-on"})
        self.assertEqual(s, 401)
        s, _, b = self.b.post_json("/tokenize", {"prompt": "hi"})
        self.assertEqual(s, 401)
        s, _, b = self.b.post_json("/v1/completions", body, {"Authorization": "Bearer key-two"})
        self.assertEqual(s, 200, b)
        self.assertEqual(self.b.request("GET", "/health")[0], 200)
        self.assertEqual(self.b.request("GET", "/metrics")[0], 200)

    def test_chat_through_the_jinja_template(self):
        s, _, b = self.b.post_json("/v1/chat/completions",
                                   {"model": "kimi", "messages": CHAT, "max_tokens": 4},
                                   {"Authorization": "Bearer key-one"})
        self.assertEqual(s, 200, b)
        self.assertEqual(b["model"], "kimi")
        s, _, tok = self.b.post_json("/tokenize", {"messages": CHAT},
                                     {"Authorization": "Bearer key-one"})
        self.assertEqual(s, 200, tok)
        self.assertEqual(b["usage"]["prompt_tokens"], tok["count"])

    def test_keep_alive_while_queued(self):
        # One running request holds the only sequence slot; a second streamed one waits in the
        # queue and must receive ": keep-alive" comments (every 0.05 s here) before any data.
        body = {"model": "kimi", "prompt": "x", "max_tokens": LONG, "ignore_eos": True,
                "stream": True}
        auth = {"Authorization": "Bearer key-one"}
        running = self.b.open_stream("/v1/completions", body, auth, timeout=10)
        queued = None
        try:
            self.assertTrue(read_head(running).startswith(b"HTTP/1.1 200"))
            # The running request holds the slot once the engine runs it (its first bytes may be
            # a keep-alive comment of its own while it waits, on a slow multi-rank server).
            self.assertTrue(wait_until(
                lambda: metric(self.b.metrics(), "vllm:num_requests_running") == 1, timeout=10))
            queued = self.b.open_stream("/v1/completions", body, auth, timeout=10)
            raw = b""
            deadline = time.monotonic() + 10
            while b": keep-alive" not in raw and time.monotonic() < deadline:
                chunk = queued.recv(4096)
                if not chunk:
                    break
                raw += chunk
            self.assertIn(b": keep-alive", raw)
            self.assertTrue(raw.startswith(b"HTTP/1.1 200"), raw[:60])
        finally:
            running.close()
            if queued is not None:
                queued.close()
        self.assertTrue(wait_until(
            lambda: metric(self.b.metrics(), "vllm:num_requests_running") == 0
            and metric(self.b.metrics(), "vllm:num_requests_waiting") == 0, timeout=5))

    def test_overload_gives_503_with_retry_after(self):
        body = {"model": "kimi", "prompt": "x", "max_tokens": LONG, "ignore_eos": True,
                "stream": True}
        socks = []
        try:
            for _ in range(5):
                socks.append(self.b.open_stream("/v1/completions", body,
                                                {"Authorization": "Bearer key-one"}, timeout=10))
            statuses = [read_head(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        rejected = [h for h in statuses if h.startswith(b"HTTP/1.1 503")]
        self.assertTrue(rejected, [h[:40] for h in statuses])
        self.assertTrue(any(h.startswith(b"HTTP/1.1 200") for h in statuses))
        for head in rejected:
            retry = [line for line in head.split(b"\r\n") if line.lower().startswith(b"retry-after:")]
            self.assertEqual(len(retry), 1, head)
            self.assertTrue(1 <= int(retry[0].split(b":")[1]) <= 60)
        m = self.b.metrics()
        self.assertGreater(metric(m, "vllm:requests_rejected_total", reason="queue_full"), 0)
        # Everyone hung up: the engine drains.
        self.assertTrue(wait_until(
            lambda: metric(self.b.metrics(), "vllm:num_requests_running") == 0, timeout=5))


if __name__ == "__main__":
    unittest.main()

"""`dayzero bench serve` (docs/serving.md §6), the load client, end to end.

1. Against a mock OpenAI server written here (http.server, chunked SSE) whose delays are known:
   the first text chunk 200 ms after the request, then one every 40 ms, each SSE event written in
   two pieces with a pause between them (so events are split across reads). The saved JSON must
   show those TTFT, ITL, TPOT and E2EL (lower bound exact, upper bound loose: this machine is
   shared), vLLM's field names, throughputs consistent with the duration, the concurrency bound
   kept by the client, and the counter deltas scraped from the mock's /metrics.
2. The chat endpoint: a role-only delta sent at once does not count as the first token.
3. Failures: a mock that answers 503 to some requests; they are counted by HTTP status and the
   others still measured. A stream that stalls fails after --timeout, and the run ends.
4. The real server: `dayzero serve` on the tiny deepseek_v32 checkpoint; 8 prompts of 16 tokens,
   8 output tokens with ignore_eos, concurrency 4; the server's token counters must move by
   exactly what the client sent and received.
"""

import json
import os
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cli_support import run_dayzero, skip_unless_built
from dayzero_ref import make_tiny, tokenizer_gen
from server_support import ServerProcess

FIRST_DELAY_S = 0.200
GAP_S = 0.040
NUM_CHUNKS = 8
SLACK_S = 0.150  # loose upper bound on scheduling noise of a loaded 2-core machine


class MockState:
    def __init__(self, reject_odd_first_id=False, stall_s=0.0):
        self.stall_s = stall_s  # a pause after the first text chunk
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.prompt_tokens = 0
        self.rejected = 0
        self.served = 0
        self.reject_odd_first_id = reject_odd_first_id


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep the test output quiet
            pass

        def send_chunk(self, data: bytes):
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def send_event(self, payload):
            text = payload if isinstance(payload, str) else json.dumps(payload)
            event = f"data: {text}\n\n".encode()
            half = len(event) // 2
            self.send_chunk(event[:half])  # split mid-event, across two reads
            time.sleep(0.002)
            self.send_chunk(event[half:])

        def do_GET(self):
            if self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": "mock", "object": "model"}]})
            elif self.path == "/metrics":
                with state.lock:
                    body = ("# TYPE vllm:prefix_cache_queries_total counter\n"
                            f'vllm:prefix_cache_queries_total{{model_name="mock"}} '
                            f"{state.prompt_tokens}\n"
                            f'vllm:requests_rejected_total{{reason="queue_full"}} '
                            f"{state.rejected}\n")
            else:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            chat = self.path == "/v1/chat/completions"
            prompt_len = 5 if chat else len(body["prompt"])
            if state.reject_odd_first_id and body["prompt"][0] % 2 == 1:
                with state.lock:
                    state.rejected += 1
                data = b'{"error":{"message":"queue full","type":"server_error","code":503}}'
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            with state.lock:
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
                state.prompt_tokens += prompt_len
            self.stream(body, chat, prompt_len)

        def leave(self):
            # Before the last bytes: once the client has them it may send its next request, and
            # that must not overlap this one in the count.
            with state.lock:
                state.in_flight -= 1
                state.served += 1

        def stream(self, body, chat, prompt_len):
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            n = body["max_completion_tokens" if chat else "max_tokens"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.send_chunk(b": keep-alive\n\n")
            if chat:
                self.send_event({"choices": [{"index": 0,
                                              "delta": {"role": "assistant", "content": ""}}]})
            time.sleep(FIRST_DELAY_S)
            for i in range(n):
                if i:
                    time.sleep(GAP_S)
                text = f"t{i} "
                finish = "length" if i == n - 1 else None
                choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish}
                          if chat else {"index": 0, "text": text, "finish_reason": finish})
                self.send_event({"choices": [choice]})
                if i == 0 and state.stall_s:
                    time.sleep(state.stall_s)
            self.send_event({"choices": [], "usage": {"prompt_tokens": prompt_len,
                                                      "completion_tokens": n,
                                                      "total_tokens": prompt_len + n}})
            self.leave()
            self.send_event("[DONE]")
            self.send_chunk(b"")

    return Handler


class BenchServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.started = time.monotonic()

    @classmethod
    def tearDownClass(cls):
        print(f"\ntest_bench_serve: {time.monotonic() - cls.started:.1f} s")
        cls.tmp.cleanup()

    def start_mock(self, **kwargs):
        state = MockState(**kwargs)
        server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return state, f"http://127.0.0.1:{server.server_address[1]}"

    def bench(self, url, *flags, name="out"):
        out = os.path.join(self.tmp.name, f"{name}.json")
        proc = run_dayzero("bench", "serve", "--url", url, "--save-result", out, *flags,
                           timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(out, encoding="utf-8") as f:
            return json.load(f), proc.stdout

    def test_mock_timings(self):
        state, url = self.start_mock()
        r, table = self.bench(url, "--num-prompts", 8, "--concurrency", 4, "--input-len", 16,
                              "--output-len", NUM_CHUNKS, "--vocab-size", 1000)
        self.assertIn("Serving Benchmark Result", table)
        self.assertEqual((r["completed"], r["failed"]), (8, 0))
        self.assertEqual(r["total_input_tokens"], 8 * 16)
        self.assertEqual(r["total_output_tokens"], 8 * NUM_CHUNKS)
        self.assertEqual(r["max_concurrency"], 4)
        self.assertEqual(r["request_rate"], "inf")
        self.assertLessEqual(state.max_in_flight, 4)
        self.assertEqual(r["max_concurrent_requests"], 4)  # the first four overlap
        # The mock's delays, measured on the client: lower bounds exact, upper ones loose.
        ttft = FIRST_DELAY_S * 1000
        self.assertGreaterEqual(r["mean_ttft_ms"], ttft)
        self.assertLess(r["mean_ttft_ms"], ttft + SLACK_S * 1000)
        self.assertGreater(r["mean_itl_ms"], GAP_S * 1000 * 0.9)  # a split read may lag a gap
        self.assertLess(r["mean_itl_ms"], (GAP_S + SLACK_S / 4) * 1000)
        for itls in r["itls"]:
            self.assertEqual(len(itls), NUM_CHUNKS - 1)
        e2el_min = (FIRST_DELAY_S + (NUM_CHUNKS - 1) * GAP_S) * 1000
        self.assertGreaterEqual(r["mean_e2el_ms"], e2el_min)
        for lat, ttft_s, itls in zip(r["latencies"], r["ttfts"], r["itls"]):
            self.assertAlmostEqual(lat, ttft_s + sum(itls), places=9)  # last chunk = last text
        # TPOT = (E2EL − TTFT) / (out − 1); here that is the mean of each request's gaps.
        tpots = [(lat - t) / (NUM_CHUNKS - 1) for lat, t in zip(r["latencies"], r["ttfts"])]
        self.assertAlmostEqual(r["mean_tpot_ms"], 1000 * sum(tpots) / len(tpots), places=6)
        for key in ("median", "std", "p50", "p90", "p99"):
            for metric in ("ttft", "tpot", "itl", "e2el"):
                self.assertIn(f"{key}_{metric}_ms", r)
        # Two waves of four requests; throughputs are counts over the measured duration.
        self.assertGreaterEqual(r["duration"], 2 * e2el_min / 1000)
        self.assertAlmostEqual(r["request_throughput"] * r["duration"], 8, places=6)
        self.assertAlmostEqual(r["output_throughput"] * r["duration"], 8 * NUM_CHUNKS, places=6)
        self.assertAlmostEqual(r["total_token_throughput"] * r["duration"],
                               8 * (16 + NUM_CHUNKS), places=6)
        self.assertEqual(r["server_metrics_delta"], {"vllm:prefix_cache_queries_total": 128.0})
        self.assertEqual(r["generated_texts"][0],
                         "".join(f"t{i} " for i in range(NUM_CHUNKS)))

    def test_chat_role_delta_is_not_a_token(self):
        _, url = self.start_mock()
        tok = os.path.join(self.tmp.name, "tok")
        os.makedirs(tok, exist_ok=True)
        tokenizer_gen.write_hf_tokenizer(tok, 512, seed=0)
        r, _ = self.bench(url, "--endpoint", "/v1/chat/completions", "--tokenizer", tok,
                          "--num-prompts", 3, "--input-len", 8, "--output-len", 4,
                          "--request-rate", 50, "--seed", 3, name="chat")
        self.assertEqual(r["completed"], 3)
        self.assertEqual(r["backend"], "openai-chat")
        self.assertGreaterEqual(r["mean_ttft_ms"], FIRST_DELAY_S * 1000)
        self.assertEqual(r["total_input_tokens"], 15)  # the mock's usage.prompt_tokens
        self.assertEqual(r["request_rate"], 50)

    def test_rejections_are_counted(self):
        state, url = self.start_mock(reject_odd_first_id=True)
        r, table = self.bench(url, "--num-prompts", 12, "--concurrency", 6, "--input-len", 4,
                              "--output-len", 2, "--vocab-size", 100, "--seed", 5, name="503")
        self.assertGreater(state.rejected, 0)
        self.assertGreater(state.served, 0)
        self.assertEqual(r["failed"], state.rejected)
        self.assertEqual(r["completed"], state.served)
        self.assertEqual(r["failed_by_http_status"], {"503": state.rejected})
        self.assertIn("HTTP 503:", table)
        self.assertEqual(r["server_metrics_delta"]["vllm:requests_rejected_total"],
                         state.rejected)
        self.assertEqual(sum(1 for e in r["errors"] if e.startswith("HTTP 503")), state.rejected)

    def test_timeout_bounds_a_stalled_stream(self):
        _, url = self.start_mock(stall_s=3.0)
        started = time.monotonic()
        out = os.path.join(self.tmp.name, "stall.json")
        proc = run_dayzero("bench", "serve", "--url", url, "--num-prompts", 2, "--input-len", 4,
                           "--output-len", 4, "--vocab-size", 50, "--timeout", 0.5,
                           "--save-result", out, timeout=60)
        self.assertLess(time.monotonic() - started, 2.5)  # not the mock's 3 s stall
        self.assertEqual(proc.returncode, 1)  # nothing succeeded
        self.assertIn("every request failed", proc.stderr)
        with open(out, encoding="utf-8") as f:
            r = json.load(f)
        self.assertEqual((r["completed"], r["failed"]), (0, 2))
        for error in r["errors"]:  # the read timeout or the per-request deadline, whichever first
            self.assertTrue(error.startswith(("transport error", "timed out")), error)

    def test_bad_flags(self):
        proc = run_dayzero("bench", "serve", "--url", "http://127.0.0.1:9", "--num-prompts", 1)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("random prompts need a vocabulary", proc.stderr)
        proc = run_dayzero("bench", "serve", "--url", "http://127.0.0.1:9", "--vocab-size", 10,
                           "--goodput", "ttfx:5")
        self.assertIn("--goodput: unknown metric 'ttfx'", proc.stderr)

    def test_real_server(self):
        model = os.path.join(self.tmp.name, "deepseek_v32-tiny")
        make_tiny.make_tiny("deepseek_v32", model, seed=0)
        server = ServerProcess(model)  # F2's helper: a free port, /health waited for
        self.addCleanup(server.stop)
        r, table = self.bench(server.base_url, "--model", model, "--num-prompts", 8,
                              "--concurrency", 4, "--input-len", 16, "--output-len", 8,
                              "--ignore-eos", name="real")
        print("\n" + table)
        self.assertEqual(r["completed"], 8, r["errors"])
        self.assertEqual(r["total_input_tokens"], 8 * 16)
        self.assertEqual(r["total_output_tokens"], 8 * 8)
        self.assertGreater(r["mean_ttft_ms"], 0)
        self.assertGreater(r["mean_tpot_ms"], 0)
        self.assertAlmostEqual(r["request_throughput"] * r["duration"], 8, places=6)
        self.assertLessEqual(r["max_concurrent_requests"], 4)
        delta = r["server_metrics_delta"]
        self.assertEqual(delta.get("vllm:generation_tokens_total"), 64.0, delta)
        self.assertEqual(delta.get("vllm:prompt_tokens_total"), 128.0, delta)

if __name__ == "__main__":
    unittest.main()

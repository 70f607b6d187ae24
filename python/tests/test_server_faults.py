"""A fault in one request's logits fails that request alone (docs/serving.md §5.4, issue 20 item 3).

`dayzero serve --fault-nan-logits-seed 7` puts one NaN into the logits row of every request sampled
with "seed": 7. Six requests run at once on the tiny DeepSeek-V3.2: two with seed 7 (one streaming,
one not) and four without. The faulty ones end with a 500 / an error event naming the non-finite
logits; the other four complete every token, each equal to the same request run alone afterwards
(temperature 0.8 with their own seeds: the sampler's draws depend only on the seed); the server then
still serves, answers /health with 200 and holds no request or block.
"""
import json
import os
import tempfile
import threading
import unittest

from cli_support import skip_unless_built
from dayzero_ref import make_tiny
from server_support import ServerProcess, metric, sse_events

FAULTY_SEED = 7
FLAGS = ("--max-model-len", 256, "--block-size", 16, "--num-blocks", 129, "--max-num-seqs", 8,
         "--fault-nan-logits-seed", FAULTY_SEED)


class FaultContainment(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        model = os.path.join(cls.tmp.name, "deepseek_v32-tiny")
        make_tiny.make_tiny("deepseek_v32", model, seed=0)
        cls.server = ServerProcess(model, *FLAGS)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        cls.tmp.cleanup()
        assert code == 0, f"dayzero serve exited with {code} on SIGTERM"

    def body(self, seed, stream=False):
        return {"model": "deepseek_v32-tiny", "prompt": f"request with seed {seed}",
                "max_tokens": 12, "ignore_eos": True, "temperature": 0.8, "seed": seed,
                "stream": stream}

    def post(self, seed, stream=False):
        status, _, data = self.server.request("POST", "/v1/completions", self.body(seed, stream))
        return status, data

    def test_a_nan_fails_its_request_and_no_other(self):
        seeds = [11, FAULTY_SEED, 12, FAULTY_SEED, 13, 14]
        streams = [False, False, True, True, False, True]
        results = [None] * len(seeds)

        def run(i):
            results[i] = self.post(seeds[i], streams[i])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(seeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        texts = {}
        for i, (seed, stream) in enumerate(zip(seeds, streams)):
            status, data = results[i]
            if seed == FAULTY_SEED and not stream:
                self.assertEqual(status, 500, data)
                self.assertIn(b"logits for output token 0 of this request are not finite (1 NaN",
                              data)
                continue
            self.assertEqual(status, 200, data)
            if stream:
                events = sse_events(data)
                self.assertEqual(events[-1], "[DONE]")
                errors = [e for e in events[:-1] if "error" in e]
                if seed == FAULTY_SEED:
                    self.assertEqual(len(errors), 1, events)
                    self.assertIn("are not finite", errors[0]["error"]["message"])
                    continue
                self.assertEqual(errors, [])
                text = "".join(e["choices"][0]["text"] for e in events[:-1] if e.get("choices"))
            else:
                choice = json.loads(data)["choices"][0]
                self.assertEqual(choice["finish_reason"], "length")
                text = choice["text"]
            texts[seed] = text
        self.assertEqual(sorted(texts), [11, 12, 13, 14])
        # Each survivor alone gives the same text.
        for seed, text in texts.items():
            status, data = self.post(seed)
            self.assertEqual(status, 200, data)
            self.assertEqual(json.loads(data)["choices"][0]["text"], text, f"seed {seed}")
        status, _, _ = self.server.request("GET", "/health")
        self.assertEqual(status, 200)
        after = self.server.metrics()
        self.assertEqual(metric(after, "vllm:num_requests_running"), 0)
        self.assertEqual(metric(after, "vllm:kv_cache_usage_perc"), 0)


if __name__ == "__main__":
    unittest.main()

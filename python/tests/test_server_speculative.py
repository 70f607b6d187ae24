"""`dayzero serve --speculative-config` (docs/serving.md §4): n-gram speculative decoding behind the
OpenAI API on the demo model, in one worker process and in a `--tp 2` worker group.

1. Completions with speculation give exactly max_tokens tokens, streamed and not, and the same
   text as the server without it for a greedy request whose margins are wide (the list prompt;
   the engine tests compare logits and near-ties, test_engine_cli.py).
2. /metrics carries vLLM's spec-decode counters: drafts, draft tokens, accepted tokens and
   accepted per position, consistent with each other and non-zero after a repetitive prompt.
3. A bad --speculative-config stops the server at start with the key named, exit code 1.
"""

import json
import os
import subprocess
import unittest

from cli_support import DAYZERO, skip_unless_built
from server_support import MPI_ENV, MPIRUN, ServerProcess

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                   "prompt_lookup_max": 3})
LIST_PROMPT = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,"
MAX_TOKENS = 48


def completion(server, stream):
    body = {"model": "demo", "prompt": LIST_PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "repetition_penalty": 1, "stream": stream}
    if not stream:
        status, _, data = server.post_json("/v1/completions", body)
        assert status == 200, data
        return data["choices"][0]["text"], data["usage"]["completion_tokens"]
    status, _, raw = server.request("POST", "/v1/completions",
                                    dict(body, stream_options={"include_usage": True}))
    assert status == 200, raw
    text, tokens = "", None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            text += choice["text"]
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    return text, tokens


class SpeculativeServerBase:
    plan_flags = ()
    env = None

    @classmethod
    def setUpClass(cls):
        skip_unless_built()

    def test_speculation_behind_the_api(self):
        plain = ServerProcess(None, *self.plan_flags, env=self.env)
        try:
            expected, _ = completion(plain, stream=False)
        finally:
            self.assertEqual(plain.stop(), 0)
        server = ServerProcess(None, *self.plan_flags, "--speculative-config", SPEC, env=self.env)
        try:
            for stream in (False, True):
                text, tokens = completion(server, stream)
                self.assertEqual(tokens, MAX_TOKENS)
                self.assertEqual(text, expected, f"stream={stream}")
            metrics = server.metrics()
            series = {name.split("{")[0]: value for name, value in metrics.items()}
            drafts = series["vllm:spec_decode_num_drafts_total"]
            draft_tokens = series["vllm:spec_decode_num_draft_tokens_total"]
            accepted = series["vllm:spec_decode_num_accepted_tokens_total"]
            per_position = [value for name, value in sorted(metrics.items())
                            if name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos")]
            print(f"\nspeculative server: {drafts:.0f} drafts, {draft_tokens:.0f} draft tokens, "
                  f"{accepted:.0f} accepted {per_position}")
            self.assertGreater(accepted, 0)
            self.assertLessEqual(accepted, draft_tokens)
            self.assertLessEqual(draft_tokens, 3 * drafts)
            self.assertEqual(len(per_position), 3)
            self.assertEqual(sum(per_position), accepted)
            self.assertGreaterEqual(per_position[0], per_position[1])
            self.assertIn("speculative decoding: ngram", server.log_text())
        finally:
            self.assertEqual(server.stop(), 0)


class SpeculativeServerOneProcess(SpeculativeServerBase, unittest.TestCase):
    def test_a_bad_config_is_refused_at_start(self):
        proc = subprocess.run([DAYZERO, "serve", "--port", "0", "--speculative-config",
                               '{"method": "ngram", "num_speculative_tokens": 2, "k": 1}'],
                              capture_output=True, text=True, timeout=60, check=False)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn('unknown key "k"', proc.stderr)


class SpeculativeServerTwoRanks(SpeculativeServerBase, unittest.TestCase):
    plan_flags = ("--tp", 2, "--mpirun-args", " ".join(MPIRUN[1:]))
    env = dict(os.environ, **MPI_ENV)


if __name__ == "__main__":
    unittest.main()

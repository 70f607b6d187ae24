"""n > 1 choices under tensor, expert and context parallelism against one process (docs/parallel.md §7).

A request with n = 3 computes its prompt once; the other choices fork from it: the prompt's full
blocks are shared, its partial last block and the recurrent state are copied. Under a plan those
copies are cache edits rank 0 makes between steps and every other rank must repeat. The demo model
(KDA and MLA layers) is served by one process, by `mpirun -np 2 dayzero serve --tp 2`, by
`mpirun -np 4 dayzero serve --tp 2 --ep 2` and by `mpirun -np 2 dayzero serve --cp 2` (each rank
stores every other block, so a copy may go from one rank's block to the other's: §9.4); a greedy
completion with n = 3 must give, for every choice, the tokens and top-5 logprobs of one process.

Tolerance (docs/models.md §8.1): TP changes only the order of FP32 sums, so the logprobs of a token
agree to 2e-2 nats (measured: below 5e-3); the greedy tokens are compared up to the first position
whose top-2 margin in the one-process run is below 0.1 nats (a near-tie may go either way). With the
followers' copies left out, choices 1 and 2 attend to zeros for the last prompt block and miss both.
"""

import json
import os
import tempfile
import unittest

from cli_support import DAYZERO, SOURCE_DIR, skip_unless_built
from serve_process import ServeProcess
from server_support import MPIRUN, rank0_pid

DEMO = os.path.join(SOURCE_DIR, "models", "demo")
# A prompt of 33 tokens leaves a partial last block under --block-size 16.
PROMPT = ("The old lighthouse keeper climbed the stairs every evening, and the ships that passed "
          "far out at sea never knew his name, but they")
REQUEST = {"model": "demo", "prompt": PROMPT, "max_tokens": 8, "n": 3, "temperature": 0,
           "logprobs": 5}
FLAGS = ["--model", DEMO, "--port", "0", "--threads", "1", "--max-model-len", "256",
         "--num-blocks", "64"]


def complete(proc):
    import http.client  # pylint: disable=import-outside-toplevel
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(REQUEST),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 200, body
        return body
    finally:
        conn.close()


def serve(argv, env=None):
    log_fd, log_path = tempfile.mkstemp(prefix="dz-fork-", suffix=".log")
    os.close(log_fd)
    return ServeProcess(argv, log_path, ready_timeout=60.0, env=env)


def serve_mpirun(ranks, flags, plan):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    return serve([*MPIRUN, "-np", str(ranks), DAYZERO, "serve", *flags, *plan],
                 env=env)


class ForkUnderParallelism(unittest.TestCase):
    def check_against_one_process(self, ranks, plan, block_size):
        skip_unless_built()
        flags = [*FLAGS, "--block-size", str(block_size)]
        one = serve([DAYZERO, "serve", *flags])
        try:
            want = complete(one)
        finally:
            self.assertEqual(one.stop(), 0)
        many = serve_mpirun(ranks, flags, plan)
        try:
            got = complete(many)
        finally:
            if many.proc.poll() is None:
                os.kill(rank0_pid(many.proc.pid), 15)
                many.proc.wait(timeout=20)
            log = many.log_text()
            many.stop()
        self.assertIn(f"rank {ranks - 1} of {ranks}", log)
        self.assertNotEqual(want["usage"]["prompt_tokens"] % block_size, 0, "no partial block")
        worst = 0.0
        for w, g in zip(want["choices"], got["choices"], strict=True):
            wl, gl = w["logprobs"], g["logprobs"]
            for i, top in enumerate(wl["top_logprobs"]):
                ranked = sorted(top.values(), reverse=True)
                self.assertEqual(gl["tokens"][i], wl["tokens"][i], f"choice {w['index']} token {i}")
                for token, logprob in top.items():
                    if token in gl["top_logprobs"][i]:
                        worst = max(worst, abs(gl["top_logprobs"][i][token] - logprob))
                        self.assertAlmostEqual(gl["top_logprobs"][i][token], logprob, delta=2e-2,
                                               msg=f"choice {w['index']} position {i} {token!r}")
                if ranked[0] - ranked[1] < 0.1:
                    break  # a near-tie: the continuations may differ from here on
        print(f"n = 3 under {' '.join(plan)}: every choice's tokens as one process's, logprobs "
              f"within {worst:.1e}")

    def test_n_choices_under_tensor_parallelism(self):
        self.check_against_one_process(2, ["--tp", "2"], 16)

    def test_n_choices_under_expert_parallelism(self):
        # 64-token blocks: the whole prompt is one partial block, so each fork's copy of it is its
        # first block, and the fork must stay in the data-parallel group that wrote the original.
        self.check_against_one_process(4, ["--tp", "2", "--ep", "2"], 64)

    def test_n_choices_under_context_parallelism(self):
        self.check_against_one_process(2, ["--cp", "2"], 16)


if __name__ == "__main__":
    unittest.main()

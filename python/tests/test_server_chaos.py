"""A server that survives a dead worker (docs/serving.md §5.10, issue 20).

`dayzero serve` on the demo model is a frontend and a worker group. 50 streaming completions run at
once (half greedy, half sampled with their own seeds); the worker is killed with SIGKILL three
times at random moments (each once every unfinished stream has had a token since the last recovery,
then after a random pause). Every stream must complete with [DONE], no error and exactly max_tokens
tokens (the frontend re-submits prompt + generated tokens and forwards only what follows), and be
compared with the same request on an undisturbed server. Each greedy stream's text must equal the
undisturbed one's, except at a near-tie (top-two log-probabilities of the undisturbed run within
0.05 at the first differing token: the recomputed prefix gives logits equal within rounding, not
bitwise) or, in at most two of the 25, where rounding flipped an MoE routing choice inside the
model (a lost or repeated token would part all 25). Sampling (inverse CDF in token-id order) turns
such rounding into a different draw now and then, so a sampled stream must equal the undisturbed
one up to where it first moved (all but two of 25) and be whole after. Streams stay under 64 tokens
of context, below the demo's indexer top-k, so no sparse selection flips inside the model. /metrics
counts three restarts and the migrated requests; /health is 503 during a recovery and 200 after.
The same again with a 2-rank group (`--tp 2`: mpirun of two workers, a random rank killed).
Recovery times (kill → failure noticed → group ready → first token) are printed, from the
frontend's log.

Then: a request that crashes its worker every time (--fault-crash-seed) fails with 500 after
--poison-limit failures and a turn alone on probation, while the others complete; and SIGTERM
drains (a running stream completes, a new request gets 503, the exit code is 0); a stopped (hung)
worker is restarted once its heartbeats stop; a worker that
cannot load fails the server's start with the load error; and a crash loop (the checkpoint gone,
then the worker killed) ends the server with exit code 1 and the last error, which the running
stream gets too.
"""
import datetime
import json
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
import unittest

from cli_support import skip_unless_built
from serve_process import ServeError
from server_support import MPI_ENV, MPIRUN, ServerProcess, metric

DEMO_MODEL = os.path.join(os.environ.get("DZ_SOURCE_DIR", "../.."), "models", "demo")

NUM_STREAMS = 50
NUM_KILLS = 3
MAX_TOKENS = 40
TIE_NATS = 0.05
MAX_GREEDY_FLIPS = 2
FLAGS = ("--max-num-seqs", 64, "--max-model-len", 4096)
MPI_FLAGS = ("--tp", 2, "--mpirun-args", " ".join(MPIRUN[1:]))


def children(pid):
    """Children of every thread of pid (a thread other than the main one may have spawned)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return found


def worker_pids(server_pid):
    """The worker processes (one, or mpirun's ranks) under the frontend."""
    pids = []
    for child in children(server_pid):
        with open(f"/proc/{child}/cmdline", "rb") as f:
            cmd = f.read()
        if b"--worker-socket" in cmd and not cmd.startswith(b"mpirun"):
            pids.append(child)
        else:
            pids.extend(p for p in children(child))
    return pids


def log_time(line):
    """Seconds since midnight of a log line's [HH:MM:SS.mmm] stamp."""
    h, m, s = line[1:13].split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def wall_of_day(t):
    d = datetime.datetime.fromtimestamp(t)
    return d.hour * 3600 + d.minute * 60 + d.second + d.microsecond / 1e6


def prompt(i):
    return f"Story {i}: once upon a time, in a town by the sea number {i * 7 % 13},"


def body(i, stream=True, max_tokens=MAX_TOKENS):
    b = {"model": "demo", "prompt": prompt(i), "max_tokens": max_tokens, "ignore_eos": True,
         "stream": stream, "logprobs": 2}
    if i % 2:
        b.update(temperature=0.8, seed=1000 + i)
    else:
        b.update(temperature=0.0)
    return b


class StreamingReader:
    """The same, reading the SSE body as it arrives, so the test sees progress during the run."""

    def __init__(self, server, i, max_tokens=MAX_TOKENS):
        self.i, self.tokens, self.tops, self.errors, self.done = i, [], [], [], False
        self.count, self.max_tokens = 0, max_tokens
        self.thread = threading.Thread(target=self.run, args=(server,), daemon=True)
        self.thread.start()

    def run(self, server):
        try:
            sock = server.open_stream("/v1/completions", body(self.i, max_tokens=self.max_tokens),
                                      timeout=240)
            buf = b""
            with sock:
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n\n" in buf:
                        block, buf = buf.split(b"\n\n", 1)
                        self.event(block)
                    if self.done:
                        break
        except OSError as e:
            self.errors.append(repr(e))

    def wait_for_tokens(self, timeout=60):
        """Returns once the stream has a token (fails after `timeout` s)."""
        deadline = time.monotonic() + timeout
        while self.count == 0:
            if time.monotonic() > deadline or self.errors:
                raise AssertionError(f"stream {self.i} has no token: {self.errors}")
            time.sleep(0.01)

    def event(self, block):
        for line in block.decode(errors="replace").split("\n"):
            if line.startswith("HTTP/1.1") and " 200 " not in line:
                self.errors.append(line)
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                self.done = True
                return
            event = json.loads(payload)
            if "error" in event:
                self.errors.append(event["error"]["message"])
            elif event.get("choices"):
                lp = event["choices"][0].get("logprobs") or {}
                self.tokens.extend(lp.get("tokens") or [])
                self.tops.extend(lp.get("top_logprobs") or [])
                self.count = len(self.tokens)


def first_difference(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


class ChaosBase:
    plan_flags = ()
    env = None

    def start(self, *flags):
        return ServerProcess(None, *FLAGS, *self.plan_flags, *flags, env=self.env,
                             ready_timeout=120)

    def test_streams_survive_three_kills(self):
        skip_unless_built()
        seed = random.randrange(1 << 30)
        print(f"\nseed {seed}")
        rng = random.Random(seed)
        # The undisturbed texts, from a server that is not disturbed.
        calm = self.start()
        try:
            calm_runs = [StreamingReader(calm, i) for i in range(NUM_STREAMS)]
            for r in calm_runs:
                r.thread.join(timeout=240)
        finally:
            self.assertEqual(calm.stop(), 0)
        for r in calm_runs:
            self.assertEqual(r.errors, [], f"undisturbed stream {r.i}")
            self.assertTrue(r.done and len(r.tokens) == MAX_TOKENS, f"undisturbed stream {r.i}")

        server = self.start()
        try:
            t0 = time.monotonic()
            runs = [StreamingReader(server, i) for i in range(NUM_STREAMS)]
            kills, saw_503s = [], []
            for k in range(NUM_KILLS):
                base = [r.count for r in runs]
                deadline = time.monotonic() + 60
                while any(not r.done and r.count <= b for r, b in zip(runs, base)):
                    self.assertLess(time.monotonic(), deadline, "no progress after a recovery")
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.05))
                pids = worker_pids(server.proc.pid)
                self.assertTrue(pids, "no worker process found")
                victim = rng.choice(pids)
                killed_at = time.time()
                os.kill(victim, signal.SIGKILL)
                kills.append(killed_at)
                counts = [r.count for r in runs]
                if k == 0:
                    first_kill_counts = counts
                # /health is 503 until the new group is ready. Tokens still in flight may arrive
                # after the kill, so only the restart counter says the recovery is over when no
                # poll happened to fall inside it.
                saw_503 = False
                while True:
                    status, _ = server.get("/health", timeout=5)
                    if status == 503:
                        saw_503 = True
                    elif status == 200 and saw_503:
                        break
                    elif status == 200 and time.time() - killed_at > 0.3 and metric(
                            server.metrics(), "vllm:worker_restarts_total") >= k + 1:
                        break
                    self.assertLess(time.time() - killed_at, 60, "no recovery within 60 s")
                    time.sleep(0.005)
                saw_503s.append(saw_503)
                print(f"kill {k + 1}: pid {victim} at {time.monotonic() - t0:.2f} s; "
                      f"health 503 seen: {saw_503}")
            for r in runs:
                r.thread.join(timeout=120)
            elapsed = time.monotonic() - t0
            metrics = server.metrics()
            log = server.log_text()
        finally:
            if os.environ.get("DZ_CHAOS_LOG"):  # debugging: the frontend's whole log
                print(server.log_text())
            code = server.stop()
        self.assertEqual(code, 0)
        print(f"{NUM_STREAMS} streams, {NUM_KILLS} kills: {elapsed:.1f} s")

        parted = {"greedy": [], "sampled": []}
        for r, c in zip(runs, calm_runs):
            self.assertEqual(r.errors, [], f"stream {r.i}")
            self.assertTrue(r.done, f"stream {r.i} did not end with [DONE]")
            self.assertEqual(len(r.tokens), MAX_TOKENS, f"stream {r.i}: a token lost or repeated")
            k = first_difference(r.tokens, c.tokens)
            if k is None:
                continue
            top = sorted(c.tops[k].values(), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else float("inf")
            if r.i % 2 == 0:
                parted["greedy"].append((r.i, k, round(gap, 3)))
            else:
                parted["sampled"].append((r.i, k, k >= first_kill_counts[r.i]))
        print(f"streams that part from the undisturbed run (stream, token[, top-2 gap]): {parted}")
        # Rounding can also flip a choice inside the model (an MoE routing near-tie) and part a
        # greedy stream where its output had no near-tie: allowed twice in 25. A migration that
        # lost or repeated a token would part every greedy stream it moved (all 25, each time).
        # A sampled stream parts before its first move only by the same batch rounding.
        early = [p for p in parted["sampled"] if not p[2]]
        self.assertLessEqual(len(early), MAX_GREEDY_FLIPS,
                             f"sampled streams part before they first moved: {early}")
        no_tie = [p for p in parted["greedy"] if p[2] >= TIE_NATS]
        self.assertLessEqual(len(no_tie), MAX_GREEDY_FLIPS, f"greedy streams part without a "
                             f"near-tie in their output: {no_tie}")
        self.assertTrue(any(saw_503s), "/health never answered 503 during a recovery")
        self.assertEqual(metric(metrics, "vllm:worker_restarts_total"), NUM_KILLS)
        self.assertGreater(metric(metrics, "vllm:requests_migrated_total"), 0)

        # Recovery times from the frontend's log.
        failed = [log_time(l) for l in log.splitlines() if re.search(r"worker group \d+ failed", l)]
        ready = [(log_time(l), l) for l in log.splitlines() if " ready: " in l]
        first = [(log_time(l), l) for l in log.splitlines() if "first token" in l]
        self.assertEqual(len(failed), NUM_KILLS, log[-3000:])
        for k in range(NUM_KILLS):
            kill = wall_of_day(kills[k])
            m = re.search(r"restart and load ([\d.]+) s, of which the model load ([\d.]+) s",
                          ready[k][1])
            ft = re.search(r"first token ([\d.]+) s after ready", first[k][1]) if k < len(first) \
                else None
            print(f"recovery {k + 1}: detection {failed[k] - kill:.3f} s, then ready after "
                  f"{ready[k][0] - failed[k]:.3f} s (restart+load {m.group(1)} s, model load "
                  f"{m.group(2)} s), first token {ft.group(1) if ft else '?'} s after ready; "
                  f"kill to first token {(first[k][0] if k < len(first) else ready[k][0]) - kill:.3f} s")

    def test_a_request_that_kills_its_worker_fails_alone(self):
        skip_unless_built()
        server = self.start("--fault-crash-seed", 77, "--poison-limit", 2, "--max-restarts", 4)
        try:
            good = [StreamingReader(server, i) for i in range(6)]
            bad = {"model": "demo", "prompt": "poison", "max_tokens": 8, "temperature": 0.5,
                   "seed": 77}
            status, _, data = server.request("POST", "/v1/completions", bad, timeout=120)
            for r in good:
                r.thread.join(timeout=120)
            metrics = server.metrics()
            health = server.get("/health", timeout=5)[0]
        finally:
            code = server.stop()
        self.assertEqual(status, 500, data)
        self.assertIn(b"failed 3 times in a row while this request ran", data)
        for r in good:
            self.assertEqual(r.errors, [], f"stream {r.i}")
            self.assertTrue(r.done and len(r.tokens) == MAX_TOKENS, f"stream {r.i}")
        # Two failures with all seven running, then each suspect alone until the poison's turn.
        self.assertEqual(metric(metrics, "vllm:worker_restarts_total"), 3)
        self.assertEqual(health, 200)
        self.assertEqual(code, 0)

    def test_sigterm_drains(self):
        skip_unless_built()
        server = self.start("--drain-timeout", 60)
        stopped = None
        try:
            running = StreamingReader(server, 3, max_tokens=3000)
            running.wait_for_tokens()
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            status, _, data = server.request("POST", "/v1/completions", body(4, stream=False))
            health = server.get("/health", timeout=5)[0]
            running.thread.join(timeout=120)
            stopped = server.proc.wait(timeout=60)
        finally:
            code = server.stop()
        self.assertEqual(status, 503, data)
        self.assertIn(b"shutting down", data)
        self.assertEqual(health, 503)
        self.assertEqual(running.errors, [])
        self.assertTrue(running.done and len(running.tokens) == 3000)
        self.assertEqual(stopped, 0)
        self.assertEqual(code, 0)


class ChaosOneProcess(ChaosBase, unittest.TestCase):
    def test_a_crash_loop_stops_the_server_with_the_last_error(self):
        # The checkpoint disappears while the server runs, then the worker dies: the restart
        # fails at load, and with --max-restarts 1 the second failure ends the server.
        skip_unless_built()
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "demo")
            shutil.copytree(DEMO_MODEL, model)
            server = ServerProcess(model, *FLAGS, "--max-restarts", 1, "--restart-window", 600)
            try:
                running = StreamingReader(server, 2, max_tokens=3000)
                running.wait_for_tokens()
                os.rename(os.path.join(model, "model.safetensors"), os.path.join(tmp, "moved"))
                os.kill(worker_pids(server.proc.pid)[0], signal.SIGKILL)
                running.thread.join(timeout=60)
                code = server.proc.wait(timeout=60)
                log = server.log_text()
            finally:
                server.stop()
        self.assertEqual(code, 1, log[-3000:])
        self.assertEqual(len(running.errors), 1, running.errors)
        self.assertIn("failed 2 times within 600 s (--max-restarts 1)", running.errors[0])
        self.assertIn("model.safetensors", running.errors[0])
        self.assertIn("the server stops", log)

    def test_a_hung_worker_is_restarted(self):
        # SIGSTOP: the worker neither dies nor answers; its heartbeats stop.
        skip_unless_built()
        server = self.start("--heartbeat-timeout", 1)
        try:
            running = StreamingReader(server, 6, max_tokens=400)
            running.wait_for_tokens()
            os.kill(worker_pids(server.proc.pid)[0], signal.SIGSTOP)
            running.thread.join(timeout=60)
            metrics = server.metrics()
            log = server.log_text()
        finally:
            code = server.stop()
        self.assertEqual(running.errors, [])
        self.assertTrue(running.done and len(running.tokens) == 400)
        self.assertEqual(metric(metrics, "vllm:worker_restarts_total"), 1)
        self.assertRegex(log, r"worker group 1 failed: no heartbeat from the worker for 1\.\d s")
        self.assertEqual(code, 0)

    def test_a_worker_that_cannot_load_is_reported(self):
        skip_unless_built()
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "demo")
            shutil.copytree(DEMO_MODEL, model)
            with open(os.path.join(model, "model.safetensors"), "r+b") as f:
                f.truncate(1000)
            with self.assertRaises(ServeError) as caught:
                ServerProcess(model, *FLAGS, ready_timeout=60)
        message = str(caught.exception)
        self.assertIn("the worker group", message)
        self.assertIn("model.safetensors", message)


class ChaosTwoRanks(ChaosBase, unittest.TestCase):
    plan_flags = MPI_FLAGS
    env = dict(os.environ, **MPI_ENV)

    # The poison and drain behaviour do not depend on the group's size.
    test_a_request_that_kills_its_worker_fails_alone = None
    test_sigterm_drains = None


if __name__ == "__main__":
    unittest.main()

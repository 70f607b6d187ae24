#!/usr/bin/python3
"""A bounded soak of `dayzero serve` (issue 15), meant for a sanitizer build of the binary.

Many concurrent clients against a server with a tiny KV cache (so requests are preempted) and a
short queue (so some are refused): /v1/completions streamed and whole, some clients hanging up
mid-stream or before the answer, 503s retried after their Retry-After (capped, so the run stays
bounded). Every request must end in a 200 with a well-formed body or a 503 server_overloaded
with Retry-After in [1, 60]: never another status, never a hang (each socket has a timeout),
never a dead server. At the end /health answers 200, the engine drained, preemptions happened,
SIGTERM stops the server with exit code 0, and its log holds no sanitizer report.

    soak_server.py path/to/dayzero [--model DIR] [--clients 12] [--requests 200] ...

Standard library only; loopback only (127.0.0.1, a port the server picks). Exit code 0 when every
check passed; the last line of stdout is a JSON summary.
"""

import argparse
import ctypes
import http.client
import json
import os
import random
import re
import signal
import socket
import sys
import tempfile
import threading
import time

from serve_process import ServeError, ServeProcess

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What ASan, LSan, UBSan and TSan print when they find something.
SANITIZER_REPORT = re.compile(
    r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|WARNING: ThreadSanitizer|"
    r"runtime error: |SUMMARY: \w+Sanitizer")
WORDS = ("the city river morning history people water light house story small old new great "
         "long road field king music garden winter north school market stone").split()


class Failure(Exception):
    pass


def die_with_parent():
    """The server gets SIGKILL when this script dies, however it dies (a ctest timeout)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_server(dayzero, flags, log_path, ready_timeout):
    # Spinning OpenMP workers on a machine whose cores are busy (CI running builds beside it) made
    # the engine 5x slower; sleeping ones cost nothing here.
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        return ServeProcess([dayzero, "serve", "--host", "127.0.0.1", "--port", "0", *flags],
                            log_path, ready_timeout, env=env, preexec_fn=die_with_parent)
    except ServeError as e:
        raise Failure(str(e)) from e


def metric(values, name, **labels):
    total = 0.0
    for key, value in values.items():
        base = key.split("{", 1)[0]
        if base.endswith(":" + name) and all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


class Soak:
    def __init__(self, server, args):
        self.server = server
        self.args = args
        self.lock = threading.Lock()
        self.next_index = 0
        self.counts = {"ok_whole": 0, "ok_stream": 0, "aborted_stream": 0, "aborted_whole": 0,
                       "overloaded_503": 0, "gave_up_503": 0}
        self.failures = []
        self.deadline = time.monotonic() + args.seconds

    def take_index(self):
        with self.lock:
            if self.next_index >= self.args.requests or time.monotonic() > self.deadline:
                return None
            self.next_index += 1
            return self.next_index - 1

    def count(self, key):
        with self.lock:
            self.counts[key] += 1

    def fail(self, index, message):
        with self.lock:
            self.failures.append(f"request {index}: {message}")

    def client(self, seed):
        rng = random.Random(seed)
        while not self.failures:
            index = self.take_index()
            if index is None:
                return
            try:
                self.one_request(index, rng)
            except Failure as e:
                self.fail(index, str(e))
            except OSError as e:  # refused, reset, timed out: the server hung or died
                self.fail(index, f"{type(e).__name__}: {e}")

    def one_request(self, index, rng):
        kind = rng.choices(["whole", "stream", "stream_abort", "whole_abort"],
                           weights=[40, 35, 15, 10])[0]
        max_tokens = rng.randint(4, self.args.max_tokens)
        body = {"model": self.args.model_name,
                "prompt": " ".join(rng.choice(WORDS)
                                   for _ in range(rng.randint(1, self.args.max_prompt_words))),
                "max_tokens": max_tokens, "stream": kind.startswith("stream")}
        if rng.random() < 0.5:
            body["temperature"] = 0
        else:
            body["seed"] = index
        if rng.random() < 0.3:
            body["ignore_eos"] = True
        for _ in range(self.args.max_attempts):
            if kind.endswith("_abort"):
                outcome = self.send_and_hang_up(body, kind, rng)
            else:
                outcome = self.send(body, max_tokens)
            if outcome is None:
                self.count({"whole": "ok_whole", "stream": "ok_stream",
                            "stream_abort": "aborted_stream", "whole_abort": "aborted_whole"}[kind])
                return
            self.count("overloaded_503")
            if time.monotonic() > self.deadline:
                break
            # Honour Retry-After, capped so the soak stays bounded.
            time.sleep(min(outcome, self.args.retry_cap) * rng.uniform(0.5, 1.0))
        self.count("gave_up_503")

    @staticmethod
    def check_overloaded(retry_after, payload):
        if retry_after is None or not retry_after.strip().isdigit():
            raise Failure(f"503 without a valid Retry-After ({retry_after!r}): {payload[:300]!r}")
        seconds = int(retry_after)
        if not 1 <= seconds <= 60:
            raise Failure(f"Retry-After {seconds} outside [1, 60]")
        try:
            error = json.loads(payload)["error"]
        except (ValueError, KeyError, TypeError):
            raise Failure(f"503 with a malformed body: {payload[:300]!r}")
        if error.get("type") != "server_overloaded":
            raise Failure(f"503 of type {error.get('type')!r}: {payload[:300]!r}")
        return seconds

    def send(self, body, max_tokens):
        """None on a good 200; the Retry-After seconds on a good 503; Failure otherwise."""
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port,
                                          timeout=self.args.request_timeout)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
            if resp.status == 503:
                return self.check_overloaded(resp.getheader("Retry-After"), payload)
            if resp.status != 200:
                raise Failure(f"HTTP {resp.status}: {payload[:500]!r}")
            if body["stream"]:
                check_stream(payload, max_tokens)
            else:
                check_whole(payload, max_tokens)
            return None
        finally:
            conn.close()

    def send_and_hang_up(self, body, kind, rng):
        """Sends the request on a raw socket and closes it early: after the first event of a
        stream, or after a short wait for a whole answer. The Retry-After of a 503, else None."""
        data = json.dumps(body).encode()
        sock = socket.create_connection(("127.0.0.1", self.server.port),
                                        timeout=self.args.request_timeout)
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(data) + data)
            if kind == "whole_abort":
                sock.settimeout(rng.uniform(0.05, 0.5))
            raw = b""
            try:
                while b"\r\n\r\n" not in raw or (kind == "stream_abort" and b"data: " not in raw):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    raw += chunk
            except socket.timeout:
                if kind != "whole_abort":
                    raise
                return None  # hung up before the answer
            sock.settimeout(self.args.request_timeout)
            head, _, rest = raw.partition(b"\r\n\r\n")
            status_line = head.split(b"\r\n", 1)[0]
            if status_line.startswith(b"HTTP/1.1 503"):
                retry = None
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"retry-after":
                        retry = value.decode().strip()
                while len(rest) < content_length(head):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    rest += chunk
                return self.check_overloaded(retry, rest)
            if not status_line.startswith(b"HTTP/1.1 200"):
                raise Failure(f"{status_line!r} on a request that hung up")
            return None
        finally:
            sock.close()


def content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def check_whole(payload, max_tokens):
    try:
        doc = json.loads(payload)
        choice = doc["choices"][0]
        usage = doc["usage"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise Failure(f"malformed completion: {payload[:500]!r}")
    if doc.get("object") != "text_completion" or len(doc["choices"]) != 1:
        raise Failure(f"unexpected completion: {payload[:500]!r}")
    if not isinstance(choice.get("text"), str) or choice.get("finish_reason") not in ("length",
                                                                                       "stop"):
        raise Failure(f"bad choice: {choice!r}")
    if not 0 <= usage.get("completion_tokens", -1) <= max_tokens:
        raise Failure(f"bad usage {usage!r} for max_tokens {max_tokens}")


def check_stream(payload, max_tokens):
    events = []
    for block in payload.decode("utf-8").split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    if not events or events[-1] != "[DONE]":
        raise Failure(f"stream does not end with [DONE]: {payload[-300:]!r}")
    reasons = []
    for event in events[:-1]:
        try:
            chunk = json.loads(event)
        except ValueError:
            raise Failure(f"malformed event {event[:300]!r}")
        if "error" in chunk:
            raise Failure(f"error event {event[:500]!r}")
        for choice in chunk.get("choices", []):
            if not isinstance(choice.get("text"), str):
                raise Failure(f"bad chunk {event[:300]!r}")
            if choice.get("finish_reason") is not None:
                reasons.append(choice["finish_reason"])
    if len(reasons) != 1 or reasons[0] not in ("length", "stop"):
        raise Failure(f"finish reasons {reasons!r} in a stream")
    if len(events) - 1 > max_tokens + 1:
        raise Failure(f"{len(events) - 1} chunks for max_tokens {max_tokens}")


def wait_drained(server, timeout):
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if metric(m, "num_requests_running") == 0 and metric(m, "num_requests_waiting") == 0:
            return m
        if time.monotonic() > deadline:
            raise Failure(f"the engine did not drain: {metric(m, 'num_requests_running')} running, "
                          f"{metric(m, 'num_requests_waiting')} waiting")
        time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dayzero", help="the dayzero binary (e.g. build-asan/src/dayzero/cli/dayzero)")
    parser.add_argument("--model", default=os.path.join(SOURCE_DIR, "models", "demo"))
    parser.add_argument("--model-name", default=None, help="default: the model folder's name")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="no new request after this; those in flight still finish")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-prompt-words", type=int, default=40)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-blocks", type=int, default=12)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-queued-requests", type=int, default=4)
    parser.add_argument("--retry-cap", type=float, default=1.0, help="longest wait on a 503, s")
    parser.add_argument("--max-attempts", type=int, default=60)
    parser.add_argument("--request-timeout", type=float, default=60.0)
    parser.add_argument("--min-preemptions", type=int, default=1)
    parser.add_argument("--keep-log", default=None, help="copy the server's log here")
    args = parser.parse_args()
    args.model_name = args.model_name or os.path.basename(os.path.normpath(args.model))

    flags = ["--model", args.model, "--threads", args.threads, "--max-num-seqs", args.max_num_seqs,
             "--max-queued-requests", args.max_queued_requests, "--num-blocks", args.num_blocks,
             "--block-size", args.block_size, "--max-model-len", args.max_model_len,
             "--max-num-batched-tokens", args.max_num_batched_tokens, "--sse-keepalive", 1]
    log_fd, log_path = tempfile.mkstemp(prefix="dz-soak-", suffix=".log")
    os.close(log_fd)
    started = time.monotonic()
    summary = {"binary": args.dayzero, "clients": args.clients}
    failures = []
    server = None
    try:
        server = start_server(args.dayzero, flags, log_path, ready_timeout=120)
        summary["startup_s"] = round(time.monotonic() - started, 1)
        soak = Soak(server, args)
        threads = [threading.Thread(target=soak.client, args=(seed,), daemon=True)
                   for seed in range(args.clients)]
        soak_start = time.monotonic()
        for t in threads:
            t.start()
        # Bounded: no new attempt after the deadline, and each has a socket timeout.
        join_deadline = soak_start + args.seconds + args.request_timeout + 10
        for t in threads:
            t.join(max(0.0, join_deadline - time.monotonic()))
            if t.is_alive():
                failures.append("a client thread never finished (a request hung)")
                break
        summary["soak_s"] = round(time.monotonic() - soak_start, 1)
        summary.update(soak.counts)
        summary["requests_started"] = soak.next_index
        failures += soak.failures
        if server.proc.poll() is not None:
            raise Failure(f"the server died (exit code {server.proc.returncode})")
        m = wait_drained(server, timeout=30)
        summary["preemptions"] = metric(m, "num_preemptions_total")
        summary["rejected_queue_full"] = metric(m, "requests_rejected_total", reason="queue_full")
        summary["cancelled"] = metric(m, "requests_cancelled_total")
        if summary["preemptions"] < args.min_preemptions:
            failures.append(f"only {summary['preemptions']} preemptions: the KV cache is not "
                            "small enough to exercise them")
        status, body = server.get("/health", timeout=10)
        if status != 200:
            failures.append(f"/health answered {status} after the soak: {body[:200]!r}")
    except Failure as e:
        failures.append(str(e))
    finally:
        if server is not None:
            code = server.stop(timeout=60)
            summary["exit_code"] = code
            if code != 0:
                failures.append(f"dayzero serve exited with {code} on SIGTERM")
            log = server.log_text()
            reports = [line for line in log.splitlines() if SANITIZER_REPORT.search(line)]
            if reports:
                failures.append("sanitizer reports in the server log:\n" + "\n".join(reports[:20]))
            if args.keep_log:
                with open(args.keep_log, "w", encoding="utf-8") as f:
                    f.write(log)
            if failures:
                print("---- server log (tail) ----\n" + log[-8000:], file=sys.stderr)
        os.unlink(log_path)
    summary["total_s"] = round(time.monotonic() - started, 1)
    summary["failures"] = len(failures)
    for failure in failures[:30]:
        print("FAIL:", failure, file=sys.stderr)
    print(json.dumps(summary))
    return 1 if failures else 0


if __name__ == "__main__":
    # SIGTERM (a timeout) still stops the server and prints what was found.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    sys.exit(main())

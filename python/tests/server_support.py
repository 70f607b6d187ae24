"""Starting `dayzero serve` on a free loopback port and talking to it with bounded timeouts, for
test_server.py. Nothing here can hang: every wait has a deadline."""

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile

from cli_support import DAYZERO
from serve_process import ServeProcess


# DZ_SERVE_TP=T (and DZ_SERVE_EP=E, DZ_SERVE_CP=C) runs every server of the suite as
# `dayzero serve --tp T --ep E --cp C`, whose frontend starts `mpirun -np T*E*C` workers (one
# thread per rank): the server test suite under tensor, expert and context parallelism
# (docs/parallel.md §7, §9).
SERVE_TP = int(os.environ.get("DZ_SERVE_TP", "1"))
SERVE_EP = int(os.environ.get("DZ_SERVE_EP", "1"))
SERVE_CP = int(os.environ.get("DZ_SERVE_CP", "1"))
SERVE_RANKS = SERVE_TP * SERVE_EP * SERVE_CP
MPIRUN = ("mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


class ServerProcess(ServeProcess):
    """`dayzero serve --model DIR --port 0 --threads 1 ...` with its log in a temporary file."""

    def __init__(self, model_dir, *flags, ready_timeout=60.0, env=None):
        """model_dir None: the default (demo) model."""
        log_fd, log_path = tempfile.mkstemp(prefix="dz-serve-", suffix=".log")
        os.close(log_fd)
        plan = []
        if SERVE_RANKS > 1:
            # The frontend starts the ranks itself (docs/serving.md §5.10).
            plan = ["--tp", str(SERVE_TP), "--ep", str(SERVE_EP), "--cp", str(SERVE_CP),
                    "--mpirun-args", " ".join(MPIRUN[1:])]
            env = dict(env or os.environ, **MPI_ENV)
        model = [] if model_dir is None else ["--model", model_dir]
        super().__init__([DAYZERO, "serve", *model, "--port", "0", "--threads", "1", *plan,
                          *flags], log_path, ready_timeout, env=env)

    def stop(self, timeout=10.0):
        code = super().stop(timeout)
        if code != 0:
            print(f"dayzero serve exited with {code}; its log ends:\n{self.log_text()[-3000:]}")
        os.unlink(self.log_path)
        return code

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=30):
        """(status, headers dict lower-cased, body bytes). `body`: bytes, str or JSON-able."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post_json(self, path, body, headers=None, timeout=30):
        status, hdrs, data = self.request("POST", path, body, headers, timeout)
        return status, hdrs, json.loads(data)

    def open_stream(self, path, body, headers=None, timeout=30):
        """A raw socket with the request sent (to read part of a stream and then hang up)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        data = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"{extra}Content-Length: {len(data)}\r\n\r\n".encode() + data)
        return sock


def rank0_pid(mpirun_pid):
    """The process of rank 0 among mpirun's children (by OMPI_COMM_WORLD_RANK)."""
    with open(f"/proc/{mpirun_pid}/task/{mpirun_pid}/children", encoding="ascii") as f:
        children = [int(pid) for pid in f.read().split()]
    for pid in children:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if b"OMPI_COMM_WORLD_RANK=0\0" in f.read():
                return pid
    raise RuntimeError(f"mpirun {mpirun_pid} has no rank 0 among {children}")


def read_until(sock, marker):
    """What a raw socket sends until `marker` has arrived or the peer closes."""
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def read_head(sock):
    """The status line and headers of a response on a raw socket (b"" if it closed first)."""
    return read_until(sock, b"\r\n\r\n")


def sse_events(raw):
    """The data payloads of an SSE body (comments dropped), JSON-decoded except [DONE]."""
    events = []
    for block in raw.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric(values, name, **labels):
    """The value of series `name` whose labels include `labels` (0 when absent)."""
    for key, value in values.items():
        base = key.split("{", 1)[0]
        if base == name and all(f'{k}="{v}"' in key for k, v in labels.items()):
            return value
    return 0.0

"""One `dayzero serve --port 0 ...` process on loopback, started and waited for: the port comes
from its "listening on" log line, then /health must answer 200. Standard library only (the soak
runs it without the test environment); every wait has a deadline, so nothing here can hang."""

import http.client
import re
import signal
import subprocess
import time


class ServeError(Exception):
    """The server did not start, did not become healthy, or answered what it must not."""


class ServeProcess:
    def __init__(self, argv, log_path, ready_timeout, env=None, preexec_fn=None):
        self.log_path = log_path
        self.log = open(log_path, "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [*map(str, argv)], stdout=subprocess.DEVNULL, stderr=self.log, env=env,
            preexec_fn=preexec_fn)
        self.port = None
        deadline = time.monotonic() + ready_timeout
        while self.port is None:
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log_text())
            if match:
                self.port = int(match.group(1))
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                raise ServeError(f"dayzero serve did not start:\n{self.log_text()[-4000:]}")
            else:
                time.sleep(0.05)
        while self.get("/health", timeout=5)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ServeError(f"dayzero serve never became healthy:\n{self.log_text()[-4000:]}")
            time.sleep(0.1)

    def log_text(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def get(self, path, timeout):
        """(status, body bytes); (0, b"") when the connection fails."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def metrics(self):
        """{series name with labels: value} of GET /metrics."""
        status, data = self.get("/metrics", timeout=10)
        if status != 200:
            raise ServeError(f"/metrics answered {status}")
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self, timeout=10.0):
        """SIGTERM; the exit code, or None when it had to be killed after `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.log.close()
                return None
        self.log.close()
        return self.proc.returncode

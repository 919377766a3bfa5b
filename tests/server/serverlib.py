"""Helpers for the server tests: a `quantspec serve` process and small HTTP utilities.

(Kept out of conftest.py so that test modules import them by a name no other test folder uses.)
"""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_MODELS = ["llama3-tiny", "llama2-tiny", "mistral-tiny", "qwen2-tiny"]


class ServerProcess:
    """A running `quantspec serve`; stderr is collected in the background."""

    def __init__(self, binary, args, env=None):
        self.args = [binary, "serve", "--host", "127.0.0.1", "--port", "0", *map(str, args)]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, text=True, errors="replace")
        self.stderr_lines = []
        self.port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.stderr_lines.append(line)
                m = re.search(r"listening on http://[^ ]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        ready.wait(timeout=60)
        if self.port is None:
            self.proc.kill()
            raise AssertionError("server did not start:\n" + self.stderr)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def stderr(self):
        return "".join(self.stderr_lines)

    def get(self, path, timeout=10):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.status, r.read().decode()

    def metrics(self):
        """Prometheus samples: {'name{labels}': value}."""
        _, text = self.get("/metrics")
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                samples[key] = float(value)
        return samples

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pump.join(timeout=5)
        return self.proc.returncode


def post(url, payload, timeout=60, raw=None, headers=None):
    """POST JSON (or raw bytes); returns (status, parsed JSON or text)."""
    data = raw if raw is not None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        status = e.code
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def wait_until(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()

"""Shared fixtures: the built `seedbar` binary, an isolated model store holding the default
model (SmolLM2-135M-Instruct), random-weight checkpoints written with mlx-lm, and a running
`seedbar serve` on an ephemeral loopback port."""

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "debug" / "seedbar"
CACHE = Path(os.environ.get("SEEDBAR_DEV_CACHE", Path.home() / ".cache" / "seedbar-dev"))
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def default_gguf() -> Path:
    return Path((CACHE / "default-model.path").read_text().strip())


EMBEDDING_MODEL = "all-minilm-l6-v2"


def embedding_model_dir() -> Path:
    """The default embedding model's folder (sentence-transformers), fetched by set-up."""
    return Path((CACHE / "embedding-model.path").read_text().strip())


class Seedbar:
    """Runs the CLI against one store."""

    def __init__(self, home: Path):
        self.home = home

    def env(self, **extra):
        env = dict(os.environ, SEEDBAR_HOME=str(self.home))
        env.update(extra)
        return env

    def run(self, *args, check=True, timeout=900, env=None):
        proc = subprocess.run(
            [str(BIN), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or self.env(),
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"seedbar {' '.join(map(str, args))} failed:\n{proc.stderr}")
        return proc

    def probe(self, model, **kwargs):
        args = ["probe", "--model", model]
        for key, value in kwargs.items():
            flag = "--" + key.replace("_", "-")
            args += [flag, ",".join(map(str, value)) if isinstance(value, list) else value]
        return json.loads(self.run(*args).stdout)


@pytest.fixture(scope="session")
def seedbar(tmp_path_factory) -> Seedbar:
    assert BIN.exists(), f"{BIN} is missing: build with `cargo build -p seedbar-cli`"
    sb = Seedbar(tmp_path_factory.mktemp("store"))
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    return sb


# ---------------------------------------------------------------------------------------------
# `seedbar serve`

READY_LINE = re.compile(r"Seedbar serving (?P<model>\S+) at (?P<url>http://127\.0\.0\.1:(?P<port>\d+)/v1)")
SERVER_START_TIMEOUT = 120


def wait_for(predicate, timeout, interval=0.1, message="condition"):
    """Polls `predicate` until it returns a truthy value (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {last!r})")
        time.sleep(interval)


def parse_metrics(text):
    """Prometheus text -> {series name: value summed over its label sets}."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        values[name] = values.get(name, 0.0) + float(value)
    return values


class Server:
    """A running `seedbar serve` process."""

    def __init__(self, process, ready_line, stderr_path, stdout_lines):
        match = READY_LINE.fullmatch(ready_line)
        self.process = process
        self.pid = process.pid
        self.ready_line = ready_line
        self.model = match["model"]
        self.port = int(match["port"])
        self.base_url = match["url"]  # http://127.0.0.1:PORT/v1, for OpenAI clients
        self.url = self.base_url[: -len("/v1")]  # the server root, for /health, /metrics, /api/...
        self.stderr_path = stderr_path
        self.stdout_lines = stdout_lines  # stdout lines printed after the ready line

    def stderr(self):
        return Path(self.stderr_path).read_text(errors="replace")

    def rss_bytes(self):
        """Resident memory (psutil: /proc on Linux, the kernel's task info on macOS)."""
        return psutil.Process(self.pid).memory_info().rss

    def metrics_text(self, headers=None):
        req = urllib.request.Request(self.url + "/metrics", headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()

    def metrics(self, headers=None):
        return parse_metrics(self.metrics_text(headers))

    def wait_idle(self, timeout=30, headers=None):
        """Waits until no row runs and nothing is queued; returns the metrics."""

        def idle():
            m = self.metrics(headers)
            return m if m.get("seedbar_running_rows") == 0 and m.get("seedbar_queued_requests") == 0 else None

        return wait_for(idle, timeout, interval=0.2, message="seedbar_running_rows 0 and seedbar_queued_requests 0")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends `sig` and returns the exit code; kills and fails if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"seedbar serve (pid {self.pid}) did not exit {timeout}s after {sig!r}")


def serve_env(seedbar, env=None):
    base = seedbar.env()
    base.pop("SEEDBAR_API_KEY", None)  # only the keys a test asks for
    base.update(env or {})
    return base


def start_server(seedbar, *args, model=DEFAULT_MODEL, env=None, timeout=SERVER_START_TIMEOUT):
    """Starts `seedbar serve --model MODEL --port 0 ARGS...` and waits for its ready line."""
    stderr_file = tempfile.NamedTemporaryFile(prefix="seedbar-serve-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [str(BIN), "serve", "--model", model, "--port", "0", *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
        env=serve_env(seedbar, env),
    )
    stderr_file.close()
    lines = queue.Queue()
    after_ready = []

    def pump():  # keeps reading stdout so the server can never block on it
        first = True
        for line in process.stdout:
            if first:
                lines.put(line.rstrip("\n"))
                first = False
            else:
                after_ready.append(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        process.wait()
        raise AssertionError(
            f"seedbar serve printed no ready line within {timeout}s; stderr:\n{Path(stderr_file.name).read_text()}"
        )
    if line is None or not READY_LINE.fullmatch(line):
        process.kill()
        rc = process.wait()
        raise AssertionError(
            f"seedbar serve: expected `Seedbar serving {model} at http://127.0.0.1:<port>/v1`, got {line!r} "
            f"(exit {rc}); stderr:\n{Path(stderr_file.name).read_text()}"
        )
    return Server(process, line, stderr_file.name, after_ready)


@contextlib.contextmanager
def serving(seedbar, *args, **kwargs):
    """A server for the duration of a `with` block; it must shut down cleanly (exit 0) on SIGTERM."""
    server = start_server(seedbar, *args, **kwargs)
    try:
        yield server
    finally:
        rc = server.stop()
    assert rc == 0, f"seedbar serve exited {rc} after SIGTERM; stderr:\n{server.stderr()[-4000:]}"


@pytest.fixture(scope="session")
def server(seedbar):
    """The shared server: `seedbar serve --model SmolLM2-135M-Instruct --port 0`."""
    with serving(seedbar) as srv:
        yield srv

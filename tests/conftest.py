"""Shared fixtures: the built `seedbar` binary, an isolated model store holding the default
model (SmolLM2-135M-Instruct), and random-weight checkpoints written with mlx-lm."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "debug" / "seedbar"
CACHE = Path(os.environ.get("SEEDBAR_DEV_CACHE", Path.home() / ".cache" / "seedbar-dev"))
DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def default_gguf() -> Path:
    return Path((CACHE / "default-model.path").read_text().strip())


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

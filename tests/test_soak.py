"""The short soak (tests/soak.py; `make soak` runs the long one): 16 concurrent workers for
SEEDBAR_SOAK_SECONDS (default 20) against a server of its own, mixing good seeded streamed,
non-streamed and Ollama chats (each must give exactly its solo reference text), cancelled
streams, raw-socket disconnects, malformed requests (the expected 4xx JSON error) and oversize
bodies (413). 429 queue_full is an expected outcome, not an error. Afterwards the server must be
idle (no running or queued rows), within its RSS bound, answer a reference as before, and exit 0
on SIGTERM."""

import os

import pytest

import soak
from conftest import serving

CONCURRENCY = 16
SECONDS = float(os.environ.get("SEEDBAR_SOAK_SECONDS", "20"))


@pytest.fixture(scope="module")
def soak_server(seedbar):
    with serving(seedbar, "--max-body-bytes", soak.BODY_LIMIT) as srv:  # its own process: RSS and the idle check are this test's alone
        yield srv


def test_short_soak(soak_server, capsys):
    with capsys.disabled():
        print()
        result = soak.run_soak(soak_server.url, soak_server.pid, concurrency=CONCURRENCY, seconds=SECONDS, seed=7,
                               warmup=0, prompts=2, seeds=1, solo_modes=False)
    assert not result["failures"], "\n".join(result["failures"])
    kinds = result["kinds"]
    for kind in ("stream", "nonstream", "ollama", "malformed"):
        assert kinds[kind]["ok"] > 0, f"no {kind} request completed: {kinds[kind]}"
    assert result["running_rows_after"] == 0 and result["queued_after"] == 0
    assert result["rss_after"] <= result["rss_limit"]

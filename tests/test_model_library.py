"""The model library refuses a repository whose config.json names an architecture Seedbar
cannot run before downloading anything, with the list of those it can run, and shows the
architecture of the ones it pulls (the stand-in hub of test_app_api)."""

import httpx
import pytest

from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving
from test_app_api import FakeHub, wait_pull


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    sb = Seedbar(tmp_path_factory.mktemp("library-home"))
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    hub = FakeHub()
    hub.repos = {
        "org/mamba": {"config.json": b'{"model_type": "mamba"}', "model.safetensors": b"\0" * 5000},
        "org/moe": {"config.json": b'{"model_type": "qwen3_moe"}', "model.safetensors": b"\0" * 1000},
    }
    try:
        with serving(sb, env={"HF_ENDPOINT": hub.url, "HF_TOKEN": ""}) as srv:
            with httpx.Client(base_url=srv.url, timeout=60) as client:
                yield client, sb
    finally:
        hub.close()


def test_an_unsupported_architecture_is_refused_before_download(library):
    client, sb = library
    assert client.post("/app/models/pull", json={"repo": "org/mamba"}).status_code == 202
    failed = wait_pull(client, "org/mamba")
    assert failed["status"] == "error", failed
    assert "unsupported model architecture `mamba`" in failed["error"], failed
    assert "qwen3_moe" in failed["error"] and "mixtral" in failed["error"] and "bert for embeddings" in failed["error"]
    assert failed["downloaded_bytes"] == 0 and failed["architecture"] is None
    assert not (sb.home / "models" / "org--mamba").exists()
    assert not (sb.home / "downloads" / "org--mamba").exists()


def test_a_pull_shows_its_architecture(library):
    client, _ = library
    assert client.post("/app/models/pull", json={"repo": "org/moe"}).status_code == 202
    done = wait_pull(client, "org/moe")
    assert (done["status"], done["architecture"]) == ("done", "qwen3_moe"), done
    assert client.delete("/app/models/org--moe").status_code == 204

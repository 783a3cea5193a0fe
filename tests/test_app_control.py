"""The app as a Mac user keeps it (#32): the default model switched live and kept in the
settings, the first run's catalogue fitted to this machine, and pulls of one GGUF file of a
repository (the catalogue's GGUF entries), through a stand-in hub serving the real default
model's bytes, so the pulled file loads and answers."""

import httpx
import pytest

from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving, wait_for
from test_app_api import FakeHub, wait_pull

SPARE = "Spare-Model"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    sb = Seedbar(tmp_path_factory.mktemp("control") / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    sb.run("models", "add", default_gguf(), "--name", SPARE)
    hub = FakeHub()
    hub.repos["org/tiny-GGUF"] = {
        "tiny-Q4_1.gguf": default_gguf().read_bytes(),
        "tiny-Q8_0.gguf": b"\0" * 100,
        "README.md": b"# tiny",
    }
    try:
        with serving(sb, env={"HF_ENDPOINT": hub.url, "HF_TOKEN": ""}) as srv:
            with httpx.Client(base_url=srv.url, timeout=120) as client:
                yield client, sb
    finally:
        hub.close()


def ready_model(client):
    status = client.get("/app/status").json()
    return status["model"] if status["state"] == "ready" else None


def test_the_default_model_switches_live_and_is_kept(app):
    client, _ = app
    assert wait_for(lambda: ready_model(client), 60, message="the first default") == DEFAULT_MODEL
    settings = client.get("/app/settings").json()
    assert settings["default_model"] == "" and settings["show_menu_bar_icon"] and not settings["start_minimized"]
    refused = client.put("/app/settings", json={**settings, "default_model": "Nope"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "default_model"
    assert SPARE in refused.json()["error"]["message"], "the message lists the chat models"
    assert client.get("/app/settings").json()["default_model"] == ""
    saved = client.put("/app/settings", json={**settings, "default_model": SPARE.lower()})
    assert saved.status_code == 200 and saved.json()["default_model"] == SPARE, "spelled as installed"
    assert wait_for(lambda: ready_model(client) == SPARE, 60, message=f"{SPARE} as the default")
    # A conversation that names no model runs on the default.
    cid = client.post("/app/conversations", json={"settings": {"max_tokens": 4}}).json()["id"]
    with client.stream("POST", f"/app/conversations/{cid}/reply", json={"content": "Hi"}) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_lines():
            pass
    reply = client.get(f"/app/conversations/{cid}").json()["messages"][-1]
    assert reply["sampling"]["model"] == SPARE
    # The icon and start settings are kept as given.
    kept = client.put("/app/settings", json={**saved.json(), "show_menu_bar_icon": False, "start_minimized": True})
    assert kept.status_code == 200
    again = client.get("/app/settings").json()
    assert (again["show_menu_bar_icon"], again["start_minimized"], again["default_model"]) == (False, True, SPARE)


def test_the_catalogue_fits_this_machine(app):
    client, _ = app
    offer = client.get("/app/catalogue").json()
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert abs(offer["memory_bytes"] - total) < total * 0.05
    assert offer["backend"] == "cpu"
    gb = offer["memory_bytes"] / 1e9
    assert offer["size_class"] == ("7-9B" if gb >= 28 else "3-4B" if gb >= 14 else "1-2B")
    formats = [(m, f) for m in offer["models"] for f in m["formats"]]
    [(model, pick)] = [(m, f) for m, f in formats if f["recommended"]]
    assert model["size_class"] == offer["size_class"] and pick["format"] == "mlx-4bit"
    assert all(f["memory_bytes"] > f["download_bytes"] > 0 for _, f in formats)
    assert {m["size_class"] for m in offer["models"]} == {"1-2B", "3-4B", "7-9B"}
    assert any(f["format"] == "gguf-q4_k_m" for _, f in formats)
    assert not any(f["installed"] for _, f in formats)


def test_one_gguf_file_of_a_repository_is_pulled_and_answers(app):
    client, sb = app
    repo = "org/tiny-GGUF:tiny-Q4_1.gguf"
    started = client.post("/app/models/pull", json={"repo": repo})
    assert started.status_code == 202, started.text
    done = wait_pull(client, repo)
    assert done["status"] == "done", done
    assert done["downloaded_bytes"] == done["total_bytes"] == default_gguf().stat().st_size
    assert sorted(p.name for p in (sb.home / "models" / "tiny-Q4_1").iterdir()) == ["tiny-Q4_1.gguf"]
    tiny = next(m for m in client.get("/app/models").json() if m["name"] == "tiny-Q4_1")
    assert (tiny["format"], tiny["quantization"]) == ("gguf", "Q4_1")
    reply = client.post("/v1/chat/completions", json={
        "model": "tiny-Q4_1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "seed": 1})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    # A file the repository does not have, and ids that are not a top-level .gguf file.
    missing = "org/tiny-GGUF:tiny-Q2_K.gguf"
    assert client.post("/app/models/pull", json={"repo": missing}).status_code == 202
    failed = wait_pull(client, missing)
    assert failed["status"] == "error" and "has no file tiny-Q2_K.gguf" in failed["error"], failed
    for bad in ["org/tiny-GGUF:README.md", "org/tiny-GGUF:../x.gguf", "org/tiny-GGUF:.gguf", "org:x.gguf"]:
        refused = client.post("/app/models/pull", json={"repo": bad})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "repo", bad

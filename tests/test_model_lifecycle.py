"""Models that come and go, as Ollama's users drive them, through the `ollama` client and the
CLI: `keep_alive: 0` unloads a model at once and the next request loads it again; a
`keep_alive` duration shows in `/api/ps`'s `expires_at` and runs out on time; `seedbar ps`,
`seedbar stop MODEL` and `seedbar models rm NAME`; `seedbar serve --keep-alive` and the app's
idle setting unload idle models other than the served one; a model too large for free memory is refused before it is
loaded, with both sizes."""

import os
import re
import time
from datetime import datetime, timezone

import httpx
import ollama
import pytest

from checkpoints import write_checkpoint
from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving, wait_for

SPARE = "Spare-Model"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    sb = Seedbar(tmp_path_factory.mktemp("lifecycle") / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    sb.run("models", "add", default_gguf(), "--name", SPARE)
    return sb


@pytest.fixture(scope="module")
def server(store):
    with serving(store) as srv:
        yield srv


def loaded(server):
    """The names `/api/ps` lists, with their `expires_at`."""
    return {m["name"]: m["expires_at"] for m in httpx.get(f"{server.url}/api/ps", timeout=30).json()["models"]}


def expires_in(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) - datetime.now(timezone.utc)


def test_keep_alive_zero_unloads_at_once_and_the_next_request_loads_again(server):
    client = ollama.Client(host=server.url, timeout=120)
    client.generate(model=SPARE, prompt="Hi", options={"num_predict": 4})
    assert SPARE in loaded(server)
    done = client.generate(model=SPARE, prompt="Hi", options={"num_predict": 4}, keep_alive=0)
    assert done.response
    wait_for(lambda: SPARE not in loaded(server), timeout=5, message=f"{SPARE} unloaded")
    assert DEFAULT_MODEL in loaded(server), "the served model stays"
    again = client.generate(model=SPARE, prompt="Hi", options={"num_predict": 4})
    assert again.response and SPARE in loaded(server)
    # `ollama stop`'s request unloads without loading first.
    stopped = client.generate(model=SPARE, prompt="", keep_alive=0)
    assert stopped.done_reason == "unload" and SPARE not in loaded(server)


def test_a_keep_alive_duration_shows_in_ps_and_runs_out(server):
    client = ollama.Client(host=server.url, timeout=120)
    client.chat(model=SPARE, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4}, keep_alive="3s")
    left = expires_in(loaded(server)[SPARE])
    assert 0 < left.total_seconds() <= 3.5, left
    assert expires_in(loaded(server)[DEFAULT_MODEL]).days > 365 * 100, "the served model never expires"
    wait_for(lambda: SPARE not in loaded(server), timeout=8, message=f"{SPARE} unloaded after 3 s")
    bad = httpx.post(f"{server.url}/api/generate", json={"model": SPARE, "prompt": "Hi", "keep_alive": "soon"})
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"], bad.text


def test_the_cli_lists_and_stops_models_of_a_running_server(server, store):
    ollama.Client(host=server.url, timeout=120).generate(model=SPARE, prompt="Hi", options={"num_predict": 2})
    ps = store.run("ps", "--port", server.port).stdout
    rows = {line.split()[0]: line for line in ps.splitlines()[1:]}
    assert set(rows) == {DEFAULT_MODEL, SPARE}, ps
    assert rows[DEFAULT_MODEL].endswith("forever"), ps
    stop = store.run("stop", SPARE, "--port", server.port)
    assert stop.stdout.strip() == f"unloaded {SPARE}"
    assert SPARE not in loaded(server)
    unknown = store.run("stop", "no-such-model", "--port", server.port, check=False)
    assert unknown.returncode != 0 and "no-such-model" in unknown.stderr, unknown.stderr
    nobody = store.run("ps", "--port", "9", check=False)
    assert nobody.returncode != 0 and "no Seedbar server" in nobody.stderr, nobody.stderr


def test_models_rm_takes_a_model_out_of_the_store(store):
    store.run("models", "add", default_gguf(), "--name", "Doomed")
    assert "Doomed" in store.run("models").stdout
    assert store.run("models", "rm", "Doomed").stdout.strip() == "removed Doomed"
    assert "Doomed" not in store.run("models").stdout
    assert os.path.exists(default_gguf()), "the linked file stays where it is"
    again = store.run("models", "rm", "Doomed", check=False)
    assert again.returncode != 0 and "Doomed" in again.stderr


def test_serve_keep_alive_unloads_idle_models_but_the_served_one(store):
    with serving(store, "--keep-alive", "1s") as srv:
        ollama.Client(host=srv.url, timeout=120).generate(model=SPARE, prompt="Hi", options={"num_predict": 2})
        wait_for(lambda: SPARE not in loaded(srv), timeout=6, message=f"{SPARE} unloaded after 1 s idle")
        time.sleep(1.5)
        assert DEFAULT_MODEL in loaded(srv)


def test_the_apps_idle_setting_unloads_models_after_its_minutes(store):
    with serving(store) as srv:
        client = ollama.Client(host=srv.url, timeout=120)
        client.generate(model=SPARE, prompt="Hi", options={"num_predict": 2})
        assert expires_in(loaded(srv)[SPARE]).days > 365 * 100, "kept until its room is needed"
        settings = httpx.get(f"{srv.url}/app/settings", timeout=30).json()
        assert settings["unload_idle_minutes"] == 0
        saved = httpx.put(f"{srv.url}/app/settings", json={**settings, "unload_idle_minutes": 2}, timeout=30)
        assert saved.status_code == 200, saved.text
        client.generate(model=SPARE, prompt="Hi", options={"num_predict": 2})
        left = expires_in(loaded(srv)[SPARE]).total_seconds()
        assert 110 < left <= 120, left
        assert expires_in(loaded(srv)[DEFAULT_MODEL]).days > 365 * 100, "the default model stays"
    # Saved: the next start keeps it.
    with serving(store) as srv:
        ollama.Client(host=srv.url, timeout=120).generate(model=SPARE, prompt="Hi", options={"num_predict": 2})
        assert 110 < expires_in(loaded(srv)[SPARE]).total_seconds() <= 120


def test_a_model_too_large_for_free_memory_is_refused_before_loading(store, server, tmp_path):
    huge = write_checkpoint(tmp_path / "huge", "llama")
    # A sparse file: 4 TB on paper, nothing on disk; the refusal must come before any read.
    os.truncate(huge / "model.safetensors", 4 << 40)
    store.run("models", "add", huge, "--name", "Huge-Model")
    reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "Huge-Model", "messages": [{"role": "user", "content": "Hi"}]})
    assert reply.status_code == 503, reply.text
    message = reply.json()["error"]["message"]
    assert re.search(r"Huge-Model needs about 5\d{3}\.\d GB of memory to load, and [\d.]+ [GM]B is free", message), message
    assert "Huge-Model" not in loaded(server)
    library = {m["name"]: m for m in httpx.get(f"{server.url}/app/models", timeout=30).json()}
    assert not library["Huge-Model"]["fits"] and library["Huge-Model"]["memory_needed"] > 5e12
    assert library[DEFAULT_MODEL]["fits"] and library[SPARE]["fits"]
    store.run("models", "rm", "Huge-Model")

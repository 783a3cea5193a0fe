"""The chat app's `/app` API (docs/app-api.md) end to end against `seedbar serve`: conversations
in SQLite, replies streamed as SSE and stored (pinned seeds, regenerate, edit, stop, a killed
server), the model library with downloads from a stand-in hub, app settings, status, the API
key and the static chat UI."""

import json
import re
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import httpx
import numpy as np
import ollama
import pytest

from conftest import BIN, DEFAULT_MODEL, Seedbar, default_gguf, serving, start_server, wait_for

SHORT = 24  # max_tokens of most replies
STORY = "Write a long, detailed story about a dragon who learns to bake bread."
KEY = "app-key"


@pytest.fixture(scope="module")
def api(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def create(api, title=None, **settings):
    body = {"settings": settings}
    if title is not None:
        body["title"] = title
    resp = api.post("/app/conversations", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def messages(api, conversation_id):
    resp = api.get(f"/app/conversations/{conversation_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()["messages"]


def reply(api, conversation_id, body, stop_after_deltas=None):
    """POSTs to the reply route and returns the events; with `stop_after_deltas`, closes the
    stream after that many deltas."""
    events = []
    with api.stream("POST", f"/app/conversations/{conversation_id}/reply", json=body) as resp:
        assert resp.status_code == 200, resp.read().decode()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[len("data: ") :]))
            deltas = sum(e["type"] == "delta" for e in events)
            if stop_after_deltas is not None and deltas >= stop_after_deltas:
                break
    return events


def streamed_text(events):
    return "".join(e["text"] for e in events if e["type"] == "delta")


def assert_error(resp, status, param=None):
    assert resp.status_code == status, (resp.status_code, resp.text)
    error = resp.json()["error"]
    assert error["message"], error
    if param is not None:
        assert error["param"] == param, error
    return error


# --- conversations --------------------------------------------------------------------------


def test_create_list_rename_and_delete(api, server):
    first = create(api)
    assert first["title"] == "New chat"
    assert first["settings"] == {
        "model": server.model,
        "system_prompt": "",
        "temperature": 0.7,
        "top_p": 1.0,
        "max_tokens": 512,
        "seed": None,
    }
    second = create(api, "Second", temperature=0.2, seed=99)
    assert (second["title"], second["settings"]["temperature"], second["settings"]["seed"]) == ("Second", 0.2, 99)

    listed = api.get("/app/conversations").json()
    assert [c["id"] for c in listed[:2]] == [second["id"], first["id"]]  # most recent first

    renamed = api.patch(f"/app/conversations/{first['id']}", json={"title": "Renamed"}).json()
    assert renamed["title"] == "Renamed"
    assert renamed["settings"] == first["settings"]
    assert api.get("/app/conversations").json()[0]["id"] == first["id"]  # updated: now first

    pinned = api.patch(f"/app/conversations/{first['id']}", json={"settings": {"seed": 7}}).json()
    assert pinned["settings"]["seed"] == 7
    kept = api.patch(f"/app/conversations/{first['id']}", json={"settings": {"max_tokens": 64}}).json()
    assert (kept["settings"]["seed"], kept["settings"]["max_tokens"]) == (7, 64)
    unpinned = api.patch(f"/app/conversations/{first['id']}", json={"settings": {"seed": None}}).json()
    assert unpinned["settings"]["seed"] is None

    detail = api.get(f"/app/conversations/{first['id']}").json()
    assert detail["messages"] == [] and detail["title"] == "Renamed"

    assert api.delete(f"/app/conversations/{second['id']}").status_code == 204
    assert_error(api.get(f"/app/conversations/{second['id']}"), 404)
    assert_error(api.delete(f"/app/conversations/{second['id']}"), 404)
    assert second["id"] not in [c["id"] for c in api.get("/app/conversations").json()]


def test_bad_requests_get_clear_errors(api):
    conversation = create(api)
    cid = conversation["id"]
    assert_error(api.post("/app/conversations", json={"settings": {"temperature": -1}}), 400, "settings.temperature")
    assert_error(api.post("/app/conversations", json={"settings": {"max_tokens": 0}}), 400, "settings.max_tokens")
    assert_error(api.post("/app/conversations", json={"settings": {"seed": 2**53}}), 400, "settings.seed")
    assert_error(api.post("/app/conversations", json={"settings": {"model": "no-such-model"}}), 400, "settings.model")
    assert_error(api.post("/app/conversations", json={"settings": {"temprature": 1}}), 400)
    assert_error(api.post("/app/conversations", json={"title": "   "}), 400, "title")
    assert_error(api.patch(f"/app/conversations/{cid}", json={"settings": {"top_p": 0}}), 400, "settings.top_p")
    assert_error(api.get("/app/conversations/not-a-number"), 400, "id")
    assert_error(api.get("/app/conversations/999999"), 404)
    assert_error(api.post(f"/app/conversations/{cid}/reply", json={}), 400)
    assert_error(api.post(f"/app/conversations/{cid}/reply", json={"content": "hi", "regenerate": True}), 400)
    assert_error(api.post(f"/app/conversations/{cid}/reply", json={"content": "  "}), 400, "content")
    assert_error(api.post(f"/app/conversations/{cid}/reply", json={"regenerate": True}), 400, "regenerate")
    assert_error(api.post("/app/conversations/999999/reply", json={"content": "hi"}), 404)
    assert_error(api.get("/app/nothing-here"), 404)
    assert messages(api, cid) == []  # nothing refused was stored


def test_search_matches_titles_and_messages(api):
    zebra = create(api, "Zebra stripes")
    quokka = create(api, max_tokens=4)
    reply(api, quokka["id"], {"content": "Tell me about the Quokka of Rottnest"})

    def found(q):
        return {c["id"] for c in api.get("/app/conversations", params={"q": q}).json()}

    assert zebra["id"] in found("zebra")
    assert quokka["id"] not in found("zebra")
    assert quokka["id"] in found("QUOKKA OF rottnest")
    assert zebra["id"] not in found("quokka")
    assert found("no conversation says xyzzy-42") == set()


# --- replies --------------------------------------------------------------------------------


def test_send_streams_and_stores_the_reply(api, server):
    conversation = create(api, max_tokens=SHORT, system_prompt="You are brief.")
    cid = conversation["id"]
    with api.stream("POST", f"/app/conversations/{cid}/reply", json={"content": "What is 2+2?"}) as resp:
        header_seed = int(resp.headers["x-seedbar-seed"])
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]

    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["user", "start"] and kinds[-1] == "done", kinds
    assert set(kinds[2:-1]) == {"delta"}, kinds
    user, start, done = events[0]["message"], events[1], events[-1]["message"]
    assert (user["role"], user["content"], user["status"], user["seed"]) == ("user", "What is 2+2?", "complete", None)
    assert start["seed"] == header_seed < 2**53
    assert done["id"] == start["message_id"]
    assert done["content"] == streamed_text(events) != ""
    assert (done["role"], done["status"], done["seed"]) == ("assistant", "complete", start["seed"])
    assert done["sampling"] == {
        "model": server.model,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_tokens": SHORT,
        "system_prompt": "You are brief.",
    }
    assert messages(api, cid) == [user, done]


def test_a_pinned_seed_regenerates_the_same_reply(api):
    conversation = create(api, temperature=0.8, seed=1234, max_tokens=SHORT)
    cid = conversation["id"]
    first = reply(api, cid, {"content": "Name three colors."})
    again = reply(api, cid, {"regenerate": True})
    assert [e["type"] for e in again][0] == "start"  # no user event: the question stays
    assert again[0]["seed"] == 1234
    assert again[-1]["type"] == "done"
    assert again[-1]["message"]["content"] == first[-1]["message"]["content"] != ""
    stored = messages(api, cid)
    assert [m["role"] for m in stored] == ["user", "assistant"]  # the old reply was replaced
    assert stored[1]["id"] == again[0]["message_id"] != first[1]["message_id"]


def test_export_as_markdown_and_json_reproduces_a_pinned_reply(api, server):
    conversation = create(api, "Colors: a list!", temperature=0.8, seed=777, max_tokens=SHORT)
    cid = conversation["id"]
    done = reply(api, cid, {"content": "Name three colors."})[-1]["message"]
    answer, fingerprint = done["content"], done["provenance"]["fingerprint"]

    md = api.get(f"/app/conversations/{cid}/export")
    assert md.status_code == 200, md.text
    assert md.headers["content-type"].startswith("text/markdown")
    assert md.headers["content-disposition"] == 'attachment; filename="Colors--a-list.md"'
    assert md.text.startswith("# Colors: a list!\n")
    assert "seed pinned 777" in md.text and "## User\n\nName three colors.\n" in md.text
    assert f"seed 777, `{fingerprint}`)\n\n{answer.strip()}" in md.text

    exported = api.get(f"/app/conversations/{cid}/export", params={"format": "json"}).json()
    assert (exported["format"], exported["version"]) == ("seedbar.conversation", 1)
    question, reply_message = exported["messages"]
    assert reply_message["seed"] == 777 and reply_message["content"] == answer
    # Reproduced elsewhere: the same seed and sampling through the OpenAI API give the reply.
    sampling = reply_message["sampling"]
    again = httpx.post(server.base_url + "/chat/completions", timeout=120, json={
        "model": sampling["model"], "messages": [{"role": "user", "content": question["content"]}],
        "seed": reply_message["seed"], "temperature": sampling["temperature"],
        "top_p": sampling["top_p"], "max_tokens": sampling["max_tokens"]})
    assert again.json()["choices"][0]["message"]["content"] == answer

    assert_error(api.get(f"/app/conversations/{cid}/export", params={"format": "pdf"}), 400, "format")
    assert api.get("/app/conversations/999999/export").status_code == 404


def test_an_unpinned_reply_can_be_repeated_from_its_seed(api):
    conversation = create(api, temperature=0.9, max_tokens=SHORT)
    cid = conversation["id"]
    first = reply(api, cid, {"content": "Say something about the sea."})
    seed = first[-1]["message"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**53
    api.patch(f"/app/conversations/{cid}", json={"settings": {"seed": seed}})
    again = reply(api, cid, {"regenerate": True})
    assert again[-1]["message"]["content"] == first[-1]["message"]["content"]


def test_concurrent_regenerations_match_their_solo_replies(server):
    question = "Write a sentence about mountains."
    with httpx.Client(base_url=server.url, timeout=120) as api:
        a = create(api, temperature=0.8, seed=11, max_tokens=48)
        b = create(api, temperature=0.8, seed=22, max_tokens=48)
        alone = {c["id"]: reply(api, c["id"], {"content": question})[-1]["message"]["content"] for c in (a, b)}
    assert alone[a["id"]] != alone[b["id"]]

    together, barrier = {}, threading.Barrier(2)

    def regenerate(cid):
        with httpx.Client(base_url=server.url, timeout=120) as client:
            barrier.wait()
            together[cid] = reply(client, cid, {"regenerate": True})[-1]["message"]["content"]

    threads = [threading.Thread(target=regenerate, args=(c["id"],)) for c in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert together == alone


def test_editing_a_message_drops_what_follows(api):
    conversation = create(api, seed=5, max_tokens=8)
    cid = conversation["id"]
    reply(api, cid, {"content": "First question"})
    reply(api, cid, {"content": "Second question"})
    before = messages(api, cid)
    assert [m["role"] for m in before] == ["user", "assistant", "user", "assistant"]

    assert_error(
        api.post(f"/app/conversations/{cid}/reply", json={"edit": {"message_id": before[1]["id"], "content": "x"}}),
        400,
        "edit.message_id",
    )
    events = reply(api, cid, {"edit": {"message_id": before[0]["id"], "content": "Edited question"}})
    assert [e["type"] for e in events][:2] == ["user", "start"] and events[-1]["type"] == "done"
    edited = events[0]["message"]
    assert (edited["id"], edited["content"]) == (before[0]["id"], "Edited question")
    after = messages(api, cid)
    assert [m["id"] for m in after] == [before[0]["id"], events[1]["message_id"]]
    assert after[0]["content"] == "Edited question"
    assert after[1]["content"] == streamed_text(events)


def test_closing_the_stream_stores_a_stopped_reply(api):
    conversation = create(api, temperature=0.8, seed=3, max_tokens=400)
    cid = conversation["id"]
    events = reply(api, cid, {"content": STORY}, stop_after_deltas=3)
    shown = streamed_text(events)
    reply_id = events[1]["message_id"]

    def settled():
        stored = [m for m in messages(api, cid) if m["id"] == reply_id]
        return stored[0] if stored and stored[0]["status"] != "streaming" else None

    stored = wait_for(settled, 30, message="the stopped reply to be stored")
    assert stored["status"] == "stopped", stored
    assert stored["content"].startswith(shown), (stored["content"], shown)


# --- a killed server ------------------------------------------------------------------------


@pytest.fixture()
def own_store(tmp_path):
    sb = Seedbar(tmp_path / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    return sb


def test_a_killed_server_loses_nothing_shown_as_sent_or_completed(own_store):
    settings = {"port": 7555, "api_key": "", "allowed_origins": [], "show_in_dock": True, "launch_at_login": True,
                "quick_chat_shortcut": "Alt+F9", "prompt_cache_disk_gb": 2, "unload_idle_minutes": 5,
                "default_model": "", "show_menu_bar_icon": False, "start_minimized": True, "welcomed": True,
                "fetch_image_urls": True, "draft_models": {}}
    srv = start_server(own_store)
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as api:
            cid = create(api, temperature=0.8, seed=8, max_tokens=SHORT)["id"]
            reply(api, cid, {"content": "Hello!"})
            completed = messages(api, cid)
            assert api.put("/app/settings", json=settings).status_code == 200
            api.patch(f"/app/conversations/{cid}", json={"settings": {"max_tokens": 400}})
            with api.stream("POST", f"/app/conversations/{cid}/reply", json={"content": STORY}) as resp:
                deltas = 0
                for line in resp.iter_lines():
                    deltas += line.startswith('data: {"type":"delta"')
                    if deltas == 2:
                        srv.process.kill()  # SIGKILL, mid-reply
                        break
    finally:
        srv.process.kill()
        srv.process.wait()

    with serving(own_store) as again, httpx.Client(base_url=again.url, timeout=120) as api:
        stored = messages(api, cid)
        assert stored[:2] == completed
        assert [(m["role"], m["content"]) for m in stored[2:3]] == [("user", STORY)]
        assert stored[2]["status"] == "complete"
        # The reply that was streaming when the process died is marked as stopped.
        assert len(stored) == 4
        assert (stored[3]["role"], stored[3]["status"]) == ("assistant", "stopped")
        assert api.get("/app/settings").json() == settings


# --- models, pulls, settings, status --------------------------------------------------------


def test_models_list_the_installed_ones(api, server):
    models = api.get("/app/models").json()
    smol = next(m for m in models if m["name"] == server.model)
    assert smol["format"] == "gguf"
    assert smol["bytes"] > 50_000_000
    assert smol["quantization"] == "Q4_1"
    assert (smol["architecture"], smol["supported"]) == ("llama", True)
    assert smol["loaded"] is True


def test_models_show_their_architecture_and_whether_it_runs(api, seedbar, tmp_path):
    """A GGUF and a folder of architectures Seedbar does not run are listed as such."""
    writer = gguf.GGUFWriter(str(tmp_path / "Bloom-Tiny.gguf"), "bloom")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    folder = tmp_path / "Mamba-Tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "mamba"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    (folder / "tokenizer.json").write_text("{}")
    for path in (tmp_path / "Bloom-Tiny.gguf", folder):
        seedbar.run("models", "add", path)
    models = {m["name"]: m for m in api.get("/app/models").json()}
    for name, arch in [("Bloom-Tiny", "bloom"), ("Mamba-Tiny", "mamba")]:
        assert (models[name]["architecture"], models[name]["supported"]) == (arch, False), models[name]
    for name in ("Bloom-Tiny", "Mamba-Tiny"):
        assert api.delete(f"/app/models/{name}").status_code == 204


def test_deleting_models(api, server, seedbar):
    assert_error(api.delete(f"/app/models/{server.model}"), 409)
    assert_error(api.delete("/app/models/no-such-model"), 404)
    seedbar.run("models", "add", default_gguf(), "--name", "Spare-Model")
    assert "Spare-Model" in [m["name"] for m in api.get("/app/models").json()]
    orphan = create(api, model="Spare-Model")
    assert api.delete("/app/models/Spare-Model").status_code == 204
    assert "Spare-Model" not in [m["name"] for m in api.get("/app/models").json()]
    assert not (seedbar.home / "models" / "Spare-Model").exists()
    # A conversation whose model is gone can still be renamed and (re)pinned...
    renamed = api.patch(f"/app/conversations/{orphan['id']}", json={"title": "Kept", "settings": {"seed": 5}})
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["settings"]["seed"] == 5
    # ...but not switched to another missing model.
    assert_error(api.patch(f"/app/conversations/{orphan['id']}", json={"settings": {"model": "Gone"}}), 400, "settings.model")


class FakeHub:
    """A stand-in for the Hugging Face hub: `org/tiny` (small) and `org/slow` (4 MB of weights
    sent slowly), or nothing at all once closed (a closed port)."""

    def __init__(self):
        self.repos = {
            "org/tiny": {"config.json": b'{"model_type": "llama", "torch_dtype": "bfloat16"}', "model.safetensors": b"\0" * 1000},
            "org/slow": {"config.json": b"{}", "model.safetensors": b"\0" * (4 << 20)},
        }
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "models"] and "/".join(parts[2:4]) in hub.repos:
                    files = hub.repos["/".join(parts[2:4])]
                    siblings = [{"rfilename": n, "size": len(b)} for n, b in files.items()]
                    return self.send(json.dumps({"sha": "c0ffee", "siblings": siblings}).encode())
                repo, file = "/".join(parts[:2]), "/".join(parts[4:])
                if repo in hub.repos and file in hub.repos[repo]:
                    return self.send(hub.repos[repo][file], slow=repo == "org/slow")
                self.send_response(404)
                self.end_headers()

            def send(self, body, slow=False):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(0, len(body), 64 * 1024):
                        self.wfile.write(body[i : i + 64 * 1024])
                        if slow:
                            time.sleep(0.1)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def ui_dir(tmp_path_factory):
    ui = tmp_path_factory.mktemp("ui")
    (ui / "index.html").write_text("<!doctype html><title>Seedbar chat</title>")
    (ui / "assets").mkdir()
    (ui / "assets" / "app.js").write_text("console.log('seedbar')")
    return ui


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, ui_dir):
    """A server with an API key, a chat UI folder and the stand-in hub."""
    sb = Seedbar(tmp_path_factory.mktemp("keyed-home"))
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    hub = FakeHub()
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": ""}
    try:
        with serving(sb, "--api-key", KEY, "--ui-dir", ui_dir, env=env) as srv:
            headers = {"Authorization": f"Bearer {KEY}"}
            with httpx.Client(base_url=srv.url, timeout=120, headers=headers) as client:
                yield srv, client, hub, sb
    finally:
        hub.close()


def wait_pull(client, repo, timeout=30):
    def ended():
        pulls = {p["repo"]: p for p in client.get("/app/models/pulls").json()}
        return pulls[repo] if pulls[repo]["status"] != "downloading" else None

    return wait_for(ended, timeout, interval=0.1, message=f"the pull of {repo} to end")


def test_pull_downloads_with_progress_and_cancels(keyed):
    _, client, _, sb = keyed
    resp = client.post("/app/models/pull", json={"repo": "org/tiny"})
    assert resp.status_code == 202, resp.text
    assert resp.json()["repo"] == "org/tiny"
    done = wait_pull(client, "org/tiny")
    assert done["status"] == "done", done
    assert done["downloaded_bytes"] == done["total_bytes"] > 1000
    tiny = next(m for m in client.get("/app/models").json() if m["name"] == "org--tiny")
    assert (tiny["format"], tiny["quantization"], tiny["loaded"]) == ("safetensors", "bfloat16", False)
    assert client.delete("/app/models/org--tiny").status_code == 204

    assert client.post("/app/models/pull", json={"repo": "org/slow"}).status_code == 202
    wait_for(
        lambda: next(p for p in client.get("/app/models/pulls").json() if p["repo"] == "org/slow")["downloaded_bytes"] > 0,
        30,
        message="the slow pull to start",
    )
    cancelled = client.delete("/app/models/pulls/org/slow")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled", cancelled.json()
    assert cancelled.json()["downloaded_bytes"] < cancelled.json()["total_bytes"]
    assert not (sb.home / "models" / "org--slow").exists()
    assert not (sb.home / "downloads" / "org--slow").exists()

    assert_error(client.delete("/app/models/pulls/org/never"), 404)
    assert_error(client.post("/app/models/pull", json={"repo": "not-a-repo"}), 400, "repo")


def test_ollama_pull_streams_status_lines(keyed):
    srv, client, _, _ = keyed
    with client.stream("POST", "/api/pull", json={"model": "org/tiny"}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    assert lines[0] == {"status": "pulling manifest"}, lines
    assert lines[-1] == {"status": "success"}, lines
    progress = [line for line in lines if line["status"].startswith("downloading")]
    assert all(0 <= p["completed"] <= p["total"] for p in progress), progress
    assert any(m["name"] == "org--tiny" for m in client.get("/app/models").json())
    again = ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {KEY}"}).pull("org/tiny")
    assert again.status == "success"
    assert client.delete("/app/models/org--tiny").status_code == 204
    bad = client.post("/api/pull", json={"model": "not-a-repo", "stream": False})
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str), bad.text


def test_pull_without_a_reachable_hub_fails_quickly(keyed):
    _, client, hub, _ = keyed
    hub.close()  # now HF_ENDPOINT points at a closed port
    started = time.monotonic()
    assert client.post("/app/models/pull", json={"repo": "org/offline"}).status_code == 202
    failed = wait_pull(client, "org/offline", timeout=20)
    assert time.monotonic() - started < 20
    assert failed["status"] == "error"
    assert "cannot reach the Hugging Face hub" in failed["error"], failed


def test_a_conversation_starts_with_quick_chats_question_and_answer(api):
    """`POST /app/conversations` with `messages`: quick chat's question and answer, stored
    complete, the answer with its seed and the conversation's sampling."""
    body = {"title": "Capital", "settings": {"temperature": 0.7, "max_tokens": 512},
            "messages": [{"role": "user", "content": "Capital of France?"},
                         {"role": "assistant", "content": "Paris.", "seed": 77}]}
    resp = api.post("/app/conversations", json=body)
    assert resp.status_code == 200, resp.text
    stored = messages(api, resp.json()["id"])
    assert [(m["role"], m["content"], m["status"], m["seed"]) for m in stored] == [
        ("user", "Capital of France?", "complete", None), ("assistant", "Paris.", "complete", 77)]
    assert stored[1]["sampling"]["model"] == DEFAULT_MODEL
    assert stored[1]["sampling"]["max_tokens"] == 512
    user_seed = {**body, "messages": [{"role": "user", "content": "x", "seed": 1}]}
    assert_error(api.post("/app/conversations", json=user_seed), 400, "messages[0].seed")
    big_seed = {**body, "messages": [{"role": "assistant", "content": "x", "seed": 2**53}]}
    assert_error(api.post("/app/conversations", json=big_seed), 400, "messages[0].seed")
    assert_error(api.post("/app/conversations", json={"messages": [{"role": "system", "content": "x"}]}), 400)


def test_settings_round_trip(api):
    new = {
        "port": 7400,
        "api_key": "",
        "allowed_origins": ["http://localhost:5173"],
        "show_in_dock": True,
        "launch_at_login": False,
        "quick_chat_shortcut": "Alt+Space",
        "prompt_cache_disk_gb": 8,
        "unload_idle_minutes": 0,
        "default_model": "",
        "show_menu_bar_icon": True,
        "start_minimized": False,
        "welcomed": True,
        "fetch_image_urls": True,
        "draft_models": {},
    }
    assert set(api.get("/app/settings").json()) == set(new)
    assert api.get("/app/settings").json()["quick_chat_shortcut"] == "CommandOrControl+Shift+Space"
    resp = api.put("/app/settings", json=new)
    assert resp.status_code == 200, resp.text
    assert resp.json() == new
    assert api.get("/app/settings").json() == new
    assert_error(api.put("/app/settings", json={**new, "allowed_origins": ["not an origin"]}), 400, "allowed_origins")
    assert_error(api.put("/app/settings", json={"port": 1}), 400)
    assert api.get("/app/settings").json() == new
    # The shared server's later tests expect image URLs refused, as by default.
    assert api.put("/app/settings", json={**new, "fetch_image_urls": False}).status_code == 200


def test_status(api, server):
    status = api.get("/app/status").json()
    assert status == {"state": "ready", "model": server.model, "percent": None, "problem": None, "fix": None,
                      "actions": [], "endpoint": server.base_url, "paused": False, "message": None}
    assert_error(api.post("/app/status/retry"), 409)  # a model is ready: nothing to retry


# --- no model yet: the API answers, says why and how to fix it; an import fixes it ----------

LISTENING = re.compile(r"Seedbar listening at (http://127\.0\.0\.1:\d+)/v1 without a model")


def test_without_a_model_the_app_api_works_and_an_import_fixes_it(tmp_path):
    sb = Seedbar(tmp_path / "empty-home")
    stderr = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([str(BIN), "serve", "--port", "0"], stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=sb.env())
    try:
        line = proc.stdout.readline()
        match = LISTENING.fullmatch(line.strip())
        assert match, (line, (tmp_path / "serve.log").read_text())
        with httpx.Client(base_url=match[1], timeout=120) as api:
            status = api.get("/app/status").json()
            assert status["state"] == "no_model", status
            assert status["problem"] == f"The model {DEFAULT_MODEL} is not installed.", status
            assert "import a gguf file" in status["fix"].lower() and "seedbar pull" in status["fix"], status
            assert "import" in status["actions"] and status["endpoint"] == match[1] + "/v1"
            assert "not installed" in (tmp_path / "serve.log").read_text()

            # The store, the library and settings work without a model.
            assert api.get("/app/conversations").json() == []
            waiting = create(api, "Before the model")
            assert waiting["settings"]["model"] == ""  # the default model, whichever it becomes
            assert api.get("/app/models").json() == []
            assert api.get("/app/settings").status_code == 200
            assert api.get("/v1/models").json()["data"] == []

            # Requests that need a model get a 503 saying why, at once.
            refused = assert_error(api.post(f"/app/conversations/{waiting['id']}/reply", json={"content": "Hi"}), 503)
            assert "not installed" in refused["message"] and refused["code"] == "model_not_ready", refused
            assert messages(api, waiting["id"]) == []
            chat = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
            error = assert_error(api.post("/v1/chat/completions", json=chat), 503)
            assert error["type"] == "server_error" and "seedbar pull" in error["message"], error

            # Imports are checked first.
            (tmp_path / "notes.txt").write_text("not a model")
            (tmp_path / "half").mkdir()
            (tmp_path / "half" / "config.json").write_text("{}")
            for path, says in [("relative.gguf", "absolute"), (tmp_path / "missing.gguf", "does not exist"),
                               (tmp_path / "notes.txt", "not a GGUF model file"), (tmp_path / "half", "no .safetensors")]:
                error = assert_error(api.post("/app/models/import", json={"path": str(path)}), 400, "path")
                assert says in error["message"], error
            assert_error(api.post("/app/models/import", json={}), 400)

            # A copy of the SmolLM2 GGUF, imported through the library's route: it becomes the
            # default model, loads, lists in /v1/models and answers.
            copy = tmp_path / "disk" / "my-smol.gguf"
            copy.parent.mkdir()
            shutil.copyfile(default_gguf(), copy)
            imported = api.post("/app/models/import", json={"path": str(copy)})
            assert imported.status_code == 200, imported.text
            assert imported.json()["name"] == "my-smol" and imported.json()["format"] == "gguf"
            ready = wait_for(lambda: (s := api.get("/app/status").json())["state"] == "ready" and s, 60,
                             message="the imported model to load")
            assert ready["model"] == "my-smol" and ready["problem"] is None
            assert "my-smol" in [m["id"] for m in api.get("/v1/models").json()["data"]]
            answer = api.post("/v1/chat/completions", json={**chat, "model": "my-smol", "temperature": 0})
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"].strip()
            # The conversation made before there was a model now replies with the default one.
            api.patch(f"/app/conversations/{waiting['id']}", json={"settings": {"max_tokens": SHORT}})
            events = reply(api, waiting["id"], {"content": "What is the capital of France?"})
            assert events[-1]["type"] == "done" and streamed_text(events), events
            assert events[-1]["message"]["sampling"]["model"] == "my-smol"
            # The file stays where it was (a link in the store, not a copy); the same file
            # again changes nothing; another file under a taken name is refused.
            assert copy.exists()
            assert api.post("/app/models/import", json={"path": str(copy)}).status_code == 200
            other = tmp_path / "disk" / "other.gguf"
            other.write_bytes(copy.read_bytes()[:1024])
            assert_error(api.post("/app/models/import", json={"path": str(other), "name": "my-smol"}), 409, "name")

            # `seedbar models add` into the same store: listed and answering at once.
            cli = tmp_path / "disk" / "cli-copy.gguf"
            shutil.copyfile(default_gguf(), cli)
            assert sb.run("models", "add", cli).stdout.startswith("cli-copy: ")
            assert "cli-copy" in [m["id"] for m in api.get("/v1/models").json()["data"]]
            answer = api.post("/v1/chat/completions", json={**chat, "model": "cli-copy", "temperature": 0})
            assert answer.status_code == 200, answer.text
            bad = sb.run("models", "add", tmp_path / "notes.txt", check=False)
            assert bad.returncode == 1 and "not a GGUF model file" in bad.stderr, bad.stderr
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


# --- the API key and the chat UI ------------------------------------------------------------


def test_app_routes_need_the_key_but_the_ui_does_not(keyed, ui_dir):
    srv, client, _, _ = keyed
    wait_for(lambda: srv.stdout_lines, 10, message="the line after the ready line")
    assert srv.stdout_lines[0] == f"Chat UI at {srv.url}/"
    with httpx.Client(base_url=srv.url, timeout=30) as anonymous:
        for path in ("/app/conversations", "/app/status", "/app/models", "/app/settings", "/app/nothing", "/v1/models"):
            assert_error(anonymous.get(path), 401)
        assert_error(anonymous.post("/app/conversations", json={}), 401)
        index = anonymous.get("/")
        assert index.status_code == 200 and "Seedbar chat" in index.text
        assert anonymous.get("/assets/app.js").text == "console.log('seedbar')"
        assert "Seedbar chat" in anonymous.get("/chats/12").text  # the UI's own routes
        for sneaky in ("//v1/models", "/assets/../app/settings", "/%2e%2e/app/settings"):
            resp = anonymous.get(sneaky)
            assert KEY not in resp.text and '"object":"list"' not in resp.text, (sneaky, resp.text)
        assert_error(anonymous.post("/", json={}), 401)
    assert client.get("/app/status").json()["state"] == "ready"
    assert_error(client.get("/app/nothing"), 404)


def test_the_shared_server_serves_the_ui_or_says_how_to_build_it(server):
    resp = httpx.get(server.url + "/", timeout=30)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    built = Path.cwd() / "ui" / "dist" / "index.html"  # `seedbar serve` looks there first
    if built.exists():
        assert resp.text == built.read_text()
    else:
        assert "make ui" in resp.text
    assert_error(httpx.get(server.url + "/v1/nothing", timeout=30), 404)

"""A reply's reproducibility receipt (#32): every generating route answers with the seed, the
model's weights hash (SHA-256 of its file), its quantization, the engine build and the backend
class in `x-seedbar-*` headers, and OpenAI's `system_fingerprint` is the fingerprint of all but
the seed. Two replies with the same seed and settings have equal receipts and equal text;
another weights file changes the hash and the fingerprint."""

import hashlib
import json
import os
import shutil
import time

import httpx
import pytest

from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving

ALTERED = "SmolLM2-altered"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("receipt")
    sb = Seedbar(root / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    # The same model with one byte of its last tensor changed: it loads and answers, from
    # other weights.
    altered = root / "altered.gguf"
    shutil.copy(default_gguf(), altered)
    with open(altered, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0x01]))
    sb.run("models", "add", altered, "--name", ALTERED)
    with serving(sb) as srv:
        yield srv


def receipt(response):
    return {k: v for k, v in response.headers.items() if k.startswith("x-seedbar-")}


def chat(server, model=DEFAULT_MODEL, seed=5, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 12, "temperature": 0.9, "seed": seed, **extra}
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def test_every_reply_carries_its_receipt(server):
    response = chat(server)
    got = receipt(response)
    assert got["x-seedbar-seed"] == "5"
    assert got["x-seedbar-weights"] == sha256(default_gguf())
    assert got["x-seedbar-quantization"] == "Q4_1"
    assert got["x-seedbar-engine"].startswith("seedbar ")
    assert got["x-seedbar-backend"] == "cpu"
    assert got["x-seedbar-fingerprint"] == response.json()["system_fingerprint"]
    assert got["x-seedbar-fingerprint"].startswith("fp_")
    # The other routes say the same.
    for path, body in [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 16}),
        ("/api/chat", {"messages": [{"role": "user", "content": "Hi"}], "stream": False,
                       "options": {"num_predict": 2, "seed": 5}}),
    ]:
        other = httpx.post(f"{server.url}{path}", json={"model": DEFAULT_MODEL, **body}, timeout=120)
        assert other.status_code == 200, (path, other.text)
        mine = receipt(other)
        assert {k: v for k, v in mine.items() if k != "x-seedbar-seed"} == {
            k: v for k, v in got.items() if k != "x-seedbar-seed"}, path


def test_equal_seeds_give_equal_receipts_and_text_and_other_weights_another_fingerprint(server):
    first, again = chat(server, seed=11), chat(server, seed=11)
    assert receipt(first) == receipt(again)
    assert first.json()["choices"][0]["message"] == again.json()["choices"][0]["message"]
    other_seed = chat(server, seed=12)
    assert receipt(other_seed)["x-seedbar-fingerprint"] == receipt(first)["x-seedbar-fingerprint"]
    altered = chat(server, model=ALTERED, seed=11)
    assert receipt(altered)["x-seedbar-weights"] != receipt(first)["x-seedbar-weights"]
    assert altered.json()["system_fingerprint"] != first.json()["system_fingerprint"]


def test_a_chat_reply_keeps_its_receipt_in_the_store_and_the_export(server):
    with httpx.Client(base_url=server.url, timeout=120) as api:
        created = api.post("/app/conversations", json={"settings": {"seed": 21, "max_tokens": 8}})
        cid = created.json()["id"]
        with api.stream("POST", f"/app/conversations/{cid}/reply", json={"content": "Hi"}) as resp:
            assert resp.status_code == 200
            headers = receipt(resp)
            for _ in resp.iter_lines():
                pass
        stored = api.get(f"/app/conversations/{cid}").json()["messages"][-1]
        assert stored["seed"] == 21 and headers["x-seedbar-seed"] == "21"
        provenance = stored["provenance"]
        assert provenance == {
            "weights": sha256(default_gguf()),
            "quantization": "Q4_1",
            "engine": headers["x-seedbar-engine"],
            "backend": "cpu",
            "fingerprint": headers["x-seedbar-fingerprint"],
        }
        exported = api.get(f"/app/conversations/{cid}/export", params={"format": "json"}).json()
        assert exported["messages"][-1]["provenance"] == provenance
        markdown = api.get(f"/app/conversations/{cid}/export").text
        assert provenance["fingerprint"] in markdown


def test_an_exported_conversation_imports_and_replays_identically(server):
    with httpx.Client(base_url=server.url, timeout=300) as api:
        cid = api.post("/app/conversations", json={"settings": {"seed": 31, "max_tokens": 10,
                                                                "temperature": 0.9}}).json()["id"]
        for question in ["Name a fruit.", "And a vegetable?"]:
            with api.stream("POST", f"/app/conversations/{cid}/reply", json={"content": question}) as resp:
                assert resp.status_code == 200
                for _ in resp.iter_lines():
                    pass
        exported = api.get(f"/app/conversations/{cid}/export", params={"format": "json"}).json()

        imported = api.post("/app/conversations/import", json=exported)
        assert imported.status_code == 200, imported.text
        copy = imported.json()
        assert copy["id"] != cid and copy["settings"]["seed"] == 31
        stored = api.get(f"/app/conversations/{copy['id']}").json()["messages"]
        original = [dict(m) for m in exported["messages"]]
        keep = ("role", "content", "seed", "sampling", "provenance", "reasoning")
        assert [{k: m[k] for k in keep} for m in stored] == [{k: m[k] for k in keep} for m in original]

        replay = api.post(f"/app/conversations/{copy['id']}/replay").json()
        assert (replay["total"], replay["identical"]) == (2, 2), replay
        assert all(r["differences"] == [] for r in replay["replies"]), replay

        # Positive control: a reply changed after the fact does not replay as identical (the
        # last one: an earlier one would change the history of those after it too).
        exported["messages"][3]["content"] += " (edited)"
        edited = api.post("/app/conversations/import", json=exported).json()
        replay = api.post(f"/app/conversations/{edited['id']}/replay").json()
        assert (replay["total"], replay["identical"]) == (2, 1), replay
        assert [r["identical"] for r in replay["replies"]] == [True, False]
        assert replay["replies"][1]["content"] == original[3]["content"]

        # Another format is refused with the protocol's error.
        wrong = api.post("/app/conversations/import", json={**exported, "version": 9})
        assert wrong.status_code == 400 and "version 9" in wrong.json()["error"]["message"]


def test_weights_are_hashed_once_per_version_of_their_files(tmp_path):
    sb = Seedbar(tmp_path / "home")
    model = tmp_path / "model.gguf"
    shutil.copy(default_gguf(), model)
    sb.run("models", "add", model, "--name", DEFAULT_MODEL)
    real = sha256(model)
    kept = sb.home / "weights-digests.json"

    def weights():
        with serving(sb) as srv:
            return receipt(chat(srv))["x-seedbar-weights"]

    assert weights() == real
    digests = json.loads(kept.read_text())
    (path,) = [p for p, (_, digest) in digests.items() if digest == real]
    # Kept across restarts: a digest on record for these files' version is used, not rehashed.
    version, _ = digests[path]
    kept.write_text(json.dumps({path: [version, "sha256:" + "0" * 64]}))
    assert weights() == "sha256:" + "0" * 64
    # Files that changed (their time) are hashed again.
    os.utime(model, (time.time() + 5, time.time() + 5))
    assert weights() == real

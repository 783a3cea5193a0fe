"""Remote engines (#33): a model another engine serves, added to the library by URL and served
on every local route. The upstream here is a real second Seedbar process (its own store, an
API key), so every request crosses a real HTTP hop: the probe, the key, seeds passed through
(a seeded reply equals the upstream's own reply for that seed, alone and among other
requests), tools, cancellation upstream when the client goes, and the failures a remote
engine brings (down: 502, key refused: 401, silent: 504), each naming the upstream."""

import json
import os
import socket
import stat
import threading
import time

import anthropic
import httpx
import ollama
import openai
import pytest

from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving, wait_for

KEY = "sk-upstream-test"
REMOTE = "far-smol"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A second Seedbar, behind an API key."""
    sb = Seedbar(tmp_path_factory.mktemp("upstream") / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    with serving(sb, "--api-key", KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    sb = Seedbar(tmp_path_factory.mktemp("downstream") / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    return sb


@pytest.fixture(scope="module")
def server(home, upstream):
    """The local Seedbar, with the upstream added as REMOTE (keys in the file: no keychain
    on a test machine)."""
    with serving(home, env={"SEEDBAR_KEY_STORE": "file"}) as srv:
        added = httpx.post(f"{srv.url}/app/remotes", timeout=60,
                           json={"name": REMOTE, "url": upstream.base_url, "key": KEY})
        assert added.status_code == 201, added.text
        yield srv


def up_headers():
    return {"Authorization": f"Bearer {KEY}"}


def remotes_file(home):
    return json.loads((home.home / "remotes.json").read_text())


def chat_body(seed=11, **extra):
    return {"messages": [{"role": "user", "content": "Tell me a short story about a fox."}],
            "max_tokens": 24, "temperature": 0.9, "seed": seed, **extra}


def test_adding_probes_the_upstream_and_keeps_the_key_apart(server, upstream, home):
    listed = httpx.get(f"{server.url}/app/remotes", timeout=30).json()
    [remote] = [r for r in listed if r["name"] == REMOTE]
    assert remote["engine"] == "seedbar"
    assert remote["model"] == DEFAULT_MODEL, "the upstream's only model, found by the probe"
    assert remote["identical_seeds"] is True
    assert remote["has_key"] is True
    assert remote["owner"] == f"seedbar at 127.0.0.1:{upstream.port}"
    assert KEY not in json.dumps(listed)
    assert KEY not in (home.home / "remotes.json").read_text()
    keys = home.home / "remote-keys.json"
    assert json.loads(keys.read_text()) == {REMOTE: KEY}
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    models = {m["id"]: m["owned_by"] for m in httpx.get(f"{server.base_url}/models", timeout=30).json()["data"]}
    assert models[REMOTE] == f"remote: seedbar at 127.0.0.1:{upstream.port}"
    assert models[DEFAULT_MODEL] == "seedbar"
    tags = [m["name"] for m in httpx.get(f"{server.url}/api/tags", timeout=30).json()["models"]]
    assert REMOTE in tags
    shown = ollama.Client(host=server.url).show(REMOTE)
    assert "completion" in shown.capabilities and shown.details.family == "seedbar"


@pytest.mark.parametrize("body, status, words", [
    ({"key": "wrong"}, 401, ["upstream-bad", "401"]),
    ({}, 401, ["upstream-bad", "401"]),
    ({"key": KEY, "model": "no-such-model"}, 400, ["no model 'no-such-model'", DEFAULT_MODEL]),
    ({"key": KEY, "name": DEFAULT_MODEL}, 409, ["a local model is called"]),
    ({"key": KEY, "name": "two words"}, 400, ["not a model name"]),
    ({"key": KEY, "url": "ftp://x"}, 400, ["not an http"]),
])
def test_a_remote_that_cannot_be_added_is_refused_clearly(server, upstream, body, status, words):
    body = {"name": "upstream-bad", "url": upstream.base_url, **body}
    response = httpx.post(f"{server.url}/app/remotes", json=body, timeout=60)
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    for word in words:
        assert word in message, message
    names = [r["name"] for r in httpx.get(f"{server.url}/app/remotes", timeout=30).json()]
    assert names == [REMOTE]


def test_an_unreachable_upstream_is_refused_at_add_time(server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    response = httpx.post(f"{server.url}/app/remotes", timeout=60,
                          json={"name": "gone", "url": f"http://127.0.0.1:{dead}"})
    assert response.status_code == 502, response.text
    assert "'gone'" in response.json()["error"]["message"]
    assert "cannot be reached" in response.json()["error"]["message"]


def test_a_seeded_reply_is_the_upstreams_own_reply_for_that_seed(server, upstream):
    local = openai.OpenAI(base_url=server.base_url, api_key="unused")
    direct = openai.OpenAI(base_url=upstream.base_url, api_key=KEY)
    body = chat_body(seed=11)
    theirs = direct.chat.completions.create(model=DEFAULT_MODEL, **body)
    raw = local.chat.completions.with_raw_response.create(model=REMOTE, **body)
    ours = raw.parse()
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.model == REMOTE
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens > 0
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens
    assert raw.headers["x-seedbar-seed"] == "11"
    assert raw.headers["x-seedbar-backend"] == "remote"
    assert raw.headers["x-seedbar-remote"] == f"seedbar at {upstream.url}; seeds identical"
    assert raw.headers["x-seedbar-weights"] == f"remote:{DEFAULT_MODEL}"
    own = local.chat.completions.create(model=DEFAULT_MODEL, **body)
    assert ours.system_fingerprint != own.system_fingerprint
    # Streamed, the same text, token by token.
    pieces = [c.choices[0].delta.content or "" for c in local.chat.completions.create(
        model=REMOTE, stream=True, **body) if c.choices]
    assert len([p for p in pieces if p]) > 5
    assert "".join(pieces) == theirs.choices[0].message.content
    # Another seed, another reply; n choices take seed + k, as a local model's do.
    other = local.chat.completions.create(model=REMOTE, **chat_body(seed=12))
    assert other.choices[0].message.content != ours.choices[0].message.content
    two = local.chat.completions.create(model=REMOTE, n=2, **body)
    assert [c.message.content for c in two.choices] == [
        ours.choices[0].message.content, other.choices[0].message.content]


def test_a_seeded_reply_through_the_remote_is_the_same_among_other_requests(server):
    body = {"model": REMOTE, **chat_body(seed=21, max_tokens=32)}
    alone = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120).json()
    results = {}

    def run(i):
        other = {"model": REMOTE, **chat_body(seed=100 + i, max_tokens=40 + 4 * i)}
        other["messages"][0]["content"] = f"Write {i + 2} lines about rivers."
        results[i] = httpx.post(f"{server.base_url}/chat/completions", json=other, timeout=180)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    batched = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=180).json()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 for r in results.values())
    assert batched["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]


def test_every_protocol_serves_the_remote_model(server, upstream):
    direct = openai.OpenAI(base_url=upstream.base_url, api_key=KEY)
    # Ollama's defaults (temperature 0.8, top_p 0.9, top_k 40) go upstream as they are.
    reply = ollama.Client(host=server.url).chat(
        model=REMOTE, messages=[{"role": "user", "content": "Name a fruit."}],
        options={"seed": 3, "num_predict": 16})
    theirs = direct.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Name a fruit."}], seed=3,
        max_tokens=16, temperature=0.8, top_p=0.9, extra_body={"top_k": 40})
    assert reply.message.content == theirs.choices[0].message.content
    assert reply.prompt_eval_count == theirs.usage.prompt_tokens
    # Anthropic's messages, OpenAI's completions and Responses.
    message = anthropic.Anthropic(base_url=server.url, api_key="unused").messages.create(
        model=REMOTE, max_tokens=12, messages=[{"role": "user", "content": "Say hello."}])
    assert message.content[0].text and message.usage.input_tokens > 0
    completion = openai.OpenAI(base_url=server.base_url, api_key="unused").completions.create(
        model=REMOTE, prompt="The capital of France is", max_tokens=8, temperature=0, seed=1)
    upstream_completion = direct.completions.create(
        model=DEFAULT_MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, seed=1)
    assert completion.choices[0].text == upstream_completion.choices[0].text
    response = openai.OpenAI(base_url=server.base_url, api_key="unused").responses.create(
        model=REMOTE, input="Say hi.", max_output_tokens=12)
    assert response.output_text
    # What only a local model has is refused, saying why.
    refused = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "model": REMOTE, "logprobs": True, **chat_body()})
    assert refused.status_code == 400
    assert "remote engine" in refused.json()["error"]["message"]


def test_tools_and_formats_go_to_the_upstream(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}, "required": ["city"]}}}]
    reply = client.chat.completions.create(
        model=REMOTE, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40, seed=2)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)
    assert reply.choices[0].finish_reason == "tool_calls"
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    shaped = client.chat.completions.create(
        model=REMOTE, messages=[{"role": "user", "content": "A colour as JSON."}], max_tokens=40, seed=2,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert "colour" in json.loads(shaped.choices[0].message.content)


def test_a_client_that_goes_away_frees_the_upstreams_row(server, upstream):
    body = {"model": REMOTE, "stream": True, **chat_body(max_tokens=2000, temperature=1.0)}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert upstream.metrics(up_headers())["seedbar_running_rows"] >= 1
    upstream.wait_idle(timeout=10, headers=up_headers())


def write_remote(home, **fields):
    remotes = [r for r in remotes_file(home) if r["name"] != fields["name"]]
    remotes.append({"api": "openai", "model": DEFAULT_MODEL, "engine": "seedbar", **fields})
    (home.home / "remotes.json").write_text(json.dumps(remotes))


def test_upstream_failures_are_named_errors(server, upstream, home):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    write_remote(home, name="down", url=f"http://127.0.0.1:{dead}")
    write_remote(home, name="keyless", url=upstream.url)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as down:
        client.chat.completions.create(model="down", **chat_body())
    assert down.value.status_code == 502
    assert "'down'" in down.value.message and "cannot be reached" in down.value.message
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="keyless", stream=True, **chat_body())
    assert "'keyless'" in refused.value.message and "401" in refused.value.message
    # Ollama's shape on Ollama's routes.
    with pytest.raises(ollama.ResponseError) as down:
        ollama.Client(host=server.url).chat(model="down", messages=[{"role": "user", "content": "hi"}])
    assert down.value.status_code == 502 and "down" in down.value.error


def test_a_silent_upstream_times_out(server, home):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    try:
        write_remote(home, name="silent", url=f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=2)
        started = time.monotonic()
        response = httpx.post(f"{server.base_url}/chat/completions", timeout=30,
                              json={"model": "silent", **chat_body()})
        waited = time.monotonic() - started
        assert response.status_code == 504, response.text
        assert "'silent' sent nothing for 2 s" in response.json()["error"]["message"]
        assert 1.5 < waited < 10
    finally:
        listener.close()


def test_the_cli_adds_lists_and_removes_a_remote(server, upstream, home):
    env = home.env(UPKEY=KEY, SEEDBAR_KEY_STORE="file")
    added = home.run("models", "add-remote", "cli-smol", "--url", upstream.base_url,
                     "--key-env", "UPKEY", env=env)
    assert "cli-smol" in added.stdout and "seedbar at 127.0.0.1" in added.stdout
    assert "cli-smol" in home.run("models", env=env).stdout
    # The running server serves it at once.
    reply = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                       json={"model": "cli-smol", **chat_body(seed=11)})
    assert reply.status_code == 200, reply.text
    home.run("models", "rm-remote", "cli-smol", env=env)
    assert "cli-smol" not in json.loads((home.home / "remote-keys.json").read_text())
    gone = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                      json={"model": "cli-smol", **chat_body()})
    assert gone.status_code == 404
    bad = home.run("models", "add-remote", "x", "--url", upstream.base_url, check=False, env=env)
    assert bad.returncode != 0 and "401" in bad.stderr


def test_an_ollama_upstream_keeps_seeds_too(server, upstream):
    added = httpx.post(f"{server.url}/app/remotes", timeout=60, json={
        "name": "far-ollama", "url": upstream.url, "api": "ollama", "key": KEY})
    assert added.status_code == 201, added.text
    assert added.json()["engine"] == "seedbar" and added.json()["api"] == "ollama"
    try:
        ask = {"messages": [{"role": "user", "content": "Name a bird."}], "stream": False,
               "options": {"seed": 5, "num_predict": 16, "temperature": 0.9}}
        ours = httpx.post(f"{server.url}/api/chat", json={"model": "far-ollama", **ask}, timeout=60).json()
        theirs = httpx.post(f"{upstream.url}/api/chat", json={"model": DEFAULT_MODEL, **ask},
                            headers=up_headers(), timeout=60).json()
        assert ours["message"]["content"] == theirs["message"]["content"]
    finally:
        assert httpx.delete(f"{server.url}/app/remotes/far-ollama", timeout=30).status_code == 204


def test_a_conversation_on_a_remote_model_keeps_where_its_replies_ran(server, upstream):
    with httpx.Client(base_url=server.url, timeout=120) as api:
        created = api.post("/app/conversations", json={"settings": {"model": REMOTE, "seed": 21, "max_tokens": 12}})
        assert created.status_code == 200, created.text
        cid = created.json()["id"]
        texts = []
        for body in ({"content": "Hi"}, {"regenerate": True}):
            with api.stream("POST", f"/app/conversations/{cid}/reply", json=body) as resp:
                assert resp.status_code == 200
                assert resp.headers["x-seedbar-backend"] == "remote"
                events = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
            assert events[-1]["type"] == "done", events
            texts.append(api.get(f"/app/conversations/{cid}").json()["messages"][-1])
        first, again = texts
        assert first["content"] and first["content"] == again["content"], "the pinned seed, sent upstream"
        assert first["provenance"]["remote"] == {
            "engine": "seedbar", "url": upstream.url, "model": DEFAULT_MODEL, "identical_seeds": True}
        assert first["provenance"]["backend"] == "remote"
        exported = api.get(f"/app/conversations/{cid}/export", params={"format": "json"}).json()
        assert exported["messages"][-1]["provenance"]["remote"]["engine"] == "seedbar"
        # A remote that is not in the library is refused as the conversation's model.
        refused = api.patch(f"/app/conversations/{cid}", json={"settings": {"model": "nowhere"}})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "settings.model"

"""`seedbar serve` over raw HTTP (httpx): SSE and NDJSON framing, the seed header, the Ollama
routes, Host and CORS checks, API keys, body limits, errors, /health and /metrics, refusing to
bind beyond loopback without a key, client disconnects, a full queue, and graceful shutdown."""

import asyncio
import json
import re
import signal
import subprocess
import threading
import time

import httpx
import pytest

from conftest import BIN, DEFAULT_MODEL, Seedbar, default_gguf, serve_env, serving, start_server, wait_for

QUESTION = "What is the capital of France?"
POEM = "Write a short poem about the sea."
EOS_BAN = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: forces max_tokens tokens
CHUNK_FIELDS = ("id", "object", "created", "model", "system_fingerprint", "seed", "choices")


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def chat_body(text=QUESTION, **kwargs):
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    body.update(kwargs)
    return body


def assert_openai_error(resp, status, param=None):
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if param is not None:
        assert error["param"] == param, error
    return error


def sse_events(resp):
    """Reads a whole SSE body; checks its framing; returns the data payloads as strings."""
    assert resp.status_code == 200, resp.read()
    assert resp.headers["content-type"].startswith("text/event-stream"), resp.headers
    body = "".join(resp.iter_text())
    assert body.endswith("\n\n"), body[-200:]
    events = body[:-2].split("\n\n")
    payloads = []
    for event in events:
        lines = [line for line in event.split("\n") if line]
        assert len(lines) == 1, f"one data line per event, got {event!r}"
        assert lines[0].startswith("data: "), lines[0]
        payloads.append(lines[0][len("data: "):])
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    return payloads


def stream_chunks(http, path, body):
    with http.stream("POST", path, json=body) as resp:
        payloads = sse_events(resp)
        header_seed = resp.headers.get("x-seedbar-seed")
    chunks = [json.loads(p) for p in payloads[:-1]]
    return chunks, header_seed


# --- SSE and the seed header ----------------------------------------------------------------


def test_chat_sse_framing_and_chunk_fields(http):
    chunks, header_seed = stream_chunks(
        http, "/v1/chat/completions", chat_body(POEM, stream=True, stream_options={"include_usage": True})
    )
    assert len(chunks) >= 3
    for chunk in chunks:
        assert set(CHUNK_FIELDS) <= set(chunk), chunk
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"] == chunks[0]["id"]
        assert chunk["model"] == DEFAULT_MODEL
        assert isinstance(chunk["created"], int)
        assert isinstance(chunk["seed"], int) and chunk["seed"] == chunks[0]["seed"]
        assert isinstance(chunk["system_fingerprint"], str) and chunk["system_fingerprint"]
    assert header_seed is not None and int(header_seed) == chunks[0]["seed"]
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choices[:-1])
    assert with_choices[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices).strip()


def test_completions_sse_framing(http):
    body = {"model": DEFAULT_MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
            "stream": True, "seed": 5}
    chunks, header_seed = stream_chunks(http, "/v1/completions", body)
    assert header_seed == "5"
    for chunk in chunks:
        assert set(CHUNK_FIELDS) <= set(chunk), chunk
        assert chunk["object"] == "text_completion"
        assert chunk["seed"] == 5
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    whole = http.post("/v1/completions", json={**body, "stream": False}).json()
    assert text == whole["choices"][0]["text"] and text.strip()
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_seed_header_matches_body_seed(http):
    resp = http.post("/v1/chat/completions", json=chat_body(temperature=0.8, max_tokens=8))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert int(resp.headers["x-seedbar-seed"]) == body["seed"]
    pinned = http.post("/v1/chat/completions", json=chat_body(temperature=0.8, max_tokens=8, seed=424242))
    assert pinned.headers["x-seedbar-seed"] == "424242" and pinned.json()["seed"] == 424242
    legacy = http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 4})
    assert int(legacy.headers["x-seedbar-seed"]) == legacy.json()["seed"]


# --- Ollama ---------------------------------------------------------------------------------


def ndjson_lines(resp):
    assert resp.status_code == 200, resp.read()
    assert resp.headers["content-type"].startswith("application/x-ndjson"), resp.headers
    body = "".join(resp.iter_text())
    assert body.endswith("\n")
    lines = body.split("\n")[:-1]
    assert all(lines), f"blank NDJSON line in {body!r}"
    objs = [json.loads(line) for line in lines]
    assert objs[-1]["done"] is True
    assert all(o["done"] is False for o in objs[:-1])
    return objs


def ollama_final_ok(final, limit):
    assert final["model"] == DEFAULT_MODEL
    assert final["done_reason"] in ("stop", "length")
    assert isinstance(final["prompt_eval_count"], int) and final["prompt_eval_count"] > 0
    assert isinstance(final["eval_count"], int) and 0 < final["eval_count"] <= limit


def test_ollama_chat_ndjson(http):
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": POEM}],
            "options": {"seed": 7, "temperature": 0.8, "num_predict": 16}}
    texts = []
    for _ in range(2):
        with http.stream("POST", "/api/chat", json=body) as resp:  # stream defaults to true
            objs = ndjson_lines(resp)
        for o in objs[:-1]:
            assert o["model"] == DEFAULT_MODEL
            assert isinstance(o["created_at"], str) and o["created_at"]
            assert o["message"]["role"] == "assistant"
            assert isinstance(o["message"]["content"], str)
        ollama_final_ok(objs[-1], 16)
        texts.append("".join(o["message"]["content"] for o in objs))
    assert texts[0].strip()
    assert texts[0] == texts[1], "options.seed did not reproduce the reply"
    single = http.post("/api/chat", json={**body, "stream": False})
    assert single.status_code == 200, single.text
    obj = single.json()
    assert obj["done"] is True and obj["message"]["role"] == "assistant"
    assert obj["message"]["content"] == texts[0]
    ollama_final_ok(obj, 16)
    other = http.post("/api/chat", json={**body, "stream": False, "options": {**body["options"], "seed": 8}})
    assert other.json()["message"]["content"] != texts[0]


def test_ollama_generate_ndjson(http):
    body = {"model": DEFAULT_MODEL, "prompt": POEM, "options": {"seed": 3, "temperature": 0.8, "num_predict": 16}}
    texts = []
    for _ in range(2):
        with http.stream("POST", "/api/generate", json={**body, "stream": True}) as resp:
            objs = ndjson_lines(resp)
        assert all(isinstance(o["response"], str) for o in objs[:-1])
        ollama_final_ok(objs[-1], 16)
        texts.append("".join(o.get("response", "") for o in objs))
    assert texts[0].strip() and texts[0] == texts[1]
    single = http.post("/api/generate", json={**body, "stream": False})
    assert single.status_code == 200, single.text
    assert single.json()["done"] is True and single.json()["response"] == texts[0]


def test_ollama_tags_version_show(http):
    tags = http.get("/api/tags")
    assert tags.status_code == 200, tags.text
    assert DEFAULT_MODEL in [m["name"] for m in tags.json()["models"]]
    version = http.get("/api/version")
    assert version.status_code == 200
    assert isinstance(version.json()["version"], str) and version.json()["version"]
    show = http.post("/api/show", json={"model": DEFAULT_MODEL})
    assert show.status_code == 200, show.text
    details = show.json()
    assert isinstance(details, dict) and details
    assert "details" in details or "model_info" in details, details


def test_ollama_unknown_model_is_404(http):
    for path, body in [
        ("/api/chat", {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "stream": False}),
        ("/api/generate", {"model": "no-such-model", "prompt": "hi", "stream": False}),
        ("/api/show", {"model": "no-such-model"}),
    ]:
        resp = http.post(path, json=body)
        assert resp.status_code == 404, (path, resp.status_code, resp.text)
        err = resp.json()
        assert isinstance(err.get("error"), str) and err["error"], (path, err)


# --- Host header and CORS -------------------------------------------------------------------


def test_forged_host_is_403(http):
    for path in ("/v1/models", "/api/tags"):
        resp = http.get(path, headers={"Host": "evil.example"})
        assert resp.status_code == 403, (path, resp.status_code, resp.text)
    assert_openai_error(http.get("/v1/models", headers={"Host": "evil.example"}), 403)
    resp = http.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers={"Host": "evil.example:80"})
    assert_openai_error(resp, 403)


def test_loopback_hosts_are_allowed(http, server):
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}"):
        resp = http.get("/v1/models", headers={"Host": host})
        assert resp.status_code == 200, (host, resp.status_code, resp.text)


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type, authorization"}


def preflight(client, origin):
    return client.options("/v1/chat/completions", headers={"Origin": origin, **PREFLIGHT})


def test_cors_refused_by_default(http):
    resp = preflight(http, "http://evil.example")
    assert "access-control-allow-origin" not in resp.headers, dict(resp.headers)
    resp = http.get("/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in resp.headers, dict(resp.headers)


@pytest.fixture(scope="module")
def configured(seedbar):
    with serving(seedbar, "--allow-origin", "http://good.example", "--allow-host", "seedbar.test",
                 "--max-body-bytes", "4096") as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            yield srv, client


def test_cors_allowed_for_a_configured_origin(configured):
    _, client = configured
    good = "http://good.example"
    resp = preflight(client, good)
    assert resp.status_code in (200, 204), (resp.status_code, resp.text)
    assert resp.headers.get("access-control-allow-origin") == good, dict(resp.headers)
    assert "POST" in resp.headers.get("access-control-allow-methods", "").upper(), dict(resp.headers)
    # The actual requests, as the browser sends them after the preflight.
    resp = client.get("/v1/models", headers={"Origin": good})
    assert resp.status_code == 200, resp.text
    assert resp.headers.get("access-control-allow-origin") == good, dict(resp.headers)
    resp = client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers={"Origin": good})
    assert resp.status_code == 200, resp.text
    assert resp.headers.get("access-control-allow-origin") == good, dict(resp.headers)
    # Other origins stay refused: no allow header, and a 403 before any handler.
    resp = preflight(client, "http://evil.example")
    assert "access-control-allow-origin" not in resp.headers, dict(resp.headers)
    assert_openai_error(resp, 403)
    for resp in (
        client.get("/v1/models", headers={"Origin": "http://evil.example"}),
        client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers={"Origin": "http://evil.example"}),
    ):
        assert "access-control-allow-origin" not in resp.headers, dict(resp.headers)
        assert_openai_error(resp, 403)


def test_allow_host_adds_a_host_name(configured):
    srv, client = configured
    for host in (f"seedbar.test:{srv.port}", f"localhost:{srv.port}"):
        resp = client.get("/v1/models", headers={"Host": host})
        assert resp.status_code == 200, (host, resp.status_code, resp.text)
    assert_openai_error(client.get("/v1/models", headers={"Host": "evil.example"}), 403)


def test_max_body_bytes_flag(configured):
    _, client = configured
    resp = client.post("/v1/chat/completions", json=chat_body("x" * 8000))
    assert_openai_error(resp, 413)
    resp = client.post("/v1/chat/completions", json=chat_body("Hi", max_tokens=2))
    assert resp.status_code == 200, resp.text


# --- API key --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(seedbar):
    with serving(seedbar, "--api-key", "sekrit", "--allow-origin", "http://good.example") as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            yield srv, client


def test_api_key_required_except_health(keyed):
    _, client = keyed
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
        assert_openai_error(client.get("/v1/models", headers=headers), 401)
        assert_openai_error(client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=headers), 401)
        assert client.get("/metrics", headers=headers).status_code == 401
        assert client.get("/api/tags", headers=headers).status_code == 401
    assert client.get("/health").status_code == 200
    good = {"Authorization": "Bearer sekrit"}
    assert client.get("/v1/models", headers=good).status_code == 200
    assert client.get("/metrics", headers=good).status_code == 200
    assert client.get("/api/tags", headers=good).status_code == 200
    resp = client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=good)
    assert resp.status_code == 200, resp.text


def test_cors_preflight_needs_no_key(keyed):
    # Browsers never send credentials on a preflight.
    _, client = keyed
    resp = preflight(client, "http://good.example")
    assert resp.status_code in (200, 204), (resp.status_code, resp.text)
    assert resp.headers.get("access-control-allow-origin") == "http://good.example", dict(resp.headers)
    assert "authorization" in resp.headers.get("access-control-allow-headers", "").lower(), dict(resp.headers)


# --- errors ---------------------------------------------------------------------------------


def test_a_body_over_the_default_32_mib_is_413(http):
    # Requests carry images (20 MiB, base64): 32 MiB bodies are taken, larger ones are not.
    resp = http.post("/v1/chat/completions", json=chat_body("x" * (33 * 1024 * 1024)))
    assert_openai_error(resp, 413)
    # The unread rest of the body ends the connection: the client must not reuse it.
    assert resp.headers.get("connection") == "close", dict(resp.headers)


def test_malformed_json_is_400(http):
    resp = http.post("/v1/chat/completions", content=b'{"model": "x", "messages": [',
                     headers={"Content-Type": "application/json"})
    error = assert_openai_error(resp, 400)
    assert re.search(r"json|parse|eof|expected", error["message"], re.I), error


def test_unknown_route_is_404(http):
    assert_openai_error(http.get("/v1/nope"), 404)
    assert_openai_error(http.post("/nope", json={}), 404)


def test_unknown_model_is_404(http):
    error = assert_openai_error(http.post("/v1/chat/completions", json=chat_body(model="no-such-model")), 404)
    assert "no-such-model" in error["message"]


@pytest.mark.parametrize("param,value", [
    ("temperature", -1),
    ("temperature", 3),
    ("top_p", 1.5),
    ("max_tokens", -1),
    ("n", 0),
    ("presence_penalty", 5),
    ("frequency_penalty", -5),
    ("top_logprobs", 100),
    ("messages", "not a list"),
])
def test_bad_parameter_is_400_naming_it(http, param, value):
    body = chat_body(max_tokens=2)
    body[param] = value
    if param == "top_logprobs":
        body["logprobs"] = True
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, param=param)


def test_missing_messages_is_400(http):
    body = chat_body()
    del body["messages"]
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, param="messages")


# --- /health and /metrics -------------------------------------------------------------------

METRICS = ("seedbar_requests_total", "seedbar_generated_tokens_total", "seedbar_running_rows",
           "seedbar_queued_requests")
HISTOGRAMS = ("seedbar_time_to_first_token_seconds", "seedbar_inter_token_latency_seconds")


def test_health(http):
    resp = http.get("/health")
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok"


def test_metrics(http, server):
    before = server.metrics()
    resp = http.post("/v1/chat/completions", json=chat_body(POEM, max_tokens=12, logit_bias=EOS_BAN))
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 12
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain"), metrics.headers
    text = metrics.text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types.get("seedbar_running_rows") == "gauge", types
    assert types.get("seedbar_queued_requests") == "gauge", types
    assert types.get("seedbar_requests_total") == "counter" or types.get("seedbar_requests") == "counter", types
    for name in HISTOGRAMS:
        assert types.get(name) == "histogram", (name, types)
        for suffix in ("_bucket", "_sum", "_count"):
            assert re.search(rf"^{name}{suffix}[{{ ]", text, re.M), f"{name}{suffix} missing"
        assert re.search(rf'^{name}_bucket{{.*le="\+Inf".*}} ', text, re.M), f"{name} has no +Inf bucket"
    after = server.metrics()
    for name in METRICS:
        assert name in after, name
    assert after["seedbar_requests_total"] >= before["seedbar_requests_total"] + 1
    assert after["seedbar_generated_tokens_total"] >= before["seedbar_generated_tokens_total"] + 12
    assert after["seedbar_time_to_first_token_seconds_count"] >= before["seedbar_time_to_first_token_seconds_count"] + 1
    assert after["seedbar_inter_token_latency_seconds_count"] >= before["seedbar_inter_token_latency_seconds_count"] + 11
    assert after["seedbar_running_rows"] == 0 and after["seedbar_queued_requests"] == 0


def test_ready_line_is_the_only_stdout_output(server):
    # Besides `Chat UI at http://<addr>/` when a built chat UI is served (test_app_api.py).
    others = [line for line in server.stdout_lines if line != f"Chat UI at {server.url}/"]
    assert others == [], server.stdout_lines[:5]


# --- binding beyond loopback ----------------------------------------------------------------


def test_binding_beyond_loopback_without_key_exits_2(seedbar):
    proc = subprocess.run(
        [str(BIN), "serve", "--model", DEFAULT_MODEL, "--port", "0", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env=serve_env(seedbar), stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Seedbar serving" not in proc.stdout
    assert re.search(r"api.?key", proc.stderr, re.I), proc.stderr


# --- disconnects, a full queue, shutdown ----------------------------------------------------


def test_client_disconnect_frees_its_row(server):
    long = chat_body(POEM, max_tokens=400, logit_bias=EOS_BAN, stream=True)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        with client.stream("POST", "/v1/chat/completions", json=long) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            seen = 0
            for line in lines:
                if line.startswith("data: "):
                    seen += 1
                    if seen == 4:
                        break
            assert seen == 4
            assert server.metrics()["seedbar_running_rows"] >= 1
        # Leaving the block closes the connection mid-stream (about 396 tokens, ~20 s, left).
    start = time.monotonic()
    wait_for(lambda: server.metrics()["seedbar_running_rows"] == 0, timeout=10, interval=0.2,
             message="seedbar_running_rows 0 after the client went away")
    assert time.monotonic() - start < 10
    # The server still answers normally afterwards.
    resp = httpx.post(server.url + "/v1/chat/completions", json=chat_body(max_tokens=4), timeout=60)
    assert resp.status_code == 200


def test_full_queue_is_429(server):
    """16 rows run (CPU), 64 wait; beyond that requests are refused with 429 right away."""

    async def main():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as client:
            body = chat_body(POEM, max_tokens=8, logit_bias=EOS_BAN)
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(100)))

    responses = asyncio.run(main())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1, statuses
    # Whatever arrived while fewer than 64 were waiting must have been taken (in a burst the
    # rows may not have admitted any yet, so 64 is the guaranteed capacity).
    assert statuses.count(200) >= 64, statuses
    assert_openai_error(next(r for r in responses if r.status_code == 429), 429)
    server.wait_idle(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown_during_a_stream(seedbar, sig):
    srv = start_server(seedbar)
    try:
        received = []
        started = threading.Event()

        def reader():
            body = chat_body(POEM, max_tokens=120, logit_bias=EOS_BAN, stream=True)
            try:
                with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as resp:
                    for line in resp.iter_lines():
                        received.append(line)
                        if line.startswith("data: {"):
                            started.set()
            except httpx.HTTPError as exc:
                received.append(f"error: {exc!r}")
            finally:
                started.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        assert started.wait(60), "the stream never started"
        assert any(line.startswith("data: {") for line in received), received
        srv.process.send_signal(sig)
        start = time.monotonic()
        try:
            rc = srv.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"seedbar serve still running 10 s after {sig!r} during a stream")
        assert rc == 0, (rc, srv.stderr()[-3000:])
        assert time.monotonic() - start < 10
        thread.join(10)
        assert not thread.is_alive(), "the client stream was left hanging after the server exited"
        with pytest.raises(httpx.ConnectError):
            httpx.get(srv.url + "/health", timeout=5)
    finally:
        if srv.process.poll() is None:
            srv.process.kill()
            srv.process.wait()


def test_serve_takes_a_model_path_outside_the_store(tmp_path):
    """`--model PATH`: the GGUF is served under its file name from an empty store."""
    gguf = default_gguf()
    with serving(Seedbar(tmp_path / "empty-store"), model=str(gguf)) as srv:
        assert srv.model == gguf.stem
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [gguf.stem]
            body = {"model": gguf.stem, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == gguf.stem

"""Ollama parity on the shared server, through raw HTTP (httpx) and the `ollama` Python client:
/api/tags, /api/show and /api/ps computed from the model file (checked against the `gguf`
package's reading of it and its sha256), the final line's measured durations, /api/generate's
`context` (returned and accepted), and OpenAI's GET /v1/models/{id}."""

import hashlib
from collections import Counter
from datetime import datetime

import gguf
import httpx
import ollama
import pytest

from conftest import DEFAULT_MODEL, default_gguf

OPTIONS = {"seed": 5, "temperature": 0.8, "num_predict": 4}


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


def human(count):
    """Ollama's parameter size: 134.52M, 135M, 7.2B."""
    for unit, suffix, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if count >= unit:
            value = count / unit
            return f"{value:.0f}{suffix}" if value == int(value) else f"{value:.{decimals}f}{suffix}"
    return f"{count / 1e3:.0f}K"


@pytest.fixture(scope="module")
def expected():
    """What the GGUF file says, read by the `gguf` package."""
    path = default_gguf()
    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.get_field(key)
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types[0] == gguf.GGUFValueType.STRING else int(value[0])

    by_type = Counter()
    for tensor in reader.tensors:
        if len(tensor.shape) >= 2:
            by_type[tensor.tensor_type.name] += int(tensor.n_elements)
    arch = field("general.architecture")
    return {
        "arch": arch,
        "basename": field("general.basename"),
        "params": sum(int(t.n_elements) for t in reader.tensors),
        "quantization": by_type.most_common(1)[0][0],
        "embedding_length": field(f"{arch}.embedding_length"),
        "block_count": field(f"{arch}.block_count"),
        "context_length": field(f"{arch}.context_length"),
        "digest": "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest(),
        "size": path.stat().st_size,
    }


def test_tags_details_come_from_the_file(http, client, expected):
    entry = next(m for m in http.get("/api/tags").json()["models"] if m["name"] == DEFAULT_MODEL)
    assert entry["digest"] == expected["digest"]
    assert entry["size"] == expected["size"]
    assert entry["details"] == {
        "parent_model": "",
        "format": "gguf",
        "family": expected["arch"],
        "families": [expected["arch"]],
        "parameter_size": human(expected["params"]),
        "quantization_level": expected["quantization"],
    }
    assert expected["quantization"] == "Q4_1" and human(expected["params"]) == "134.52M"
    listed = next(m for m in client.list().models if m.model == DEFAULT_MODEL)
    assert (listed.details.family, listed.details.quantization_level) == (expected["arch"], "Q4_1")
    assert listed.digest == expected["digest"]


def test_show_reads_the_model(http, client, expected):
    show = http.post("/api/show", json={"model": DEFAULT_MODEL}).json()
    info, arch = show["model_info"], expected["arch"]
    assert info["general.architecture"] == arch
    assert info["general.basename"] == expected["basename"]
    assert info["general.parameter_count"] == expected["params"]
    assert info[f"{arch}.context_length"] == min(8192, expected["context_length"])
    assert info[f"{arch}.embedding_length"] == expected["embedding_length"]
    assert info[f"{arch}.block_count"] == expected["block_count"]
    # SmolLM2's template does not read `tools` and its vocabulary has no FIM tokens.
    assert show["capabilities"] == ["completion"]
    assert show["details"]["parameter_size"] == human(expected["params"])
    shown = client.show(DEFAULT_MODEL)
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo["general.parameter_count"] == expected["params"]


def test_final_lines_carry_measured_durations(http, client):
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "options": OPTIONS}
    with http.stream("POST", "/api/chat", json=body) as resp:
        lines = [line for line in resp.iter_lines() if line]
    final = httpx.Response(200, content=lines[-1]).json()
    for key in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(final[key], int) and final[key] > 0, (key, final)
    assert isinstance(final["load_duration"], int) and final["load_duration"] >= 0
    assert final["total_duration"] >= final["prompt_eval_duration"] + final["eval_duration"]
    assert 0 < final["eval_count"] <= 4 and final["prompt_eval_count"] > 0
    reply = client.chat(model=DEFAULT_MODEL, messages=body["messages"], options=OPTIONS)
    assert reply.done and reply.eval_duration > 0 and reply.prompt_eval_duration > 0
    assert reply.total_duration >= reply.eval_duration


def test_generate_returns_and_accepts_context(http, client):
    first = http.post("/api/generate", json={"model": DEFAULT_MODEL, "prompt": "Hi", "stream": False,
                                             "options": OPTIONS}).json()
    context = first["context"]
    assert all(isinstance(t, int) for t in context)
    assert len(context) == first["prompt_eval_count"] + first["eval_count"]
    with http.stream("POST", "/api/generate", json={"model": DEFAULT_MODEL, "prompt": "Hi",
                                                    "options": OPTIONS}) as resp:
        lines = [line for line in resp.iter_lines() if line]
    streamed = httpx.Response(200, content=lines[-1]).json()
    assert streamed["context"] == context, "the same seed gives the same tokens, streamed or not"
    raw = {"model": DEFAULT_MODEL, "prompt": " And then?", "raw": True, "stream": False, "options": OPTIONS}
    alone = http.post("/api/generate", json=raw).json()
    continued = http.post("/api/generate", json={**raw, "context": context}).json()
    assert continued["prompt_eval_count"] == alone["prompt_eval_count"] + len(context)
    assert continued["context"][: len(context)] == context
    reply = client.generate(model=DEFAULT_MODEL, prompt=" And then?", raw=True, context=context, options=OPTIONS)
    assert reply.context == continued["context"]


def test_ps_lists_the_loaded_model(http, client, expected):
    running = next(m for m in http.get("/api/ps").json()["models"] if m["name"] == DEFAULT_MODEL)
    assert running["size"] == expected["size"] and running["size_vram"] == 0
    assert running["digest"] == expected["digest"]
    assert running["details"]["family"] == expected["arch"]
    datetime.fromisoformat(running["expires_at"].replace("Z", "+00:00"))
    assert [m.model for m in client.ps().models] == [DEFAULT_MODEL]


def test_pulling_a_model_the_store_holds_succeeds_at_once(http, client):
    # What clients do with a name from /api/tags (Open WebUI's "update", `ollama pull`).
    for name in (DEFAULT_MODEL, DEFAULT_MODEL.lower() + ":latest"):
        assert client.pull(name).status == "success"
        streamed = [p.status for p in client.pull(name, stream=True)]
        assert streamed == ["pulling manifest", "success"], streamed
    assert http.get("/app/models/pulls").json() == [], "nothing was downloaded"


def test_openai_model_object(http):
    resp = http.get(f"/v1/models/{DEFAULT_MODEL}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["id"], body["object"], body["owned_by"]) == (DEFAULT_MODEL, "model", "seedbar")
    assert isinstance(body["created"], int)
    missing = http.get("/v1/models/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"

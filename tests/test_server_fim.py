"""Fill-in-the-middle through `/v1/completions` (`suffix`) and `/api/generate`, on a
random-weight checkpoint whose vocabulary has FIM tokens, installed next to SmolLM2 in a store
of its own and loaded by the running server (serving SmolLM2) on first use. The reply must equal mlx-lm's greedy continuation of the
prompt <fim_prefix>PREFIX<fim_suffix>SUFFIX<fim_middle> on the same weights."""

import shutil

import httpx
import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

from checkpoints import FIM_TOKENS, VOCAB, write_checkpoint
from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving

PREFIX, SUFFIX, TOKENS = "def add(a, b):\n    ", "\n    return total\n", 12
# Keep the random model to printable ASCII (and away from EOS and the FIM tokens), so the
# reply compares as text: the same additive bias on both sides.
BANNED = [t for t in range(VOCAB + len(FIM_TOKENS)) if not 32 <= t < 127]
LOGIT_BIAS = {str(t): -100 for t in BANNED}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """SmolLM2 and `tiny-fim`, the checkpoint."""
    store = Seedbar(tmp_path_factory.mktemp("fim-store"))
    store.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    ckpt = write_checkpoint(tmp_path_factory.mktemp("fim") / "ckpt", "llama", fim=True)
    shutil.copytree(ckpt, store.home / "models" / "tiny-fim")
    return store


@pytest.fixture(scope="module")
def server(store):
    with serving(store) as srv:
        yield srv


@pytest.fixture(scope="module")
def fim_model(store):
    """The checkpoint's name and the middle mlx-lm writes for the FIM prompt."""
    ckpt = store.home / "models" / "tiny-fim"
    model, _ = load(str(ckpt))
    ids = [VOCAB] + list(PREFIX.encode()) + [VOCAB + 1] + list(SUFFIX.encode()) + [VOCAB + 2]
    out, x = [], mx.array([ids])
    cache = make_prompt_cache(model)
    bias = mx.zeros((VOCAB + len(FIM_TOKENS),))
    bias[mx.array(BANNED)] = -100.0
    for _ in range(TOKENS):
        logits = model(x, cache=cache)[:, -1, :].astype(mx.float32) + bias
        token = int(mx.argmax(logits, axis=-1).item())
        out.append(token)
        x = mx.array([[token]])
    return {"name": "tiny-fim", "prompt_tokens": len(ids), "expected": bytes(out).decode()}


def test_suffix_fills_the_middle_like_mlx_lm(server, fim_model):
    body = {"model": fim_model["name"], "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": TOKENS,
            "temperature": 0, "logit_bias": LOGIT_BIAS}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["model"] == "tiny-fim"
    assert reply["usage"]["prompt_tokens"] == fim_model["prompt_tokens"]
    assert reply["choices"][0]["text"] == fim_model["expected"]
    models = httpx.get(server.url + "/api/tags", timeout=30).json()["models"]
    assert {m["name"] for m in models} == {"tiny-fim", DEFAULT_MODEL}


def test_ollama_generate_takes_a_suffix_too(server, fim_model):
    body = {"model": fim_model["name"], "prompt": PREFIX, "suffix": SUFFIX, "stream": False,
            "options": {"temperature": 0, "num_predict": 4}}
    r = httpx.post(server.url + "/api/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == fim_model["prompt_tokens"]
    assert r.json()["eval_count"] == 4


def test_a_model_without_fim_tokens_refuses_suffix(server):
    body = {"model": DEFAULT_MODEL, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "suffix" and "fill-in-the-middle" in error["message"]


def test_ollama_reports_insert_for_fim_models_and_reads_safetensors_folders(server, store, fim_model):
    show = httpx.post(server.url + "/api/show", json={"model": fim_model["name"]}, timeout=120).json()
    assert show["capabilities"][0] == "completion" and "insert" in show["capabilities"], show["capabilities"]
    plain = httpx.post(server.url + "/api/show", json={"model": DEFAULT_MODEL}, timeout=120).json()
    assert "insert" not in plain["capabilities"]
    weights = mx.load(str(store.home / "models" / "tiny-fim" / "model.safetensors"))
    params = sum(w.size for w in weights.values())
    assert show["model_info"]["general.parameter_count"] == params
    assert show["model_info"]["general.architecture"] == "llama"
    tags = httpx.get(server.url + "/api/tags", timeout=120).json()["models"]
    details = next(m for m in tags if m["name"] == fim_model["name"])["details"]
    dtypes = {str(w.dtype).split(".")[-1] for w in weights.values() if w.ndim >= 2}
    assert details["format"] == "safetensors" and details["family"] == "llama"
    assert details["quantization_level"] == {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtypes.pop()]

"""Embeddings end to end with the real all-MiniLM-L6-v2: `POST /v1/embeddings` through the
`openai` SDK (its default base64 path and `encoding_format="float"`), batches and token-id
inputs, Ollama's `/api/embed` and `/api/embeddings`, errors; and parity with an independent
numpy BERT (mean pooling + normalize) on the same safetensors and tokenizer.json."""


import httpx
import numpy as np
import ollama
import pytest
from openai import OpenAI
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from bert_reference import ReferenceBert
from conftest import DEFAULT_MODEL, EMBEDDING_MODEL, Seedbar, default_gguf, embedding_model_dir, serving

SENTENCES = [
    "The cat sits on the mat.",
    "A feline is resting on a rug.",
    "Quarterly revenue grew by twelve percent, driven by cloud services.",
    "How do I reset my password?",
    "Ünïcödé, emoji 🚀 and numbers 3.14159 — all in one line!",
]
MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server whose store holds the chat model and the embedding model."""
    sb = Seedbar(tmp_path_factory.mktemp("embed-store"))
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    sb.run("models", "add", embedding_model_dir(), "--name", EMBEDDING_MODEL)
    with serving(sb) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer.from_file(str(embedding_model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def embed_float(client, inputs):
    reply = client.embeddings.create(model=EMBEDDING_MODEL, input=inputs, encoding_format="float")
    return [np.array(d.embedding) for d in reply.data]


def test_parity_with_a_numpy_reference_on_the_same_weights(client, tokenizer):
    reference = ReferenceBert(embedding_model_dir())
    got = embed_float(client, SENTENCES)
    cosines = [cosine(g, reference(tokenizer.encode(s).ids)) for g, s in zip(got, SENTENCES)]
    print("parity cosines:", " ".join(f"{c:.10f}" for c in cosines))
    assert min(cosines) >= 0.9999, cosines
    for vector in got:
        assert vector.shape == (384,)
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-5


def test_the_sdk_default_base64_path_decodes_to_the_float_vectors(client, tokenizer):
    reply = client.embeddings.create(model=EMBEDDING_MODEL, input=SENTENCES[:3])
    assert reply.object == "list" and reply.model == EMBEDDING_MODEL
    assert [d.index for d in reply.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in reply.data)
    tokens = sum(len(tokenizer.encode(s).ids) for s in SENTENCES[:3])
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (tokens, tokens)
    floats = embed_float(client, SENTENCES[:3])
    for d, f in zip(reply.data, floats):
        np.testing.assert_allclose(np.array(d.embedding), f, rtol=0, atol=1e-7)


def test_base64_is_little_endian_f32(http):
    import base64

    body = {"model": EMBEDDING_MODEL, "input": "hello", "encoding_format": "base64"}
    raw = http.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    as_float = http.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    decoded = np.frombuffer(base64.b64decode(raw), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(as_float["data"][0]["embedding"], dtype=np.float32))


def test_batches_token_ids_and_token_lists_match_single_texts(client, tokenizer):
    alone = [embed_float(client, s)[0] for s in SENTENCES[:3]]
    batched = embed_float(client, SENTENCES[:3])
    ids = [tokenizer.encode(s).ids for s in SENTENCES[:3]]
    one_list = embed_float(client, ids[1])[0]
    token_lists = embed_float(client, ids)
    for a, b, t in zip(alone, batched, token_lists):
        assert np.abs(a - b).max() <= 1e-5
        assert np.abs(a - t).max() <= 1e-5
    assert np.abs(one_list - alone[1]).max() <= 1e-5


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(client):
    cat, paraphrase, revenue = embed_float(client, SENTENCES[:3])
    assert cosine(cat, paraphrase) > cosine(cat, revenue) + 0.3


def test_ollama_embed_and_the_older_embeddings_route(http, client):
    floats = embed_float(client, SENTENCES[:2])
    many = http.post("/api/embed", json={"model": EMBEDDING_MODEL, "input": SENTENCES[:2]})
    assert many.status_code == 200, many.text
    body = many.json()
    assert body["model"] == EMBEDDING_MODEL and len(body["embeddings"]) == 2
    assert body["prompt_eval_count"] > 0 and body["total_duration"] >= body["load_duration"] >= 0
    for got, want in zip(body["embeddings"], floats):
        assert np.abs(np.array(got) - want).max() <= 1e-5
    one = http.post("/api/embed", json={"model": EMBEDDING_MODEL + ":latest", "input": SENTENCES[0]}).json()
    assert len(one["embeddings"]) == 1
    legacy = http.post("/api/embeddings", json={"model": EMBEDDING_MODEL, "prompt": SENTENCES[0]})
    assert legacy.status_code == 200 and set(legacy.json()) == {"embedding"}
    assert np.abs(np.array(legacy.json()["embedding"]) - floats[0]).max() <= 1e-5


def test_ollama_show_tags_and_client_know_the_embedding_model(http, server):
    show = http.post("/api/show", json={"model": EMBEDDING_MODEL}).json()
    assert show["capabilities"] == ["embedding"]
    assert show["model_info"]["general.architecture"] == "bert"
    weights = load_file(str(embedding_model_dir() / "model.safetensors"))
    assert show["model_info"]["general.parameter_count"] == sum(w.size for w in weights.values())
    assert show["model_info"]["bert.embedding_length"] == 384
    tag = next(m for m in http.get("/api/tags").json()["models"] if m["name"] == EMBEDDING_MODEL)
    assert (tag["details"]["family"], tag["details"]["format"]) == ("bert", "safetensors")
    assert tag["digest"].startswith("sha256:") and len(tag["digest"]) == 71
    reply = ollama.Client(host=server.url, timeout=120).embed(model=EMBEDDING_MODEL, input=SENTENCES[0])
    assert len(reply.embeddings) == 1 and len(reply.embeddings[0]) == 384


def test_long_inputs_follow_the_length_rule(http):
    long_text = "word " * 400  # ~400 tokens, over the 256 limit
    refused = http.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": long_text})
    assert refused.status_code == 400 and "at most 256" in refused.json()["error"]["message"]
    cut = http.post("/api/embed", json={"model": EMBEDDING_MODEL, "input": long_text}).json()
    assert cut["prompt_eval_count"] == MAX_TOKENS
    strict = http.post("/api/embed", json={"model": EMBEDDING_MODEL, "input": long_text, "truncate": False})
    assert strict.status_code == 400 and "at most 256" in strict.json()["error"]


OPENAI_ERRORS = [
    ({"input": ""}, 400, "empty string"),
    ({"input": []}, 400, "nothing to embed"),
    ({"input": [[]]}, 400, "empty list of tokens"),
    ({"input": ["ok", ""]}, 400, "input 1 is an empty string"),
    ({"input": {"text": "x"}}, 400, "a string, an array of strings"),
    ({"input": [1, -2]}, 400, "a string, an array of strings"),
    ({"input": [999999]}, 400, "outside the vocabulary"),
    ({"input": "x", "dimensions": 128}, 400, "384 dimensions, not 128"),
    ({"input": "x", "encoding_format": "int8"}, 400, "unknown variant"),
    ({"input": "x", "model": DEFAULT_MODEL}, 400, "is a chat model and makes no embeddings"),
    ({"input": "x", "model": "no-such-model"}, 404, "does not exist"),
    ({"model": EMBEDDING_MODEL}, 400, "missing required parameter 'input'"),
]


@pytest.mark.parametrize("body,status,message", OPENAI_ERRORS, ids=[m for _, _, m in OPENAI_ERRORS])
def test_openai_errors_say_why(http, body, status, message):
    reply = http.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, **body})
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]["message"], reply.text


def test_chat_models_and_embedding_models_stay_apart(http, client):
    ids = [m.id for m in client.models.list().data]
    assert EMBEDDING_MODEL in ids and DEFAULT_MODEL in ids
    chat = http.post("/v1/chat/completions",
                     json={"model": EMBEDDING_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "is an embedding model" in chat.json()["error"]["message"]
    ollama_chat = http.post("/api/chat", json={"model": EMBEDDING_MODEL, "messages": []})
    assert ollama_chat.status_code == 400 and "is an embedding model" in ollama_chat.json()["error"]
    ollama_embed = http.post("/api/embed", json={"model": DEFAULT_MODEL, "input": "x"})
    assert ollama_embed.status_code == 400 and "is a chat model" in ollama_embed.json()["error"]
    empty = http.post("/api/embed", json={"model": EMBEDDING_MODEL, "input": [""]})
    assert empty.status_code == 400 and "empty string" in empty.json()["error"]
    legacy = http.post("/api/embeddings", json={"model": EMBEDDING_MODEL})
    assert legacy.status_code == 400 and "prompt" in legacy.json()["error"]

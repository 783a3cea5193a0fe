"""Reranking with a cross-encoder: a random-weight BERT with a one-label classification head
(`BertForSequenceClassification`'s weight names, a WordPiece tokenizer whose post-processor
builds `[CLS] query [SEP] document [SEP]`), served at `/v1/rerank` (and llama-server's other
paths) in the shape Jina's and Cohere's clients parse; every score equals an independent
numpy BERT's sigmoid within 1e-4, a pair past the model's positions is cut as documented, and
a model that is not a reranker is a 400 that names the rerankers."""

import json

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from bert_reference import ReferenceBert
from conftest import DEFAULT_MODEL, Seedbar, default_gguf, serving

RERANKER = "tiny-reranker"
HEADS = 4
MAX_POSITIONS = 48
QUERY = "how do plants make food"
DOCUMENTS = [
    "plants make food from light water and air",
    "the train leaves at nine",
    {"text": "photosynthesis turns light into sugar in leaves"},
    "cats sleep most of the day " * 6,  # past MAX_POSITIONS with the query: cut
]


def write_cross_encoder(directory, seed=0):
    """A tiny random cross-encoder checkpoint as transformers lays one out."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", *letters, *(f"##{c}" for c in letters), "plants", "food", "light"]
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tokenizer.decoder = decoders.WordPiece()
    d, ff, layers = 32, 64, 2
    config = {
        "architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": len(vocab),
        "hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": HEADS, "intermediate_size": ff,
        "max_position_embeddings": MAX_POSITIONS, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
        "hidden_act": "gelu", "pad_token_id": 0, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
    }
    rng = np.random.default_rng(seed)
    shapes = {
        "bert.embeddings.word_embeddings.weight": (len(vocab), d),
        "bert.embeddings.position_embeddings.weight": (MAX_POSITIONS, d),
        "bert.embeddings.token_type_embeddings.weight": (2, d),
        "bert.pooler.dense.weight": (d, d), "bert.pooler.dense.bias": (d,),
        "classifier.weight": (1, d), "classifier.bias": (1,),
    }
    for i in range(layers):
        p = f"bert.encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes |= {f"{p}.{name}.weight": (d, d), f"{p}.{name}.bias": (d,)}
        shapes |= {f"{p}.intermediate.dense.weight": (ff, d), f"{p}.intermediate.dense.bias": (ff,),
                   f"{p}.output.dense.weight": (d, ff), f"{p}.output.dense.bias": (d,)}
    norms = ["bert.embeddings.LayerNorm"] + [f"bert.encoder.layer.{i}.{n}" for i in range(layers)
                                            for n in ("attention.output.LayerNorm", "output.LayerNorm")]
    weights = {name: (rng.standard_normal(shape) * 0.3).astype(np.float32) for name, shape in shapes.items()}
    for norm in norms:
        weights[f"{norm}.weight"] = (1 + rng.standard_normal(d) * 0.1).astype(np.float32)
        weights[f"{norm}.bias"] = (rng.standard_normal(d) * 0.1).astype(np.float32)
    directory.mkdir(parents=True)
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_cross_encoder(tmp_path_factory.mktemp("rerank") / "reranker")


@pytest.fixture(scope="module")
def server(tmp_path_factory, checkpoint):
    sb = Seedbar(tmp_path_factory.mktemp("rerank-store") / "home")
    sb.run("models", "add", default_gguf(), "--name", DEFAULT_MODEL)
    sb.run("models", "add", checkpoint, "--name", RERANKER)
    with serving(sb) as srv:
        yield srv


def reference_scores(checkpoint):
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    bert = ReferenceBert(checkpoint, heads=HEADS)
    scores, tokens = [], 0
    for document in DOCUMENTS:
        text = document["text"] if isinstance(document, dict) else document
        encoding = tokenizer.encode(QUERY, text)
        ids, types = encoding.ids, encoding.type_ids
        if len(ids) > MAX_POSITIONS:  # cut at the end, the closing [SEP] kept
            ids, types = ids[: MAX_POSITIONS - 1] + ids[-1:], types[: MAX_POSITIONS - 1] + types[-1:]
        tokens += len(ids)
        scores.append(bert.relevance(ids, types))
    return scores, tokens


def test_scores_equal_a_reference_and_come_best_first(server, checkpoint):
    expected, tokens = reference_scores(checkpoint)
    assert len(set(np.round(expected, 3))) == len(expected), "the documents score apart"
    reply = httpx.post(f"{server.url}/v1/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "return_documents": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    for result in results:
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-4, (result, expected)
        document = DOCUMENTS[result["index"]]
        assert result["document"] == {"text": document["text"] if isinstance(document, dict) else document}
    assert body["model"] == RERANKER
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_the_library_says_which_model_reranks(server):
    listed = {m["name"]: m["capabilities"] for m in httpx.get(f"{server.url}/app/models", timeout=60).json()}
    assert listed[RERANKER] == ["rerank"]
    assert "completion" in listed[DEFAULT_MODEL] and "rerank" not in listed[DEFAULT_MODEL]


def test_llama_servers_paths_and_top_n(server, checkpoint):
    expected, _ = reference_scores(checkpoint)
    best = max(range(len(expected)), key=lambda i: expected[i])
    for path in ("/rerank", "/v1/reranking", "/reranking"):
        body = httpx.post(f"{server.url}{path}", timeout=60, json={
            "model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 1}).json()
        assert [r["index"] for r in body["results"]] == [best], (path, body)
        assert "document" not in body["results"][0]


@pytest.mark.parametrize("body, param, words", [
    ({"model": DEFAULT_MODEL, "query": QUERY, "documents": ["x"]}, "model", f"rerankers: {RERANKER}"),
    ({"model": RERANKER, "query": QUERY, "documents": []}, "documents", "must not be empty"),
    ({"model": RERANKER, "query": " ", "documents": ["x"]}, "query", "must not be empty"),
    ({"model": RERANKER, "query": QUERY, "documents": ["x"], "top_n": 0}, "top_n", "at least 1"),
])
def test_bad_requests_are_400s_naming_the_field(server, body, param, words):
    reply = httpx.post(f"{server.url}/v1/rerank", timeout=60, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_reranker_is_not_a_chat_model_and_says_what_it_is(server):
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": RERANKER, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "is a reranker: it answers /v1/rerank" in chat.text, chat.text
    show = httpx.post(f"{server.url}/api/show", timeout=60, json={"model": RERANKER}).json()
    assert show["capabilities"] == ["rerank"]

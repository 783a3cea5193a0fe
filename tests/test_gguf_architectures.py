"""GGUF beyond llama: a random-weight GGUF of each architecture (written with the `gguf`
package as llama.cpp's converter lays it out) gives the logits and greedy tokens of the same
weights as safetensors; SentencePiece vocabularies (`llama`, `gemma`) from GGUF metadata
tokenize as the SentencePiece library does on the same pieces and scores."""

import json

import gguf
import mlx.core as mx
import numpy as np
import pytest

from checkpoints import write_checkpoint
from gguf_checkpoints import SPM_TOKENS, SPM_VOCAB, write_gguf

PROMPT = [5, 17, 99, 3, 200, 42, 42, 7, 128, 64, 1, 250]
TEXT = "hello the world in the sea, é!  two  spaces"


def logits_and_tokens(seedbar, model, tmp_path):
    out = tmp_path / "logits.safetensors"
    result = seedbar.probe(str(model), ids=PROMPT, generate=16, logits_out=str(out))
    return np.array(mx.load(str(out))["logits"]), result["generated"]


@pytest.mark.parametrize(
    "arch,tokenizer",
    [
        ("mistral", "llama"),
        ("qwen2", "gpt2"),
        ("qwen3", "gpt2"),
        ("gemma3_gguf", "gemma"),
        ("phi3_longrope", "llama"),
    ],
)
def test_gguf_matches_the_same_weights_as_safetensors(seedbar, tmp_path, arch, tokenizer):
    vocab = SPM_VOCAB if tokenizer != "gpt2" else None
    checkpoint = write_checkpoint(tmp_path / "ckpt", arch, vocab_size=vocab)
    gguf_file = write_gguf(checkpoint, tmp_path / "model.gguf", tokenizer)
    expected, expected_tokens = logits_and_tokens(seedbar, checkpoint, tmp_path)
    logits, tokens = logits_and_tokens(seedbar, gguf_file, tmp_path)
    max_diff = np.abs(logits - expected).max()
    assert max_diff < 1e-4 * max(1.0, np.abs(expected).max()), f"max |Δlogit| {max_diff}"
    assert tokens == expected_tokens


def sentencepiece_reference(gguf_file, kind):
    """The real SentencePiece library over the GGUF's pieces, scores and types, normalizing
    as the GGUF says (a space before the text for `llama`)."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as proto

    fields = gguf.GGUFReader(str(gguf_file)).fields
    model = proto.ModelProto()
    model.trainer_spec.model_type = proto.TrainerSpec.BPE
    model.trainer_spec.byte_fallback = True
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = bool(fields["tokenizer.ggml.add_space_prefix"].contents())
    model.normalizer_spec.remove_extra_whitespaces = False
    model.normalizer_spec.escape_whitespaces = True
    for piece, score, kind_of in zip(
        fields["tokenizer.ggml.tokens"].contents(),
        fields["tokenizer.ggml.scores"].contents(),
        fields["tokenizer.ggml.token_type"].contents(),
    ):
        model.pieces.add(piece=piece, score=score, type=kind_of)
    return sentencepiece.SentencePieceProcessor(model_proto=model.SerializeToString())


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_sentencepiece_vocabulary_tokenizes_as_sentencepiece_does(seedbar, tmp_path, kind):
    checkpoint = write_checkpoint(tmp_path / "ckpt", "llama", vocab_size=SPM_VOCAB)
    gguf_file = write_gguf(checkpoint, tmp_path / "model.gguf", kind)
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps([TEXT]))
    probe = seedbar.probe(str(gguf_file), texts=str(texts))
    expected = sentencepiece_reference(gguf_file, kind).encode(TEXT)
    assert probe["encoded"][0] == expected
    assert probe["decoded"][0] == TEXT
    # Merged pieces and byte fallback both show ("▁world" is one token, "é" two bytes).
    pieces = [SPM_TOKENS[i] for i in expected]
    assert "▁world" in pieces and ["<0xC3>", "<0xA9>"] == pieces[pieces.index("<0xC3>") :][:2]

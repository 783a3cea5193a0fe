"""GGUF beyond llama: a random-weight GGUF of each architecture (written with the `gguf`
package as llama.cpp's converter lays it out) gives the logits and greedy tokens of the same
weights as safetensors; K-quant tensors load as the `gguf` package's reference dequantizer
reads them, or are refused with advice where MLX's loader misreads or cannot read them;
SentencePiece vocabularies (`llama`, `gemma`) from GGUF metadata
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
    checkpoint = write_checkpoint(tmp_path / "ckpt", arch, overrides=vocab and {"vocab_size": vocab})
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
    checkpoint = write_checkpoint(tmp_path / "ckpt", "llama", overrides={"vocab_size": SPM_VOCAB})
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


def k_quant_blocks(rng, shape, qtype):
    """Random `qtype` blocks for a `shape` tensor, their float16 scales drawn so the weights
    come out of variance about 1 / fan-in."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    count = shape[0] * shape[1] // block
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    # Where each format keeps its float16 super-block scale(s), and their size.
    scales = {gguf.GGMLQuantizationType.Q6_K: [(size - 2, 3e-5)], gguf.GGMLQuantizationType.Q2_K: [(size - 4, 3e-2), (size - 2, 1e-2)]}
    for at, scale in scales[qtype]:
        d = (np.abs(rng.standard_normal(count)) * scale).astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(count, 2)
    return blocks.reshape(shape[0], -1)


def test_k_quant_tensors_load_as_the_reference_dequantizer_reads_them(seedbar, tmp_path):
    """Q6_K and Q2_K projections (random blocks): Seedbar's logits on the GGUF equal those
    on safetensors of `gguf.quants.dequantize`'s reading of the same blocks."""
    wide = {"hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64}
    checkpoint = write_checkpoint(tmp_path / "ckpt", "qwen3", overrides=wide)
    tensors = {k: np.array(v) for k, v in mx.load(str(checkpoint / "model.safetensors")).items()}
    rng = np.random.default_rng(0)
    raw = {}
    for name, w in tensors.items():
        if ".layers." in name and w.ndim == 2:
            qtype = gguf.GGMLQuantizationType.Q6_K if ".0." in name else gguf.GGMLQuantizationType.Q2_K
            blocks = k_quant_blocks(rng, w.shape, qtype)
            raw[name] = (blocks, qtype)
            tensors[name] = gguf.quants.dequantize(blocks, qtype)
    mx.save_safetensors(str(checkpoint / "model.safetensors"), {k: mx.array(v) for k, v in tensors.items()})
    gguf_file = write_gguf(checkpoint, tmp_path / "model.gguf", raw=raw)
    expected, _ = logits_and_tokens(seedbar, checkpoint, tmp_path)
    logits, _ = logits_and_tokens(seedbar, gguf_file, tmp_path)
    # MLX widens K-quants to float16: the reference's float32 weights, rounded.
    max_diff = np.abs(logits - expected).max()
    assert max_diff < 1e-2 * max(1.0, np.abs(expected).max()), f"max |Δlogit| {max_diff}"
    assert (logits.argmax(-1) == expected.argmax(-1)).all()


def test_k_quant_files_mlx_misreads_or_cannot_read_are_refused_with_advice(seedbar, tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ckpt", "llama")
    q4_k_m = write_gguf(checkpoint, tmp_path / "q4_k_m.gguf", file_type=15)
    proc = seedbar.run("run", "--model", q4_k_m, "hi", check=False)
    assert proc.returncode == 1 and "Q4_K_M GGUF holds Q4_K tensors" in proc.stderr, proc.stderr
    assert "use a Q8_0, Q6_K or Q4_0 GGUF" in proc.stderr

    blocks = np.zeros((256, 256 // 256 * 176), dtype=np.uint8)
    q5_k = write_gguf(checkpoint, tmp_path / "q5_k.gguf", extra={"extra.weight": (blocks, gguf.GGMLQuantizationType.Q5_K)})
    proc = seedbar.run("run", "--model", q5_k, "hi", check=False)
    assert proc.returncode == 1 and "Q3_K and Q5_K" in proc.stderr and "panicked" not in proc.stderr, proc.stderr

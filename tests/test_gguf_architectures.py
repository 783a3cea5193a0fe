"""GGUF beyond llama: a random-weight GGUF of each architecture, mixtures of experts
included (written with the `gguf` package as llama.cpp's converter lays it out), gives the logits and greedy tokens of the same
weights as safetensors; quantized tensors (Q4_0 to Q8_0 and the K-quants Q2_K to Q6_K) decode
exactly as the `gguf` package's reference dequantizer reads them, and K-quant GGUFs give the
logits of their weights dequantized (with float activations; by default a GGUF's products
round their input to int8 as llama.cpp's do, close to those logits); unreadable types and
truncated files are refused by name; SentencePiece vocabularies (`llama`, `gemma`) from GGUF metadata
tokenize as the SentencePiece library does on the same pieces and scores."""

import json

import gguf
import mlx.core as mx
import numpy as np
import pytest

from checkpoints import write_checkpoint
from gguf_checkpoints import SPM_TOKENS, SPM_VOCAB, unpermute, write_gguf

PROMPT = [5, 17, 99, 3, 200, 42, 42, 7, 128, 64, 1, 250]
TEXT = "hello the world in the sea, é!  two  spaces"


def logits_and_tokens(seedbar, model, tmp_path, **options):
    out = tmp_path / "logits.safetensors"
    result = seedbar.probe(str(model), ids=PROMPT, generate=16, logits_out=str(out), **options)
    return np.array(mx.load(str(out))["logits"]), result["generated"]


@pytest.mark.parametrize(
    "arch,tokenizer",
    [
        ("mistral", "llama"),
        ("qwen2", "gpt2"),
        ("qwen3", "gpt2"),
        ("gemma2_gguf", "gemma"),
        ("gemma3_gguf", "gemma"),
        ("phi3_longrope", "llama"),
        # Mixtures of experts: stacked `ffn_*_exps` and `ffn_gate_inp`, with
        # `expert_count` and `expert_used_count` (Mixtral's GGUFs are llama with experts).
        ("qwen3_moe_gguf", "gpt2"),
        ("mixtral", "llama"),
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


Q = gguf.GGMLQuantizationType
# Where each type keeps its float16 block scales (byte offset, typical magnitude for weights
# of variance about 1 / fan-in); the types the `gguf` package cannot quantize.
K_QUANT_SCALES = {
    Q.Q2_K: [(80, 2e-3), (82, 3e-3)],
    Q.Q3_K: [(108, 1e-3)],
    Q.Q4_K: [(0, 1e-4), (2, 5e-4)],
    Q.Q5_K: [(0, 5e-5), (2, 5e-4)],
    Q.Q6_K: [(208, 3e-5)],
}
# What MLX's affine quantization holds exactly (groups of 32), and its bit width.
KEPT_QUANTIZED = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8, Q.Q4_K: 4, Q.Q5_K: 5}


def quantized_blocks(rng, shape, qtype):
    """A random `shape` tensor as `qtype` blocks (`[..rows, bytes per row]`): quantized by the
    `gguf` package where it can, else random bytes with float16 scales (of random sign)
    drawn at K_QUANT_SCALES' magnitudes."""
    if qtype not in K_QUANT_SCALES:
        w = rng.standard_normal(shape).astype(np.float32) / np.sqrt(shape[-1])
        return gguf.quants.quantize(w, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    count = int(np.prod(shape)) // block
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    for at, scale in K_QUANT_SCALES[qtype]:
        d = (rng.standard_normal(count) * scale).astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(count, 2)
    return blocks.reshape(*shape[:-1], -1)


def test_quantized_tensors_decode_exactly_as_the_reference_dequantizer(seedbar, tmp_path):
    """Every quantized type Seedbar reads, decoded from a GGUF's bytes (and written out by
    `seedbar convert --dtype float32`), equals `gguf.quants.dequantize`'s reading bit for
    bit; the types MLX's affine quantization holds stay quantized, the others are dense."""
    checkpoint = write_checkpoint(tmp_path / "ckpt", "llama")
    rng = np.random.default_rng(1)
    extra = {f"extra_{t.name.lower()}.weight": (quantized_blocks(rng, (8, 512), t), t) for t in [*K_QUANT_SCALES, *KEPT_QUANTIZED]}
    gguf_file = write_gguf(checkpoint, tmp_path / "model.gguf", extra=extra)
    seedbar.run("convert", gguf_file, tmp_path / "mlx", "--dtype", "float32")
    weights = mx.load(str(tmp_path / "mlx" / "model.safetensors"))
    for name, (blocks, qtype) in extra.items():
        stem = name.removesuffix(".weight")
        expected = gguf.quants.dequantize(blocks, qtype)
        if qtype in KEPT_QUANTIZED:
            parts = [weights[f"{stem}.{p}"] for p in ("weight", "scales", "biases")]
            assert parts[1].dtype == mx.float32
            decoded = mx.dequantize(*parts, group_size=32, bits=KEPT_QUANTIZED[qtype])
        else:
            assert f"{stem}.scales" not in weights
            decoded = weights[name]
        assert decoded.dtype == mx.float32
        np.testing.assert_array_equal(np.array(decoded), expected, err_msg=qtype.name)


@pytest.mark.parametrize(
    "arch,qtypes",
    [
        # llama: Q4_K q/k rows go through the un-permutation as quantized triplets; a
        # quantized embedding table.
        ("llama", [Q.Q4_K, Q.Q6_K]),
        ("qwen3", [Q.Q5_K, Q.Q3_K, Q.Q2_K, Q.Q8_0]),
        # Stacked experts (`[experts, rows, cols]`) and routers in K-quants.
        ("qwen3_moe_gguf", [Q.Q4_K, Q.Q6_K, Q.Q8_0]),
    ],
)
def test_k_quant_gguf_matches_its_weights_dequantized(seedbar, tmp_path, arch, qtypes):
    """Every matrix of a random-weight GGUF in a K-quant (types in turn): Seedbar's logits and
    greedy tokens equal those on safetensors of `gguf.quants.dequantize`'s reading."""
    wide = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "moe_intermediate_size": 256}
    checkpoint = write_checkpoint(tmp_path / "ckpt", arch, overrides=wide)
    tensors = {k: np.array(v) for k, v in mx.load(str(checkpoint / "model.safetensors")).items()}
    rng = np.random.default_rng(0)
    raw = {}
    matrices = sorted(name for name, w in tensors.items() if w.ndim >= 2)
    for i, name in enumerate(matrices):
        qtype = qtypes[i % len(qtypes)]
        blocks = quantized_blocks(rng, tensors[name].shape, qtype)
        raw[name] = (blocks, qtype)
        w = gguf.quants.dequantize(blocks, qtype)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = unpermute(w, wide["num_attention_heads"] if "q_proj" in name else wide["num_key_value_heads"])
        tensors[name] = w
    mx.save_safetensors(str(checkpoint / "model.safetensors"), {k: mx.array(v) for k, v in tensors.items()})
    gguf_file = write_gguf(checkpoint, tmp_path / "model.gguf", raw=raw)
    expected, expected_tokens = logits_and_tokens(seedbar, checkpoint, tmp_path)
    scale = max(1.0, np.abs(expected).max())
    logits, tokens = logits_and_tokens(seedbar, gguf_file, tmp_path, activations="float")
    max_diff = np.abs(logits - expected).max()
    assert max_diff < 1e-4 * scale, f"max |Δlogit| {max_diff}"
    assert tokens == expected_tokens
    # By default a GGUF's products round their input to int8 per block of 32, as llama.cpp's
    # do: near the float products (a router's near-tie may pick another expert at a
    # position, hence the mean), not equal to them, and the same greedy tokens here.
    int8, int8_tokens = logits_and_tokens(seedbar, gguf_file, tmp_path)
    mean_diff = np.abs(int8 - expected).mean()
    assert 0 < mean_diff < 1e-2 * scale, f"mean |Δlogit| {mean_diff} with int8 activations"
    assert int8_tokens == expected_tokens


def test_unreadable_tensor_types_and_truncated_files_are_refused_by_name(seedbar, tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ckpt", "llama")
    blocks = np.zeros((4, 64 // 32 * 18), dtype=np.uint8)
    iq4 = write_gguf(checkpoint, tmp_path / "iq4.gguf", extra={"extra.weight": (blocks, Q.IQ4_NL)})
    proc = seedbar.run("run", "--model", iq4, "hi", check=False)
    assert proc.returncode == 1 and "panicked" not in proc.stderr, proc.stderr
    assert "tensor `extra.weight` has ggml type IQ4_NL, which Seedbar does not read (it reads F32, F16" in proc.stderr

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(write_gguf(checkpoint, tmp_path / "whole.gguf").read_bytes()[:-100])
    proc = seedbar.run("run", "--model", truncated, "hi", check=False)
    assert proc.returncode == 1 and "runs past the end of the file" in proc.stderr, proc.stderr

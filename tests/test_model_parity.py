"""Logits parity with mlx-lm on random-weight checkpoints of every architecture: same tokens
in, logits within tolerance, and identical 32-token greedy continuations."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from checkpoints import write_checkpoint

PROMPT = [5, 17, 99, 3, 200, 42, 42, 7, 128, 64, 1, 250]
CASES = [
    ("llama", None, None),
    ("llama3", None, None),
    ("mistral", None, None),
    ("qwen2", None, None),
    ("qwen3", None, None),
    ("gemma3", None, None),
    ("gemma2", None, None),
    ("phi3", None, None),
    ("phi3_longrope", None, None),
    ("smollm3", None, None),
    ("gemma3", 4, None),
    ("llama", 4, None),
    ("qwen3", 8, None),
    ("qwen2", None, mx.bfloat16),
    ("llama", None, mx.float16),
]


def mlx_lm_reference(path, generate=32):
    model, _ = load_model(path)
    if any(v.dtype in (mx.bfloat16, mx.float16) for _, v in _leaves(model.parameters())):
        model.set_dtype(mx.float32)  # Seedbar computes in f32 on CPU; compare like with like.
    logits = model(mx.array([PROMPT])).astype(mx.float32)
    cache = make_prompt_cache(model)
    out = model(mx.array([PROMPT]), cache=cache)
    tokens = []
    for _ in range(generate):
        token = int(mx.argmax(out[0, -1]).item())
        tokens.append(token)
        out = model(mx.array([[token]]), cache=cache)
    return np.array(logits), tokens


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix, tree


def seedbar_run(seedbar, tmp_path, path):
    """Seedbar's logits over PROMPT and its probe result (32 greedy tokens)."""
    logits_file = tmp_path / "logits.safetensors"
    result = seedbar.probe(str(path), ids=PROMPT, generate=32, logits_out=str(logits_file))
    return np.array(mx.load(str(logits_file))["logits"]), result


@pytest.mark.parametrize("arch,bits,dtype", CASES, ids=lambda v: str(v))
def test_logits_and_greedy_match_mlx_lm(seedbar, tmp_path, arch, bits, dtype):
    path = write_checkpoint(tmp_path / "ckpt", arch, quantize_bits=bits, dtype=dtype)
    expected_logits, expected_tokens = mlx_lm_reference(path)

    logits, result = seedbar_run(seedbar, tmp_path, path)

    assert logits.shape == expected_logits.shape == (1, len(PROMPT), 256)
    scale = np.abs(expected_logits).max()
    max_diff = np.abs(logits - expected_logits).max()
    # Quantized layers: Seedbar expands them to f32 for OpenBLAS, mlx-lm runs quantized kernels.
    tolerance = (2e-3 if bits else 2e-4) * max(1.0, scale)
    assert max_diff < tolerance, f"max |Δlogit| {max_diff} (scale {scale})"
    assert result["generated"] == expected_tokens
    assert result["eos_ids"] == [255]



MOE_CASES = ["qwen3_moe", "qwen3_moe_unnormalized", "mixtral"]


@pytest.mark.parametrize("arch", MOE_CASES)
def test_mixture_of_experts_matches_mlx_lm(seedbar, tmp_path, arch):
    """Qwen3-MoE (routing normalized or not, a dense layer between) and Mixtral, experts
    stacked as mlx-lm saves them."""
    test_logits_and_greedy_match_mlx_lm(seedbar, tmp_path, arch, None, None)


def test_quantized_experts_match_mlx_lm_on_their_dequantized_weights(seedbar, tmp_path):
    """4-bit Mixtral experts (mlx-lm 0.32.2's quantized switch layers do not run against
    MLX 0.32.2's gather_qmm, so the reference runs on the same weights dequantized)."""
    path = write_checkpoint(tmp_path / "ckpt", "mixtral", quantize_bits=4)
    reference = tmp_path / "reference"
    shutil.copytree(path, reference)
    tensors = mx.load(str(path / "model.safetensors"))
    dense = {}
    for name, value in tensors.items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{prefix}.scales" in tensors:
            value = mx.dequantize(value, tensors[f"{prefix}.scales"], tensors[f"{prefix}.biases"], 32, 4)
        if not name.endswith((".scales", ".biases")):
            dense[name] = value
    mx.save_safetensors(str(reference / "model.safetensors"), dense)
    config = json.loads((path / "config.json").read_text())
    del config["quantization"]
    (reference / "config.json").write_text(json.dumps(config))
    expected_logits, expected_tokens = mlx_lm_reference(reference)

    logits, result = seedbar_run(seedbar, tmp_path, path)
    assert any(".switch_mlp.gate_proj.scales" in name for name in tensors)
    max_diff = np.abs(logits - expected_logits).max()
    assert max_diff < 2e-4 * max(1.0, np.abs(expected_logits).max()), f"max |Δlogit| {max_diff}"
    assert result["generated"] == expected_tokens

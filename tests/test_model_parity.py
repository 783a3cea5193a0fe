"""Logits parity with mlx-lm on random-weight checkpoints of every architecture: same tokens
in, logits within tolerance, and identical 32-token greedy continuations.

Tolerances follow the backend the binary reports (`seedbar probe`'s "backend"):
- CPU computes in float32 (quantized weights expanded for OpenBLAS): logits within 2e-4 of
  mlx-lm's float32 run, 2e-3 with quantized layers (mlx-lm runs its quantized kernels), and
  the whole greedy continuation identical.
- GPUs (Metal, CUDA) compute in float16 (quantized weights kept): mlx-lm runs in float16 too,
  logits within 2e-2, 3e-2 with quantized layers (float16 keeps 11 significant bits; on these
  checkpoints mlx-lm's own float16 run is 2e-3 to 4e-3 from its float32 run, 8e-3 quantized),
  and the continuation identical up to the first step where mlx-lm's top two logits are closer
  than twice the measured logit difference (a near-tie that either side may take).
Each bound is relative to the largest logit when that exceeds 1.
"""

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


# compute dtype -> (dense tolerance, tolerance with quantized layers), relative to the scale
# (bfloat16, a GPU's for bfloat16 checkpoints, keeps 3 fewer bits than float16).
TOLERANCE = {"float32": (2e-4, 2e-3), "float16": (2e-2, 3e-2), "bfloat16": (1.6e-1, 2.4e-1)}
MLX_DTYPE = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def mlx_lm_reference(path, compute_dtype, generate=32, prompt=PROMPT):
    """mlx-lm's logits for `prompt`, its greedy continuation, and each step's margin between
    its top two logits; computed in Seedbar's compute dtype (like with like)."""
    model, _ = load_model(path)
    floats = {v.dtype for _, v in _leaves(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}
    if floats != {MLX_DTYPE[compute_dtype]}:
        model.set_dtype(MLX_DTYPE[compute_dtype])
    logits = model(mx.array([prompt])).astype(mx.float32)
    cache = make_prompt_cache(model)
    out = model(mx.array([prompt]), cache=cache)
    tokens, margins = [], []
    for _ in range(generate):
        last = np.array(out[0, -1].astype(mx.float32))
        top2 = np.sort(last)[-2:]
        token = int(np.argmax(last))
        tokens.append(token)
        margins.append(float(top2[1] - top2[0]))
        out = model(mx.array([[token]]), cache=cache)
    return np.array(logits), tokens, margins


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix, tree


def seedbar_run(seedbar, tmp_path, path, prompt=PROMPT):
    """Seedbar's logits over `prompt` and its probe result (32 greedy tokens)."""
    logits_file = tmp_path / "logits.safetensors"
    result = seedbar.probe(str(path), ids=prompt, generate=32, logits_out=str(logits_file))
    return np.array(mx.load(str(logits_file))["logits"].astype(mx.float32)), result


@pytest.mark.parametrize("arch,bits,dtype", CASES, ids=lambda v: str(v))
def test_logits_and_greedy_match_mlx_lm(seedbar, tmp_path, arch, bits, dtype):
    check_parity(seedbar, tmp_path, arch, bits, dtype)


def check_parity(seedbar, tmp_path, arch, bits, dtype, prompt=PROMPT):
    """Seedbar's logits over `prompt` and greedy continuation against mlx-lm's on one
    random-weight checkpoint of `arch`; returns Seedbar's probe result."""
    path = write_checkpoint(tmp_path / "ckpt", arch, quantize_bits=bits, dtype=dtype)
    logits, result = seedbar_run(seedbar, tmp_path, path, prompt)
    compute_dtype = result["backend"]["compute_dtype"]
    assert compute_dtype in TOLERANCE, result["backend"]
    expected_logits, expected_tokens, margins = mlx_lm_reference(path, compute_dtype, prompt=prompt)

    assert logits.shape == expected_logits.shape == (1, len(prompt), 256)
    scale = np.abs(expected_logits).max()
    max_diff = np.abs(logits - expected_logits).max()
    dense, quantized = TOLERANCE[compute_dtype]
    tolerance = (quantized if bits else dense) * max(1.0, scale)
    assert max_diff < tolerance, f"max |Δlogit| {max_diff} (scale {scale}, {result['backend']})"
    if compute_dtype == "float32":
        assert result["generated"] == expected_tokens
    else:
        clear = next((i for i, m in enumerate(margins) if m < 2 * max_diff), len(margins))
        assert result["generated"][:clear] == expected_tokens[:clear], f"near-tie from step {clear}"
    assert result["eos_ids"] == [255]
    return result


# Far past Gemma 3's window of 8: the sliding layers' caches let old positions go.
LONG_PROMPT = [(i * 7919 + 13) % 250 for i in range(600)]
# What a sliding layer's cache may hold (step/kv_cache.rs `kept_from`): the window less one,
# one prefill chunk (128) and one KV block (256) of slack, and the step's new position.
WINDOW_BOUND = 8 - 1 + 128 + 256 + 1


@pytest.mark.parametrize("bits", [None, 4], ids=["dense", "q4"])
def test_sliding_window_past_its_window_matches_mlx_lm_and_keeps_only_the_window(seedbar, tmp_path, bits):
    """Gemma 3 (window 8 on layers 0 and 2) over a 600-token prompt and 32 greedy tokens,
    against mlx-lm's rotating caches: logits and tokens agree, and the sliding layers hold
    a bounded tail while the global layer holds every position. Dense runs the MLX path;
    4-bit on the CPU runs the host path (packed kernels)."""
    result = check_parity(seedbar, tmp_path, "gemma3", bits, None, prompt=LONG_PROMPT)
    total = len(LONG_PROMPT) + 31
    sliding, full, sliding_too = result["kv"]["held"]
    assert full == total
    assert max(sliding, sliding_too) <= WINDOW_BOUND < total, result["kv"]

MOE_CASES = ["qwen3_moe", "qwen3_moe_unnormalized", "mixtral"]


@pytest.mark.parametrize("arch", MOE_CASES)
def test_mixture_of_experts_matches_mlx_lm(seedbar, tmp_path, arch):
    """Qwen3-MoE (routing normalized or not, a dense layer between) and Mixtral, experts
    stacked as mlx-lm saves them."""
    check_parity(seedbar, tmp_path, arch, None, None)


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
    expected_logits, expected_tokens, _ = mlx_lm_reference(reference, "float32")

    logits, result = seedbar_run(seedbar, tmp_path, path)
    if result["backend"]["compute_dtype"] != "float32":
        pytest.skip("the dequantized reference is float32; GPUs compute in float16")
    assert any(".switch_mlp.gate_proj.scales" in name for name in tensors)
    max_diff = np.abs(logits - expected_logits).max()
    assert max_diff < 2e-4 * max(1.0, np.abs(expected_logits).max()), f"max |Δlogit| {max_diff}"
    assert result["generated"] == expected_tokens

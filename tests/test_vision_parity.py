"""Images through Seedbar against mlx-vlm on random-weight vision checkpoints written with
mlx-vlm's own classes (tests/vision_checkpoints.py), Gemma 3 and Qwen2.5-VL: the processor's
pixels equal to Hugging Face's, the image features (tower and projector or merger) and the
logits over a prompt that holds the image within the text parity tests' float32 tolerance, and
the same 32-token greedy continuation (for Qwen2.5-VL, with its multimodal RoPE placing the
images' tokens on their grids and shifting the text after them). CPU only (float32), as the
other parity tests run in CI."""

import json

import httpx
import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from conftest import serving
from vision_checkpoints import (
    PREPROCESSOR,
    QWEN_PAD,
    QWEN_PREPROCESSOR,
    QWEN_TEXT,
    SOFT,
    TEXT,
    TOKENS_PER_IMAGE,
    chat_ids,
    qwen_chat_ids,
    qwen_grid,
    write_qwen_vision_checkpoint,
    write_vision_checkpoint,
)


# The text parity tests' float32 bound, relative to the largest value when that exceeds 1.
TOLERANCE = 2e-4


def photo(path, seed, size=(400, 300)):
    """A noisy picture with some structure (gradients under noise), saved as PNG."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], axis=-1)
    noisy = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(path)
    return path


def hf_pixels(path):
    from transformers import Gemma3ImageProcessor
    from transformers.image_utils import load_image

    settings = {k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"}
    return np.asarray(Gemma3ImageProcessor(**settings)(load_image(str(path)))["pixel_values"])


def mlx_vlm_reference(path, ids, pixels, generate=32):
    """mlx-vlm's features of each image (as the decoder embeds them, before its sqrt(d) scale),
    logits over `ids` and greedy continuation."""
    from mlx_vlm.utils import load_model

    model = load_model(path)
    hidden, _, _ = model.vision_tower(mx.array(pixels).transpose(0, 2, 3, 1), output_hidden_states=True)
    features = model.multi_modal_projector(hidden) / (TEXT["hidden_size"] ** 0.5)
    language = model.language_model

    def embeds():
        # Fresh each pass: the decoder scales its input embeddings in place (`h *= ...`).
        mask = mx.ones((1, len(ids)))
        return model.get_input_embeddings(mx.array([ids]), mx.array(pixels), mask=mask).inputs_embeds

    logits = language(mx.array([ids]), inputs_embeds=embeds()).logits
    cache = language.make_cache()
    out = language(mx.array([ids]), inputs_embeds=embeds(), cache=cache).logits
    tokens = []
    for _ in range(generate):
        token = int(np.argmax(np.array(out[0, -1])))
        tokens.append(token)
        out = language(mx.array([[token]]), cache=cache).logits
    return np.array(features), np.array(logits), tokens


def probe_with_images(seedbar, path, ids, files, tmp_path):
    """`seedbar probe` over `ids` with the pictures `files` (float32, as the tolerances are):
    its JSON (the 32-token greedy continuation), each picture's pixels and features, and the
    logits at every position."""
    logits_file, features_file = tmp_path / "logits.safetensors", tmp_path / "features.safetensors"
    result = seedbar.probe(
        str(path),
        ids=ids,
        generate=32,
        images=",".join(map(str, files)),
        logits_out=str(logits_file),
        features_out=str(features_file),
    )
    assert result["backend"]["compute_dtype"] == "float32", result["backend"]
    return result, mx.load(str(features_file)), np.array(mx.load(str(logits_file))["logits"])


def within(actual, expected, what, tolerance=TOLERANCE):
    scale = max(1.0, float(np.abs(expected).max()))
    diff = float(np.abs(actual - expected).max())
    assert diff < tolerance * scale, f"{what}: max |Δ| {diff} (scale {scale})"


@pytest.mark.parametrize("images", [1, 2])
def test_image_features_logits_and_greedy_match_mlx_vlm(seedbar, tmp_path, images):
    path = write_vision_checkpoint(tmp_path / "ckpt")
    files = [photo(tmp_path / f"img{k}.png", seed=k, size=(400 + 37 * k, 300)) for k in range(images)]
    ids = chat_ids("Compare", "Which is brighter?", images=images) if images > 1 else chat_ids("What is in", "this picture?")
    assert ids.count(SOFT) == images * TOKENS_PER_IMAGE
    result, ours, logits = probe_with_images(seedbar, path, ids, files, tmp_path)
    reference_pixels = [hf_pixels(f) for f in files]
    for k, pixels in enumerate(reference_pixels):
        assert np.array_equal(np.array(ours[f"pixels{k}"]), pixels[0]), f"image {k}: pixels differ from Hugging Face's"
    features, expected_logits, expected_tokens = mlx_vlm_reference(path, ids, np.concatenate(reference_pixels))
    for k in range(images):
        within(np.array(ours[f"features{k}"]), features[k], f"image {k} features")
    assert logits.shape == expected_logits.shape == (1, len(ids), TEXT["vocab_size"])
    within(logits, expected_logits, "logits")
    assert result["generated"] == expected_tokens


def test_an_image_moves_the_logits(seedbar, tmp_path):
    """The features reach the decoder: two different pictures give different logits after
    them, and a picture gives the same logits twice."""
    path = write_vision_checkpoint(tmp_path / "ckpt")
    ids = chat_ids("What is in", "this picture?")
    runs = []
    for name, seed in [("a", 1), ("b", 2), ("a2", 1)]:
        out = tmp_path / f"{name}.safetensors"
        seedbar.probe(str(path), ids=ids, images=str(photo(tmp_path / f"{name}.png", seed)), logits_out=str(out))
        runs.append(np.array(mx.load(str(out))["logits"]))
    first_image = ids.index(SOFT)
    assert np.array_equal(runs[0], runs[2])
    assert np.array_equal(runs[0][:, :first_image], runs[1][:, :first_image]), "text before the image"
    assert not np.allclose(runs[0][:, -1], runs[1][:, -1]), "the image does not reach the reply"


# ---------------------------------------------------------------------------------------------
# Qwen2.5-VL


def qwen_hf_pixels(path):
    """The Hugging Face processor's flattened patches and grid for one picture."""
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    settings = {k: v for k, v in QWEN_PREPROCESSOR.items() if k != "image_processor_type"}
    out = Qwen2VLImageProcessorPil(**settings)(load_image(str(path)), return_tensors="np")
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


def as_patches(pixels):
    """Seedbar's `[3, H, W]` pixels as the processor's rows: the picture twice in time, cut
    into 14x14 patches in 2x2 blocks, each row (channel, time, row, column)."""
    _, h, w = pixels.shape
    x = np.stack([pixels, pixels]).reshape(1, 2, 3, h // 28, 2, 14, w // 28, 2, 14)
    return x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(-1, 3 * 2 * 14 * 14)


def qwen_reference(path, ids, pixels, grids, generate=32):
    """mlx-vlm's image tokens (the merger's output), logits over `ids` and greedy continuation."""
    from mlx_vlm.utils import load_model

    model = load_model(path)
    pixels, grids = mx.array(pixels), mx.array(grids)
    features = model.vision_tower(pixels, grids)
    language = model.language_model
    inputs = mx.array([ids])

    def run(cache=None):
        embeds = model.get_input_embeddings(inputs, pixels, image_grid_thw=grids).inputs_embeds
        return language(inputs, inputs_embeds=embeds, cache=cache, pixel_values=pixels, image_grid_thw=grids).logits

    logits = run()
    cache = language.make_cache() if hasattr(language, "make_cache") else [None] * len(language.layers)
    if cache[0] is None:
        from mlx_vlm.models.cache import KVCache

        cache = [KVCache() for _ in language.layers]
    out = run(cache)
    tokens = []
    for _ in range(generate):
        token = int(np.argmax(np.array(out[0, -1])))
        tokens.append(token)
        out = language(mx.array([[token]]), cache=cache).logits
    return np.array(features), np.array(logits), tokens


@pytest.mark.parametrize(
    "sizes,bits",
    [([(400, 300)], None), ([(400, 300), (150, 260)], None), ([(400, 300), (150, 260)], 4)],
    ids=["one", "two", "two-q4"],
)
def test_qwen2_5_vl_tokens_logits_and_greedy_match_mlx_vlm(seedbar, tmp_path, sizes, bits):
    """Pictures of their own sizes: 9x6 and 5x9 tokens, windows cut at the edges, the text
    between and after them shifted by the grids. With a 4-bit decoder the CPU runs it on its
    packed kernels and rotates on the host (mlx-vlm on MLX's quantized products: 2e-3)."""
    path = write_qwen_vision_checkpoint(tmp_path / "qwen", quantize_bits=bits)
    files = [photo(tmp_path / f"img{k}.png", seed=k, size=size) for k, size in enumerate(sizes)]
    ids = qwen_chat_ids("Compare these:", "Which is brighter?", sizes)
    grids = [qwen_grid(*size) for size in sizes]
    assert ids.count(QWEN_PAD) == sum(r * c for r, c in grids)
    result, ours, logits = probe_with_images(seedbar, path, ids, files, tmp_path)
    reference = [qwen_hf_pixels(f) for f in files]
    for k, (pixels, grid) in enumerate(reference):
        assert tuple(grid[0]) == (1, 2 * grids[k][0], 2 * grids[k][1])
        assert np.array_equal(as_patches(np.array(ours[f"pixels{k}"])), pixels), f"image {k}: pixels differ"
    features, expected_logits, expected_tokens = qwen_reference(
        path, ids, np.concatenate([p for p, _ in reference]), np.concatenate([g for _, g in reference])
    )
    start = 0
    for k, (rows, cols) in enumerate(grids):
        within(np.array(ours[f"features{k}"]), features[start : start + rows * cols], f"image {k} tokens")
        start += rows * cols
    assert logits.shape == expected_logits.shape == (1, len(ids), QWEN_TEXT["vocab_size"])
    within(logits, expected_logits, "logits", tolerance=2e-3 if bits else TOLERANCE)
    assert result["generated"] == expected_tokens

    # The server's rows (the scheduler places the tokens the same way): the same greedy reply.
    name = f"qwen-{len(sizes)}-{bits}"
    seedbar.run("models", "add", str(path), "--name", name)
    content = [{"type": "text", "text": "Compare these:"}]
    content += [{"type": "image_url", "image_url": {"url": "file://" + str(f)}} for f in files]
    content += [{"type": "text", "text": "Which is brighter?"}]
    request = {"model": name, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 32, "logprobs": True}
    with serving(seedbar, model=name) as server:
        reply = httpx.post(f"{server.base_url}/chat/completions", json=request, timeout=120).json()
    assert reply["usage"]["prompt_tokens"] == len(ids)
    served = [bytes(t["bytes"]) for t in reply["choices"][0]["logprobs"]["content"]]
    # Byte tokens spell themselves, a lone byte past ASCII as U+FFFD (compared up to the end
    # token, 255, or a marker).
    end = next((i for i, t in enumerate(expected_tokens) if t >= 255), len(expected_tokens))
    assert end >= 8 and len(served) >= end, (expected_tokens, served)
    assert served[:end] == [bytes([t]).decode(errors="replace").encode() for t in expected_tokens[:end]]

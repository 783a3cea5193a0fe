"""Images through Seedbar against mlx-vlm on a random-weight Gemma 3 vision checkpoint written
with mlx-vlm's own classes (tests/vision_checkpoints.py): the processor's pixels equal to
Hugging Face's, the image features (tower and projector) and the logits over a prompt that
holds the image within the text parity tests' float32 tolerance, and the same 32-token greedy
continuation. CPU only (float32), as the other parity tests run in CI."""

import json

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from vision_checkpoints import PREPROCESSOR, SOFT, TEXT, TOKENS_PER_IMAGE, chat_ids, write_vision_checkpoint


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


def within(actual, expected, what):
    scale = max(1.0, float(np.abs(expected).max()))
    diff = float(np.abs(actual - expected).max())
    assert diff < TOLERANCE * scale, f"{what}: max |Δ| {diff} (scale {scale})"


@pytest.mark.parametrize("images", [1, 2])
def test_image_features_logits_and_greedy_match_mlx_vlm(seedbar, tmp_path, images):
    path = write_vision_checkpoint(tmp_path / "ckpt")
    files = [photo(tmp_path / f"img{k}.png", seed=k, size=(400 + 37 * k, 300)) for k in range(images)]
    ids = chat_ids("Compare", "Which is brighter?", images=images) if images > 1 else chat_ids("What is in", "this picture?")
    assert ids.count(SOFT) == images * TOKENS_PER_IMAGE
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
    ours = mx.load(str(features_file))
    logits = np.array(mx.load(str(logits_file))["logits"])
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

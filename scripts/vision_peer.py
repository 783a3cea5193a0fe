"""Prefill of one 896x896 image, Seedbar against mlx-vlm on the same weights, same run.

The checkpoint is written with mlx-vlm's own classes (random weights, float32), the vision side
at a real model's size and a short decoder of its width (2 layers), so the figure is the
image's: decoding and resizing the picture, the tower, the projector and the prefill of the
prompt that holds it.
- `gemma3` (the default): SigLIP-So400m (27 layers of width 1152, 896x896 pixels in 14x14
  patches, pooled to 256 tokens, projected to a 2560-wide decoder, as in gemma-3-4b);
- `qwen2_5_vl`: Qwen2.5-VL-3B's tower (32 layers of width 1280, 4,096 patches of the picture
  at its own 896x896 size in 8x8-patch windows and 4 full-attention layers, merged to 1,024
  tokens of width 2048).

Seedbar: `seedbar serve`, the time of a one-token chat request carrying the picture as a data
URL (each run a new picture: no cache helps): the prefill and the step that draws the token. mlx-vlm: in-process, the Hugging
Face processor on the same file, `get_input_embeddings` and the decoder's prefill up to the
last logits, evaluated. Median of VISION_PEER_RUNS (2) after one warm-up each: on a 2-core
machine each run takes minutes.

Run alone (it takes minutes a picture on a 2-core CPU, so `make bench` leaves it out):
`~/.cache/seedbar-dev/venv/bin/python scripts/vision_peer.py [gemma3|qwen2_5_vl] [seedbar binary]`."""

import base64
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from vision_checkpoints import (  # noqa: E402
    IMAGE_MARKERS,
    PREPROCESSOR,
    QWEN_MARKERS,
    QWEN_PREPROCESSOR,
    QWEN_TEMPLATE,
    TEMPLATE,
    qwen_chat_ids,
)

RUNS = int(os.environ.get("VISION_PEER_RUNS", "2"))
SIDE = 896
TEXT = dict(
    model_type="gemma3_text", hidden_size=2560, num_hidden_layers=2, intermediate_size=10240,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
    rms_norm_eps=1e-6, vocab_size=259, rope_theta=1_000_000.0, rope_global_base_freq=1_000_000.0,
    rope_local_base_freq=10_000.0, sliding_window=1024, sliding_window_pattern=2,
    mm_tokens_per_image=256, max_position_embeddings=8192,
)
VISION = dict(
    model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
    num_attention_heads=16, patch_size=14, image_size=SIDE, layer_norm_eps=1e-6,
)
CONFIG = dict(
    model_type="gemma3", text_config=TEXT, vision_config=VISION, hidden_size=2560, vocab_size=259,
    image_token_index=258, boi_token_index=256, eoi_token_index=257, mm_tokens_per_image=256,
    pad_token_id=0, eos_token_id=[255],
)
QUESTION = "What is in this picture?"
# Qwen2.5-VL-3B's tower, and a 2-layer decoder of its width.
QWEN_TEXT = dict(
    model_type="qwen2_5_vl", hidden_size=2048, num_hidden_layers=2, intermediate_size=11008,
    num_attention_heads=16, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=259,
    rope_theta=1_000_000.0, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    max_position_embeddings=8192, tie_word_embeddings=True,
)
QWEN_VISION = dict(
    model_type="qwen2_5_vl", depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
    out_hidden_size=2048, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
    window_size=112, fullatt_block_indexes=[7, 15, 23, 31], in_channels=3,
)
QWEN_CONFIG = dict(
    **QWEN_TEXT, vision_config=QWEN_VISION, image_token_id=258, video_token_id=270,
    vision_start_token_id=256, vision_end_token_id=257, eos_token_id=[255],
)
# The model's own budget (Qwen2.5-VL's processor defaults): 896x896 stays 896x896.
QWEN_BUDGET = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)


def write_checkpoint(directory: Path) -> None:
    from mlx_vlm.models import gemma3
    from checkpoints import byte_tokenizer

    config = gemma3.ModelConfig(
        text_config=gemma3.TextConfig(**{k: v for k, v in TEXT.items() if k != "rope_theta"}),
        vision_config=gemma3.VisionConfig(**VISION),
        **{k: v for k, v in CONFIG.items() if k not in ("text_config", "vision_config", "boi_token_index",
                                                         "eoi_token_index", "mm_tokens_per_image")},
    )
    mx.random.seed(0)
    model = gemma3.Model(config)
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (directory / "config.json").write_text(json.dumps(CONFIG))
    (directory / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSOR, "size": {"height": SIDE, "width": SIDE}}))
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(IMAGE_MARKERS)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))


def write_qwen_checkpoint(directory: Path) -> None:
    from mlx_vlm.models import qwen2_5_vl
    from checkpoints import byte_tokenizer

    fields = {k: v for k, v in QWEN_CONFIG.items() if k not in QWEN_TEXT and k != "vision_config"}
    config = qwen2_5_vl.ModelConfig(
        text_config=qwen2_5_vl.TextConfig.from_dict(QWEN_TEXT),
        vision_config=qwen2_5_vl.VisionConfig.from_dict(QWEN_VISION),
        model_type="qwen2_5_vl", vocab_size=259, **fields,
    )
    mx.random.seed(0)
    model = qwen2_5_vl.Model(config)
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (directory / "config.json").write_text(json.dumps(QWEN_CONFIG))
    (directory / "preprocessor_config.json").write_text(json.dumps({**QWEN_PREPROCESSOR, **QWEN_BUDGET}))
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(QWEN_MARKERS)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN_TEMPLATE}))


def picture(seed: int, size=(1280, 960)) -> bytes:
    """A photo-like PNG (1280x960: Gemma 3's processor resizes it to 896x896)."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def seedbar_times(binary: str, directory: Path, size, tokens: int) -> list:
    home = Path(tempfile.mkdtemp(prefix="seedbar-vision-bench-"))
    env = {"SEEDBAR_HOME": str(home), "PATH": "/usr/bin:/bin"}
    subprocess.run([binary, "models", "add", str(directory), "--name", "seer"], check=True, env=env, capture_output=True)
    server = subprocess.Popen([binary, "serve", "--model", "seer", "--port", "0", "--prompt-cache-disk-gb", "0"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = server.stdout.readline().split(" at ")[1].strip()
        times = []
        with httpx.Client(base_url=url, timeout=600) as client:
            for run in range(RUNS + 1):
                data = base64.b64encode(picture(100 + run, size)).decode()
                body = {"model": "seer", "max_tokens": 1, "seed": 1, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]}
                started = time.perf_counter()
                # One token: the prefill and the step that draws it.
                response = client.post("/chat/completions", json=body)
                response.raise_for_status()
                assert response.json()["usage"]["prompt_tokens"] > tokens, response.text
                print(f"  seedbar run {run}: {time.perf_counter() - started:.2f} s", flush=True)
                if run:
                    times.append(time.perf_counter() - started)
        return times
    finally:
        server.terminate()
        server.wait()


def mlx_vlm_times(directory: Path) -> list:
    from mlx_vlm.utils import load_model
    from transformers import Gemma3ImageProcessor
    from transformers.image_utils import load_image

    from vision_checkpoints import expanded_image

    model = load_model(directory)
    settings = {k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"}
    processor = Gemma3ImageProcessor(**{**settings, "size": {"height": SIDE, "width": SIDE}})
    prompt = list(f"<start_of_turn>user\n{QUESTION}".encode())
    ids = prompt + expanded_image(256) + list(b"<end_of_turn>\n<start_of_turn>model\n")
    times = []
    with tempfile.TemporaryDirectory() as folder:
        for run in range(RUNS + 1):
            path = Path(folder) / f"{run}.png"
            path.write_bytes(picture(100 + run))
            started = time.perf_counter()
            pixels = mx.array(np.asarray(processor(load_image(str(path)))["pixel_values"]))
            embeds = model.get_input_embeddings(mx.array([ids]), pixels, mask=mx.ones((1, len(ids)))).inputs_embeds
            cache = model.language_model.make_cache()
            logits = model.language_model(mx.array([ids]), inputs_embeds=embeds, cache=cache).logits[:, -1]
            mx.eval(logits)
            print(f"  mlx-vlm run {run}: {time.perf_counter() - started:.2f} s", flush=True)
            if run:
                times.append(time.perf_counter() - started)
    return times


def qwen_mlx_vlm_times(directory: Path) -> list:
    from mlx_vlm.utils import load_model
    from transformers.image_utils import load_image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model = load_model(directory)
    settings = {k: v for k, v in QWEN_PREPROCESSOR.items() if k != "image_processor_type"}
    processor = Qwen2VLImageProcessorPil(**{**settings, **QWEN_BUDGET})
    ids = mx.array([qwen_chat_ids(QUESTION, "", [(SIDE, SIDE)])])
    times = []
    with tempfile.TemporaryDirectory() as folder:
        for run in range(RUNS + 1):
            path = Path(folder) / f"{run}.png"
            path.write_bytes(picture(100 + run, (SIDE, SIDE)))
            started = time.perf_counter()
            out = processor(load_image(str(path)), return_tensors="np")
            pixels, grid = mx.array(out["pixel_values"]), mx.array(out["image_grid_thw"])
            embeds = model.get_input_embeddings(ids, pixels, image_grid_thw=grid).inputs_embeds
            logits = model.language_model(ids, inputs_embeds=embeds, pixel_values=pixels, image_grid_thw=grid).logits[:, -1]
            mx.eval(logits)
            print(f"  mlx-vlm run {run}: {time.perf_counter() - started:.2f} s", flush=True)
            if run:
                times.append(time.perf_counter() - started)
    return times


# name -> (checkpoint writer, the peer's timing, the picture's size, its tokens, description)
FAMILIES = {
    "gemma3": (write_checkpoint, mlx_vlm_times, (1280, 960), 256, "Gemma 3 SigLIP-So400m tower, 256 tokens"),
    "qwen2_5_vl": (write_qwen_checkpoint, qwen_mlx_vlm_times, (SIDE, SIDE), 1024, "Qwen2.5-VL-3B tower, 4,096 patches, 1,024 tokens"),
}


def main() -> None:
    args = sys.argv[1:]
    family = args.pop(0) if args and args[0] in FAMILIES else "gemma3"
    binary = args[0] if args else str(ROOT / "target" / "debug" / "seedbar")
    write, peer_times, size, tokens, description = FAMILIES[family]
    cache = Path.home() / ".cache" / "seedbar-dev" / "bench" / f"{family}-vision-896"
    if not (cache / "model.safetensors").exists():
        write(cache)
    peer = peer_times(cache)
    ours = seedbar_times(binary, cache, size, tokens)
    o, p = statistics.median(ours), statistics.median(peer)
    print(f"Prefill of one {SIDE}x{SIDE} image ({description}, float32), median of {RUNS}")
    print(f"{'seedbar (HTTP, one-token reply)':<40}{o:>8.2f} s   runs {', '.join(f'{t:.2f}' for t in ours)}")
    print(f"{'mlx-vlm (in-process, to last logits)':<40}{p:>8.2f} s   runs {', '.join(f'{t:.2f}' for t in peer)}")
    print(f"{'ratio (mlx-vlm / seedbar)':<40}{p / o:>8.2f}x")


if __name__ == "__main__":
    main()

"""Seeded replies about images on a GPU: for a vision checkpoint (Gemma 3, Qwen2.5-VL), a seeded
reply about a picture alone, then again among 1, 7, 15 and 31 other requests (text and other pictures, some
arriving late), over `seedbar serve`'s HTTP API; prints how many came out identical, and the
time to the first token of a request whose picture is new (the tower's prefill).

Stands alone on an offline GPU machine (the standard library, numpy and mlx): pictures are
drawn here and written as PNG with zlib; with --shapes, a checkpoint folder that lacks its
weights gets random ones of those shapes (mlx-vlm's names), so a full-size tower needs no
transfer.

Usage: python3 gpu_image_identity.py SEEDBAR CHECKPOINT [--shapes SHAPES.json] [--trials N]"""

import argparse
import base64
import json
import os
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import numpy as np


def png(pixels: np.ndarray) -> bytes:
    """`pixels` (H, W, 3 uint8) as a PNG file."""
    height, width, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


def picture(seed: int, width=640, height=480) -> str:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x * y) % 255], axis=-1)
    pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    return "data:image/png;base64," + base64.b64encode(png(pixels)).decode()


def random_weights(folder: Path, shapes: dict) -> None:
    """Random weights of `shapes`; norm weights 1 where a norm multiplies by its weight (0 for
    Gemma's decoder, whose norms multiply by 1 + w)."""
    import mlx.core as mx

    offset_norms = json.loads((folder / "config.json").read_text())["model_type"] == "gemma3"
    mx.random.seed(0)
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            norm = ("norm" in name or "ln_q" in name) and name.endswith("weight")
            unit = norm and (not offset_norms or "vision_tower" in name)
            weights[name] = (mx.ones(shape) if unit else mx.zeros(shape)).astype(mx.bfloat16)
        else:
            weights[name] = (mx.random.normal(shape) * 0.02).astype(mx.bfloat16)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=900) as response:
        return json.loads(response.read())


def ask(url: str, image: str | None, text: str, seed: int, max_tokens=32) -> str:
    content = [{"type": "text", "text": text}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": image}})
    body = {"model": "seer", "messages": [{"role": "user", "content": content}], "seed": seed,
            "temperature": 0.9, "max_tokens": max_tokens}
    return post(url, body)["choices"][0]["message"]["content"]


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("seedbar")
    args.add_argument("checkpoint", type=Path)
    args.add_argument("--shapes", type=Path)
    args.add_argument("--trials", type=int, default=4)
    args = args.parse_args()
    if args.shapes and not (args.checkpoint / "model.safetensors").exists():
        random_weights(args.checkpoint, json.loads(args.shapes.read_text()))
    home = tempfile.mkdtemp(prefix="seedbar-gpu-images-")
    env = {**os.environ, "SEEDBAR_HOME": home}
    subprocess.run([args.seedbar, "models", "add", str(args.checkpoint), "--name", "seer"], check=True, env=env,
                   capture_output=True)
    server = subprocess.Popen([args.seedbar, "serve", "--model", "seer", "--port", "0", "--prompt-cache-disk-gb", "0"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = server.stdout.readline().split(" at ")[1].strip()
        # The first request loads the model and compiles the shapes.
        ask(url, picture(999), "Warm up.", 1, max_tokens=4)
        ttft = []
        for k in range(3):
            image = picture(500 + k)
            started = time.perf_counter()
            ask(url, image, "What is in this picture?", 7, max_tokens=1)
            ttft.append(time.perf_counter() - started)
        identical, total = 0, 0
        for trial in range(args.trials):
            mine = (picture(trial), f"Describe this picture, trial {trial}.", 1000 + trial)
            alone = ask(url, *mine)
            for siblings in (1, 7, 15, 31):
                results = {}

                def run(key, image, text, seed, delay=0.0):
                    time.sleep(delay)
                    results[key] = ask(url, image, text, seed)

                threads = [threading.Thread(target=run, args=("mine", *mine))]
                for k in range(siblings):
                    # Pictures of several sizes (a Qwen2.5-VL tower takes each at its own).
                    size = (320 + 96 * (k % 4), 240 + 72 * (k % 3))
                    image = picture(100 + k, *size) if k % 2 == 0 else None
                    late = 0.3 if k % 3 == 2 else 0.0
                    threads.append(threading.Thread(target=run, args=(k, image, f"Tell me about {k}.", 50 + k, late)))
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                total += 1
                identical += results["mine"] == alone
                print(f"trial {trial}, {siblings:>2} others: {'identical' if results['mine'] == alone else 'DIFFERENT'}",
                      flush=True)
        print(f"identical {identical}/{total}")
        print(f"time to first token, a new picture: {', '.join(f'{t:.3f}' for t in ttft)} s")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

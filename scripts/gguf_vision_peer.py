"""A GGUF vision model and its `mmproj` file read by Seedbar and by llama.cpp's `llama-server
--mmproj`, same files, same run: does Seedbar read llama.cpp's projector files as llama.cpp does?

For each family (Gemma 3, Qwen2.5-VL) a random-weight checkpoint is written with mlx-vlm's
classes and converted to llama.cpp's two files as its converter lays them out
(tests/gguf_checkpoints.py, float32; llama-server's copy has one BPE merge, which llama.cpp
requires and no prompt here uses). The picture is one colour, so any resampler gives the
same pixels (Seedbar resizes as the Hugging Face processor does, llama.cpp with its own code),
at a size both sides keep (Gemma 3: the tower's; Qwen2.5-VL: a multiple of 28 within every
budget). The same prompt goes to both: text, the picture between its markers, text.
Seedbar: `seedbar probe` (the prompt's ids, the logits at every position, the greedy
continuation). llama-server: `/completion` with the picture as multimodal data in place of its
media marker, greedy, float32 KV and no flash attention (its CPU kernel rounds through
float16), and the first reply token's top log-probabilities. Printed: the prompt's token count
on each side, the largest difference between the log-probabilities llama-server reports for
the first reply token and Seedbar's (llama-server reports none for a token that ends mid-way
through a UTF-8 character), and how many of the 16 greedy tokens agree.

Known difference, by design: llama.cpp lets a Gemma 3 image's tokens attend to each other both
ways (as Hugging Face's Gemma 3 does in prefill); Seedbar attends causally, as mlx-vlm does.

Usage: `~/.cache/seedbar-dev/venv/bin/python scripts/gguf_vision_peer.py [SEEDBAR] [LLAMA_SERVER]`
(defaults: target/debug/seedbar, the path in ~/.cache/seedbar-dev/llama-server.path; build it
with `scripts/setup.sh --bench`)."""

import base64
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import mlx.core as mx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from gguf_checkpoints import write_vision_gguf  # noqa: E402
from vision_checkpoints import (  # noqa: E402
    GGUF_TEXT,
    chat_ids,
    qwen_chat_ids,
    write_qwen_vision_checkpoint,
    write_vision_checkpoint,
)

GENERATE = 16
TOP = 5
MEDIA = "<__media__>"


def flat_picture(path: Path, size) -> bytes:
    Image.new("RGB", size, (180, 90, 40)).save(path)
    return path.read_bytes()


def seedbar_side(seedbar: str, model: Path, ids: list, picture: Path, work: Path):
    """Seedbar's greedy tokens and the log-probabilities at the reply's first position."""
    logits_file = work / "logits.safetensors"
    out = subprocess.run(
        [seedbar, "probe", "--model", str(model), "--ids", ",".join(map(str, ids)), "--generate", str(GENERATE),
         "--images", str(picture), "--logits-out", str(logits_file)],
        capture_output=True, text=True, check=True, env={"SEEDBAR_HOME": str(work / "home"), "PATH": "/usr/bin:/bin"},
    )
    last = np.array(mx.load(str(logits_file))["logits"])[0, -1].astype(np.float64)
    logprobs = last - np.log(np.exp(last - last.max()).sum()) - last.max()
    return json.loads(out.stdout)["generated"], logprobs


def llama_side(server: str, model: Path, prompt: str, picture_bytes: bytes, work: Path):
    """llama-server's prompt length, greedy tokens and first-position top log-probabilities."""
    projector = next(model.parent.glob("mmproj*.gguf"))
    log = open(work / "llama-server.log", "w")
    port = 18000 + (hash(str(model)) % 1000)
    proc = subprocess.Popen(
        # float32 KV (its default is float16) and no flash attention (its CPU kernel rounds
        # through float16), as Seedbar computes float32 weights.
        [server, "-m", str(model), "--mmproj", str(projector), "--port", str(port), "-c", "2048", "-np", "1",
         "-t", "2", "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit("llama-server exited:\n" + (work / "llama-server.log").read_text()[-3000:])
            time.sleep(0.5)
        # The server's media marker (it may be its own for each process).
        marker = httpx.get(f"{base}/props", timeout=10).json().get("media_marker", MEDIA)
        body = {
            "prompt": {
                "prompt_string": prompt.replace(MEDIA, marker),
                "multimodal_data": [base64.b64encode(picture_bytes).decode()],
            },
            "n_predict": GENERATE, "temperature": 0, "n_probs": TOP, "cache_prompt": False,
            "samplers": ["top_k"], "top_k": 1, "return_tokens": True, "ignore_eos": True,
        }
        reply = httpx.post(f"{base}/completion", json=body, timeout=600).json()
        # The first token's probabilities alone: llama-server groups the entries of tokens
        # that end mid-way through a UTF-8 character (random weights write such bytes).
        first_reply = httpx.post(f"{base}/completion", json={**body, "n_predict": 1}, timeout=600).json()
    finally:
        proc.terminate()
        proc.wait()
    if "completion_probabilities" not in reply:
        log_tail = (work / "llama-server.log").read_text()[-2000:]
        raise SystemExit(f"llama-server answered {json.dumps(reply)[:2000]}\n{log_tail}")
    # None where that token ends mid-way through a character: llama-server gives no
    # probabilities for it then.
    probs = first_reply.get("completion_probabilities")
    first = {t["id"]: t["logprob"] for t in probs[0]["top_logprobs"]} if probs else None
    return reply["tokens_evaluated"], reply["tokens"], first


def family(name: str, seedbar: str, server: str, work: Path):
    work.mkdir(parents=True, exist_ok=True)
    if name == "gemma3":
        folder = write_vision_checkpoint(work / "ckpt", text=GGUF_TEXT)
        size = (224, 224)
        ids = chat_ids("What is in", "this picture?")
        prompt = f"<start_of_turn>user\nWhat is in\n\n{MEDIA}\n\nthis picture?<end_of_turn>\n<start_of_turn>model\n"
    else:
        folder = write_qwen_vision_checkpoint(work / "ckpt")
        size = (224, 168)
        ids = qwen_chat_ids("Compare ", " with this.", [size])
        prompt = f"<|im_start|>user\nCompare {MEDIA} with this.<|im_end|>\n<|im_start|>assistant\n"
    model = write_vision_gguf(folder, work / "gguf")
    # llama.cpp refuses a BPE vocabulary without merges: its copy of the same weights gets one
    # that no prompt here uses (Seedbar takes the prompt's ids, so it reads the files without).
    llama_model = write_vision_gguf(folder, work / "gguf-llama", merges=["ÿ ÿ"])
    picture = work / "flat.png"
    picture_bytes = flat_picture(picture, size)
    ours, logprobs = seedbar_side(seedbar, model, ids, picture, work)
    evaluated, theirs, first = llama_side(server, llama_model, prompt, picture_bytes, work)
    agree = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    gap = (
        f"differ by at most {max(abs(logprobs[i] - lp) for i, lp in first.items()):.2e}"
        if first
        else "not reported by llama-server (the token is part of a UTF-8 character)"
    )
    print(f"{name}: prompt tokens Seedbar {len(ids)}, llama-server {evaluated}; the first reply token's "
          f"top-{TOP} log-probabilities {gap}; greedy tokens agree for {agree} of {GENERATE}")
    print(f"  Seedbar      {ours}\n  llama-server {theirs}")


def main():
    seedbar = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/debug/seedbar")
    default_server = Path.home() / ".cache/seedbar-dev/llama-server.path"
    server = sys.argv[2] if len(sys.argv) > 2 else default_server.read_text().strip()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gemma3", "qwen2_5_vl"):
            family(name, seedbar, server, Path(tmp) / name)


if __name__ == "__main__":
    main()

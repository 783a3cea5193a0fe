"""Seedbar vs mlx-lm on a GPU (MLX CUDA or Metal), same model folder, one run: aggregate
throughput of N concurrent seeded streams (Seedbar's scheduler) against mlx-lm's unseeded
`batch_generate` and against mlx-lm serving seeded requests one at a time (what mlx_lm.server
does with a seed), then prefill of 512 tokens and batch-1 decode. Every shape runs once
unmeasured first (MLX compiles kernels for new shapes at run time). Prints JSON lines and the
Seedbar / mlx-lm ratios.

Usage: python3 scripts/gpu_peer.py MODEL_DIR [STREAMS] [TOKENS]
SEEDBAR names the binary (default target/debug/seedbar); scripts/gpu-bench.sh runs this with
the binary on MLX's CUDA build. mlx-lm must be importable on the same backend."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import batch_generate, load, stream_generate
from mlx_lm.sample_utils import make_sampler

import mlx_lm_peer

PROMPTS = json.loads((Path(__file__).parent / "bench-prompts.json").read_text())
PREFILL_TOKENS, DECODE_TOKENS, TEMPERATURE = 512, 128, 0.8


def seedbar(*args: str) -> list[dict]:
    """`seedbar bench ARGS`: its JSON lines."""
    binary = os.environ.get("SEEDBAR", "target/debug/seedbar")
    out = subprocess.run([binary, "bench", *args], check=True, capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def chats(tokenizer, n: int) -> list[list[int]]:
    """The first `n` bench prompts (cycled) as chat prompts, token ids."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], add_generation_prompt=True
        )
        for i in range(n)
    ]


def batched_tok_s(model, tokenizer, n: int, tokens: int) -> float:
    """mlx-lm's `batch_generate` over `n` chats, warmed at that batch size."""
    batch, sampler = chats(tokenizer, n), make_sampler(TEMPERATURE)
    batch_generate(model, tokenizer, batch, max_tokens=8, sampler=sampler)
    started = time.perf_counter()
    reply = batch_generate(model, tokenizer, batch, max_tokens=tokens, sampler=sampler, return_token_ids=True)
    return sum(len(ids) for ids in reply.token_ids) / (time.perf_counter() - started)


def seeded_serial_tok_s(model, tokenizer, n: int, tokens: int) -> float:
    """`n` seeded chats one after another, each seeding MLX's generator as mlx_lm.server does."""
    sampler, total = make_sampler(TEMPERATURE), 0
    started = time.perf_counter()
    for seed, prompt in enumerate(chats(tokenizer, n)):
        mx.random.seed(seed)
        total += sum(1 for _ in stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=sampler))
    return total / (time.perf_counter() - started)


def main() -> None:
    model_dir = sys.argv[1]
    streams = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1,8,16,32").split(",")]
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else DECODE_TOKENS
    listed = ",".join(map(str, streams))
    # Two passes in one scheduler: the first warms every shape, the second is measured.
    ours = seedbar("throughput", "--model", model_dir, "--streams", f"{listed},{listed}", "--tokens", str(tokens))
    ours = {line["streams"]: line["aggregate_tok_s"] for line in ours[len(streams):]}
    model, tokenizer = load(model_dir)
    for n in streams:
        batched = batched_tok_s(model, tokenizer, n, tokens)
        serial = seeded_serial_tok_s(model, tokenizer, n, tokens)
        print(json.dumps({"streams": n, "seedbar_tok_s": ours[n], "mlx_lm_batch_generate_tok_s": batched,
                          "mlx_lm_seeded_serial_tok_s": serial, "vs_batch_generate": ours[n] / batched,
                          "vs_seeded_serial": ours[n] / serial}), flush=True)
    (ours_speed,) = seedbar("speed", "--model", model_dir, "--repeat", "2")
    peer = mlx_lm_peer.speed(model, tokenizer, PREFILL_TOKENS, DECODE_TOKENS, repeat=3)
    print(json.dumps({"seedbar": ours_speed, "mlx_lm": peer,
                      "prefill_ratio": ours_speed["prefill_tok_s"] / peer["prefill_tok_s"],
                      "decode_ratio": ours_speed["decode_tok_s"] / peer["decode_tok_s"]}), flush=True)


if __name__ == "__main__":
    main()

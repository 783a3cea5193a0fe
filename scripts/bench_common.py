"""What the bench scripts share (scripts/bench.py on the CPU, scripts/gpu_peer.py on a GPU):
Seedbar's `bench` JSON lines, and mlx-lm's figures on the same weights measured as Seedbar's
benches measure its own: single-stream speed, and aggregate throughput of N chats, batched
and one at a time."""

import json
import subprocess
import time
from pathlib import Path

from mlx_lm import batch_generate, stream_generate
from mlx_lm.sample_utils import make_sampler

PROMPTS = json.loads((Path(__file__).parent / "bench-prompts.json").read_text())


def seedbar_json_lines(binary, *args) -> list:
    """`BINARY bench ARGS`: its JSON lines."""
    out = subprocess.run([binary, "bench", *map(str, args)], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def speed(model, tokenizer, prompt_tokens: int, decode_tokens: int, repeat: int) -> dict:
    """The prefill of a fixed prompt and greedy batch-1 decode after it, the best of `repeat`
    runs (the first warms the shapes): {"prefill_tok_s", "decode_tok_s"}."""
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * prompt_tokens)[:prompt_tokens]
    best = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0}
    for _ in range(repeat):
        last = None
        for last in stream_generate(model, tokenizer, prompt, max_tokens=decode_tokens, sampler=make_sampler(0.0)):
            pass
        best["prefill_tok_s"] = max(best["prefill_tok_s"], last.prompt_tps)
        best["decode_tok_s"] = max(best["decode_tok_s"], last.generation_tps)
    return best


def throughput(model, tokenizer, n: int, tokens: int, warm: bool) -> dict:
    """`n` chats of the bench prompts (cycled) at temperature 0.8: batched (`batch_generate`,
    unseeded) and one at a time (how mlx_lm.server serves seeded requests) aggregate tok/s,
    with the last one's time to first token. `warm`: one short batch of that size first (MLX
    compiles kernels for new shapes at run time)."""
    batch = [
        tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], add_generation_prompt=True)
        for i in range(n)
    ]
    sampler = make_sampler(0.8)
    if warm:
        batch_generate(model, tokenizer, batch, max_tokens=8, sampler=sampler)
    start = time.perf_counter()
    response = batch_generate(model, tokenizer, batch, max_tokens=tokens, sampler=sampler, return_token_ids=True)
    batched = sum(len(ids) for ids in response.token_ids) / (time.perf_counter() - start)
    start, total, last_first = time.perf_counter(), 0, 0.0
    for prompt in batch:
        for i, _ in enumerate(stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=sampler)):
            if i == 0:
                last_first = time.perf_counter() - start
            total += 1
    serial = total / (time.perf_counter() - start)
    return {"batched_tok_s": batched, "serial_tok_s": serial, "serial_last_ttft_s": last_first}

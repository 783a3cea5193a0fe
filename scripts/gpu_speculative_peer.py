"""Speculative decoding on a GPU (MLX CUDA or Metal), Seedbar beside mlx-lm, same model folder,
one run (issue #29's GPU rows): Seedbar's `bench speculative` (each workload with prompt lookup
and without, and whether the replies were the same), then mlx-lm on the editor's request
(scripts/bench-editor.txt, greedy, one chat): plain, and with its speculative decoding by a
draft model (DRAFT_DIR, or the model itself: every draft kept, mlx-lm's best case). Every
shape runs once unmeasured first. Prints JSON lines and the ratios of Seedbar's one editor
chat with lookup to each mlx-lm figure.

Usage: python3 scripts/gpu_speculative_peer.py MODEL_DIR [DRAFT_DIR] [TOKENS]
SEEDBAR names the binary (default target/debug/seedbar); mlx-lm must import on the same
backend (the staged GPU machine: /tmp/stage/env.sh)."""

import json
import os
import sys
from pathlib import Path

from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

import bench_common

EDITOR = (Path(__file__).parent / "bench-editor.txt").read_text()
DRAFT_TOKENS = 4


def mlx_lm_decode(model, tokenizer, prompt, tokens: int, **draft) -> float:
    """Greedy decode tok/s of one chat, the best of two runs after one unmeasured."""
    best = 0.0
    for run in range(3):
        last = None
        for last in stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(0.0), **draft):
            pass
        if run:
            best = max(best, last.generation_tps)
    return best


def main() -> None:
    model_dir = sys.argv[1]
    draft_dir = sys.argv[2] if len(sys.argv) > 2 else model_dir
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    binary = os.environ.get("SEEDBAR", "target/debug/seedbar")
    ours = bench_common.seedbar_json_lines(binary, "speculative", "--model", model_dir, "--tokens", tokens)
    for line in ours:
        print(json.dumps({"seedbar": line}), flush=True)
    editor = next(line for line in ours if line["workload"] == "editor, greedy")
    model, tokenizer = load(model_dir)
    draft_model = model if draft_dir == model_dir else load(draft_dir)[0]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": EDITOR}], add_generation_prompt=True)
    plain = mlx_lm_decode(model, tokenizer, prompt, tokens)
    drafted = mlx_lm_decode(model, tokenizer, prompt, tokens, draft_model=draft_model, num_draft_tokens=DRAFT_TOKENS)
    print(json.dumps({"mlx_lm_plain_tok_s": plain, "mlx_lm_draft_model_tok_s": drafted, "draft_model": draft_dir,
                      "seedbar_lookup_tok_s": editor["speculative_tok_s"],
                      "seedbar_plain_tok_s": editor["plain_tok_s"],
                      "vs_mlx_lm_plain": editor["speculative_tok_s"] / plain,
                      "vs_mlx_lm_draft_model": editor["speculative_tok_s"] / drafted}), flush=True)


if __name__ == "__main__":
    main()

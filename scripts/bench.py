"""Seedbar vs mlx-lm on the same SmolLM2 weights, in one run: prefill of a 512-token prompt
and batch-1 decode. Prints both and the ratios (Seedbar / mlx-lm).

Run through `make bench` (which prepares everything); mlx-lm reads the MLX directory that
`seedbar convert` makes from the default GGUF."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load

ROOT = Path(__file__).resolve().parent.parent
SEEDBAR = ROOT / "target" / "debug" / "seedbar"
CACHE = Path(os.environ.get("SEEDBAR_DEV_CACHE", Path.home() / ".cache" / "seedbar-dev"))
PROMPT_TOKENS, DECODE_TOKENS, REPEAT = 512, 128, 3


def seedbar_bench(gguf: Path) -> dict:
    out = subprocess.run(
        [SEEDBAR, "bench", "--model", gguf, "--prompt-tokens", str(PROMPT_TOKENS),
         "--decode-tokens", str(DECODE_TOKENS), "--repeat", str(REPEAT)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def mlx_lm_bench(model_dir: Path) -> dict:
    model, tokenizer = load(str(model_dir))
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * PROMPT_TOKENS)[:PROMPT_TOKENS]
    best = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0}
    for _ in range(REPEAT):
        last = None
        for last in stream_generate(model, tokenizer, prompt, max_tokens=DECODE_TOKENS, sampler=make_sampler(0.0)):
            pass
        best["prefill_tok_s"] = max(best["prefill_tok_s"], last.prompt_tps)
        best["decode_tok_s"] = max(best["decode_tok_s"], last.generation_tps)
    return best


def main() -> None:
    gguf = Path((CACHE / "default-model.path").read_text().strip())
    mlx_dir = CACHE / "bench" / "smollm2-mlx"
    if not (mlx_dir / "model.safetensors").exists():
        subprocess.run([SEEDBAR, "convert", gguf, mlx_dir], check=True, capture_output=True)
    ours = seedbar_bench(gguf)
    peer = mlx_lm_bench(mlx_dir)
    print(f"SmolLM2-135M-Instruct Q4_1, prompt {PROMPT_TOKENS} tokens, decode {DECODE_TOKENS} tokens, best of {REPEAT}")
    print(f"{'':<10}{'prefill tok/s':>15}{'decode tok/s':>15}")
    print(f"{'seedbar':<10}{ours['prefill_tok_s']:>15.1f}{ours['decode_tok_s']:>15.1f}")
    print(f"{'mlx-lm':<10}{peer['prefill_tok_s']:>15.1f}{peer['decode_tok_s']:>15.1f}")
    print(f"{'ratio':<10}{ours['prefill_tok_s'] / peer['prefill_tok_s']:>14.2f}x{ours['decode_tok_s'] / peer['decode_tok_s']:>14.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

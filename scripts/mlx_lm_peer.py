"""mlx-lm's single-stream speed on a loaded model, as Seedbar's `bench speed` measures its own:
the prefill of a fixed prompt and greedy batch-1 decode after it, the best of several runs (the
first warms the shapes). Shared by scripts/bench.py (CPU) and scripts/gpu_peer.py (GPU)."""

from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler


def speed(model, tokenizer, prompt_tokens: int, decode_tokens: int, repeat: int) -> dict:
    """{"prefill_tok_s", "decode_tok_s"}: the best of `repeat` runs."""
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * prompt_tokens)[:prompt_tokens]
    best = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0}
    for _ in range(repeat):
        last = None
        for last in stream_generate(model, tokenizer, prompt, max_tokens=decode_tokens, sampler=make_sampler(0.0)):
            pass
        best["prefill_tok_s"] = max(best["prefill_tok_s"], last.prompt_tps)
        best["decode_tok_s"] = max(best["decode_tok_s"], last.generation_tps)
    return best

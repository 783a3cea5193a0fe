"""Seedbar vs mlx-lm on the same SmolLM2 weights, in one run: prefill of a 512-token prompt,
batch-1 decode, aggregate throughput at 1/2/4/8 concurrent streams (mlx-lm's batched
generation, and mlx-lm's server behaviour for seeded requests: one at a time), and Seedbar's
seeded identity rate in random concurrent mixes. Prints the ratios (Seedbar / mlx-lm). Then the
CPU peer a Linux user would pick, llama.cpp's llama-server, over HTTP, plain and with
speculative decoding on both sides (scripts/cpu_peer.py), and llama-server as a remote engine
behind Seedbar (scripts/remote_peer.py).

Run through `make bench` (which prepares everything); mlx-lm reads the MLX directory that
`seedbar convert` makes from the default GGUF."""

import json
import os
import subprocess
import sys
from pathlib import Path

import bench_common
import cpu_peer
import remote_peer
from mlx_lm.utils import load

ROOT = Path(__file__).resolve().parent.parent
SEEDBAR = ROOT / "target" / "debug" / "seedbar"
CACHE = Path(os.environ.get("SEEDBAR_DEV_CACHE", Path.home() / ".cache" / "seedbar-dev"))
PROMPT_TOKENS, DECODE_TOKENS, REPEAT = 512, 128, 3


def seedbar_bench(gguf: Path) -> dict:
    out = subprocess.run(
        [SEEDBAR, "bench", "speed", "--model", gguf, "--prompt-tokens", str(PROMPT_TOKENS),
         "--decode-tokens", str(DECODE_TOKENS), "--repeat", str(REPEAT)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def mlx_lm_bench(model_dir: Path) -> dict:
    model, tokenizer = load(str(model_dir))
    return bench_common.speed(model, tokenizer, PROMPT_TOKENS, DECODE_TOKENS, REPEAT)


STREAMS, TOKENS = [1, 2, 4, 8], 64
PROMPTS = bench_common.PROMPTS


def seedbar_json_lines(*args) -> list:
    return bench_common.seedbar_json_lines(SEEDBAR, *args)


def mlx_lm_throughput(model_dir: Path) -> dict:
    """Per stream count: batched (unseeded) and one-at-a-time (how mlx_lm.server serves seeded
    requests) aggregate tok/s, with the last stream's time to first token."""
    model, tokenizer = load(str(model_dir))
    return {n: bench_common.throughput(model, tokenizer, n, TOKENS, warm=False) for n in STREAMS}


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
    print()
    ours_tp = {r["streams"]: r for r in seedbar_json_lines("throughput", "--model", gguf, "--tokens", TOKENS)}
    peer_tp = mlx_lm_throughput(mlx_dir)
    print(f"Concurrent chats, {TOKENS} tokens each, temperature 0.8 (Seedbar: every stream seeded)")
    print(f"{'streams':<8}{'seedbar tok/s':>15}{'ttft max s':>12}{'mlx-lm batched':>16}{'mlx-lm seeded 1-by-1':>22}{'last ttft s':>13}{'vs batched':>12}{'vs seeded':>11}")
    for n in STREAMS:
        o, p = ours_tp[n], peer_tp[n]
        print(f"{n:<8}{o['aggregate_tok_s']:>15.1f}{o['ttft_max_s']:>12.2f}{p['batched_tok_s']:>16.1f}{p['serial_tok_s']:>22.1f}"
              f"{p['serial_last_ttft_s']:>13.2f}{o['aggregate_tok_s'] / p['batched_tok_s']:>11.2f}x{o['aggregate_tok_s'] / p['serial_tok_s']:>10.2f}x")
    print()
    det = seedbar_json_lines("determinism", "--model", gguf, "--mixes", 12, "--tokens", 48)[0]
    print(f"Determinism, {det['mixes']} random mixes of 2-8 concurrent seeded requests (target joins mid-stream):")
    for name in ("invariant", "non_invariant"):
        d = det[name]
        print(f"  {name:<14} identical to alone {d['identical']}/{det['mixes']} ({d['identity_rate']:.0%}), "
              f"batched aggregate {d['batched_aggregate_tok_s']:.1f} tok/s")
    print(f"  cost of invariance: {det['invariance_cost']:+.1%} (goal <= 10%)")
    print()
    sys.stdout.flush()
    llama_server = CACHE / "llama-server.path"
    if llama_server.exists():
        llama = Path(llama_server.read_text().strip())
        cpu_peer.compare(SEEDBAR, llama, gguf, PROMPTS)
        print()
        cpu_peer.compare(SEEDBAR, llama, cpu_peer.q4_k_m(llama, gguf, CACHE / "bench"), PROMPTS)
        print()
        cpu_peer.speculative(SEEDBAR, llama, gguf, PROMPTS)
        print()
        cpu_peer.draft_model(SEEDBAR, llama, gguf, PROMPTS)
        print()
        remote_peer.compare(SEEDBAR, llama, gguf)
    else:
        print("llama-server is not built: `make bench` builds it (scripts/setup.sh --bench)")


if __name__ == "__main__":
    main()

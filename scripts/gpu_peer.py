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
import sys

from mlx_lm import load

import bench_common

PREFILL_TOKENS, DECODE_TOKENS = 512, 128


def seedbar(*args) -> list:
    """`seedbar bench ARGS` with the binary SEEDBAR names: its JSON lines."""
    return bench_common.seedbar_json_lines(os.environ.get("SEEDBAR", "target/debug/seedbar"), *args)


def main() -> None:
    model_dir = sys.argv[1]
    streams = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "1,8,16,32").split(",")]
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else DECODE_TOKENS
    listed = ",".join(map(str, streams))
    # Two passes in one scheduler: the first warms every shape, the second is measured; with
    # speculation (the default) and without, and how many steps stayed pipelined.
    def passes(*extra):
        lines = seedbar("throughput", "--model", model_dir, "--streams", f"{listed},{listed}", "--tokens", tokens,
                        *extra)
        return {line["streams"]: line for line in lines[len(streams):]}
    ours, plain = passes(), passes("--no-speculative")
    model, tokenizer = load(model_dir)
    for n in streams:
        peer = bench_common.throughput(model, tokenizer, n, tokens, warm=True)
        batched, serial = peer["batched_tok_s"], peer["serial_tok_s"]
        rate = ours[n]["aggregate_tok_s"]
        print(json.dumps({"streams": n, "seedbar_tok_s": rate, "mlx_lm_batch_generate_tok_s": batched,
                          "mlx_lm_seeded_serial_tok_s": serial, "vs_batch_generate": rate / batched,
                          "vs_seeded_serial": rate / serial,
                          "seedbar_no_speculative_tok_s": plain[n]["aggregate_tok_s"],
                          "seedbar_steps": ours[n]["steps"], "seedbar_pipelined_steps": ours[n]["pipelined_steps"],
                          "seedbar_drafted": ours[n]["drafted_tokens"], "seedbar_accepted": ours[n]["accepted_tokens"],
                          "seedbar_step_ms": ours[n]["step_ms"]}), flush=True)
    (ours_speed,) = seedbar("speed", "--model", model_dir, "--repeat", 2)
    peer = bench_common.speed(model, tokenizer, PREFILL_TOKENS, DECODE_TOKENS, repeat=3)
    print(json.dumps({"seedbar": ours_speed, "mlx_lm": peer,
                      "prefill_ratio": ours_speed["prefill_tok_s"] / peer["prefill_tok_s"],
                      "decode_ratio": ours_speed["decode_tok_s"] / peer["decode_tok_s"]}), flush=True)


if __name__ == "__main__":
    main()

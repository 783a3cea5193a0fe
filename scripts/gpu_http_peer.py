"""Seedbar vs mlx_lm.server over HTTP on a GPU (MLX CUDA or Metal), same model folder, one run
(issue #28's HTTP rows): 1, 8 and 32 concurrent streamed chat requests, 128 tokens each,
end-of-reply banned; Seedbar's seeded (every reply reproducible), mlx_lm.server's unseeded
(its batched path) and, at 8 clients, seeded (which it serves one at a time). Each size runs
once unmeasured first (MLX compiles kernels for new shapes at run time). Prints aggregate
tok/s, median time to first token and the Seedbar / mlx_lm.server ratios.

Usage: python3 scripts/gpu_http_peer.py MODEL_DIR [CLIENTS] [TOKENS]
SEEDBAR names the binary (default target/debug/seedbar); mlx-lm must import on the same
backend (the staged GPU machine: /tmp/stage/env.sh)."""

import json
import os
import sys
import tempfile

import httpx

from bench_common import PROMPTS
from cpu_peer import concurrent, free_port, running

TOKENS = 128


def main() -> None:
    model_dir = sys.argv[1]
    clients = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32").split(",")]
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else TOKENS
    seedbar = os.environ.get("SEEDBAR", "target/debug/seedbar")
    ours_port, peer_port = free_port(), free_port()
    env = dict(os.environ, SEEDBAR_HOME=tempfile.mkdtemp(prefix="seedbar-http-peer-"))
    with running([seedbar, "serve", "--model", model_dir, "--port", str(ours_port)], ours_port, env=env) as ours, \
            running([sys.executable, "-m", "mlx_lm.server", "--model", model_dir, "--port", str(peer_port)],
                    peer_port, ready="/v1/models") as peer:
        name = httpx.get(ours + "/v1/models").json()["data"][0]["id"]
        for n in clients:
            concurrent(ours, name, PROMPTS, n, tokens=16)  # warm-up: this size's shapes
            concurrent(peer, model_dir, PROMPTS, n, seeded=False, tokens=16)
            a = concurrent(ours, name, PROMPTS, n, tokens=tokens)
            b = concurrent(peer, model_dir, PROMPTS, n, seeded=False, tokens=tokens)
            row = {"clients": n, "seedbar_seeded_tok_s": a["tok_s"], "seedbar_ttft_s": a["ttft_s"],
                   "mlx_lm_server_tok_s": b["tok_s"], "mlx_lm_server_ttft_s": b["ttft_s"],
                   "ratio": a["tok_s"] / b["tok_s"]}
            if n == 8:
                seeded = concurrent(peer, model_dir, PROMPTS, n, tokens=tokens)
                row |= {"mlx_lm_server_seeded_tok_s": seeded["tok_s"], "mlx_lm_server_seeded_ttft_s": seeded["ttft_s"],
                        "ratio_vs_seeded": a["tok_s"] / seeded["tok_s"]}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

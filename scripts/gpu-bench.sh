#!/usr/bin/env bash
# Seedbar's figures on a GPU (MLX CUDA or Metal) for one model folder, as JSON lines:
# the determinism mixes on the invariant and the reference layout, throughput at 1, 8, 16
# and 32 seeded streams, prefill and batch-1 decode. Usage:
#   scripts/gpu-bench.sh MODEL_DIR [MIXES] [STREAMS]
# SEEDBAR (the binary, default target/debug/seedbar) and SEEDBAR_HOME are read from the
# environment; on Linux the binary runs on MLX's CUDA build (scripts/setup.sh --cuda, see
# scripts/cuda-env.sh) unless LD_LIBRARY_PATH already starts with a libmlx's folder (one staged
# by hand). Where mlx-lm imports (PYTHON, default python3), throughput and speed run beside
# it in the same run (scripts/gpu_peer.py: ratios against batch_generate and against seeded
# one-at-a-time serving); otherwise Seedbar's alone.
set -euo pipefail
lib_path=${LD_LIBRARY_PATH:-}
if [[ "$(uname -s)" == Linux && ! -e "${lib_path%%:*}/libmlx.so" ]]; then
  cuda_env="$("$(dirname "$0")/cuda-env.sh")"
  eval "$cuda_env"
fi
model=$1 mixes=${2:-24} streams=${3:-1,8,16,32}
seedbar=${SEEDBAR:-target/debug/seedbar}
export SEEDBAR_HOME=${SEEDBAR_HOME:-$(mktemp -d)}
python=${PYTHON:-python3}
if "$python" -c 'import mlx_lm' 2>/dev/null; then
  SEEDBAR=$seedbar "$python" "$(dirname "$0")/gpu_peer.py" "$model" "$streams"
else
  "$seedbar" bench speed --model "$model" --repeat 2
  "$seedbar" bench throughput --model "$model" --streams "$streams,$streams" --tokens 128
fi
"$seedbar" bench determinism --model "$model" --mixes "$mixes" --tokens 32

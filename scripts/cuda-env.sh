#!/usr/bin/env bash
# The same Seedbar binary on MLX's CUDA build (Linux + NVIDIA, set up by scripts/setup.sh --cuda):
#   scripts/cuda-env.sh COMMAND [ARG...]   runs COMMAND with the CUDA libmlx first
#   eval "$(scripts/cuda-env.sh)"          the same for this shell (prints the export)
# LD_LIBRARY_PATH is searched before the binary's DT_RUNPATH (the CPU wheel's mlx/lib).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/scripts/versions.env"
CACHE="${SEEDBAR_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seedbar-dev}"
dir="$CACHE/cuda-$MLX_VERSION"
[[ -f "$dir/.ready" ]] || { echo "MLX's CUDA build is not set up: scripts/setup.sh --cuda" >&2; exit 1; }
export LD_LIBRARY_PATH="$dir/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
(($#)) && exec "$@"
printf 'export LD_LIBRARY_PATH=%q\n' "$LD_LIBRARY_PATH"

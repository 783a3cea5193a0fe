#!/usr/bin/env bash
# Seedbar vs mlx-lm, same weights, same run (see scripts/bench.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SEEDBAR_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seedbar-dev}"
exec "$CACHE/venv/bin/python" -u "$ROOT/scripts/bench.py"

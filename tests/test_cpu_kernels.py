"""The CPU backend runs the BLAS kernels this CPU supports: an OpenBLAS older than the CPU
falls back to its generic SSE3 kernels (half the prefill speed) unless Seedbar restarts
itself with native ones (`runtime::prepare`)."""

import json
import platform
from pathlib import Path

import pytest

GENERIC = {"Prescott", "Core2", "Penryn", "Nehalem"}


def cpu_flags() -> set:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="OpenBLAS kernel sets are an x86-64 Linux matter",
)
def test_bench_runs_native_blas_kernels(seedbar):
    if not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("this CPU has no AVX2/FMA kernels to choose")
    env = seedbar.env()
    env.pop("OPENBLAS_CORETYPE", None)
    out = seedbar.run(
        "bench", "speed", "--prompt-tokens", "16", "--decode-tokens", "2", "--repeat", "1", env=env
    ).stdout
    kernels = json.loads(out.strip().splitlines()[-1])["blas_kernels"]
    assert kernels and kernels not in GENERIC, f"OpenBLAS runs its generic {kernels} kernels"

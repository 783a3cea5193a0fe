"""The GitHub Actions workflows: both pass actionlint (the PyPI wheel's bundled binary), the
macOS one runs the README's set-up, `make test` and `make bundle` on Apple Silicon runners
and uploads the .dmg, and the Linux one runs .ci/run."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github/workflows"
# Beside the test venv's python (scripts/setup.sh --tests installs it from requirements.txt).
ACTIONLINT = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")


def run_lines(workflow):
    """Every `run:` command of a workflow, one string per step (actionlint has checked its
    syntax; the steps are read as text to stay free of a YAML package)."""
    steps, current = [], None
    for line in (WORKFLOWS / workflow).read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith(("- name:", "- uses:", "- run:")):
            current = None
        if stripped.startswith(("run:", "- run:")):
            value = stripped.split("run:", 1)[1].strip()
            current = [] if value in ("|", ">") else [value]
            steps.append(current)
        elif current is not None and stripped and not stripped.endswith(":"):
            current.append(stripped)
    return [" ".join(step) for step in steps]


def test_workflows_pass_actionlint():
    assert ACTIONLINT, "actionlint is missing: run scripts/setup.sh --tests"
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert [Path(f).name for f in files] == ["linux.yml", "macos.yml"]
    proc = subprocess.run([ACTIONLINT, "-no-color", *files], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The linter run above can fail: an unknown runner label and a bad expression."""
    assert ACTIONLINT, "actionlint is missing: run scripts/setup.sh --tests"
    broken = tmp_path / ".github/workflows/broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: macos-99-nonexistent\n"
                      "    steps:\n      - run: echo ${{ matrix.nope }\n")
    proc = subprocess.run([ACTIONLINT, "-no-color", str(broken)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "macos-99-nonexistent" in proc.stdout


def test_macos_workflow_tests_and_bundles_on_apple_silicon():
    text = (WORKFLOWS / "macos.yml").read_text()
    assert "os: [macos-14, macos-15]" in text  # arm64 runners
    runs = run_lines("macos.yml")
    assert "scripts/setup.sh --tests" in runs
    assert runs.index("make test") < runs.index("make bundle")
    assert "target/release/bundle/dmg/*.dmg" in text and "actions/upload-artifact" in text
    for cached in ("~/.cargo/registry", "target/mlx-metal", "mlx-sys-*", "~/.cache/seedbar-dev"):
        assert cached in text, cached


def test_linux_workflow_runs_ci():
    assert "bash .ci/run" in run_lines("linux.yml")


@pytest.mark.parametrize("workflow", ["macos.yml", "linux.yml"])
def test_run_lines_reads_every_step(workflow):
    """The reader above sees each step's command (a broken reader would pass the checks
    vacuously)."""
    runs = run_lines(workflow)
    assert len(runs) >= 2 and all(runs), runs

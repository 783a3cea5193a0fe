"""scripts/setup.sh's macOS paths, run here with a stubbed `uname` of Darwin: the prerequisite
check (Xcode's Metal toolchain, CMake, Rust, Node.js, Python >= 3.10) names everything missing
at once with the command that installs it and stops before any work; SEEDBAR_SETUP_BREW=1
runs Homebrew; sha256 checks use `shasum -a 256 -c` on a file (never sha256sum, never a pipe);
the chosen Python is the first python3.x >= 3.10; .cargo/config.toml gets mlx-sys's settings.
On Linux, `--macos-check` installs (once) the Debian Rust of the macOS compile check and writes
its cargo config; `--tests` does not. `--cuda` stops before any work, with the reason, without
Linux x86_64 or an NVIDIA driver with a GPU; with them it installs (once) the sha256-pinned
mlx-cuda and NVIDIA wheels into one folder, whose libmlx scripts/cuda-env.sh puts first.

The script runs from a copy of the repository's scripts in a temporary root (ROOT comes from
the script's own path, so nothing of the real checkout or cache is touched), with a PATH of
stub executables (each records its call) and links to a few basic tools only."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASIC_TOOLS = ["bash", "env", "cat", "sed", "sort", "head", "cut", "mkdir", "ln", "rm", "touch",
               "grep", "dirname", "basename", "id", "tr", "ls", "chmod", "wc", "cmp", "mv"]
MODEL_BYTES = b"not really a GGUF, but its sha256 is pinned in the sandbox's versions.env\n"

# A stub records "<name> <args>" in $STUB_LOG, then runs its body (sh).
STUB = '#!/bin/sh\necho "{name} $*" >>"$STUB_LOG"\n{body}\n'

# shasum as macOS has it: `-a 256 FILE` prints the digest, `-a 256 -c [--status] LIST` checks
# LIST, which must be a file: a pipe or stdin is refused, as macOS 15's shasum does.
SHASUM = r'''#!{python} -S
import hashlib, os, stat, sys
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write("shasum " + " ".join(args) + "\n")
    if "-c" in args:
        lst = args[-1]
        if lst == "-" or not stat.S_ISREG(os.stat(lst).st_mode):
            print("shasum: -c needs a regular file, not a pipe", file=sys.stderr)
            sys.exit(2)
        log.write("shasum-list " + open(lst).read())
assert args[:2] == ["-a", "256"], args
if "-c" in args:
    for line in open(args[-1]).read().splitlines():
        digest, name = line.split("  ", 1)
        with open(name, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                sys.exit(1)
    sys.exit(0)
with open(args[-1], "rb") as f:
    print(hashlib.sha256(f.read()).hexdigest() + "  " + args[-1])
'''

GOOD = {
    "uname": 'case "$1" in -m) echo arm64 ;; *) echo Darwin ;; esac',
    "xcodebuild": 'echo "Xcode 16.2"; echo "Build version 16C5032a"',
    "xcrun": 'case "$*" in *-f*) echo /Applications/Xcode.app/Contents/Developer/usr/bin/metal ;;'
             ' *) echo "Apple metal version 32023.404" ;; esac',
    "cmake": 'echo "cmake version 3.31.6"',
    "cargo": 'echo "cargo 1.95.0 (f2d3ce0bd 2026-03-21)"',
    "node": 'echo v22.12.0',
    "npm": '[ "$1" = ci ] && mkdir -p node_modules; exit 0',
    "python3": 'echo "Python 3.9.6"',
    "python3.12": 'case "$1" in --version) echo "Python 3.12.8" ;; *) exit 1 ;; esac',
    "brew": 'exit 0',
    # Linux's tool: the Darwin paths must never call it.
    "sha256sum": 'echo "sha256sum: not on macOS 14" >&2; exit 127',
}


class Sandbox:
    def __init__(self, tmp: Path, stubs: dict):
        self.tmp = tmp
        self.root = tmp / "repo"
        self.cache = tmp / "cache"
        self.log = tmp / "calls.log"
        (self.root / "scripts").mkdir(parents=True)
        (self.root / "ui").mkdir()
        (self.root / "tests").mkdir()
        (tmp / "home").mkdir()
        shutil.copy2(ROOT / "scripts/setup.sh", self.root / "scripts/setup.sh")
        shutil.copy2(ROOT / "Cargo.toml", self.root / "Cargo.toml")
        shutil.copy2(ROOT / "tests/requirements.txt", self.root / "tests/requirements.txt")
        shutil.copy2(ROOT / "tests/requirements-no-deps.txt", self.root / "tests/requirements-no-deps.txt")
        (self.root / "ui/package-lock.json").write_text('{"lockfileVersion": 3}\n')
        pins = {}
        lines = []
        for line in (ROOT / "scripts/versions.env").read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                pins[key] = value
                if key in ("SMOLLM2_SHA256", "MINILM_SHA256"):
                    line = f"{key}={hashlib.sha256(MODEL_BYTES).hexdigest()}"
            lines.append(line)
        (self.root / "scripts/versions.env").write_text("\n".join(lines) + "\n")
        self.pins = pins
        # The Tauri CLI as already fetched (its download is no concern here).
        tauri = self.cache / f"tauri-cli-{pins['TAURI_CLI_VERSION']}"
        tauri.mkdir(parents=True)
        (tauri / ".ready").touch()
        self.model = self.cache / "models" / Path(pins["SMOLLM2_GGUF"]).name
        self.embedding_model = self.cache / "models" / pins["MINILM_NAME"]
        self.tools = tmp / "tools"
        self.tools.mkdir()
        for tool in BASIC_TOOLS:
            (self.tools / tool).symlink_to(shutil.which(tool))
        self.stubs = tmp / "stubs"
        self.stubs.mkdir()
        for name, body in stubs.items():
            self.stub(name, body)
        shasum = self.stubs / "shasum"
        shasum.write_text(SHASUM.replace("{python}", sys.executable))
        shasum.chmod(0o755)

    def stub(self, name: str, body: str):
        path = self.stubs / name
        path.write_text(STUB.format(name=name, body=body))
        path.chmod(0o755)

    def run(self, *args, **env):
        full_env = {
            "PATH": f"{self.stubs}:{self.tools}",
            "HOME": str(self.tmp / "home"),
            "SEEDBAR_DEV_CACHE": str(self.cache),
            "STUB_LOG": str(self.log),
            "LANG": "C",
            **env,
        }
        proc = subprocess.run([shutil.which("bash"), str(self.root / "scripts/setup.sh"), *args],
                              env=full_env, capture_output=True, text=True, timeout=30)
        self.calls = self.log.read_text().splitlines() if self.log.exists() else []
        return proc

    def called(self, name: str):
        return [c for c in self.calls if c == name or c.startswith(name + " ")]


def assert_no_work(box: Sandbox):
    """Stopped at the check: no hashing, downloads, npm, cargo config or model path."""
    assert not box.called("shasum") and not box.called("sha256sum")
    assert not box.called("npm") and not box.called("brew install")
    assert not [c for c in box.calls if " -m " in f" {c} "]
    assert not (box.root / ".cargo").exists()
    assert not (box.cache / "default-model.path").exists()


def test_missing_prerequisites_are_named_with_homebrew_commands(tmp_path):
    stubs = dict(GOOD)
    stubs["xcrun"] = 'echo "xcrun: error: unable to find utility \\"metal\\"" >&2; exit 72'
    stubs["cmake"] = 'echo "cmake version 3.22.1"'
    stubs["node"] = "echo v18.20.4"
    del stubs["cargo"], stubs["python3.12"]
    box = Sandbox(tmp_path, stubs)
    proc = box.run()
    assert proc.returncode != 0, proc.stderr
    err = proc.stderr
    assert "macOS prerequisites missing:" in err
    assert "the Metal toolchain (xcrun -f metal fails): xcodebuild -downloadComponent MetalToolchain" in err
    assert "CMake 3.22.1 is too old (need >= 3.25): brew install cmake" in err
    assert "Rust (cargo not found): brew install rust" in err
    assert "Node.js 18.20.4 is too old (need >= 20.19.0): brew install node" in err
    assert "Python >= 3.10 (python3 is 3.9.6; the Command Line Tools give 3.9): brew install python@3.12" in err
    assert "all of Homebrew's at once: brew install cmake rust node python@3.12" in err
    assert "ready" not in err
    assert_no_work(box)


def test_without_xcode_or_homebrew(tmp_path):
    stubs = dict(GOOD)
    stubs["xcodebuild"] = ('echo "xcode-select: error: tool \'xcodebuild\' requires Xcode, but active'
                           ' developer directory \'/Library/Developer/CommandLineTools\' is a command'
                           ' line tools instance" >&2; exit 1')
    del stubs["brew"], stubs["cmake"]
    box = Sandbox(tmp_path, stubs)
    proc = box.run("--tests")
    assert proc.returncode != 0, proc.stderr
    err = proc.stderr
    assert ("Xcode (the Command Line Tools alone have no Metal compiler): install Xcode, then: "
            "sudo xcode-select -s /Applications/Xcode.app/Contents/Developer && "
            "xcodebuild -downloadComponent MetalToolchain") in err
    assert "CMake >= 3.25 (not found): brew install cmake (after installing Homebrew)" in err
    assert "Homebrew is not on PATH: install it, then: brew install cmake" in err
    # What is there is not reported.
    assert "Node.js" not in err and "Python" not in err and "Rust" not in err
    assert not box.called("xcrun")
    assert_no_work(box)


def test_check_only_stops_after_a_passing_check(tmp_path):
    box = Sandbox(tmp_path, GOOD)
    proc = box.run("--tests", SEEDBAR_SETUP_CHECK_ONLY="1")
    assert proc.returncode == 0, proc.stderr
    assert "prerequisites: ok" in proc.stderr
    assert box.called("xcrun") and box.called("cmake") and box.called("node")
    assert_no_work(box)


def test_brew_mode_installs_what_is_missing_then_checks_again(tmp_path):
    stubs = dict(GOOD)
    stubs["node"] = "echo v18.20.4"
    # Homebrew's install of node puts a current one in its place.
    stubs["brew"] = (f'[ "$1" = install ] && printf \'#!/bin/sh\\necho v22.12.0\\n\' >"{tmp_path}/stubs/node"'
                     '; exit 0')
    box = Sandbox(tmp_path, stubs)
    proc = box.run(SEEDBAR_SETUP_BREW="1", SEEDBAR_SETUP_CHECK_ONLY="1")
    assert proc.returncode == 0, proc.stderr
    assert box.called("brew install") == ["brew install node"]
    assert "prerequisites: ok" in proc.stderr


def test_darwin_run_checks_sha256_with_shasum_on_a_file(tmp_path):
    box = Sandbox(tmp_path, GOOD)
    box.embedding_model.mkdir(parents=True)
    (box.embedding_model / "model.safetensors").write_bytes(MODEL_BYTES)
    box.model.write_bytes(MODEL_BYTES)
    proc = box.run()
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stderr
    assert not box.called("sha256sum")
    checks = [c for c in box.called("shasum") if " -c " in c]
    assert checks, box.calls
    assert all(c.startswith("shasum -a 256 -c --status ") for c in checks)
    assert f"shasum-list {hashlib.sha256(MODEL_BYTES).hexdigest()}  {box.model}" in box.calls
    # The model was cached and good: nothing fetched, its path recorded.
    assert not [c for c in box.calls if "pip" in c]
    assert (box.cache / "default-model.path").read_text().strip() == str(box.model)
    assert (box.cache / "embedding-model.path").read_text().strip() == str(box.embedding_model)
    # The UI's lock file hashed by shasum too (npm ci ran once, its stamp is the real digest).
    lock = box.root / "ui/package-lock.json"
    assert f"shasum -a 256 {lock}" in box.calls
    assert box.called("npm ci")
    stamp = (box.root / "ui/node_modules/.seedbar-lock").read_text().strip()
    assert stamp == hashlib.sha256(lock.read_bytes()).hexdigest()
    # mlx-sys's build of MLX: the metallib in the target dir, a Release CMake build.
    config = (box.root / ".cargo/config.toml").read_text()
    assert f'MLX_RS_METAL_PATH = {{ value = "{box.root}/target/mlx-metal", force = true }}' in config
    assert "[profile.dev.package.mlx-sys]\ndebug-assertions = false" in config
    assert "x86_64-unknown-linux-gnu" not in config


def test_darwin_fetch_uses_the_checked_python(tmp_path):
    box = Sandbox(tmp_path, GOOD)
    box.model.parent.mkdir(parents=True)
    box.model.write_bytes(b"a corrupted download\n")
    proc = box.run()
    # The bad sha256 sends it to fetch the model with python3.12 (>= 3.10), not python3 (3.9);
    # the stub's pip fails, and so does set-up.
    assert proc.returncode != 0
    assert "model: fetching" in proc.stderr
    assert [c for c in box.calls if c.startswith("python3.12 -m pip download")]
    assert not [c for c in box.calls if c.startswith("python3 -m")]
    assert not box.called("sha256sum")


def test_linux_has_no_macos_check(tmp_path):
    stubs = {"uname": 'case "$1" in -m) echo x86_64 ;; *) echo Linux ;; esac'}
    box = Sandbox(tmp_path, stubs)
    proc = box.run(SEEDBAR_SETUP_CHECK_ONLY="1")
    assert proc.returncode == 0, proc.stderr
    assert "macOS" not in proc.stderr
    assert box.called("uname")
    assert not box.called("xcodebuild") and not box.called("cmake") and not box.called("shasum")


# Debian's Rust that scripts/check-macos.sh type-checks the macOS code with.
MACOS_COMPILE_CHECK_PACKAGES = ["rustc-web", "cargo-web", "rust-web-src"]


def linux_sandbox(tmp: Path) -> Sandbox:
    """A Linux x86_64 run of `setup.sh` with everything but the macOS compile check's
    Rust already in place; dpkg-query reports installed what $tmp/installed lists (apt-get's
    stub adds to it)."""
    installed = tmp / "installed"
    box = Sandbox(tmp, {
        "uname": 'case "$1" in -m) echo x86_64 ;; *) echo Linux ;; esac',
        "dpkg-query": f'grep -qx "$3" "{installed}" && echo "install ok installed"; exit 0',
        "apt-get": f'[ "$3" = install ] && shift 5 && printf "%s\\n" "$@" >>"{installed}"; exit 0',
        "sudo": 'exec "$@"',
        "node": "echo v22.12.0",
        "npm": GOOD["npm"],
    })
    (box.tools / "sha256sum").symlink_to(shutil.which("sha256sum"))
    shutil.copy2(ROOT / "scripts/apt-packages.txt", box.root / "scripts/apt-packages.txt")
    packages = (ROOT / "scripts/apt-packages.txt").read_text().splitlines()
    installed.write_text("".join(f"{p}\n" for p in packages if not p.startswith("#")))
    mlx = box.cache / f"mlx-{box.pins['MLX_VERSION']}-sys-{box.pins['MLX_SYS_VERSION']}"
    mlx.mkdir(parents=True)
    (mlx / ".ready").touch()
    box.embedding_model.mkdir(parents=True)
    (box.embedding_model / "model.safetensors").write_bytes(MODEL_BYTES)
    box.model.write_bytes(MODEL_BYTES)
    # setup.sh's stamp: 8 hex digits of each requirements file's sha256.
    stamp = "".join(
        hashlib.sha256((ROOT / "tests" / name).read_bytes()).hexdigest()[:8]
        for name in ("requirements.txt", "requirements-no-deps.txt")
    )
    (box.cache / "venv").mkdir()
    (box.cache / "venv" / f".req-{stamp}").touch()
    box.mlx_dir = mlx
    return box


def test_linux_macos_check_setup_installs_its_rust_once(tmp_path):
    box = linux_sandbox(tmp_path)
    proc = box.run("--macos-check")
    assert proc.returncode == 0, proc.stderr
    installs = [c for c in box.called("apt-get") if " install " in c]
    packages = " ".join(MACOS_COMPILE_CHECK_PACKAGES)
    assert installs == [f"apt-get -o DPkg::Lock::Timeout=900 install -y -qq {packages}"]
    config = (box.cache / "macos-check.toml").read_text()
    bindings = box.mlx_dir / "bindings"
    assert f'[target.aarch64-apple-darwin.mlx]\nrustc-env = {{ OUT_DIR = "{bindings}" }}' in config
    # Again: all installed, nothing fetched, the same config.
    box.log.unlink()
    proc = box.run("--macos-check")
    assert proc.returncode == 0, proc.stderr
    assert not box.called("apt-get")
    assert [c for c in box.called("dpkg-query") if c.endswith(" rust-web-src")]
    assert (box.cache / "macos-check.toml").read_text() == config


def test_linux_test_setup_skips_the_macos_compile_check(tmp_path):
    box = linux_sandbox(tmp_path)
    proc = box.run("--tests")
    assert proc.returncode == 0, proc.stderr
    assert not box.called("apt-get")
    assert not [c for c in box.called("dpkg-query") if c.endswith(" rustc-web")]
    assert not (box.cache / "macos-check.toml").exists()


# `setup.sh --cuda` (Linux + NVIDIA, opt-in): the stubbed nvidia-smi of a machine with a GPU.
NVIDIA_SMI = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"'
# pip as the CUDA install calls it: records the requirements file, lays out the wheels' folders.
PIP_TARGET = ('while [ $# -gt 0 ]; do case "$1" in --target) t=$2 ;; -r) r=$2 ;; esac; shift; done\n'
              'cat "$r" >"$STUB_LOG.requirements"\n'
              'mkdir -p "$t/mlx/lib" "$t/mlx/include" "$t/mlx_cuda_13.libs"\n'
              'touch "$t/mlx/lib/libmlx.so" "$t/mlx_cuda_13.libs/libblas-0.so.3"')


def cuda_dirs(box: Sandbox):
    return sorted(p.name for p in box.cache.glob("cuda*"))


def test_cuda_without_an_nvidia_driver_stops_before_any_work(tmp_path):
    box = linux_sandbox(tmp_path)
    for env in ({}, {"SEEDBAR_SETUP_CHECK_ONLY": "1"}):
        proc = box.run("--cuda", **env)
        assert proc.returncode != 0, proc.stderr
        assert ("setup.sh --cuda: no NVIDIA driver here (nvidia-smi not found). "
                "The CPU build works without it: scripts/setup.sh, make run.") in proc.stderr
        assert "ready" not in proc.stderr and "prerequisites: ok" not in proc.stderr
        assert not box.called("dpkg-query") and not box.called("python3")
        assert cuda_dirs(box) == []
        assert not (box.root / ".cargo").exists()


def test_cuda_needs_linux_x86_64_and_a_gpu(tmp_path):
    cases = [
        ('case "$1" in -m) echo aarch64 ;; *) echo Linux ;; esac', NVIDIA_SMI,
         "MLX's CUDA build is for Linux x86_64 only, this is Linux aarch64"),
        ('case "$1" in -m) echo x86_64 ;; *) echo Linux ;; esac',
         'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."; exit 9',
         "the NVIDIA driver finds no GPU (nvidia-smi -L fails)"),
    ]
    for i, (uname, nvidia_smi, why) in enumerate(cases):
        box = Sandbox(tmp_path / str(i), {"uname": uname, "nvidia-smi": nvidia_smi})
        proc = box.run("--cuda", SEEDBAR_SETUP_CHECK_ONLY="1")
        assert proc.returncode != 0, proc.stderr
        assert f"setup.sh --cuda: {why}. The CPU build works without it" in proc.stderr
        assert cuda_dirs(box) == []


def test_cuda_installs_the_pinned_wheels_once(tmp_path):
    box = linux_sandbox(tmp_path)
    box.stub("nvidia-smi", NVIDIA_SMI)
    box.stub("python3", PIP_TARGET)
    shutil.copy2(ROOT / "scripts/cuda-env.sh", box.root / "scripts/cuda-env.sh")
    proc = box.run("--cuda", SEEDBAR_SETUP_CHECK_ONLY="1")
    assert proc.returncode == 0 and "prerequisites: ok" in proc.stderr, proc.stderr
    assert box.called("nvidia-smi") == ["nvidia-smi -L"] and not box.called("python3")
    proc = box.run("--cuda")
    assert proc.returncode == 0, proc.stderr
    cuda = box.cache / f"cuda-{box.pins['MLX_VERSION']}"
    assert cuda_dirs(box) == [cuda.name]
    # Every wheel pinned to a version and the sha256 of its wheel; pip refuses any other, and
    # any requirement of theirs left unpinned.
    [pip] = box.called("python3")
    assert pip == (f"python3 -m pip install -q --no-cache-dir --no-compile --require-hashes "
                   f"--target {cuda}.new -r {cuda}.new/.requirements")
    requirements = [r for r in Path(f"{box.log}.requirements").read_text().splitlines() if r]
    names = {r.split("==")[0] for r in requirements}
    assert requirements[0] == (f"mlx-cuda-13=={box.pins['MLX_VERSION']} "
                               f"--hash=sha256:{box.pins['MLX_CUDA_SHA256']}")
    assert names == {"mlx-cuda-13", "nvidia-cublas", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime",
                     "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-nccl-cu13", "nvidia-nvjitlink"}
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+ --hash=sha256:[0-9a-f]{64}", r) for r in requirements)
    assert (cuda / ".ready").exists() and (cuda / "mlx/include").is_dir()
    assert os.readlink(cuda / "mlx_cuda_13.libs/libblas-0.so.3").endswith("libopenblas.so.0")
    # The same binaries run with the CUDA libmlx first on LD_LIBRARY_PATH.
    env = subprocess.run([str(box.root / "scripts/cuda-env.sh")], capture_output=True, text=True,
                         env={"PATH": str(box.tools), "SEEDBAR_DEV_CACHE": str(box.cache)})
    assert env.stdout == f"export LD_LIBRARY_PATH={cuda}/mlx/lib\n", env.stderr
    # Again: installed, nothing fetched.
    box.log.unlink()
    proc = box.run("--cuda")
    assert proc.returncode == 0, proc.stderr
    assert not box.called("python3")

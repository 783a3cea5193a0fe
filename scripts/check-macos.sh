#!/usr/bin/env bash
# Type-checks the app and the CLI for macOS (aarch64-apple-darwin) on this Linux machine, so
# code under cfg(target_os = "macos") is compiled at least this far before a Mac sees it:
#   scripts/check-macos.sh [CARGO ARGS]   (`make check-macos`; `make test` runs it)
# - the compiler: Debian's rustc-web and cargo-web with their std source (rust-web-src), std
#   built for the target by -Zbuild-std (RUSTC_BOOTSTRAP: that flag is unstable; rustup's
#   toolchain has no std for the target here); its own target dir, target/macos-check;
# - mlx-sys's build script (CMake, bindgen, Xcode) replaced by the Linux bindings, in the
#   cargo config that scripts/setup.sh --tests writes ($CACHE/macos-check.toml);
# - the other C parts (objc2's exception helper, ring, oniguruma, esaxx) compiled by the stub
#   tools in scripts/macos-check/: a check links nothing, so empty objects do;
# - warnings are errors (build.warnings), as clippy's -D warnings makes them on Linux;
# - no optimization (the workspace's profile optimizes every dependency): only the build
#   scripts, the proc macros and std are compiled to code here, and they run once.
# Nothing is linked or run: a type check, not a macOS build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SEEDBAR_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seedbar-dev}"
if [[ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]]; then
  echo "check-macos: runs on Linux x86_64 only (a Mac builds the real thing)"
  exit 0
fi
CONFIG="$CACHE/macos-check.toml" STD_SRC=/usr/lib/rustlib/src/rust/library
if [[ ! -f "$CONFIG" || ! -x /usr/bin/rustc || ! -x /usr/bin/cargo || ! -d "$STD_SRC" ]]; then
  echo "check-macos: Debian's rustc-web, cargo-web and rust-web-src or $CONFIG are missing:" \
    "run scripts/setup.sh --tests" >&2
  exit 1
fi
stub="$ROOT/scripts/macos-check"
cd "$ROOT"
RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$ROOT/target/macos-check" \
  CC_aarch64_apple_darwin="$stub/cc" CXX_aarch64_apple_darwin="$stub/cc" \
  AR_aarch64_apple_darwin="$stub/ar" \
  /usr/bin/cargo check --config "$CONFIG" -Zbuild-std=std,panic_abort \
  -Zwarnings --config 'build.warnings="deny"' --config 'profile.dev.package."*".opt-level=0' \
  --target aarch64-apple-darwin -p seedbar-cli -p seedbar-app "$@"
echo "check-macos: seedbar-cli and seedbar-app type-check for aarch64-apple-darwin"

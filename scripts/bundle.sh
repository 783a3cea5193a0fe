#!/usr/bin/env bash
# Bundle the app with the Tauri CLI: `scripts/bundle.sh` (macOS: Seedbar.app and a .dmg in
# target/release/bundle/), extra arguments go to `tauri build` (e.g. --debug, --bundles deb).
#
# The CLI wants tauri.conf.json beside the app's Cargo.toml (src-tauri/), while ours lives at
# the repository root (the layout asks for it; the crate reads it with generate_context!).
# So for the CLI's run a copy with its paths rebased onto src-tauri/ is written there, and
# removed afterwards. Both resolve to the same files (bundle.macOS.files and .infoPlist too:
# mlx.metallib from target/mlx-metal/, where scripts/setup.sh has mlx-sys put it, and
# Info.plist's LSUIElement). On macOS the built Seedbar.app is then checked by
# scripts/check-bundle.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SEEDBAR_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seedbar-dev}"
COPY="$ROOT/src-tauri/tauri.conf.json"
[[ -x "$CACHE/tauri" ]] || { echo "the Tauri CLI is missing: run scripts/setup.sh" >&2; exit 1; }
[[ -f "$ROOT/ui/dist/index.html" ]] || { echo "ui/dist is missing: run make ui" >&2; exit 1; }
STAMP="$(mktemp)" # older than the bundle this run makes
trap 'rm -f "$COPY" "$STAMP"' EXIT
node -e '
const fs = require("fs");
const config = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
config.build.frontendDist = "../" + config.build.frontendDist;
config.bundle.icon = config.bundle.icon.map((p) => "../" + p);
const mac = config.bundle.macOS || {};
if (mac.infoPlist) mac.infoPlist = "../" + mac.infoPlist;
for (const key of Object.keys(mac.files || {})) mac.files[key] = "../" + mac.files[key];
fs.writeFileSync(process.argv[2], JSON.stringify(config, null, 2) + "\n");
' "$ROOT/tauri.conf.json" "$COPY"
cd "$ROOT/src-tauri"
"$CACHE/tauri" build "$@"
if [[ "$(uname -s)" == Darwin ]]; then
  for app in "$ROOT"/target/{release,debug}/bundle/macos/Seedbar.app \
    "$ROOT"/target/*/{release,debug}/bundle/macos/Seedbar.app; do
    if [[ -d "$app" && "$app" -nt "$STAMP" ]]; then "$ROOT/scripts/check-bundle.sh" "$app"; fi
  done
fi

#!/usr/bin/env bash
# Checks a built Seedbar.app (what `make bundle` makes; scripts/bundle.sh runs this on macOS):
#   scripts/check-bundle.sh path/to/Seedbar.app
# - Contents/Resources/mlx.metallib is there and not empty (MLX's Metal kernels; without it
#   the first GPU op fails on any Mac but the builder's)
# - Contents/Info.plist has LSUIElement true (a menu-bar app: no Dock icon at launch)
# - the main binary (CFBundleExecutable) is in Contents/MacOS
# - no load command of the binary (otool -L, and its LC_RPATHs) points into a home directory
#   (/Users/..., $HOME): the app must not depend on the builder's files. Needs otool (macOS);
#   skipped, with a note, where there is none.
# Prints every failure and exits 1 if there was any. plutil reads Info.plist on macOS,
# Python's plistlib elsewhere.
set -uo pipefail
APP="${1:?usage: scripts/check-bundle.sh path/to/Seedbar.app}"
failures=0
fail() { printf 'check-bundle: FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }
ok() { printf 'check-bundle: ok: %s\n' "$*"; }

# plist_value KEY: the value of a top-level key of Contents/Info.plist ("true"/"false" for
# booleans), empty if it is absent.
plist_value() {
  local plist="$APP/Contents/Info.plist"
  if command -v plutil >/dev/null; then
    plutil -extract "$1" raw -o - "$plist" 2>/dev/null
  else
    python3 - "$plist" "$1" <<'PY'
import plistlib, sys
with open(sys.argv[1], "rb") as f:
    value = plistlib.load(f).get(sys.argv[2])
if value is not None:
    print(str(value).lower() if isinstance(value, bool) else value)
PY
  fi
}

[[ -d "$APP/Contents" ]] || { fail "$APP is not an app bundle (no Contents/)"; exit 1; }

metallib="$APP/Contents/Resources/mlx.metallib"
if [[ ! -f "$metallib" ]]; then
  fail "Contents/Resources/mlx.metallib is missing (bundle.macOS.files in tauri.conf.json; built with MLX_RS_METAL_PATH by scripts/setup.sh)"
elif [[ ! -s "$metallib" ]]; then
  fail "Contents/Resources/mlx.metallib is empty"
else
  ok "Contents/Resources/mlx.metallib ($(wc -c <"$metallib" | tr -d ' ') bytes)"
fi

exe=""
if [[ ! -f "$APP/Contents/Info.plist" ]]; then
  fail "Contents/Info.plist is missing"
else
  ui_element="$(plist_value LSUIElement)"
  case "$ui_element" in
    true | 1 | YES) ok "Info.plist: LSUIElement is true" ;;
    "") fail "Info.plist has no LSUIElement (the Dock icon would show at launch; see Info.plist beside tauri.conf.json)" ;;
    *) fail "Info.plist: LSUIElement is $ui_element, not true" ;;
  esac
  exe="$(plist_value CFBundleExecutable)"
  [[ -n "$exe" ]] || fail "Info.plist has no CFBundleExecutable"
fi

binary=""
if [[ -n "$exe" ]]; then
  if [[ -f "$APP/Contents/MacOS/$exe" && -x "$APP/Contents/MacOS/$exe" ]]; then
    binary="$APP/Contents/MacOS/$exe"
    ok "main binary Contents/MacOS/$exe"
  else
    fail "the main binary Contents/MacOS/$exe is missing or not executable"
  fi
fi

if [[ -n "$binary" ]]; then
  if command -v otool >/dev/null; then
    if ! libs="$(otool -L "$binary" 2>&1)"; then
      fail "otool -L $binary failed: $libs"
    else
      # otool -L: "\t<path> (compatibility ...)" per library (lines naming the file or an
      # architecture start without a tab); otool -l: each LC_RPATH's "path <dir> (offset N)".
      paths="$(printf '%s\n' "$libs" | sed -n 's/^[[:space:]]\{1,\}\([^[:space:]].*\) (.*/\1/p')
$(otool -l "$binary" 2>/dev/null | sed -n '/cmd LC_RPATH/,/path /s/^[[:space:]]*path \(.*\) (offset.*/\1/p')"
      home="${HOME:-}"
      [[ "$home" == / ]] && home=""
      home_refs=0
      while IFS= read -r ref; do
        if [[ "$ref" == /Users/* || (-n "$home" && "$ref" == "${home%/}"/*) ]]; then
          fail "load command points into a home directory: $ref"
          home_refs=$((home_refs + 1))
        fi
      done <<<"$paths"
      ((home_refs)) || ok "no load command points into a home directory"
    fi
  else
    echo "check-bundle: note: no otool here, the binary's load commands were not checked" >&2
  fi
fi

if ((failures)); then
  echo "check-bundle: $failures check(s) failed for $APP" >&2
  exit 1
fi
echo "check-bundle: $APP is good"

"""scripts/check-bundle.sh on Seedbar.app layouts built here: a good one passes; one without
mlx.metallib, one with an empty metallib, one without LSUIElement, one without its main
binary and one whose binary loads a library from the builder's home fail, each naming what is
wrong. `otool` is a stub (the fake binary is no Mach-O file), which prints what the test
gives it; Info.plist is read by plutil on macOS and by Python's plistlib elsewhere."""

import json
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/check-bundle.sh"
EXE = "seedbar-app"
CLEAN_LIBS = ("\t/System/Library/Frameworks/Metal.framework/Versions/A/Metal (compatibility version 1.0.0)\n"
              "\t/usr/lib/libc++.1.dylib (compatibility version 1.0.0, current version 1800.101.0)\n")


def make_app(tmp: Path, *, metallib=b"MTLB" + bytes(64), plist_extra=None, ui_element=True,
             binary=True) -> Path:
    app = tmp / "Seedbar.app"
    (app / "Contents/MacOS").mkdir(parents=True)
    (app / "Contents/Resources").mkdir()
    info = {"CFBundleExecutable": EXE, "CFBundleIdentifier": "dev.seedbar.Seedbar",
            "CFBundleName": "Seedbar", **(plist_extra or {})}
    if ui_element is not None:
        info["LSUIElement"] = ui_element
    with open(app / "Contents/Info.plist", "wb") as f:
        plistlib.dump(info, f)
    if metallib is not None:
        (app / "Contents/Resources/mlx.metallib").write_bytes(metallib)
    if binary:
        exe = app / "Contents/MacOS" / EXE
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return app


def check(tmp: Path, app: Path, libs=CLEAN_LIBS, rpaths=()):
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "otool.L").write_text(f"{app}/Contents/MacOS/{EXE}:\n{libs}")
    (stubs / "otool.l").write_text("".join(
        f"Load command {i}\n          cmd LC_RPATH\n      cmdsize 32\n         path {p} (offset 12)\n"
        for i, p in enumerate(rpaths)))
    otool = stubs / "otool"
    otool.write_text(f'#!/bin/sh\ncase "$1" in -L) cat "{stubs}/otool.L" ;; -l) cat "{stubs}/otool.l" ;; esac\n')
    otool.chmod(0o755)
    # python3 for the plistlib fallback, where there is no plutil.
    if not (stubs / "python3").exists():
        (stubs / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": "/Users/builder"}
    return subprocess.run([shutil.which("bash"), str(SCRIPT), str(app)], env=env,
                          capture_output=True, text=True, timeout=30)


def test_good_bundle_passes(tmp_path):
    proc = check(tmp_path, make_app(tmp_path), rpaths=["@executable_path/../Frameworks"])
    assert proc.returncode == 0, proc.stderr
    assert "FAIL" not in proc.stderr
    assert "ok: Contents/Resources/mlx.metallib (68 bytes)" in proc.stdout
    assert "ok: Info.plist: LSUIElement is true" in proc.stdout
    assert f"ok: main binary Contents/MacOS/{EXE}" in proc.stdout
    assert "ok: no load command points into a home directory" in proc.stdout
    assert "is good" in proc.stdout


@pytest.mark.parametrize(
    "broken, message",
    [
        ({"metallib": None}, "FAIL: Contents/Resources/mlx.metallib is missing"),
        ({"metallib": b""}, "FAIL: Contents/Resources/mlx.metallib is empty"),
        ({"ui_element": None}, "FAIL: Info.plist has no LSUIElement"),
        ({"ui_element": False}, "FAIL: Info.plist: LSUIElement is false, not true"),
        ({"binary": False}, f"FAIL: the main binary Contents/MacOS/{EXE} is missing or not executable"),
    ],
)
def test_each_broken_part_fails_alone(tmp_path, broken, message):
    proc = check(tmp_path, make_app(tmp_path, **broken))
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "1 check(s) failed" in proc.stderr


def test_load_commands_into_the_builders_home_fail(tmp_path):
    libs = CLEAN_LIBS + "\t/Users/builder/.mlx/lib/libmlx.dylib (compatibility version 0.0.0)\n"
    proc = check(tmp_path, make_app(tmp_path), libs=libs, rpaths=["/Users/builder/src/seedbar/target/release"])
    assert proc.returncode == 1
    assert "FAIL: load command points into a home directory: /Users/builder/.mlx/lib/libmlx.dylib" in proc.stderr
    assert ("FAIL: load command points into a home directory: /Users/builder/src/seedbar/target/release"
            in proc.stderr)
    assert "2 check(s) failed" in proc.stderr


def test_every_failure_is_reported_at_once(tmp_path):
    proc = check(tmp_path, make_app(tmp_path, metallib=None, ui_element=None, binary=False))
    assert proc.returncode == 1
    assert "mlx.metallib is missing" in proc.stderr
    assert "no LSUIElement" in proc.stderr
    assert "main binary" in proc.stderr
    assert "3 check(s) failed" in proc.stderr


def test_not_a_bundle(tmp_path):
    proc = check(tmp_path, tmp_path / "nothing.app")
    assert proc.returncode == 1
    assert "is not an app bundle" in proc.stderr


def test_bundle_config_carries_the_metallib_and_lsuielement():
    """What the check looks for is what tauri.conf.json asks Tauri to put in the bundle: the
    metallib from the folder scripts/setup.sh gives mlx-sys (MLX_RS_METAL_PATH), and the
    Info.plist (LSUIElement) merged into the generated one."""
    config = json.loads((ROOT / "tauri.conf.json").read_text())
    mac = config["bundle"]["macOS"]
    assert mac["files"] == {"Resources/mlx.metallib": "target/mlx-metal/mlx.metallib"}
    assert '"$ROOT/target/mlx-metal"' in (ROOT / "scripts/setup.sh").read_text()
    with open(ROOT / mac["infoPlist"], "rb") as f:
        assert plistlib.load(f)["LSUIElement"] is True
    assert mac["infoPlist"] == "Info.plist"  # beside tauri.conf.json, where codegen looks too


def bundle_like_make_bundle(tmp: Path, metal_dir: Path) -> Path:
    """Seedbar.app laid out as `make bundle` (Tauri's bundler) lays it out from
    tauri.conf.json: Contents/MacOS/<mainBinaryName>, each bundle.macOS.files entry at its
    key under Contents/ (copied from its source, here with target/ moved to `metal_dir`'s
    parent), and Info.plist: the keys Tauri writes merged with the repository's Info.plist."""
    config = json.loads((ROOT / "tauri.conf.json").read_text())
    mac = config["bundle"]["macOS"]
    contents = tmp / f"{config['productName']}.app/Contents"
    (contents / "MacOS").mkdir(parents=True)
    exe = contents / "MacOS" / config["mainBinaryName"]
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    for destination, source in mac["files"].items():
        assert source.startswith("target/mlx-metal/"), source
        target = contents / destination
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(metal_dir / Path(source).relative_to("target/mlx-metal"), target)
    with open(ROOT / mac["infoPlist"], "rb") as f:
        extra = plistlib.load(f)
    info = {"CFBundleExecutable": config["mainBinaryName"], "CFBundleIdentifier": config["identifier"],
            "CFBundleName": config["productName"], "LSMinimumSystemVersion": mac["minimumSystemVersion"],
            **extra}
    with open(contents / "Info.plist", "wb") as f:
        plistlib.dump(info, f)
    return contents.parent


def test_the_bundle_make_bundle_lays_out_passes(tmp_path):
    """The configuration, not a hand-made layout: what tauri.conf.json and Info.plist put in
    the bundle is what check-bundle.sh (and the app's start-up, which reads
    Contents/Resources/mlx.metallib: runtime::bundled_metallib) expects."""
    metal = tmp_path / "target/mlx-metal"
    metal.mkdir(parents=True)
    (metal / "mlx.metallib").write_bytes(b"MTLB" + bytes(1000))
    app = bundle_like_make_bundle(tmp_path, metal)
    assert (app / "Contents/Resources/mlx.metallib").stat().st_size == 1004
    proc = check(tmp_path, app)
    assert proc.returncode == 0, proc.stderr
    assert "ok: Contents/Resources/mlx.metallib (1004 bytes)" in proc.stdout
    assert "ok: Info.plist: LSUIElement is true" in proc.stdout
    assert "ok: main binary Contents/MacOS/seedbar-app" in proc.stdout

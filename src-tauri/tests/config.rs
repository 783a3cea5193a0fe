//! The root tauri.conf.json agrees with the crate and points at files that exist.

use std::path::Path;

use serde_json::Value;

fn config() -> (Value, &'static Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("src-tauri has a parent");
    let text = std::fs::read_to_string(root.join("tauri.conf.json")).unwrap();
    (serde_json::from_str(&text).unwrap(), root)
}

#[test]
fn names_and_version() {
    let (config, _) = config();
    assert_eq!(config["productName"], "Seedbar");
    assert_eq!(config["identifier"], "dev.seedbar.Seedbar");
    assert_eq!(config["mainBinaryName"], env!("CARGO_PKG_NAME"));
    // The Tauri CLI reads the version from here (the workspace root has no [package]).
    assert_eq!(config["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn bundle_files_exist() {
    let (config, root) = config();
    assert_eq!(config["build"]["frontendDist"], "ui/dist");
    let icons = config["bundle"]["icon"].as_array().unwrap();
    for name in [
        "32x32.png",
        "128x128.png",
        "128x128@2x.png",
        "icon.icns",
        "icon.ico",
    ] {
        let path = format!("icons/{name}");
        assert!(icons.iter().any(|i| i == path.as_str()), "{path} is listed");
    }
    for icon in icons {
        assert!(root.join(icon.as_str().unwrap()).is_file(), "{icon} exists");
    }
    let targets = &config["bundle"]["targets"];
    assert_eq!(*targets, serde_json::json!(["app", "dmg"]));
    assert!(config["bundle"]["macOS"]["minimumSystemVersion"].is_string());
    // Signing stays out of the repository (the CLI reads APPLE_* variables).
    assert!(config["bundle"]["macOS"]["signingIdentity"].is_null());
}

#[test]
fn tray_icons_are_pngs() {
    let (_, root) = config();
    for name in [
        "tray-template-16.png",
        "tray-template-16@2x.png",
        "tray-template-32.png",
        "tray-template-32@2x.png",
        "tray-color-32.png",
        "tray-color-32@2x.png",
    ] {
        let bytes = std::fs::read(root.join("icons").join(name)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{name}");
    }
}

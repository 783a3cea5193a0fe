//! Tauri's build step with the configuration at the repository root, after checking that
//! the chat UI has been built (`tauri.conf.json` bundles `ui/dist` into the binary).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=../ui/dist");
    println!("cargo:rerun-if-changed=../icons");
    if !Path::new("../ui/dist/index.html").exists() {
        panic!(
            "ui/dist/index.html is missing: the app bundles the chat UI, so build it first \
             (`make ui`, or `npm ci && npm run build` in ui/)"
        );
    }
    let attributes = tauri_build::Attributes::new()
        .config_path("../tauri.conf.json")
        .windows_attributes(
            tauri_build::WindowsAttributes::new().window_icon_path("../icons/icon.ico"),
        );
    if let Err(e) = tauri_build::try_build(attributes) {
        panic!("tauri-build: {e:#}");
    }
}

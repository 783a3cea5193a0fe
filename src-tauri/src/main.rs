//! `seedbar-app`: the menu-bar app's entry point (everything lives in the library, `lib.rs`).

// No console window on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() -> std::process::ExitCode {
    seedbar_app::run()
}

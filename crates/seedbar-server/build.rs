//! The commit the server is built from, for replies' receipts (`receipt.rs`): `SEEDBAR_COMMIT`
//! (empty outside a git checkout).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=SEEDBAR_COMMIT={commit}");
    // What moves when the commit does; only paths that exist (Cargo reruns a script whose
    // path is missing on every build).
    println!("cargo:rerun-if-changed=build.rs");
    for moved in ["HEAD", "refs/heads", "packed-refs"] {
        let path = format!("../../.git/{moved}");
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

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
    for moved in ["HEAD", "refs/heads", "packed-refs"] {
        println!("cargo:rerun-if-changed=../../.git/{moved}");
    }
}

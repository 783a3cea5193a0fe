//! The development set-up's default model, for the tests that need a real one: the
//! set-up (`scripts/setup.sh`) fetches it and records its path in its cache
//! (`$SEEDBAR_DEV_CACHE`, else `~/.cache/seedbar-dev`). Crates take this crate as a
//! dev-dependency only, so no product binary carries it.
//!
//! ```no_run
//! let gguf = seedbar_dev::default_model_path();
//! assert!(gguf.exists());
//! ```

use std::path::PathBuf;

/// The path of the default model's GGUF file that the set-up fetched.
///
/// # Panics
/// When the set-up has not run (the message says so).
pub fn default_model_path() -> PathBuf {
    let cache = std::env::var_os("SEEDBAR_DEV_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/seedbar-dev")
        });
    let path = std::fs::read_to_string(cache.join("default-model.path"))
        .expect("run scripts/setup.sh first: it fetches the default model");
    PathBuf::from(path.trim())
}

//! Where remotes' API keys are kept: the OS keychain where there is one (the macOS Keychain;
//! the Secret Service on a Linux desktop), else `remote-keys.json` in the data directory,
//! readable by the user alone (mode 0600). `SEEDBAR_KEY_STORE=file` skips the keychain.
//! Keys are never in `remotes.json`, the logs or an API response.

use std::{collections::BTreeMap, path::Path};

/// The file keys are kept in where there is no keychain.
pub const KEYS_FILE: &str = "remote-keys.json";

/// Where a key was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPlace {
    Keychain,
    File(String),
}

impl std::fmt::Display for KeyPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPlace::Keychain => write!(f, "the system keychain"),
            KeyPlace::File(path) => write!(f, "{path} (readable by you alone)"),
        }
    }
}

/// The keychain entry of `remote` in the data directory `root` (two data directories keep
/// keys apart).
fn entry(root: &Path, remote: &str) -> Option<keyring::Entry> {
    if std::env::var("SEEDBAR_KEY_STORE").as_deref() == Ok("file") {
        return None;
    }
    let account = format!("{}:{remote}", root.display());
    keyring::Entry::new("Seedbar remote engine", &account).ok()
}

/// Keep `key` for `remote`.
pub fn store(root: &Path, remote: &str, key: &str) -> std::io::Result<KeyPlace> {
    if let Some(entry) = entry(root, remote) {
        match entry.set_password(key) {
            Ok(()) => {
                // A key kept in the file before moves to the keychain.
                edit_file(root, |keys| keys.remove(remote).map(|_| ()))?;
                return Ok(KeyPlace::Keychain);
            }
            Err(e) => tracing::info!(error = %e, "no keychain: the key goes in a file"),
        }
    }
    edit_file(root, |keys| {
        keys.insert(remote.to_string(), key.to_string());
        Some(())
    })?;
    Ok(KeyPlace::File(root.join(KEYS_FILE).display().to_string()))
}

/// `remote`'s key, wherever it is kept.
pub fn load(root: &Path, remote: &str) -> Option<String> {
    if let Some(key) = entry(root, remote).and_then(|e| e.get_password().ok()) {
        return Some(key);
    }
    read_file(root).remove(remote)
}

/// Forget `remote`'s key, wherever it is kept.
pub fn forget(root: &Path, remote: &str) -> std::io::Result<()> {
    if let Some(entry) = entry(root, remote) {
        let _ = entry.delete_credential();
    }
    edit_file(root, |keys| keys.remove(remote).map(|_| ()))
}

fn read_file(root: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(root.join(KEYS_FILE))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

/// Apply `change` to the file's keys and write them back (only where it changed something),
/// created readable by the user alone.
fn edit_file(
    root: &Path,
    change: impl FnOnce(&mut BTreeMap<String, String>) -> Option<()>,
) -> std::io::Result<()> {
    let mut keys = read_file(root);
    if change(&mut keys).is_none() {
        return Ok(());
    }
    std::fs::create_dir_all(root)?;
    let file = root.join(KEYS_FILE);
    let temporary = file.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let json = serde_json::to_vec(&keys).map_err(std::io::Error::other)?;
    std::io::Write::write_all(&mut options.open(&temporary)?, &json)?;
    std::fs::rename(&temporary, &file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_the_file_is_the_users_alone_and_forgotten() {
        let root = std::env::temp_dir().join(format!("seedbar-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // The file path alone (a test machine's keychain is not the user's).
        edit_file(&root, |keys| {
            keys.insert("big".into(), "sk-1".into());
            Some(())
        })
        .unwrap();
        assert_eq!(
            read_file(&root).get("big").map(String::as_str),
            Some("sk-1")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(root.join(KEYS_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        edit_file(&root, |keys| keys.remove("big").map(|_| ())).unwrap();
        assert!(read_file(&root).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}

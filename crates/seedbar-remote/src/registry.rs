//! The remotes kept in the library: `remotes.json` in the data directory (API keys are not
//! in it: see [`crate::keys`]), read again whenever the file changes, so a remote added by
//! `seedbar models add-remote` is served by a running server at its next request; and
//! adding one ([`Remotes::add_probed`]): the name checked, the upstream probed, the key kept.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

use crate::{keys, probe::probe, Api, Remote, UpstreamError};

/// The file [`Remotes`] keeps in the data directory.
pub const REMOTES_FILE: &str = "remotes.json";

/// What adding or removing a remote refuses.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0}")]
    Invalid(String),
    #[error("a local model is called '{0}': give the remote another name")]
    Taken(String),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("no remote model is called '{0}'")]
    NotFound(String),
    #[error("cannot keep the remotes in {file}: {error}")]
    Io { file: String, error: std::io::Error },
}

/// A remote as someone adds it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRemote {
    pub name: String,
    pub url: String,
    #[serde(default = "openai")]
    pub api: Api,
    /// Empty: the one model the upstream serves.
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Overrides what the probe found (e.g. vLLM started with batch invariance on).
    #[serde(default)]
    pub identical_seeds: Option<bool>,
}

fn openai() -> Api {
    Api::OpenAi
}

/// The remotes of one data directory.
pub struct Remotes {
    file: PathBuf,
    /// The list as last read, and the file's time then.
    cached: Mutex<(Option<SystemTime>, Vec<Remote>)>,
}

impl Remotes {
    /// The remotes kept in `root` (none where the file is missing).
    pub fn open(root: &Path) -> Remotes {
        Remotes {
            file: root.join(REMOTES_FILE),
            cached: Mutex::new((None, Vec::new())),
        }
    }

    /// Every remote, as the file says now (an unreadable file reads as none, logged).
    pub fn list(&self) -> Vec<Remote> {
        let modified = std::fs::metadata(&self.file)
            .and_then(|m| m.modified())
            .ok();
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if cached.0 != modified || modified.is_none() {
            let read = std::fs::read_to_string(&self.file)
                .ok()
                .map(|text| serde_json::from_str::<Vec<Remote>>(&text));
            let remotes = match read {
                None => Vec::new(),
                Some(Ok(remotes)) => remotes,
                Some(Err(e)) => {
                    tracing::warn!(file = %self.file.display(), error = %e, "remotes unreadable");
                    Vec::new()
                }
            };
            *cached = (modified, remotes);
        }
        cached.1.clone()
    }

    /// The remote called `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<Remote> {
        self.list()
            .into_iter()
            .find(|r| r.name.eq_ignore_ascii_case(name))
    }

    /// Keep `remote`, replacing one of the same name.
    pub fn add(&self, remote: Remote) -> Result<(), RegistryError> {
        check_name(&remote.name)?;
        check_url(&remote.url)?;
        if remote.model.trim().is_empty() {
            return Err(RegistryError::Invalid(
                "the upstream's model id is empty".into(),
            ));
        }
        let mut remotes = self.list();
        remotes.retain(|r| !r.name.eq_ignore_ascii_case(&remote.name));
        remotes.push(remote);
        self.write(&remotes)
    }

    /// Forget the remote called `name`, and its key.
    pub fn remove(&self, name: &str) -> Result<Remote, RegistryError> {
        let mut remotes = self.list();
        let index = remotes
            .iter()
            .position(|r| r.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let removed = remotes.remove(index);
        self.write(&remotes)?;
        if removed.has_key {
            keys::forget(self.root(), &removed.name).map_err(|error| self.io(error))?;
        }
        Ok(removed)
    }

    /// Add `new` once its upstream answers with its key: the probe fills in the engine, the
    /// model id and what it supports. `local` are the local models' names, which a remote
    /// may not take.
    pub async fn add_probed(
        &self,
        new: NewRemote,
        local: &[String],
    ) -> Result<Remote, RegistryError> {
        check_name(&new.name)?;
        if local
            .iter()
            .any(|name| name.eq_ignore_ascii_case(&new.name))
        {
            return Err(RegistryError::Taken(new.name));
        }
        let mut remote = Remote::new(&new.name, &new.url, new.api, &new.model);
        check_url(&remote.url)?;
        if let Some(seconds) = new.timeout_s {
            remote.timeout_s = seconds.max(1);
        }
        let key = new.key.filter(|k| !k.trim().is_empty());
        probe(&mut remote, key.clone()).await?;
        if let Some(identical) = new.identical_seeds {
            remote.identical_seeds = identical;
        }
        remote.has_key = key.is_some();
        match &key {
            Some(key) => {
                let place = keys::store(self.root(), &remote.name, key).map_err(|e| self.io(e))?;
                tracing::info!(remote = remote.name, "API key kept in {place}");
            }
            None => keys::forget(self.root(), &remote.name).map_err(|e| self.io(e))?,
        }
        self.add(remote.clone())?;
        Ok(remote)
    }

    /// The data directory.
    fn root(&self) -> &Path {
        self.file.parent().unwrap_or(Path::new("."))
    }

    fn io(&self, error: std::io::Error) -> RegistryError {
        RegistryError::Io {
            file: self.file.display().to_string(),
            error,
        }
    }

    /// Written whole to a temporary file, then renamed over the old one.
    fn write(&self, remotes: &[Remote]) -> Result<(), RegistryError> {
        let io = |error| self.io(error);
        let json = serde_json::to_vec_pretty(remotes).map_err(|e| io(e.into()))?;
        let temporary = self.file.with_extension("tmp");
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(&temporary, json).map_err(io)?;
        std::fs::rename(&temporary, &self.file).map_err(io)?;
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        *cached = (None, remotes.to_vec());
        Ok(())
    }
}

fn check_url(url: &str) -> Result<(), RegistryError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() => Ok(()),
        _ => Err(RegistryError::Invalid(format!(
            "'{url}' is not an http:// or https:// URL"
        ))),
    }
}

/// A name clients can type: 1–64 characters of letters, digits and `-_.:`.
fn check_name(name: &str) -> Result<(), RegistryError> {
    let fine = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(fine) {
        return Err(RegistryError::Invalid(format!(
            "'{name}' is not a model name: use 1 to 64 letters, digits and - _ . :"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Api;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("seedbar-remotes-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn remotes_are_kept_replaced_and_removed() {
        let dir = scratch("keep");
        let remotes = Remotes::open(&dir);
        assert!(remotes.list().is_empty());
        remotes
            .add(Remote::new("Big", "http://gpu:8000/v1", Api::OpenAi, "m1"))
            .unwrap();
        remotes
            .add(Remote::new("big", "http://gpu:8000", Api::OpenAi, "m2"))
            .unwrap();
        // Another process (the CLI) reads what this one wrote.
        let other = Remotes::open(&dir);
        assert_eq!(other.list().len(), 1);
        assert_eq!(other.get("BIG").unwrap().model, "m2");
        assert_eq!(other.get("big").unwrap().url, "http://gpu:8000");
        other.remove("big").unwrap();
        assert!(remotes.list().is_empty());
        assert!(matches!(
            remotes.remove("big"),
            Err(RegistryError::NotFound(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_names_and_urls_are_refused() {
        let dir = scratch("bad");
        let remotes = Remotes::open(&dir);
        for (name, url) in [("a b", "http://h"), ("", "http://h"), ("ok", "ftp://h")] {
            let remote = Remote::new(name, url, Api::Ollama, "m");
            assert!(matches!(
                remotes.add(remote),
                Err(RegistryError::Invalid(_))
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

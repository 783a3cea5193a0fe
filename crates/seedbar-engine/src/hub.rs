//! Downloads from the Hugging Face hub: hf-hub names the repository, its URLs and the
//! access token (`HF_TOKEN`, or `huggingface-cli login`'s), and lists its files; each file
//! is then streamed to disk with progress, resumed where a previous try stopped, checked
//! for cancellation between chunks, under bounded timeouts (hf-hub's own download has
//! none and cannot be cancelled) so that an unreachable hub gives an error, not a hang.
//! A repository whose `config.json` names an architecture Seedbar cannot run is refused
//! before any download.

use std::{
    io::{Read, Write},
    path::{Component, Path},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use crate::error::{EngineError, Result};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest silence while a response streams.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole file-list request.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
const CHUNK: usize = 256 * 1024;
/// The most of a `config.json` read to check its architecture.
const CONFIG_LIMIT: u64 = 1 << 20;

/// What a download reports as it goes.
pub trait Progress {
    /// The bytes the whole download needs, once known.
    fn total(&mut self, bytes: u64);
    /// `bytes` more are on disk (files already there count too).
    fn advance(&mut self, bytes: u64);
    /// The `model_type` the repository's `config.json` names, checked before any download.
    fn architecture(&mut self, _model_type: &str) {}
}

impl Progress for () {
    fn total(&mut self, _bytes: u64) {}
    fn advance(&mut self, _bytes: u64) {}
}

/// A file of a repository.
#[derive(Debug, Clone)]
pub(crate) struct RemoteFile {
    /// Path inside the repository (checked to stay inside it).
    pub name: String,
    pub size: Option<u64>,
}

/// The hub at one endpoint.
pub(crate) struct Hub {
    endpoint: String,
    api: hf_hub::api::sync::Api,
    agent: ureq::Agent,
    token: Option<String>,
}

impl Hub {
    pub fn new(endpoint: &str) -> Result<Self> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let token = token();
        let api = hf_hub::api::sync::ApiBuilder::new()
            .with_endpoint(endpoint.clone())
            .with_token(token.clone())
            .with_progress(false)
            .build()
            .map_err(|e| EngineError::Download(format!("cannot set up the hub client: {e}")))?;
        Ok(Hub {
            endpoint,
            api,
            token,
            agent: ureq::AgentBuilder::new()
                .timeout_connect(CONNECT_TIMEOUT)
                .timeout_read(READ_TIMEOUT)
                .timeout_write(READ_TIMEOUT)
                .try_proxy_from_env(true)
                .user_agent(concat!("seedbar/", env!("CARGO_PKG_VERSION")))
                .build(),
        })
    }

    fn get(&self, url: &str) -> ureq::Request {
        let request = self.agent.get(url);
        match &self.token {
            Some(token) => request.set("Authorization", &format!("Bearer {token}")),
            None => request,
        }
    }

    /// The commit `main` points at and the files there.
    pub fn files(&self, repo: &str) -> Result<(String, Vec<RemoteFile>)> {
        #[derive(serde::Deserialize)]
        struct Info {
            sha: Option<String>,
            siblings: Vec<Sibling>,
        }
        #[derive(serde::Deserialize)]
        struct Sibling {
            rfilename: String,
            size: Option<u64>,
        }
        let response = self
            .api
            .model(repo.to_string())
            .info_request()
            .query("blobs", "true")
            .timeout(LIST_TIMEOUT)
            .call()
            .map_err(|e| match e {
                ureq::Error::Status(401 | 403 | 404, _) => EngineError::Download(format!(
                    "{repo} was not found on the Hugging Face hub at {} (a private or gated \
                     repository needs an access token in HF_TOKEN)",
                    self.endpoint
                )),
                e => self.failed(e),
            })?;
        let info: Info = serde_json::from_reader(response.into_reader()).map_err(|e| {
            EngineError::Download(format!("the hub's description of {repo} is not valid: {e}"))
        })?;
        let files = info
            .siblings
            .into_iter()
            .map(|s| {
                if !stays_inside(&s.rfilename) {
                    return Err(EngineError::Download(format!(
                        "{repo} lists a file outside the repository: {}",
                        s.rfilename
                    )));
                }
                Ok(RemoteFile {
                    name: s.rfilename,
                    size: s.size,
                })
            })
            .collect::<Result<_>>()?;
        Ok((info.sha.unwrap_or_else(|| "main".into()), files))
    }

    /// Where `file` of `repo` at `revision` is downloaded from.
    fn file_url(&self, repo: &str, revision: &str, file: &str) -> String {
        self.api
            .repo(hf_hub::Repo::with_revision(
                repo.to_string(),
                hf_hub::RepoType::Model,
                revision.to_string(),
            ))
            .url(file)
    }

    /// The `model_type` `config.json` at `revision` names, once checked to be one Seedbar
    /// runs (else the error listing those it does); `None` when it names none.
    pub fn check_architecture(&self, repo: &str, revision: &str) -> Result<Option<String>> {
        #[derive(serde::Deserialize)]
        struct Config {
            model_type: Option<String>,
        }
        let url = self.file_url(repo, revision, "config.json");
        let response = self.get(&url).call().map_err(|e| self.failed(e))?;
        let config: Config = serde_json::from_reader(response.into_reader().take(CONFIG_LIMIT))
            .map_err(|e| {
                EngineError::Download(format!("{repo}'s config.json is not valid: {e}"))
            })?;
        if let Some(model_type) = &config.model_type {
            crate::config::check_runnable(model_type)?;
        }
        Ok(config.model_type)
    }

    /// Download `file` to `target`, continuing a partial `target` when the size is known.
    /// Returns `EngineError::Cancelled` (leaving the partial file) once `cancel` is set.
    pub fn download(
        &self,
        repo: &str,
        revision: &str,
        file: &RemoteFile,
        target: &Path,
        progress: &mut dyn Progress,
        cancel: &AtomicBool,
    ) -> Result<()> {
        let url = self.file_url(repo, revision, &file.name);
        let have = match (target.metadata().map(|m| m.len()), file.size) {
            (Ok(have), Some(size)) if have <= size => have,
            _ => 0,
        };
        if Some(have) == file.size {
            progress.advance(have);
            return Ok(());
        }
        let request = match have {
            0 => self.get(&url),
            _ => self.get(&url).set("Range", &format!("bytes={have}-")),
        };
        let response = request.call().map_err(|e| self.failed(e))?;
        let io = |e| EngineError::io(target, e);
        let mut out = if response.status() == 206 {
            progress.advance(have);
            std::fs::OpenOptions::new()
                .append(true)
                .open(target)
                .map_err(io)?
        } else {
            std::fs::File::create(target).map_err(io)?
        };
        let mut reader = response.into_reader();
        let mut buffer = vec![0u8; CHUNK];
        loop {
            if cancel.load(Ordering::SeqCst) {
                return Err(EngineError::Cancelled);
            }
            let n = reader.read(&mut buffer).map_err(|e| {
                EngineError::Download(format!("downloading {} from {repo} failed: {e}", file.name))
            })?;
            if n == 0 {
                break;
            }
            out.write_all(&buffer[..n]).map_err(io)?;
            progress.advance(n as u64);
        }
        out.sync_all().map_err(io)?;
        let written = target.metadata().map_err(io)?.len();
        match file.size {
            Some(size) if size != written => Err(EngineError::Download(format!(
                "{} from {repo} ended after {written} of {size} bytes; pull again to resume",
                file.name
            ))),
            _ => Ok(()),
        }
    }

    fn failed(&self, error: ureq::Error) -> EngineError {
        match error {
            ureq::Error::Status(code, response) => EngineError::Download(format!(
                "the Hugging Face hub answered {code} for {}",
                response.get_url()
            )),
            ureq::Error::Transport(e) => EngineError::Download(format!(
                "cannot reach the Hugging Face hub at {} ({e}); check the network connection. \
                 Models already in the store still work offline.",
                self.endpoint
            )),
        }
    }
}

/// A relative path with no `..`: safe to join to a folder.
fn stays_inside(name: &str) -> bool {
    let path = Path::new(name);
    !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// `HF_TOKEN`, else the token `huggingface-cli login` saved (hf-hub's cache).
fn token() -> Option<String> {
    std::env::var("HF_TOKEN")
        .ok()
        .or_else(|| hf_hub::Cache::from_env().token())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

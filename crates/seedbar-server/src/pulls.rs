//! Model downloads started from the app (and Ollama's `/api/pull`): each runs `ModelStore::pull` on its own thread
//! and reports its progress here, for `GET /app/models/pulls`. Cancelling sets the flag
//! the download checks between chunks; it then removes what it wrote. At most
//! `MAX_RUNNING` run at once and the last `MAX_KEPT` are listed.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use axum::http::StatusCode;
use seedbar_engine::{
    store::{ModelStore, Progress},
    EngineError,
};
use serde::Serialize;
use tokio::sync::watch;

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PullStatus {
    Downloading,
    Done,
    Error,
    Cancelled,
}

/// A download as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Pull {
    pub repo: String,
    pub status: PullStatus,
    pub downloaded_bytes: u64,
    pub total_bytes: u64,
    /// The `model_type` of the repository's `config.json`, once checked.
    pub architecture: Option<String>,
    pub error: Option<String>,
}

/// Downloads running at once; another one waits for one of them (429).
const MAX_RUNNING: usize = 2;
/// Downloads listed; the oldest that ended go first.
const MAX_KEPT: usize = 16;

/// How long cancelling waits for the download to stop and clean up.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// One download: what it shows, its cancel flag, and whether its thread has ended.
struct Tracked {
    pull: Mutex<Pull>,
    cancel: AtomicBool,
    ended: watch::Sender<bool>,
}

impl Tracked {
    fn lock(&self) -> MutexGuard<'_, Pull> {
        self.pull.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn end(&self, status: PullStatus, error: Option<String>) {
        let mut pull = self.lock();
        (pull.status, pull.error) = (status, error);
        tracing::info!(repo = pull.repo, status = ?pull.status, "pull ended");
        drop(pull);
        self.ended.send_replace(true);
    }
}

/// Feeds a download's progress into its `Pull`.
struct Reporter(Arc<Tracked>);

impl Progress for Reporter {
    fn total(&mut self, bytes: u64) {
        self.0.lock().total_bytes = bytes;
    }

    fn advance(&mut self, bytes: u64) {
        self.0.lock().downloaded_bytes += bytes;
    }

    fn architecture(&mut self, model_type: &str) {
        self.0.lock().architecture = Some(model_type.to_string());
    }
}

/// The downloads of this server's lifetime, the latest per repository.
#[derive(Default)]
pub struct Pulls {
    pulls: Mutex<Vec<Arc<Tracked>>>,
}

impl Pulls {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Tracked>>> {
        self.pulls.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn find(pulls: &[Arc<Tracked>], repo: &str) -> Option<usize> {
        pulls
            .iter()
            .position(|p| p.lock().repo.eq_ignore_ascii_case(repo))
    }

    /// Start downloading `repo` into the store at `root`, or return the download of it
    /// still running.
    pub fn start(&self, root: PathBuf, repo: &str) -> Result<Pull, ApiError> {
        let mut pulls = self.lock();
        let index = Self::find(&pulls, repo);
        if let Some(running) = index.map(|i| &pulls[i]).filter(|p| !*p.ended.borrow()) {
            return Ok(running.lock().clone());
        }
        if pulls.iter().filter(|p| !*p.ended.borrow()).count() >= MAX_RUNNING {
            return Err(ApiError {
                code: Some("too_many_downloads"),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "{MAX_RUNNING} downloads are running; wait for one to finish or \
                         cancel one"
                    ),
                )
            });
        }
        let tracked = Arc::new(Tracked {
            pull: Mutex::new(Pull {
                repo: repo.to_string(),
                status: PullStatus::Downloading,
                downloaded_bytes: 0,
                total_bytes: 0,
                architecture: None,
                error: None,
            }),
            cancel: AtomicBool::new(false),
            ended: watch::Sender::new(false),
        });
        match index {
            Some(i) => pulls[i] = tracked.clone(),
            None => {
                if pulls.len() >= MAX_KEPT {
                    if let Some(oldest) = pulls.iter().position(|p| *p.ended.borrow()) {
                        pulls.remove(oldest);
                    }
                }
                pulls.push(tracked.clone());
            }
        }
        // A plain thread, not the runtime's blocking pool: shutting down must not wait for
        // a download (the next pull resumes what it wrote).
        let (worker, repo_id) = (tracked.clone(), repo.to_string());
        let spawned = std::thread::Builder::new()
            .name(format!("pull {repo}"))
            .spawn(move || {
                let result = ModelStore::at(root).pull(
                    &repo_id,
                    &mut Reporter(worker.clone()),
                    &worker.cancel,
                );
                match result {
                    Ok(_) => worker.end(PullStatus::Done, None),
                    Err(EngineError::Cancelled) => worker.end(PullStatus::Cancelled, None),
                    Err(e) => worker.end(PullStatus::Error, Some(e.to_string())),
                }
            });
        if let Err(e) = spawned {
            tracked.end(
                PullStatus::Error,
                Some(format!("cannot start the download: {e}")),
            );
        }
        let pull = tracked.lock().clone();
        Ok(pull)
    }

    pub fn list(&self) -> Vec<Pull> {
        self.lock().iter().map(|p| p.lock().clone()).collect()
    }

    fn tracked(&self, repo: &str) -> Option<Arc<Tracked>> {
        let pulls = self.lock();
        Some(pulls[Self::find(&pulls, repo)?].clone())
    }

    /// The latest download of `repo`, as it stands.
    pub fn get(&self, repo: &str) -> Option<Pull> {
        Some(self.tracked(repo)?.lock().clone())
    }

    /// The latest download of `repo` once it has ended.
    pub async fn wait(&self, repo: &str) -> Option<Pull> {
        let tracked = self.tracked(repo)?;
        let mut ended = tracked.ended.subscribe();
        let _ = ended.wait_for(|ended| *ended).await;
        let pull = tracked.lock().clone();
        Some(pull)
    }

    /// Stop the download of `repo` and wait (a little) until it has cleaned up; `None`
    /// when there is no such download.
    pub async fn cancel(&self, repo: &str) -> Option<Pull> {
        let tracked = self.tracked(repo)?;
        tracked.cancel.store(true, Ordering::SeqCst);
        let mut ended = tracked.ended.subscribe();
        let _ = tokio::time::timeout(CANCEL_WAIT, ended.wait_for(|ended| *ended)).await;
        let pull = tracked.lock().clone();
        Some(pull)
    }
}

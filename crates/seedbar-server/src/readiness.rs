//! The server's default model and what it is doing: none installed, downloading, loading,
//! ready, or failed, with the problem in words and the fix (`GET /app/status`, the app's
//! banner and tray). The server answers from the start: `App::bring_up` finds the model in
//! the store (or downloads the default one) and loads it in the background, and a request
//! that needs a model meanwhile gets a 503 saying why and what to do.

use std::{sync::Arc, time::Duration};

use axum::http::StatusCode;
use seedbar_engine::store::{ModelKind, DEFAULT_MODEL};
use serde::Serialize;

use crate::{error::ApiError, pulls::PullStatus, App};

/// How often a download's progress is read into the readiness.
const DOWNLOAD_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    NoModel,
    Downloading,
    Loading,
    Ready,
    Error,
}

/// What the person can do about a problem: the window shows a button for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FixAction {
    /// Import a GGUF file or a model folder from disk (`POST /app/models/import`).
    Import,
    /// Look for a model again and download the default one (`POST /app/status/retry`).
    RetryDownload,
}

/// The default model's state as `/app/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    pub state: ModelState,
    /// The default model (the one downloading, loading or served), when there is one.
    pub model: Option<String>,
    /// A download's progress, when its size is known.
    pub percent: Option<u8>,
    /// What is wrong, in a sentence (`no_model` and `error`).
    pub problem: Option<String>,
    /// What to do about it.
    pub fix: Option<String>,
    pub actions: Vec<FixAction>,
}

/// How to find the default model: the one asked for, else the default, else any chat model
/// in the store; with an empty store, `download` (a Hugging Face repository) is fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BringUp {
    pub wanted: Option<String>,
    pub download: Option<String>,
}

impl Readiness {
    fn new(state: ModelState, model: Option<&str>) -> Self {
        Readiness {
            state,
            model: model.map(str::to_string),
            percent: None,
            problem: None,
            fix: None,
            actions: Vec::new(),
        }
    }

    pub fn loading(model: &str) -> Self {
        Self::new(ModelState::Loading, Some(model))
    }

    pub fn ready(model: &str) -> Self {
        Self::new(ModelState::Ready, Some(model))
    }

    pub fn downloading(model: &str, percent: Option<u8>) -> Self {
        Readiness {
            percent,
            ..Self::new(ModelState::Downloading, Some(model))
        }
    }

    /// A problem and its fix; `can_download`: a default model can be downloaded.
    fn with_problem(
        state: ModelState,
        model: Option<&str>,
        problem: String,
        can_download: bool,
    ) -> Self {
        let (fix, actions) = if can_download {
            (
                "Retry the download, import a GGUF file or a model folder from disk \
                 (Models → Import), or run `seedbar pull <org/name>` in a terminal.",
                vec![FixAction::RetryDownload, FixAction::Import],
            )
        } else {
            (
                "Import a GGUF file or a model folder from disk (Models → Import), or run \
                 `seedbar pull <org/name>` in a terminal and check again.",
                vec![FixAction::Import, FixAction::RetryDownload],
            )
        };
        Readiness {
            problem: Some(problem),
            fix: Some(fix.to_string()),
            actions,
            ..Self::new(state, model)
        }
    }

    /// No model installed (`wanted`: the one asked for, when it is missing).
    pub fn no_model(wanted: Option<&str>, can_download: bool) -> Self {
        let problem = match wanted {
            Some(name) => format!("The model {name} is not installed."),
            None => "No model is installed yet.".to_string(),
        };
        Self::with_problem(ModelState::NoModel, wanted, problem, can_download)
    }

    pub fn download_failed(model: &str, message: &str) -> Self {
        let problem = format!("Cannot download {model}: {message}");
        Self::with_problem(ModelState::Error, Some(model), problem, true)
    }

    pub fn load_failed(model: &str, message: &str, can_download: bool) -> Self {
        let problem = format!("Cannot load {model}: {message}");
        Self::with_problem(ModelState::Error, Some(model), problem, can_download)
    }

    /// Before the bring-up: loading, `wanted` or whichever it finds.
    pub fn starting(wanted: Option<&str>) -> Self {
        Self::new(ModelState::Loading, wanted)
    }

    /// The model requests without one run on: the ready one.
    pub fn default_model(&self) -> Option<&str> {
        (self.state == ModelState::Ready)
            .then_some(self.model.as_deref())
            .flatten()
    }

    /// The model being loaded or served (deleting it is refused).
    pub fn served_model(&self) -> Option<&str> {
        match self.state {
            ModelState::Loading | ModelState::Ready => self.model.as_deref(),
            _ => None,
        }
    }

    /// Bring-up is over or has not begun: it may start (again).
    fn settled(&self) -> bool {
        matches!(self.state, ModelState::NoModel | ModelState::Error)
    }

    /// The 503 a request that needs a model gets while there is none.
    pub fn unavailable(&self) -> ApiError {
        let message = match (self.state, &self.model, &self.problem) {
            (ModelState::Downloading, Some(model), _) => format!(
                "{model} is still downloading{}; try again when it is ready",
                self.percent.map(|p| format!(" ({p}%)")).unwrap_or_default()
            ),
            (ModelState::Loading, Some(model), _) => format!("{model} is still loading"),
            (_, _, Some(problem)) => {
                format!("{problem} {}", self.fix.as_deref().unwrap_or_default())
            }
            _ => "no model is ready yet".to_string(),
        };
        ApiError {
            code: Some("model_not_ready"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message.trim_end())
        }
    }
}

impl App {
    /// What the default model is doing.
    pub fn readiness(&self) -> Readiness {
        self.readiness.borrow().clone()
    }

    /// Sees every change of the readiness (the app's tray follows it).
    pub fn subscribe_readiness(&self) -> tokio::sync::watch::Receiver<Readiness> {
        self.readiness.subscribe()
    }

    /// The model a request without one runs on; `None` while there is none.
    pub fn default_model(&self) -> Option<String> {
        self.readiness.borrow().default_model().map(str::to_string)
    }

    fn set_readiness(&self, readiness: Readiness) {
        self.readiness.send_replace(readiness);
    }

    /// Find, fetch if needed, and load the default model by `plan` (remembered for
    /// `retry`). Returns once it is ready or has failed, with the readiness saying which.
    pub async fn bring_up(self: &Arc<Self>, plan: BringUp) {
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = plan.clone();
        let can_download = plan.download.is_some();
        let model = match self.choose_model(plan.wanted.as_deref()) {
            Ok(Some(model)) => model,
            Ok(None) => match (&plan.wanted, &plan.download) {
                (None, Some(repo)) => match self.download(repo).await {
                    Some(model) => model,
                    None => return,
                },
                (wanted, _) => {
                    let readiness = Readiness::no_model(wanted.as_deref(), can_download);
                    tracing::warn!("{}", readiness.problem.as_deref().unwrap_or_default());
                    return self.set_readiness(readiness);
                }
            },
            Err(e) => {
                return self.set_readiness(Readiness::load_failed(
                    plan.wanted.as_deref().unwrap_or(DEFAULT_MODEL),
                    &e.message,
                    can_download,
                ))
            }
        };
        self.set_readiness(Readiness::loading(&model));
        self.models.set_served(&model);
        tracing::info!("loading {model}");
        match self.models.get(&model).await {
            Ok(_) => {
                tracing::info!("{model} is ready");
                self.set_readiness(Readiness::ready(&model));
            }
            Err(e) => {
                tracing::error!("cannot load {model}: {}", e.message);
                self.set_readiness(Readiness::load_failed(&model, &e.message, can_download));
            }
        }
    }

    /// Start over when there is no model (after a `seedbar pull`, or to retry a failed
    /// download), in the background; `model`: bring up this one instead (just imported).
    /// False when a model is ready or on its way.
    pub fn retry_bring_up(self: &Arc<Self>, model: Option<&str>) -> bool {
        let mut started = false;
        self.readiness.send_if_modified(|r| {
            if r.settled() {
                *r = Readiness::starting(None);
                started = true;
            }
            started
        });
        if started {
            let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(model) = model {
                plan.wanted = Some(model.to_string());
            }
            let app = self.clone();
            tokio::spawn(async move { app.bring_up(plan).await });
        }
        started
    }

    /// The model to serve: the one asked for, else the default, else the first chat model
    /// installed; `None` when there is none.
    fn choose_model(&self, wanted: Option<&str>) -> Result<Option<String>, ApiError> {
        let installed = self.models.installed()?;
        let chat = |name: &str| {
            installed
                .iter()
                .find(|m| m.kind == ModelKind::Chat && m.name.eq_ignore_ascii_case(name))
                .map(|m| m.name.clone())
        };
        Ok(match wanted {
            Some(name) => chat(name),
            None => chat(DEFAULT_MODEL).or_else(|| {
                installed
                    .iter()
                    .find(|m| m.kind == ModelKind::Chat)
                    .map(|m| m.name.clone())
            }),
        })
    }

    /// Download `repo` as any library download (it shows in `/app/models/pulls`), the
    /// readiness following its progress. The installed model's name, or `None` on failure.
    async fn download(self: &Arc<Self>, repo: &str) -> Option<String> {
        let name = repo.replace('/', "--");
        let shown = repo.rsplit('/').next().unwrap_or(repo).to_string();
        tracing::info!("no model installed: downloading {repo}");
        self.set_readiness(Readiness::downloading(&shown, None));
        let root = self.models.store().root().to_path_buf();
        if let Err(e) = self.pulls.start(root, repo) {
            self.set_readiness(Readiness::download_failed(&shown, &e.message));
            return None;
        }
        loop {
            let Some(pull) = self.pulls.list().into_iter().find(|p| p.repo == repo) else {
                self.set_readiness(Readiness::download_failed(&shown, "the download vanished"));
                return None;
            };
            match pull.status {
                PullStatus::Downloading => {
                    let percent = (pull.total_bytes > 0).then(|| {
                        (pull.downloaded_bytes.min(pull.total_bytes) * 100 / pull.total_bytes) as u8
                    });
                    self.set_readiness(Readiness::downloading(&shown, percent));
                }
                PullStatus::Done => return Some(name),
                PullStatus::Error | PullStatus::Cancelled => {
                    let message = pull.error.unwrap_or_else(|| "it was cancelled".into());
                    tracing::error!("cannot download {repo}: {message}");
                    self.set_readiness(Readiness::download_failed(&shown, &message));
                    return None;
                }
            }
            tokio::time::sleep(DOWNLOAD_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_say_what_to_do() {
        let none = Readiness::no_model(None, true);
        assert_eq!(none.state, ModelState::NoModel);
        assert_eq!(none.problem.as_deref(), Some("No model is installed yet."));
        assert!(none.fix.as_deref().unwrap().contains("seedbar pull"));
        assert_eq!(none.actions, [FixAction::RetryDownload, FixAction::Import]);
        assert_eq!(none.default_model(), None);

        let failed = Readiness::download_failed("SmolLM2", "cannot reach the hub");
        assert_eq!(failed.state, ModelState::Error);
        let error = failed.unavailable();
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(error
            .message
            .starts_with("Cannot download SmolLM2: cannot reach the hub"));
        assert!(error.message.contains("import a GGUF file"));
    }

    #[test]
    fn a_model_on_its_way_is_named() {
        let down = Readiness::downloading("SmolLM2", Some(42));
        assert_eq!(
            down.unavailable().message,
            "SmolLM2 is still downloading (42%); try again when it is ready"
        );
        assert_eq!(down.default_model(), None);
        assert_eq!(Readiness::loading("m").default_model(), None);
        assert_eq!(Readiness::loading("m").served_model(), Some("m"));
        assert_eq!(Readiness::ready("m").default_model(), Some("m"));
        assert!(!Readiness::ready("m").settled());
        assert!(Readiness::no_model(Some("m"), false).settled());
    }

    #[test]
    fn the_wire_shape() {
        let json = serde_json::to_value(Readiness::no_model(None, false)).unwrap();
        assert_eq!(json["state"], "no_model");
        assert_eq!(
            json["actions"],
            serde_json::json!(["import", "retry_download"])
        );
        assert_eq!(json["model"], serde_json::Value::Null);
    }
}

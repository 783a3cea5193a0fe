//! The server's default model and what it is doing: none installed, downloading, loading,
//! ready, or failed, with the problem in words and the fix (`GET /app/status`, the app's
//! banner and tray). The server answers from the start: `App::bring_up` (`state.rs`) finds
//! the model in the store (or downloads the default one) and loads it in the background,
//! and a request that needs a model meanwhile gets a 503 saying why and what to do.

use axum::http::StatusCode;
use serde::Serialize;

use crate::error::ApiError;

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
    pub(crate) fn new(state: ModelState, model: Option<&str>) -> Self {
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
    pub(crate) fn with_problem(
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
    pub(crate) fn settled(&self) -> bool {
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

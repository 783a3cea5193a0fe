//! What the tray menu shows, as plain data: the server's phase and the pause switch in,
//! menu entries with their labels and enabled flags out. No Tauri types, so every state is
//! unit-tested without a display; `tray.rs` turns the entries into native menu items.

/// What the in-process server is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Before the model store is looked at.
    Starting,
    /// The model is being read into memory.
    Loading { model: String },
    /// A model download; `percent` when its size is known.
    Downloading { model: String, percent: Option<u8> },
    /// The API answers at `endpoint` (the OpenAI base URL, ending in `/v1`).
    Serving { model: String, endpoint: String },
    /// No model to serve: `model` is the one asked for (None when the store is empty).
    NoModel { model: Option<String> },
    /// Fetching the default model into an empty store failed.
    DownloadFailed { model: String, message: String },
    /// Starting or serving failed.
    Error { message: String },
    /// Quit was chosen; the server is finishing its streams.
    Stopping,
}

/// The menu's actions. Their ids are the native menu items' ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    OpenChat,
    NewChat,
    CopyEndpoint,
    TogglePause,
    Settings,
    Quit,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::OpenChat,
        Action::NewChat,
        Action::CopyEndpoint,
        Action::TogglePause,
        Action::Settings,
        Action::Quit,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Action::OpenChat => "open-chat",
            Action::NewChat => "new-chat",
            Action::CopyEndpoint => "copy-endpoint",
            Action::TogglePause => "toggle-pause",
            Action::Settings => "settings",
            Action::Quit => "quit",
        }
    }

    pub fn from_id(id: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.id() == id)
    }
}

/// One line of the menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A disabled line of text (`id` names it so it can be relabelled).
    Info {
        id: &'static str,
        text: String,
    },
    Item {
        action: Action,
        label: String,
        enabled: bool,
    },
    Separator,
}

/// Id of the status line.
pub const STATUS_ID: &str = "status";
/// Id of the hint line under the status (only there when there is something to add).
pub const HINT_ID: &str = "hint";

/// Longest error line shown; longer messages are cut with an ellipsis.
pub const MAX_LINE_CHARS: usize = 72;

/// The tray's whole state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrayModel {
    pub phase: Phase,
    /// Outside clients get 503 while paused (the app's own routes keep working).
    pub paused: bool,
}

impl Default for TrayModel {
    fn default() -> Self {
        TrayModel {
            phase: Phase::Starting,
            paused: false,
        }
    }
}

impl TrayModel {
    pub fn new(phase: Phase, paused: bool) -> Self {
        TrayModel { phase, paused }
    }

    /// The endpoint URL, once the server answers.
    pub fn endpoint(&self) -> Option<&str> {
        match &self.phase {
            Phase::Serving { endpoint, .. } => Some(endpoint),
            _ => None,
        }
    }

    /// A short machine-readable name of the phase (for the app's IPC status).
    pub fn state_name(&self) -> &'static str {
        match (&self.phase, self.paused) {
            (Phase::Starting, _) => "starting",
            (Phase::Loading { .. }, _) => "loading",
            (Phase::Downloading { .. }, _) => "downloading",
            (Phase::Serving { .. }, false) => "serving",
            (Phase::Serving { .. }, true) => "paused",
            (Phase::NoModel { .. }, _) => "no-model",
            (Phase::DownloadFailed { .. }, _) => "download-failed",
            (Phase::Error { .. }, _) => "error",
            (Phase::Stopping, _) => "stopping",
        }
    }

    /// The disabled first line of the menu. Messages from elsewhere (errors) are cut to
    /// one short line; model names and the endpoint are shown whole.
    pub fn status_line(&self) -> String {
        let cut = |text: &str| shorten(text, MAX_LINE_CHARS);
        match &self.phase {
            Phase::Starting => "Starting…".to_string(),
            Phase::Loading { model } => format!("Loading {model}…"),
            Phase::Downloading { model, percent } => match percent {
                Some(p) => format!("Downloading {model} {p}%"),
                None => format!("Downloading {model}…"),
            },
            Phase::Serving { model, endpoint } if self.paused => {
                format!("Paused: {model} at {endpoint}")
            }
            Phase::Serving { model, endpoint } => format!("Serving {model} at {endpoint}"),
            Phase::NoModel { model: Some(model) } => format!("{model} is not installed"),
            Phase::NoModel { model: None } => "No model installed".to_string(),
            Phase::DownloadFailed { model, message } => {
                cut(&format!("Cannot download {model}: {message}"))
            }
            Phase::Error { message } => cut(&format!("Error: {message}")),
            Phase::Stopping => "Stopping…".to_string(),
        }
    }

    /// A second disabled line saying what to do, when there is something to do.
    pub fn hint_line(&self) -> Option<String> {
        match &self.phase {
            Phase::Serving { .. } if self.paused => {
                Some("Editors and SDKs get 503; the chat window still works".to_string())
            }
            Phase::NoModel { .. } | Phase::DownloadFailed { .. } => {
                Some("Install one: seedbar pull <org/name>, then restart Seedbar".to_string())
            }
            _ => None,
        }
    }

    pub fn pause_label(&self) -> &'static str {
        if self.paused {
            "Resume Server"
        } else {
            "Pause Server"
        }
    }

    /// The menu, top to bottom (the native menu is rebuilt from it on every change).
    pub fn entries(&self) -> Vec<Entry> {
        let serving = matches!(self.phase, Phase::Serving { .. });
        let stopping = self.phase == Phase::Stopping;
        let item = |action, label: &str, enabled| Entry::Item {
            action,
            label: label.to_string(),
            enabled,
        };
        let mut entries = vec![Entry::Info {
            id: STATUS_ID,
            text: self.status_line(),
        }];
        if let Some(hint) = self.hint_line() {
            entries.push(Entry::Info {
                id: HINT_ID,
                text: hint,
            });
        }
        entries.extend([
            Entry::Separator,
            item(Action::OpenChat, "Open Chat", !stopping),
            item(Action::NewChat, "New Chat", !stopping),
            Entry::Separator,
            item(Action::CopyEndpoint, "Copy Endpoint URL", serving),
            item(Action::TogglePause, self.pause_label(), serving),
            Entry::Separator,
            item(Action::Settings, "Settings…", !stopping),
            Entry::Separator,
            item(Action::Quit, "Quit Seedbar", !stopping),
        ]);
        entries
    }

    /// The tooltip (where the platform shows one).
    pub fn tooltip(&self) -> String {
        format!("Seedbar: {}", self.status_line())
    }
}

/// `text` cut to `max` characters, ending with an ellipsis when cut.
pub fn shorten(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

/// The window route (URL hash) each window action opens; the UI routes `#/new` to a new
/// conversation and `#/settings` to the settings view.
pub fn route_of(action: Action) -> Option<&'static str> {
    match action {
        Action::OpenChat => Some(""),
        Action::NewChat => Some("#/new"),
        Action::Settings => Some("#/settings"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENDPOINT: &str = "http://127.0.0.1:7337/v1";

    fn serving() -> Phase {
        Phase::Serving {
            model: "SmolLM2-135M-Instruct".into(),
            endpoint: ENDPOINT.into(),
        }
    }

    fn item(model: &TrayModel, action: Action) -> (String, bool) {
        model
            .entries()
            .into_iter()
            .find_map(|e| match e {
                Entry::Item {
                    action: a,
                    label,
                    enabled,
                } if a == action => Some((label, enabled)),
                _ => None,
            })
            .unwrap()
    }

    fn info(model: &TrayModel, id: &str) -> Option<String> {
        model.entries().into_iter().find_map(|e| match e {
            Entry::Info { id: i, text } if i == id => Some(text),
            _ => None,
        })
    }

    #[test]
    fn status_line_for_each_phase() {
        let cases = [
            (Phase::Starting, "Starting…"),
            (
                Phase::Loading {
                    model: "SmolLM2-135M-Instruct".into(),
                },
                "Loading SmolLM2-135M-Instruct…",
            ),
            (
                Phase::Downloading {
                    model: "SmolLM2".into(),
                    percent: Some(42),
                },
                "Downloading SmolLM2 42%",
            ),
            (
                Phase::Downloading {
                    model: "SmolLM2".into(),
                    percent: None,
                },
                "Downloading SmolLM2…",
            ),
            (
                serving(),
                "Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1",
            ),
            (
                Phase::NoModel {
                    model: Some("SmolLM2-135M-Instruct".into()),
                },
                "SmolLM2-135M-Instruct is not installed",
            ),
            (Phase::NoModel { model: None }, "No model installed"),
            (
                Phase::DownloadFailed {
                    model: "SmolLM2".into(),
                    message: "offline".into(),
                },
                "Cannot download SmolLM2: offline",
            ),
            (
                Phase::Error {
                    message: "cannot listen on 127.0.0.1:7337: address in use".into(),
                },
                "Error: cannot listen on 127.0.0.1:7337: address in use",
            ),
            (Phase::Stopping, "Stopping…"),
        ];
        for (phase, line) in cases {
            let model = TrayModel::new(phase, false);
            assert_eq!(model.status_line(), line);
            assert_eq!(info(&model, STATUS_ID).as_deref(), Some(line));
        }
    }

    #[test]
    fn pause_toggles_label_and_status() {
        let running = TrayModel::new(serving(), false);
        assert_eq!(
            item(&running, Action::TogglePause),
            ("Pause Server".into(), true)
        );
        assert_eq!(running.state_name(), "serving");
        assert_eq!(info(&running, HINT_ID), None);

        let paused = TrayModel::new(serving(), true);
        assert_eq!(
            item(&paused, Action::TogglePause),
            ("Resume Server".into(), true)
        );
        assert_eq!(paused.state_name(), "paused");
        assert!(paused
            .status_line()
            .starts_with("Paused: SmolLM2-135M-Instruct"));
        assert!(info(&paused, HINT_ID).unwrap().contains("503"));
        // The endpoint stays copyable while paused: the app still answers on it.
        assert_eq!(paused.endpoint(), Some(ENDPOINT));
        assert!(item(&paused, Action::CopyEndpoint).1);
    }

    #[test]
    fn server_actions_only_while_serving() {
        for phase in [
            Phase::Starting,
            Phase::Loading { model: "m".into() },
            Phase::NoModel { model: None },
            Phase::Error {
                message: "boom".into(),
            },
            Phase::Stopping,
        ] {
            let model = TrayModel::new(phase, false);
            assert!(!item(&model, Action::CopyEndpoint).1, "{model:?}");
            assert!(!item(&model, Action::TogglePause).1, "{model:?}");
            assert_eq!(model.endpoint(), None);
        }
        let model = TrayModel::new(serving(), false);
        assert!(item(&model, Action::CopyEndpoint).1);
    }

    #[test]
    fn window_actions_work_until_quit() {
        let loading = TrayModel::new(Phase::Loading { model: "m".into() }, false);
        for action in [
            Action::OpenChat,
            Action::NewChat,
            Action::Settings,
            Action::Quit,
        ] {
            assert!(item(&loading, action).1);
        }
        let stopping = TrayModel::new(Phase::Stopping, false);
        for action in [
            Action::OpenChat,
            Action::NewChat,
            Action::Settings,
            Action::Quit,
        ] {
            assert!(!item(&stopping, action).1);
        }
    }

    #[test]
    fn menu_shape() {
        let shape = |m: &TrayModel| {
            m.entries()
                .iter()
                .map(|e| match e {
                    Entry::Info { id, .. } => id.to_string(),
                    Entry::Item { action, .. } => action.id().to_string(),
                    Entry::Separator => "-".to_string(),
                })
                .collect::<Vec<_>>()
        };
        let base = shape(&TrayModel::default());
        assert_eq!(
            base,
            [
                "status",
                "-",
                "open-chat",
                "new-chat",
                "-",
                "copy-endpoint",
                "toggle-pause",
                "-",
                "settings",
                "-",
                "quit"
            ]
        );
        assert_eq!(shape(&TrayModel::new(serving(), false)), base);
        assert_eq!(shape(&TrayModel::new(Phase::Stopping, false)), base);
        // A hint line comes right under the status when there is one.
        let mut with_hint = base.clone();
        with_hint.insert(1, "hint".to_string());
        assert_eq!(shape(&TrayModel::new(serving(), true)), with_hint);
    }

    #[test]
    fn missing_model_says_what_to_do() {
        let model = TrayModel::new(Phase::NoModel { model: None }, false);
        assert!(info(&model, HINT_ID).unwrap().contains("seedbar pull"));
        assert_eq!(model.state_name(), "no-model");
        let failed = TrayModel::new(
            Phase::DownloadFailed {
                model: "m".into(),
                message: "offline".into(),
            },
            false,
        );
        assert!(info(&failed, HINT_ID).unwrap().contains("seedbar pull"));
        assert_eq!(failed.state_name(), "download-failed");
    }

    #[test]
    fn long_errors_are_cut_to_one_line() {
        let message = format!("first line\nsecond {}", "x".repeat(200));
        let model = TrayModel::new(Phase::Error { message }, false);
        let line = model.status_line();
        assert_eq!(line.chars().count(), MAX_LINE_CHARS);
        assert!(line.starts_with("Error: first line second x"));
        assert!(line.ends_with('…'));
        assert!(!line.contains('\n'));
    }

    #[test]
    fn endpoints_are_never_cut() {
        let model = TrayModel::new(
            Phase::Serving {
                model: "HuggingFaceTB--SmolLM2-135M-Instruct".into(),
                endpoint: "http://127.0.0.1:65535/v1".into(),
            },
            true,
        );
        assert!(model.status_line().ends_with("http://127.0.0.1:65535/v1"));
    }

    #[test]
    fn action_ids_round_trip() {
        for action in Action::ALL {
            assert_eq!(Action::from_id(action.id()), Some(action));
        }
        assert_eq!(Action::from_id(STATUS_ID), None);
        assert_eq!(Action::from_id("nope"), None);
    }

    #[test]
    fn window_routes() {
        assert_eq!(route_of(Action::NewChat), Some("#/new"));
        assert_eq!(route_of(Action::Settings), Some("#/settings"));
        assert_eq!(route_of(Action::OpenChat), Some(""));
        assert_eq!(route_of(Action::Quit), None);
    }
}

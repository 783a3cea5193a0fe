//! What the tray menu shows, as plain data: the default model's phase, where the server
//! listens, the pause switch, what is generating and downloading, the models in memory in; menu entries with
//! their labels and enabled flags, the tooltip and the menu-bar title out. No Tauri types,
//! so every state is unit-tested without a display; `tray.rs` turns the entries into
//! native menu items.

/// What the default model is doing (the server answers meanwhile, see `endpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Before the server listens.
    Starting,
    /// The model is being read into memory (`None`: before it is chosen).
    Loading { model: Option<String> },
    /// A model download; `percent` when its size is known.
    Downloading { model: String, percent: Option<u8> },
    /// The model answers.
    Serving { model: String },
    /// No model to serve: `model` is the one asked for (None when the store is empty).
    NoModel { model: Option<String> },
    /// Downloading or loading the model failed, or the server could not start.
    Error { message: String },
    /// Quit was chosen; the server is finishing its streams.
    Stopping,
}

/// What is generating now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Activity {
    /// Chats (rows) generating.
    pub running: usize,
    /// Tokens generated per second over the last sample, while any run.
    pub tokens_per_second: Option<f32>,
    /// The share of tokens drafted by speculative decoding that were kept, over the last
    /// sample, where any were drafted.
    pub drafts_kept: Option<f32>,
}

/// A model download in progress (the first-start one, or one from the Model Library).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    pub repo: String,
    pub percent: Option<u8>,
}

/// A model in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedModel {
    pub name: String,
    /// Bytes of its files (what its weights take in memory).
    pub bytes: u64,
    /// The server's default model (kept loaded: the menu offers no unload for it).
    pub default: bool,
}

/// The menu's actions. Their ids are the native menu items' ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    OpenChat,
    NewChat,
    QuickChat,
    CopyEndpoint,
    TogglePause,
    Settings,
    Quit,
}

impl Action {
    pub const ALL: [Action; 7] = [
        Action::OpenChat,
        Action::NewChat,
        Action::QuickChat,
        Action::CopyEndpoint,
        Action::TogglePause,
        Action::Settings,
        Action::Quit,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Action::OpenChat => "open-chat",
            Action::NewChat => "new-chat",
            Action::QuickChat => "quick-chat",
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
    /// "Unload NAME": takes a model other than the default out of memory.
    Unload {
        model: String,
    },
    Separator,
}

impl Entry {
    /// The native menu item's id (an unload item's is `unload:` and the model's name).
    pub fn id(&self) -> String {
        match self {
            Entry::Info { id, .. } => id.to_string(),
            Entry::Item { action, .. } => action.id().to_string(),
            Entry::Unload { model } => format!("{UNLOAD_PREFIX}{model}"),
            Entry::Separator => String::new(),
        }
    }
}

/// Ids of unload items start with this, then the model's name.
const UNLOAD_PREFIX: &str = "unload:";

/// The model an unload item's id names.
pub fn unload_target(id: &str) -> Option<&str> {
    id.strip_prefix(UNLOAD_PREFIX)
}

/// Id of the status line.
pub const STATUS_ID: &str = "status";
/// Id of the hint line under the status (only there when there is something to add).
pub const HINT_ID: &str = "hint";
/// Id of the line saying what generates (only while something does).
pub const ACTIVITY_ID: &str = "activity";
/// Id of a download's line.
pub const DOWNLOAD_ID: &str = "download";
/// Id of a loaded model's line.
pub const LOADED_ID: &str = "loaded";

/// Longest error line shown; longer messages are cut with an ellipsis.
pub const MAX_LINE_CHARS: usize = 72;

/// The tray's whole state.
#[derive(Debug, Clone, PartialEq)]
pub struct TrayModel {
    pub phase: Phase,
    /// Outside clients get 503 while paused (the app's own routes keep working).
    pub paused: bool,
    /// The OpenAI base URL (ending in `/v1`) once the server listens, model or not.
    pub listening: Option<String>,
    pub activity: Activity,
    pub downloads: Vec<Download>,
    /// The models in memory, the default one first.
    pub loaded: Vec<LoadedModel>,
    /// Quick chat's global shortcut as the menu shows it, while one is registered.
    pub quick_chat_shortcut: Option<String>,
}

impl Default for TrayModel {
    fn default() -> Self {
        TrayModel {
            phase: Phase::Starting,
            paused: false,
            listening: None,
            activity: Activity::default(),
            downloads: Vec::new(),
            loaded: Vec::new(),
            quick_chat_shortcut: None,
        }
    }
}

impl TrayModel {
    pub fn new(phase: Phase, paused: bool) -> Self {
        TrayModel {
            phase,
            paused,
            ..TrayModel::default()
        }
    }

    /// The same, listening at `endpoint`.
    pub fn listening_at(self, endpoint: &str) -> Self {
        TrayModel {
            listening: Some(endpoint.to_string()),
            ..self
        }
    }

    /// The endpoint URL while the server answers (until Quit).
    pub fn endpoint(&self) -> Option<&str> {
        match self.phase {
            Phase::Stopping => None,
            _ => self.listening.as_deref(),
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
            Phase::Loading { model: Some(model) } => format!("Loading {model}…"),
            Phase::Loading { model: None } => "Loading the model…".to_string(),
            Phase::Downloading { model, percent } => match percent {
                Some(p) => format!("Downloading {model} {p}%"),
                None => format!("Downloading {model}…"),
            },
            Phase::Serving { model } => {
                let at = self
                    .listening
                    .as_deref()
                    .map(|e| format!(" at {e}"))
                    .unwrap_or_default();
                match self.paused {
                    true => format!("Paused: {model}{at}"),
                    false => format!("Serving {model}{at}"),
                }
            }
            Phase::NoModel { model: Some(model) } => format!("{model} is not installed"),
            Phase::NoModel { model: None } => "No model installed".to_string(),
            Phase::Error { message } => cut(message),
            Phase::Stopping => "Stopping…".to_string(),
        }
    }

    /// A second disabled line saying what to do, when there is something to do.
    pub fn hint_line(&self) -> Option<String> {
        match &self.phase {
            Phase::Serving { .. } if self.paused => {
                Some("Editors and SDKs get 503; the chat window still works".to_string())
            }
            Phase::NoModel { .. } | Phase::Error { .. } if self.listening.is_some() => {
                Some("Import one in Models (Open Chat), or: seedbar pull <org/name>".to_string())
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

    /// "Quick Chat", with its shortcut when one is registered: "Quick Chat (Ctrl+Shift+Space)".
    pub fn quick_chat_label(&self) -> String {
        match &self.quick_chat_shortcut {
            Some(keys) => format!("Quick Chat ({keys})"),
            None => "Quick Chat".to_string(),
        }
    }

    /// What generates, while something does: "2 chats · 41 tok/s", and with speculative
    /// decoding "1 chat · 140 tok/s · 92% of drafts kept".
    pub fn activity_line(&self) -> Option<String> {
        let Activity {
            running,
            tokens_per_second,
            drafts_kept,
        } = self.activity;
        if running == 0 {
            return None;
        }
        let chats = match running {
            1 => "1 chat".to_string(),
            n => format!("{n} chats"),
        };
        let mut line = match tokens_per_second {
            Some(rate) => format!("{chats} · {rate:.0} tok/s"),
            None => chats,
        };
        if let Some(kept) = drafts_kept {
            line += &format!(" · {:.0}% of drafts kept", kept * 100.0);
        }
        Some(line)
    }

    /// A download's line: "Downloading org/name 42%".
    pub fn download_line(download: &Download) -> String {
        match download.percent {
            Some(p) => format!("Downloading {} {p}%", download.repo),
            None => format!("Downloading {}…", download.repo),
        }
    }

    /// A loaded model's line: "In memory: NAME · 105 MB", "(default)" after the default's.
    pub fn loaded_line(model: &LoadedModel) -> String {
        let default = if model.default { " (default)" } else { "" };
        format!(
            "In memory: {}{default} · {}",
            model.name,
            format_bytes(model.bytes)
        )
    }

    /// The menu, top to bottom (the native menu is rebuilt from it on every change).
    pub fn entries(&self) -> Vec<Entry> {
        let serving = self.endpoint().is_some();
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
        if let Some(activity) = self.activity_line() {
            entries.push(Entry::Info {
                id: ACTIVITY_ID,
                text: activity,
            });
        }
        entries.extend(self.downloads.iter().map(|d| Entry::Info {
            id: DOWNLOAD_ID,
            text: Self::download_line(d),
        }));
        entries.extend([
            Entry::Separator,
            item(Action::OpenChat, "Open Chat", !stopping),
            item(Action::NewChat, "New Chat", !stopping),
            item(Action::QuickChat, &self.quick_chat_label(), !stopping),
            Entry::Separator,
            item(Action::CopyEndpoint, "Copy Endpoint URL", serving),
            item(Action::TogglePause, self.pause_label(), serving),
            Entry::Separator,
        ]);
        if serving && !self.loaded.is_empty() {
            entries.extend(self.loaded.iter().map(|m| Entry::Info {
                id: LOADED_ID,
                text: Self::loaded_line(m),
            }));
            entries.extend(
                self.loaded
                    .iter()
                    .filter(|m| !m.default)
                    .map(|m| Entry::Unload {
                        model: m.name.clone(),
                    }),
            );
            entries.push(Entry::Separator);
        }
        entries.extend([
            item(Action::Settings, "Settings…", !stopping),
            Entry::Separator,
            item(Action::Quit, "Quit Seedbar", !stopping),
        ]);
        entries
    }

    /// The tooltip (where the platform shows one): the status, and what generates.
    pub fn tooltip(&self) -> String {
        let status = match (&self.phase, self.activity_line()) {
            (Phase::Serving { model }, Some(activity)) => format!("{model} · {activity}"),
            _ => self.status_line(),
        };
        format!("Seedbar: {status}")
    }

    /// The text beside the menu-bar icon (macOS): the speed while generating, else none.
    pub fn title(&self) -> Option<String> {
        let rate = self.activity.tokens_per_second?;
        (self.activity.running > 0).then(|| format!("{rate:.0} tok/s"))
    }
}

/// Bytes as the menu shows them: "105 MB", "4.3 GB".
pub fn format_bytes(bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    if mb >= 1000.0 {
        format!("{:.1} GB", mb / 1000.0)
    } else {
        format!("{mb:.0} MB")
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
        }
    }

    /// `phase` with the server listening at ENDPOINT.
    fn up(phase: Phase, paused: bool) -> TrayModel {
        TrayModel::new(phase, paused).listening_at(ENDPOINT)
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
                    model: Some("SmolLM2-135M-Instruct".into()),
                },
                "Loading SmolLM2-135M-Instruct…",
            ),
            (Phase::Loading { model: None }, "Loading the model…"),
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
            (serving(), "Serving SmolLM2-135M-Instruct"),
            (
                Phase::NoModel {
                    model: Some("SmolLM2-135M-Instruct".into()),
                },
                "SmolLM2-135M-Instruct is not installed",
            ),
            (Phase::NoModel { model: None }, "No model installed"),
            (
                Phase::Error {
                    message: "Cannot download SmolLM2: offline".into(),
                },
                "Cannot download SmolLM2: offline",
            ),
            (Phase::Stopping, "Stopping…"),
        ];
        for (phase, line) in cases {
            let model = TrayModel::new(phase, false);
            assert_eq!(model.status_line(), line);
            assert_eq!(info(&model, STATUS_ID).as_deref(), Some(line));
        }
        assert_eq!(
            up(serving(), false).status_line(),
            "Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1"
        );
    }

    #[test]
    fn pause_toggles_label_and_status() {
        let running = up(serving(), false);
        assert_eq!(
            item(&running, Action::TogglePause),
            ("Pause Server".into(), true)
        );
        assert_eq!(running.state_name(), "serving");
        assert_eq!(info(&running, HINT_ID), None);

        let paused = up(serving(), true);
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
    fn server_actions_while_it_listens_model_or_not() {
        for phase in [
            Phase::Starting,
            Phase::Loading { model: None },
            Phase::NoModel { model: None },
            Phase::Error {
                message: "boom".into(),
            },
        ] {
            let model = TrayModel::new(phase.clone(), false);
            assert!(!item(&model, Action::CopyEndpoint).1, "{model:?}");
            assert!(!item(&model, Action::TogglePause).1, "{model:?}");
            assert_eq!(model.endpoint(), None);
            // The server answers without a model: its endpoint is real and copyable.
            let listening = up(phase, false);
            assert!(item(&listening, Action::CopyEndpoint).1, "{listening:?}");
            assert_eq!(listening.endpoint(), Some(ENDPOINT));
        }
        let stopping = up(Phase::Stopping, false);
        assert!(!item(&stopping, Action::CopyEndpoint).1);
        assert_eq!(stopping.endpoint(), None);
    }

    #[test]
    fn window_actions_work_until_quit() {
        let loading = TrayModel::new(Phase::Loading { model: None }, false);
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
                    Entry::Separator => "-".to_string(),
                    entry => entry.id(),
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
                "quick-chat",
                "-",
                "copy-endpoint",
                "toggle-pause",
                "-",
                "settings",
                "-",
                "quit"
            ]
        );
        assert_eq!(shape(&up(serving(), false)), base);
        assert_eq!(shape(&TrayModel::new(Phase::Stopping, false)), base);
        // A hint line comes right under the status when there is one.
        let mut with_hint = base.clone();
        with_hint.insert(1, "hint".to_string());
        assert_eq!(shape(&up(serving(), true)), with_hint);
        // Then what generates, then each download.
        let busy = TrayModel {
            activity: Activity {
                running: 2,
                tokens_per_second: Some(41.4),
                drafts_kept: None,
            },
            downloads: vec![
                Download {
                    repo: "org/a".into(),
                    percent: Some(42),
                },
                Download {
                    repo: "org/b".into(),
                    percent: None,
                },
            ],
            ..up(serving(), false)
        };
        let mut with_lines = base.clone();
        with_lines.splice(1..1, ["activity", "download", "download"].map(String::from));
        assert_eq!(shape(&busy), with_lines);
        let lines: Vec<_> = busy
            .entries()
            .into_iter()
            .filter_map(|e| match e {
                Entry::Info { id, text } if id != STATUS_ID => Some(text),
                _ => None,
            })
            .collect();
        assert_eq!(
            lines,
            [
                "2 chats · 41 tok/s",
                "Downloading org/a 42%",
                "Downloading org/b…"
            ]
        );
    }

    /// The models in memory, each with its size, and an unload item for each but the
    /// default; none while the server does not answer.
    #[test]
    fn loaded_models_and_their_unload_items() {
        let model = |name: &str, bytes, default| LoadedModel {
            name: name.into(),
            bytes,
            default,
        };
        let two = TrayModel {
            loaded: vec![
                model("SmolLM2-135M-Instruct", 105_000_000, true),
                model("Qwen3-8B-4bit", 4_610_000_000, false),
            ],
            ..up(serving(), false)
        };
        let entries = two.entries();
        let at = entries
            .iter()
            .position(|e| e.id() == LOADED_ID)
            .expect("a loaded line");
        assert_eq!(entries[at - 1], Entry::Separator);
        let lines: Vec<_> = entries[at..at + 3]
            .iter()
            .map(|e| match e {
                Entry::Info { text, .. } => text.clone(),
                other => other.id(),
            })
            .collect();
        assert_eq!(
            lines,
            [
                "In memory: SmolLM2-135M-Instruct (default) · 105 MB",
                "In memory: Qwen3-8B-4bit · 4.6 GB",
                "unload:Qwen3-8B-4bit",
            ]
        );
        assert_eq!(
            entries[at + 2],
            Entry::Unload {
                model: "Qwen3-8B-4bit".into()
            }
        );
        assert_eq!(entries[at + 3], Entry::Separator);
        assert_eq!(unload_target(&entries[at + 2].id()), Some("Qwen3-8B-4bit"));
        assert_eq!(unload_target("settings"), None);
        let stopping = TrayModel {
            phase: Phase::Stopping,
            ..two.clone()
        };
        assert!(stopping.entries().iter().all(|e| e.id() != LOADED_ID));
    }

    #[test]
    fn live_status_in_tooltip_and_title() {
        let idle = up(serving(), false);
        assert_eq!(
            idle.tooltip(),
            "Seedbar: Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1"
        );
        assert_eq!(idle.title(), None);
        assert_eq!(idle.activity_line(), None);
        let one = TrayModel {
            activity: Activity {
                running: 1,
                tokens_per_second: Some(87.6),
                drafts_kept: None,
            },
            ..idle.clone()
        };
        assert_eq!(
            one.tooltip(),
            "Seedbar: SmolLM2-135M-Instruct · 1 chat · 88 tok/s"
        );
        assert_eq!(one.title().as_deref(), Some("88 tok/s"));
        // Before the first sample there is no speed yet.
        let starting = TrayModel {
            activity: Activity {
                running: 3,
                tokens_per_second: None,
                drafts_kept: None,
            },
            ..idle.clone()
        };
        assert_eq!(starting.activity_line().as_deref(), Some("3 chats"));
        assert_eq!(starting.title(), None);
        let drafting = TrayModel {
            activity: Activity {
                running: 1,
                tokens_per_second: Some(140.2),
                drafts_kept: Some(0.916),
            },
            ..idle
        };
        assert_eq!(
            drafting.activity_line().as_deref(),
            Some("1 chat · 140 tok/s · 92% of drafts kept")
        );
    }

    #[test]
    fn missing_model_says_what_to_do() {
        let model = up(Phase::NoModel { model: None }, false);
        assert!(info(&model, HINT_ID).unwrap().contains("seedbar pull"));
        assert!(info(&model, HINT_ID).unwrap().contains("Import"));
        assert_eq!(model.state_name(), "no-model");
        let failed = up(
            Phase::Error {
                message: "Cannot download m: offline".into(),
            },
            false,
        );
        assert!(info(&failed, HINT_ID).unwrap().contains("seedbar pull"));
        assert_eq!(failed.state_name(), "error");
        // A server that did not start has nothing to import into.
        let down = TrayModel::new(
            Phase::Error {
                message: "x".into(),
            },
            false,
        );
        assert_eq!(info(&down, HINT_ID), None);
    }

    #[test]
    fn long_errors_are_cut_to_one_line() {
        let message = format!("first line\nsecond {}", "x".repeat(200));
        let model = TrayModel::new(Phase::Error { message }, false);
        let line = model.status_line();
        assert_eq!(line.chars().count(), MAX_LINE_CHARS);
        assert!(line.starts_with("first line second x"));
        assert!(line.ends_with('…'));
        assert!(!line.contains('\n'));
    }

    #[test]
    fn endpoints_are_never_cut() {
        let model = TrayModel::new(
            Phase::Serving {
                model: "HuggingFaceTB--SmolLM2-135M-Instruct".into(),
            },
            true,
        )
        .listening_at("http://127.0.0.1:65535/v1");
        assert!(model.status_line().ends_with("http://127.0.0.1:65535/v1"));
    }

    #[test]
    fn quick_chat_shows_its_shortcut() {
        let mut model = up(serving(), false);
        assert_eq!(item(&model, Action::QuickChat), ("Quick Chat".into(), true));
        model.quick_chat_shortcut = Some("Ctrl+Shift+Space".into());
        assert_eq!(
            item(&model, Action::QuickChat),
            ("Quick Chat (Ctrl+Shift+Space)".into(), true)
        );
        model.phase = Phase::Stopping;
        assert!(!item(&model, Action::QuickChat).1);
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

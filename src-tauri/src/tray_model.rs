//! What the tray menu shows, as plain data: the default model's phase, where the server
//! listens, the pause switch, what is generating and downloading, the models in memory, the
//! chat models to choose the default from and the recent conversations in; menu entries with
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

/// A conversation the menu can reopen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    pub id: i64,
    pub title: String,
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
    /// A chat model in the "Default Model" submenu, checked when it is the default.
    DefaultModel {
        model: String,
        current: bool,
    },
    /// A conversation in the "Recent Conversations" submenu: opens it.
    Recent(Recent),
    /// A submenu of entries.
    Submenu {
        id: &'static str,
        label: String,
        entries: Vec<Entry>,
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
            Entry::DefaultModel { model, .. } => format!("{DEFAULT_PREFIX}{model}"),
            Entry::Recent(recent) => format!("{RECENT_PREFIX}{}", recent.id),
            Entry::Submenu { id, .. } => id.to_string(),
            Entry::Separator => String::new(),
        }
    }
}

/// An item of the menu that can be chosen, as the shell's status lists them: its label
/// (a checked choice's starred), and a submenu's items.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Choice {
    pub label: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<String>,
}

impl Entry {
    /// What the entry reads as where it can be chosen (what the arrow keys walk through);
    /// `None` for lines, separators and disabled items.
    pub fn choice(&self) -> Option<Choice> {
        let label = match self {
            Entry::Item {
                label,
                enabled: true,
                ..
            } => label.clone(),
            Entry::Unload { model } => format!("Unload {model}"),
            Entry::DefaultModel { model, current } => {
                format!("{}{model}", if *current { "*" } else { "" })
            }
            Entry::Recent(recent) => recent.title.clone(),
            Entry::Submenu { label, entries, .. } => {
                let items = entries.iter().filter_map(Entry::choice);
                return Some(Choice {
                    label: label.clone(),
                    items: items.map(|c| c.label).collect(),
                });
            }
            Entry::Item { .. } | Entry::Info { .. } | Entry::Separator => return None,
        };
        Some(Choice {
            label,
            items: Vec::new(),
        })
    }
}

/// Ids of unload items start with this, then the model's name.
const UNLOAD_PREFIX: &str = "unload:";
/// Ids of the default-model choices start with this, then the model's name.
const DEFAULT_PREFIX: &str = "default:";
/// Ids of recent conversations start with this, then the conversation's id.
const RECENT_PREFIX: &str = "recent:";

/// What a click on an item with a model's or a conversation's id asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<'a> {
    Unload(&'a str),
    Default(&'a str),
    Recent(i64),
}

/// The pick an item's id names, where it names one.
pub fn pick_of(id: &str) -> Option<Pick<'_>> {
    if let Some(model) = id.strip_prefix(UNLOAD_PREFIX) {
        return Some(Pick::Unload(model));
    }
    if let Some(model) = id.strip_prefix(DEFAULT_PREFIX) {
        return Some(Pick::Default(model));
    }
    id.strip_prefix(RECENT_PREFIX)?
        .parse()
        .ok()
        .map(Pick::Recent)
}

/// The window route that opens conversation `id`.
pub fn conversation_route(id: i64) -> String {
    format!("#/c/{id}")
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
/// Id of the default-model submenu.
pub const DEFAULT_MENU_ID: &str = "default-model";
/// Id of the recent-conversations submenu.
pub const RECENT_MENU_ID: &str = "recent";

/// Conversations the menu lists.
pub const RECENT_COUNT: usize = 5;
/// Longest conversation title shown.
const MAX_TITLE_CHARS: usize = 40;

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
    /// The installed chat models, which the default can be switched to.
    pub chat_models: Vec<String>,
    /// The most recently updated conversations, newest first.
    pub recent: Vec<Recent>,
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
            chat_models: Vec::new(),
            recent: Vec::new(),
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
        ]);
        if !stopping && !self.recent.is_empty() {
            entries.push(Entry::Submenu {
                id: RECENT_MENU_ID,
                label: "Recent Conversations".into(),
                entries: self
                    .recent
                    .iter()
                    .map(|r| {
                        Entry::Recent(Recent {
                            id: r.id,
                            title: shorten(&r.title, MAX_TITLE_CHARS),
                        })
                    })
                    .collect(),
            });
        }
        entries.extend([
            Entry::Separator,
            item(Action::CopyEndpoint, "Copy Endpoint URL", serving),
            item(Action::TogglePause, self.pause_label(), serving),
            Entry::Separator,
        ]);
        if let Some(submenu) = self.default_menu().filter(|_| serving) {
            entries.push(submenu);
        }
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

    /// "Default Model ▸" with every chat model, the one served (or loading) checked;
    /// `None` while there is no choice to make.
    fn default_menu(&self) -> Option<Entry> {
        let current = match &self.phase {
            Phase::Serving { model } | Phase::Loading { model: Some(model) } => Some(model),
            _ => None,
        };
        if self.chat_models.len() < 2 && current.is_some() {
            return None;
        }
        let entries: Vec<Entry> = self
            .chat_models
            .iter()
            .map(|model| Entry::DefaultModel {
                model: model.clone(),
                current: current.is_some_and(|c| c.eq_ignore_ascii_case(model)),
            })
            .collect();
        (!entries.is_empty()).then(|| Entry::Submenu {
            id: DEFAULT_MENU_ID,
            label: "Default Model".into(),
            entries,
        })
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
mod tests;

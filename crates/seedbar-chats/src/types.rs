//! What the store keeps, in the JSON shapes of the app API (docs/app-api.md): conversations
//! with their settings, messages with the seed and sampling each reply used, app settings.

use serde::{Deserialize, Deserializer, Serialize};

/// A conversation's generation settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Store name of the model, e.g. `SmolLM2-135M-Instruct`.
    pub model: String,
    /// `""` for none.
    pub system_prompt: String,
    pub temperature: f64,
    pub top_p: f64,
    pub max_tokens: u32,
    /// The pinned seed; `None` draws a fresh one per reply.
    pub seed: Option<u64>,
}

impl Settings {
    /// The defaults for a new conversation with `model`.
    pub fn for_model(model: impl Into<String>) -> Self {
        Settings {
            model: model.into(),
            system_prompt: String::new(),
            temperature: 0.7,
            top_p: 1.0,
            max_tokens: 512,
            seed: None,
        }
    }

    /// These settings with the fields `patch` names replaced.
    pub fn patched(&self, patch: &SettingsPatch) -> Settings {
        Settings {
            model: patch.model.as_ref().unwrap_or(&self.model).clone(),
            system_prompt: patch
                .system_prompt
                .as_ref()
                .unwrap_or(&self.system_prompt)
                .clone(),
            temperature: patch.temperature.unwrap_or(self.temperature),
            top_p: patch.top_p.unwrap_or(self.top_p),
            max_tokens: patch.max_tokens.unwrap_or(self.max_tokens),
            seed: patch.seed.unwrap_or(self.seed),
        }
    }

    /// What a reply generated under these settings records.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            model: self.model.clone(),
            temperature: self.temperature,
            top_p: self.top_p,
            max_tokens: self.max_tokens,
            system_prompt: self.system_prompt.clone(),
        }
    }
}

/// Some settings to change; `seed: null` unpins, an absent `seed` leaves it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    pub seed: Option<Option<u64>>,
}

/// A field that is present, `null` included (absent fields take `#[serde(default)]`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(de: D) -> Result<Option<T>, D::Error> {
    T::deserialize(de).map(Some)
}

/// A conversation as listed: its settings, without its messages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conversation {
    pub id: i64,
    pub title: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub updated_at: String,
    pub settings: Settings,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    /// The API (and database) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Where a message stands. User messages are `Complete` from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// A reply being written. One left behind by a process that was killed is marked
    /// `Stopped` when the store is next opened.
    Streaming,
    Complete,
    /// Stopped by the user (or cut short), holding what was written.
    Stopped,
    /// The engine failed; holds what was written before.
    Error,
}

impl Status {
    /// The API (and database) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Streaming => "streaming",
            Status::Complete => "complete",
            Status::Stopped => "stopped",
            Status::Error => "error",
        }
    }
}

/// The settings a reply was generated with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub model: String,
    pub temperature: f64,
    pub top_p: f64,
    pub max_tokens: u32,
    pub system_prompt: String,
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub id: i64,
    pub conversation_id: i64,
    pub role: Role,
    pub content: String,
    /// Assistant replies: the seed the reply used.
    pub seed: Option<u64>,
    pub sampling: Option<Sampling>,
    pub status: Status,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Assistant replies of models that think: the thinking before the content.
    pub reasoning: Option<String>,
    /// How long the model thought, in milliseconds.
    pub reasoning_ms: Option<u64>,
    /// Replies: what fixed the reply besides its seed and sampling (the server's receipt:
    /// the model's weights hash and quantization, the engine build, the backend class and
    /// their fingerprint), as the server wrote it.
    pub provenance: Option<serde_json::Value>,
    /// User messages: the ids of the images sent with the text, in order
    /// ([`ChatStore::image`](crate::ChatStore::image)).
    pub images: Vec<i64>,
}

/// An image as a user sent it: its encoded bytes and their media type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub media_type: String,
    pub data: Vec<u8>,
}

/// What a streaming reply has written: its content and, from models that think, its
/// thinking and how long that took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyText {
    pub content: String,
    pub reasoning: String,
    pub reasoning_ms: Option<u64>,
}

impl ReplyText {
    /// A reply of `content` alone.
    pub fn content(content: impl Into<String>) -> Self {
        ReplyText {
            content: content.into(),
            ..ReplyText::default()
        }
    }
}

/// A message to add to a conversation.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub role: Role,
    pub content: String,
    pub status: Status,
    pub seed: Option<u64>,
    pub sampling: Option<Sampling>,
    pub provenance: Option<serde_json::Value>,
    /// A reply's thinking and how long it took (an imported conversation's).
    pub reasoning: Option<String>,
    pub reasoning_ms: Option<u64>,
    /// A user message's images, in order.
    pub images: Vec<Image>,
}

impl NewMessage {
    /// A user message (complete from the start).
    pub fn user(content: impl Into<String>) -> Self {
        NewMessage {
            role: Role::User,
            content: content.into(),
            status: Status::Complete,
            seed: None,
            sampling: None,
            provenance: None,
            reasoning: None,
            reasoning_ms: None,
            images: Vec::new(),
        }
    }

    /// The row of a reply about to stream, with its model's `provenance`.
    pub fn reply(seed: u64, sampling: Sampling, provenance: serde_json::Value) -> Self {
        NewMessage {
            role: Role::Assistant,
            content: String::new(),
            status: Status::Streaming,
            seed: Some(seed),
            sampling: Some(sampling),
            provenance: Some(provenance),
            reasoning: None,
            reasoning_ms: None,
            images: Vec::new(),
        }
    }
}

/// What a reply request does to a conversation before its reply starts
/// ([`ChatStore::begin_reply`](crate::ChatStore::begin_reply)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Append a user message with this text and these images.
    Send { content: String, images: Vec<Image> },
    /// Replace the text of a user message of the conversation and drop everything after it.
    Edit { message_id: i64, content: String },
    /// Answer again: drop every message after message `after`.
    Regenerate { after: i64 },
}

/// The app's own settings (the menu-bar app applies them; port, key and origins on the
/// next start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSettings {
    pub port: u16,
    /// `""` for none.
    pub api_key: String,
    pub allowed_origins: Vec<String>,
    pub show_in_dock: bool,
    pub launch_at_login: bool,
    /// The global shortcut that opens the quick-chat panel (`""` for none), in the
    /// accelerator syntax of Tauri's global-shortcut plugin: `CommandOrControl+Shift+Space`.
    /// Settings saved before it existed get the default.
    #[serde(default = "default_quick_chat_shortcut")]
    pub quick_chat_shortcut: String,
    /// Gigabytes of prompt KV the engine keeps on disk for later requests (`0`: none).
    /// Settings saved before it existed get the default.
    #[serde(default = "default_prompt_cache_disk_gb")]
    pub prompt_cache_disk_gb: u32,
    /// Minutes a model other than the default one stays loaded once idle (`0`: until its
    /// room is needed, or as `seedbar serve --keep-alive` says).
    #[serde(default)]
    pub unload_idle_minutes: u32,
    /// The model new conversations and requests that name none run on (`""`: the bundled
    /// default, else the first chat model installed); chosen in the tray or the settings.
    #[serde(default)]
    pub default_model: String,
    /// Whether the app has a menu-bar (tray) icon; without one it opens from the Dock or
    /// launcher and the global shortcut.
    #[serde(default = "yes")]
    pub show_menu_bar_icon: bool,
    /// Start with the window closed (the app waits in the menu bar).
    #[serde(default)]
    pub start_minimized: bool,
    /// Whether the first run's welcome (a model picked for this machine) was done or
    /// skipped.
    #[serde(default)]
    pub welcomed: bool,
    /// Whether image parts given by `http(s)` addresses are fetched (off: refused, and only
    /// data URLs and local files are read).
    #[serde(default)]
    pub fetch_image_urls: bool,
    /// Each chat model's draft model for speculative decoding (a smaller installed model of
    /// the same vocabulary), by the model's name.
    #[serde(default)]
    pub draft_models: std::collections::BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

/// The disk budget of the prompt cache until one is chosen.
pub const DEFAULT_PROMPT_CACHE_DISK_GB: u32 = 8;

fn default_prompt_cache_disk_gb() -> u32 {
    DEFAULT_PROMPT_CACHE_DISK_GB
}

/// Quick chat's shortcut until one is chosen: Cmd+Shift+Space on macOS, Ctrl+Shift+Space
/// elsewhere (Cmd+Space and Alt+Space belong to Spotlight and window menus).
pub const DEFAULT_QUICK_CHAT_SHORTCUT: &str = "CommandOrControl+Shift+Space";

fn default_quick_chat_shortcut() -> String {
    DEFAULT_QUICK_CHAT_SHORTCUT.to_string()
}

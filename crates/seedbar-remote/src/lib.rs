//! Remote engines: models that run on an existing serving engine (vLLM, SGLang,
//! llama-server, Ollama or another Seedbar) and appear in Seedbar's library beside local
//! ones. This crate owns what a remote is ([`Remote`]), where remotes and their API keys are
//! kept ([`Remotes`], [`keys`]), what an upstream says about itself when one is added
//! ([`probe`]), and the exchange with it ([`Upstream`]): a neutral [`Ask`] sent in the
//! upstream's protocol (OpenAI-compatible or Ollama), its reply streamed back as [`Piece`]s,
//! with timeouts, a retry only while nothing has streamed, and errors that name the upstream;
//! and, through the same client, one URL's bytes within limits ([`fetch`]: an image part's
//! `http(s)` URL, where the server allows fetching).
//!
//! ```no_run
//! # async fn run() -> Result<(), seedbar_remote::UpstreamError> {
//! use futures_util::StreamExt;
//! use seedbar_remote::{Api, Ask, AskPrompt, Remote, Upstream};
//!
//! let remote = Remote::new("big", "http://gpu-box:8000", Api::OpenAi, "qwen3-32b");
//! let ask = Ask::new(AskPrompt::Text("The capital of France is".into()), 42);
//! let mut pieces = Upstream::new(&remote, None).ask(&ask).await?;
//! while let Some(piece) = pieces.next().await {
//!     println!("{:?}", piece?);
//! }
//! # Ok(()) }
//! ```

pub mod fetch;
pub mod keys;
pub mod probe;
mod registry;
mod upstream;
mod wire;

use serde::{Deserialize, Serialize};

pub use registry::{NewRemote, RegistryError, Remotes, REMOTES_FILE};
pub use upstream::{Pieces, Upstream, UpstreamError};
pub use wire::{Ask, AskPrompt, End, Finish, Piece, Shape};

/// The protocol an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/v1/chat/completions` and `/v1/completions` (vLLM, SGLang, llama-server, Seedbar,
    /// and Ollama's compatibility routes).
    #[serde(rename = "openai")]
    OpenAi,
    /// `/api/chat` and `/api/generate`.
    Ollama,
}

/// A model served by another engine, as the library keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Remote {
    /// The name clients ask for (unique among local and remote models).
    pub name: String,
    /// The upstream's base URL, without `/v1` and without a trailing slash.
    pub url: String,
    pub api: Api,
    /// The model id the upstream knows it by.
    pub model: String,
    /// Which engine answered the probe (`vllm`, `sglang`, `llama-server`, `ollama`,
    /// `seedbar`), or `unknown`.
    #[serde(default = "unknown")]
    pub engine: String,
    /// The engine's version, where it says.
    #[serde(default)]
    pub engine_version: Option<String>,
    /// Whether the upstream promises that a seeded reply is the same whatever else it runs
    /// (Seedbar; SGLang in deterministic mode; vLLM with batch invariance on, as the user
    /// says): replies then carry the seed's promise, else only the seed.
    #[serde(default)]
    pub identical_seeds: bool,
    #[serde(default)]
    pub supports: Supports,
    /// Seconds without a byte from the upstream before a request is given up (the time to
    /// the first token included).
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// Whether an API key is kept for it (in [`keys`]).
    #[serde(default)]
    pub has_key: bool,
}

/// What an upstream is known to take, from the probe where it tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supports {
    pub seeds: bool,
    pub tools: bool,
    pub images: bool,
    pub structured: bool,
    pub reasoning: bool,
}

impl Default for Supports {
    /// What the OpenAI-compatible servers named above all take; images only where told.
    fn default() -> Self {
        Supports {
            seeds: true,
            tools: true,
            images: false,
            structured: true,
            reasoning: true,
        }
    }
}

/// Seconds [`Remote::timeout_s`] is by default: a large model's long prompt may take minutes
/// to its first token.
pub const DEFAULT_TIMEOUT_S: u64 = 300;

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_S
}

fn unknown() -> String {
    "unknown".into()
}

impl Remote {
    /// A remote as given, before a probe fills in what the upstream says.
    pub fn new(name: &str, url: &str, api: Api, model: &str) -> Remote {
        Remote {
            name: name.to_string(),
            url: base_url(url),
            api,
            model: model.to_string(),
            engine: unknown(),
            engine_version: None,
            identical_seeds: false,
            supports: Supports::default(),
            timeout_s: DEFAULT_TIMEOUT_S,
            has_key: false,
        }
    }

    /// Where it runs, for people: the engine and the host.
    pub fn owner(&self) -> String {
        let host = self
            .url
            .split("://")
            .nth(1)
            .unwrap_or(&self.url)
            .split('/')
            .next()
            .unwrap_or_default();
        format!("{} at {host}", self.engine)
    }
}

/// `url` without trailing slashes and without a final `/v1` (`/api` for Ollama's): the
/// routes are added per request.
pub fn base_url(url: &str) -> String {
    let mut url = url.trim().trim_end_matches('/');
    for suffix in ["/v1", "/api"] {
        url = url.strip_suffix(suffix).unwrap_or(url);
    }
    url.trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_lose_the_api_path() {
        assert_eq!(base_url("http://h:8000/v1/"), "http://h:8000");
        assert_eq!(base_url(" http://h:11434/api "), "http://h:11434");
        assert_eq!(base_url("https://h/proxy/v1"), "https://h/proxy");
    }

    #[test]
    fn the_owner_names_engine_and_host() {
        let mut remote = Remote::new("r", "http://gpu:8000/v1", Api::OpenAi, "m");
        remote.engine = "vllm".into();
        assert_eq!(remote.owner(), "vllm at gpu:8000");
    }
}

//! The models the server answers for: every model installed in the store, loaded on first
//! use (the served model at start), each running behind its own scheduler; which stay in
//! memory, the reload of one whose engine failed, and what each model's files say about it
//! (`ModelFacts`: its inventory and digest, read once per file version); and the remote
//! models of the library (`RemoteModel`: a model another engine serves).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::http::StatusCode;
use seedbar_engine::{
    inventory::Inventory,
    store::{ModelKind, ModelStore, StoredModel},
    tokenizer::Tokenizer,
    ChatMessage, ChatPrompt, ChatTemplate, EngineError, ImagePrompt, Model, ModelConfig,
    TemplateKwargs, Vision,
};
use seedbar_grammar::{GrammarError, Vocabulary};
use seedbar_remote::{Remote, Remotes};
use seedbar_scheduler::{DiskCache, DiskTier, DraftModel, Scheduler, SchedulerConfig, SubmitError};

use crate::{
    error::ApiError,
    receipt::{Digests, Provenance},
};

/// What clients are told about a model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelCard {
    pub name: String,
    pub format: &'static str,
    pub bytes: u64,
    /// Seconds since the epoch the model was installed.
    pub created: u64,
    pub path: PathBuf,
    pub quantization: Option<String>,
    /// GGUF's `general.architecture` or `config.json`'s `model_type`.
    pub architecture: Option<String>,
    /// Whether Seedbar runs that architecture.
    pub supported: bool,
    pub kind: ModelKind,
}

/// A model in memory: its scheduler and what the HTTP side needs to build prompts.
pub struct LoadedModel {
    pub card: ModelCard,
    pub scheduler: Scheduler,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// How images stand in its prompts, where the model sees them.
    pub images: Option<ImagePrompt>,
    pub config: ModelConfig,
    /// Its weights' content hash, the build and the backend: what a reply's receipt holds
    /// besides its seed and settings (`fingerprint` is OpenAI's `system_fingerprint`).
    pub provenance: Provenance,
    /// Ids that end a reply.
    pub eos_ids: Vec<u32>,
    /// The vocabulary as structured outputs see it, built on first use.
    vocabulary: OnceLock<Result<Vocabulary, GrammarError>>,
}

impl LoadedModel {
    /// The vocabulary constrained decoding masks (built once, on the first request that
    /// asks for a format).
    pub fn vocabulary(&self) -> Result<&Vocabulary, GrammarError> {
        self.vocabulary
            .get_or_init(|| Vocabulary::new(&self.tokenizer, &self.eos_ids))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The prompt for a chat rendered with the request's template `kwargs`, ending where the
    /// assistant's reply begins; special-token strings in the messages' text stay text.
    /// `image_sizes` are the messages' images' (width, height), in order: how many soft
    /// tokens each takes may follow its size.
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        kwargs: &TemplateKwargs,
        image_sizes: &[(u32, u32)],
    ) -> Result<ChatPrompt, ApiError> {
        if self.images.is_none() && messages.iter().any(|m| m.images() > 0) {
            return Err(ApiError::bad_param(
                "messages",
                format!(
                    "the model '{}' does not take images: it reads text only",
                    self.card.name
                ),
            ));
        }
        let bad = |e: EngineError| match e {
            EngineError::ChatTemplate(_) | EngineError::InvalidRequest(_) => {
                ApiError::bad_param("messages", e.to_string())
            }
            e => ApiError::internal(e),
        };
        let marks = self
            .images
            .as_ref()
            .map(|p| p.marks(image_sizes))
            .transpose()
            .map_err(bad)?;
        self.template
            .prompt(&self.tokenizer, messages, tools, kwargs, marks.as_ref())
            .map_err(bad)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer.encode(text).map_err(ApiError::internal)
    }

    /// The model's fill-in-the-middle tokens (StarCoder or Qwen naming): prefix, suffix,
    /// middle.
    pub fn fim_tokens(&self) -> Option<[u32; 3]> {
        const NAMINGS: [[&str; 3]; 2] = [
            ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
            ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ];
        NAMINGS.iter().find_map(|names| {
            let [p, s, m] = names.map(|n| self.tokenizer.token_to_id(n));
            Some([p?, s?, m?])
        })
    }

    /// A fill-in-the-middle prompt from the model's FIM tokens: prefix, suffix, then the
    /// middle the model writes.
    pub fn fill_in_the_middle(&self, prefix: &str, suffix: &str) -> Result<Vec<u32>, ApiError> {
        let Some([p, s, m]) = self.fim_tokens() else {
            return Err(ApiError::bad_param(
                "suffix",
                format!(
                    "{} has no fill-in-the-middle tokens, so `suffix` cannot be used",
                    self.card.name
                ),
            ));
        };
        let mut prompt = vec![p];
        prompt.extend(self.encode(prefix)?);
        prompt.push(s);
        prompt.extend(self.encode(suffix)?);
        prompt.push(m);
        Ok(prompt)
    }
}

/// A model another engine serves: where, with which key, and the provenance its replies
/// carry.
pub struct RemoteModel {
    pub remote: Remote,
    pub key: Option<String>,
    pub provenance: Provenance,
}

/// What a model's files say about it.
#[derive(Debug)]
pub struct ModelFacts {
    pub inventory: Inventory,
    /// `sha256:` and the hex digest of the model file (of a folder's files, in name order).
    pub digest: String,
}

/// Facts read from a file version: its size and modification time, and what it said.
struct FactsEntry {
    bytes: u64,
    modified: u64,
    facts: Arc<ModelFacts>,
}

/// Read `card`'s files: the inventory from their headers, and the digest of their bytes.
fn read_facts(card: &ModelCard, digests: &Digests) -> Result<ModelFacts, ApiError> {
    let inventory = seedbar_engine::inventory::read(&card.path).map_err(ApiError::internal)?;
    let digest = digests.of(&card.path).map_err(ApiError::internal)?;
    Ok(ModelFacts { inventory, digest })
}

/// A loaded model and when a request last asked for it.
struct Entry {
    model: Arc<LoadedModel>,
    /// When a request last came for it, or it last ran one.
    last_used: Instant,
    /// How long it stays once idle, as a request asked (Ollama's `keep_alive`); `None`:
    /// as the host's default says.
    keep_alive: Option<KeepAlive>,
}

/// How long a loaded model stays in memory after its last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Until the server stops, or the room is needed.
    Forever,
    /// This long after the last request ends (zero: unloaded as soon as it is idle).
    For(Duration),
}

impl std::str::FromStr for KeepAlive {
    type Err = String;

    /// Ollama's forms: seconds (`300`, `-1` for forever) or a duration (`5m`, `1h30m`,
    /// `45s`, `500ms`; negative for forever).
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || format!("'{text}' is not a duration (e.g. 300, \"5m\", \"1h\", \"-1\")");
        if let Some(rest) = text.strip_prefix('-') {
            return rest
                .parse::<KeepAlive>()
                .map(|_| KeepAlive::Forever)
                .map_err(|_| bad());
        }
        if let Ok(seconds) = text.parse::<f64>() {
            return Ok(KeepAlive::For(Duration::from_secs_f64(seconds)));
        }
        let mut total = Duration::ZERO;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            let (number, tail) = rest.split_at(digits);
            let number: f64 = number.parse().map_err(|_| bad())?;
            let unit_len = tail
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(unit_len);
            let seconds = match unit {
                "h" => 3600.0,
                "m" => 60.0,
                "s" => 1.0,
                "ms" => 1e-3,
                _ => return Err(bad()),
            };
            total += Duration::from_secs_f64(number * seconds);
            rest = tail;
        }
        if text.is_empty() {
            return Err(bad());
        }
        Ok(KeepAlive::For(total))
    }
}

/// Installed models, and the ones loaded. The served model stays loaded; others are loaded
/// on first use and evicted, least recently used first, when a new one needs room in the
/// memory budget, never while they run or queue requests. A model whose engine failed is
/// dropped, and the next request for it loads it afresh.
pub struct ModelHost {
    store: ModelStore,
    outside: Vec<StoredModel>,
    config: SchedulerConfig,
    /// The served model's key: never evicted.
    served: Mutex<String>,
    /// Bytes of model files kept in memory at once.
    memory_budget: u64,
    /// How long a model other than the served one stays once idle, unless a request says
    /// (`seedbar serve --keep-alive`, or the app's setting).
    idle_keep_alive: Mutex<KeepAlive>,
    loaded: Mutex<HashMap<String, Entry>>,
    /// Serialises loads so two requests for a cold model load it once.
    loading: tokio::sync::Mutex<()>,
    /// Set by `stop_all`: nothing is loaded any more.
    stopping: AtomicBool,
    /// Each model file's facts, by path.
    facts: Mutex<HashMap<PathBuf, FactsEntry>>,
    /// Serialises reading facts so that a file is hashed once.
    reading_facts: tokio::sync::Mutex<()>,
    /// The prompt cache's disk tier, shared by every model's scheduler.
    disk_cache: Option<Arc<DiskCache>>,
    /// Models' weights digests, kept in the data directory across restarts.
    digests: Arc<Digests>,
    /// Each model file's capabilities, by path, with the size and time they were read at.
    capabilities: Mutex<HashMap<PathBuf, (u64, u64, Capabilities)>>,
    /// The remote models (`remotes.json` in the data directory).
    remotes: Remotes,
    /// Each remote as last served, by name, with its key read once.
    remote_models: Mutex<HashMap<String, Arc<RemoteModel>>>,
    /// The served model's draft model as given at start (a store name or a path), if any.
    draft_model: Option<String>,
    /// Each model's draft model as the settings choose it, by the model's key.
    draft_models: Mutex<HashMap<String, String>>,
}

/// What a model does, in Ollama's names: `completion` (and `tools` where its template reads
/// them, `thinking` where it thinks), `embedding` or `rerank`.
pub type Capabilities = Vec<&'static str>;

/// The key of a model name: case-insensitive, Ollama's `:latest` tag dropped.
fn key(name: &str) -> String {
    name.strip_suffix(":latest").unwrap_or(name).to_lowercase()
}

impl ModelHost {
    /// `served`: the model that is never evicted; `outside`: models served from paths
    /// outside the store (`seedbar serve --model PATH`).
    pub fn new(
        store: ModelStore,
        config: SchedulerConfig,
        served: &str,
        outside: Vec<StoredModel>,
        idle_keep_alive: KeepAlive,
        disk_cache: Option<Arc<DiskCache>>,
    ) -> Self {
        let digests = Arc::new(Digests::open(store.root()));
        ModelHost {
            remotes: Remotes::open(store.root()),
            remote_models: Mutex::new(HashMap::new()),
            store,
            outside,
            config,
            served: Mutex::new(key(served)),
            idle_keep_alive: Mutex::new(idle_keep_alive),
            memory_budget: crate::memory::default_budget(),
            loaded: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            stopping: AtomicBool::new(false),
            facts: Mutex::new(HashMap::new()),
            reading_facts: tokio::sync::Mutex::new(()),
            disk_cache,
            capabilities: Mutex::new(HashMap::new()),
            digests,
            draft_model: None,
            draft_models: Mutex::new(HashMap::new()),
        }
    }

    /// The host with `draft` (a store name or a path) drafting for the model it was made to
    /// serve, and the settings' draft models (`pairs`, by model name).
    pub fn drafting_with(self, draft: Option<String>, pairs: BTreeMap<String, String>) -> Self {
        self.set_draft_models(&pairs);
        ModelHost {
            draft_model: draft,
            ..self
        }
    }

    /// Take the settings' draft models (by model name); the models whose draft model
    /// changed.
    pub fn set_draft_models(&self, pairs: &BTreeMap<String, String>) -> Vec<String> {
        let pairs: HashMap<String, String> =
            pairs.iter().map(|(m, d)| (key(m), d.clone())).collect();
        let mut current = self.draft_models.lock().unwrap_or_else(|e| e.into_inner());
        let changed = current
            .keys()
            .chain(pairs.keys())
            .filter(|m| current.get(*m) != pairs.get(*m))
            .cloned()
            .collect::<BTreeSet<String>>();
        *current = pairs;
        changed.into_iter().collect()
    }

    /// The draft model's file for the model `key`, where it has one: the settings' choice,
    /// else the served model's as started, if it resolves.
    fn draft_for(&self, key: &str) -> Option<PathBuf> {
        let chosen = self
            .draft_models
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        let served = *self.served.lock().unwrap_or_else(|e| e.into_inner()) == key;
        let draft = chosen.or_else(|| self.draft_model.clone().filter(|_| served))?;
        match self.store.resolve(&draft) {
            Ok(path) => Some(path),
            Err(e) => {
                tracing::error!(draft, "no draft model: {e}");
                None
            }
        }
    }

    /// What `card`'s model does, read from its files' headers and template (once per file
    /// version, without loading it).
    pub fn capabilities(&self, card: &ModelCard) -> Capabilities {
        let version = (card.bytes, card.created);
        let cached = |cache: &HashMap<PathBuf, (u64, u64, Capabilities)>| {
            let (bytes, created, capabilities) = cache.get(&card.path)?;
            ((*bytes, *created) == version).then(|| capabilities.clone())
        };
        if let Some(known) = cached(&self.capabilities.lock().unwrap_or_else(|e| e.into_inner())) {
            return known;
        }
        let capabilities = match card.kind {
            ModelKind::Embedding => vec!["embedding"],
            ModelKind::Reranker => vec!["rerank"],
            ModelKind::Chat => {
                let template = seedbar_engine::inventory::read(&card.path)
                    .ok()
                    .and_then(|inventory| inventory.chat_template)
                    .and_then(|source| ChatTemplate::new(&source, "", "").ok());
                let mut capabilities = vec!["completion"];
                if let Some(template) = template {
                    if template.supports_tools() {
                        capabilities.push("tools");
                    }
                    if template.thinking().thinks {
                        capabilities.push("thinking");
                    }
                }
                if Vision::seen_at(&card.path) {
                    capabilities.push("vision");
                }
                capabilities
            }
        };
        self.capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                card.path.clone(),
                (version.0, version.1, capabilities.clone()),
            );
        capabilities
    }

    /// The prompt cache's disk tier, if on.
    pub fn disk_cache(&self) -> Option<&Arc<DiskCache>> {
        self.disk_cache.as_ref()
    }

    /// Make `name` the served model (the default one, never evicted).
    pub fn set_served(&self, name: &str) {
        *self.served.lock().unwrap_or_else(|e| e.into_inner()) = key(name);
    }

    pub fn store(&self) -> &ModelStore {
        &self.store
    }

    pub fn remotes(&self) -> &Remotes {
        &self.remotes
    }

    /// The remote model called `name` (case-insensitive), its key read from where keys are
    /// kept the first time it is served as it is now.
    pub fn remote(&self, name: &str) -> Option<Arc<RemoteModel>> {
        let remote = self.remotes.get(name)?;
        let mut served = self.remote_models.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(model) = served.get(&remote.name).filter(|m| m.remote == remote) {
            return Some(model.clone());
        }
        let key = remote
            .has_key
            .then(|| seedbar_remote::keys::load(self.store.root(), &remote.name))
            .flatten();
        let model = Arc::new(RemoteModel {
            provenance: Provenance::remote(&remote),
            key,
            remote,
        });
        served.insert(model.remote.name.clone(), model.clone());
        Some(model)
    }

    /// Forget what was served of `name` (its key changed or it was removed).
    pub fn forget_remote(&self, name: &str) {
        let mut served = self.remote_models.lock().unwrap_or_else(|e| e.into_inner());
        served.retain(|served, _| !served.eq_ignore_ascii_case(name));
    }

    /// Every installed model, and those served from outside the store.
    pub fn installed(&self) -> Result<Vec<ModelCard>, ApiError> {
        let mut models = self.store.list().map_err(ApiError::internal)?;
        models.extend(self.outside.iter().cloned());
        Ok(models
            .into_iter()
            .map(|m| ModelCard {
                created: m
                    .path
                    .metadata()
                    .and_then(|md| md.modified())
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs()),
                supported: m.runnable(),
                name: m.name,
                format: m.format,
                bytes: m.bytes,
                path: m.path,
                quantization: m.quantization,
                architecture: m.architecture,
                kind: m.kind,
            })
            .collect())
    }

    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        self.lock().values().map(|e| e.model.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loaded model under `key` if its engine still runs (one that failed is dropped).
    fn running(&self, key: &str) -> Option<Arc<LoadedModel>> {
        let mut models = self.lock();
        let entry = models.get_mut(key)?;
        if entry.model.scheduler.is_running() {
            entry.last_used = Instant::now();
            return Some(entry.model.clone());
        }
        tracing::warn!(model = key, "dropping a model whose engine stopped");
        let dead = models.remove(key);
        drop(models);
        retire(dead.into_iter().collect());
        None
    }

    /// The model called `name` (case-insensitive; Ollama's `:latest` tag allowed), loading
    /// it if needed.
    pub async fn get(&self, name: &str) -> Result<Arc<LoadedModel>, ApiError> {
        let key = key(name);
        if key.is_empty() {
            return Err(ApiError::bad_param("model", "`model` is required"));
        }
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::from(SubmitError::Stopped));
        }
        if let Some(model) = self.running(&key) {
            return Ok(model);
        }
        let _loading = self.loading.lock().await;
        if let Some(model) = self.running(&key) {
            return Ok(model);
        }
        let card = self.card(name)?;
        let routes = match card.kind {
            ModelKind::Chat => None,
            ModelKind::Embedding => Some(("an embedding model", "/v1/embeddings and /api/embed")),
            ModelKind::Reranker => Some(("a reranker", "/v1/rerank")),
        };
        if let Some((what, routes)) = routes {
            return Err(ApiError::bad_param(
                "model",
                format!(
                    "{} is {what}: it answers {routes}, not chat or completions",
                    card.name
                ),
            ));
        }
        self.check_fits(&card)?;
        retire(self.make_room(&card)?);
        let mut config = self.config.clone();
        // The model's identity in the disk tier's keys is its weights' digest (`load`).
        config.disk_cache = self.disk_cache.clone().map(|cache| DiskTier {
            cache,
            model: String::new(),
        });
        let digests = self.digests.clone();
        let draft = self.draft_for(&key);
        let loaded = tokio::task::spawn_blocking(move || load(card, draft, config, &digests))
            .await
            .map_err(ApiError::internal)??;
        let loaded = Arc::new(loaded);
        self.lock().insert(
            key,
            Entry {
                model: loaded.clone(),
                last_used: Instant::now(),
                keep_alive: None,
            },
        );
        Ok(loaded)
    }

    /// The installed model called `name` (case-insensitive; Ollama's `:latest` tag allowed).
    pub fn card(&self, name: &str) -> Result<ModelCard, ApiError> {
        let installed = self.installed()?;
        let key = key(name);
        installed
            .iter()
            .find(|m| m.name.to_lowercase() == key)
            .cloned()
            .ok_or_else(|| {
                let remotes = self.remotes.list().into_iter().map(|r| r.name);
                let names: Vec<String> = installed
                    .iter()
                    .map(|m| m.name.clone())
                    .chain(remotes)
                    .collect();
                ApiError::unknown_model(name, &names)
            })
    }

    /// Whether `card` fits in the memory free now, counting what evicting the idle models
    /// would give back (a loaded model fits); when it does not, the memory it needs and the
    /// memory there is.
    pub fn shortfall(&self, card: &ModelCard) -> Option<(u64, u64)> {
        let free = crate::memory::available()?;
        let served = self.served_key();
        let models = self.lock();
        if models.contains_key(&key(&card.name)) {
            return None;
        }
        let evictable: u64 = models
            .iter()
            .filter(|(k, e)| **k != served && !e.model.scheduler.busy())
            .map(|(_, e)| e.model.card.bytes)
            .sum();
        let needed = crate::memory::needed(card.bytes);
        (needed > free + evictable).then_some((needed, free + evictable))
    }

    /// Refuse `card` when it does not fit (see [`ModelHost::shortfall`]): both sizes in the
    /// message, before anything is loaded.
    fn check_fits(&self, card: &ModelCard) -> Result<(), ApiError> {
        let Some((needed, free)) = self.shortfall(card) else {
            return Ok(());
        };
        Err(ApiError {
            code: Some("model_too_large"),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{} needs about {} of memory to load, and {} is free (idle models \
                     unloaded); close other apps, unload a model, or pick a smaller one",
                    card.name,
                    crate::memory::human(needed),
                    crate::memory::human(free),
                ),
            )
        })
    }

    fn served_key(&self) -> String {
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keep `name` (if loaded) for `keep_alive` after its last request, as a request asked.
    pub fn set_keep_alive(&self, name: &str, keep_alive: KeepAlive) {
        if let Some(entry) = self.lock().get_mut(&key(name)) {
            entry.keep_alive = Some(keep_alive);
            entry.last_used = Instant::now();
        }
    }

    /// How long `entry` stays once idle: as its last request asked, else forever for the
    /// served model and the host's default for others.
    fn keep_alive(&self, key: &str, entry: &Entry, served: &str) -> KeepAlive {
        entry.keep_alive.unwrap_or(if key == served {
            KeepAlive::Forever
        } else {
            *self
                .idle_keep_alive
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        })
    }

    /// How long models other than the served one stay once idle from now on.
    pub fn set_idle_keep_alive(&self, keep_alive: KeepAlive) {
        *self
            .idle_keep_alive
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = keep_alive;
    }

    /// When the loaded model `name` leaves memory if no request comes: `None` for never
    /// (or not loaded).
    pub fn expires(&self, name: &str) -> Option<SystemTime> {
        let served = self.served_key();
        let key = key(name);
        let models = self.lock();
        let entry = models.get(&key)?;
        match self.keep_alive(&key, entry, &served) {
            KeepAlive::Forever => None,
            KeepAlive::For(after) => {
                let left = (entry.last_used + after).saturating_duration_since(Instant::now());
                Some(SystemTime::now() + left)
            }
        }
    }

    /// Unload the models whose keep-alive has run out since their last request (a model
    /// still running requests counts as used now).
    pub fn unload_expired(&self) {
        let served = self.served_key();
        let now = Instant::now();
        let mut models = self.lock();
        let mut expired = Vec::new();
        for (key, entry) in models.iter_mut() {
            if entry.model.scheduler.busy() {
                entry.last_used = now;
                continue;
            }
            if let KeepAlive::For(after) = self.keep_alive(key, entry, &served) {
                if now >= entry.last_used + after {
                    expired.push(key.clone());
                }
            }
        }
        let gone: Vec<Entry> = expired.iter().filter_map(|k| models.remove(k)).collect();
        drop(models);
        for key in &expired {
            tracing::info!(model = key, "unloading an idle model (keep-alive ran out)");
        }
        retire(gone);
    }

    /// Evict idle models, least recently used first, until `card` fits in the budget (they
    /// are returned, to be dropped outside the lock). When it still does not fit it loads
    /// only beside the served model, never beside another model that is busy.
    fn make_room(&self, card: &ModelCard) -> Result<Vec<Entry>, ApiError> {
        let served = self.served_key();
        let mut models = self.lock();
        let mut evicted = Vec::new();
        loop {
            let used: u64 = models.values().map(|e| e.model.card.bytes).sum();
            if used + card.bytes <= self.memory_budget {
                return Ok(evicted);
            }
            let idle = models
                .iter()
                .filter(|(k, e)| **k != served && !e.model.scheduler.busy())
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(oldest) = idle else { break };
            tracing::info!(model = oldest, "evicting a model to make room");
            evicted.extend(models.remove(&oldest));
        }
        match models.keys().find(|k| **k != served) {
            None => Ok(evicted),
            Some(busy) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{} does not fit in memory beside {busy}, which is still generating; \
                     try again when it is done",
                    card.name
                ),
            )),
        }
    }

    /// What `card`'s files say, read once per file version (hashing takes a while).
    pub async fn facts(&self, card: &ModelCard) -> Result<Arc<ModelFacts>, ApiError> {
        let cached = || {
            let facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
            facts
                .get(&card.path)
                .filter(|e| (e.bytes, e.modified) == (card.bytes, card.created))
                .map(|e| e.facts.clone())
        };
        if let Some(facts) = cached() {
            return Ok(facts);
        }
        let _reading = self.reading_facts.lock().await;
        if let Some(facts) = cached() {
            return Ok(facts);
        }
        let read = card.clone();
        let digests = self.digests.clone();
        let facts = tokio::task::spawn_blocking(move || read_facts(&read, &digests))
            .await
            .map_err(ApiError::internal)??;
        let facts = Arc::new(facts);
        self.facts.lock().unwrap_or_else(|e| e.into_inner()).insert(
            card.path.clone(),
            FactsEntry {
                bytes: card.bytes,
                modified: card.created,
                facts: facts.clone(),
            },
        );
        Ok(facts)
    }

    /// Drop the model called `name` from memory, if loaded (requests it runs go on until
    /// they end).
    pub fn unload(&self, name: &str) {
        let unloaded = self.lock().remove(&key(name));
        retire(unloaded.into_iter().collect());
    }

    /// End every running and queued request (shutdown): their streams finish with an error,
    /// and no model is loaded any more.
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for model in self.loaded() {
            model.scheduler.stop();
        }
    }
}

/// Drop models taken out of the host on a blocking thread: the last reference joins the
/// engine thread, which may be finishing a step.
/// Drop `models` off the async workers (each scheduler's thread is joined), then give
/// their memory back to the system.
fn retire(models: Vec<Entry>) {
    if !models.is_empty() {
        tokio::task::spawn_blocking(move || {
            drop(models);
            seedbar_engine::runtime::release_memory();
        });
    }
}

fn load(
    card: ModelCard,
    draft: Option<PathBuf>,
    mut config: SchedulerConfig,
    digests: &Digests,
) -> Result<LoadedModel, ApiError> {
    let model = Model::load(&card.path).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot load {}: {e}", card.name),
        )
    })?;
    // A draft model that cannot load or draft for it leaves the model without one (said
    // in the log whatever its level: it was asked for).
    let drafter = draft.and_then(|path| {
        let drafter = Model::load(&path)
            .map_err(|e| e.to_string())
            .and_then(|draft| DraftModel::new(draft, &model));
        drafter
            .inspect_err(|e| tracing::error!(model = card.name, "no draft model: {e}"))
            .ok()
    });
    let provenance = Provenance::of(&card, digests).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read {}: {e}", card.path.display()),
        )
    })?;
    // KV kept on disk is the weights' own: files replaced in place (same name, size and
    // time) are other weights, another key.
    if let Some(tier) = config.disk_cache.as_mut() {
        tier.model = provenance.weights.clone();
    }
    let tokenizer = model.tokenizer.clone();
    let template = model.template.clone();
    let images = model.vision.as_ref().map(|v| v.prompt.clone());
    let model_config = model.config().clone();
    let eos_ids = model.eos_ids.clone();
    Ok(LoadedModel {
        eos_ids,
        vocabulary: OnceLock::new(),
        scheduler: Scheduler::start_drafting(model, drafter, config),
        card,
        tokenizer,
        template,
        images,
        config: model_config,
        provenance,
    })
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_reads_ollamas_forms() {
        let parse = |text: &str| text.parse::<KeepAlive>();
        let after = |seconds: f64| Ok(KeepAlive::For(Duration::from_secs_f64(seconds)));
        assert_eq!(parse("0"), after(0.0));
        assert_eq!(parse("300"), after(300.0));
        assert_eq!(parse("5m"), after(300.0));
        assert_eq!(parse("1h30m"), after(5400.0));
        assert_eq!(parse("1.5s"), after(1.5));
        assert_eq!(parse("250ms"), after(0.25));
        assert_eq!(parse("-1"), Ok(KeepAlive::Forever));
        assert_eq!(parse("-5m"), Ok(KeepAlive::Forever));
        for bad in ["", "soon", "5x", "m5", "-"] {
            assert!(parse(bad).unwrap_err().contains("not a duration"), "{bad}");
        }
    }
}

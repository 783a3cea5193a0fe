//! What every route shares: the server's configuration, the state behind it (the model
//! host, the embedding models, metrics, the conversations database, downloads, settings and
//! the default model's readiness) and how it opens.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use seedbar_chats::{AppSettings, ChatStore};
use seedbar_engine::store::{ModelKind, ModelStore, StoredModel, DEFAULT_MODEL};
use seedbar_scheduler::{DiskCache, SchedulerConfig};
use tokio::sync::watch;

use crate::{
    encoders::Encoders,
    error::ApiError,
    metrics::Metrics,
    model_host::{KeepAlive, ModelHost},
    pulls::{self, Pull, PullStatus},
    readiness::{BringUp, Readiness},
};

/// The default port: clear of Ollama (11434), LM Studio (1234), llama-server (8080),
/// Jan (1337), vLLM (8000) and the usual web dev ports.
pub const DEFAULT_PORT: u16 = 7337;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: IpAddr,
    pub port: u16,
    /// When set, every route but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Host header names accepted besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed by CORS besides the app's own window.
    pub allowed_origins: Vec<String>,
    pub max_body_bytes: usize,
    /// Whether image parts given by `http(s)` URLs are fetched whatever the settings say
    /// (off: as the settings say; see [`App::fetches_image_urls`]).
    pub fetch_image_urls: bool,
    /// The model `App::bring_up` looks for first (a store name or a path); empty: none in
    /// particular.
    pub model: String,
    /// A smaller model of the same vocabulary that drafts for `model` (speculative
    /// decoding; a store name or a path).
    pub draft_model: Option<String>,
    pub scheduler: SchedulerConfig,
    /// The built chat UI, served at `/` (static files need no API key).
    pub ui_dir: Option<PathBuf>,
    /// How long a model other than the served one stays loaded once idle (a request's
    /// `keep_alive` overrides it for its model).
    pub keep_alive: KeepAlive,
    /// Bytes of prompt KV kept on disk (in `kv-cache` in the data directory), overriding
    /// the saved setting until it is next changed; `Some(0)` turns the tier off.
    pub prompt_cache_disk_bytes: Option<u64>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: IpAddr::from([127, 0, 0, 1]),
            port: DEFAULT_PORT,
            api_key: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 32 << 20,
            fetch_image_urls: false,
            model: seedbar_engine::store::DEFAULT_MODEL.to_string(),
            draft_model: None,
            scheduler: SchedulerConfig::default(),
            ui_dir: None,
            keep_alive: KeepAlive::Forever,
            prompt_cache_disk_bytes: None,
        }
    }
}

impl ServerConfig {
    /// Binding beyond loopback exposes the models to the network: only with an API key.
    pub fn check(&self) -> Result<(), String> {
        if !self.host.is_loopback() && self.api_key.is_none() {
            return Err(format!(
                "binding to {} makes the server reachable from other machines; set an API key \
                 (--api-key or SEEDBAR_API_KEY) to do that",
                self.host
            ));
        }
        Ok(())
    }
}

/// The chat model called `name` (any case) among the installed ones, `chat`, spelled as
/// installed; a 400 naming `param` and listing them for none.
fn chat_model_among(chat: &[String], name: &str, param: &str) -> Result<String, ApiError> {
    chat.iter()
        .find(|m| m.eq_ignore_ascii_case(name))
        .cloned()
        .ok_or_else(|| ApiError {
            status: axum::http::StatusCode::BAD_REQUEST,
            param: Some(param.into()),
            ..ApiError::unknown_model(name, chat)
        })
}

/// How long idle models stay as the settings say, where they say (`None`: as the server
/// was started).
pub(crate) fn idle_keep_alive(settings: &AppSettings) -> Option<KeepAlive> {
    let minutes = u64::from(settings.unload_idle_minutes);
    (minutes > 0).then(|| KeepAlive::For(Duration::from_secs(60 * minutes)))
}

/// The prompt cache's disk tier's folder in the data directory.
pub const DISK_CACHE_DIR: &str = "kv-cache";

/// The prompt cache's disk tier in `dir` (reading its folder takes a moment); without it
/// where its folder cannot be used (said in the log), or where the budget is 0.
async fn open_disk_cache(dir: PathBuf, budget: u64) -> Option<Arc<DiskCache>> {
    let opened = tokio::task::spawn_blocking(move || {
        DiskCache::open(&dir, budget).map_err(|e| format!("{}: {e}", dir.display()))
    });
    match opened.await.unwrap_or_else(|e| Err(e.to_string())) {
        Ok(cache) => Some(Arc::new(cache)),
        Err(e) => {
            tracing::warn!(error = %e, "the prompt cache's disk tier is off");
            None
        }
    }
}

/// Shared state of every route.
pub struct App {
    pub config: ServerConfig,
    pub models: ModelHost,
    /// The embedding models, loaded on first use.
    pub(crate) encoders: Encoders,
    pub metrics: Arc<Metrics>,
    pub(crate) paused: AtomicBool,
    /// Conversations and app settings (`seedbar.db` in the data directory).
    pub(crate) chats: Arc<ChatStore>,
    pub(crate) pulls: pulls::Pulls,
    pub(crate) settings: watch::Sender<AppSettings>,
    /// The address the server listens on, once bound.
    pub(crate) endpoint: OnceLock<SocketAddr>,
    /// What the default model is doing (`readiness.rs`).
    pub(crate) readiness: watch::Sender<Readiness>,
    /// How the last bring-up looked for the default model (`retry_bring_up` repeats it).
    pub(crate) plan: Mutex<BringUp>,
}

/// What runs now, for the app's live status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Rows generating in the schedulers (one per running chat or choice).
    pub running: usize,
    /// Requests waiting for a row.
    pub queued: usize,
    /// Tokens generated since the server started.
    pub generated_tokens: u64,
    /// The loaded models' engine steps, tokens drafted by speculative decoding and drafts
    /// kept, since each was loaded.
    pub steps: u64,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// Of the drafted tokens, the draft models'.
    pub model_drafted_tokens: u64,
}

impl App {
    /// Check the configuration and open the conversations database, without a model: the
    /// `/app` API, the store and the library work at once; `bring_up` brings the model.
    pub async fn open(mut config: ServerConfig, store: ModelStore) -> anyhow::Result<Arc<App>> {
        config.check().map_err(anyhow::Error::msg)?;
        // `--model PATH`: served under its file or folder name, beside the store's models.
        let outside: Vec<StoredModel> = ModelStore::describe_path(Path::new(&config.model))
            .into_iter()
            .collect();
        if let Some(model) = outside.first() {
            config.model = model.name.clone();
        }
        let path = store.root().join(seedbar_chats::DATABASE_FILE);
        let chats = tokio::task::spawn_blocking(move || ChatStore::open(&path)).await??;
        let settings = match chats.app_settings()? {
            Some(saved) => saved,
            None => AppSettings {
                port: config.port,
                api_key: config.api_key.clone().unwrap_or_default(),
                allowed_origins: config.allowed_origins.clone(),
                show_in_dock: false,
                launch_at_login: false,
                quick_chat_shortcut: seedbar_chats::DEFAULT_QUICK_CHAT_SHORTCUT.to_string(),
                prompt_cache_disk_gb: seedbar_chats::DEFAULT_PROMPT_CACHE_DISK_GB,
                unload_idle_minutes: 0,
                default_model: String::new(),
                show_menu_bar_icon: true,
                start_minimized: false,
                welcomed: false,
                fetch_image_urls: config.fetch_image_urls,
                draft_models: Default::default(),
            },
        };
        let idle_keep_alive = idle_keep_alive(&settings).unwrap_or(config.keep_alive);
        let disk_budget = config
            .prompt_cache_disk_bytes
            .unwrap_or(u64::from(settings.prompt_cache_disk_gb) << 30);
        let disk_cache = open_disk_cache(store.root().join(DISK_CACHE_DIR), disk_budget).await;
        let wanted = Some(config.model.clone()).filter(|m| !m.is_empty());
        Ok(Arc::new(App {
            models: ModelHost::new(
                store,
                config.scheduler.clone(),
                &config.model,
                outside,
                idle_keep_alive,
                disk_cache,
            )
            .drafting_with(config.draft_model.clone(), settings.draft_models.clone()),
            encoders: Encoders::default(),
            metrics: Arc::new(Metrics::default()),
            paused: AtomicBool::new(false),
            chats: Arc::new(chats),
            pulls: pulls::Pulls::default(),
            settings: watch::Sender::new(settings),
            endpoint: OnceLock::new(),
            readiness: watch::Sender::new(Readiness::starting(wanted.as_deref())),
            plan: Mutex::new(BringUp {
                wanted,
                download: None,
            }),
            config,
        }))
    }

    /// The downloads of this server's lifetime (`GET /app/models/pulls`).
    pub fn downloads(&self) -> Vec<Pull> {
        self.pulls.list()
    }

    /// The rows generating and the tokens generated so far (what `/metrics` shows).
    pub fn activity(&self) -> Activity {
        let stats: Vec<_> = self
            .models
            .loaded()
            .iter()
            .map(|m| {
                let stats = m.scheduler.stats();
                [
                    stats.running.load(Ordering::SeqCst) as u64,
                    stats.queued.load(Ordering::SeqCst) as u64,
                    stats.steps.load(Ordering::Relaxed),
                    stats.drafted_tokens.load(Ordering::Relaxed),
                    stats.accepted_tokens.load(Ordering::Relaxed),
                    stats.model_drafted_tokens.load(Ordering::Relaxed),
                ]
            })
            .collect();
        let sum = |k: usize| stats.iter().map(|s| s[k]).sum::<u64>();
        Activity {
            running: sum(0) as usize,
            queued: sum(1) as usize,
            generated_tokens: self.metrics.generated_tokens.load(Ordering::Relaxed),
            steps: sum(2),
            drafted_tokens: sum(3),
            accepted_tokens: sum(4),
            model_drafted_tokens: sum(5),
        }
    }

    /// Pause or resume the API for outside clients (editors, SDKs): while paused they get
    /// 503; the app's own routes (`/app/*`) and `/health` keep working.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Whether image parts given by `http(s)` addresses are fetched: where the server was
    /// started to (`--fetch-image-urls`), or the settings say so now.
    pub fn fetches_image_urls(&self) -> bool {
        self.config.fetch_image_urls || self.settings.borrow().fetch_image_urls
    }

    /// The app's settings as last saved (before any save: the running configuration's).
    pub fn app_settings(&self) -> AppSettings {
        self.settings.borrow().clone()
    }

    /// Save `settings` and apply them: the disk cache's budget, idle models' keep-alive,
    /// the default model (checked to be an installed chat model first, 400 otherwise, and
    /// brought up in the background when it changed), and the shell's watchers.
    pub async fn save_settings(
        self: &Arc<Self>,
        mut settings: AppSettings,
    ) -> Result<AppSettings, ApiError> {
        let before = self.app_settings();
        let switch = !settings.default_model.is_empty()
            && !settings
                .default_model
                .eq_ignore_ascii_case(&before.default_model);
        if switch {
            settings.default_model = self.chat_model(&settings.default_model, "default_model")?;
        }
        settings.draft_models = self.draft_pairs(&settings.draft_models, &before.draft_models)?;
        let (chats, saved) = (self.chats.clone(), settings.clone());
        tokio::task::spawn_blocking(move || chats.set_app_settings(&saved))
            .await
            .map_err(ApiError::internal)?
            .map_err(ApiError::internal)?;
        if let Some(disk) = self.models.disk_cache() {
            disk.set_budget(u64::from(settings.prompt_cache_disk_gb) << 30);
        }
        let idle = idle_keep_alive(&settings).unwrap_or(self.config.keep_alive);
        self.models.set_idle_keep_alive(idle);
        // A model whose draft model changed loads again with it at its next request (what
        // it runs now goes on until it ends).
        for model in self.models.set_draft_models(&settings.draft_models) {
            self.models.unload(&model);
        }
        self.settings.send_replace(settings.clone());
        if switch {
            self.serve_default(&settings.default_model);
        }
        Ok(settings)
    }

    /// Make `name` (an installed chat model) the default model, now and at the next start.
    pub async fn set_default_model(self: &Arc<Self>, name: &str) -> Result<(), ApiError> {
        let settings = AppSettings {
            default_model: name.to_string(),
            ..self.app_settings()
        };
        self.save_settings(settings).await.map(drop)
    }

    /// The installed chat models Seedbar runs: what the default model can be.
    pub fn chat_models(&self) -> Result<Vec<String>, ApiError> {
        let installed = self.models.installed()?;
        Ok(installed
            .into_iter()
            .filter(|m| m.kind == ModelKind::Chat && m.supported)
            .map(|m| m.name)
            .collect())
    }

    /// The `count` most recently updated conversations: their ids and titles.
    pub fn recent_conversations(&self, count: usize) -> Vec<(i64, String)> {
        match self.chats.list("") {
            Ok(list) => list
                .into_iter()
                .take(count)
                .map(|c| (c.id, c.title))
                .collect(),
            Err(e) => {
                tracing::warn!("cannot list the conversations: {e}");
                Vec::new()
            }
        }
    }

    /// The installed chat model called `name`, spelled as installed; a 400 naming `param`
    /// for none.
    fn chat_model(&self, name: &str, param: &str) -> Result<String, ApiError> {
        chat_model_among(&self.chat_models()?, name, param)
    }

    /// Draft model pairs as settings keep them: a pair new since `saved` names two installed
    /// chat models (spelled as installed), a model not its own draft; a 400 naming the pair
    /// otherwise. Pairs kept from `saved` stay as they were (a model deleted since is left
    /// without its draft when it loads).
    fn draft_pairs(
        &self,
        pairs: &BTreeMap<String, String>,
        saved: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, ApiError> {
        // The installed chat models, listed once (and only where there is a pair to check).
        let changed = pairs
            .iter()
            .any(|(model, draft)| saved.get(model) != Some(draft));
        let chat = if changed {
            self.chat_models()?
        } else {
            Vec::new()
        };
        pairs
            .iter()
            .map(|(model, draft)| {
                if saved.get(model) == Some(draft) {
                    return Ok((model.clone(), draft.clone()));
                }
                let param = format!("draft_models.{model}");
                let (model, draft) = (
                    chat_model_among(&chat, model, &param)?,
                    chat_model_among(&chat, draft, &param)?,
                );
                if model == draft {
                    return Err(ApiError::bad_param(
                        &param,
                        format!(
                            "{model} cannot draft for itself: choose a smaller model of its family"
                        ),
                    ));
                }
                Ok((model, draft))
            })
            .collect()
    }

    /// Bring `name` up as the default model in the background, unless it already is.
    fn serve_default(self: &Arc<Self>, name: &str) {
        if self
            .readiness()
            .served_model()
            .is_some_and(|served| served.eq_ignore_ascii_case(name))
        {
            return;
        }
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner()).clone();
        plan.wanted = Some(name.to_string());
        self.set_readiness(Readiness::loading(name));
        let app = self.clone();
        tokio::spawn(async move { app.bring_up(plan).await });
    }

    /// Sees every change `PUT /app/settings` makes (the shell applies "show in dock" and
    /// "launch at login" from it).
    pub fn subscribe_settings(&self) -> watch::Receiver<AppSettings> {
        self.settings.subscribe()
    }

    /// Record the address `listen` bound (for `/app/status`); only the first call counts.
    pub fn set_endpoint(&self, address: SocketAddr) {
        let _ = self.endpoint.set(address);
    }

    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.endpoint.get().copied()
    }
}

/// How often a download's progress is read into the readiness.
const DOWNLOAD_POLL: Duration = Duration::from_millis(200);

/// The default model's bring-up: find it in the store (or download the default one), load
/// it, and keep the readiness (`readiness.rs`) saying what happens.
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

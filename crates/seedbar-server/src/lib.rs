//! Seedbar's local HTTP server: OpenAI- and Ollama-compatible endpoints over the scheduler,
//! the chat app's `/app` routes and its static UI, with health, metrics and the safety a
//! localhost server on a laptop needs. `serve` is the entry point `seedbar serve` and the
//! app share.

mod anthropic;
mod app_api;
mod common;
mod embeddings;
mod error;
mod extract;
mod generation;
mod metrics;
mod models;
mod ollama;
mod openai;
mod pulls;
mod readiness;
mod responses;
mod security;
mod sse;
mod structured;
mod ui;

use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use axum::{
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
    Json, Router,
};
use seedbar_chats::ChatStore;
use seedbar_engine::store::{ModelStore, StoredModel};
use seedbar_scheduler::SchedulerConfig;
use tokio::{net::TcpListener, sync::watch};

pub use error::ApiError;
pub use metrics::Metrics;
pub use models::ModelHost;
pub use pulls::{Pull, PullStatus};
pub use readiness::{BringUp, FixAction, ModelState, Readiness};
pub use seedbar_chats::AppSettings;

/// The default port: clear of Ollama (11434), LM Studio (1234), llama-server (8080),
/// Jan (1337), vLLM (8000) and the usual web dev ports.
pub const DEFAULT_PORT: u16 = 7337;

/// How long running streams may go on after a shutdown request before they are ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

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
    /// The model `App::bring_up` looks for first (a store name or a path); empty: none in
    /// particular.
    pub model: String,
    pub scheduler: SchedulerConfig,
    /// The built chat UI, served at `/` (static files need no API key).
    pub ui_dir: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: IpAddr::from([127, 0, 0, 1]),
            port: DEFAULT_PORT,
            api_key: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_body_bytes: 1 << 20,
            model: seedbar_engine::store::DEFAULT_MODEL.to_string(),
            scheduler: SchedulerConfig::default(),
            ui_dir: None,
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

/// Shared state of every route.
pub struct App {
    pub config: ServerConfig,
    pub models: ModelHost,
    /// The embedding models, loaded on first use.
    encoders: embeddings::Encoders,
    pub metrics: Arc<Metrics>,
    paused: AtomicBool,
    /// Conversations and app settings (`seedbar.db` in the data directory).
    chats: Arc<ChatStore>,
    pulls: pulls::Pulls,
    settings: watch::Sender<AppSettings>,
    /// The address the server listens on, once bound.
    endpoint: OnceLock<SocketAddr>,
    /// What the default model is doing (`readiness.rs`).
    readiness: watch::Sender<Readiness>,
    /// How the last bring-up looked for the default model (`retry_bring_up` repeats it).
    plan: Mutex<BringUp>,
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
}

/// All routes with their middleware.
pub fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{id}", get(openai::get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/pull", post(ollama::pull))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(embeddings::ollama_embed))
        .route("/api/embeddings", post(embeddings::ollama_embeddings))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        // Quick chat's one-off answers: `/v1/chat/completions` under `/app`, so the panel
        // answers while the API is paused for outside clients (as the chat window does).
        .route("/app/chat/completions", post(openai::chat_completions))
        .merge(app_api::routes())
        .fallback(ui::fallback);
    api.layer(DefaultBodyLimit::max(app.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            security::check_api_key,
        ))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            refuse_when_paused,
        ))
        .layer(middleware::from_fn_with_state(app.clone(), count_requests))
        .layer(security::cors())
        .layer(middleware::from_fn_with_state(
            app.clone(),
            security::check_origin,
        ))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            security::check_host,
        ))
        .with_state(app)
}

#[derive(serde::Serialize)]
struct Health {
    status: &'static str,
    version: &'static str,
    models: Vec<String>,
}

async fn health(State(app): State<Arc<App>>) -> Json<Health> {
    let models = app
        .models
        .loaded()
        .iter()
        .map(|m| m.card.name.clone())
        .collect();
    Json(Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
        models,
    })
}

async fn metrics(State(app): State<Arc<App>>) -> String {
    let activity = app.activity();
    let gauges = metrics::Gauges {
        running_rows: activity.running,
        queued_requests: activity.queued,
        loaded_models: app.models.loaded().len(),
    };
    app.metrics.render(&gauges)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", request.method(), request.uri().path()),
    )
}

async fn refuse_when_paused(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let exempt = path == "/health" || path.starts_with("/app/") || ui::serves(&request);
    if app.is_paused() && !exempt {
        return axum::response::IntoResponse::into_response(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the Seedbar server is paused; resume it from the menu bar",
        ));
    }
    next.run(request).await
}

async fn count_requests(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let response = next.run(request).await;
    app.metrics
        .count_request(&route, response.status().as_u16());
    response
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
            },
        };
        let wanted = Some(config.model.clone()).filter(|m| !m.is_empty());
        Ok(Arc::new(App {
            models: ModelHost::new(store, config.scheduler.clone(), &config.model, outside),
            encoders: embeddings::Encoders::default(),
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
                (
                    stats.running.load(Ordering::SeqCst),
                    stats.queued.load(Ordering::SeqCst),
                )
            })
            .collect();
        Activity {
            running: stats.iter().map(|s| s.0).sum(),
            queued: stats.iter().map(|s| s.1).sum(),
            generated_tokens: self.metrics.generated_tokens.load(Ordering::Relaxed),
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

    /// The app's settings as last saved (before any save: the running configuration's).
    pub fn app_settings(&self) -> AppSettings {
        self.settings.borrow().clone()
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

/// Bind the configured address (port 0 picks a free port; see `local_addr`).
pub async fn listen(app: &App) -> anyhow::Result<TcpListener> {
    let address = SocketAddr::new(app.config.host, app.config.port);
    TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))
}

/// Serve until `shutdown` resolves; then new connections stop, running streams get a
/// short grace period, and whatever still runs is ended.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = app.clone();
    let stop = async move {
        shutdown.await;
        tracing::info!("shutting down");
        tokio::spawn(async move {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
            stopping.models.stop_all();
        });
    };
    axum::serve(listener, router(app))
        .with_graceful_shutdown(stop)
        .await
}

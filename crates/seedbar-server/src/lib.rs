//! Seedbar's local HTTP server: OpenAI- and Ollama-compatible endpoints over the scheduler,
//! the chat app's `/app` routes and its static UI, with health, metrics and the safety a
//! localhost server on a laptop needs. `serve` is the entry point `seedbar serve` and the
//! app share.

mod anthropic;
mod app_api;
mod catalogue;
mod common;
mod embeddings;
mod encoders;
mod error;
mod extract;
mod generation;
mod images;
mod memory;
mod metrics;
mod model_host;
mod ollama;
mod openai;
mod pulls;
mod readiness;
mod receipt;
mod rerank;
mod responses;
mod security;
mod sse;
mod state;
mod structured;
mod ui;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
    Json, Router,
};
use tokio::net::TcpListener;

pub use error::ApiError;
pub use metrics::Metrics;
pub use model_host::{KeepAlive, ModelHost};
pub use pulls::{Pull, PullStatus};
pub use readiness::{BringUp, FixAction, ModelState, Readiness};
pub use seedbar_chats::AppSettings;
pub use state::{Activity, App, ServerConfig, DEFAULT_PORT};

/// How long running streams may go on after a shutdown request before they are ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// All routes with their middleware.
pub fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{id}", get(openai::get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        .route("/rerank", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
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
        engine_steps: activity.steps,
        drafted_tokens: activity.drafted_tokens,
        accepted_tokens: activity.accepted_tokens,
        model_drafted_tokens: activity.model_drafted_tokens,
        disk_cache: app.models.disk_cache().map(|disk| disk.stats().into()),
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

/// Bind the configured address (port 0 picks a free port; see `local_addr`).
pub async fn listen(app: &App) -> anyhow::Result<TcpListener> {
    let address = SocketAddr::new(app.config.host, app.config.port);
    TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))
}

/// Serve until `shutdown` resolves (unloading models whose keep-alive runs out meanwhile);
/// then new connections stop, running streams get a short grace period, and whatever still
/// runs is ended.
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
    let keeping = app.clone();
    let disk_cache = app.models.disk_cache().cloned();
    let unloads = tokio::spawn(async move {
        loop {
            tokio::time::sleep(KEEP_ALIVE_TICK).await;
            keeping.models.unload_expired();
        }
    });
    let served = axum::serve(listener, router(app))
        .with_graceful_shutdown(stop)
        .await;
    unloads.abort();
    // What finished before the shutdown reaches the disk tier before the process ends.
    if let Some(disk) = disk_cache {
        let _ = tokio::task::spawn_blocking(move || disk.flush()).await;
    }
    served
}

/// How often models whose keep-alive ran out are unloaded.
const KEEP_ALIVE_TICK: std::time::Duration = std::time::Duration::from_millis(250);

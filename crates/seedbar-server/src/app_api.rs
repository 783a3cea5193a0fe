//! The chat app's routes under `/app` (docs/app-api.md): conversations stored in the
//! `ChatStore` with their replies streamed as server-sent events, the model library
//! (installed models, deletion, downloads with progress), the app's settings and status,
//! and the OpenAI chat completion for the app's own quick-chat panel.
//! Handlers stay thin: the store, `ModelHost`, `Pulls` and the generation service do the
//! work; a reply's events are [`ReplyEvent`]s, translated from the service's neutral ones.

use std::{collections::HashMap, sync::Arc};

use axum::{
    extract::{
        rejection::{PathRejection, QueryRejection},
        Path, Query, State,
    },
    http::{header, HeaderValue, StatusCode},
    response::Response,
    routing::{delete, get, post},
    Json, Router,
};
use seedbar_chats::{
    export::ExportedImage, AppSettings, Conversation, Image, Message, NewMessage, Role, Settings,
    SettingsPatch, Status, Turn,
};
use seedbar_engine::{ChatMessage, ContentPart, EngineError, SamplingParams};
use seedbar_scheduler::draw_seed;
use serde::{Deserialize, Serialize};

use crate::{
    error::ApiError,
    extract::ApiJson,
    generation::{self, spawn_body, Generation, Job, Prompt, ServedModel},
    images::{self, InImage},
    model_host::{Capabilities, ModelCard},
    pulls::Pull,
    receipt::with_receipt,
    sse::sse,
    App, Readiness,
};
use db::db;

/// Seeds stay below 2^53 so that JavaScript numbers hold them exactly.
const MAX_SEED: u64 = 1 << 53;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(
            "/app/conversations",
            get(list_conversations).post(create_conversation),
        )
        .route(
            "/app/conversations/{id}",
            get(get_conversation)
                .patch(update_conversation)
                .delete(delete_conversation),
        )
        .route("/app/conversations/{id}/reply", post(reply))
        .route("/app/conversations/{id}/export", get(export_conversation))
        .route("/app/images/{id}", get(image))
        .route("/app/conversations/import", post(replay::import))
        .route("/app/conversations/{id}/replay", post(replay::replay))
        .route("/app/models", get(list_models))
        .route("/app/catalogue", get(crate::catalogue::catalogue))
        .route("/app/remotes", get(remotes::list).post(remotes::add))
        .route("/app/remotes/{name}", delete(remotes::remove))
        .route("/app/models/{name}", delete(delete_model))
        .route("/app/models/pull", post(pull_model))
        .route("/app/models/import", post(import_model))
        .route("/app/models/pulls", get(list_pulls))
        .route("/app/models/pulls/{org}/{name}", delete(cancel_pull))
        .route("/app/settings", get(get_settings).put(put_settings))
        .route("/app/status", get(status))
        .route("/app/status/retry", post(retry))
}

/// A numeric id from the path, or a JSON 400.
fn path_id(path: Result<Path<i64>, PathRejection>) -> Result<i64, ApiError> {
    path_param(path, "id", "not a conversation id")
}

/// A path parameter, or a JSON 400 naming it.
fn path_param<T>(
    path: Result<Path<T>, PathRejection>,
    param: &str,
    what: &str,
) -> Result<T, ApiError> {
    path.map(|Path(value)| value)
        .map_err(|e| ApiError::bad_param(param, format!("{what}: {e}")))
}

// ---- Conversations ---------------------------------------------------------------------

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    q: String,
}

async fn list_conversations(
    State(app): State<Arc<App>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<Conversation>>, ApiError> {
    let Query(ListQuery { q }) = query.map_err(|e| ApiError::bad_param("q", e.body_text()))?;
    Ok(Json(db(&app, move |s| s.list(q.trim())).await?))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConversationBody {
    title: Option<String>,
    #[serde(default)]
    settings: SettingsPatch,
}

/// A conversation's title as given (trimmed), refused when blank.
fn checked_title(title: Option<&str>) -> Result<Option<String>, ApiError> {
    match title.map(str::trim) {
        Some("") => Err(ApiError::bad_param("title", "the title must not be empty")),
        title => Ok(title.map(str::to_string)),
    }
}

/// `POST /app/conversations`: a conversation's title and settings, and the messages it
/// starts with (quick chat's question and answer), if any.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewConversationBody {
    title: Option<String>,
    #[serde(default)]
    settings: SettingsPatch,
    #[serde(default)]
    messages: Vec<StartingMessage>,
}

/// A message a new conversation starts with: a user's, or a complete answer (with the
/// seed it was sampled with, under the conversation's settings).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartingMessage {
    role: Role,
    content: String,
    #[serde(default)]
    seed: Option<u64>,
    /// A user's images, as data URLs (quick chat's question about a picture).
    #[serde(default)]
    images: Vec<String>,
}

impl StartingMessage {
    fn stored(self, i: usize, settings: &Settings) -> Result<NewMessage, ApiError> {
        let param = |field: &str| format!("messages[{i}].{field}");
        let images = self
            .images
            .iter()
            .enumerate()
            .map(|(k, url)| Ok(images::kept(url, &param(&format!("images[{k}]")))?.1))
            .collect::<Result<Vec<_>, ApiError>>()?;
        if !images.is_empty() && self.role != Role::User {
            return Err(ApiError::bad_param(
                &param("images"),
                "only a user's message holds images",
            ));
        }
        match (self.role, self.seed) {
            (Role::User, Some(_)) => Err(ApiError::bad_param(
                &param("seed"),
                "only an answer has a seed",
            )),
            (_, Some(seed)) if seed >= MAX_SEED => Err(ApiError::bad_param(
                &param("seed"),
                "the seed must be below 2^53",
            )),
            (Role::User, None) => Ok(NewMessage {
                images,
                ..NewMessage::user(self.content)
            }),
            (Role::Assistant, seed) => Ok(NewMessage {
                role: Role::Assistant,
                content: self.content,
                status: Status::Complete,
                seed,
                sampling: seed.map(|_| settings.sampling()),
                ..NewMessage::user("")
            }),
        }
    }
}

async fn create_conversation(
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<NewConversationBody>,
) -> Result<Json<Conversation>, ApiError> {
    let title = checked_title(body.title.as_deref())?.unwrap_or_else(|| "New chat".to_string());
    // Without a model (yet) the conversation runs on whichever becomes the default ("").
    let default = app
        .readiness()
        .served_model()
        .unwrap_or_default()
        .to_string();
    let settings = Settings::for_model(&default).patched(&body.settings);
    check_settings(&app, &settings, !settings.model.is_empty())?;
    let messages = body
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.stored(i, &settings))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(
        db(&app, move |s| s.create_with(&title, &settings, &messages)).await?,
    ))
}

#[derive(Serialize)]
struct ConversationWithMessages {
    #[serde(flatten)]
    conversation: Conversation,
    messages: Vec<Message>,
}

async fn get_conversation(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<ConversationWithMessages>, ApiError> {
    let id = path_id(id)?;
    let (conversation, messages) = db(&app, move |s| Ok((s.get(id)?, s.messages(id)?))).await?;
    Ok(Json(ConversationWithMessages {
        conversation,
        messages,
    }))
}

/// `?format=`: `markdown` (the default) or `json`.
#[derive(Debug, Default, Deserialize)]
struct ExportQuery {
    #[serde(default)]
    format: ExportFormat,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ExportFormat {
    #[default]
    Markdown,
    Json,
}

/// An image a user sent, as it was sent (the chat window shows it from here).
async fn image(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let image = db(&app, move |s| s.image(id)).await?;
    Response::builder()
        .header(header::CONTENT_TYPE, image.media_type)
        // An image id never names other bytes.
        .header(
            header::CACHE_CONTROL,
            "private, max-age=31536000, immutable",
        )
        .body(image.data.into())
        .map_err(ApiError::internal)
}

/// A conversation as a download: Markdown to read, or JSON with every reply's seed and
/// sampling (`seedbar_chats::export`).
async fn export_conversation(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
    query: Result<Query<ExportQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let Query(query) = query.map_err(|e| ApiError::bad_param("format", e.body_text()))?;
    let (conversation, messages) = db(&app, move |s| Ok((s.get(id)?, s.messages(id)?))).await?;
    let images: Vec<ExportedImage> = stored_images(&app, &messages)
        .await?
        .iter()
        .map(|(&id, image)| ExportedImage::new(id, image))
        .collect();
    let (body, content_type, extension) = match query.format {
        ExportFormat::Markdown => (
            seedbar_chats::export::markdown(&conversation, &messages, &images),
            "text/markdown; charset=utf-8",
            "md",
        ),
        ExportFormat::Json => (
            serde_json::to_string_pretty(&seedbar_chats::export::Export::new(
                &conversation,
                &messages,
                &images,
            ))
            .map_err(ApiError::internal)?,
            "application/json",
            "json",
        ),
    };
    let name: String = conversation
        .title
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let name = name.trim_matches('-');
    let name = if name.is_empty() {
        "conversation"
    } else {
        name
    };
    Response::builder()
        .header(axum::http::header::CONTENT_TYPE, content_type)
        .header(
            axum::http::header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{name}.{extension}\""),
        )
        .body(body.into())
        .map_err(ApiError::internal)
}

async fn update_conversation(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
    ApiJson(body): ApiJson<ConversationBody>,
) -> Result<Json<Conversation>, ApiError> {
    let id = path_id(id)?;
    let title = checked_title(body.title.as_deref())?;
    let current = db(&app, move |s| s.get(id)).await?;
    let settings = current.settings.patched(&body.settings);
    // A conversation whose model was since deleted can still be renamed or re-pinned; the
    // model is checked when it changes (and again when a reply runs).
    check_settings(&app, &settings, body.settings.model.is_some())?;
    let title = title.unwrap_or(current.title);
    Ok(Json(
        db(&app, move |s| s.update(id, &title, &settings)).await?,
    ))
}

async fn delete_conversation(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = path_id(id)?;
    db(&app, move |s| s.delete(id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The scheduler's settings for a reply under `settings` with `seed`.
fn generation_settings(settings: &Settings, seed: u64) -> generation::Settings {
    generation::Settings {
        sampling: SamplingParams {
            temperature: settings.temperature as f32,
            top_p: settings.top_p as f32,
            ..SamplingParams::default()
        },
        seed: Some(seed),
        max_tokens: Some(settings.max_tokens as usize),
        ..generation::Settings::default()
    }
}

/// Settings a reply can run with: sampling in range, a seed JavaScript can hold, and (with
/// `check_model`) an installed model.
fn check_settings(app: &App, settings: &Settings, check_model: bool) -> Result<(), ApiError> {
    generation_settings(settings, 0).validate("settings.")?;
    if settings.seed.is_some_and(|s| s >= MAX_SEED) {
        return Err(ApiError::bad_param(
            "settings.seed",
            "the seed must be below 2^53 (9007199254740992)",
        ));
    }
    if !check_model {
        return Ok(());
    }
    let installed = app.models.installed()?;
    let remote = app.models.remotes().get(&settings.model).is_some();
    if !remote
        && !installed
            .iter()
            .any(|m| m.name.eq_ignore_ascii_case(&settings.model))
    {
        let names: Vec<String> = installed.into_iter().map(|m| m.name).collect();
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            param: Some("settings.model".into()),
            ..ApiError::unknown_model(&settings.model, &names)
        });
    }
    Ok(())
}

// ---- Replies ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyBody {
    content: Option<String>,
    /// Images sent with `content`, as data URLs, shown before its text.
    #[serde(default)]
    images: Vec<String>,
    #[serde(default)]
    regenerate: bool,
    edit: Option<Edit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Edit {
    message_id: i64,
    content: String,
}

async fn reply(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
    ApiJson(body): ApiJson<ReplyBody>,
) -> Result<Response, ApiError> {
    let id = path_id(id)?;
    let conversation = db(&app, move |s| s.get(id)).await?;
    let messages = db(&app, move |s| s.messages(id)).await?;
    let stored = stored_images(&app, &messages).await?;
    let (history, images, turn) = turn(body, &messages, &stored)?;
    let settings = conversation.settings;

    // Everything that can refuse the request runs before anything is stored.
    // The default model, once chosen: while it loads, the reply waits for it.
    let readiness = app.readiness();
    let name = match (settings.model.as_str(), readiness.served_model()) {
        ("", Some(default)) => default.to_string(),
        ("", None) => return Err(readiness.unavailable()),
        (name, _) => name.to_string(),
    };
    let model = ServedModel::find(&app, &name).await?;
    let seed = settings.seed.unwrap_or_else(draw_seed);
    let sampling = generation_settings(&settings, seed);
    sampling.validate("settings.")?;
    let prompt = reply_prompt(&settings.system_prompt, history, images);
    let ran_on = model.name().to_string();
    let generation =
        Generation::start(&app, model, Job::new(vec![prompt], sampling, "reply-")).await?;

    // The turn and the streaming reply row in one transaction, refused (409) while another
    // reply streams into this conversation.
    // The reply records the model it ran on (the default one for a conversation without),
    // and the rest of its receipt.
    let receipt = generation.receipt();
    let row = NewMessage::reply(
        seed,
        seedbar_chats::Sampling {
            model: ran_on,
            ..settings.sampling()
        },
        serde_json::to_value(&receipt.provenance).map_err(ApiError::internal)?,
    );
    let (user, reply) = db(&app, move |s| s.begin_reply(id, &turn, &row)).await?;
    let body = spawn_body(move |tx| reply_stream::stream_reply(app, generation, user, reply, tx));
    Ok(with_receipt(&receipt, sse(body)))
}

/// The images `messages` hold, read from the store.
async fn stored_images(app: &App, messages: &[Message]) -> Result<HashMap<i64, Image>, ApiError> {
    let ids: Vec<i64> = messages.iter().flat_map(|m| m.images.clone()).collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    db(app, move |s| {
        ids.iter().map(|&id| Ok((id, s.image(id)?))).collect()
    })
    .await
}

/// Stored messages as the chat a reply answers (a user's images before its text) and the
/// images in it, in order: replies that were cut off before any text add nothing to it (a
/// user's pictures without text do).
fn chat_history(
    messages: &[Message],
    stored: &HashMap<i64, Image>,
) -> Result<(Vec<ChatMessage>, Vec<InImage>), ApiError> {
    let mut images = Vec::new();
    let mut chat = Vec::new();
    for m in messages
        .iter()
        .filter(|m| !m.content.is_empty() || !m.images.is_empty())
    {
        let mut parts = vec![ContentPart::Image; m.images.len()];
        parts.push(ContentPart::Text {
            text: m.content.clone(),
        });
        chat.push(ChatMessage::from_parts(m.role.as_str(), parts, ""));
        images.extend(decoded(&m.images, stored)?);
    }
    Ok((chat, images))
}

/// The stored images `ids`, decoded.
fn decoded(ids: &[i64], stored: &HashMap<i64, Image>) -> Result<Vec<InImage>, ApiError> {
    ids.iter()
        .map(|id| {
            let image = stored
                .get(id)
                .ok_or_else(|| ApiError::internal(format!("image {id} was not read")))?;
            InImage::decode(&image.data, Some(&image.media_type), "messages")
        })
        .collect()
}

/// A reply's prompt: the system prompt, if any, then the chat and its images.
fn reply_prompt(system_prompt: &str, history: Vec<ChatMessage>, images: Vec<InImage>) -> Prompt {
    let messages = (!system_prompt.is_empty())
        .then(|| ChatMessage::new("system", system_prompt))
        .into_iter()
        .chain(history)
        .collect();
    Prompt::Chat {
        messages,
        tools: None,
        images,
    }
}

/// The chat a reply answers (and its images) and what to store for it, from the request and
/// the messages.
fn turn(
    body: ReplyBody,
    messages: &[Message],
    stored: &HashMap<i64, Image>,
) -> Result<(Vec<ChatMessage>, Vec<InImage>, Turn), ApiError> {
    if !body.images.is_empty() && body.content.is_none() {
        return Err(ApiError::bad_param("images", "images go with `content`"));
    }
    let (new_images, to_store): (Vec<InImage>, Vec<Image>) = body
        .images
        .iter()
        .enumerate()
        .map(|(k, url)| images::kept(url, &format!("images[{k}]")))
        .collect::<Result<Vec<_>, ApiError>>()?
        .into_iter()
        .unzip();
    images::check_count(&new_images)?;
    let turn = match (body.content, body.regenerate, body.edit) {
        (Some(content), false, None) => Turn::Send {
            content,
            images: to_store,
        },
        (None, true, None) => {
            let last_user = messages
                .iter()
                .rposition(|m| m.role == Role::User)
                .ok_or_else(|| {
                    ApiError::bad_param("regenerate", "there is no message to reply to yet")
                })?;
            Turn::Regenerate {
                after: messages[last_user].id,
            }
        }
        (
            None,
            false,
            Some(Edit {
                message_id,
                content,
            }),
        ) => Turn::Edit {
            message_id,
            content,
        },
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "send exactly one of `content`, `regenerate: true` or `edit`",
            ))
        }
    };
    let (kept, new_text, param) = match &turn {
        Turn::Send { content, .. } => (messages, Some(content), "content"),
        Turn::Edit {
            message_id,
            content,
        } => {
            let at = messages
                .iter()
                .position(|m| m.id == *message_id && m.role == Role::User)
                .ok_or_else(|| {
                    ApiError::bad_param(
                        "edit.message_id",
                        format!("message {message_id} is not a user message of this conversation"),
                    )
                })?;
            (&messages[..at], Some(content), "edit.content")
        }
        Turn::Regenerate { after } => {
            let end = messages
                .iter()
                .position(|m| m.id == *after)
                .map_or(0, |i| i + 1);
            (&messages[..end], None, "")
        }
    };
    // A message of images alone says something; an empty one does not.
    if new_text.is_some_and(|text| text.trim().is_empty()) && new_images.is_empty() {
        return Err(ApiError::bad_param(param, "the message is empty"));
    }
    let (mut history, mut images) = chat_history(kept, stored)?;
    if let Some(text) = new_text {
        // The message's images: those sent with it, or an edited message's own.
        let own = match &turn {
            Turn::Edit { message_id, .. } => {
                let ids = messages.iter().find(|m| m.id == *message_id);
                decoded(ids.map_or(&[][..], |m| &m.images), stored)?
            }
            _ => new_images,
        };
        let mut parts = vec![ContentPart::Image; own.len()];
        parts.push(ContentPart::Text { text: text.clone() });
        history.push(ChatMessage::from_parts("user", parts, ""));
        images.extend(own);
    }
    Ok((history, images, turn))
}

// ---- Models ----------------------------------------------------------------------------

#[derive(Serialize)]
struct ModelInfo {
    name: String,
    format: &'static str,
    bytes: u64,
    quantization: Option<String>,
    /// GGUF's `general.architecture` or `config.json`'s `model_type`.
    architecture: Option<String>,
    /// Whether Seedbar runs that architecture.
    supported: bool,
    loaded: bool,
    /// Memory it takes to load (its files and a fifth more).
    memory_needed: u64,
    /// Whether that much is free now (idle models unloaded); a load would be refused if not.
    fits: bool,
    /// What it does: `completion`, `tools`, `thinking`, `vision`, `embedding`, `rerank`.
    capabilities: Capabilities,
}

impl ModelInfo {
    fn new(app: &App, card: ModelCard, loaded: bool) -> Self {
        ModelInfo {
            memory_needed: crate::memory::needed(card.bytes),
            fits: app.models.shortfall(&card).is_none(),
            capabilities: app.models.capabilities(&card),
            loaded,
            supported: card.supported,
            name: card.name,
            format: card.format,
            bytes: card.bytes,
            quantization: card.quantization,
            architecture: card.architecture,
        }
    }
}

async fn list_models(State(app): State<Arc<App>>) -> Result<Json<Vec<ModelInfo>>, ApiError> {
    let loaded: Vec<String> = app
        .models
        .loaded()
        .iter()
        .map(|m| m.card.name.to_lowercase())
        .collect();
    let models = app.models.installed()?;
    // Capabilities read a file's header the first time.
    let described = tokio::task::spawn_blocking(move || {
        models
            .into_iter()
            .map(|m| {
                let is_loaded = loaded.contains(&m.name.to_lowercase());
                ModelInfo::new(&app, m, is_loaded)
            })
            .collect()
    });
    Ok(Json(described.await.map_err(ApiError::internal)?))
}

async fn delete_model(
    State(app): State<Arc<App>>,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_param(name, "name", "not a model name")?;
    let installed = app.models.installed()?;
    let Some(model) = installed
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(&name))
    else {
        let names: Vec<String> = installed.iter().map(|m| m.name.clone()).collect();
        return Err(ApiError::unknown_model(&name, &names));
    };
    let readiness = app.readiness();
    if readiness
        .served_model()
        .is_some_and(|served| model.name.eq_ignore_ascii_case(served))
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "{} is the model this server serves; serve another one \
                 (`seedbar serve --model NAME`) before deleting it",
                model.name
            ),
        ));
    }
    let name = model.name.clone();
    app.models.unload(&name);
    let host = app.clone();
    tokio::task::spawn_blocking(move || host.models.store().remove(&name))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PullBody {
    repo: String,
}

async fn pull_model(
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<PullBody>,
) -> Result<(StatusCode, Json<Pull>), ApiError> {
    let repo = body.repo.trim();
    seedbar_engine::store::check_pull_id(repo)
        .map(drop)
        .map_err(|e| ApiError::bad_param("repo", e.to_string()))?;
    let root = app.models.store().root().to_path_buf();
    Ok((StatusCode::ACCEPTED, Json(app.pulls.start(root, repo)?)))
}

async fn list_pulls(State(app): State<Arc<App>>) -> Json<Vec<Pull>> {
    Json(app.pulls.list())
}

async fn cancel_pull(
    State(app): State<Arc<App>>,
    repo: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Pull>, ApiError> {
    let (org, name) = path_param(repo, "repo", "not a repository id")?;
    let repo = format!("{org}/{name}");
    app.pulls
        .cancel(&repo)
        .await
        .map(Json)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no download of {repo}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportBody {
    /// A `.gguf` file or a model folder on this computer.
    path: String,
    /// The library name (default: the file or folder name).
    name: Option<String>,
}

/// Add a model on disk to the library (`ModelStore::import`: linked, not copied); with no
/// model ready yet it becomes the default one and loads.
async fn import_model(
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<ImportBody>,
) -> Result<Json<ModelInfo>, ApiError> {
    let path = std::path::PathBuf::from(body.path.trim());
    if !path.is_absolute() {
        return Err(ApiError::bad_param(
            "path",
            format!("'{}' is not an absolute path", path.display()),
        ));
    }
    let host = app.clone();
    let name = body.name.filter(|n| !n.trim().is_empty());
    let model =
        tokio::task::spawn_blocking(move || host.models.store().import(&path, name.as_deref()))
            .await
            .map_err(ApiError::internal)?
            .map_err(|e| match e {
                EngineError::NameTaken(_) => ApiError {
                    param: Some("name".into()),
                    code: Some("name_taken"),
                    ..ApiError::new(StatusCode::CONFLICT, e.to_string())
                },
                EngineError::Io { .. } => ApiError::internal(e),
                e => ApiError::bad_param("path", e.to_string()),
            })?;
    tracing::info!(model = model.name, path = %model.path.display(), "imported");
    app.retry_bring_up(Some(&model.name));
    let card = app.models.card(&model.name)?;
    Ok(Json(ModelInfo::new(&app, card, false)))
}

// ---- App -------------------------------------------------------------------------------

async fn get_settings(State(app): State<Arc<App>>) -> Json<AppSettings> {
    Json(app.app_settings())
}

async fn put_settings(
    State(app): State<Arc<App>>,
    ApiJson(settings): ApiJson<AppSettings>,
) -> Result<Json<AppSettings>, ApiError> {
    for origin in &settings.allowed_origins {
        if !origin.contains("://") || HeaderValue::from_str(origin).is_err() {
            return Err(ApiError::bad_param(
                "allowed_origins",
                format!("'{origin}' is not an origin like http://localhost:5173"),
            ));
        }
    }
    Ok(Json(app.save_settings(settings).await?))
}

/// `/app/status`: the default model's readiness (state, problem, fix), where the API
/// listens, and whether it is paused.
#[derive(Serialize)]
struct ServerStatus {
    #[serde(flatten)]
    readiness: Readiness,
    endpoint: Option<String>,
    paused: bool,
    message: Option<&'static str>,
}

fn server_status(app: &App) -> ServerStatus {
    let paused = app.is_paused();
    ServerStatus {
        readiness: app.readiness(),
        endpoint: app.endpoint().map(|address| format!("http://{address}/v1")),
        paused,
        message: paused.then_some(
            "paused for outside clients (the app's own routes keep working); resume from the \
             menu bar",
        ),
    }
}

async fn status(State(app): State<Arc<App>>) -> Json<ServerStatus> {
    Json(server_status(&app))
}

/// Look for a model again (and download the default one when the store is empty); 409
/// while one is ready or on its way.
async fn retry(State(app): State<Arc<App>>) -> Result<(StatusCode, Json<ServerStatus>), ApiError> {
    if !app.retry_bring_up(None) {
        return Err(ApiError {
            code: Some("model_on_its_way"),
            ..ApiError::new(
                StatusCode::CONFLICT,
                "a model is already ready, loading or downloading",
            )
        });
    }
    Ok((StatusCode::ACCEPTED, Json(server_status(&app))))
}

mod db;
mod remotes;
mod replay;
mod reply_stream;
#[cfg(test)]
mod tests;

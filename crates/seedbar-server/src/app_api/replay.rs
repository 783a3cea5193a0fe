//! Conversations from elsewhere, and whether they reproduce here. `POST
//! /app/conversations/import` stores a JSON export (`seedbar.conversation` version 1) as a new
//! conversation, each reply with its seed, sampling, thinking and receipt. `POST
//! /app/conversations/{id}/replay` regenerates every seeded reply from its own history, seed
//! and settings, says whether it came out the same, and where the reply's receipt differs from
//! this machine's (another backend class, other weights, another engine build).

use std::sync::Arc;

use axum::{
    extract::{rejection::PathRejection, Path, State},
    Json,
};
use seedbar_chats::{
    export, Conversation, Image, Message, NewMessage, Role, Sampling, Settings, Status,
};
use serde::{Deserialize, Serialize};

use super::{
    chat_history, db, generation_settings, path_id, reply_prompt, stored_images, MAX_SEED,
};
use crate::{
    error::ApiError,
    extract::ApiJson,
    generation::{Generation, Job, ServedModel},
    images,
    receipt::Provenance,
    App,
};

/// A JSON export, as `GET /app/conversations/{id}/export?format=json` writes it (fields this
/// import does not need, such as ids and times, are ignored).
#[derive(Deserialize)]
pub(super) struct ImportBody {
    format: String,
    version: u32,
    conversation: ImportedConversation,
    messages: Vec<ImportedMessage>,
    /// The images the messages name, as data URLs.
    #[serde(default)]
    images: Vec<ImportedImage>,
}

#[derive(Deserialize)]
struct ImportedImage {
    id: i64,
    url: String,
}

#[derive(Deserialize)]
struct ImportedConversation {
    title: String,
    settings: Settings,
}

#[derive(Deserialize)]
struct ImportedMessage {
    role: Role,
    content: String,
    seed: Option<u64>,
    sampling: Option<Sampling>,
    status: Status,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    reasoning_ms: Option<u64>,
    #[serde(default)]
    provenance: Option<serde_json::Value>,
    #[serde(default)]
    images: Vec<i64>,
}

pub(super) async fn import(
    State(app): State<Arc<App>>,
    ApiJson(body): ApiJson<ImportBody>,
) -> Result<Json<Conversation>, ApiError> {
    if body.format != export::FORMAT || body.version != export::VERSION {
        return Err(ApiError::bad_param(
            "format",
            format!(
                "this is {} version {}; Seedbar imports {} version {}",
                body.format,
                body.version,
                export::FORMAT,
                export::VERSION
            ),
        ));
    }
    let seeds = body.messages.iter().filter_map(|m| m.seed);
    if seeds
        .chain(body.conversation.settings.seed)
        .any(|s| s >= MAX_SEED)
    {
        return Err(ApiError::bad_param("seed", "a seed must be below 2^53"));
    }
    let image = |id: &i64| -> Result<Image, ApiError> {
        let param = format!("images[{id}]");
        let url = body
            .images
            .iter()
            .find(|image| image.id == *id)
            .map(|image| image.url.as_str())
            .ok_or_else(|| {
                ApiError::bad_param(&param, "a message names an image the export lacks")
            })?;
        Ok(images::kept(url, &param)?.1)
    };
    let pictures = body
        .messages
        .iter()
        .map(|m| m.images.iter().map(image).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()?;
    let messages: Vec<NewMessage> = body
        .messages
        .into_iter()
        .zip(pictures)
        .map(|(m, images)| NewMessage {
            images,
            role: m.role,
            content: m.content,
            // A reply that was still streaming when exported ended there.
            status: match m.status {
                Status::Streaming => Status::Stopped,
                status => status,
            },
            seed: m.seed,
            sampling: m.sampling,
            provenance: m.provenance,
            reasoning: m.reasoning,
            reasoning_ms: m.reasoning_ms,
        })
        .collect();
    let ImportedConversation { title, settings } = body.conversation;
    let title = Some(title.trim().to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "Imported conversation".to_string());
    Ok(Json(
        db(&app, move |s| s.create_with(&title, &settings, &messages)).await?,
    ))
}

/// What a replay found.
#[derive(Serialize)]
pub(super) struct Replay {
    /// Seeded, complete replies replayed.
    total: usize,
    /// Those that came out the same, thinking included.
    identical: usize,
    replies: Vec<Replayed>,
}

#[derive(Serialize)]
struct Replayed {
    message_id: i64,
    identical: bool,
    /// The reply this machine gives now (absent when it could not run: `error` says why).
    content: Option<String>,
    reasoning: Option<String>,
    error: Option<String>,
    /// Where the stored receipt differs from this machine's for its model ("backend: cuda
    /// there, cpu here"): why a reply may not reproduce.
    differences: Vec<String>,
}

pub(super) async fn replay(
    State(app): State<Arc<App>>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Json<Replay>, ApiError> {
    let id = path_id(id)?;
    let messages = db(&app, move |s| s.messages(id)).await?;
    let mut replies = Vec::new();
    for (at, message) in messages.iter().enumerate() {
        let (Some(seed), Some(sampling)) = (message.seed, &message.sampling) else {
            continue;
        };
        if message.role != Role::Assistant || message.status != Status::Complete {
            continue;
        }
        replies.push(
            match regenerate(&app, &messages[..at], seed, sampling).await {
                Ok((reply, provenance)) => {
                    let identical = reply.text() == message.content
                        && reply.reasoning().unwrap_or_default()
                            == message.reasoning.clone().unwrap_or_default();
                    Replayed {
                        message_id: message.id,
                        identical,
                        content: Some(reply.text()),
                        reasoning: reply.reasoning(),
                        error: None,
                        differences: differences(message, &provenance),
                    }
                }
                Err(e) => Replayed {
                    message_id: message.id,
                    identical: false,
                    content: None,
                    reasoning: None,
                    error: Some(e.message),
                    differences: Vec::new(),
                },
            },
        );
    }
    Ok(Json(Replay {
        total: replies.len(),
        identical: replies.iter().filter(|r| r.identical).count(),
        replies,
    }))
}

/// The reply to `history` under `sampling` and `seed`, and the provenance it ran with.
async fn regenerate(
    app: &App,
    history: &[Message],
    seed: u64,
    sampling: &Sampling,
) -> Result<(crate::generation::Reply, Provenance), ApiError> {
    let settings = Settings {
        model: sampling.model.clone(),
        system_prompt: sampling.system_prompt.clone(),
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        max_tokens: sampling.max_tokens,
        seed: Some(seed),
    };
    let model = ServedModel::find(app, &settings.model).await?;
    let generation_settings = generation_settings(&settings, seed);
    generation_settings.validate("sampling.")?;
    let stored = stored_images(app, history).await?;
    let (chat, images) = chat_history(history, &stored)?;
    let prompt = reply_prompt(&settings.system_prompt, chat, images);
    let job = Job::new(vec![prompt], generation_settings, "replay-");
    let generation = Generation::start(app, model, job).await?;
    let provenance = generation.receipt().provenance;
    let reply = generation.collect().await?.into_iter().next();
    let reply = reply.ok_or_else(|| ApiError::internal("the replay gave no reply"))?;
    Ok((reply, provenance))
}

/// Where `message`'s stored receipt differs from `here`.
fn differences(message: &Message, here: &Provenance) -> Vec<String> {
    let Some(stored) = message.provenance.as_ref() else {
        return vec!["the reply has no receipt (made before receipts were kept)".to_string()];
    };
    let fields = [
        ("backend", Some(here.backend.as_str())),
        ("weights", Some(here.weights.as_str())),
        ("quantization", here.quantization.as_deref()),
        ("engine", Some(here.engine.as_str())),
    ];
    fields
        .into_iter()
        .filter_map(|(field, here)| {
            let there = stored[field].as_str();
            (there != here).then(|| {
                format!(
                    "{field}: {} there, {} here",
                    there.unwrap_or("none"),
                    here.unwrap_or("none")
                )
            })
        })
        .collect()
}

//! Embedding routes over the store's encoder models (BERT-family sentence-transformers
//! checkpoints, run by `seedbar_engine::encoder`): OpenAI's `POST /v1/embeddings`,
//! Ollama's `POST /api/embed` and its older `POST /api/embeddings`. Each encoder is loaded on
//! first use onto a thread of its own, which then runs that model's requests one after
//! another, off the async runtime.
//!
//! Length: OpenAI's route refuses an input over the model's limit (as OpenAI does); Ollama's
//! cut it to the limit unless `truncate: false` (as Ollama does).

use std::{sync::Arc, time::Instant};

use axum::{extract::State, Json};
use base64::Engine as _;
use seedbar_engine::{
    encoder::{EmbeddingInput, Embeddings, Truncation},
    store::ModelKind,
};
use serde::{Deserialize, Serialize};

use crate::{
    encoders::Encoder,
    error::{ApiError, OllamaError},
    extract::{ApiJson, OllamaJson},
    App,
};

/// What a request got: its encoder, the vectors, and the nanoseconds spent finding (or
/// loading) the model.
struct Embedded {
    encoder: Arc<Encoder>,
    embeddings: Embeddings,
    load_duration: u64,
}

/// A request's model, loaded, with `dimensions` checked, and its inputs embedded.
async fn embed(
    app: &App,
    model: &str,
    dimensions: Option<usize>,
    inputs: Vec<EmbeddingInput>,
    truncation: Truncation,
    field: &str,
) -> Result<Embedded, ApiError> {
    let asked = Instant::now();
    let encoder = app
        .encoders
        .get(&app.models, model, ModelKind::Embedding)
        .await?;
    let load_duration = nanos_since(asked);
    if let Some(asked) = dimensions.filter(|&d| d != encoder.dimensions) {
        return Err(ApiError::bad_param(
            "dimensions",
            format!(
                "{} makes vectors of {} dimensions, not {asked}",
                encoder.name, encoder.dimensions
            ),
        ));
    }
    let embeddings = encoder.embed(inputs, truncation, field).await?;
    Ok(Embedded {
        encoder,
        embeddings,
        load_duration,
    })
}

// ---- POST /v1/embeddings -------------------------------------------------------------

#[derive(Deserialize)]
pub struct EmbeddingRequest {
    model: String,
    input: OpenAiInput,
    #[serde(default)]
    encoding_format: EncodingFormat,
    dimensions: Option<usize>,
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
)]
enum OpenAiInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl From<OpenAiInput> for Vec<EmbeddingInput> {
    fn from(input: OpenAiInput) -> Self {
        match input {
            OpenAiInput::Text(text) => vec![EmbeddingInput::Text(text)],
            OpenAiInput::Texts(texts) => texts.into_iter().map(EmbeddingInput::Text).collect(),
            OpenAiInput::Tokens(ids) => vec![EmbeddingInput::Tokens(ids)],
            OpenAiInput::TokenLists(lists) => {
                lists.into_iter().map(EmbeddingInput::Tokens).collect()
            }
        }
    }
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum EncodingFormat {
    #[default]
    Float,
    /// Each vector's little-endian f32 bytes in base64 (what the openai SDKs ask for).
    Base64,
}

#[derive(Serialize, Deserialize)]
pub struct EmbeddingList {
    object: String,
    data: Vec<EmbeddingData>,
    model: String,
    usage: EmbeddingUsage,
}

#[derive(Serialize, Deserialize)]
struct EmbeddingData {
    object: String,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

impl Vector {
    fn new(values: Vec<f32>, format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => Vector::Float(values),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct EmbeddingUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

pub async fn openai(
    State(app): State<Arc<App>>,
    ApiJson(req): ApiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingList>, ApiError> {
    let Embedded {
        encoder,
        embeddings,
        ..
    } = embed(
        &app,
        &req.model,
        req.dimensions,
        req.input.into(),
        Truncation::Refuse,
        "input",
    )
    .await?;
    let data = embeddings
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, values)| EmbeddingData {
            object: "embedding".into(),
            index,
            embedding: Vector::new(values, req.encoding_format),
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list".into(),
        data,
        model: encoder.name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: embeddings.tokens,
            total_tokens: embeddings.tokens,
        },
    }))
}

// ---- POST /api/embed, POST /api/embeddings ----------------------------------------------

#[derive(Deserialize)]
pub struct EmbedRequest {
    model: String,
    input: OllamaInput,
    /// Ollama's default: inputs over the limit are cut to it.
    #[serde(default = "yes")]
    truncate: bool,
    dimensions: Option<usize>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a string or an array of strings")]
enum OllamaInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Serialize, Deserialize)]
pub struct EmbedResponse {
    model: String,
    embeddings: Vec<Vec<f32>>,
    /// Nanoseconds, as Ollama counts them.
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
}

fn nanos_since(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

pub async fn ollama_embed(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<EmbedRequest>,
) -> Result<Json<EmbedResponse>, OllamaError> {
    let started = Instant::now();
    let texts = match req.input {
        OllamaInput::One(text) => vec![text],
        OllamaInput::Many(texts) => texts,
    };
    let truncation = if req.truncate {
        Truncation::Cut
    } else {
        Truncation::Refuse
    };
    let inputs = texts.into_iter().map(EmbeddingInput::Text).collect();
    let done = embed(
        &app,
        &req.model,
        req.dimensions,
        inputs,
        truncation,
        "input",
    )
    .await?;
    Ok(Json(EmbedResponse {
        model: done.encoder.name.clone(),
        embeddings: done.embeddings.vectors,
        total_duration: nanos_since(started),
        load_duration: done.load_duration,
        prompt_eval_count: done.embeddings.tokens,
    }))
}

#[derive(Deserialize)]
pub struct LegacyEmbedRequest {
    model: String,
    prompt: String,
}

#[derive(Serialize, Deserialize)]
pub struct LegacyEmbedResponse {
    embedding: Vec<f32>,
}

pub async fn ollama_embeddings(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<LegacyEmbedRequest>,
) -> Result<Json<LegacyEmbedResponse>, OllamaError> {
    let inputs = vec![EmbeddingInput::Text(req.prompt)];
    let mut done = embed(&app, &req.model, None, inputs, Truncation::Cut, "prompt").await?;
    Ok(Json(LegacyEmbedResponse {
        embedding: done.embeddings.vectors.pop().unwrap_or_default(),
    }))
}

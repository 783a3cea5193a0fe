//! Ollama-compatible routes, for editors' Ollama providers (Zed, Continue): `/api/version`,
//! `/api/tags`, `/api/show`, `/api/chat` and `/api/generate`, streamed as NDJSON by default.
//! `options.seed` pins a reply exactly as `seed` does on the OpenAI routes.

use std::{convert::Infallible, sync::Arc, time::Instant};

use axum::{
    body::Body,
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use futures_util::StreamExt;
use seedbar_engine::{
    tool_calls::{ToolCallParser, ToolOutput},
    ChatMessage, SamplingParams,
};
use seedbar_scheduler::Event;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    error::{ApiError, OllamaError},
    extract::OllamaJson,
    generation::{next_or_gone, spawn_body, ChoiceEvent, Generation, Settings},
    models::{LoadedModel, ModelCard},
    openai::{seed_value, with_seed},
    structured::{self, OllamaFormat},
    App,
};

type Result<T> = std::result::Result<T, OllamaError>;

/// Ollama's sampling options (its defaults where the request leaves them out).
#[derive(Deserialize, Default)]
struct Options {
    seed: Option<serde_json::Number>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    num_predict: Option<i64>,
    stop: Option<Vec<String>>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
}

impl Options {
    /// The settings, with the reply held to `format` when one is given.
    fn settings(
        &self,
        model: &LoadedModel,
        format: Option<&OllamaFormat>,
    ) -> std::result::Result<Settings, ApiError> {
        let mut settings = Settings {
            sampling: SamplingParams {
                temperature: self.temperature.unwrap_or(0.8),
                top_p: self.top_p.unwrap_or(0.9),
                top_k: self.top_k.unwrap_or(40),
                min_p: self.min_p.unwrap_or(0.0),
                repetition_penalty: self.repeat_penalty.unwrap_or(1.0),
                presence_penalty: self.presence_penalty.unwrap_or(0.0),
                frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
                ..SamplingParams::default()
            },
            seed: self.seed.as_ref().map(seed_value).transpose()?,
            // Ollama: -1 (or absent) generates until the model stops or the context ends.
            max_tokens: self.num_predict.filter(|&n| n > 0).map(|n| n as usize),
            stop: self.stop.clone().unwrap_or_default(),
            logprobs: None,
            constraint: None,
        };
        settings.validate("options.")?;
        if let Some(format) = format.map(OllamaFormat::format).transpose()?.flatten() {
            structured::constrain(&mut settings, model, format, "format")?;
        }
        Ok(settings)
    }
}

fn yes() -> bool {
    true
}

/// The Ollama API version whose routes and fields these follow. Clients gate on it (VS Code
/// Copilot's Ollama provider needs at least 0.6.4); Seedbar's own version is in `/health`.
const OLLAMA_API_VERSION: &str = "0.12.0";

pub async fn version() -> Json<Value> {
    Json(json!({"version": OLLAMA_API_VERSION}))
}

fn details(card: &ModelCard, model: Option<&LoadedModel>) -> Value {
    json!({"format": card.format, "family": model.map(|m| m.config.model_type.clone()),
           "parameter_size": model.map(|m| format!("{:.0}M", m.parameter_count() as f64 / 1e6)),
           "quantization_level": card.quantization})
}

pub async fn tags(State(app): State<Arc<App>>) -> Result<Json<Value>> {
    let loaded = app.models.loaded();
    let models: Vec<Value> = app
        .models
        .installed()?
        .iter()
        .map(|card| {
            let model = loaded.iter().find(|m| m.card.name == card.name);
            json!({"name": card.name, "model": card.name, "size": card.bytes,
                   "modified_at": timestamp_of(card.created), "digest": "",
                   "details": details(card, model.map(|m| m.as_ref()))})
        })
        .collect();
    Ok(Json(json!({"models": models})))
}

#[derive(Deserialize)]
pub struct ShowRequest {
    model: Option<String>,
    /// Older clients send `name`.
    name: Option<String>,
}

pub async fn show(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<ShowRequest>,
) -> Result<Json<Value>> {
    let name = req.model.or(req.name).unwrap_or_default();
    let model = app.models.get(&name).await?;
    let c = &model.config;
    Ok(Json(json!({
        "modelfile": format!("FROM {}", model.card.path.display()),
        "parameters": "",
        "template": model.template.source,
        "details": details(&model.card, Some(&model)),
        "model_info": {
            "general.architecture": c.model_type,
            "general.parameter_count": model.parameter_count(),
            format!("{}.context_length", c.model_type): model.scheduler.config().max_context,
            format!("{}.embedding_length", c.model_type): c.hidden_size,
            format!("{}.block_count", c.model_type): c.num_hidden_layers,
        },
        "capabilities": ["completion", "tools"],
        "modified_at": timestamp_of(model.card.created),
    })))
}

#[derive(Deserialize)]
pub struct ChatRequest {
    model: String,
    messages: Vec<OllamaMessage>,
    #[serde(default = "yes")]
    stream: bool,
    #[serde(default)]
    options: Options,
    tools: Option<Vec<Value>>,
    format: Option<OllamaFormat>,
}

#[derive(Deserialize)]
struct OllamaMessage {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    images: Vec<Value>,
    tool_calls: Option<Value>,
}

pub async fn chat(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<ChatRequest>,
) -> Result<Response> {
    let model = app.models.get(&req.model).await?;
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad_param(
                &format!("messages[{i}].role"),
                format!("unknown role '{}'", m.role),
            )
            .into());
        }
        if !m.images.is_empty() {
            return Err(ApiError::bad_param(
                &format!("messages[{i}].images"),
                "this model reads text only",
            )
            .into());
        }
        let mut message = ChatMessage::new(&m.role, &m.content);
        message.tool_calls = m.tool_calls;
        messages.push(message);
    }
    let tools = req.tools.filter(|t| !t.is_empty());
    let prompt = model.chat_prompt(&messages, tools.as_deref())?;
    let settings = req.options.settings(&model, req.format.as_ref())?;
    let generation = Generation::start(
        model,
        vec![prompt],
        1,
        settings,
        app.metrics.clone(),
        "chat-",
    )?;
    Ok(respond(
        generation,
        req.stream,
        Kind::Chat {
            tools: tools.is_some(),
        },
    )
    .await?)
}

#[derive(Deserialize)]
pub struct GenerateRequest {
    model: String,
    #[serde(default)]
    prompt: String,
    suffix: Option<String>,
    system: Option<String>,
    /// Send the prompt as is, without the chat template.
    #[serde(default)]
    raw: bool,
    #[serde(default = "yes")]
    stream: bool,
    #[serde(default)]
    options: Options,
    format: Option<OllamaFormat>,
}

pub async fn generate(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<GenerateRequest>,
) -> Result<Response> {
    let model = app.models.get(&req.model).await?;
    if req.prompt.is_empty() && req.suffix.is_none() {
        // Ollama's way of loading a model ahead of use.
        return Ok(Json(
            json!({"model": model.card.name, "created_at": timestamp(), "response": "",
                              "done": true, "done_reason": "load"}),
        )
        .into_response());
    }
    let prompt = match (&req.suffix, req.raw) {
        (Some(suffix), _) => model.fill_in_the_middle(&req.prompt, suffix)?,
        (None, true) => model.encode(&req.prompt)?,
        (None, false) => {
            let mut messages: Vec<ChatMessage> = req
                .system
                .iter()
                .map(|s| ChatMessage::new("system", s))
                .collect();
            messages.push(ChatMessage::new("user", &req.prompt));
            model.chat_prompt(&messages, None)?
        }
    };
    let settings = req.options.settings(&model, req.format.as_ref())?;
    let generation = Generation::start(
        model,
        vec![prompt],
        1,
        settings,
        app.metrics.clone(),
        "gen-",
    )?;
    Ok(respond(generation, req.stream, Kind::Generate).await?)
}

#[derive(Clone, Copy)]
enum Kind {
    Chat { tools: bool },
    Generate,
}

impl Kind {
    /// One line's payload for a piece of reply text (and tool calls, on chat).
    fn piece(self, text: &str, tool_calls: &[Value]) -> Value {
        match self {
            Kind::Chat { .. } => {
                let mut message = json!({"role": "assistant", "content": text});
                if !tool_calls.is_empty() {
                    message["tool_calls"] = tool_calls.into();
                }
                json!({"message": message})
            }
            Kind::Generate => json!({"response": text}),
        }
    }
}

/// Split text into plain content and Ollama-shaped tool calls.
fn split_tools(outputs: Vec<ToolOutput>) -> (String, Vec<Value>) {
    let (mut text, mut calls) = (String::new(), Vec::new());
    for out in outputs {
        match out {
            ToolOutput::Text(t) => text.push_str(&t),
            ToolOutput::Call(c) => calls.push(json!({"function": {"name": c.name,
                "arguments": serde_json::from_str::<Value>(&c.arguments).unwrap_or(Value::Null)}})),
        }
    }
    (text, calls)
}

async fn respond(
    generation: Generation,
    stream: bool,
    kind: Kind,
) -> std::result::Result<Response, ApiError> {
    let seed = generation.seed;
    if stream {
        let lines = spawn_body(move |tx| stream_lines(generation, kind, tx));
        let body = Body::from_stream(lines.map(|line| Ok::<_, Infallible>(line + "\n")));
        return Ok(with_seed(
            seed,
            ([(header::CONTENT_TYPE, "application/x-ndjson")], body),
        ));
    }
    let started = Instant::now();
    let (name, prompt_tokens) = (generation.model.card.name.clone(), generation.prompt_tokens);
    let choice = generation.collect().await?.pop().unwrap_or_default();
    let (text, calls) = match kind {
        Kind::Chat { tools: true } => split_tools(ToolCallParser::parse(&choice.text)),
        _ => (choice.text.clone(), Vec::new()),
    };
    let mut body = kind.piece(&text, &calls);
    body["model"] = name.into();
    body["created_at"] = timestamp().into();
    body["done"] = true.into();
    body["done_reason"] = choice.finish.map_or("stop", |f| f.as_str()).into();
    stats(
        &mut body,
        started,
        prompt_tokens,
        choice.usage.completion_tokens,
        seed,
    );
    Ok(with_seed(seed, Json(body)))
}

fn stats(body: &mut Value, started: Instant, prompt_tokens: usize, eval_count: usize, seed: u64) {
    body["total_duration"] = (started.elapsed().as_nanos() as u64).into();
    body["load_duration"] = 0.into();
    body["prompt_eval_count"] = prompt_tokens.into();
    body["eval_count"] = eval_count.into();
    body["seed"] = seed.into();
}

async fn stream_lines(
    mut generation: Generation,
    kind: Kind,
    tx: tokio::sync::mpsc::Sender<String>,
) {
    let started = Instant::now();
    let (name, prompt_tokens, seed) = (
        generation.model.card.name.clone(),
        generation.prompt_tokens,
        generation.seed,
    );
    let line = |mut payload: Value, done: bool| {
        payload["model"] = name.clone().into();
        payload["created_at"] = timestamp().into();
        payload["done"] = done.into();
        payload
    };
    let mut parser = matches!(kind, Kind::Chat { tools: true }).then(ToolCallParser::new);
    let mut events = generation.events();
    while let Some(ChoiceEvent { event, .. }) = next_or_gone(&mut events, &tx).await {
        let (text, finished) = match event {
            Event::Token { text, .. } => (text, None),
            Event::Finished {
                reason,
                usage,
                text,
            } => (text, Some((reason, usage))),
            Event::Failed(message) => {
                let _ = tx.send(json!({"error": message}).to_string()).await;
                return;
            }
        };
        let outputs = match parser.as_mut() {
            Some(p) => {
                let mut out = p.push(&text);
                if finished.is_some() {
                    out.extend(p.finish());
                }
                out
            }
            None => vec![ToolOutput::Text(text)],
        };
        let (text, calls) = split_tools(outputs);
        if (!text.is_empty() || !calls.is_empty())
            && tx
                .send(line(kind.piece(&text, &calls), false).to_string())
                .await
                .is_err()
        {
            return;
        }
        if let Some((reason, usage)) = finished {
            let mut last = line(kind.piece("", &[]), true);
            last["done_reason"] = reason.as_str().into();
            stats(
                &mut last,
                started,
                prompt_tokens,
                usage.completion_tokens,
                seed,
            );
            let _ = tx.send(last.to_string()).await;
            return;
        }
    }
}

fn timestamp() -> String {
    humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string()
}

fn timestamp_of(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string()
}

//! Ollama-compatible routes, for editors' Ollama providers (Zed, Continue, VS Code Copilot)
//! and the `ollama` client: `/api/version`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/pull`, `/api/chat` and `/api/generate` (streamed as NDJSON by default). Owns
//! Ollama's request and wire structs and the translator from the generation service's
//! neutral events to its lines. Model details come from the model's files (`ModelFacts`).
//! `options.seed` pins a reply exactly as `seed` does on the OpenAI routes.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use futures_util::StreamExt;
use seedbar_engine::{ChatMessage, ContentPart, SamplingParams};
use seedbar_scheduler::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    common::seed_value,
    error::{ApiError, OllamaError, OllamaErrorBody},
    extract::{null_as_default, null_as_true, OllamaJson},
    generation::{
        stream_body, Delta, Finish, Generation, Job, Prompt, Reply, ServedModel, Settings,
        StopReason, Timings, Token, Translator,
    },
    images::{self, InImage},
    model_host::KeepAlive,
    receipt::with_receipt,
    structured::{self, OllamaFormat},
    App,
};

mod library;

pub use library::{ps, pull, show, tags, version};

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
    /// Seedbar's: `false` turns speculative decoding off (the reply is the same).
    speculative: Option<bool>,
}

impl Options {
    fn settings(&self) -> std::result::Result<Settings, ApiError> {
        let settings = Settings {
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
            format: None,
            speculative: self.speculative,
            thinking: None,
            template_kwargs: Default::default(),
        };
        settings.validate("options.")?;
        Ok(settings)
    }
}

/// Ollama's `keep_alive`: seconds, or a duration string (`"5m"`); negative keeps the model.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum KeepAliveField {
    Seconds(f64),
    Text(String),
}

impl KeepAliveField {
    fn parse(&self) -> std::result::Result<KeepAlive, ApiError> {
        let text = match self {
            KeepAliveField::Seconds(seconds) => seconds.to_string(),
            KeepAliveField::Text(text) => text.clone(),
        };
        text.parse().map_err(|message: String| {
            ApiError::bad_param("keep_alive", format!("keep_alive: {message}"))
        })
    }
}

/// Keep the request's model for its `keep_alive`, when it gives one.
fn keep(app: &App, model: &ServedModel, keep_alive: Option<&KeepAliveField>) -> Result<()> {
    if let Some(field) = keep_alive {
        app.models.set_keep_alive(model.name(), field.parse()?);
    }
    Ok(())
}

/// Ollama's `think`: on or off, or a level (gpt-oss's), which means on.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum Think {
    On(bool),
    Level(String),
}

impl Think {
    fn on(&self) -> std::result::Result<bool, ApiError> {
        match self {
            Think::On(on) => Ok(*on),
            Think::Level(level) if matches!(level.as_str(), "low" | "medium" | "high") => Ok(true),
            Think::Level(level) => Err(ApiError::bad_param(
                "think",
                format!(
                    "think must be true, false, \"low\", \"medium\" or \"high\", got \"{level}\""
                ),
            )),
        }
    }
}

/// The job for `prompt` on `model`, held to `format` when one is given, thinking as `think`
/// says (absent: as the model's template does).
async fn job(
    model: &ServedModel,
    prompt: Prompt,
    options: &Options,
    (format, think): (Option<&OllamaFormat>, Option<&Think>),
    id_prefix: &'static str,
) -> std::result::Result<Job, ApiError> {
    let format = format.map(OllamaFormat::format).transpose()?.flatten();
    let mut settings = options.settings()?;
    settings.thinking = think.map(Think::on).transpose()?;
    structured::constrain(&mut settings, model, format.map(|f| (f, "format"))).await?;
    Ok(Job::new(vec![prompt], settings, id_prefix))
}

fn yes() -> bool {
    true
}

// ---- wire structs ----------------------------------------------------------------------

/// A line of a chat or generate reply (the whole reply when not streamed).
#[derive(Serialize)]
struct Line {
    model: String,
    created_at: String,
    #[serde(flatten)]
    piece: Piece,
    done: bool,
    #[serde(flatten)]
    end: Option<Stats>,
}

/// A piece of reply: a chat message, or generated text (and the thinking before it).
#[derive(Serialize)]
#[serde(untagged)]
enum Piece {
    Chat {
        message: ReplyMessage,
    },
    Generate {
        response: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        thinking: String,
    },
}

#[derive(Serialize)]
struct ReplyMessage {
    role: &'static str,
    content: String,
    /// The thinking before the answer (models that think).
    #[serde(skip_serializing_if = "String::is_empty")]
    thinking: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OllamaToolCall>,
}

#[derive(Serialize)]
struct OllamaToolCall {
    function: OllamaFunction,
}

#[derive(Serialize)]
struct OllamaFunction {
    name: String,
    /// An object (Ollama's shape), not JSON text.
    arguments: Value,
}

/// The last line's fields. Durations are nanoseconds, as Ollama counts them.
#[derive(Serialize)]
struct Stats {
    done_reason: &'static str,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
    prompt_eval_duration: u64,
    eval_count: usize,
    eval_duration: u64,
    /// Seedbar's: the seed the reply used.
    seed: u64,
    /// `/api/generate`'s: the token ids of the prompt and the reply, to send back as
    /// `context`.
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<Vec<u32>>,
}

/// `/api/generate`'s answer to an empty prompt: the model is loaded, or unloaded.
#[derive(Serialize)]
struct Loaded {
    model: String,
    created_at: String,
    response: String,
    done: bool,
    done_reason: &'static str,
}

impl Loaded {
    fn now(model: String, done_reason: &'static str) -> Self {
        Loaded {
            model,
            created_at: timestamp(),
            response: String::new(),
            done: true,
            done_reason,
        }
    }
}

// ---- chat and generate -----------------------------------------------------------------

#[derive(Deserialize)]
pub struct ChatRequest {
    model: String,
    messages: Vec<OllamaMessage>,
    #[serde(default = "yes", deserialize_with = "null_as_true")]
    stream: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    options: Options,
    tools: Option<Vec<Value>>,
    format: Option<OllamaFormat>,
    think: Option<Think>,
    keep_alive: Option<KeepAliveField>,
}

#[derive(Deserialize)]
struct OllamaMessage {
    role: String,
    #[serde(default, deserialize_with = "null_as_default")]
    content: String,
    #[serde(default, deserialize_with = "null_as_default")]
    images: Vec<Value>,
    tool_calls: Option<Value>,
    /// An assistant turn's thinking, sent back.
    thinking: Option<String>,
}

pub async fn chat(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<ChatRequest>,
) -> Result<Response> {
    let model = ServedModel::find(&app, &req.model).await?;
    keep(&app, &model, req.keep_alive.as_ref())?;
    let mut messages = Vec::with_capacity(req.messages.len());
    let mut images = Vec::new();
    for (i, m) in req.messages.into_iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad_param(
                &format!("messages[{i}].role"),
                format!("unknown role '{}'", m.role),
            )
            .into());
        }
        let mut message = with_images(
            &m.role,
            m.content,
            m.images,
            &format!("messages[{i}].images"),
            &mut images,
        )?;
        message.tool_calls = m.tool_calls;
        message.reasoning_content = m.thinking.filter(|_| m.role == "assistant");
        messages.push(message);
    }
    let tools = req.tools.filter(|t| !t.is_empty());
    images::check_count(&images)?;
    let prompt = Prompt::Chat {
        messages,
        tools,
        images,
    };
    let shape = (req.format.as_ref(), req.think.as_ref());
    let job = job(&model, prompt, &req.options, shape, "chat-").await?;
    let generation = Generation::start(&app, model, job).await?;
    Ok(respond(generation, req.stream, Route::Chat).await?)
}

/// A turn of `content` after `given` images (Ollama's base64 strings, decoded into `images`).
fn with_images(
    role: &str,
    content: String,
    given: Vec<Value>,
    param: &str,
    images: &mut Vec<InImage>,
) -> std::result::Result<ChatMessage, ApiError> {
    let mut parts = Vec::with_capacity(given.len() + 1);
    for (k, image) in given.iter().enumerate() {
        let param = format!("{param}[{k}]");
        let Some(data) = image.as_str() else {
            return Err(ApiError::bad_param(
                &param,
                "an image must be a base64 string",
            ));
        };
        images.push(match data.starts_with("data:") {
            true => InImage::url(data, &param)?,
            false => InImage::base64(data, None, &param)?,
        });
        parts.push(ContentPart::Image);
    }
    parts.push(ContentPart::Text { text: content });
    Ok(ChatMessage::from_parts(role, parts, ""))
}

#[derive(Deserialize)]
pub struct GenerateRequest {
    model: String,
    #[serde(default, deserialize_with = "null_as_default")]
    prompt: String,
    /// Images the prompt is about (base64), before its text.
    #[serde(default, deserialize_with = "null_as_default")]
    images: Vec<Value>,
    suffix: Option<String>,
    system: Option<String>,
    /// Send the prompt as is, without the chat template.
    #[serde(default, deserialize_with = "null_as_default")]
    raw: bool,
    #[serde(default = "yes", deserialize_with = "null_as_true")]
    stream: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    options: Options,
    format: Option<OllamaFormat>,
    /// An earlier reply's `context`: run before the prompt as given.
    #[serde(default, deserialize_with = "null_as_default")]
    context: Vec<u32>,
    think: Option<Think>,
    keep_alive: Option<KeepAliveField>,
}

pub async fn generate(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<GenerateRequest>,
) -> Result<Response> {
    let keep_alive = req
        .keep_alive
        .as_ref()
        .map(KeepAliveField::parse)
        .transpose()?;
    let empty = req.prompt.is_empty() && req.suffix.is_none();
    if empty && keep_alive == Some(KeepAlive::For(Duration::ZERO)) {
        // Ollama's way of unloading a model (`ollama stop`): no load first.
        let name = app.models.card(&req.model)?.name;
        app.models.unload(&name);
        return Ok(Json(Loaded::now(name, "unload")).into_response());
    }
    let model = ServedModel::find(&app, &req.model).await?;
    keep(&app, &model, req.keep_alive.as_ref())?;
    if empty {
        // Ollama's way of loading a model ahead of use.
        return Ok(Json(Loaded::now(model.name().to_string(), "load")).into_response());
    }
    if !req.images.is_empty() && (req.raw || req.suffix.is_some()) {
        return Err(ApiError::bad_param(
            "images",
            "images go through the chat template: not with raw or suffix",
        )
        .into());
    }
    let prompt = match (req.suffix, req.raw) {
        (Some(suffix), _) => Prompt::FillInTheMiddle {
            prefix: req.prompt,
            suffix,
        },
        (None, true) => Prompt::Text(req.prompt),
        (None, false) => {
            let mut images = Vec::new();
            let user = with_images("user", req.prompt, req.images, "images", &mut images)?;
            images::check_count(&images)?;
            let system = req.system.iter().map(|s| ChatMessage::new("system", s));
            Prompt::Chat {
                messages: system.chain([user]).collect(),
                tools: None,
                images,
            }
        }
    };
    let shape = (req.format.as_ref(), req.think.as_ref());
    let job = Job {
        context: req.context,
        ..job(&model, prompt, &req.options, shape, "gen-").await?
    };
    let generation = Generation::start(&app, model, job).await?;
    Ok(respond(generation, req.stream, Route::Generate).await?)
}

/// Which route a reply answers: chat lines carry a message, generate lines text (and the
/// last one the `context`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Generate,
}

/// Ollama's lines for a reply: a line per piece of text or tool calls, then the last line
/// with the stats; `{"error"}` when the engine fails.
struct ReplyLines {
    route: Route,
    model: String,
    seed: u64,
    prompt_tokens: usize,
    /// The prompt's token ids and, as they come, the reply's (`/api/generate`'s `context`).
    context: Vec<u32>,
}

impl ReplyLines {
    fn new(generation: &Generation, route: Route) -> Self {
        ReplyLines {
            route,
            model: generation.model.clone(),
            seed: generation.seed,
            prompt_tokens: generation.prompt_tokens,
            context: generation.prompts.concat(),
        }
    }

    fn piece(&self, deltas: Vec<Delta>) -> Piece {
        let mut text = String::new();
        let mut thinking = String::new();
        let mut tool_calls = Vec::new();
        for delta in deltas {
            match delta {
                Delta::Text(t) => text.push_str(&t),
                Delta::Reasoning(t) => thinking.push_str(&t),
                Delta::ToolCall(call) => tool_calls.push(OllamaToolCall {
                    function: OllamaFunction {
                        name: call.name,
                        arguments: serde_json::from_str(&call.arguments).unwrap_or(Value::Null),
                    },
                }),
            }
        }
        match self.route {
            Route::Chat => Piece::Chat {
                message: ReplyMessage {
                    role: "assistant",
                    content: text,
                    thinking,
                    tool_calls,
                },
            },
            Route::Generate => Piece::Generate {
                response: text,
                thinking,
            },
        }
    }

    fn line(&self, piece: Piece, end: Option<Stats>) -> Line {
        Line {
            model: self.model.clone(),
            created_at: timestamp(),
            piece,
            done: end.is_some(),
            end,
        }
    }

    /// The last line's stats; a remote engine counts the prompt in `usage`.
    fn stats(&self, reason: StopReason, usage: &Usage, timings: Timings) -> Stats {
        let nanos = |d: Duration| d.as_nanos() as u64;
        Stats {
            done_reason: match reason {
                StopReason::Length => "length",
                StopReason::Stop | StopReason::StopString(_) | StopReason::ToolCalls => "stop",
            },
            total_duration: nanos(timings.total),
            load_duration: nanos(timings.load),
            prompt_eval_count: self.prompt_tokens.max(usage.prompt_tokens),
            prompt_eval_duration: nanos(timings.prompt_eval),
            eval_count: usage.completion_tokens,
            eval_duration: nanos(timings.eval),
            seed: self.seed,
            context: (self.route == Route::Generate).then(|| self.context.clone()),
        }
    }

    /// The whole reply as one line (not streamed).
    fn whole(mut self, reply: Reply) -> Line {
        self.context.extend(&reply.tokens);
        let stats = self.stats(reply.reason(), &reply.usage(), reply.timings());
        self.line(self.piece(reply.pieces), Some(stats))
    }
}

impl Translator for ReplyLines {
    type Wire = String;

    fn token(&mut self, _: usize, token: Token) -> Vec<String> {
        self.context.push(token.id);
        self.pieces(token.deltas)
    }

    fn finish(&mut self, _: usize, finish: Finish) -> Vec<String> {
        let mut lines = self.pieces(finish.deltas);
        let stats = self.stats(finish.reason, &finish.usage, finish.timings);
        lines.push(json_line(&self.line(self.piece(Vec::new()), Some(stats))));
        lines
    }

    fn failed(&mut self, message: String) -> Vec<String> {
        vec![json_line(&OllamaErrorBody { error: message })]
    }
}

impl ReplyLines {
    /// A line for `deltas`, unless they hold no text and no call.
    fn pieces(&self, deltas: Vec<Delta>) -> Vec<String> {
        let empty = deltas
            .iter()
            .all(|d| matches!(d, Delta::Text(t) | Delta::Reasoning(t) if t.is_empty()));
        if empty {
            return Vec::new();
        }
        vec![json_line(&self.line(self.piece(deltas), None))]
    }
}

async fn respond(
    generation: Generation,
    stream: bool,
    route: Route,
) -> std::result::Result<Response, ApiError> {
    let receipt = generation.receipt();
    let lines = ReplyLines::new(&generation, route);
    if stream {
        return Ok(with_receipt(
            &receipt,
            ndjson(stream_body(generation, lines)),
        ));
    }
    let reply = generation.collect().await?.pop().unwrap_or_default();
    Ok(with_receipt(&receipt, Json(lines.whole(reply))))
}

fn json_line(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// An NDJSON body of `lines`.
fn ndjson(lines: impl futures_util::Stream<Item = String> + Send + 'static) -> Response {
    let body = Body::from_stream(lines.map(|line| Ok::<_, Infallible>(line + "\n")));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

fn timestamp() -> String {
    humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string()
}

fn timestamp_of(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

#[cfg(test)]
mod tests;

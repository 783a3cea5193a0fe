//! Ollama-compatible routes, for editors' Ollama providers (Zed, Continue, VS Code Copilot)
//! and the `ollama` client: `/api/version`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/pull`, `/api/chat` and `/api/generate` (streamed as NDJSON by default). Owns
//! Ollama's request and wire structs and the translator from the generation service's
//! neutral events to its lines. Model details come from the model's files (`ModelFacts`).
//! `options.seed` pins a reply exactly as `seed` does on the OpenAI routes.

use std::{collections::BTreeMap, convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use futures_util::StreamExt;
use seedbar_engine::{inventory::human_count, store::ModelKind, ChatMessage, SamplingParams};
use seedbar_remote::Remote;
use seedbar_scheduler::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    common::seed_value,
    error::{ApiError, OllamaError, OllamaErrorBody},
    extract::{null_as_default, null_as_true, OllamaJson},
    generation::{
        spawn_body, stream_body, Delta, Finish, Generation, Job, Prompt, Reply, ServedModel,
        Settings, StopReason, Timings, Token, Translator,
    },
    model_host::{KeepAlive, ModelCard, ModelFacts},
    pulls::PullStatus,
    receipt::with_receipt,
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

/// The Ollama API version whose routes and fields these follow. Clients gate on it (VS Code
/// Copilot's Ollama provider needs at least 0.6.4); Seedbar's own version is in `/health`.
const OLLAMA_API_VERSION: &str = "0.12.0";

/// What `/api/ps` says of a model that never expires by time (it leaves memory only to make
/// room): a date no client reaches.
const NEVER_EXPIRES: &str = "9999-12-31T23:59:59Z";

/// How often a streamed `/api/pull` reports progress.
const PULL_POLL: Duration = Duration::from_millis(250);

// ---- wire structs ----------------------------------------------------------------------

#[derive(Serialize)]
pub struct VersionBody {
    version: &'static str,
}

#[derive(Serialize)]
pub struct TagList {
    models: Vec<TagEntry>,
}

#[derive(Serialize)]
struct TagEntry {
    name: String,
    model: String,
    modified_at: String,
    size: u64,
    digest: String,
    details: Details,
}

#[derive(Serialize)]
struct Details {
    parent_model: String,
    format: &'static str,
    family: String,
    families: Vec<String>,
    parameter_size: String,
    quantization_level: String,
}

impl Details {
    /// A remote model's: its engine as the family, its upstream id as the parent.
    fn remote(remote: &Remote) -> Self {
        Details {
            parent_model: remote.model.clone(),
            format: "remote",
            family: remote.engine.clone(),
            families: vec![remote.engine.clone()],
            parameter_size: String::new(),
            quantization_level: String::new(),
        }
    }

    fn new(card: &ModelCard, facts: &ModelFacts) -> Self {
        let family = facts.inventory.architecture.clone();
        Details {
            parent_model: String::new(),
            format: card.format,
            families: vec![family.clone()],
            family,
            parameter_size: human_count(facts.inventory.parameters),
            quantization_level: facts.inventory.quantization.clone(),
        }
    }
}

#[derive(Serialize)]
pub struct ShowBody {
    modelfile: String,
    parameters: String,
    template: String,
    details: Details,
    model_info: ModelInfo,
    capabilities: Vec<&'static str>,
    modified_at: String,
}

/// `/api/show`'s `model_info`: the general keys, then `<architecture>.<hyper-parameter>`.
impl ShowBody {
    /// A remote model's: what its engine supports, as the probe found.
    fn remote(remote: &Remote) -> Self {
        let supports = remote.supports;
        let capabilities = [
            (true, "completion"),
            (supports.tools, "tools"),
            (supports.images, "vision"),
            (supports.reasoning, "thinking"),
        ];
        ShowBody {
            modelfile: format!("# {} on {}", remote.model, remote.owner()),
            parameters: String::new(),
            template: String::new(),
            details: Details::remote(remote),
            model_info: ModelInfo {
                architecture: remote.engine.clone(),
                basename: remote.model.clone(),
                parameter_count: 0,
                hyperparameters: BTreeMap::new(),
            },
            capabilities: capabilities
                .into_iter()
                .filter_map(|(has, name)| has.then_some(name))
                .collect(),
            modified_at: timestamp_of(0),
        }
    }
}

#[derive(Serialize)]
struct ModelInfo {
    #[serde(rename = "general.architecture")]
    architecture: String,
    #[serde(rename = "general.basename")]
    basename: String,
    #[serde(rename = "general.parameter_count")]
    parameter_count: u64,
    #[serde(flatten)]
    hyperparameters: BTreeMap<String, u64>,
}

#[derive(Serialize)]
pub struct RunningList {
    models: Vec<RunningModel>,
}

#[derive(Serialize)]
struct RunningModel {
    name: String,
    model: String,
    size: u64,
    digest: String,
    details: Details,
    expires_at: String,
    /// Bytes in GPU memory: all of it on a GPU, none on the CPU.
    size_vram: u64,
}

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

/// A line of `/api/pull`.
#[derive(Serialize)]
struct PullLine {
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completed: Option<u64>,
}

// ---- model routes ----------------------------------------------------------------------

pub async fn version() -> Json<VersionBody> {
    Json(VersionBody {
        version: OLLAMA_API_VERSION,
    })
}

pub async fn tags(State(app): State<Arc<App>>) -> Result<Json<TagList>> {
    let mut models = Vec::new();
    for card in app.models.installed()? {
        let facts = match app.models.facts(&card).await {
            Ok(facts) => facts,
            Err(e) => {
                tracing::warn!(model = card.name, error = %e.message, "cannot read a model's files");
                continue;
            }
        };
        models.push(TagEntry {
            name: card.name.clone(),
            model: card.name.clone(),
            modified_at: timestamp_of(card.created),
            size: card.bytes,
            digest: facts.digest.clone(),
            details: Details::new(&card, &facts),
        });
    }
    for remote in app.models.remotes().list() {
        models.push(TagEntry {
            name: remote.name.clone(),
            model: remote.name.clone(),
            modified_at: timestamp_of(0),
            size: 0,
            digest: format!("remote:{}", remote.model),
            details: Details::remote(&remote),
        });
    }
    Ok(Json(TagList { models }))
}

#[derive(Deserialize)]
pub struct ModelRequest {
    model: Option<String>,
    /// Older clients send `name`.
    name: Option<String>,
}

impl ModelRequest {
    fn name(self) -> String {
        self.model.or(self.name).unwrap_or_default()
    }
}

pub async fn show(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<ModelRequest>,
) -> Result<Json<ShowBody>> {
    let name = req.name();
    if let Some(remote) = app.models.remotes().get(&name) {
        return Ok(Json(ShowBody::remote(&remote)));
    }
    let card = app.models.card(&name)?;
    let facts = app.models.facts(&card).await?;
    let inventory = &facts.inventory;
    let mut hyperparameters = inventory.hyperparameters.clone();
    let (template, capabilities) = if card.kind != ModelKind::Chat {
        let capability = match card.kind {
            ModelKind::Reranker => "rerank",
            _ => "embedding",
        };
        (String::new(), vec![capability])
    } else {
        let model = app.models.get(&name).await?;
        // The context this server gives the model.
        hyperparameters.insert(
            "context_length".into(),
            model.scheduler.config().max_context as u64,
        );
        let mut capabilities = vec!["completion"];
        if model.template.supports_tools() {
            capabilities.push("tools");
        }
        if model.fim_tokens().is_some() {
            capabilities.push("insert");
        }
        if model.template.thinking().thinks {
            capabilities.push("thinking");
        }
        (model.template.source.clone(), capabilities)
    };
    let architecture = &inventory.architecture;
    Ok(Json(ShowBody {
        modelfile: format!("FROM {}", card.path.display()),
        parameters: String::new(),
        template,
        details: Details::new(&card, &facts),
        model_info: ModelInfo {
            architecture: architecture.clone(),
            basename: inventory
                .basename
                .clone()
                .unwrap_or_else(|| card.name.clone()),
            parameter_count: inventory.parameters,
            hyperparameters: hyperparameters
                .into_iter()
                .map(|(key, value)| (format!("{architecture}.{key}"), value))
                .collect(),
        },
        capabilities,
        modified_at: timestamp_of(card.created),
    }))
}

pub async fn ps(State(app): State<Arc<App>>) -> Result<Json<RunningList>> {
    let on_gpu = seedbar_engine::runtime::default_device_is_gpu();
    let mut models = Vec::new();
    for loaded in app.models.loaded() {
        let card = &loaded.card;
        let facts = app.models.facts(card).await?;
        models.push(RunningModel {
            name: card.name.clone(),
            model: card.name.clone(),
            size: card.bytes,
            digest: facts.digest.clone(),
            details: Details::new(card, &facts),
            expires_at: app.models.expires(&card.name).map_or_else(
                || NEVER_EXPIRES.into(),
                |at| humantime::format_rfc3339_seconds(at).to_string(),
            ),
            size_vram: if on_gpu { card.bytes } else { 0 },
        });
    }
    Ok(Json(RunningList { models }))
}

#[derive(Deserialize)]
pub struct PullRequest {
    #[serde(flatten)]
    model: ModelRequest,
    #[serde(default = "yes", deserialize_with = "null_as_true")]
    stream: bool,
}

/// The answer to a pull of a model the store holds: Ollama's "pulling manifest" and
/// "success" lines when streamed, else the last one.
fn pulled(stream: bool) -> Response {
    let line = |status: &str| PullLine {
        status: status.into(),
        total: None,
        completed: None,
    };
    if !stream {
        return Json(line("success")).into_response();
    }
    let lines = [line("pulling manifest"), line("success")].map(|l| json_line(&l));
    ndjson(futures_util::stream::iter(lines))
}

/// Download a Hugging Face repository (`org/name`) into the store, through the app's
/// downloads: status lines while streamed, else one when it is done. A model the store
/// already holds is up to date at once.
pub async fn pull(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<PullRequest>,
) -> Result<Response> {
    let repo = req.model.name().trim().to_string();
    if app.models.card(&repo).is_ok() {
        // Already in the store (a name `/api/tags` lists): up to date, as Ollama answers.
        return Ok(pulled(req.stream));
    }
    seedbar_engine::store::check_pull_id(&repo)
        .map(drop)
        .map_err(|e| ApiError::bad_param("model", e.to_string()))?;
    let root = app.models.store().root().to_path_buf();
    app.pulls.start(root, &repo)?;
    if req.stream {
        let lines = spawn_body(move |tx| async move {
            let mut last = None;
            let first = PullLine {
                status: "pulling manifest".into(),
                total: None,
                completed: None,
            };
            if tx.send(json_line(&first)).await.is_err() {
                return;
            }
            loop {
                let Some(pull) = app.pulls.get(&repo) else {
                    return;
                };
                let line = match pull.status {
                    PullStatus::Downloading => {
                        let progress = (pull.downloaded_bytes, pull.total_bytes);
                        if last == Some(progress) {
                            tokio::time::sleep(PULL_POLL).await;
                            continue;
                        }
                        last = Some(progress);
                        json_line(&PullLine {
                            status: format!("downloading {repo}"),
                            total: Some(pull.total_bytes),
                            completed: Some(pull.downloaded_bytes),
                        })
                    }
                    PullStatus::Done => json_line(&PullLine {
                        status: "success".into(),
                        total: None,
                        completed: None,
                    }),
                    PullStatus::Error | PullStatus::Cancelled => json_line(&OllamaErrorBody {
                        error: pull
                            .error
                            .unwrap_or_else(|| "the download was cancelled".into()),
                    }),
                };
                let ended = pull.status != PullStatus::Downloading;
                if tx.send(line).await.is_err() || ended {
                    return;
                }
            }
        });
        return Ok(ndjson(lines));
    }
    let pull = app.pulls.wait(&repo).await;
    match pull {
        Some(pull) if pull.status == PullStatus::Done => Ok(Json(PullLine {
            status: "success".into(),
            total: None,
            completed: None,
        })
        .into_response()),
        other => Err(ApiError::internal(
            other
                .and_then(|p| p.error)
                .unwrap_or_else(|| "the download was cancelled".into()),
        )
        .into()),
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
        message.reasoning_content = m.thinking.filter(|_| m.role == "assistant");
        messages.push(message);
    }
    let tools = req.tools.filter(|t| !t.is_empty());
    let prompt = Prompt::Chat { messages, tools };
    let shape = (req.format.as_ref(), req.think.as_ref());
    let job = job(&model, prompt, &req.options, shape, "chat-").await?;
    let generation = Generation::start(&app, model, job).await?;
    Ok(respond(generation, req.stream, Route::Chat).await?)
}

#[derive(Deserialize)]
pub struct GenerateRequest {
    model: String,
    #[serde(default, deserialize_with = "null_as_default")]
    prompt: String,
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
    let prompt = match (req.suffix, req.raw) {
        (Some(suffix), _) => Prompt::FillInTheMiddle {
            prefix: req.prompt,
            suffix,
        },
        (None, true) => Prompt::Text(req.prompt),
        (None, false) => {
            let system = req.system.iter().map(|s| ChatMessage::new("system", s));
            let messages = system
                .chain([ChatMessage::new("user", &req.prompt)])
                .collect();
            Prompt::Chat {
                messages,
                tools: None,
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

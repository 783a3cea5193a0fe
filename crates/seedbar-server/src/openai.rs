//! OpenAI-compatible routes: `GET /v1/models`, `GET /v1/models/{id}`,
//! `POST /v1/chat/completions` and `POST /v1/completions`, streamed as server-sent events
//! when asked. Owns the OpenAI request bodies, the OpenAI wire structs, and the translators
//! from the generation service's neutral events to chat and legacy completion chunks. Every response carries the seed it used (a `seed`
//! field and the `x-seedbar-seed` header).

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    extract::{rejection::PathRejection, Path, State},
    response::Response,
    Json,
};
use seedbar_engine::{ChatMessage, ContentPart, ToolCall};
use seedbar_remote::Remote;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    common::{arguments_as_object, thinking_for_effort, CommonFields},
    error::ApiError,
    extract::{null_as_default, JsonBody},
    generation::{
        stream_body, Delta, Finish, Generation, Job, Logprob, Prompt, Reply, ServedModel, Token,
        TotalUsage, Translator,
    },
    images::{self, InImage},
    model_host::ModelCard,
    receipt::with_receipt,
    sse::{sse, SseMessage},
    structured::{self, ResponseFormat, ToolChoice, ToolMode},
    App,
};

// ---- /v1/models ------------------------------------------------------------------------

#[derive(Serialize)]
pub struct ModelList {
    object: &'static str,
    data: Vec<ModelObject>,
}

/// OpenAI's model object.
#[derive(Serialize)]
pub struct ModelObject {
    id: String,
    object: &'static str,
    created: u64,
    /// `seedbar`, or for a remote model `remote: ENGINE at HOST`.
    owned_by: String,
}

impl From<ModelCard> for ModelObject {
    fn from(card: ModelCard) -> Self {
        ModelObject {
            id: card.name,
            object: "model",
            created: card.created,
            owned_by: "seedbar".into(),
        }
    }
}

impl From<Remote> for ModelObject {
    fn from(remote: Remote) -> Self {
        ModelObject {
            owned_by: format!("remote: {}", remote.owner()),
            id: remote.name,
            object: "model",
            created: 0,
        }
    }
}

pub async fn list_models(State(app): State<Arc<App>>) -> Result<Json<ModelList>, ApiError> {
    let local = app.models.installed()?.into_iter().map(Into::into);
    let remote = app.models.remotes().list().into_iter().map(Into::into);
    let data = local.chain(remote).collect();
    Ok(Json(ModelList {
        object: "list",
        data,
    }))
}

pub async fn get_model(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ModelObject>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_param("model", e.body_text()))?;
    if let Some(remote) = app.models.remotes().get(&id) {
        return Ok(Json(remote.into()));
    }
    Ok(Json(app.models.card(&id)?.into()))
}

// ---- /v1/chat/completions --------------------------------------------------------------

#[derive(Deserialize)]
pub struct ChatRequest {
    messages: Vec<InMessage>,
    max_completion_tokens: Option<usize>,
    #[serde(default, deserialize_with = "null_as_default")]
    logprobs: bool,
    top_logprobs: Option<usize>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<ToolChoice>,
    response_format: Option<ResponseFormat>,
    /// `none` turns a thinking model's thinking off; the others leave it on.
    reasoning_effort: Option<String>,
}

#[derive(Deserialize)]
struct InMessage {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
    /// An assistant turn's thinking, sent back (llama-server's and vLLM's field).
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    image_url: Option<ImageUrl>,
}

/// An `image_url` part's image: `{"url": ...}` (OpenAI's shape) or the URL alone.
#[derive(Deserialize)]
#[serde(untagged)]
enum ImageUrl {
    Object { url: String },
    Url(String),
}

impl ImageUrl {
    fn url(&self) -> &str {
        match self {
            ImageUrl::Object { url } | ImageUrl::Url(url) => url,
        }
    }
}

impl InMessage {
    /// The message as chat templates see it. OpenAI's `developer` role is a system message;
    /// tool-call arguments (JSON text on the wire) become objects, as templates expect.
    fn into_chat(self, index: usize, images: &mut Vec<InImage>) -> Result<ChatMessage, ApiError> {
        let role = match self.role.as_str() {
            "system" | "developer" => "system",
            "user" | "assistant" | "tool" => self.role.as_str(),
            other => {
                return Err(ApiError::bad_param(
                    &format!("messages[{index}].role"),
                    format!("unknown role '{other}' (system, developer, user, assistant or tool)"),
                ))
            }
        };
        let mut message = match self.content {
            None => ChatMessage::new(role, ""),
            Some(Content::Text(text)) => ChatMessage::new(role, &text),
            Some(Content::Parts(parts)) => {
                let mut pieces = Vec::with_capacity(parts.len());
                for (i, part) in parts.into_iter().enumerate() {
                    let param = format!("messages[{index}].content[{i}]");
                    pieces.push(match (part.kind.as_str(), part.text, part.image_url) {
                        ("text", Some(text), _) => ContentPart::Text { text },
                        ("image_url", _, Some(image)) => {
                            images.push(InImage::url(image.url(), &format!("{param}.image_url"))?);
                            ContentPart::Image
                        }
                        (kind, _, _) => {
                            return Err(ApiError::bad_param(
                                &param,
                                format!("content parts of type '{kind}' are not supported: send text or image_url parts"),
                            ))
                        }
                    });
                }
                ChatMessage::from_parts(role, pieces, "")
            }
        };
        let tool_calls = self
            .tool_calls
            .map(|calls| Value::Array(calls.into_iter().map(arguments_as_object).collect()));
        message.name = self.name;
        message.tool_calls = tool_calls;
        message.tool_call_id = self.tool_call_id;
        message.reasoning_content = self.reasoning_content.filter(|_| role == "assistant");
        Ok(message)
    }
}

pub async fn chat_completions(
    State(app): State<Arc<App>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let body = body.with_remote_images(app.fetches_image_urls()).await?;
    let (common, req): (CommonFields, ChatRequest) = (body.parse()?, body.parse()?);
    let model = ServedModel::find(&app, &common.model).await?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let logprobs = req.logprobs.then(|| req.top_logprobs.unwrap_or(0));
    if req.top_logprobs.is_some() && !req.logprobs {
        return Err(ApiError::bad_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    let mut settings =
        common.settings(req.max_completion_tokens.or(common.max_tokens), logprobs)?;
    settings.thinking = req
        .reasoning_effort
        .as_deref()
        .map(|effort| thinking_for_effort(effort, "reasoning_effort"))
        .transpose()?;
    let n = common.n()?;
    let tool_choice = req.tool_choice.unwrap_or(ToolChoice::Mode(ToolMode::Auto));
    let tools = req
        .tools
        .filter(|t| !t.is_empty() && tool_choice.offers_tools());
    let format = structured::one_format(
        tool_choice.format(tools.as_deref().unwrap_or_default())?,
        req.response_format
            .as_ref()
            .and_then(ResponseFormat::format),
        "response_format",
    )?;
    structured::constrain(&mut settings, &model, format).await?;
    let mut images = Vec::new();
    let messages = req
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.into_chat(i, &mut images))
        .collect::<Result<Vec<_>, _>>()?;
    images::check_count(&images)?;
    let prompt = Prompt::Chat {
        messages,
        tools,
        images,
    };
    let job = Job {
        n,
        ..Job::new(vec![prompt], settings, "chatcmpl-")
    };
    let generation = Generation::start(&app, model, job).await?;
    let receipt = generation.receipt();
    if common.stream {
        let translator = ChatStream {
            envelope: Envelope::new(&generation, "chat.completion.chunk"),
            choices: generation.choices(),
            calls: vec![0; generation.choices()],
            include_usage: common.include_usage(),
        };
        return Ok(with_receipt(
            &receipt,
            sse(stream_body(generation, translator)),
        ));
    }
    let logprobs = logprobs.is_some();
    let body = whole_response(generation, "chat.completion", |index, reply| {
        chat_choice(index, reply, logprobs)
    })
    .await?;
    Ok(with_receipt(&receipt, Json(body)))
}

// ---- wire structs ----------------------------------------------------------------------

/// The fields every response and chunk carries.
#[derive(Debug, Clone, Serialize)]
struct Envelope {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    system_fingerprint: String,
    seed: u64,
}

impl Envelope {
    fn new(generation: &Generation, object: &'static str) -> Self {
        Envelope {
            id: generation.id.clone(),
            object,
            created: generation.created,
            model: generation.model.clone(),
            system_fingerprint: generation.provenance.fingerprint.clone(),
            seed: generation.seed,
        }
    }
}

/// A response or a chunk: the envelope, choices, and (on whole responses and a stream's
/// usage chunk) the usage.
#[derive(Debug, Serialize)]
struct Body<C> {
    #[serde(flatten)]
    envelope: Envelope,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageBody>,
}

#[derive(Debug, Serialize)]
struct UsageBody {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
    completion_tokens_details: CompletionTokensDetails,
}

#[derive(Debug, Serialize)]
struct PromptTokensDetails {
    cached_tokens: usize,
}

#[derive(Debug, Serialize)]
struct CompletionTokensDetails {
    reasoning_tokens: usize,
}

impl From<TotalUsage> for UsageBody {
    fn from(usage: TotalUsage) -> Self {
        UsageBody {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
            completion_tokens_details: CompletionTokensDetails {
                reasoning_tokens: usage.reasoning_tokens,
            },
        }
    }
}

#[derive(Debug, Serialize)]
struct ChatChoice {
    index: usize,
    message: AssistantMessage,
    logprobs: Option<ChatLogprobs>,
    finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
struct AssistantMessage {
    role: &'static str,
    content: Option<String>,
    /// The thinking before the answer (models that think).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Serialize)]
struct ChatChunkChoice {
    index: usize,
    delta: ChatDelta,
    logprobs: Option<ChatLogprobs>,
    finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Serialize)]
struct WireToolCall {
    /// The call's place in the reply (on stream deltas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction,
}

#[derive(Debug, Serialize)]
struct WireFunction {
    name: String,
    arguments: String,
}

impl WireToolCall {
    fn new(call: ToolCall, index: Option<usize>) -> Self {
        WireToolCall {
            index,
            id: call.id,
            kind: "function",
            function: WireFunction {
                name: call.name,
                arguments: call.arguments,
            },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct ChatLogprobs {
    content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
struct ChatTokenLogprob {
    #[serde(flatten)]
    token: TokenLogprob,
    top_logprobs: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
struct TokenLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

impl TokenLogprob {
    fn new(token: &str, logprob: f32) -> Self {
        TokenLogprob {
            token: token.to_string(),
            logprob,
            bytes: token.as_bytes().to_vec(),
        }
    }
}

impl From<&Logprob> for ChatTokenLogprob {
    fn from(lp: &Logprob) -> Self {
        ChatTokenLogprob {
            token: TokenLogprob::new(&lp.token, lp.logprob),
            top_logprobs: lp
                .top
                .iter()
                .map(|(token, logprob)| TokenLogprob::new(token, *logprob))
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
struct CompletionChoice {
    index: usize,
    text: String,
    logprobs: Option<LegacyLogprobs>,
    finish_reason: Option<&'static str>,
}

/// Legacy completions' `logprobs`: parallel lists, offsets into the choice's text.
#[derive(Debug, Default, Serialize)]
struct LegacyLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<BTreeMap<String, f32>>,
    text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// `logprobs`' tokens, their offsets counted from `start` (the echoed prompt's length).
    fn new<'a>(logprobs: impl IntoIterator<Item = &'a Logprob>, start: usize) -> Self {
        let mut legacy = LegacyLogprobs::default();
        for lp in logprobs {
            legacy.tokens.push(lp.token.clone());
            legacy.token_logprobs.push(lp.logprob);
            legacy.top_logprobs.push(lp.top.iter().cloned().collect());
            legacy.text_offset.push(start + lp.offset);
        }
        legacy
    }
}

fn data(value: &impl Serialize) -> SseMessage {
    SseMessage::json(None, value)
}

/// OpenAI's last event.
fn done_event() -> SseMessage {
    SseMessage {
        name: None,
        data: "[DONE]".into(),
    }
}

/// A stream's end after a failure: the error, then `[DONE]`.
fn failure_events(message: String) -> Vec<SseMessage> {
    vec![data(&ApiError::internal(message).body()), done_event()]
}

/// A stream's end: the usage chunk when asked for, then `[DONE]`.
fn end_events(envelope: &Envelope, usage: Option<TotalUsage>) -> Vec<SseMessage> {
    let usage = usage.map(|usage| Body::<ChatChunkChoice> {
        envelope: envelope.clone(),
        choices: Vec::new(),
        usage: Some(usage.into()),
    });
    usage.iter().map(data).chain([done_event()]).collect()
}

/// A non-streamed response: the envelope, each reply as `choice` writes it, the usage.
async fn whole_response<C>(
    generation: Generation,
    object: &'static str,
    choice: impl Fn(usize, Reply) -> C,
) -> Result<Body<C>, ApiError> {
    let envelope = Envelope::new(&generation, object);
    let prompt_tokens = generation.prompt_tokens;
    let replies = generation.collect().await?;
    let usage = crate::generation::total_usage(prompt_tokens, &replies);
    Ok(Body {
        envelope,
        choices: replies
            .into_iter()
            .enumerate()
            .map(|(index, reply)| choice(index, reply))
            .collect(),
        usage: Some(usage.into()),
    })
}

// ---- translators -----------------------------------------------------------------------

fn chat_choice(index: usize, reply: Reply, logprobs: bool) -> ChatChoice {
    let calls: Vec<WireToolCall> = reply
        .tool_calls()
        .map(|call| WireToolCall::new(call.clone(), None))
        .collect();
    let text = reply.text();
    let content = match calls.is_empty() {
        false if text.is_empty() => None,
        _ => Some(text),
    };
    ChatChoice {
        index,
        message: AssistantMessage {
            role: "assistant",
            content,
            reasoning_content: reply.reasoning(),
            tool_calls: (!calls.is_empty()).then_some(calls),
        },
        logprobs: logprobs.then(|| ChatLogprobs {
            content: reply.logprobs.iter().map(Into::into).collect(),
        }),
        finish_reason: reply.reason().as_str(),
    }
}

/// Chat completion chunks: a role chunk per choice, then a chunk per piece of text or tool
/// call (the token's log-probabilities on its first), a `finish_reason` chunk per choice,
/// the usage chunk when asked for, and `[DONE]`.
struct ChatStream {
    envelope: Envelope,
    choices: usize,
    /// Tool calls so far, per choice.
    calls: Vec<usize>,
    include_usage: bool,
}

impl ChatStream {
    fn chunk(
        &self,
        index: usize,
        delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> SseMessage {
        data(&Body {
            envelope: self.envelope.clone(),
            choices: vec![ChatChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason,
            }],
            usage: None,
        })
    }

    /// A delta per non-empty text and per call.
    fn deltas(&mut self, index: usize, deltas: Vec<Delta>) -> Vec<ChatDelta> {
        deltas
            .into_iter()
            .filter_map(|delta| match delta {
                Delta::Text(text) | Delta::Reasoning(text) if text.is_empty() => None,
                Delta::Text(text) => Some(ChatDelta {
                    content: Some(text),
                    ..ChatDelta::default()
                }),
                Delta::Reasoning(text) => Some(ChatDelta {
                    reasoning_content: Some(text),
                    ..ChatDelta::default()
                }),
                Delta::ToolCall(call) => {
                    let call = WireToolCall::new(call, Some(self.calls[index]));
                    self.calls[index] += 1;
                    Some(ChatDelta {
                        tool_calls: Some(vec![call]),
                        ..ChatDelta::default()
                    })
                }
            })
            .collect()
    }
}

impl Translator for ChatStream {
    type Wire = SseMessage;

    fn start(&mut self) -> Vec<SseMessage> {
        (0..self.choices)
            .map(|index| {
                let role = ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..ChatDelta::default()
                };
                self.chunk(index, role, None, None)
            })
            .collect()
    }

    fn token(&mut self, index: usize, token: Token) -> Vec<SseMessage> {
        let mut deltas = self.deltas(index, token.deltas);
        let mut logprobs = token.logprob.map(|lp| ChatLogprobs {
            content: vec![(&lp).into()],
        });
        if deltas.is_empty() && logprobs.is_some() {
            deltas.push(ChatDelta {
                content: Some(String::new()),
                ..ChatDelta::default()
            });
        }
        deltas
            .into_iter()
            .map(|delta| self.chunk(index, delta, logprobs.take(), None))
            .collect()
    }

    fn finish(&mut self, index: usize, finish: Finish) -> Vec<SseMessage> {
        let mut events: Vec<SseMessage> = self
            .deltas(index, finish.deltas)
            .into_iter()
            .map(|delta| self.chunk(index, delta, None, None))
            .collect();
        let reason = finish.reason.as_str();
        events.push(self.chunk(index, ChatDelta::default(), None, Some(reason)));
        events
    }

    fn done(&mut self, usage: TotalUsage) -> Vec<SseMessage> {
        end_events(&self.envelope, self.include_usage.then_some(usage))
    }

    fn failed(&mut self, message: String) -> Vec<SseMessage> {
        failure_events(message)
    }
}

// ---- /v1/completions -------------------------------------------------------------------

#[derive(Deserialize)]
pub struct CompletionRequest {
    prompt: PromptField,
    suffix: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    echo: bool,
    logprobs: Option<usize>,
    /// Not in OpenAI's legacy API; vLLM and llama.cpp's server take it here too.
    response_format: Option<ResponseFormat>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// One prompt of a completion request: text, or token ids (run as given).
enum CompletionPrompt {
    Text(String),
    Tokens(Vec<u32>),
}

impl CompletionPrompt {
    /// The prompt to run: fill-in-the-middle with a `suffix` (token ids decoded for it),
    /// else the text or the token ids as they are.
    fn prompt(self, suffix: Option<&str>, model: &ServedModel) -> Result<Prompt, ApiError> {
        match (self, suffix) {
            (CompletionPrompt::Text(text), None) => Ok(Prompt::Text(text)),
            (CompletionPrompt::Tokens(ids), None) => Ok(Prompt::Tokens(ids)),
            (prompt, Some(suffix)) => Ok(Prompt::FillInTheMiddle {
                prefix: prompt.text(model)?,
                suffix: suffix.to_string(),
            }),
        }
    }

    /// The prompt as text (what `echo` repeats).
    fn text(&self, model: &ServedModel) -> Result<String, ApiError> {
        match self {
            CompletionPrompt::Text(text) => Ok(text.clone()),
            CompletionPrompt::Tokens(ids) => {
                let model = model.local("a prompt of token ids")?;
                model.tokenizer.decode(ids).map_err(ApiError::internal)
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            CompletionPrompt::Text(text) => text.is_empty(),
            CompletionPrompt::Tokens(ids) => ids.is_empty(),
        }
    }
}

impl From<PromptField> for Vec<CompletionPrompt> {
    fn from(field: PromptField) -> Self {
        match field {
            PromptField::Text(text) => vec![CompletionPrompt::Text(text)],
            PromptField::Texts(texts) => texts.into_iter().map(CompletionPrompt::Text).collect(),
            PromptField::Tokens(ids) => vec![CompletionPrompt::Tokens(ids)],
            PromptField::TokenLists(lists) => {
                lists.into_iter().map(CompletionPrompt::Tokens).collect()
            }
        }
    }
}

pub async fn completions(
    State(app): State<Arc<App>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (common, req): (CommonFields, CompletionRequest) = (body.parse()?, body.parse()?);
    let model = ServedModel::find(&app, &common.model).await?;
    if req.echo && req.logprobs.is_some() {
        return Err(ApiError::bad_param(
            "echo",
            "echo together with logprobs is not supported (prompt logprobs are not computed)",
        ));
    }
    let mut settings = common.settings(Some(common.max_tokens.unwrap_or(16)), req.logprobs)?;
    let format = req
        .response_format
        .as_ref()
        .and_then(ResponseFormat::format);
    let format = format.map(|f| (f, "response_format"));
    structured::constrain(&mut settings, &model, format).await?;
    let n = common.n()?;
    let given: Vec<CompletionPrompt> = req.prompt.into();
    if given.is_empty() || given.iter().any(CompletionPrompt::is_empty) {
        return Err(ApiError::bad_param(
            "prompt",
            "the prompt must not be empty",
        ));
    }
    let mut echoes = Vec::with_capacity(given.len() * n);
    let mut prompts = Vec::with_capacity(given.len());
    for prompt in given {
        let echo = if req.echo {
            prompt.text(&model)?
        } else {
            String::new()
        };
        echoes.extend(std::iter::repeat_n(echo, n));
        prompts.push(prompt.prompt(req.suffix.as_deref(), &model)?);
    }
    let job = Job {
        n,
        ..Job::new(prompts, settings, "cmpl-")
    };
    let generation = Generation::start(&app, model, job).await?;
    let receipt = generation.receipt();
    if common.stream {
        let translator = CompletionStream {
            envelope: Envelope::new(&generation, "text_completion"),
            echoes,
            include_usage: common.include_usage(),
        };
        return Ok(with_receipt(
            &receipt,
            sse(stream_body(generation, translator)),
        ));
    }
    let logprobs = req.logprobs.is_some();
    let body = whole_response(generation, "text_completion", |index, reply| {
        let echo = &echoes[index];
        CompletionChoice {
            index,
            text: format!("{echo}{}", reply.text()),
            logprobs: logprobs.then(|| LegacyLogprobs::new(&reply.logprobs, echo.len())),
            finish_reason: Some(reply.reason().as_str()),
        }
    })
    .await?;
    Ok(with_receipt(&receipt, Json(body)))
}

/// Legacy completion chunks: each choice's echo, a chunk per token (empty text included,
/// with its log-probabilities when asked for), the last text with `finish_reason`, the
/// usage chunk when asked for, and `[DONE]`.
struct CompletionStream {
    envelope: Envelope,
    /// Per choice: the prompt text echoed before the reply, or empty.
    echoes: Vec<String>,
    include_usage: bool,
}

impl CompletionStream {
    fn chunk(
        &self,
        index: usize,
        text: String,
        logprobs: Option<LegacyLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> SseMessage {
        data(&Body {
            envelope: self.envelope.clone(),
            choices: vec![CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason,
            }],
            usage: None,
        })
    }
}

/// The text of `deltas` (legacy completions offer no tools, and their prompts are raw text,
/// so nothing is split out as thinking).
fn text_of(deltas: Vec<Delta>) -> String {
    deltas
        .into_iter()
        .filter_map(|delta| match delta {
            Delta::Text(text) | Delta::Reasoning(text) => Some(text),
            Delta::ToolCall(_) => None,
        })
        .collect()
}

impl Translator for CompletionStream {
    type Wire = SseMessage;

    fn start(&mut self) -> Vec<SseMessage> {
        self.echoes
            .iter()
            .enumerate()
            .filter(|(_, echo)| !echo.is_empty())
            .map(|(index, echo)| self.chunk(index, echo.clone(), None, None))
            .collect()
    }

    fn token(&mut self, index: usize, token: Token) -> Vec<SseMessage> {
        let start = self.echoes[index].len();
        let logprobs = token.logprob.map(|lp| LegacyLogprobs::new([&lp], start));
        vec![self.chunk(index, text_of(token.deltas), logprobs, None)]
    }

    fn finish(&mut self, index: usize, finish: Finish) -> Vec<SseMessage> {
        let reason = Some(finish.reason.as_str());
        vec![self.chunk(index, text_of(finish.deltas), None, reason)]
    }

    fn done(&mut self, usage: TotalUsage) -> Vec<SseMessage> {
        end_events(&self.envelope, self.include_usage.then_some(usage))
    }

    fn failed(&mut self, message: String) -> Vec<SseMessage> {
        failure_events(message)
    }
}

#[cfg(test)]
mod tests;

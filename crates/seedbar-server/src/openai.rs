//! OpenAI-compatible routes: `GET /v1/models`, `POST /v1/chat/completions` and
//! `POST /v1/completions`, streamed as server-sent events when asked. Every response
//! carries the seed it used (a `seed` field and the `x-seedbar-seed` header).

use std::{collections::HashMap, convert::Infallible, sync::Arc};

use axum::{
    extract::State,
    response::{
        sse::{Event as SseEvent, KeepAlive, Sse},
        IntoResponse, Response,
    },
    Json,
};
use futures_util::StreamExt;
use seedbar_engine::{
    tool_calls::{ToolCall, ToolCallParser, ToolOutput},
    ChatMessage, FinishReason, SamplingParams,
};
use seedbar_scheduler::{Event, TokenLogprob, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{
    error::ApiError,
    extract::JsonBody,
    generation::{next_or_gone, spawn_body, Choice, ChoiceEvent, Generation, Settings},
    models::LoadedModel,
    structured::{self, ResponseFormat, ToolChoice, ToolMode},
    App, SEED_HEADER,
};

/// Fields chat and legacy completions share (and the Anthropic and Responses routes, whose
/// sampling fields have the same names).
#[derive(Deserialize)]
pub struct CommonFields {
    pub(crate) model: String,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Not OpenAI's, but sent by many clients (llama.cpp, vLLM extensions).
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<HashMap<String, f32>>,
    seed: Option<serde_json::Number>,
    stop: Option<Stop>,
    max_tokens: Option<usize>,
    n: Option<usize>,
    #[serde(default)]
    pub(crate) stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

impl CommonFields {
    pub(crate) fn settings(
        &self,
        max_tokens: Option<usize>,
        logprobs: Option<usize>,
    ) -> Result<Settings, ApiError> {
        let logit_bias = self
            .logit_bias
            .iter()
            .flatten()
            .map(|(token, &bias)| {
                token.parse::<u32>().map(|t| (t, bias)).map_err(|_| {
                    ApiError::bad_param("logit_bias", format!("'{token}' is not a token id"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let defaults = SamplingParams::default();
        let settings = Settings {
            sampling: SamplingParams {
                temperature: self.temperature.unwrap_or(1.0),
                top_p: self.top_p.unwrap_or(1.0),
                top_k: self.top_k.unwrap_or(0),
                min_p: self.min_p.unwrap_or(0.0),
                repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
                presence_penalty: self.presence_penalty.unwrap_or(0.0),
                frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
                logit_bias,
                ..defaults
            },
            seed: self.seed.as_ref().map(seed_value).transpose()?,
            max_tokens,
            stop: match &self.stop {
                None => Vec::new(),
                Some(Stop::One(s)) => vec![s.clone()],
                Some(Stop::Many(v)) => v.clone(),
            },
            logprobs,
            constraint: None,
        };
        if settings.sampling.temperature > 2.0 {
            return Err(ApiError::bad_param(
                "temperature",
                format!(
                    "temperature must be in [0, 2], got {}",
                    settings.sampling.temperature
                ),
            ));
        }
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad_param(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        settings.validate("")?;
        Ok(settings)
    }

    fn n(&self) -> Result<usize, ApiError> {
        match self.n.unwrap_or(1) {
            n @ 1..=8 => Ok(n),
            n => Err(ApiError::bad_param(
                "n",
                format!("n must be between 1 and 8, got {n}"),
            )),
        }
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// A seed as JSON gives it: any integer; negative ones wrap to their two's complement.
pub fn seed_value(n: &serde_json::Number) -> Result<u64, ApiError> {
    n.as_u64()
        .or_else(|| n.as_i64().map(|i| i as u64))
        .ok_or_else(|| ApiError::bad_param("seed", format!("seed must be an integer, got {n}")))
}

// ---- /v1/models ------------------------------------------------------------------------

pub async fn list_models(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    let data: Vec<Value> = app
        .models
        .installed()?
        .into_iter()
        .map(|m| json!({"id": m.name, "object": "model", "created": m.created, "owned_by": "seedbar"}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

// ---- /v1/chat/completions --------------------------------------------------------------

#[derive(Deserialize)]
pub struct ChatRequest {
    messages: Vec<InMessage>,
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<usize>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<ToolChoice>,
    response_format: Option<ResponseFormat>,
}

#[derive(Deserialize)]
struct InMessage {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
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
}

impl InMessage {
    /// The message as chat templates see it. OpenAI's `developer` role is a system message;
    /// tool-call arguments (JSON text on the wire) become objects, as templates expect.
    fn into_chat(self, index: usize) -> Result<ChatMessage, ApiError> {
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
        let content = match self.content {
            None => String::new(),
            Some(Content::Text(text)) => text,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (i, part) in parts.into_iter().enumerate() {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::bad_param(
                                &format!("messages[{index}].content[{i}]"),
                                format!("content parts of type '{kind}' are not supported: this model reads text"),
                            ))
                        }
                    }
                }
                text
            }
        };
        let tool_calls = self
            .tool_calls
            .map(|calls| Value::Array(calls.into_iter().map(arguments_as_object).collect()));
        let mut message = ChatMessage::new(role, &content);
        message.name = self.name;
        message.tool_calls = tool_calls;
        message.tool_call_id = self.tool_call_id;
        Ok(message)
    }
}

/// A function the model may call, as chat templates take it (an OpenAI chat `tools` entry).
#[derive(Serialize)]
struct TemplateTool {
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateFunction,
}

#[derive(Serialize)]
struct TemplateFunction {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    parameters: Value,
}

/// The template's `tools` entry for a function other APIs declare in their own shape.
pub(crate) fn template_tool(name: String, description: Option<String>, parameters: Value) -> Value {
    let tool = TemplateTool {
        kind: "function",
        function: TemplateFunction {
            name,
            description,
            parameters,
        },
    };
    serde_json::to_value(tool).unwrap_or_default()
}

/// An assistant's earlier call as chat templates take it (`ChatMessage::tool_calls`
/// entries: OpenAI's shape with the arguments as an object).
#[derive(Serialize)]
struct TemplateCall {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateCallFunction,
}

#[derive(Serialize)]
struct TemplateCallFunction {
    name: String,
    arguments: Value,
}

/// `ChatMessage::tool_calls` for calls given as `(id, name, arguments)`.
pub(crate) fn template_calls(calls: Vec<(String, String, Value)>) -> Value {
    let calls: Vec<TemplateCall> = calls
        .into_iter()
        .map(|(id, name, arguments)| TemplateCall {
            id,
            kind: "function",
            function: TemplateCallFunction { name, arguments },
        })
        .collect();
    serde_json::to_value(calls).unwrap_or_default()
}

/// Tool-call arguments as JSON text (on the wire) made an object, as templates expect;
/// text that is not JSON stays a string.
pub(crate) fn arguments_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

fn arguments_as_object(mut call: Value) -> Value {
    if let Some(args) = call.pointer_mut("/function/arguments") {
        if let Some(text) = args.as_str() {
            *args = arguments_value(text);
        }
    }
    call
}

pub async fn chat_completions(
    State(app): State<Arc<App>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (common, req): (CommonFields, ChatRequest) = (body.parse()?, body.parse()?);
    let model = app.models.get(&common.model).await?;
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
    let n = common.n()?;
    let tool_choice = req.tool_choice.unwrap_or(ToolChoice::Mode(ToolMode::Auto));
    let tools = req
        .tools
        .filter(|t| !t.is_empty() && tool_choice.offers_tools());
    let format = match (
        tool_choice.format(tools.as_deref().unwrap_or_default())?,
        req.response_format
            .as_ref()
            .and_then(ResponseFormat::format),
    ) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_param(
                "response_format",
                "a forced tool call (tool_choice) and a JSON response_format cannot both apply",
            ))
        }
        (call, reply) => call
            .map(|f| ("tool_choice", f))
            .or(reply.map(|f| ("response_format", f))),
    };
    if let Some((param, format)) = format {
        structured::constrain(&mut settings, &model, format, param)?;
    }
    let messages = req
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.into_chat(i))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt = model.chat_prompt(&messages, tools.as_deref())?;
    let generation = Generation::start(
        model,
        vec![prompt],
        n,
        settings,
        app.metrics.clone(),
        "chatcmpl-",
    )?;
    let seed = generation.seed;
    let reply = Reply {
        object: "chat.completion",
        tools: tools.is_some(),
        logprobs: logprobs.is_some(),
    };
    if common.stream {
        let include_usage = common.include_usage();
        Ok(with_seed(
            seed,
            sse(spawn_body(move |tx| {
                stream_chat(generation, reply, include_usage, tx)
            })),
        ))
    } else {
        Ok(with_seed(
            seed,
            Json(chat_response(generation, reply).await?),
        ))
    }
}

/// What shapes a response.
#[derive(Clone, Copy)]
struct Reply {
    object: &'static str,
    tools: bool,
    logprobs: bool,
}

/// The fields every response and chunk carries.
fn envelope(g: &Generation, object: &str) -> Value {
    json!({"id": g.id, "object": object, "created": g.created, "model": g.model.card.name,
           "system_fingerprint": g.model.fingerprint, "seed": g.seed})
}

fn usage_json(prompt_tokens: usize, usages: &[Usage]) -> Value {
    let completion: usize = usages.iter().map(|u| u.completion_tokens).sum();
    let cached = usages.iter().map(|u| u.cached_tokens).max().unwrap_or(0);
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion,
           "total_tokens": prompt_tokens + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

fn finish_reason(reason: Option<FinishReason>, called_tools: bool) -> &'static str {
    match reason {
        _ if called_tools => "tool_calls",
        Some(r) => r.as_str(),
        None => "stop",
    }
}

/// One token in chat `logprobs.content` form.
fn chat_logprob(model: &LoadedModel, id: u32, lp: &TokenLogprob) -> Value {
    let entry = |id: u32, logprob: f32| {
        let token = model.tokenizer.decode(&[id]).unwrap_or_default();
        json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
    };
    let mut value = entry(id, lp.logprob);
    value["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
    value
}

/// A tool call in OpenAI's shape.
fn call_json(call: &ToolCall) -> Value {
    json!({"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}})
}

/// Split reply text into content and tool calls (when tools were offered).
fn message_parts(outputs: Vec<ToolOutput>, calls_so_far: &mut usize) -> Vec<Value> {
    outputs
        .into_iter()
        .filter_map(|out| match out {
            ToolOutput::Text(t) if t.is_empty() => None,
            ToolOutput::Text(t) => Some(json!({"content": t})),
            ToolOutput::Call(call) => {
                let mut delta = call_json(&call);
                delta["index"] = (*calls_so_far).into();
                *calls_so_far += 1;
                Some(json!({"tool_calls": [delta]}))
            }
        })
        .collect()
}

/// A non-streamed response: the envelope, each finished choice as `choice_json` writes it,
/// and the usage.
async fn whole_response(
    generation: Generation,
    object: &str,
    choice_json: impl Fn(usize, Choice, &LoadedModel) -> Value,
) -> Result<Value, ApiError> {
    let mut body = envelope(&generation, object);
    let (model, prompt_tokens) = (generation.model.clone(), generation.prompt_tokens);
    let choices = generation.collect().await?;
    let usages: Vec<Usage> = choices.iter().map(|c| c.usage).collect();
    body["choices"] = choices
        .into_iter()
        .enumerate()
        .map(|(index, choice)| choice_json(index, choice, &model))
        .collect();
    body["usage"] = usage_json(prompt_tokens, &usages);
    Ok(body)
}

/// The end of a stream that ran to completion: the usage chunk when asked for, then `[DONE]`.
async fn finish_stream(
    tx: &tokio::sync::mpsc::Sender<SseEvent>,
    base: &Value,
    usage: Option<Value>,
) {
    if let Some(usage) = usage {
        let mut last = base.clone();
        last["choices"] = json!([]);
        last["usage"] = usage;
        let _ = tx.send(SseEvent::default().data(last.to_string())).await;
    }
    let _ = tx.send(SseEvent::default().data("[DONE]")).await;
}

async fn chat_response(generation: Generation, reply: Reply) -> Result<Value, ApiError> {
    whole_response(generation, reply.object, |index, choice, model| {
        let mut message = json!({"role": "assistant", "content": choice.text});
        if reply.tools {
            let (mut content, mut calls) = (String::new(), Vec::new());
            for output in ToolCallParser::parse(&choice.text) {
                match output {
                    ToolOutput::Text(text) => content.push_str(&text),
                    ToolOutput::Call(call) => calls.push(call_json(&call)),
                }
            }
            if !calls.is_empty() {
                message["content"] = if content.is_empty() {
                    Value::Null
                } else {
                    content.into()
                };
                message["tool_calls"] = calls.into();
            }
        }
        let called = message.get("tool_calls").is_some();
        let logprobs = reply.logprobs.then(|| {
            json!({"content": choice.tokens.iter()
                    .filter_map(|(id, _, lp)| lp.as_ref().map(|lp| chat_logprob(model, *id, lp)))
                    .collect::<Vec<_>>()})
        });
        json!({"index": index, "message": message, "logprobs": logprobs,
                   "finish_reason": finish_reason(choice.finish, called)})
    })
    .await
}

async fn stream_chat(
    mut generation: Generation,
    reply: Reply,
    include_usage: bool,
    tx: tokio::sync::mpsc::Sender<SseEvent>,
) {
    let base = envelope(&generation, "chat.completion.chunk");
    let chunk = |choices: Value| {
        let mut c = base.clone();
        c["choices"] = choices;
        SseEvent::default().data(c.to_string())
    };
    let n = generation.choices();
    let model = generation.model.clone();
    let mut parsers: Vec<ToolCallParser> = (0..n).map(|_| ToolCallParser::new()).collect();
    let mut calls = vec![0usize; n];
    let mut usages = Vec::new();
    for index in 0..n {
        let delta = json!({"role": "assistant", "content": ""});
        if tx
            .send(chunk(
                json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": null}]),
            ))
            .await
            .is_err()
        {
            return;
        }
    }
    let mut events = generation.events();
    while let Some(ChoiceEvent { index, event }) = next_or_gone(&mut events, &tx).await {
        let (text, finished, logprob) = match event {
            Event::Token { id, text, logprob } => {
                let lp = reply
                    .logprobs
                    .then(|| logprob.map(|lp| json!({"content": [chat_logprob(&model, id, &lp)]})));
                (text, None, lp.flatten())
            }
            Event::Finished {
                reason,
                usage,
                text,
            } => {
                usages.push(usage);
                (text, Some(reason), None)
            }
            Event::Failed(message) => {
                let error = ApiError::internal(message).body();
                let _ = tx.send(SseEvent::default().data(error.to_string())).await;
                let _ = tx.send(SseEvent::default().data("[DONE]")).await;
                return;
            }
        };
        let mut outputs = if reply.tools {
            parsers[index].push(&text)
        } else {
            vec![ToolOutput::Text(text)]
        };
        if finished.is_some() && reply.tools {
            outputs.extend(parsers[index].finish());
        }
        let mut deltas = message_parts(outputs, &mut calls[index]);
        if deltas.is_empty() && logprob.is_some() {
            deltas.push(json!({"content": ""}));
        }
        for (i, delta) in deltas.into_iter().enumerate() {
            let lp = if i == 0 { logprob.clone() } else { None };
            let choice =
                json!([{"index": index, "delta": delta, "logprobs": lp, "finish_reason": null}]);
            if tx.send(chunk(choice)).await.is_err() {
                return;
            }
        }
        if let Some(reason) = finished {
            let reason = finish_reason(Some(reason), calls[index] > 0);
            let choice =
                json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": reason}]);
            if tx.send(chunk(choice)).await.is_err() {
                return;
            }
        }
    }
    if usages.len() < n {
        return; // the client went away
    }
    let usage = include_usage.then(|| usage_json(generation.prompt_tokens, &usages));
    finish_stream(&tx, &base, usage).await;
}

// ---- /v1/completions -------------------------------------------------------------------

#[derive(Deserialize)]
pub struct CompletionRequest {
    prompt: Prompt,
    suffix: Option<String>,
    #[serde(default)]
    echo: bool,
    logprobs: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

pub async fn completions(
    State(app): State<Arc<App>>,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (common, req): (CommonFields, CompletionRequest) = (body.parse()?, body.parse()?);
    let model = app.models.get(&common.model).await?;
    if req.echo && req.logprobs.is_some() {
        return Err(ApiError::bad_param(
            "echo",
            "echo together with logprobs is not supported (prompt logprobs are not computed)",
        ));
    }
    let settings = common.settings(Some(common.max_tokens.unwrap_or(16)), req.logprobs)?;
    let n = common.n()?;
    let texts: Vec<String> = match req.prompt {
        Prompt::Text(t) => vec![t],
        Prompt::Texts(ts) => ts,
        Prompt::Tokens(ids) => vec![model.tokenizer.decode(&ids).map_err(ApiError::internal)?],
        Prompt::TokenLists(lists) => lists
            .iter()
            .map(|ids| model.tokenizer.decode(ids).map_err(ApiError::internal))
            .collect::<Result<_, _>>()?,
    };
    if texts.is_empty() || texts.iter().any(String::is_empty) {
        return Err(ApiError::bad_param(
            "prompt",
            "the prompt must not be empty",
        ));
    }
    let prompts = texts
        .iter()
        .map(|text| match &req.suffix {
            Some(suffix) => model.fill_in_the_middle(text, suffix),
            None => model.encode(text),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let generation = Generation::start(model, prompts, n, settings, app.metrics.clone(), "cmpl-")?;
    let seed = generation.seed;
    let echoes: Vec<String> = if req.echo {
        texts
            .iter()
            .flat_map(|t| std::iter::repeat_n(t.clone(), n))
            .collect()
    } else {
        vec![String::new(); texts.len() * n]
    };
    let logprobs = req.logprobs.is_some();
    if common.stream {
        let include_usage = common.include_usage();
        Ok(with_seed(
            seed,
            sse(spawn_body(move |tx| {
                stream_completion(generation, echoes, logprobs, include_usage, tx)
            })),
        ))
    } else {
        Ok(with_seed(
            seed,
            Json(completion_response(generation, echoes, logprobs).await?),
        ))
    }
}

/// Legacy `logprobs` for a run of tokens, offsets counted from `offset`.
fn legacy_logprobs(
    model: &LoadedModel,
    tokens: &[(u32, String, Option<TokenLogprob>)],
    mut offset: usize,
) -> Value {
    let (mut names, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for (id, text, lp) in tokens {
        let Some(lp) = lp else { continue };
        names.push(model.tokenizer.decode(&[*id]).unwrap_or_default());
        lps.push(lp.logprob);
        let top: serde_json::Map<String, Value> = lp
            .top
            .iter()
            .map(|&(t, l)| (model.tokenizer.decode(&[t]).unwrap_or_default(), json!(l)))
            .collect();
        tops.push(Value::Object(top));
        offsets.push(offset);
        offset += text.len();
    }
    json!({"tokens": names, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

async fn completion_response(
    generation: Generation,
    echoes: Vec<String>,
    logprobs: bool,
) -> Result<Value, ApiError> {
    whole_response(generation, "text_completion", |index, choice, model| {
        let echo = &echoes[index];
        let lp = logprobs.then(|| legacy_logprobs(model, &choice.tokens, echo.len()));
        json!({"index": index, "text": format!("{echo}{}", choice.text), "logprobs": lp,
               "finish_reason": finish_reason(choice.finish, false)})
    })
    .await
}

async fn stream_completion(
    mut generation: Generation,
    echoes: Vec<String>,
    logprobs: bool,
    include_usage: bool,
    tx: tokio::sync::mpsc::Sender<SseEvent>,
) {
    let base = envelope(&generation, "text_completion");
    let chunk = |index: usize, text: &str, lp: Option<Value>, finish: Option<&str>| {
        let mut c = base.clone();
        c["choices"] =
            json!([{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}]);
        SseEvent::default().data(c.to_string())
    };
    let model = generation.model.clone();
    let mut offsets: Vec<usize> = echoes.iter().map(String::len).collect();
    for (index, echo) in echoes.iter().enumerate().filter(|(_, e)| !e.is_empty()) {
        if tx.send(chunk(index, echo, None, None)).await.is_err() {
            return;
        }
    }
    let mut usages = Vec::new();
    let mut events = generation.events();
    while let Some(ChoiceEvent { index, event }) = next_or_gone(&mut events, &tx).await {
        let message = match event {
            Event::Token { id, text, logprob } => {
                let lp = logprobs.then(|| {
                    legacy_logprobs(&model, &[(id, text.clone(), logprob)], offsets[index])
                });
                offsets[index] += text.len();
                chunk(index, &text, lp, None)
            }
            Event::Finished {
                reason,
                usage,
                text,
            } => {
                usages.push(usage);
                chunk(index, &text, None, Some(reason.as_str()))
            }
            Event::Failed(message) => {
                let _ = tx
                    .send(SseEvent::default().data(ApiError::internal(message).body().to_string()))
                    .await;
                break;
            }
        };
        if tx.send(message).await.is_err() {
            return;
        }
    }
    let usage = (include_usage && usages.len() == echoes.len())
        .then(|| usage_json(generation.prompt_tokens, &usages));
    finish_stream(&tx, &base, usage).await;
}

pub(crate) fn sse(events: impl futures_util::Stream<Item = SseEvent> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Attach the seed header.
pub fn with_seed(seed: u64, body: impl IntoResponse) -> Response {
    ([(SEED_HEADER, seed.to_string())], body).into_response()
}

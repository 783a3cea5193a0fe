//! What is asked of an upstream and what comes back, protocol-neutral ([`Ask`], [`Piece`]),
//! and their shapes on the wire: the request bodies of OpenAI's chat and completions routes
//! and Ollama's chat and generate routes, and the parsers of their streams (server-sent
//! events; JSON lines).

use seedbar_engine::{ChatMessage, SamplingParams, ToolCall};
use serde_json::{json, Map, Value};

use crate::{Api, Remote};

/// What a prompt is made of.
#[derive(Debug, Clone)]
pub enum AskPrompt {
    /// A chat, rendered by the upstream's template, offering `tools`.
    Chat {
        messages: Vec<ChatMessage>,
        tools: Option<Vec<Value>>,
    },
    /// Text continued as it is.
    Text(String),
    /// The model writes the middle between `prefix` and `suffix`.
    FillInTheMiddle { prefix: String, suffix: String },
}

/// The format a reply must follow, as the upstream is asked for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Any JSON object.
    Json,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
    /// A call of one of the offered tools: the named one, or any.
    Call(Option<String>),
}

/// One reply asked of an upstream.
#[derive(Debug, Clone)]
pub struct Ask {
    pub prompt: AskPrompt,
    /// Sent as the upstream's `seed`.
    pub seed: u64,
    /// Temperature, nucleus, top-k, min-p and penalties (logit bias is not sent: token ids
    /// are the upstream's).
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub shape: Option<Shape>,
    /// Whether a model that thinks should; `None` leaves the upstream's default.
    pub thinking: Option<bool>,
}

impl Ask {
    /// `prompt` with `seed`, greedy, nothing else set.
    pub fn new(prompt: AskPrompt, seed: u64) -> Ask {
        Ask {
            prompt,
            seed,
            sampling: SamplingParams::default(),
            max_tokens: None,
            stop: Vec::new(),
            shape: None,
            thinking: None,
        }
    }
}

/// Why a reply ended, as the upstream says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Stop,
    Length,
    ToolCalls,
}

/// A reply's end: why, and the upstream's token counts where it gave them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    pub end: End,
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
}

/// A piece of a streamed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// The model's thinking, kept apart by the upstream.
    Reasoning(String),
    /// A whole call (an OpenAI upstream streams a call's arguments in fragments; they are
    /// joined first).
    ToolCall(ToolCall),
    Finish(Finish),
}

// ---- requests --------------------------------------------------------------------------

/// The route and body that ask `remote` for `ask`, streamed.
pub fn request(remote: &Remote, ask: &Ask) -> (String, Value) {
    match remote.api {
        Api::OpenAi => openai_request(remote, ask),
        Api::Ollama => ollama_request(remote, ask),
    }
}

fn openai_request(remote: &Remote, ask: &Ask) -> (String, Value) {
    let s = &ask.sampling;
    let mut body = Map::new();
    body.insert("model".into(), remote.model.clone().into());
    let route = match &ask.prompt {
        AskPrompt::Chat { messages, tools } => {
            let messages: Vec<Value> = messages.iter().map(openai_message).collect();
            body.insert("messages".into(), messages.into());
            if let Some(tools) = tools {
                body.insert("tools".into(), tools.clone().into());
            }
            "/v1/chat/completions"
        }
        AskPrompt::Text(text) => {
            body.insert("prompt".into(), text.clone().into());
            "/v1/completions"
        }
        AskPrompt::FillInTheMiddle { prefix, suffix } => {
            body.insert("prompt".into(), prefix.clone().into());
            body.insert("suffix".into(), suffix.clone().into());
            "/v1/completions"
        }
    };
    body.insert("stream".into(), true.into());
    body.insert("stream_options".into(), json!({"include_usage": true}));
    body.insert("seed".into(), ask.seed.into());
    body.insert("temperature".into(), s.temperature.into());
    body.insert("top_p".into(), s.top_p.into());
    // Beyond OpenAI's fields, sent only when set: the servers named here all read them.
    if s.top_k > 0 {
        body.insert("top_k".into(), s.top_k.into());
    }
    if s.min_p > 0.0 {
        body.insert("min_p".into(), s.min_p.into());
    }
    if s.repetition_penalty != 1.0 {
        body.insert("repetition_penalty".into(), s.repetition_penalty.into());
    }
    if s.presence_penalty != 0.0 {
        body.insert("presence_penalty".into(), s.presence_penalty.into());
    }
    if s.frequency_penalty != 0.0 {
        body.insert("frequency_penalty".into(), s.frequency_penalty.into());
    }
    if let Some(max) = ask.max_tokens {
        body.insert("max_tokens".into(), max.into());
    }
    if !ask.stop.is_empty() {
        body.insert("stop".into(), ask.stop.clone().into());
    }
    match &ask.shape {
        None => {}
        Some(Shape::Json) => {
            body.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Shape::JsonSchema(schema)) => {
            let format = json!({"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": schema}});
            body.insert("response_format".into(), format);
        }
        Some(Shape::Call(None)) => {
            body.insert("tool_choice".into(), "required".into());
        }
        Some(Shape::Call(Some(name))) => {
            let choice = json!({"type": "function", "function": {"name": name}});
            body.insert("tool_choice".into(), choice);
        }
    }
    if let Some(thinking) = ask.thinking {
        body.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": thinking}),
        );
    }
    (route.into(), body.into())
}

/// A message in OpenAI's shape: a call's arguments as JSON text.
fn openai_message(message: &ChatMessage) -> Value {
    let mut out = json!({"role": message.role, "content": message.content});
    if let Some(name) = &message.name {
        out["name"] = name.clone().into();
    }
    if let Some(id) = &message.tool_call_id {
        out["tool_call_id"] = id.clone().into();
    }
    if let Some(Value::Array(calls)) = &message.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let function = &call["function"];
                let arguments = json_text(&function["arguments"]);
                json!({"id": call["id"], "type": "function",
                       "function": {"name": function["name"], "arguments": arguments}})
            })
            .collect();
        out["tool_calls"] = calls.into();
    }
    out
}

fn ollama_request(remote: &Remote, ask: &Ask) -> (String, Value) {
    let s = &ask.sampling;
    let mut options = json!({
        "seed": ask.seed,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "repeat_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    });
    if let Some(max) = ask.max_tokens {
        options["num_predict"] = max.into();
    }
    if !ask.stop.is_empty() {
        options["stop"] = ask.stop.clone().into();
    }
    let mut body = json!({"model": remote.model, "stream": true, "options": options});
    let route = match &ask.prompt {
        AskPrompt::Chat { messages, tools } => {
            let messages: Vec<Value> = messages.iter().map(ollama_message).collect();
            body["messages"] = messages.into();
            if let Some(tools) = tools {
                body["tools"] = tools.clone().into();
            }
            "/api/chat"
        }
        AskPrompt::Text(text) => {
            body["prompt"] = text.clone().into();
            body["raw"] = true.into();
            "/api/generate"
        }
        AskPrompt::FillInTheMiddle { prefix, suffix } => {
            body["prompt"] = prefix.clone().into();
            body["suffix"] = suffix.clone().into();
            "/api/generate"
        }
    };
    match &ask.shape {
        None | Some(Shape::Call(_)) => {}
        Some(Shape::Json) => body["format"] = "json".into(),
        Some(Shape::JsonSchema(schema)) => body["format"] = schema.clone(),
    }
    if let Some(thinking) = ask.thinking {
        body["think"] = thinking.into();
    }
    (route.into(), body)
}

/// A message in Ollama's shape: a call's arguments as an object, thinking as `thinking`.
fn ollama_message(message: &ChatMessage) -> Value {
    let mut out = json!({"role": message.role, "content": message.content});
    if let Some(Value::Array(calls)) = &message.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let function = &call["function"];
                let arguments = match &function["arguments"] {
                    Value::String(text) => serde_json::from_str(text).unwrap_or(json!({})),
                    other => other.clone(),
                };
                json!({"function": {"name": function["name"], "arguments": arguments}})
            })
            .collect();
        out["tool_calls"] = calls.into();
    }
    if let Some(thinking) = &message.reasoning_content {
        out["thinking"] = thinking.clone().into();
    }
    out
}

// ---- streams ---------------------------------------------------------------------------

/// Reads an upstream's stream, a line at a time, into pieces.
#[derive(Debug)]
pub struct Reader {
    api: Api,
    /// Bytes of a line not ended yet (a network read may end inside a character).
    pending: Vec<u8>,
    /// An OpenAI stream's calls, joined from their fragments: id, name, arguments.
    calls: Vec<(String, String, String)>,
    end: Option<End>,
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
    finished: bool,
}

impl Reader {
    pub fn new(api: Api) -> Reader {
        Reader {
            api,
            pending: Vec::new(),
            calls: Vec::new(),
            end: None,
            prompt_tokens: None,
            completion_tokens: None,
            finished: false,
        }
    }

    /// Whether the reply finished (a later byte is ignored).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The pieces `bytes` completes; `Err` with the upstream's message where it sent an
    /// error in the stream, or a line that is not its protocol.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Piece>, String> {
        self.pending.extend_from_slice(bytes);
        let mut pieces = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            if !self.finished {
                self.line(String::from_utf8_lossy(&line).trim(), &mut pieces)?;
            }
        }
        Ok(pieces)
    }

    /// The stream ended: its last pieces, or `Err` where the reply had not finished.
    pub fn close(&mut self) -> Result<Vec<Piece>, String> {
        let rest = std::mem::take(&mut self.pending);
        let mut pieces = Vec::new();
        if !self.finished {
            self.line(String::from_utf8_lossy(&rest).trim(), &mut pieces)?;
        }
        if !self.finished && self.api == Api::OpenAi && self.end.is_some() {
            // A server that ends the stream without `[DONE]` after the finish reason.
            self.finish(&mut pieces);
        }
        match self.finished {
            true => Ok(pieces),
            false => Err("the upstream closed the stream before the reply finished".into()),
        }
    }

    fn line(&mut self, line: &str, pieces: &mut Vec<Piece>) -> Result<(), String> {
        if line.is_empty() {
            return Ok(());
        }
        match self.api {
            Api::OpenAi => {
                // Server-sent events: only `data:` lines carry anything.
                let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                    return Ok(());
                };
                if data == "[DONE]" {
                    self.finish(pieces);
                    return Ok(());
                }
                let chunk = parse(data)?;
                self.openai_chunk(&chunk, pieces)
            }
            Api::Ollama => {
                let chunk = parse(line)?;
                self.ollama_line(&chunk, pieces)
            }
        }
    }

    fn openai_chunk(&mut self, chunk: &Value, pieces: &mut Vec<Piece>) -> Result<(), String> {
        if let Some(error) = chunk.get("error") {
            return Err(error_message(error));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.prompt_tokens = count(&usage["prompt_tokens"]);
            self.completion_tokens = count(&usage["completion_tokens"]);
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return Ok(());
        };
        let delta = &choice["delta"];
        let reasoning = delta["reasoning_content"]
            .as_str()
            .or(delta["reasoning"].as_str());
        let text = delta["content"].as_str().or(choice["text"].as_str());
        push_text(pieces, reasoning, text);
        for fragment in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = count(&fragment["index"]).unwrap_or(self.calls.len());
            if index >= self.calls.len() {
                self.calls.resize(index + 1, Default::default());
            }
            let call = &mut self.calls[index];
            if let Some(id) = fragment["id"].as_str() {
                call.0 = id.into();
            }
            let function = &fragment["function"];
            if let Some(name) = function["name"].as_str() {
                call.1 += name;
            }
            if let Some(arguments) = function["arguments"].as_str() {
                call.2 += arguments;
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.end = Some(match reason {
                "length" => End::Length,
                "tool_calls" | "function_call" => End::ToolCalls,
                _ => End::Stop,
            });
        }
        Ok(())
    }

    fn ollama_line(&mut self, line: &Value, pieces: &mut Vec<Piece>) -> Result<(), String> {
        if let Some(error) = line.get("error") {
            return Err(error_message(error));
        }
        let message = &line["message"];
        let thinking = message["thinking"].as_str().or(line["thinking"].as_str());
        let text = message["content"].as_str().or(line["response"].as_str());
        push_text(pieces, thinking, text);
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let function = &call["function"];
            let arguments = json_text(&function["arguments"]);
            let name = function["name"].as_str().unwrap_or_default().to_string();
            self.calls.push((String::new(), name, arguments));
        }
        if line["done"].as_bool() == Some(true) {
            self.end = Some(match line["done_reason"].as_str() {
                Some("length") => End::Length,
                _ => End::Stop,
            });
            self.prompt_tokens = count(&line["prompt_eval_count"]);
            self.completion_tokens = count(&line["eval_count"]);
            self.finish(pieces);
        }
        Ok(())
    }

    /// The joined calls, then the finish.
    fn finish(&mut self, pieces: &mut Vec<Piece>) {
        let calls = std::mem::take(&mut self.calls);
        let called = !calls.is_empty();
        for (index, (id, name, arguments)) in calls.into_iter().enumerate() {
            let mut call = ToolCall::new(index, name, arguments);
            if !id.is_empty() {
                call.id = id;
            }
            pieces.push(Piece::ToolCall(call));
        }
        let end = match self.end {
            _ if called => End::ToolCalls,
            Some(end) => end,
            None => End::Stop,
        };
        pieces.push(Piece::Finish(Finish {
            end,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
        }));
        self.finished = true;
    }
}

/// A chunk's thinking, then its text, each where it has some.
fn push_text(pieces: &mut Vec<Piece>, thinking: Option<&str>, text: Option<&str>) {
    if let Some(thinking) = thinking.filter(|t| !t.is_empty()) {
        pieces.push(Piece::Reasoning(thinking.into()));
    }
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        pieces.push(Piece::Text(text.into()));
    }
}

/// A JSON value as text: a string as it is (a call's arguments sent as text), anything else
/// serialized.
fn json_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn parse(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| {
        let shown: String = text.chars().take(200).collect();
        format!("the upstream sent a line that is not JSON ({e}): {shown}")
    })
}

fn count(value: &Value) -> Option<usize> {
    value.as_u64().map(|n| n as usize)
}

/// The message of an error body in OpenAI's (`{"error": {"message"}}`), Ollama's
/// (`{"error": "..."}`) or Anthropic's shape, else the body as it is.
pub fn error_message(error: &Value) -> String {
    match error.get("message").and_then(Value::as_str) {
        Some(message) => message.to_string(),
        None => json_text(error),
    }
}

#[cfg(test)]
mod tests;

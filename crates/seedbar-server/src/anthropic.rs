//! Anthropic's Messages API: `POST /v1/messages` (as Anthropic's server-sent events when
//! `stream` is set) and `POST /v1/messages/count_tokens`. A request becomes the same chat
//! prompt, sampling settings and template tools as an OpenAI chat request; the reply is
//! split into `thinking`, `text` and `tool_use` blocks by the same parsers. Errors come in
//! Anthropic's shape. As on the OpenAI routes, a `seed` field pins the reply and the
//! `x-seedbar-seed` header (and `seed` field) says which seed it used.

use std::sync::Arc;

use axum::{extract::State, response::Response, Json};
use seedbar_engine::{ChatMessage, ContentPart, ToolCall};
use seedbar_scheduler::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    common::{arguments_value, template_calls, template_tool, CommonFields},
    error::{AnthropicError, ApiError},
    extract::{null_as_default, AnthropicBody, TextOr},
    generation::{
        stream_body, Delta, Finish, Generation, Job, Reply, ServedModel, Settings, StopReason,
        Token, Translator,
    },
    images::{self, InImage},
    receipt::with_receipt,
    sse::{sse, SseMessage},
    structured::{self, forced_call, ChatInput},
    App,
};
use seedbar_grammar::ToolSchema;

// ---- requests --------------------------------------------------------------------------

/// The conversation a request holds: what `count_tokens` reads too. (The sampling fields
/// are [`CommonFields`], which have Anthropic's names.)
#[derive(Debug, Serialize, Deserialize)]
pub struct Conversation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    system: Option<TextOr<TextBlock>>,
    messages: Vec<InMessage>,
    #[serde(default, deserialize_with = "null_as_default")]
    tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice>,
}

/// What `/v1/messages` reads besides the conversation and the common fields.
#[derive(Debug, Serialize, Deserialize)]
pub struct MessagesFields {
    /// Required, as Anthropic requires it.
    max_tokens: usize,
    #[serde(default, deserialize_with = "null_as_default")]
    stop_sequences: Vec<String>,
    /// Whether a model that thinks should; absent, it does as its template says.
    thinking: Option<ThinkingConfig>,
}

/// Anthropic's `thinking`. The thinking counts toward `max_tokens`, as Anthropic's does;
/// `budget_tokens` must be below `max_tokens`, as Anthropic requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ThinkingConfig {
    Enabled { budget_tokens: usize },
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct InMessage {
    role: Role,
    content: TextOr<InBlock>,
}

/// A block that may only be text (the system prompt's, a tool result's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TextBlock {
    Text { text: String },
}

/// A block of a request's message; other types (`image`, `document`, ...) are refused with
/// the names of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<TextOr<TextBlock>>,
    },
    /// An assistant turn's thinking (clients send it back, from whichever model wrote it):
    /// the turn's `reasoning_content`, which a template that thinks keeps or leaves out as
    /// the model wants (Qwen3's keeps it only after the last user message, as Anthropic keeps
    /// it only in a tool loop); other templates leave it out.
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    RedactedThinking {},
    /// An image in a user turn, sent as base64 (Seedbar does not fetch URLs).
    Image {
        source: ImageSource,
    },
}

/// Where an `image` block's image is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

impl ImageSource {
    fn decode(&self, param: &str) -> Result<InImage, ApiError> {
        match self {
            ImageSource::Base64 { media_type, data } => {
                InImage::base64(data, Some(media_type), param)
            }
            ImageSource::Url { url } => InImage::url(url, param),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tool {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    input_schema: Value,
}

/// How the model may use the tools. `any` and `tool` force a call (by constrained decoding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto,
    None,
    Any,
    Tool { name: String },
}

/// Text blocks' text, one block a line.
fn text_of(content: TextOr<TextBlock>) -> String {
    match content {
        TextOr::Text(text) => text,
        TextOr::Items(blocks) => blocks
            .into_iter()
            .map(|TextBlock::Text { text }| text)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

impl Conversation {
    /// The chat as templates see it, the tools offered (none with `tool_choice: none`), and
    /// the call that `any` or a named `tool` forces.
    fn into_chat(self) -> Result<ChatInput, ApiError> {
        let forced_name = match &self.tool_choice {
            Some(ToolChoice::Any) => Some(None),
            Some(ToolChoice::Tool { name }) => Some(Some(name.as_str())),
            Some(ToolChoice::Auto | ToolChoice::None) | None => None,
        };
        let forced_call = forced_name
            .map(|name| {
                let declared = self.tools.iter().map(|t| ToolSchema {
                    name: t.name.clone(),
                    parameters: t.input_schema.clone(),
                });
                forced_call(declared.collect(), name)
            })
            .transpose()?;
        let tools = match self.tool_choice {
            Some(ToolChoice::None) => None,
            _ => Some(self.tools).filter(|t| !t.is_empty()),
        };
        let tools = tools.map(|tools| {
            tools
                .into_iter()
                .map(|t| template_tool(t.name, t.description, t.input_schema))
                .collect()
        });
        if self.messages.is_empty() {
            return Err(ApiError::bad_param(
                "messages",
                "messages must not be empty",
            ));
        }
        let mut chat = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = self.system.map(text_of).filter(|s| !s.is_empty()) {
            chat.push(ChatMessage::new("system", &system));
        }
        let mut images = Vec::new();
        for (index, message) in self.messages.into_iter().enumerate() {
            push_turns(index, message, &mut chat, &mut images)?;
        }
        images::check_count(&images)?;
        Ok(ChatInput {
            messages: chat,
            tools,
            forced_call,
            images,
        })
    }
}

/// A message as chat turns: its text and images (with an assistant's `tool_use` blocks as
/// the turn's tool calls), and each `tool_result` block as a `tool` turn, in block order.
fn push_turns(
    index: usize,
    message: InMessage,
    chat: &mut Vec<ChatMessage>,
    images: &mut Vec<InImage>,
) -> Result<(), ApiError> {
    let role = message.role;
    let blocks = match message.content {
        TextOr::Text(text) => {
            chat.push(ChatMessage::new(role.as_str(), &text));
            return Ok(());
        }
        TextOr::Items(blocks) => blocks,
    };
    let (mut text, mut calls, mut results) = (Vec::new(), Vec::new(), 0);
    let mut thinking: Vec<String> = Vec::new();
    for (i, block) in blocks.into_iter().enumerate() {
        match (block, role) {
            (InBlock::Text { text: t }, _) => text.push(ContentPart::Text { text: t }),
            (InBlock::Image { source }, Role::User) => {
                images.push(source.decode(&format!("messages[{index}].content[{i}].source"))?);
                text.push(ContentPart::Image);
            }
            (InBlock::ToolUse { id, name, input }, Role::Assistant) => {
                calls.push((id, name, input))
            }
            (InBlock::Thinking { thinking: t }, Role::Assistant) => thinking.push(t),
            (InBlock::RedactedThinking {}, Role::Assistant) => {}
            (
                InBlock::ToolResult {
                    tool_use_id,
                    content,
                },
                Role::User,
            ) => {
                if !text.is_empty() {
                    chat.push(turn_of("user", std::mem::take(&mut text)));
                }
                let mut turn = ChatMessage::new("tool", &content.map(text_of).unwrap_or_default());
                turn.tool_call_id = Some(tool_use_id);
                chat.push(turn);
                results += 1;
            }
            (block, _) => {
                let (kind, belongs) = match block {
                    InBlock::ToolUse { .. } => ("tool_use", "assistant"),
                    InBlock::Image { .. } => ("image", "user"),
                    InBlock::Thinking { .. } | InBlock::RedactedThinking {} => {
                        ("thinking", "assistant")
                    }
                    _ => ("tool_result", "user"),
                };
                return Err(ApiError::bad_param(
                    &format!("messages[{index}].content[{i}]"),
                    format!("{kind} blocks belong in {belongs} messages"),
                ));
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() || results == 0 {
        let mut turn = turn_of(role.as_str(), text);
        if !calls.is_empty() {
            turn.tool_calls = Some(template_calls(calls));
        }
        turn.reasoning_content = Some(thinking.join("\n")).filter(|t| !t.is_empty());
        chat.push(turn);
    }
    Ok(())
}

/// A turn of `parts`: the text blocks a line each, and the images among them.
fn turn_of(role: &str, parts: Vec<ContentPart>) -> ChatMessage {
    ChatMessage::from_parts(role, parts, "\n")
}

/// The sampling settings: the common fields' with Anthropic's required `max_tokens` and its
/// `stop_sequences`.
fn settings(common: &CommonFields, fields: MessagesFields) -> Result<Settings, ApiError> {
    let mut settings = common.settings(Some(fields.max_tokens), None)?;
    settings.stop = fields.stop_sequences;
    settings.thinking = match fields.thinking {
        None => None,
        Some(ThinkingConfig::Disabled) => Some(false),
        Some(ThinkingConfig::Enabled { budget_tokens }) if budget_tokens >= fields.max_tokens => {
            return Err(ApiError::bad_param(
                "thinking.budget_tokens",
                "thinking.budget_tokens must be less than max_tokens",
            ))
        }
        Some(ThinkingConfig::Enabled { .. }) => Some(true),
    };
    settings.validate("")?;
    Ok(settings)
}

// ---- responses -------------------------------------------------------------------------

/// `type: "message"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageType {
    Message,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    id: String,
    #[serde(rename = "type")]
    kind: MessageType,
    role: Role,
    model: String,
    content: Vec<OutBlock>,
    stop_reason: Option<MessageStop>,
    stop_sequence: Option<String>,
    usage: MessageUsage,
    /// Seedbar's: the seed the reply used.
    seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock {
    /// The model's thinking before its answer (models that think).
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum MessageStop {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct MessageUsage {
    input_tokens: usize,
    output_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCount {
    input_tokens: usize,
}

/// The events of a streamed message, each sent as `event: <type>` with itself as `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: Message,
    },
    ContentBlockStart {
        index: usize,
        content_block: OutBlock,
    },
    Ping,
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageEnd,
        usage: DeltaUsage,
    },
    MessageStop,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MessageEnd {
    stop_reason: MessageStop,
    stop_sequence: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct DeltaUsage {
    output_tokens: usize,
}

impl StreamEvent {
    fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::Ping => "ping",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }

    fn sse(&self) -> SseMessage {
        SseMessage::json(Some(self.name()), self)
    }
}

/// A parsed call's `tool_use` id: `toolu_` and the call's own id.
fn tool_use_id(call: &ToolCall) -> String {
    format!(
        "toolu_{}",
        call.id.strip_prefix("call_").unwrap_or(&call.id)
    )
}

/// A `tool_use` block for a parsed call, the input as an object.
fn tool_use(call: ToolCall) -> OutBlock {
    OutBlock::ToolUse {
        id: tool_use_id(&call),
        input: arguments_value(&call.arguments),
        name: call.name,
    }
}

/// The whole reply's blocks: its thinking, text and tool calls, in order; at least one
/// (empty) text block.
fn content_blocks(reply: &Reply) -> Vec<OutBlock> {
    let mut blocks: Vec<OutBlock> = reply
        .pieces
        .iter()
        .map(|piece| match piece {
            Delta::Reasoning(text) => OutBlock::Thinking {
                thinking: text.clone(),
                signature: signature(text),
            },
            Delta::Text(text) => OutBlock::Text { text: text.clone() },
            Delta::ToolCall(call) => tool_use(call.clone()),
        })
        .collect();
    if blocks.is_empty() {
        blocks.push(OutBlock::Text {
            text: String::new(),
        });
    }
    blocks
}

/// A streamed reply's block events, from its deltas: thinking goes into a thinking block and
/// text into a text block, each opened on demand (a thinking block ends with its
/// `signature_delta`); a tool call closes the open block and comes as a whole `tool_use`
/// block (its input as one `input_json_delta`). `ping` follows the first block's start.
#[derive(Default)]
struct BlockStream {
    /// Blocks started so far.
    started: usize,
    /// The block deltas go to now, with its text so far.
    open: Option<(OpenBlock, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Thinking,
    Text,
}

impl BlockStream {
    /// The last events of the content: the open block's stop (an empty text block when the
    /// reply had none).
    fn finish(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        if self.started == 0 {
            events.extend(self.open(OpenBlock::Text));
        }
        events.extend(self.close());
        events
    }

    fn push(&mut self, deltas: Vec<Delta>) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for delta in deltas {
            let (kind, text) = match delta {
                Delta::Text(text) | Delta::Reasoning(text) if text.is_empty() => continue,
                Delta::Text(text) => (OpenBlock::Text, text),
                Delta::Reasoning(text) => (OpenBlock::Thinking, text),
                Delta::ToolCall(call) => {
                    events.extend(self.close());
                    events.extend(self.start(OutBlock::ToolUse {
                        id: tool_use_id(&call),
                        name: call.name,
                        input: Value::Object(Default::default()),
                    }));
                    let index = self.started - 1;
                    events.push(StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::InputJson {
                            partial_json: call.arguments,
                        },
                    });
                    events.push(StreamEvent::ContentBlockStop { index });
                    continue;
                }
            };
            if self.open.as_ref().map(|(open, _)| *open) != Some(kind) {
                events.extend(self.close());
                events.extend(self.open(kind));
            }
            if let Some((_, so_far)) = self.open.as_mut() {
                so_far.push_str(&text);
            }
            let delta = match kind {
                OpenBlock::Text => BlockDelta::Text { text },
                OpenBlock::Thinking => BlockDelta::Thinking { thinking: text },
            };
            events.push(StreamEvent::ContentBlockDelta {
                index: self.started - 1,
                delta,
            });
        }
        events
    }

    /// Start a block of `kind`, empty.
    fn open(&mut self, kind: OpenBlock) -> Vec<StreamEvent> {
        self.open = Some((kind, String::new()));
        self.start(match kind {
            OpenBlock::Text => OutBlock::Text {
                text: String::new(),
            },
            OpenBlock::Thinking => OutBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            },
        })
    }

    fn start(&mut self, content_block: OutBlock) -> Vec<StreamEvent> {
        let mut events = vec![StreamEvent::ContentBlockStart {
            index: self.started,
            content_block,
        }];
        if self.started == 0 {
            events.push(StreamEvent::Ping);
        }
        self.started += 1;
        events
    }

    /// The open block's end: a thinking block's signature, then its stop.
    fn close(&mut self) -> Vec<StreamEvent> {
        let Some((kind, text)) = self.open.take() else {
            return Vec::new();
        };
        let index = self.started - 1;
        let mut events = Vec::new();
        if kind == OpenBlock::Thinking {
            events.push(StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::Signature {
                    signature: signature(&text),
                },
            });
        }
        events.push(StreamEvent::ContentBlockStop { index });
        events
    }
}

/// A thinking block's `signature`: Anthropic's clients send thinking back with it, and
/// Seedbar never needs to check it, so it is a digest of the text that names its maker.
fn signature(thinking: &str) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    thinking.hash(&mut hasher);
    format!("seedbar:{:016x}", hasher.finish())
}

/// What shapes a message: its fixed fields, and the stop sequences (to name the one that
/// matched).
struct MessageFrame {
    id: String,
    model: String,
    seed: u64,
    input_tokens: usize,
    stops: Vec<String>,
}

impl MessageFrame {
    fn new(generation: &Generation, stops: Vec<String>) -> Self {
        MessageFrame {
            id: generation.id.clone(),
            model: generation.model.clone(),
            seed: generation.seed,
            input_tokens: generation.prompt_tokens,
            stops,
        }
    }

    /// The message with `content`; `usage` counts the reply (and, from a remote engine, the
    /// prompt).
    fn message(&self, content: Vec<OutBlock>, end: Option<MessageEnd>, usage: &Usage) -> Message {
        Message {
            id: self.id.clone(),
            kind: MessageType::Message,
            role: Role::Assistant,
            model: self.model.clone(),
            content,
            stop_reason: end.as_ref().map(|e| e.stop_reason),
            stop_sequence: end.and_then(|e| e.stop_sequence),
            usage: MessageUsage {
                input_tokens: self.input_tokens.max(usage.prompt_tokens),
                output_tokens: usage.completion_tokens,
            },
            seed: self.seed,
        }
    }

    fn end(&self, reason: StopReason) -> MessageEnd {
        let (stop_reason, stop_sequence) = match reason {
            StopReason::ToolCalls => (MessageStop::ToolUse, None),
            StopReason::StopString(i) => (MessageStop::StopSequence, self.stops.get(i).cloned()),
            StopReason::Length => (MessageStop::MaxTokens, None),
            StopReason::Stop => (MessageStop::EndTurn, None),
        };
        MessageEnd {
            stop_reason,
            stop_sequence,
        }
    }
}

// ---- routes ----------------------------------------------------------------------------

pub async fn messages(
    State(app): State<Arc<App>>,
    AnthropicBody(body): AnthropicBody,
) -> Result<Response, AnthropicError> {
    let body = body.with_remote_images(app.fetches_image_urls()).await?;
    let (common, fields, conversation): (CommonFields, MessagesFields, Conversation) =
        (body.parse()?, body.parse()?, body.parse()?);
    let model = ServedModel::find(&app, &common.model).await?;
    let mut settings = settings(&common, fields)?;
    let (prompt, forced_call) = conversation.into_chat()?.into_prompt();
    let forced_call = forced_call.map(|call| (call, "tool_choice"));
    structured::constrain(&mut settings, &model, forced_call).await?;
    let stops = settings.stop.clone();
    let job = Job::new(vec![prompt], settings, "msg_");
    let generation = Generation::start(&app, model, job).await?;
    let frame = MessageFrame::new(&generation, stops);
    let receipt = generation.receipt();
    if common.stream {
        let translator = MessageStream {
            frame,
            blocks: BlockStream::default(),
        };
        return Ok(with_receipt(
            &receipt,
            sse(stream_body(generation, translator)),
        ));
    }
    let reply = generation.collect().await?.pop().unwrap_or_default();
    let end = frame.end(reply.reason());
    let message = frame.message(content_blocks(&reply), Some(end), &reply.usage());
    Ok(with_receipt(&receipt, Json(message)))
}

pub async fn count_tokens(
    State(app): State<Arc<App>>,
    AnthropicBody(body): AnthropicBody,
) -> Result<Json<TokenCount>, AnthropicError> {
    let (common, conversation): (CommonFields, Conversation) = (body.parse()?, body.parse()?);
    let model = ServedModel::find(&app, &common.model).await?;
    let (prompt, _) = conversation.into_chat()?.into_prompt();
    let prompt = prompt.tokens(model.local("counting tokens")?)?;
    Ok(Json(TokenCount {
        input_tokens: prompt.len(),
    }))
}

/// A streamed message: `message_start`, the block events, `message_delta` with the stop
/// reason and usage, `message_stop`; an `error` event when the engine fails.
struct MessageStream {
    frame: MessageFrame,
    blocks: BlockStream,
}

impl Translator for MessageStream {
    type Wire = SseMessage;

    fn start(&mut self) -> Vec<SseMessage> {
        let message = self.frame.message(Vec::new(), None, &Usage::default());
        vec![StreamEvent::MessageStart { message }.sse()]
    }

    fn token(&mut self, _: usize, token: Token) -> Vec<SseMessage> {
        self.blocks
            .push(token.deltas)
            .iter()
            .map(StreamEvent::sse)
            .collect()
    }

    fn finish(&mut self, _: usize, finish: Finish) -> Vec<SseMessage> {
        let mut events = self.blocks.push(finish.deltas);
        events.extend(self.blocks.finish());
        events.push(StreamEvent::MessageDelta {
            delta: self.frame.end(finish.reason),
            usage: DeltaUsage {
                output_tokens: finish.usage.completion_tokens,
            },
        });
        events.push(StreamEvent::MessageStop);
        events.iter().map(StreamEvent::sse).collect()
    }

    fn failed(&mut self, message: String) -> Vec<SseMessage> {
        let error = AnthropicError(ApiError::internal(message)).body();
        vec![SseMessage::json(Some("error"), &error)]
    }
}

#[cfg(test)]
mod tests;

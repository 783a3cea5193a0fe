//! Anthropic's Messages API: `POST /v1/messages` (as Anthropic's server-sent events when
//! `stream` is set) and `POST /v1/messages/count_tokens`. A request becomes the same chat
//! prompt, sampling settings and template tools as an OpenAI chat request; the reply is
//! split into `text` and `tool_use` blocks by the same tool-call parser. Errors come in
//! Anthropic's shape. As on the OpenAI routes, a `seed` field pins the reply and the
//! `x-seedbar-seed` header (and `seed` field) says which seed it used.

use std::sync::Arc;

use axum::{extract::State, response::sse::Event as SseEvent, response::Response, Json};
use seedbar_engine::{
    tool_calls::{ToolCall, ToolCallParser, ToolOutput},
    ChatMessage, FinishReason,
};
use seedbar_scheduler::Event;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc::Sender;

use crate::{
    error::{AnthropicError, ApiError},
    extract::{AnthropicBody, TextOr},
    generation::{next_or_gone, spawn_body, ChoiceEvent, Generation, Settings},
    openai::{arguments_value, sse, template_calls, template_tool, with_seed, CommonFields},
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
    #[serde(default)]
    tools: Vec<Tool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice>,
}

/// What `/v1/messages` reads besides the conversation and the common fields.
#[derive(Debug, Serialize, Deserialize)]
pub struct MessagesFields {
    /// Required, as Anthropic requires it.
    max_tokens: usize,
    #[serde(default)]
    stop_sequences: Vec<String>,
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
    /// The chat as templates see it, and the tools offered (none with `tool_choice: none`).
    /// A call that `any` or a named `tool` forces comes third.
    fn into_chat(self) -> Result<ChatInput, ApiError> {
        let forced_name = match &self.tool_choice {
            Some(ToolChoice::Any) => Some(None),
            Some(ToolChoice::Tool { name }) => Some(Some(name.as_str())),
            Some(ToolChoice::Auto | ToolChoice::None) | None => None,
        };
        let forced = forced_name
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
        for (index, message) in self.messages.into_iter().enumerate() {
            push_turns(index, message, &mut chat)?;
        }
        Ok((chat, tools, forced))
    }
}

/// A message as chat turns: its text (with an assistant's `tool_use` blocks as the turn's
/// tool calls), and each `tool_result` block as a `tool` turn, in block order.
fn push_turns(
    index: usize,
    message: InMessage,
    chat: &mut Vec<ChatMessage>,
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
    for (i, block) in blocks.into_iter().enumerate() {
        match (block, role) {
            (InBlock::Text { text: t }, _) => text.push(t),
            (InBlock::ToolUse { id, name, input }, Role::Assistant) => {
                calls.push((id, name, input))
            }
            (
                InBlock::ToolResult {
                    tool_use_id,
                    content,
                },
                Role::User,
            ) => {
                if !text.is_empty() {
                    chat.push(ChatMessage::new("user", &text.join("\n")));
                    text.clear();
                }
                let mut turn = ChatMessage::new("tool", &content.map(text_of).unwrap_or_default());
                turn.tool_call_id = Some(tool_use_id);
                chat.push(turn);
                results += 1;
            }
            (block, _) => {
                let (kind, belongs) = match block {
                    InBlock::ToolUse { .. } => ("tool_use", "assistant"),
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
        let mut turn = ChatMessage::new(role.as_str(), &text.join("\n"));
        if !calls.is_empty() {
            turn.tool_calls = Some(template_calls(calls));
        }
        chat.push(turn);
    }
    Ok(())
}

/// The sampling settings: the common fields' with Anthropic's required `max_tokens` and its
/// `stop_sequences`.
fn settings(common: &CommonFields, fields: MessagesFields) -> Result<Settings, ApiError> {
    let mut settings = common.settings(Some(fields.max_tokens), None)?;
    settings.stop = fields.stop_sequences;
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
    stop_reason: Option<StopReason>,
    stop_sequence: Option<String>,
    usage: MessageUsage,
    /// Seedbar's: the seed the reply used.
    seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock {
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
enum StopReason {
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
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MessageEnd {
    stop_reason: StopReason,
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

    fn sse(&self) -> SseEvent {
        SseEvent::default()
            .event(self.name())
            .data(serde_json::to_string(self).unwrap_or_default())
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

/// The whole reply's blocks: its text, and its tool calls when tools were offered; at least
/// one (empty) text block.
fn content_blocks(text: &str, tools: bool) -> Vec<OutBlock> {
    let outputs = if tools {
        ToolCallParser::parse(text)
    } else {
        vec![ToolOutput::Text(text.to_string())]
    };
    let mut blocks: Vec<OutBlock> = Vec::new();
    for output in outputs {
        match (output, blocks.last_mut()) {
            (ToolOutput::Text(t), Some(OutBlock::Text { text })) => text.push_str(&t),
            (ToolOutput::Text(t), _) => blocks.push(OutBlock::Text { text: t }),
            (ToolOutput::Call(call), _) => blocks.push(tool_use(call)),
        }
    }
    if blocks.is_empty() {
        blocks.push(OutBlock::Text {
            text: String::new(),
        });
    }
    blocks
}

/// A streamed reply's block events, from its text deltas: text goes into a text block
/// opened on demand; a tool call closes it and comes as a whole `tool_use` block (its input
/// as one `input_json_delta`). `ping` follows the first block's start.
struct BlockStream {
    parser: Option<ToolCallParser>,
    /// Blocks started so far.
    started: usize,
    text_open: bool,
    called: bool,
}

impl BlockStream {
    fn new(tools: bool) -> Self {
        BlockStream {
            parser: tools.then(ToolCallParser::new),
            started: 0,
            text_open: false,
            called: false,
        }
    }

    fn push(&mut self, text: &str) -> Vec<StreamEvent> {
        let outputs = match &mut self.parser {
            Some(parser) => parser.push(text),
            None => vec![ToolOutput::Text(text.to_string())],
        };
        self.events(outputs)
    }

    /// The last events of the content: held-back text, and the open block's stop (an empty
    /// text block when the reply had none).
    fn finish(&mut self) -> Vec<StreamEvent> {
        let outputs = self.parser.as_mut().map(|p| p.finish()).unwrap_or_default();
        let mut events = self.events(outputs);
        if self.started == 0 {
            events.extend(self.start(OutBlock::Text {
                text: String::new(),
            }));
            self.text_open = true;
        }
        events.extend(self.close_text());
        events
    }

    fn events(&mut self, outputs: Vec<ToolOutput>) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for output in outputs {
            match output {
                ToolOutput::Text(text) if text.is_empty() => {}
                ToolOutput::Text(text) => {
                    if !self.text_open {
                        events.extend(self.start(OutBlock::Text {
                            text: String::new(),
                        }));
                        self.text_open = true;
                    }
                    events.push(StreamEvent::ContentBlockDelta {
                        index: self.started - 1,
                        delta: BlockDelta::TextDelta { text },
                    });
                }
                ToolOutput::Call(call) => {
                    events.extend(self.close_text());
                    events.extend(self.start(OutBlock::ToolUse {
                        id: tool_use_id(&call),
                        name: call.name,
                        input: Value::Object(Default::default()),
                    }));
                    let index = self.started - 1;
                    events.push(StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::InputJsonDelta {
                            partial_json: call.arguments,
                        },
                    });
                    events.push(StreamEvent::ContentBlockStop { index });
                    self.called = true;
                }
            }
        }
        events
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

    fn close_text(&mut self) -> Option<StreamEvent> {
        std::mem::take(&mut self.text_open).then(|| StreamEvent::ContentBlockStop {
            index: self.started - 1,
        })
    }
}

/// What shapes a reply: the message's fixed fields, whether tools were offered, and the
/// stop sequences (to name the one that matched).
struct Reply {
    id: String,
    model: String,
    seed: u64,
    input_tokens: usize,
    tools: bool,
    stops: Vec<String>,
}

impl Reply {
    fn new(generation: &Generation, tools: bool, stops: Vec<String>) -> Self {
        Reply {
            id: generation.id.clone(),
            model: generation.model.card.name.clone(),
            seed: generation.seed,
            input_tokens: generation.prompt_tokens,
            tools,
            stops,
        }
    }

    fn message(&self, content: Vec<OutBlock>, end: Option<MessageEnd>, output: usize) -> Message {
        Message {
            id: self.id.clone(),
            kind: MessageType::Message,
            role: Role::Assistant,
            model: self.model.clone(),
            content,
            stop_reason: end.as_ref().map(|e| e.stop_reason),
            stop_sequence: end.and_then(|e| e.stop_sequence),
            usage: MessageUsage {
                input_tokens: self.input_tokens,
                output_tokens: output,
            },
            seed: self.seed,
        }
    }

    fn end(&self, finish: Option<FinishReason>, called: bool) -> MessageEnd {
        let (stop_reason, stop_sequence) = match finish {
            _ if called => (StopReason::ToolUse, None),
            Some(FinishReason::StopString(i)) => {
                (StopReason::StopSequence, self.stops.get(i).cloned())
            }
            Some(FinishReason::Length) => (StopReason::MaxTokens, None),
            Some(FinishReason::Stop) | None => (StopReason::EndTurn, None),
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
    let (common, fields, conversation): (CommonFields, MessagesFields, Conversation) =
        (body.parse()?, body.parse()?, body.parse()?);
    let model = app.models.get(&common.model).await?;
    let mut settings = settings(&common, fields)?;
    let (messages, tools, forced) = conversation.into_chat()?;
    if let Some(call) = forced {
        structured::constrain(&mut settings, &model, call, "tool_choice")?;
    }
    let prompt = model.chat_prompt(&messages, tools.as_deref())?;
    let stops = settings.stop.clone();
    let generation = Generation::start(
        model,
        vec![prompt],
        1,
        settings,
        app.metrics.clone(),
        "msg_",
    )?;
    let reply = Reply::new(&generation, tools.is_some(), stops);
    if common.stream {
        Ok(with_seed(
            reply.seed,
            sse(spawn_body(move |tx| stream_message(generation, reply, tx))),
        ))
    } else {
        let seed = reply.seed;
        Ok(with_seed(
            seed,
            Json(whole_message(generation, reply).await?),
        ))
    }
}

pub async fn count_tokens(
    State(app): State<Arc<App>>,
    AnthropicBody(body): AnthropicBody,
) -> Result<Json<TokenCount>, AnthropicError> {
    let (common, conversation): (CommonFields, Conversation) = (body.parse()?, body.parse()?);
    let model = app.models.get(&common.model).await?;
    let (messages, tools, _) = conversation.into_chat()?;
    let prompt = model.chat_prompt(&messages, tools.as_deref())?;
    Ok(Json(TokenCount {
        input_tokens: prompt.len(),
    }))
}

async fn whole_message(generation: Generation, reply: Reply) -> Result<Message, ApiError> {
    let choice = generation
        .collect()
        .await?
        .into_iter()
        .next()
        .unwrap_or_default();
    let content = content_blocks(&choice.text, reply.tools);
    let called = content
        .iter()
        .any(|b| matches!(b, OutBlock::ToolUse { .. }));
    let end = reply.end(choice.finish, called);
    Ok(reply.message(content, Some(end), choice.usage.completion_tokens))
}

/// Send `events`; false once the client has gone.
async fn send(tx: &Sender<SseEvent>, events: Vec<StreamEvent>) -> bool {
    for event in events {
        if tx.send(event.sse()).await.is_err() {
            return false;
        }
    }
    true
}

async fn stream_message(mut generation: Generation, reply: Reply, tx: Sender<SseEvent>) {
    let start = StreamEvent::MessageStart {
        message: reply.message(Vec::new(), None, 0),
    };
    if !send(&tx, vec![start]).await {
        return;
    }
    let mut blocks = BlockStream::new(reply.tools);
    let mut events = generation.events();
    let failure = loop {
        let Some(ChoiceEvent { event, .. }) = next_or_gone(&mut events, &tx).await else {
            break "the reply ended before it finished".to_string();
        };
        match event {
            Event::Token { text, .. } => {
                if !send(&tx, blocks.push(&text)).await {
                    return;
                }
            }
            Event::Finished {
                reason,
                usage,
                text,
            } => {
                let mut last = blocks.push(&text);
                last.extend(blocks.finish());
                last.push(StreamEvent::MessageDelta {
                    delta: reply.end(Some(reason), blocks.called),
                    usage: DeltaUsage {
                        output_tokens: usage.completion_tokens,
                    },
                });
                last.push(StreamEvent::MessageStop);
                send(&tx, last).await;
                return;
            }
            Event::Failed(message) => break message,
        }
    };
    // The engine failed (or the client went, and this goes nowhere): never a clean stop.
    let error = AnthropicError(ApiError::internal(failure)).body();
    let _ = tx
        .send(
            SseEvent::default()
                .event("error")
                .data(serde_json::to_string(&error).unwrap_or_default()),
        )
        .await;
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use serde_json::json;

    use super::*;

    fn conversation(body: Value) -> Result<ChatInput, ApiError> {
        serde_json::from_value::<Conversation>(body)
            .map_err(|e| ApiError::bad_param("body", e.to_string()))?
            .into_chat()
    }

    #[test]
    fn a_conversation_becomes_template_turns_and_tools() {
        let (chat, tools, _) = conversation(json!({
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "tools": [{"name": "weather", "description": "Weather now",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "Thanks"}]},
            ],
        }))
        .unwrap();
        let turns: Vec<(&str, &str)> = chat
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            turns,
            [
                ("system", "Be brief.\nBe kind."),
                ("user", "Weather in Paris?"),
                ("assistant", "Let me look."),
                ("tool", "sunny"),
                ("user", "Thanks"),
            ]
        );
        assert_eq!(
            chat[2].tool_calls,
            Some(json!([{"id": "toolu_1", "type": "function",
                         "function": {"name": "weather", "arguments": {"city": "Paris"}}}]))
        );
        assert_eq!(chat[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(
            tools,
            Some(vec![json!({"type": "function", "function": {
                "name": "weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})])
        );
    }

    #[test]
    fn tool_choice_none_drops_the_tools_and_any_or_tool_forces_a_call() {
        let with_choice = |choice: Value| {
            conversation(json!({
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                "tool_choice": choice,
            }))
        };
        assert!(with_choice(json!({"type": "auto"})).unwrap().1.is_some());
        assert_eq!(with_choice(json!({"type": "none"})).unwrap().1, None);
        for forced in [json!({"type": "any"}), json!({"type": "tool", "name": "f"})] {
            let (_, tools, call) = with_choice(forced).unwrap();
            assert!(tools.is_some());
            let Some(seedbar_grammar::Format::ToolCall(calls)) = call else {
                panic!("{call:?} forces no call")
            };
            assert_eq!(calls[0].name, "f");
        }
        let e = with_choice(json!({"type": "tool", "name": "g"})).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("'g'"), "{}", e.message);
        let parsed: ToolChoice =
            serde_json::from_value(json!({"type": "tool", "name": "f"})).unwrap();
        assert_eq!(parsed, ToolChoice::Tool { name: "f".into() });
    }

    #[test]
    fn misplaced_and_unknown_blocks_are_refused() {
        let e = conversation(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]}))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[1]"));
        assert!(e.message.contains("assistant messages"), "{}", e.message);
        let e = serde_json::from_value::<Conversation>(json!({"messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]}))
        .unwrap_err();
        assert!(e.to_string().contains("unknown variant `image`"), "{e}");
        assert!(conversation(json!({"messages": []})).is_err());
    }

    #[test]
    fn settings_take_max_tokens_and_stop_sequences() {
        let common: CommonFields =
            serde_json::from_value(json!({"model": "m", "temperature": 0.5, "top_k": 5})).unwrap();
        let fields: MessagesFields =
            serde_json::from_value(json!({"max_tokens": 7, "stop_sequences": ["END"]})).unwrap();
        let s = settings(&common, fields).unwrap();
        assert_eq!(
            (s.max_tokens, s.stop.as_slice(), s.sampling.top_k),
            (Some(7), ["END".to_string()].as_slice(), 5)
        );
        assert_eq!(s.sampling.temperature, 0.5);
        assert!(serde_json::from_value::<MessagesFields>(json!({})).is_err());
        let fields: MessagesFields = serde_json::from_value(json!({"max_tokens": 0})).unwrap();
        assert!(settings(&common, fields).is_err());
    }

    fn reply(tools: bool) -> Reply {
        Reply {
            id: "msg_1".into(),
            model: "m".into(),
            seed: 3,
            input_tokens: 10,
            tools,
            stops: vec!["A".into(), "B".into()],
        }
    }

    #[test]
    fn stop_reasons() {
        let r = reply(false);
        let end = |finish, called| {
            let e = r.end(finish, called);
            (e.stop_reason, e.stop_sequence)
        };
        assert_eq!(
            end(Some(FinishReason::Stop), false),
            (StopReason::EndTurn, None)
        );
        assert_eq!(
            end(Some(FinishReason::Length), false),
            (StopReason::MaxTokens, None)
        );
        assert_eq!(
            end(Some(FinishReason::StopString(1)), false),
            (StopReason::StopSequence, Some("B".into()))
        );
        assert_eq!(
            end(Some(FinishReason::Stop), true),
            (StopReason::ToolUse, None)
        );
    }

    const CALL: &str = r#"<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>"#;

    #[test]
    fn whole_replies_split_into_blocks() {
        assert_eq!(
            content_blocks("", false),
            [OutBlock::Text { text: "".into() }]
        );
        assert_eq!(
            content_blocks(CALL, false),
            [OutBlock::Text { text: CALL.into() }]
        );
        let blocks = content_blocks(&format!("Sure. {CALL}"), true);
        assert_eq!(
            blocks[0],
            OutBlock::Text {
                text: "Sure.".into()
            }
        );
        let OutBlock::ToolUse { id, name, input } = &blocks[1] else {
            panic!("{blocks:?}")
        };
        assert!(id.starts_with("toolu_") && id.len() > 10, "{id}");
        assert_eq!((name.as_str(), input), ("f", &json!({"x": 1})));
    }

    #[test]
    fn streamed_text_and_calls_become_block_events() {
        let mut blocks = BlockStream::new(true);
        let mut events = blocks.push("Hi");
        events.extend(blocks.push(" there "));
        for piece in CALL.as_bytes().chunks(7) {
            events.extend(blocks.push(std::str::from_utf8(piece).unwrap()));
        }
        events.extend(blocks.finish());
        let names: Vec<&str> = events.iter().map(StreamEvent::name).collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
            ]
        );
        assert!(blocks.called);
        assert_eq!(
            serde_json::to_value(&events[2]).unwrap(),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "Hi"}})
        );
        assert_eq!(
            serde_json::to_value(&events[6]).unwrap(),
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"x\":1}"}})
        );
        let StreamEvent::ContentBlockStart {
            index: 1,
            content_block: OutBlock::ToolUse { name, input, .. },
        } = &events[5]
        else {
            panic!("{:?}", events[5])
        };
        assert_eq!((name.as_str(), input), ("f", &json!({})));
    }

    #[test]
    fn an_empty_stream_still_has_a_text_block() {
        let mut blocks = BlockStream::new(false);
        let events = blocks.finish();
        let names: Vec<&str> = events.iter().map(StreamEvent::name).collect();
        assert_eq!(names, ["content_block_start", "ping", "content_block_stop"]);
    }

    #[test]
    fn the_message_and_its_events_have_anthropics_shape() {
        let r = reply(false);
        let end = r.end(Some(FinishReason::Length), false);
        let message = r.message(content_blocks("ok", false), Some(end.clone()), 4);
        assert_eq!(
            serde_json::to_value(&message).unwrap(),
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "ok"}], "stop_reason": "max_tokens",
                   "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 4},
                   "seed": 3})
        );
        let delta = StreamEvent::MessageDelta {
            delta: end,
            usage: DeltaUsage { output_tokens: 4 },
        };
        assert_eq!(
            serde_json::to_value(&delta).unwrap(),
            json!({"type": "message_delta",
                   "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                   "usage": {"output_tokens": 4}})
        );
        assert_eq!(
            serde_json::to_value(StreamEvent::MessageStop).unwrap(),
            json!({"type": "message_stop"})
        );
    }
}

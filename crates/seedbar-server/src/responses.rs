//! OpenAI's Responses API, stateless: `POST /v1/responses` (as OpenAI's numbered response
//! events when `stream` is set). The input items become the same chat prompt, sampling
//! settings and template tools as a chat completion; the reply is split into `reasoning`,
//! `message` and `function_call` output items by the same parsers (`output.rs`; the wire
//! shapes are `wire.rs`). Nothing is stored, so
//! `previous_response_id` is refused and `store` is ignored. A `seed` field pins the reply
//! and the `x-seedbar-seed` header (and `seed` field) says which seed it used.

use std::sync::Arc;

use axum::{extract::State, response::Response, Json};
use seedbar_engine::{ChatMessage, ContentPart};
use seedbar_scheduler::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    common::{arguments_value, template_calls, template_tool, thinking_for_effort, CommonFields},
    error::ApiError,
    extract::{null_as_default, JsonBody, TextOr},
    generation::{
        stream_body, Finish, Generation, Job, ServedModel, StopReason, Token, Translator,
    },
    images::{self, InImage},
    receipt::with_receipt,
    sse::{sse, SseMessage},
    structured::{self, forced_call, one_format, ChatInput, TextFormat},
    App,
};
use output::Output;
use seedbar_grammar::ToolSchema;
use wire::*;

// ---- requests --------------------------------------------------------------------------

/// What `/v1/responses` reads besides the common sampling fields.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResponsesRequest {
    input: TextOr<InputItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instructions: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    tools: Vec<FunctionTool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_response_id: Option<String>,
    #[serde(default, skip_serializing, deserialize_with = "null_as_default")]
    text: TextOptions,
    /// `reasoning.effort`: `none` turns a thinking model's thinking off.
    #[serde(default, skip_serializing)]
    reasoning: Option<ReasoningOptions>,
}

/// `reasoning`: how much the model thinks (`summary` is read and ignored: the thinking
/// comes whole).
#[derive(Debug, Default, Deserialize)]
struct ReasoningOptions {
    effort: Option<String>,
}

/// `text`: how the reply's text is shaped (`verbosity` is read and ignored).
#[derive(Debug, Default, Deserialize)]
struct TextOptions {
    #[serde(default)]
    format: Option<TextFormat>,
}

/// An input item. Messages may leave out `type`; which other fields an item needs depends
/// on its type (checked when it becomes a chat turn).
#[derive(Debug, Default, Serialize, Deserialize)]
struct InputItem {
    #[serde(rename = "type", default)]
    kind: ItemType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<InputRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<TextOr<InputPart>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arguments: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<TextOr<InputPart>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ItemType {
    #[default]
    Message,
    FunctionCall,
    FunctionCallOutput,
    /// An earlier reply's reasoning (clients send it back, from whichever model wrote it):
    /// opaque, and left out of the prompt.
    Reasoning,
}

impl ItemType {
    fn as_str(self) -> &'static str {
        match self {
            ItemType::Message => "message",
            ItemType::FunctionCall => "function_call",
            ItemType::FunctionCallOutput => "function_call_output",
            ItemType::Reasoning => "reasoning",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum InputRole {
    User,
    Assistant,
    System,
    Developer,
}

/// A text part of an input message (`input_text`, or `output_text` of an earlier reply).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputPart {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
    },
    /// An image as a data URL or a local file (`file_id`s are not kept here).
    InputImage {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image_url: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file_id: Option<String>,
    },
}

/// `type: "function"`: the one tool type served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionType {
    Function,
}

/// A function tool, in the Responses API's flat shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FunctionTool {
    #[serde(rename = "type")]
    kind: FunctionType,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
}

/// `auto`, `none`, `required`, or `{"type": "function", "name"}`. The last two force a
/// call (by constrained decoding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolMode),
    Function { r#type: FunctionType, name: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    Auto,
    None,
    Required,
}

/// A message's texts and images in order, the images decoded into `images`; `param` names
/// the message in errors.
fn parts_of(
    content: Option<TextOr<InputPart>>,
    images: &mut Vec<InImage>,
    param: &str,
) -> Result<Vec<ContentPart>, ApiError> {
    let parts = match content {
        None => return Ok(Vec::new()),
        Some(TextOr::Text(text)) => return Ok(vec![ContentPart::Text { text }]),
        Some(TextOr::Items(parts)) => parts,
    };
    parts
        .into_iter()
        .enumerate()
        .map(|(k, part)| match part {
            InputPart::InputText { text } | InputPart::OutputText { text } => {
                Ok(ContentPart::Text { text })
            }
            InputPart::InputImage { image_url, .. } => {
                let param = format!("{param}.content[{k}]");
                let url = image_url.ok_or_else(|| {
                    ApiError::bad_param(
                        &param,
                        "send the image as image_url (a data URL or a local path); file_id is not supported",
                    )
                })?;
                images.push(InImage::url(&url, &format!("{param}.image_url"))?);
                Ok(ContentPart::Image)
            }
        })
        .collect()
}

impl ResponsesRequest {
    /// The chat as templates see it, the tools offered (none with `tool_choice: none`), and
    /// the call that `required` or a named function forces.
    fn into_chat(self) -> Result<ChatInput, ApiError> {
        if self.previous_response_id.is_some() {
            return Err(ApiError::bad_param(
                "previous_response_id",
                "this server is stateless and keeps no responses: send the whole conversation \
                 in `input` instead of previous_response_id",
            ));
        }
        let forced_name = match &self.tool_choice {
            Some(ToolChoice::Mode(ToolMode::Required)) => Some(None),
            Some(ToolChoice::Function { name, .. }) => Some(Some(name.as_str())),
            Some(ToolChoice::Mode(ToolMode::Auto | ToolMode::None)) | None => None,
        };
        let parameters = |t: &FunctionTool| {
            t.parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}))
        };
        let forced_call = forced_name
            .map(|name| {
                let declared = self.tools.iter().map(|t| ToolSchema {
                    name: t.name.clone(),
                    parameters: parameters(t),
                });
                forced_call(declared.collect(), name)
            })
            .transpose()?;
        let tools = match self.tool_choice {
            Some(ToolChoice::Mode(ToolMode::None)) => None,
            _ => Some(self.tools).filter(|t| !t.is_empty()),
        };
        let tools = tools.map(|tools| {
            tools
                .iter()
                .map(|t| template_tool(t.name.clone(), t.description.clone(), parameters(t)))
                .collect()
        });
        let mut chat = Vec::new();
        if let Some(instructions) = self.instructions.filter(|s| !s.is_empty()) {
            chat.push(ChatMessage::new("system", &instructions));
        }
        let mut images = Vec::new();
        match self.input {
            TextOr::Text(text) => chat.push(ChatMessage::new("user", &text)),
            TextOr::Items(items) => push_items(items, &mut chat, &mut images)?,
        }
        if chat.iter().all(|m| m.role == "system") {
            return Err(ApiError::bad_param("input", "input must not be empty"));
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

/// Input items as chat turns: messages as themselves (`developer` as `system`), consecutive
/// `function_call`s as one assistant turn's tool calls (the assistant turn just before
/// them, if it has none), and each `function_call_output` as a `tool` turn.
fn push_items(
    items: Vec<InputItem>,
    chat: &mut Vec<ChatMessage>,
    images: &mut Vec<InImage>,
) -> Result<(), ApiError> {
    let mut calls = Vec::new();
    let flush = |calls: &mut Vec<(String, String, Value)>, chat: &mut Vec<ChatMessage>| {
        if calls.is_empty() {
            return;
        }
        let calls = template_calls(std::mem::take(calls));
        match chat.last_mut() {
            Some(turn) if turn.role == "assistant" && turn.tool_calls.is_none() => {
                turn.tool_calls = Some(calls)
            }
            _ => {
                let mut turn = ChatMessage::new("assistant", "");
                turn.tool_calls = Some(calls);
                chat.push(turn);
            }
        }
    };
    for (i, item) in items.into_iter().enumerate() {
        let missing = |fields: &str| {
            ApiError::bad_param(
                &format!("input[{i}]"),
                format!("{} items need {fields}", item.kind.as_str()),
            )
        };
        match item.kind {
            ItemType::Reasoning => {}
            ItemType::FunctionCall => {
                let (Some(call_id), Some(name), Some(arguments)) =
                    (&item.call_id, &item.name, &item.arguments)
                else {
                    return Err(missing("call_id, name and arguments"));
                };
                calls.push((call_id.clone(), name.clone(), arguments_value(arguments)));
            }
            ItemType::FunctionCallOutput => {
                flush(&mut calls, chat);
                let (Some(call_id), Some(_)) = (&item.call_id, &item.output) else {
                    return Err(missing("call_id and output"));
                };
                let param = format!("input[{i}].output");
                let parts = parts_of(item.output, &mut Vec::new(), &param)?;
                if parts.contains(&ContentPart::Image) {
                    return Err(ApiError::bad_param(
                        &param,
                        "images in function_call_output are not supported: send them in a user message",
                    ));
                }
                let mut turn = ChatMessage::from_parts("tool", parts, "");
                turn.tool_call_id = Some(call_id.clone());
                chat.push(turn);
            }
            ItemType::Message => {
                flush(&mut calls, chat);
                let Some(role) = item.role else {
                    return Err(missing("a role"));
                };
                let role = match role {
                    InputRole::User => "user",
                    InputRole::Assistant => "assistant",
                    InputRole::System | InputRole::Developer => "system",
                };
                let parts = parts_of(item.content, images, &format!("input[{i}]"))?;
                chat.push(ChatMessage::from_parts(role, parts, ""));
            }
        }
    }
    flush(&mut calls, chat);
    Ok(())
}

/// The response's fixed fields.
struct ResponseFrame {
    id: String,
    created_at: u64,
    model: String,
    seed: u64,
    input_tokens: usize,
}

impl ResponseFrame {
    fn new(generation: &Generation) -> Self {
        ResponseFrame {
            id: generation.id.clone(),
            created_at: generation.created,
            model: generation.model.clone(),
            seed: generation.seed,
            input_tokens: generation.prompt_tokens,
        }
    }

    /// The response while it runs, with no output yet.
    fn running(&self) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: ObjectType::Response,
            created_at: self.created_at,
            status: Status::InProgress,
            incomplete_details: None,
            error: None,
            model: self.model.clone(),
            output: Vec::new(),
            usage: None,
            seed: self.seed,
        }
    }

    /// The finished response: incomplete when `max_output_tokens` cut its text short;
    /// `usage` counts what was generated, `reasoning_tokens` of it thinking.
    fn finished(
        &self,
        output: Vec<OutputItem>,
        reason: StopReason,
        usage: &Usage,
        reasoning_tokens: usize,
    ) -> ResponseObject {
        let cut = reason == StopReason::Length;
        let tokens = usage.completion_tokens;
        // A remote engine counts the prompt in its usage.
        let input_tokens = self.input_tokens.max(usage.prompt_tokens);
        ResponseObject {
            status: if cut {
                Status::Incomplete
            } else {
                Status::Completed
            },
            incomplete_details: cut.then_some(IncompleteDetails {
                reason: IncompleteReason::MaxOutputTokens,
            }),
            output,
            usage: Some(ResponseUsage {
                input_tokens,
                output_tokens: tokens,
                total_tokens: input_tokens + tokens,
                output_tokens_details: OutputTokensDetails { reasoning_tokens },
            }),
            ..self.running()
        }
    }

    fn failed(&self, message: String) -> ResponseObject {
        ResponseObject {
            status: Status::Failed,
            error: Some(ResponseError {
                code: "server_error".into(),
                message,
            }),
            ..self.running()
        }
    }
}

// ---- the route -------------------------------------------------------------------------

pub async fn responses(State(app): State<Arc<App>>, body: JsonBody) -> Result<Response, ApiError> {
    let body = body.with_remote_images(app.fetches_image_urls()).await?;
    let (common, req): (CommonFields, ResponsesRequest) = (body.parse()?, body.parse()?);
    let model = ServedModel::find(&app, &common.model).await?;
    let mut settings = common.settings(req.max_output_tokens, None)?;
    settings.thinking = req
        .reasoning
        .as_ref()
        .and_then(|r| r.effort.as_deref())
        .map(|effort| thinking_for_effort(effort, "reasoning.effort"))
        .transpose()?;
    let reply_format = req.text.format.as_ref().and_then(TextFormat::format);
    let (prompt, forced_call) = req.into_chat()?.into_prompt();
    let format = one_format(forced_call, reply_format, "text.format")?;
    structured::constrain(&mut settings, &model, format).await?;
    let job = Job::new(vec![prompt], settings, "resp_");
    let generation = Generation::start(&app, model, job).await?;
    let frame = ResponseFrame::new(&generation);
    let receipt = generation.receipt();
    if common.stream {
        let translator = ResponseStream {
            output: Output::new(&frame.id),
            frame,
            sequence_number: 0,
        };
        return Ok(with_receipt(
            &receipt,
            sse(stream_body(generation, translator)),
        ));
    }
    let reply = generation.collect().await?.pop().unwrap_or_default();
    let mut output = Output::new(&frame.id);
    output.push(reply.pieces.clone());
    output.finish();
    let response = frame.finished(
        output.items,
        reply.reason(),
        &reply.usage(),
        reply.reasoning_tokens,
    );
    Ok(with_receipt(&receipt, Json(response)))
}

/// A streamed response: `response.created` and `response.in_progress`, the item events,
/// then `response.completed` or `response.incomplete`; `response.failed` when the engine
/// fails. Every event carries its `sequence_number`.
struct ResponseStream {
    frame: ResponseFrame,
    output: Output,
    sequence_number: u64,
}

impl ResponseStream {
    fn numbered(&mut self, events: Vec<StreamEvent>) -> Vec<SseMessage> {
        events
            .into_iter()
            .map(|event| {
                let numbered = Numbered {
                    sequence_number: self.sequence_number,
                    event,
                };
                self.sequence_number += 1;
                let name = numbered.event.name();
                SseMessage::json(Some(name), &numbered)
            })
            .collect()
    }
}

impl Translator for ResponseStream {
    type Wire = SseMessage;

    fn start(&mut self) -> Vec<SseMessage> {
        let created = StreamEvent::Created {
            response: self.frame.running(),
        };
        let in_progress = StreamEvent::InProgress {
            response: self.frame.running(),
        };
        self.numbered(vec![created, in_progress])
    }

    fn token(&mut self, _: usize, token: Token) -> Vec<SseMessage> {
        let events = self.output.push(token.deltas);
        self.numbered(events)
    }

    fn finish(&mut self, _: usize, finish: Finish) -> Vec<SseMessage> {
        let mut events = self.output.push(finish.deltas);
        events.extend(self.output.finish());
        let items = std::mem::take(&mut self.output.items);
        let response =
            self.frame
                .finished(items, finish.reason, &finish.usage, finish.reasoning_tokens);
        events.push(if response.status == Status::Incomplete {
            StreamEvent::Incomplete { response }
        } else {
            StreamEvent::Completed { response }
        });
        self.numbered(events)
    }

    fn failed(&mut self, message: String) -> Vec<SseMessage> {
        let response = self.frame.failed(message);
        self.numbered(vec![StreamEvent::Failed { response }])
    }
}

mod output;
#[cfg(test)]
mod tests;
mod wire;

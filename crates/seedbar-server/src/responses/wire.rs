//! The Responses API's wire shapes: the response object, its output items and parts, and
//! the numbered stream events, as OpenAI's clients parse them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ObjectType {
    Response,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResponseObject {
    pub(crate) id: String,
    pub(crate) object: ObjectType,
    pub(crate) created_at: u64,
    pub(crate) status: Status,
    pub(crate) incomplete_details: Option<IncompleteDetails>,
    pub(crate) error: Option<ResponseError>,
    pub(crate) model: String,
    pub(crate) output: Vec<OutputItem>,
    pub(crate) usage: Option<ResponseUsage>,
    /// Seedbar's: the seed the reply used.
    pub(crate) seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum IncompleteReason {
    MaxOutputTokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IncompleteDetails {
    pub(crate) reason: IncompleteReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResponseError {
    pub(crate) code: String,
    pub(crate) message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResponseUsage {
    pub(crate) input_tokens: usize,
    pub(crate) output_tokens: usize,
    pub(crate) total_tokens: usize,
    pub(crate) output_tokens_details: OutputTokensDetails,
}

/// Of the output tokens, those of the reply's thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OutputTokensDetails {
    pub(crate) reasoning_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AssistantRole {
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    /// The model's thinking before its answer (models that think), as `reasoning_text`.
    Reasoning {
        id: String,
        /// Always empty: the thinking is given whole, not summarized.
        summary: Vec<Value>,
        content: Vec<OutputPart>,
        status: Status,
    },
    Message {
        id: String,
        status: Status,
        role: AssistantRole,
        content: Vec<OutputPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: Status,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputPart {
    OutputText {
        text: String,
        /// Always empty: no citations.
        annotations: Vec<Value>,
    },
    ReasoningText {
        text: String,
    },
}

pub(crate) fn output_text(text: String) -> OutputPart {
    OutputPart::OutputText {
        text,
        annotations: Vec::new(),
    }
}

/// The events of a streamed response, each sent with its `sequence_number`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub(crate) enum StreamEvent {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputPart,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.content_part.done")]
    PartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputPart,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: String,
        output_index: usize,
        arguments: String,
    },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: ResponseObject },
}

impl StreamEvent {
    /// The event's `type` (also its SSE name).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::ItemAdded { .. } => "response.output_item.added",
            StreamEvent::PartAdded { .. } => "response.content_part.added",
            StreamEvent::TextDelta { .. } => "response.output_text.delta",
            StreamEvent::TextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningDelta { .. } => "response.reasoning_text.delta",
            StreamEvent::ReasoningDone { .. } => "response.reasoning_text.done",
            StreamEvent::PartDone { .. } => "response.content_part.done",
            StreamEvent::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            StreamEvent::ArgumentsDone { .. } => "response.function_call_arguments.done",
            StreamEvent::ItemDone { .. } => "response.output_item.done",
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
            StreamEvent::Failed { .. } => "response.failed",
        }
    }
}

/// An event as sent: with its place in the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Numbered {
    pub(crate) sequence_number: u64,
    #[serde(flatten)]
    pub(crate) event: StreamEvent,
}

//! A reply's Responses output items, built from the generation service's neutral deltas
//! together with the stream events that announce them.

use seedbar_engine::ToolCall;

use crate::generation::Delta;

use super::wire::{output_text, AssistantRole, OutputItem, OutputPart, Status, StreamEvent};

/// A reply's output items from its deltas, with the events that build them: thinking goes
/// into a `reasoning` item and text into a `message` item, each opened on demand; a tool call
/// closes the open item and comes as a whole `function_call` item. A non-streamed response
/// is the same items.
pub(crate) struct Output {
    /// Item ids: `rs_` / `msg_` / `fc_`, this, and the item's index.
    id_stem: String,
    pub(crate) items: Vec<OutputItem>,
    /// The open item: its kind, id and text so far.
    open: Option<(Open, String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

impl Open {
    /// The item's content part holding `text`.
    fn part(self, text: String) -> OutputPart {
        match self {
            Open::Reasoning => OutputPart::ReasoningText { text },
            Open::Message => output_text(text),
        }
    }

    /// The item, `status`, holding `text`.
    fn item(self, id: String, status: Status, text: Option<String>) -> OutputItem {
        let content = text.map(|text| vec![self.part(text)]).unwrap_or_default();
        match self {
            Open::Reasoning => OutputItem::Reasoning {
                id,
                summary: Vec::new(),
                content,
                status,
            },
            Open::Message => OutputItem::Message {
                id,
                status,
                role: AssistantRole::Assistant,
                content,
            },
        }
    }
}

impl Output {
    pub(crate) fn new(response_id: &str) -> Self {
        Output {
            id_stem: response_id
                .strip_prefix("resp_")
                .unwrap_or(response_id)
                .to_string(),
            items: Vec::new(),
            open: None,
        }
    }

    /// The last events: the open item's end (an empty message item when the reply had
    /// none).
    pub(crate) fn finish(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        if self.items.is_empty() && self.open.is_none() {
            events.extend(self.open(Open::Message));
        }
        events.extend(self.close());
        events
    }

    pub(crate) fn push(&mut self, deltas: Vec<Delta>) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for delta in deltas {
            let (kind, delta) = match delta {
                Delta::Text(delta) | Delta::Reasoning(delta) if delta.is_empty() => continue,
                Delta::Text(delta) => (Open::Message, delta),
                Delta::Reasoning(delta) => (Open::Reasoning, delta),
                Delta::ToolCall(call) => {
                    events.extend(self.close());
                    events.extend(self.call(call));
                    continue;
                }
            };
            if self.open.as_ref().map(|(open, ..)| *open) != Some(kind) {
                events.extend(self.close());
                events.extend(self.open(kind));
            }
            let output_index = self.items.len();
            if let Some((_, id, text)) = &mut self.open {
                text.push_str(&delta);
                let item_id = id.clone();
                events.push(match kind {
                    Open::Message => StreamEvent::TextDelta {
                        item_id,
                        output_index,
                        content_index: 0,
                        delta,
                    },
                    Open::Reasoning => StreamEvent::ReasoningDelta {
                        item_id,
                        output_index,
                        content_index: 0,
                        delta,
                    },
                });
            }
        }
        events
    }

    /// A whole `function_call` item's events.
    fn call(&mut self, call: ToolCall) -> Vec<StreamEvent> {
        let output_index = self.items.len();
        let id = format!("fc_{}_{output_index}", self.id_stem);
        let item = |arguments: &str, status| OutputItem::FunctionCall {
            id: id.clone(),
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments.to_string(),
            status,
        };
        let done = item(&call.arguments, Status::Completed);
        self.items.push(done.clone());
        vec![
            StreamEvent::ItemAdded {
                output_index,
                item: item("", Status::InProgress),
            },
            StreamEvent::ArgumentsDelta {
                item_id: id.clone(),
                output_index,
                delta: call.arguments.clone(),
            },
            StreamEvent::ArgumentsDone {
                item_id: id.clone(),
                output_index,
                arguments: call.arguments.clone(),
            },
            StreamEvent::ItemDone {
                output_index,
                item: done,
            },
        ]
    }

    fn open(&mut self, kind: Open) -> [StreamEvent; 2] {
        let output_index = self.items.len();
        let prefix = match kind {
            Open::Reasoning => "rs",
            Open::Message => "msg",
        };
        let id = format!("{prefix}_{}_{output_index}", self.id_stem);
        self.open = Some((kind, id.clone(), String::new()));
        [
            StreamEvent::ItemAdded {
                output_index,
                item: kind.item(id.clone(), Status::InProgress, None),
            },
            StreamEvent::PartAdded {
                item_id: id,
                output_index,
                content_index: 0,
                part: kind.part(String::new()),
            },
        ]
    }

    fn close(&mut self) -> Vec<StreamEvent> {
        let Some((kind, id, text)) = self.open.take() else {
            return Vec::new();
        };
        let output_index = self.items.len();
        let item = kind.item(id.clone(), Status::Completed, Some(text.clone()));
        self.items.push(item.clone());
        let done = match kind {
            Open::Message => StreamEvent::TextDone {
                item_id: id.clone(),
                output_index,
                content_index: 0,
                text: text.clone(),
            },
            Open::Reasoning => StreamEvent::ReasoningDone {
                item_id: id.clone(),
                output_index,
                content_index: 0,
                text: text.clone(),
            },
        };
        vec![
            done,
            StreamEvent::PartDone {
                item_id: id,
                output_index,
                content_index: 0,
                part: kind.part(text),
            },
            StreamEvent::ItemDone { output_index, item },
        ]
    }
}

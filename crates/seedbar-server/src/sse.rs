//! What every generating route answers with: server-sent events from a translator's
//! messages (the headers carrying a reply's receipt are `receipt.rs`'s).

use std::convert::Infallible;

use axum::response::{
    sse::{Event as SseEvent, KeepAlive, Sse},
    IntoResponse, Response,
};
use futures_util::StreamExt;
use serde::Serialize;

/// A server-sent event as a translator writes it: its name (where the protocol names
/// events) and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseMessage {
    pub name: Option<String>,
    pub data: String,
}

impl SseMessage {
    pub fn json(name: Option<&str>, value: &impl Serialize) -> Self {
        SseMessage {
            name: name.map(str::to_string),
            data: serde_json::to_string(value).unwrap_or_default(),
        }
    }
}

pub(crate) fn sse(
    events: impl futures_util::Stream<Item = SseMessage> + Send + 'static,
) -> Response {
    let events = events.map(|message| {
        // The name goes first: clients read `event:` as naming the `data:` after it.
        let event = match message.name {
            Some(name) => SseEvent::default().event(name),
            None => SseEvent::default(),
        };
        Ok::<_, Infallible>(event.data(message.data))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

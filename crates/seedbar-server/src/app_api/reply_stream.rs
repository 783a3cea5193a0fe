//! A chat reply's stream to the app (docs/app-api.md): the generation service's neutral
//! events as [`ReplyEvent`]s, the thinking and the text gathered and checkpointed in the
//! store while they stream, and the stored reply once it ends however it ends.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use seedbar_chats::{Message, ReplyText, Status};
use serde::Serialize;
use tokio::sync::mpsc::Sender;

use super::db::db;
use crate::{
    generation::{drive, Delta, Ending, Finish, Generation, Token, Translator},
    sse::SseMessage,
    App,
};

/// How often a streaming reply's text is written to the store, so that a killed process
/// keeps what the user saw.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// The events of a reply's stream (docs/app-api.md).
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ReplyEvent {
    /// The user's message as stored (not on regenerate).
    User {
        message: Message,
    },
    Start {
        message_id: i64,
        seed: Option<u64>,
    },
    /// A piece of the model's thinking (models that think), before any `delta`.
    Reasoning {
        text: String,
    },
    Delta {
        text: String,
    },
    /// The reply as stored, complete.
    Done {
        message: Message,
    },
    Error {
        message: String,
    },
}

impl ReplyEvent {
    fn sse(&self) -> SseMessage {
        SseMessage::json(None, self)
    }
}

/// A reply's events from the neutral ones: its thinking and text as events, gathered for the
/// store (with how long the thinking took) and checkpointed there twice a second; the stored
/// message's events come after the loop.
struct ReplyStream {
    app: Arc<App>,
    first: Vec<ReplyEvent>,
    reply_id: i64,
    written: ReplyText,
    /// When the thinking started, while it goes on.
    thinking_since: Option<Instant>,
    /// When the store last got the reply, and how many bytes it had then.
    checkpointed: (Instant, usize),
}

impl ReplyStream {
    fn delta(&mut self, deltas: Vec<Delta>) -> Vec<SseMessage> {
        let mut events = Vec::new();
        for delta in deltas {
            match delta {
                Delta::Reasoning(text) if !text.is_empty() => {
                    self.thinking_since.get_or_insert_with(Instant::now);
                    self.written.reasoning.push_str(&text);
                    events.push(ReplyEvent::Reasoning { text }.sse());
                }
                Delta::Text(text) if !text.is_empty() => {
                    self.stop_thinking();
                    self.written.content.push_str(&text);
                    events.push(ReplyEvent::Delta { text }.sse());
                }
                _ => {}
            }
        }
        self.checkpoint();
        events
    }

    /// The thinking is over: note how long it took.
    fn stop_thinking(&mut self) {
        if let Some(since) = self.thinking_since.take() {
            self.written.reasoning_ms = Some(since.elapsed().as_millis() as u64);
        }
    }

    fn written_bytes(&self) -> usize {
        self.written.content.len() + self.written.reasoning.len()
    }

    /// Write the reply so far to the store when it grew and the last write is old enough.
    /// A late write cannot undo the final one: it only touches a reply still streaming.
    fn checkpoint(&mut self) {
        let (at, length) = self.checkpointed;
        if length >= self.written_bytes() || at.elapsed() < CHECKPOINT_EVERY {
            return;
        }
        self.checkpointed = (Instant::now(), self.written_bytes());
        let (app, id, partial) = (self.app.clone(), self.reply_id, self.written.clone());
        tokio::spawn(async move {
            if let Err(e) = db(&app, move |s| s.checkpoint_reply(id, &partial)).await {
                tracing::warn!(error = %e.message, "cannot checkpoint a streaming reply");
            }
        });
    }
}

impl Translator for ReplyStream {
    type Wire = SseMessage;

    fn start(&mut self) -> Vec<SseMessage> {
        std::mem::take(&mut self.first)
            .iter()
            .map(ReplyEvent::sse)
            .collect()
    }

    fn token(&mut self, _: usize, token: Token) -> Vec<SseMessage> {
        self.delta(token.deltas)
    }

    fn finish(&mut self, _: usize, finish: Finish) -> Vec<SseMessage> {
        self.delta(finish.deltas)
    }

    fn failed(&mut self, _: String) -> Vec<SseMessage> {
        Vec::new()
    }
}

/// Send the reply's events, storing what it wrote once it ends however it ends.
pub(super) async fn stream_reply(
    app: Arc<App>,
    generation: Generation,
    user: Option<Message>,
    reply: Message,
    tx: Sender<SseMessage>,
) {
    let start = ReplyEvent::Start {
        message_id: reply.id,
        seed: reply.seed,
    };
    let mut stream = ReplyStream {
        app: app.clone(),
        first: user
            .map(|message| ReplyEvent::User { message })
            .into_iter()
            .chain([start])
            .collect(),
        reply_id: reply.id,
        written: ReplyText::default(),
        thinking_since: None,
        checkpointed: (Instant::now(), 0),
    };
    let ending = drive(generation, &mut stream, &tx).await;
    let status = match ending {
        Ending::Complete => Status::Complete,
        Ending::ClientGone => Status::Stopped,
        Ending::Failed(_) => Status::Error,
    };
    stream.stop_thinking();
    let written = stream.written;
    let stored = db(&app, move |s| s.finish_message(reply.id, &written, status)).await;
    let last = match (ending, stored) {
        (_, Err(e)) => ReplyEvent::Error { message: e.message },
        (Ending::Failed(message), Ok(_)) => ReplyEvent::Error { message },
        (Ending::Complete, Ok(message)) => ReplyEvent::Done { message },
        (Ending::ClientGone, Ok(_)) => return,
    };
    let _ = tx.send(last.sse()).await;
}

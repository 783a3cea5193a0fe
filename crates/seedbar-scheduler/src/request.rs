//! What callers hand the scheduler and what streams back.

use std::sync::Arc;

use seedbar_engine::{FinishReason, SamplingParams};
use seedbar_grammar::Constraint;
use seedbar_images::Pixels;
use tokio::sync::mpsc::UnboundedReceiver;

/// One generation request over already-tokenized input.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// `sampling.seed` is ignored: the seed comes from `seed`.
    pub sampling: SamplingParams,
    /// The seed to sample with; `None` draws one from OS entropy (reported on the stream).
    pub seed: Option<u64>,
    pub max_tokens: usize,
    /// Strings that end the reply; matched across token boundaries and not emitted.
    pub stop: Vec<String>,
    /// Report log-probabilities, with this many top alternatives per token.
    pub logprobs: Option<usize>,
    /// The output format the reply must follow (structured outputs): each draw sees only
    /// the tokens it allows.
    pub constraint: Option<Constraint>,
    /// Keep this row's numbers through every step (diagnostics: `SchedulerStats::traces`).
    pub trace: bool,
    /// Let the row draft tokens by prompt lookup where the scheduler speculates
    /// ([`SchedulerConfig::speculative`](crate::SchedulerConfig::speculative)): the reply is
    /// the same either way, only its speed differs.
    pub speculative: bool,
    /// The images whose soft tokens `prompt` holds (a vision model's), in order.
    pub images: Vec<PromptImage>,
}

/// An image in a request's prompt.
#[derive(Debug, Clone)]
pub struct PromptImage {
    /// Where its soft tokens start in the prompt.
    pub at: usize,
    /// Its encoded bytes' digest (`seedbar_images::digest`): the prefix caches key its
    /// tokens by it.
    pub digest: [u8; 32],
    /// What the model's tower takes (shared: choices of one request share their images).
    pub pixels: Arc<Pixels>,
}

impl Request {
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling: SamplingParams::default(),
            seed: None,
            max_tokens,
            stop: Vec::new(),
            logprobs: None,
            constraint: None,
            trace: false,
            speculative: true,
            images: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The most likely tokens at this position, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A sampled token and the text it completes (may be empty while a character or a
    /// possible stop string is incomplete).
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The end; `text` is any text that was held back until now.
    Finished {
        reason: FinishReason,
        usage: Usage,
        text: String,
    },
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting); try again shortly")]
    QueueFull(usize),
    #[error("the prompt has {prompt} tokens; this model's context holds {limit}")]
    PromptTooLong { prompt: usize, limit: usize },
    #[error("{0}")]
    Invalid(String),
    #[error("the engine has stopped")]
    Stopped,
}

impl Event {
    /// `Finished` and `Failed` end a request's events.
    pub fn ends(&self) -> bool {
        !matches!(self, Event::Token { .. })
    }
}

/// What a stream reports when its events stop without `Finished` or `Failed` (the engine
/// thread died): a request never ends as if it had succeeded.
const ENGINE_LOST: &str = "the engine stopped before the reply finished";

/// Events of one request, always ending with `Finished` or `Failed`. Dropping it cancels
/// the request and frees its row.
pub struct RequestStream {
    pub id: u64,
    pub seed: u64,
    pub(crate) events: UnboundedReceiver<Event>,
    pub(crate) cancel: Box<dyn Fn() + Send + Sync>,
    pub(crate) ended: bool,
}

impl RequestStream {
    pub async fn next(&mut self) -> Option<Event> {
        let event = self.events.recv().await;
        self.track(event)
    }

    /// For synchronous callers (the CLI, tests); never call from inside an async runtime.
    pub fn blocking_next(&mut self) -> Option<Event> {
        let event = self.events.blocking_recv();
        self.track(event)
    }

    /// Turn a channel that closed before the last event into `Failed`.
    fn track(&mut self, event: Option<Event>) -> Option<Event> {
        if self.ended {
            return None;
        }
        let event = event.unwrap_or_else(|| Event::Failed(ENGINE_LOST.into()));
        self.ended = event.ends();
        Some(event)
    }

    pub fn cancel(&self) {
        (self.cancel)()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        (self.cancel)()
    }
}

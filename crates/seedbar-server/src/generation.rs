//! One API request on one model: its choices become scheduler requests (choice `k` sampled
//! with `seed + k`, so each is reproducible on its own), their events merge into one
//! stream, and time-to-first-token / inter-token latency go into the metrics.

use std::{
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    time::Instant,
};

use futures_util::{stream, Stream, StreamExt};
use seedbar_engine::{FinishReason, SamplingParams};
use seedbar_grammar::Constraint;
use seedbar_scheduler::{draw_seed, Event, Request, RequestStream, TokenLogprob, Usage};

use crate::{error::ApiError, metrics::Metrics, models::LoadedModel};

/// Stop strings a request may give (OpenAI allows 4; editors' autocomplete sends ~10).
pub const MAX_STOP_STRINGS: usize = 16;
/// Bytes in one stop string.
pub const MAX_STOP_BYTES: usize = 256;

/// Sampling settings as an API request gives them, before prompts are known.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub sampling: SamplingParams,
    pub seed: Option<u64>,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    /// The output format every choice must follow, fresh (see `structured`).
    pub constraint: Option<Constraint>,
}

impl Settings {
    /// Range checks, naming the parameter (with `prefix`, e.g. `options.` for Ollama).
    pub fn validate(&self, prefix: &str) -> Result<(), ApiError> {
        self.sampling
            .validate()
            .map_err(|e| ApiError::bad_param(&format!("{prefix}{}", e.param), e.message))?;
        if self.max_tokens == Some(0) {
            return Err(ApiError::bad_param(
                &format!("{prefix}max_tokens"),
                "max_tokens must be at least 1",
            ));
        }
        if self.stop.len() > MAX_STOP_STRINGS
            || self
                .stop
                .iter()
                .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(ApiError::bad_param(
                &format!("{prefix}stop"),
                format!("up to {MAX_STOP_STRINGS} stop strings, each 1 to {MAX_STOP_BYTES} bytes"),
            ));
        }
        if self.logprobs.is_some_and(|n| n > 20) {
            return Err(ApiError::bad_param(
                &format!("{prefix}top_logprobs"),
                "at most 20 alternatives per token",
            ));
        }
        Ok(())
    }
}

/// A choice's event, tagged with its index.
pub struct ChoiceEvent {
    pub index: usize,
    pub event: Event,
}

/// A running request.
pub struct Generation {
    pub model: Arc<LoadedModel>,
    pub seed: u64,
    pub prompt_tokens: usize,
    pub id: String,
    pub created: u64,
    streams: Vec<RequestStream>,
    metrics: Arc<Metrics>,
    started: Instant,
}

impl Generation {
    /// Submit `n` choices for each prompt; choice `k` (prompt-major) uses `seed + k`. The
    /// id is `id_prefix` and 13 hex digits.
    pub fn start(
        model: Arc<LoadedModel>,
        prompts: Vec<Vec<u32>>,
        n: usize,
        settings: Settings,
        metrics: Arc<Metrics>,
        id_prefix: &str,
    ) -> Result<Self, ApiError> {
        let started = Instant::now();
        let seed = settings.seed.unwrap_or_else(draw_seed);
        let mut streams = Vec::with_capacity(prompts.len() * n);
        let prompt_tokens = prompts.iter().map(Vec::len).sum();
        for prompt in prompts {
            for _ in 0..n {
                let request = Request {
                    prompt: prompt.clone(),
                    sampling: settings.sampling.clone(),
                    seed: Some(seed.wrapping_add(streams.len() as u64)),
                    max_tokens: settings.max_tokens.unwrap_or(usize::MAX),
                    stop: settings.stop.clone(),
                    logprobs: settings.logprobs,
                    constraint: settings.constraint.clone(),
                };
                // On an error the streams already submitted are dropped, which cancels them.
                streams.push(model.scheduler.submit(request)?);
            }
        }
        metrics
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        Ok(Generation {
            id: format!("{id_prefix}{:013x}", draw_seed()),
            created: crate::models::now(),
            model,
            seed,
            prompt_tokens,
            streams,
            metrics,
            started,
        })
    }

    pub fn choices(&self) -> usize {
        self.streams.len()
    }

    /// Every choice's events as they come. Dropping the stream cancels what still runs.
    pub fn events(&mut self) -> Pin<Box<dyn Stream<Item = ChoiceEvent> + Send>> {
        let streams = std::mem::take(&mut self.streams);
        let (metrics, started) = (self.metrics.clone(), self.started);
        let per_choice = streams.into_iter().enumerate().map(move |(index, events)| {
            let metrics = metrics.clone();
            stream::unfold(
                (events, None::<Instant>),
                move |(mut events, last_token)| {
                    let metrics = metrics.clone();
                    async move {
                        let event = events.next().await?;
                        let mut last = last_token;
                        if let Event::Token { .. } = event {
                            let now = Instant::now();
                            match last {
                                None => metrics.time_to_first_token.observe(now - started),
                                Some(before) => metrics.inter_token_latency.observe(now - before),
                            }
                            metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
                            last = Some(now);
                        }
                        Some((ChoiceEvent { index, event }, (events, last)))
                    }
                },
            )
            .boxed()
        });
        stream::select_all(per_choice).boxed()
    }

    /// Run to the end and gather each choice (non-streaming responses).
    pub async fn collect(mut self) -> Result<Vec<Choice>, ApiError> {
        let mut choices: Vec<Choice> = (0..self.choices()).map(|_| Choice::default()).collect();
        let mut events = self.events();
        while let Some(ChoiceEvent { index, event }) = events.next().await {
            let choice = &mut choices[index];
            match event {
                Event::Token { id, text, logprob } => {
                    choice.text.push_str(&text);
                    choice.tokens.push((id, text, logprob));
                }
                Event::Finished {
                    reason,
                    usage,
                    text,
                } => {
                    choice.text.push_str(&text);
                    choice.finish = Some(reason);
                    choice.usage = usage;
                }
                Event::Failed(message) => return Err(ApiError::internal(message)),
            }
        }
        Ok(choices)
    }
}

/// One finished choice.
#[derive(Debug, Default)]
pub struct Choice {
    pub text: String,
    /// Each token with the text it released and its log-probabilities.
    pub tokens: Vec<(u32, String, Option<TokenLogprob>)>,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
}

/// A response body fed by `produce` on its own task. When the client goes away the
/// receiver is dropped, `produce` sees its sender closed and returns, and dropping its
/// `Generation` cancels the requests and frees their rows.
pub fn spawn_body<T, F>(
    produce: impl FnOnce(tokio::sync::mpsc::Sender<T>) -> F,
) -> impl Stream<Item = T>
where
    T: Send + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(produce(tx));
    stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// The next event of `events`, or `None` once the client has gone or the events end.
pub async fn next_or_gone<T>(
    events: &mut Pin<Box<dyn Stream<Item = ChoiceEvent> + Send>>,
    client: &tokio::sync::mpsc::Sender<T>,
) -> Option<ChoiceEvent> {
    tokio::select! {
        _ = client.closed() => None,
        event = events.next() => event,
    }
}

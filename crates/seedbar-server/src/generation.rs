//! The protocol-neutral generation service under every protocol (OpenAI, Ollama, Anthropic,
//! Responses, the app's replies): model lookup, prompt building (chat template with tools,
//! fill-in-the-middle, raw text, token ids run as given), the structured-output constraint
//! (compiled by `structured`), the choices as scheduler requests (choice `k` sampled with
//! `seed + k`, so each is reproducible on its own), thinking kept apart from the answer
//! (models whose template thinks), tool-call parsing, the finish-reason rule,
//! usage and timings; a remote model's choices are asked of its engine (`remote`), a local
//! one's of its scheduler (`local`). A running [`Generation`] yields neutral [`Event`]s per choice; the one
//! streaming loop, [`drive`], feeds them to a protocol's [`Translator`], and
//! [`Generation::collect`] folds them into whole [`Reply`]s for non-streamed responses.

mod local;
mod remote;

use std::{
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use futures_util::{stream, Stream, StreamExt};
use seedbar_engine::{
    ChatMessage, ChatPrompt, FinishReason, SamplingParams, TemplateKwargs, ToolCall,
};
use seedbar_grammar::{Constraint, Format};
use seedbar_scheduler::{draw_seed, PromptImage, Usage};
use serde_json::Value;
use tokio::sync::mpsc::Sender;

use crate::{
    error::ApiError,
    images::{self, InImage},
    metrics::Metrics,
    model_host::{LoadedModel, RemoteModel},
    receipt::{Provenance, Receipt},
    App,
};

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
    /// The output format every choice must follow, fresh (see `structured`): compiled for
    /// a local model's vocabulary...
    pub constraint: Option<Constraint>,
    /// ...and as asked, which a remote model's engine is sent.
    pub format: Option<Format>,
    /// `Some(false)` turns speculative decoding off for this request (Seedbar's
    /// `speculative` field); the reply is the same either way.
    pub speculative: Option<bool>,
    /// Whether a model that thinks should (`reasoning_effort`, Anthropic `thinking`, Ollama
    /// `think`): the template's `enable_thinking` where it reads one; `None` leaves the
    /// template's default.
    pub thinking: Option<bool>,
    /// Values for the chat template beside the messages (`chat_template_kwargs`).
    pub template_kwargs: TemplateKwargs,
}

impl Settings {
    /// The chat template's keyword arguments for `model`: the request's own, with
    /// `enable_thinking` from [`Settings::thinking`] where the template reads it. A constrained
    /// reply does not think (its format starts at the reply's first token).
    fn template_kwargs(&self, model: &LoadedModel) -> TemplateKwargs {
        let mut kwargs = self.template_kwargs.clone();
        let thinking = match self.constraint {
            Some(_) => Some(false),
            None => self.thinking,
        };
        if let Some(on) = thinking.filter(|_| model.template.thinking().switchable) {
            kwargs.insert("enable_thinking".into(), on.into());
        }
        kwargs
    }

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

// ---- model lookup and prompts ----------------------------------------------------------

/// The model a request names, loaded (or remote), and how long finding (or loading) it took.
pub struct ServedModel {
    pub model: Served,
    pub load_duration: Duration,
}

/// Where a model runs.
#[derive(Clone)]
pub enum Served {
    Local(Arc<LoadedModel>),
    Remote(Arc<RemoteModel>),
}

impl ServedModel {
    /// The model called `name` (case-insensitive; Ollama's `:latest` allowed): a remote one,
    /// or a local one loaded if needed. While the default model is not ready, a model that
    /// is not there is a 503 saying why (no model yet, downloading, failed) and what to do.
    pub async fn find(app: &App, name: &str) -> Result<Self, ApiError> {
        let asked = Instant::now();
        if let Some(remote) = app.models.remote(name) {
            return Ok(ServedModel {
                model: Served::Remote(remote),
                load_duration: Duration::ZERO,
            });
        }
        let model = match app.models.get(name).await {
            Err(e) if e.code == Some("model_not_found") => {
                let readiness = app.readiness();
                return Err(match readiness.default_model() {
                    Some(_) => e,
                    None => readiness.unavailable(),
                });
            }
            found => found?,
        };
        Ok(ServedModel {
            model: Served::Local(model),
            load_duration: asked.elapsed(),
        })
    }

    /// The name clients know it by.
    pub fn name(&self) -> &str {
        match &self.model {
            Served::Local(model) => &model.card.name,
            Served::Remote(model) => &model.remote.name,
        }
    }

    /// The local model, for what only a local model does (`what`: e.g. "counting tokens");
    /// a 400 for a remote one.
    pub fn local(&self, what: &str) -> Result<&Arc<LoadedModel>, ApiError> {
        match &self.model {
            Served::Local(model) => Ok(model),
            Served::Remote(model) => Err(ApiError::bad_param(
                "model",
                format!(
                    "{} runs on a remote engine ({}): {what} needs a local model",
                    model.remote.name,
                    model.remote.owner()
                ),
            )),
        }
    }
}

/// What a choice's prompt is made of.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// A chat through the model's template, offering `tools`; their calls are then parsed
    /// out of the reply.
    Chat {
        messages: Vec<ChatMessage>,
        tools: Option<Vec<Value>>,
        /// The images of the messages' image parts, in order.
        images: Vec<InImage>,
    },
    /// Text encoded as it is, without the template.
    Text(String),
    /// The model writes the middle between `prefix` and `suffix` (its FIM tokens).
    FillInTheMiddle { prefix: String, suffix: String },
    /// Token ids run as given.
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The prompt for `model`, a chat's rendered with `kwargs`.
    pub fn build(
        &self,
        model: &LoadedModel,
        kwargs: &TemplateKwargs,
    ) -> Result<ChatPrompt, ApiError> {
        let tokens = match self {
            Prompt::Chat {
                messages,
                tools,
                images,
            } => {
                let sizes: Vec<(u32, u32)> = images
                    .iter()
                    .map(|i| (i.image.width, i.image.height))
                    .collect();
                return model.chat_prompt(messages, tools.as_deref(), kwargs, &sizes);
            }
            Prompt::Text(text) => model.encode(text)?,
            Prompt::FillInTheMiddle { prefix, suffix } => {
                model.fill_in_the_middle(prefix, suffix)?
            }
            Prompt::Tokens(ids) => ids.clone(),
        };
        Ok(ChatPrompt {
            tokens,
            opens_in_thinking: false,
        })
    }

    /// The scheduler's images for the prompt `build` gave as `tokens`, which run after
    /// `offset` other tokens.
    pub fn images(
        &self,
        tokens: &[u32],
        offset: usize,
        model: &LoadedModel,
    ) -> Result<Vec<PromptImage>, ApiError> {
        match (self, &model.images) {
            (Prompt::Chat { images, .. }, Some(prompt)) if !images.is_empty() => {
                images::for_prompt(tokens, offset, images, prompt)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// The prompt's token ids for `model`, with the template's defaults.
    pub fn tokens(&self, model: &LoadedModel) -> Result<Vec<u32>, ApiError> {
        Ok(self.build(model, &TemplateKwargs::new())?.tokens)
    }

    /// Whether the reply may think: a chat with a model whose template thinks.
    fn may_think(&self, model: &LoadedModel) -> bool {
        matches!(self, Prompt::Chat { .. }) && model.template.thinking().thinks
    }

    fn offers_tools(&self) -> bool {
        matches!(self, Prompt::Chat { tools: Some(_), .. })
    }
}

/// What a request asks the service to run.
pub struct Job {
    pub prompts: Vec<Prompt>,
    /// Choices per prompt.
    pub n: usize,
    /// With the format every reply must follow compiled in (`structured::constrain`).
    pub settings: Settings,
    /// Token ids run before each prompt, as given (Ollama's `context`).
    pub context: Vec<u32>,
    /// The response id is this and 13 hex digits.
    pub id_prefix: &'static str,
}

impl Job {
    /// One choice per prompt, free-form.
    pub fn new(prompts: Vec<Prompt>, settings: Settings, id_prefix: &'static str) -> Self {
        Job {
            prompts,
            n: 1,
            settings,
            context: Vec::new(),
            id_prefix,
        }
    }
}

// ---- neutral events --------------------------------------------------------------------

/// A piece of a choice's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// The model's thinking before its answer (models whose template thinks).
    Reasoning(String),
    /// Reply text (tool-call markup taken out when tools were offered); may be empty while
    /// a token's text is held back.
    Text(String),
    ToolCall(ToolCall),
}

/// A sampled token's log-probability and the likeliest alternatives, each token decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
    /// Where the token's text starts in the reply, in bytes.
    pub offset: usize,
}

/// Why a choice ended. A reply that called tools finishes as a tool call, whatever stopped
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model ended its reply.
    Stop,
    /// The request's stop string at this index matched.
    StopString(usize),
    /// `max_tokens` (or the context) ran out.
    Length,
    ToolCalls,
}

impl StopReason {
    pub fn new(reason: FinishReason, called_tools: bool) -> Self {
        match reason {
            _ if called_tools => StopReason::ToolCalls,
            FinishReason::Stop => StopReason::Stop,
            FinishReason::StopString(index) => StopReason::StopString(index),
            FinishReason::Length => StopReason::Length,
        }
    }

    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Stop | StopReason::StopString(_) => "stop",
            StopReason::Length => "length",
            StopReason::ToolCalls => "tool_calls",
        }
    }
}

/// Where a choice's time went (Ollama reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timings {
    /// Finding or loading the model.
    pub load: Duration,
    /// From submitting the prompt to its first reply token.
    pub prompt_eval: Duration,
    /// From the first reply token to the end.
    pub eval: Duration,
    /// The whole request, load included.
    pub total: Duration,
}

/// A choice's end.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// The last text (held back until now) and calls.
    pub deltas: Vec<Delta>,
    pub reason: StopReason,
    pub usage: Usage,
    /// Of `usage.completion_tokens`, those of the reply's thinking.
    pub reasoning_tokens: usize,
    pub timings: Timings,
}

/// A sampled token: what of the reply it released, and its log-probabilities when the
/// request asked for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub id: u32,
    pub deltas: Vec<Delta>,
    pub logprob: Option<Logprob>,
}

/// What happens to a choice.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token(Token),
    Finish(Finish),
    /// The engine failed, or the choice's events ended before it finished.
    Failed(String),
}

/// A choice's event, tagged with its index.
pub struct ChoiceEvent {
    pub index: usize,
    pub event: Event,
}

/// The usage of all choices: the prompt counted once per prompt, completions summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TotalUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// The most prompt tokens any choice found in the prefix cache.
    pub cached_tokens: usize,
    /// Of the completion tokens, those of the replies' thinking.
    pub reasoning_tokens: usize,
}

impl TotalUsage {
    /// A choice's usage. Its prompt counts where the prompts were not counted before (a
    /// remote engine counts them).
    fn add(&mut self, usage: &Usage, reasoning_tokens: usize) {
        self.prompt_tokens = self.prompt_tokens.max(usage.prompt_tokens);
        self.completion_tokens += usage.completion_tokens;
        self.cached_tokens = self.cached_tokens.max(usage.cached_tokens);
        self.reasoning_tokens += reasoning_tokens;
    }
}

// ---- running ---------------------------------------------------------------------------

/// A running request.
pub struct Generation {
    /// The model's name, as clients know it.
    pub model: String,
    pub provenance: Provenance,
    pub seed: u64,
    pub id: String,
    pub created: u64,
    /// Each prompt's token ids as run (context included; none for a remote model, whose
    /// engine counts its prompt in each choice's usage).
    pub prompts: Vec<Vec<u32>>,
    pub prompt_tokens: usize,
    choices: Vec<Choice>,
}

/// A choice running on a local model's scheduler or on a remote engine.
enum Choice {
    Local(local::ChoiceRun),
    Remote(remote::RemoteRun),
}

impl Choice {
    async fn next(&mut self) -> Option<Event> {
        match self {
            Choice::Local(run) => run.next().await,
            Choice::Remote(run) => run.next().await,
        }
    }
}

/// When a choice started and produced its tokens: its timings, and the latency metrics.
pub(crate) struct Clock {
    started: Instant,
    load_duration: Duration,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    metrics: Arc<Metrics>,
}

impl Clock {
    fn new(started: Instant, load_duration: Duration, metrics: &Arc<Metrics>) -> Clock {
        Clock {
            started,
            load_duration,
            first_token: None,
            last_token: None,
            metrics: metrics.clone(),
        }
    }

    /// A token came: time to first token or inter-token latency, into the metrics.
    fn observe_token(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => self.metrics.time_to_first_token.observe(now - self.started),
            Some(before) => self.metrics.inter_token_latency.observe(now - before),
        }
        self.metrics
            .generated_tokens
            .fetch_add(1, Ordering::Relaxed);
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
    }

    fn timings(&self) -> Timings {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        Timings {
            load: self.load_duration,
            prompt_eval: first - self.started,
            eval: now - first,
            total: self.load_duration + (now - self.started),
        }
    }
}

impl Generation {
    /// The receipt this reply is answered with.
    pub fn receipt(&self) -> Receipt {
        Receipt {
            seed: self.seed,
            provenance: self.provenance.clone(),
        }
    }

    /// Build the prompts and start `n` choices for each prompt; choice `k` (prompt-major)
    /// uses `seed + k`. A remote model's choices are asked of its engine here, so that a
    /// refusal (a bad key, the engine down) is the response's status.
    pub async fn start(app: &App, served: ServedModel, job: Job) -> Result<Self, ApiError> {
        let started = Instant::now();
        let seed = job.settings.seed.unwrap_or_else(draw_seed);
        let clock = || Clock::new(started, served.load_duration, &app.metrics);
        let (provenance, prompts, choices) = match &served.model {
            Served::Local(model) => {
                let (prompts, choices) = local::start(model, &job, seed, clock)?;
                (model.provenance.clone(), prompts, choices)
            }
            Served::Remote(model) => {
                let choices = remote::start(model, &job, seed, clock).await?;
                (model.provenance.clone(), Vec::new(), choices)
            }
        };
        let prompt_tokens = prompts.iter().map(Vec::len).sum();
        app.metrics
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        Ok(Generation {
            id: format!("{}{:013x}", job.id_prefix, draw_seed()),
            created: crate::model_host::now(),
            model: served.name().to_string(),
            provenance,
            seed,
            prompts,
            prompt_tokens,
            choices,
        })
    }

    pub fn choices(&self) -> usize {
        self.choices.len()
    }

    /// Every choice's events as they come. Dropping the stream cancels what still runs.
    pub fn events(&mut self) -> Pin<Box<dyn Stream<Item = ChoiceEvent> + Send>> {
        let per_choice = std::mem::take(&mut self.choices)
            .into_iter()
            .enumerate()
            .map(|(index, run)| {
                stream::unfold(run, move |mut run| async move {
                    let event = run.next().await?;
                    Some((ChoiceEvent { index, event }, run))
                })
                .boxed()
            });
        stream::select_all(per_choice).boxed()
    }

    /// Run to the end and gather each choice (non-streamed responses).
    pub async fn collect(mut self) -> Result<Vec<Reply>, ApiError> {
        let mut replies: Vec<Reply> = (0..self.choices()).map(|_| Reply::default()).collect();
        let mut events = self.events();
        while let Some(ChoiceEvent { index, event }) = events.next().await {
            let reply = &mut replies[index];
            match event {
                Event::Token(token) => {
                    reply.tokens.push(token.id);
                    reply.logprobs.extend(token.logprob);
                    reply.push(token.deltas);
                }
                Event::Finish(finish) => {
                    reply.push(finish.deltas);
                    reply.reasoning_tokens = finish.reasoning_tokens;
                    reply.finish = Some((finish.reason, finish.usage, finish.timings));
                }
                Event::Failed(message) => return Err(ApiError::internal(message)),
            }
        }
        Ok(replies)
    }
}

/// One finished choice.
#[derive(Debug, Default)]
pub struct Reply {
    /// The reply in order, adjacent text merged, empty text left out.
    pub pieces: Vec<Delta>,
    /// The reply's token ids.
    pub tokens: Vec<u32>,
    /// Each token's log-probabilities, when asked for.
    pub logprobs: Vec<Logprob>,
    /// Why it ended, its usage and its timings (`None` before it has).
    pub finish: Option<(StopReason, Usage, Timings)>,
    /// Tokens of the reply's thinking.
    pub reasoning_tokens: usize,
}

impl Reply {
    fn push(&mut self, deltas: Vec<Delta>) {
        for delta in deltas {
            match (delta, self.pieces.last_mut()) {
                (Delta::Text(text) | Delta::Reasoning(text), _) if text.is_empty() => {}
                (Delta::Text(text), Some(Delta::Text(last)))
                | (Delta::Reasoning(text), Some(Delta::Reasoning(last))) => last.push_str(&text),
                (delta, _) => self.pieces.push(delta),
            }
        }
    }

    /// All of the reply's answer text.
    pub fn text(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|piece| match piece {
                Delta::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The reply's thinking, `None` when it did not think.
    pub fn reasoning(&self) -> Option<String> {
        let thinking: String = self
            .pieces
            .iter()
            .filter_map(|piece| match piece {
                Delta::Reasoning(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        (!thinking.is_empty()).then_some(thinking)
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.pieces.iter().filter_map(|piece| match piece {
            Delta::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    pub fn reason(&self) -> StopReason {
        self.finish.map_or(StopReason::Stop, |(reason, ..)| reason)
    }

    pub fn usage(&self) -> Usage {
        self.finish.map(|(_, usage, _)| usage).unwrap_or_default()
    }

    pub fn timings(&self) -> Timings {
        self.finish.map(|(.., timings)| timings).unwrap_or_default()
    }
}

/// The usage of every reply.
pub fn total_usage(prompt_tokens: usize, replies: &[Reply]) -> TotalUsage {
    let mut total = TotalUsage {
        prompt_tokens,
        ..TotalUsage::default()
    };
    for reply in replies {
        total.add(&reply.usage(), reply.reasoning_tokens);
    }
    total
}

// ---- the one streaming loop ------------------------------------------------------------

/// A protocol's side of a streamed reply: its wire events for the neutral ones.
pub trait Translator: Send + 'static {
    /// What the response body is made of (server-sent events, NDJSON lines).
    type Wire: Send + 'static;

    /// What goes out before any choice's events.
    fn start(&mut self) -> Vec<Self::Wire> {
        Vec::new()
    }

    /// A choice's sampled token.
    fn token(&mut self, index: usize, token: Token) -> Vec<Self::Wire>;

    /// A choice's end.
    fn finish(&mut self, index: usize, finish: Finish) -> Vec<Self::Wire>;

    /// What goes out once every choice has finished.
    fn done(&mut self, _usage: TotalUsage) -> Vec<Self::Wire> {
        Vec::new()
    }

    /// The last events when a choice failed (the others are cancelled).
    fn failed(&mut self, message: String) -> Vec<Self::Wire>;
}

/// How a streamed reply ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Complete,
    ClientGone,
    Failed(String),
}

/// The one streaming loop: `generation`'s events through `translator` to `client`, until
/// every choice has finished, one has failed, or the client has gone (which cancels what
/// still runs).
pub async fn drive<T: Translator>(
    mut generation: Generation,
    translator: &mut T,
    client: &Sender<T::Wire>,
) -> Ending {
    if !send(client, translator.start()).await {
        return Ending::ClientGone;
    }
    let mut usage = TotalUsage {
        prompt_tokens: generation.prompt_tokens,
        ..TotalUsage::default()
    };
    let mut events = generation.events();
    loop {
        let next = tokio::select! {
            _ = client.closed() => return Ending::ClientGone,
            next = events.next() => next,
        };
        let wire = match next {
            None => break,
            Some(ChoiceEvent { index, event }) => match event {
                Event::Token(token) => translator.token(index, token),
                Event::Finish(finish) => {
                    usage.add(&finish.usage, finish.reasoning_tokens);
                    translator.finish(index, finish)
                }
                Event::Failed(message) => {
                    send(client, translator.failed(message.clone())).await;
                    return Ending::Failed(message);
                }
            },
        };
        if !send(client, wire).await {
            return Ending::ClientGone;
        }
    }
    if !send(client, translator.done(usage)).await {
        return Ending::ClientGone;
    }
    Ending::Complete
}

/// Send `items`; false once the client has gone.
async fn send<T>(client: &Sender<T>, items: Vec<T>) -> bool {
    for item in items {
        if client.send(item).await.is_err() {
            return false;
        }
    }
    true
}

/// A streamed response body: `generation` driven through `translator` on a task of its own.
pub fn stream_body<T: Translator>(
    generation: Generation,
    mut translator: T,
) -> impl Stream<Item = T::Wire> {
    spawn_body(move |client| async move {
        drive(generation, &mut translator, &client).await;
    })
}

/// A response body fed by `produce` on its own task. When the client goes away the
/// receiver is dropped, `produce` sees its sender closed and returns, and dropping its
/// `Generation` cancels the requests and frees their rows.
pub fn spawn_body<T, F>(produce: impl FnOnce(Sender<T>) -> F) -> impl Stream<Item = T>
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

/// Neutral events for the translators' tests.
#[cfg(test)]
pub mod test_events {
    use super::*;

    pub fn call() -> ToolCall {
        ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: r#"{"x":1}"#.into(),
        }
    }

    /// A token that released `deltas`.
    pub fn token(id: u32, deltas: Vec<Delta>) -> Token {
        Token {
            id,
            deltas,
            logprob: None,
        }
    }

    /// An end with nothing held back, after `completion_tokens` of 10 prompt tokens.
    pub fn finish(reason: StopReason, completion_tokens: usize) -> Finish {
        Finish {
            deltas: Vec::new(),
            reason,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens,
                cached_tokens: 0,
            },
            reasoning_tokens: 0,
            timings: Timings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_that_called_tools_finishes_as_a_tool_call() {
        for reason in [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::StopString(1),
        ] {
            assert_eq!(StopReason::new(reason, true), StopReason::ToolCalls);
        }
        assert_eq!(StopReason::new(FinishReason::Stop, false), StopReason::Stop);
        assert_eq!(
            StopReason::new(FinishReason::StopString(2), false),
            StopReason::StopString(2)
        );
        assert_eq!(
            StopReason::new(FinishReason::Length, false),
            StopReason::Length
        );
        let names: Vec<&str> = [
            StopReason::Stop,
            StopReason::StopString(0),
            StopReason::Length,
            StopReason::ToolCalls,
        ]
        .iter()
        .map(|r| r.as_str())
        .collect();
        assert_eq!(names, ["stop", "stop", "length", "tool_calls"]);
    }

    #[test]
    fn a_reply_merges_text_and_keeps_calls_in_order() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let mut reply = Reply::default();
        reply.push(vec![Delta::Text("a".into()), Delta::Text(String::new())]);
        reply.push(vec![Delta::Text("b".into()), Delta::ToolCall(call.clone())]);
        reply.push(vec![Delta::Text("c".into())]);
        assert_eq!(
            reply.pieces,
            [
                Delta::Text("ab".into()),
                Delta::ToolCall(call.clone()),
                Delta::Text("c".into())
            ]
        );
        assert_eq!(reply.text(), "abc");
        assert_eq!(reply.tool_calls().collect::<Vec<_>>(), [&call]);
        assert_eq!(reply.reason(), StopReason::Stop, "unfinished reads as stop");
    }

    #[test]
    fn usage_sums_completions_and_keeps_the_best_cache_hit() {
        let mut total = TotalUsage {
            prompt_tokens: 5,
            ..TotalUsage::default()
        };
        for (completion_tokens, cached_tokens) in [(3, 2), (4, 0)] {
            total.add(
                &Usage {
                    prompt_tokens: 5,
                    completion_tokens,
                    cached_tokens,
                },
                1,
            );
        }
        assert_eq!(
            total,
            TotalUsage {
                prompt_tokens: 5,
                completion_tokens: 7,
                cached_tokens: 2,
                reasoning_tokens: 2,
            }
        );
    }
}

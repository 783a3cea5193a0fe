//! A remote model's choices: the job asked of its engine, one upstream request per choice
//! (choice `k` sent `seed + k`, as a local model's choice is sampled), and the upstream's
//! pieces made neutral events. The engine renders the prompt, keeps thinking apart and
//! parses tool calls; what only a local model has (token ids, log-probabilities, logit
//! bias) is refused with a 400 that says so.

use std::sync::Arc;

use futures_util::{future, StreamExt};
use seedbar_grammar::Format;
use seedbar_remote::{Ask, AskPrompt, End, Finish as Ended, Piece, Pieces, Shape, Upstream};
use seedbar_scheduler::Usage;

use super::{Choice, Clock, Delta, Event, Finish, Job, Prompt, StopReason, Token};
use crate::{error::ApiError, model_host::RemoteModel};

/// Ask `model`'s engine for every choice of `job` at once; the first refusal is the error.
pub(super) async fn start(
    model: &Arc<RemoteModel>,
    job: &Job,
    seed: u64,
    clock: impl Fn() -> Clock,
) -> Result<Vec<Choice>, ApiError> {
    let settings = &job.settings;
    let only_local = |param: &str, what: &str| {
        let remote = &model.remote;
        let message = format!(
            "{} runs on a remote engine ({}), which is not sent {what}",
            remote.name,
            remote.owner()
        );
        Err(ApiError::bad_param(param, message))
    };
    if !job.context.is_empty() {
        return only_local("context", "token ids");
    }
    if settings.logprobs.is_some() {
        return only_local("logprobs", "requests for log-probabilities");
    }
    if !settings.sampling.logit_bias.is_empty() {
        return only_local(
            "logit_bias",
            "a logit bias (token ids are the engine's own)",
        );
    }
    let offered = |prompt: &Prompt| match prompt {
        Prompt::Chat {
            tools: Some(tools), ..
        } => tools.len(),
        _ => 0,
    };
    let offered = job.prompts.iter().map(offered).max().unwrap_or(0);
    let shape = settings.format.as_ref().map(|format| match format {
        Format::JsonObject => Shape::Json,
        Format::JsonSchema(schema) => Shape::JsonSchema(schema.clone()),
        // A call of any offered tool is `required`; of one among several, that one by name.
        Format::ToolCall(tools) => Shape::Call(match tools.as_slice() {
            [one] if offered > 1 => Some(one.name.clone()),
            _ => None,
        }),
    });
    let mut asks = Vec::with_capacity(job.prompts.len() * job.n);
    for prompt in &job.prompts {
        let prompt = match prompt {
            Prompt::Chat { images, .. } if !images.is_empty() => {
                return only_local("messages", "images")
            }
            Prompt::Chat {
                messages, tools, ..
            } => AskPrompt::Chat {
                messages: messages.clone(),
                tools: tools.clone(),
            },
            Prompt::Text(text) => AskPrompt::Text(text.clone()),
            Prompt::FillInTheMiddle { prefix, suffix } => AskPrompt::FillInTheMiddle {
                prefix: prefix.clone(),
                suffix: suffix.clone(),
            },
            Prompt::Tokens(_) => return only_local("prompt", "token ids"),
        };
        for _ in 0..job.n {
            asks.push(Ask {
                prompt: prompt.clone(),
                seed: seed.wrapping_add(asks.len() as u64),
                sampling: settings.sampling.clone(),
                max_tokens: settings.max_tokens,
                stop: settings.stop.clone(),
                shape: shape.clone(),
                thinking: settings.thinking,
            });
        }
    }
    let upstream = Upstream::new(&model.remote, model.key.clone());
    // Dropping the streams already open (on a refusal) cancels them upstream.
    let streams = future::try_join_all(asks.iter().map(|ask| upstream.ask(ask))).await?;
    Ok(streams
        .into_iter()
        .map(|pieces| Choice::Remote(RemoteRun::new(pieces, clock())))
        .collect())
}

/// One choice's stream from the engine, made neutral.
pub(super) struct RemoteRun {
    pieces: Pieces,
    /// Pieces of text and thinking so far (each is about a token: the engines named here
    /// stream one token a chunk).
    tokens: usize,
    reasoning_tokens: usize,
    ended: bool,
    clock: Clock,
}

impl RemoteRun {
    fn new(pieces: Pieces, clock: Clock) -> RemoteRun {
        RemoteRun {
            pieces,
            tokens: 0,
            reasoning_tokens: 0,
            ended: false,
            clock,
        }
    }

    pub(super) async fn next(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        let piece = match self.pieces.next().await {
            Some(Ok(piece)) => piece,
            Some(Err(error)) => {
                self.ended = true;
                return Some(Event::Failed(error.to_string()));
            }
            None => {
                self.ended = true;
                return Some(Event::Failed("the reply ended before it finished".into()));
            }
        };
        let delta = match piece {
            Piece::Text(text) => Delta::Text(text),
            Piece::Reasoning(text) => {
                self.reasoning_tokens += 1;
                Delta::Reasoning(text)
            }
            Piece::ToolCall(call) => Delta::ToolCall(call),
            Piece::Finish(ended) => {
                self.ended = true;
                return Some(Event::Finish(self.finish(ended)));
            }
        };
        if !matches!(delta, Delta::ToolCall(_)) {
            self.tokens += 1;
            self.clock.observe_token();
        }
        Some(Event::Token(Token {
            id: 0,
            deltas: vec![delta],
            logprob: None,
        }))
    }

    /// The end as the engine said it, with its counts (ours where it gave none).
    fn finish(&self, ended: Ended) -> Finish {
        Finish {
            deltas: Vec::new(),
            reason: match ended.end {
                End::Stop => StopReason::Stop,
                End::Length => StopReason::Length,
                End::ToolCalls => StopReason::ToolCalls,
            },
            usage: Usage {
                prompt_tokens: ended.prompt_tokens.unwrap_or(0),
                completion_tokens: ended.completion_tokens.unwrap_or(self.tokens),
                cached_tokens: 0,
            },
            reasoning_tokens: self.reasoning_tokens,
            timings: self.clock.timings(),
        }
    }
}

//! A local model's choice: its scheduler's events made neutral (thinking split from the
//! answer, tool calls parsed out of it, log-probabilities decoded, timings and metrics).

use std::sync::Arc;

use seedbar_engine::{ReasoningOutput, ReasoningParser, ToolCallParser, ToolOutput};
use seedbar_scheduler::{Request, RequestStream, TokenLogprob};

use super::{Choice, Clock, Delta, Event, Finish, Job, Logprob, Prompt, StopReason, Token};
use crate::{error::ApiError, model_host::LoadedModel};

/// Build `job`'s prompts for `model` and submit its choices: each prompt's token ids as run,
/// and the choices (choice `k`, prompt-major, sampled with `seed + k`).
pub(super) fn start(
    model: &Arc<LoadedModel>,
    job: &Job,
    seed: u64,
    clock: impl Fn() -> Clock,
) -> Result<(Vec<Vec<u32>>, Vec<Choice>), ApiError> {
    let settings = &job.settings;
    let tools = job.prompts.iter().any(Prompt::offers_tools);
    let kwargs = settings.template_kwargs(model);
    let built = job
        .prompts
        .iter()
        .map(|prompt| {
            let chat = prompt.build(model, &kwargs)?;
            // A constrained reply is its format from the first token: nothing to split.
            let thinks = prompt.may_think(model) && settings.constraint.is_none();
            let parser = thinks.then(|| match chat.opens_in_thinking {
                true => ReasoningParser::in_thinking(),
                false => ReasoningParser::new(),
            });
            let images = prompt.images(&chat.tokens, job.context.len(), model)?;
            Ok(([job.context.clone(), chat.tokens].concat(), parser, images))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let mut choices = Vec::with_capacity(built.len() * job.n);
    let mut prompts = Vec::with_capacity(built.len());
    for (prompt, thinking, images) in built {
        for _ in 0..job.n {
            let request = Request {
                prompt: prompt.clone(),
                sampling: settings.sampling.clone(),
                seed: Some(seed.wrapping_add(choices.len() as u64)),
                max_tokens: settings.max_tokens.unwrap_or(usize::MAX),
                stop: settings.stop.clone(),
                logprobs: settings.logprobs,
                constraint: settings.constraint.clone(),
                trace: false,
                speculative: settings.speculative.unwrap_or(true),
                images: images.clone(),
            };
            // On an error the streams already submitted are dropped, which cancels them.
            let events = model.scheduler.submit(request)?;
            let run = ChoiceRun::new(events, thinking.clone(), tools, clock(), model.clone());
            choices.push(Choice::Local(run));
        }
        prompts.push(prompt);
    }
    Ok((prompts, choices))
}

/// One choice's run: its scheduler events made neutral.
pub(super) struct ChoiceRun {
    events: RequestStream,
    /// Set when the reply may think: splits its thinking from its answer.
    reasoning: Option<ReasoningParser>,
    /// Tokens of the reply's thinking.
    reasoning_tokens: usize,
    /// Set when tools were offered: splits calls out of the answer.
    parser: Option<ToolCallParser>,
    called_tools: bool,
    /// Bytes of reply text so far.
    offset: usize,
    ended: bool,
    clock: Clock,
    model: Arc<LoadedModel>,
}

impl ChoiceRun {
    /// A run of `events` for `model`; `thinking` when the reply may think (and whether its
    /// prompt opened the thinking), `tools` when tools were offered.
    pub(super) fn new(
        events: RequestStream,
        thinking: Option<ReasoningParser>,
        tools: bool,
        clock: Clock,
        model: Arc<LoadedModel>,
    ) -> ChoiceRun {
        ChoiceRun {
            events,
            reasoning: thinking,
            reasoning_tokens: 0,
            parser: tools.then(ToolCallParser::new),
            called_tools: false,
            offset: 0,
            ended: false,
            clock,
            model,
        }
    }

    pub(super) async fn next(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        let Some(event) = self.events.next().await else {
            self.ended = true;
            return Some(Event::Failed("the reply ended before it finished".into()));
        };
        Some(match event {
            seedbar_scheduler::Event::Token { id, text, logprob } => {
                self.clock.observe_token();
                let logprob = logprob.map(|lp| self.logprob(id, &lp));
                self.offset += text.len();
                let deltas = self.split(&text);
                if self
                    .reasoning
                    .as_ref()
                    .is_some_and(ReasoningParser::thinking)
                    || deltas.iter().any(|d| matches!(d, Delta::Reasoning(_)))
                {
                    self.reasoning_tokens += 1;
                }
                Event::Token(Token {
                    id,
                    deltas,
                    logprob,
                })
            }
            seedbar_scheduler::Event::Finished {
                reason,
                usage,
                text,
            } => {
                self.ended = true;
                let mut deltas = self.split(&text);
                let held_back = self
                    .reasoning
                    .as_mut()
                    .map(|p| p.finish())
                    .unwrap_or_default();
                deltas.extend(self.answer(held_back));
                let held_back = self.parser.as_mut().map(|p| p.finish()).unwrap_or_default();
                deltas.extend(self.deltas(held_back));
                Event::Finish(Finish {
                    deltas,
                    reason: StopReason::new(reason, self.called_tools),
                    usage,
                    reasoning_tokens: self.reasoning_tokens,
                    timings: self.clock.timings(),
                })
            }
            seedbar_scheduler::Event::Failed(message) => {
                self.ended = true;
                Event::Failed(message)
            }
        })
    }

    fn logprob(&self, id: u32, lp: &TokenLogprob) -> Logprob {
        let decode = |id: u32| self.model.tokenizer.decode(&[id]).unwrap_or_default();
        Logprob {
            token: decode(id),
            logprob: lp.logprob,
            top: lp.top.iter().map(|&(t, l)| (decode(t), l)).collect(),
            offset: self.offset,
        }
    }

    /// A token's text as deltas: thinking split from the answer when the reply may think,
    /// the answer split into text and calls when tools were offered.
    fn split(&mut self, text: &str) -> Vec<Delta> {
        match self.reasoning.as_mut() {
            Some(reasoning) => {
                let outputs = reasoning.push(text);
                self.answer(outputs)
            }
            None => self.answer_text(text),
        }
    }

    /// Thinking as it is; the answer's text through [`ChoiceRun::answer_text`].
    fn answer(&mut self, outputs: Vec<ReasoningOutput>) -> Vec<Delta> {
        outputs
            .into_iter()
            .flat_map(|output| match output {
                ReasoningOutput::Thinking(text) => vec![Delta::Reasoning(text)],
                ReasoningOutput::Answer(text) => self.answer_text(&text),
            })
            .collect()
    }

    /// Answer text as deltas: split into text and calls when tools were offered.
    fn answer_text(&mut self, text: &str) -> Vec<Delta> {
        match self.parser.as_mut() {
            Some(parser) => {
                let outputs = parser.push(text);
                self.deltas(outputs)
            }
            None => vec![Delta::Text(text.to_string())],
        }
    }

    fn deltas(&mut self, outputs: Vec<ToolOutput>) -> Vec<Delta> {
        outputs
            .into_iter()
            .map(|output| match output {
                ToolOutput::Text(text) => Delta::Text(text),
                ToolOutput::Call(call) => {
                    self.called_tools = true;
                    Delta::ToolCall(call)
                }
            })
            .collect()
    }
}

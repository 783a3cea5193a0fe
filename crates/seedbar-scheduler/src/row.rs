//! One running request: its caches, what it was fed and drew, and the events it streams
//! (tokens with their text, the end and why).

use seedbar_engine::{
    sampling::log_softmax,
    step::{kv_cache::KvCache, plan::Layout, RowPositions},
    tokenizer::StreamDecoder,
    FinishReason, Model,
};
use seedbar_grammar::TokenMask;
use tokio::sync::mpsc::UnboundedSender;

use crate::{
    draft_model::RowDraft,
    request::{Event, Request, TokenLogprob, Usage},
    speculation::Speculation,
    stop::{Released, StopMatcher},
};

/// A request holding a row of the batch.
pub(crate) struct Row {
    pub(crate) id: u64,
    pub(crate) request: Request,
    pub(crate) events: UnboundedSender<Event>,
    pub(crate) caches: Vec<KvCache>,
    /// Tokens whose KV is in `caches`.
    pub(crate) fed: Vec<u32>,
    pub(crate) generated: Vec<u32>,
    pub(crate) cached_tokens: usize,
    /// Text of `generated` handed out so far.
    pub(crate) decoder: StreamDecoder,
    pub(crate) stop: StopMatcher,
    pub(crate) finished: bool,
    /// How many tokens it drafts next (where the scheduler speculates).
    pub(crate) speculation: Speculation,
    /// What the draft model has read of it, once the draft model drafted for it.
    pub(crate) draft: Option<RowDraft>,
    /// Where its tokens sit for RoPE (on its images' grids for a multimodal-RoPE model).
    pub(crate) positions: RowPositions,
}

impl Row {
    /// Whether the row's draws may run on the device: no output format, no log
    /// probabilities, and sampling the device draws exactly as the host.
    pub(crate) fn draws_on_device(&self, vocab: usize) -> bool {
        self.request.constraint.is_none()
            && self.request.logprobs.is_none()
            && self.request.sampling.draws_on_device(vocab)
    }

    pub(crate) fn prefilling(&self) -> bool {
        self.fed.len() < self.request.prompt.len()
    }

    /// The tokens this row runs next step: its last sampled token, or the prefill chunk
    /// `layout` sets ([`Layout::chunk_end`]) with `budget` prefill tokens left.
    pub(crate) fn next_input(&self, layout: &Layout, budget: usize) -> Vec<u32> {
        if self.prefilling() {
            let start = self.fed.len();
            let end = layout.chunk_end(start, self.request.prompt.len(), budget);
            self.request.prompt[start..end].to_vec()
        } else {
            vec![*self
                .generated
                .last()
                .expect("decode rows have sampled a token")]
        }
    }

    /// The tokens the row's output format allows next; a format that cannot go on fails
    /// the row.
    pub(crate) fn allowed_next(&mut self) -> Option<TokenMask> {
        match self.request.constraint.as_mut()?.mask() {
            Ok(mask) => Some(mask),
            Err(e) => {
                self.fail(e.to_string());
                None
            }
        }
    }

    /// Feed the drawn token to the row's output format; false (and the row failed) if the
    /// format rejects it.
    pub(crate) fn follows_constraint(&mut self, token: u32) -> bool {
        let Some(constraint) = self.request.constraint.as_mut() else {
            return true;
        };
        match constraint.accept(token) {
            Ok(()) => true,
            Err(e) => {
                self.fail(e.to_string());
                false
            }
        }
    }

    pub(crate) fn fail(&mut self, reason: String) {
        self.send(Event::Failed(reason));
        self.finished = true;
    }

    pub(crate) fn send(&mut self, event: Event) {
        if self.events.send(event).is_err() {
            self.finished = true; // the receiver is gone: cancelled
        }
    }

    /// End the reply. Unless a stop string ended it, text still held back goes out with
    /// the final event (up to a stop string it completes, which then is the reason).
    pub(crate) fn finish(&mut self, mut reason: FinishReason, model: &Model, flush: bool) {
        let mut text = String::new();
        if flush {
            if let Ok(rest) = self.decoder.finish(&model.tokenizer, &self.generated) {
                match self.stop.push(&rest) {
                    Released::More(t) => text = t + &self.stop.finish(),
                    Released::Stopped(t, stop) => {
                        text = t;
                        reason = FinishReason::StopString(stop);
                    }
                }
            } else {
                text = self.stop.finish();
            }
        }
        let usage = Usage {
            prompt_tokens: self.request.prompt.len(),
            completion_tokens: self.generated.len(),
            cached_tokens: self.cached_tokens,
        };
        self.send(Event::Finished {
            reason,
            usage,
            text,
        });
        self.finished = true;
    }
}

/// Stream the row's new token (or finish it) and what the token completes.
pub(crate) fn emit(row: &mut Row, token: u32, logprob: Option<TokenLogprob>, model: &Model) {
    if model.eos_ids.contains(&token) {
        row.finish(FinishReason::Stop, model, true);
        return;
    }
    row.generated.push(token);
    let text = row
        .decoder
        .push(&model.tokenizer, &row.generated)
        .unwrap_or_default();
    match row.stop.push(&text) {
        Released::Stopped(last, stop) => {
            row.send(Event::Token {
                id: token,
                text: last,
                logprob,
            });
            row.finish(FinishReason::StopString(stop), model, false);
        }
        Released::More(text) => {
            row.send(Event::Token {
                id: token,
                text,
                logprob,
            });
            if row.generated.len() >= row.request.max_tokens {
                row.finish(FinishReason::Length, model, true);
            }
        }
    }
}

/// Stream a token drawn on the host from `logits`, with its log probabilities where the
/// request asks for them, unless the row's output format rejects it (the row then fails):
/// whether the row took it.
pub(crate) fn take_drawn(row: &mut Row, token: u32, logits: &[f32], model: &Model) -> bool {
    if !row.follows_constraint(token) {
        return false;
    }
    let logprob = row
        .request
        .logprobs
        .map(|top_n| token_logprob(logits, token, top_n));
    emit(row, token, logprob, model);
    true
}

fn token_logprob(logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    let n = top_n.min(order.len());
    if n > 0 {
        order.select_nth_unstable_by(n - 1, |a, b| lp[*b as usize].total_cmp(&lp[*a as usize]));
        order.truncate(n);
        order.sort_by(|a, b| lp[*b as usize].total_cmp(&lp[*a as usize]));
    } else {
        order.clear();
    }
    TokenLogprob {
        logprob: lp[token as usize],
        top: order.into_iter().map(|t| (t, lp[t as usize])).collect(),
    }
}

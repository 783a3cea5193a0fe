//! Drafting with a draft model: a smaller model of the same vocabulary, loaded beside the
//! target, guesses a row's next tokens greedily; the target then verifies them as it does
//! prompt lookup's (`speculation.rs`), so the reply is the target's own whatever the draft
//! model says. Its steps run the rows that draft together (in its own layout: the CPU's
//! packed kernels for a GGUF), each row with KV of its own that follows what the row has
//! read: a round first catches the draft model up on the tokens the row took since its last
//! round (its whole prompt the first time), cutting the KV of drafts the target did not
//! keep, then draws one token a step.

use std::time::Instant;

use seedbar_engine::{
    sampling::argmax,
    step::{kv_cache::KvCache, Batch, Logits, StepInput},
    Model,
};

use crate::step_costs::follow;

/// A draft model and its steps.
pub struct DraftModel {
    model: Model,
    batch: Batch,
    /// Seconds a round of drafting takes per token drafted, on average (0 until one ran).
    token_seconds: f32,
}

/// The most tokens a row reads to catch up in a round right after one it drafted in: its
/// drafts kept and the target's token after them.
const MAX_CATCH_UP_IN_STEADY_ROUNDS: usize = crate::speculation::MAX_MODEL_DRAFT + 1;

/// What a row's draft model has read: its KV and the tokens in it, from `start` in the
/// row's history on.
pub(crate) struct RowDraft {
    caches: Vec<KvCache>,
    fed: Vec<u32>,
    start: usize,
}

/// The most tokens a round reads to catch a row up: past that (a row's first round over a
/// long prompt, or its first after a long pause) it starts over from the history's last
/// this many, so a draft model that does not pay costs little when it tries again. Recent
/// text is what a draft's guesses mostly hang on.
const MAX_CATCH_UP: usize = 16;

/// One row's drafting in a round: its history (prompt and reply so far), its draft state
/// and how many tokens it wants.
pub(crate) struct DraftJob<'a> {
    pub history: Vec<u32>,
    pub state: &'a mut RowDraft,
    pub count: usize,
}

impl DraftModel {
    /// `draft` drafting for `target`, or why it cannot: it must share the target's
    /// vocabulary, token for token.
    pub fn new(draft: Model, target: &Model) -> Result<DraftModel, String> {
        if !draft.tokenizer.same_vocabulary(&target.tokenizer) {
            return Err(format!(
                "{} cannot draft for {}: their vocabularies differ (a draft model needs the target's tokenizer)",
                draft.path.display(),
                target.path.display()
            ));
        }
        Ok(DraftModel {
            batch: Batch::new(draft.layout()),
            model: draft,
            token_seconds: 0.0,
        })
    }

    /// Seconds a drafted token costs, on average (0 until one was drafted): its share of a
    /// round of rows that drafted the step before too (the reading of the tokens they took
    /// since included; a row's first round after a pause reads more, and is left out).
    pub(crate) fn token_seconds(&self) -> f32 {
        self.token_seconds
    }

    /// A row's fresh draft state.
    pub(crate) fn row(&self) -> RowDraft {
        RowDraft {
            caches: self.model.new_caches(),
            fed: Vec::new(),
            start: 0,
        }
    }

    /// Each job's drafted tokens (at most its count, fewer where the draft model writes a
    /// token past `vocab`, the target's vocabulary).
    pub(crate) fn draft(
        &mut self,
        jobs: &mut [DraftJob],
        vocab: usize,
    ) -> seedbar_engine::Result<Vec<Vec<u32>>> {
        let started = Instant::now();
        // Catch up: keep the KV of what the row still holds (the history's prefix the draft
        // model read), and read the rest. At least the last token is read, for its logits.
        let mut unread: Vec<Vec<u32>> = jobs
            .iter_mut()
            .map(|job| {
                let state = &mut *job.state;
                let history = &job.history[state.start.min(job.history.len())..];
                let same = state
                    .fed
                    .iter()
                    .zip(history)
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(history.len().saturating_sub(1));
                if history.len() - same > MAX_CATCH_UP {
                    *state = RowDraft {
                        caches: self.model.new_caches(),
                        fed: Vec::new(),
                        start: job.history.len() - MAX_CATCH_UP,
                    };
                    return Ok(job.history[state.start..].to_vec());
                }
                state.fed.truncate(same);
                for cache in &mut state.caches {
                    cache.truncate(same as i32)?;
                }
                Ok(history[same..].to_vec())
            })
            .collect::<seedbar_engine::Result<_>>()?;
        // Rows that drafted the step before read at most their drafts and the token after.
        let steady = unread
            .iter()
            .all(|tokens| tokens.len() <= MAX_CATCH_UP_IN_STEADY_ROUNDS);
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); jobs.len()];
        let mut active: Vec<usize> = (0..jobs.len()).filter(|&j| jobs[j].count > 0).collect();
        while !active.is_empty() {
            // Each row's next input: a chunk of what it has not read (as the layout cuts
            // chunks), or its last draft.
            let inputs: Vec<Vec<u32>> = active
                .iter()
                .map(|&j| {
                    let (start, left) = (jobs[j].state.fed.len(), unread[j].len());
                    let end = self.batch.layout().chunk_end(start, start + left, left);
                    unread[j].drain(..end - start).collect()
                })
                .collect();
            let lens: Vec<i32> = inputs.iter().map(|t| t.len() as i32).collect();
            let host: Vec<u32> = inputs.concat();
            let mut caches: Vec<&mut [KvCache]> = Vec::with_capacity(active.len());
            for (j, job) in jobs.iter_mut().enumerate() {
                if active.contains(&j) {
                    caches.push(&mut job.state.caches);
                }
            }
            let input = StepInput {
                lens: &lens,
                host: &host,
                drawn: None,
                embedded: &[],
                positions: &[],
            };
            let logits = self
                .batch
                .run(&self.model, input, &mut caches, Logits::Last, None)?;
            logits.eval()?;
            let all = logits.as_slice::<f32>();
            let width = all.len() / active.len();
            for (n, (&j, input)) in active.iter().zip(inputs).enumerate() {
                jobs[j].state.fed.extend(input);
                if !unread[j].is_empty() {
                    continue; // still catching up
                }
                let token = argmax(&all[n * width..(n + 1) * width]);
                if token as usize >= vocab {
                    jobs[j].count = drafts[j].len();
                    continue;
                }
                drafts[j].push(token);
                unread[j] = vec![token];
            }
            active.retain(|&j| drafts[j].len() < jobs[j].count);
        }
        for job in jobs.iter_mut() {
            self.batch.release(&mut job.state.caches);
        }
        let drafted: usize = drafts.iter().map(Vec::len).sum();
        if drafted > 0 && steady {
            let per_token = started.elapsed().as_secs_f32() / drafted as f32;
            self.token_seconds = follow(self.token_seconds, per_token);
        }
        Ok(drafts)
    }
}

//! A step's drafts (`speculation.rs`, `draft_model.rs`): which decoding rows draft, by prompt
//! lookup or the draft model, and their inputs turned into verify chunks.

use std::{collections::HashMap, sync::atomic::Ordering};

use super::{Input, Worker};
use crate::{draft_model::DraftJob, speculation};

impl Worker {
    /// Whether this scheduler drafts: asked to, on a layout that verifies drafts exactly.
    fn speculates(&self) -> bool {
        self.config.speculative && self.batch.layout().verifies_drafts()
    }

    /// Score each landed token (drawn on the device, in a pipelined step) against what the
    /// row's lookup would have guessed, so a row keeps learning whether drafting pays while
    /// its steps do not draft.
    pub(super) fn score_landed(&mut self, landed: &[(usize, u32)]) {
        if !self.speculates() {
            return;
        }
        for &(i, token) in landed {
            let row = &mut self.rows[i];
            if row.request.speculative {
                let (prompt, generated) = (&row.request.prompt, &row.generated);
                row.speculation.score_guess(prompt, generated, token);
            }
        }
    }

    /// Whether a decoding row may draft next step, which takes the host's draw (its drafts
    /// are looked up in its tokens so far, and verified against logits read back): where
    /// rows whose latest tokens occurred before (their drafts' source; a pipelined step's
    /// token still in flight is not among them) guess well enough to pay among this many
    /// decoding rows, together more than leaving the pipeline costs
    /// (`speculation::drafting_pays`), or any row of text where a draft model is loaded.
    /// Pipelined steps give way to such a step.
    pub(super) fn rows_may_draft(&self) -> bool {
        if !self.speculates() {
            return false;
        }
        let decoding = self.rows.iter().filter(|r| !r.prefilling()).count();
        let fixed = speculation::fixed_cost_in_rows(self.batch.layout());
        let speculating = || {
            self.rows
                .iter()
                .filter(|r| !r.prefilling() && r.request.speculative)
        };
        if self.drafter.is_some() && speculating().any(|r| r.request.images.is_empty()) {
            return true;
        }
        let gains: Vec<f32> = speculating()
            .map(|r| {
                let (prompt, generated) = (&r.request.prompt, &r.generated);
                r.speculation
                    .lookup_gain(prompt, generated, decoding, fixed)
            })
            .collect();
        let leaving = self.costs.leaving_pipeline();
        speculation::drafting_pays(&gains, leaving, decoding, fixed)
    }

    /// Where the scheduler speculates, decoding rows draft tokens after their last one
    /// (`speculation.rs`) with the step's token budget that prefill chunks left (`left`): by
    /// prompt lookup, else (a row of text alone) by the draft model where one is loaded.
    pub(super) fn draft(&mut self, chosen: &mut [(usize, Input)], mut left: usize) {
        if !self.speculates() {
            return;
        }
        let decoding = chosen
            .iter()
            .filter(|(i, _)| !self.rows[*i].prefilling())
            .count();
        let fixed = speculation::fixed_cost_in_rows(self.batch.layout());
        // (index into `chosen`, tokens wanted) of the rows the draft model drafts for.
        let mut for_model = Vec::new();
        for (n, (i, input)) in chosen.iter_mut().enumerate() {
            let row = &mut self.rows[*i];
            if !matches!(input, Input::Host(_)) {
                continue;
            }
            if row.prefilling() || !row.request.speculative || left == 0 {
                continue;
            }
            // Tokens the reply may still take after the one this step draws.
            let room = row
                .request
                .max_tokens
                .saturating_sub(row.generated.len() + 1);
            let drafts = row.speculation.draft(
                &row.request.prompt,
                &row.generated,
                left.min(room),
                (decoding, fixed),
            );
            if drafts.is_empty() {
                if let (Some(drafter), true) = (&self.drafter, row.request.images.is_empty()) {
                    let spent = drafter.token_seconds() + self.costs.verify_token;
                    let cost = spent / self.costs.decode.max(f32::EPSILON);
                    let count = row.speculation.model_draft_len(left.min(room), cost);
                    if count > 0 {
                        left -= count;
                        for_model.push((n, count));
                    }
                }
                continue;
            }
            left -= drafts.len();
            input.add_drafts(drafts);
        }
        if let (Some(drafter), false) = (self.drafter.as_mut(), for_model.is_empty()) {
            let vocab = self.model.config().vocab_size as usize;
            // Row index -> (its place in `chosen`, tokens wanted).
            let wanted: HashMap<usize, (usize, usize)> = for_model
                .iter()
                .map(|&(n, count)| (chosen[n].0, (n, count)))
                .collect();
            let mut slots = Vec::new();
            let mut jobs = Vec::new();
            for (i, row) in self.rows.iter_mut().enumerate() {
                let Some(&(n, count)) = wanted.get(&i) else {
                    continue;
                };
                let history = row.request.prompt.iter().chain(&row.generated);
                slots.push(n);
                jobs.push(DraftJob {
                    history: history.copied().collect(),
                    state: row.draft.get_or_insert_with(|| drafter.row()),
                    count,
                });
            }
            let drafted = match drafter.draft(&mut jobs, vocab) {
                Ok(drafted) => drafted,
                Err(e) => {
                    // A draft model that fails leaves the model without one; its rows go on.
                    tracing::error!("the draft model failed; drafting without it from now on: {e}");
                    self.drafter = None;
                    self.rows.iter_mut().for_each(|row| row.draft = None);
                    return;
                }
            };
            let count: usize = drafted.iter().map(Vec::len).sum();
            self.stats
                .model_drafted_tokens
                .fetch_add(count as u64, Ordering::Relaxed);
            for (n, drafts) in slots.into_iter().zip(drafted) {
                chosen[n].1.add_drafts(drafts);
            }
        }
    }
}

impl Input {
    /// The row's last token (a host input) with `drafts` after it, to verify; unchanged
    /// without drafts.
    fn add_drafts(&mut self, drafts: Vec<u32>) {
        if let (Input::Host(tokens), false) = (&mut *self, drafts.is_empty()) {
            let mut verify = std::mem::take(tokens);
            verify.extend(drafts);
            *self = Input::Verify(verify);
        }
    }
}

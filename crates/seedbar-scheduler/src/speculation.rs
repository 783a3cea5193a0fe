//! Speculative decoding. A decoding row drafts the tokens that followed the last place its
//! latest few tokens appeared in its prompt or reply (prompt lookup), or where that finds
//! nothing, the tokens a draft model guesses (`draft_model.rs`, where one is loaded); it runs
//! its last token and the drafts as one chunk, and keeps each draft while it equals the
//! token the row's own draw picks from the logits before it; at the first difference it
//! takes the draw's token.
//!
//! A kept draft is exactly the token plain decoding would have drawn: a draw is a function
//! of the position's logits, the row's history (penalties, output format) and
//! hash(seed, position), and where the layout verifies drafts
//! ([`Layout::verifies_drafts`](seedbar_engine::step::plan::Layout::verifies_drafts)) a
//! chunk's position gets a decode step's logits. So a reply does not depend on whether, how
//! many or which tokens were drafted; only its speed does. How many tokens a row drafts
//! follows how often each drafter guesses right for it (a lookup's guesses are scored drafted
//! or not; the draft model's when it drafts, and now and then while it does not pay) and how
//! many rows share the step: a row whose guesses do not pay drafts nothing.

use seedbar_engine::{
    step::plan::{Layout, Products},
    Model,
};

use crate::{
    draw::{Draw, Noise},
    images::is_image_key,
    row::{take_drawn, Row},
};

/// The most tokens a row drafts in one step (what a pooled verify chunk holds).
const MAX_DRAFT: usize = seedbar_engine::step::kv_cache::MAX_DRAFTS as usize;
/// The n-gram sizes looked up, longest first: a longer match predicts better, and a single
/// token matches too often to pay.
const NGRAMS: [usize; 3] = [4, 3, 2];
/// A step's cost that does not grow with its rows, in rows, on a layout of the CPU: on the
/// packed path one row decodes in about 17 ms and each row more adds about 5 ms
/// (SmolLM2-135M Q4_1, 2 cores).
const CPU_FIXED_COST_IN_ROWS: f32 = 2.3;
/// The same on CUDA's row kernels, which read each weight once for up to 32 rows: on an H100
/// one seeded stream of an 8B-shape 4-bit model ran 92 tok/s and eight 470, so each row adds
/// about 0.08 of a one-row step (a 1B-shape bf16 one: 0.04).
const ROW_KERNELS_FIXED_COST_IN_ROWS: f32 = 11.0;

/// A step's cost that does not grow with its rows, in rows, on `layout`.
pub(crate) fn fixed_cost_in_rows(layout: &Layout) -> f32 {
    if layout.products == Products::RowWise {
        ROW_KERNELS_FIXED_COST_IN_ROWS
    } else {
        CPU_FIXED_COST_IN_ROWS
    }
}
/// How fast a row's hit rate follows its lookups.
const HIT_RATE_WEIGHT: f32 = 0.15;
/// The most tokens a draft model drafts for a row in one step: each is a step of the draft
/// model, run before the target's.
pub(crate) const MAX_MODEL_DRAFT: usize = 6;
/// Where the draft model's drafts do not pay for a row (at its hit rate: a draft model too
/// slow to pay at any is not tried), it still drafts one token now and then, to notice when
/// they would again: after this many steps, twice as many after each probe that did not
/// bring the drafts back, at most [`MODEL_PROBE_MAX`].
const MODEL_PROBE_FIRST: u32 = 32;
/// How much more a drafted token costs than measured (sampled chats drafting at the edge of
/// paying ran 0.91x with none).
const MODEL_COST_MARGIN: f32 = 1.25;
const MODEL_PROBE_MAX: u32 = 1024;

/// Who drafted a row's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drafter {
    Lookup,
    Model,
}

/// One row's drafting: how often its lookups guess the next token, learnt from every step,
/// drafted or not, and how often the draft model's do, learnt from its drafts.
#[derive(Debug, Clone)]
pub(crate) struct Speculation {
    hit_rate: f32,
    /// The lookup's next token where the row did not draft, scored against the draw.
    guess: Option<u32>,
    model_hit_rate: f32,
    /// Steps since the draft model last drafted for the row.
    model_idle: u32,
    /// Steps between probes while the draft model's drafts do not pay.
    model_probe_every: u32,
    /// Who drafted the tokens verified this step.
    drafter: Drafter,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            hit_rate: 0.5,
            guess: None,
            // A draft model is chosen to agree with its target: trusted until it does not.
            model_hit_rate: 0.6,
            model_idle: 0,
            model_probe_every: MODEL_PROBE_FIRST,
            drafter: Drafter::Lookup,
        }
    }
}

/// How many tokens to draft with a hit rate of `p` in a step of `rows` decoding rows whose
/// fixed cost is `fixed` rows. A drafted token costs what a row does; the `j`-th is kept
/// with chance `p^j` (each kept only after the ones before it), and a kept one saves its row
/// a later step: a row plus the step's fixed cost shared among its rows. So the `j`-th pays
/// while `p^j > rows / (rows + fixed)` (on the CPU 0.3 alone, 0.78 among 8).
fn draft_len(p: f32, rows: usize, fixed: f32) -> usize {
    tokens_that_pay(p, rows as f32 / (rows as f32 + fixed), MAX_DRAFT)
}

/// How many drafted tokens pay, at most `max`, where the `j`-th is kept with chance `p^j`
/// and pays while `p^j > worth`.
fn tokens_that_pay(p: f32, worth: f32, max: usize) -> usize {
    if worth >= 1.0 || p <= worth {
        0
    } else if p >= 1.0 {
        max
    } else {
        ((worth.ln() / p.ln()) as usize).min(max)
    }
}

/// What drafting gains a row with a hit rate of `p` in a step of `rows` decoding rows whose
/// fixed cost is `fixed` rows, in rows: each token it drafts ([`draft_len`]) costs a row and,
/// kept with chance `p^j`, saves the row its share of a step. 0 where no draft pays.
fn draft_gain(p: f32, rows: usize, fixed: f32) -> f32 {
    let share = (rows as f32 + fixed) / rows as f32;
    (1..=draft_len(p, rows, fixed) as i32)
        .map(|j| p.powi(j) * share - 1.0)
        .sum()
}

/// Whether a step where rows draft by lookup pays: some row's drafts do (`gains`, each
/// row's [`Speculation::lookup_gain`]), and together they gain what leaving the pipeline
/// costs: `leaving` of a step (`StepCosts::leaving_pipeline`, 0 where steps do not
/// pipeline) of `rows` decoding rows whose fixed cost is `fixed` rows.
pub(crate) fn drafting_pays(gains: &[f32], leaving: f32, rows: usize, fixed: f32) -> bool {
    gains.iter().any(|&g| g > 0.0) && gains.iter().sum::<f32>() >= leaving * (rows as f32 + fixed)
}

/// How many tokens a draft model drafts with a hit rate of `p`, a drafted token costing
/// `cost` of a decode step (the draft model's share of a round and the target's for
/// verifying it, as measured): the `j`-th is kept with chance `p^j`, and a kept one saves a
/// step, so it pays while `p^j > cost` (with [`MODEL_COST_MARGIN`] for what the measures
/// leave out: a round's bookkeeping, the caches the draft model's steps take over).
fn model_len(p: f32, cost: f32) -> usize {
    tokens_that_pay(p, cost * MODEL_COST_MARGIN, MAX_MODEL_DRAFT)
}

impl Speculation {
    /// At most `limit` tokens to run after the row's last one, looked up in `prompt` then
    /// `generated`, in a step of `rows` decoding rows whose fixed cost is `fixed` rows: none
    /// when nothing matches or the row's lookups do not guess well enough to pay there.
    pub(crate) fn draft(
        &mut self,
        prompt: &[u32],
        generated: &[u32],
        limit: usize,
        (rows, fixed): (usize, f32),
    ) -> Vec<u32> {
        let history = history(prompt, generated);
        let len = draft_len(self.hit_rate, rows, fixed).min(limit);
        let mut drafts = lookup(&history, len.max(1));
        // An image's keys are not tokens: drafts end before one.
        if let Some(key) = drafts.iter().position(|&t| is_image_key(t)) {
            drafts.truncate(key);
        }
        self.guess = None;
        self.drafter = Drafter::Lookup;
        if len == 0 {
            self.guess = drafts.first().copied();
            drafts.clear();
        }
        drafts
    }

    /// What the row's lookups would gain by drafting after `prompt` and `generated` in a
    /// step of `rows` decoding rows whose fixed cost is `fixed` rows ([`draft_gain`]): 0
    /// where its latest tokens occur nowhere before (nothing to draft).
    pub(crate) fn lookup_gain(
        &self,
        prompt: &[u32],
        generated: &[u32],
        rows: usize,
        fixed: f32,
    ) -> f32 {
        let gain = draft_gain(self.hit_rate, rows, fixed);
        // The lookup scans the row's history: only where a draft would pay.
        if gain > 0.0 && lookup(&history(prompt, generated), 1).is_empty() {
            return 0.0;
        }
        gain
    }

    /// How many tokens the draft model drafts for the row (at most `limit`), a drafted
    /// token costing `cost` of a decode step; it drafts them unless that is none.
    pub(crate) fn model_draft_len(&mut self, limit: usize, cost: f32) -> usize {
        let mut len = model_len(self.model_hit_rate, cost);
        self.model_idle += 1;
        // Drafts that would not pay even if every one were kept are not worth a probe.
        let could_pay = model_len(1.0, cost) > 0;
        if len > 0 {
            self.model_probe_every = MODEL_PROBE_FIRST;
        } else if could_pay && self.model_idle >= self.model_probe_every {
            len = 1;
            self.model_probe_every = (self.model_probe_every * 2).min(MODEL_PROBE_MAX);
        }
        let len = len.min(limit);
        if len > 0 {
            self.model_idle = 0;
            self.drafter = Drafter::Model;
        }
        len
    }

    /// The token drawn in a step where the row did not draft: scores its guess.
    pub(crate) fn observe(&mut self, token: u32) {
        if let Some(guess) = self.guess.take() {
            self.score(Drafter::Lookup, guess == token);
        }
    }

    /// The token drawn after `prompt` and `generated` where the row could not draft (a
    /// pipelined step): scores what its lookup would have guessed.
    pub(crate) fn score_guess(&mut self, prompt: &[u32], generated: &[u32], token: u32) {
        if let Some(&guess) = lookup(&history(prompt, generated), 1).first() {
            self.score(Drafter::Lookup, guess == token);
        }
    }

    /// Learn from a verification that kept `kept` of `drafted` tokens (of this step's
    /// drafter).
    pub(crate) fn learn(&mut self, drafted: usize, kept: usize) {
        for _ in 0..kept {
            self.score(self.drafter, true);
        }
        if kept < drafted {
            self.score(self.drafter, false);
        }
    }

    fn score(&mut self, drafter: Drafter, hit: bool) {
        let hit = if hit { 1.0 } else { 0.0 };
        let rate = match drafter {
            Drafter::Lookup => &mut self.hit_rate,
            Drafter::Model => &mut self.model_hit_rate,
        };
        *rate += HIT_RATE_WEIGHT * (hit - *rate);
    }
}

/// A row's tokens so far, where its lookups search.
fn history(prompt: &[u32], generated: &[u32]) -> Vec<u32> {
    prompt.iter().chain(generated).copied().collect()
}

/// The tokens that followed the latest earlier occurrence of `history`'s last n tokens (the
/// longest n of [`NGRAMS`] that occurs), at most `max` of them.
pub(crate) fn lookup(history: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for n in NGRAMS {
        let Some(tail_start) = history.len().checked_sub(n) else {
            continue;
        };
        let tail = &history[tail_start..];
        if let Some(start) = (0..tail_start).rev().find(|&s| &history[s..s + n] == tail) {
            let from = start + n;
            return history[from..(from + max).min(history.len())].to_vec();
        }
    }
    Vec::new()
}

/// Go on through a speculating row's drafts after its first draw (`first`, already
/// streamed): while the last token drawn equals the next draft, that draft's position is
/// one plain decoding reaches too, so the token after it is drawn from its logits
/// (`logits[k]`: the logits at the row's `k`-th input, its last token being the 0th) and
/// streamed. Returns how many drafts were kept: their KV stands, the rest is cut.
pub(crate) fn verify(
    row: &mut Row,
    first: u32,
    drafts: &[u32],
    logits: &[f32],
    vocab: usize,
    model: &Model,
) -> usize {
    let mut kept = 0;
    let mut last = first;
    while kept < drafts.len() && !row.finished && last == drafts[kept] {
        kept += 1;
        let logits = &logits[kept * vocab..(kept + 1) * vocab];
        let allowed = row.allowed_next();
        if row.finished {
            break;
        }
        let position = (row.request.prompt.len() + row.generated.len()) as u64;
        let token = Draw {
            sampling: &row.request.sampling,
            prompt: &row.request.prompt,
            generated: &row.generated,
            logits,
            allowed: allowed.as_ref(),
            noise: Noise::At(position),
        }
        .token();
        if !take_drawn(row, token, logits, model) {
            break;
        }
        last = token;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_match_of_the_longest_ngram() {
        // "1 2 3" occurs twice before the tail; the later one is followed by 7 8.
        let history = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3];
        assert_eq!(lookup(&history, 2), [7, 8]);
        assert_eq!(lookup(&history, 10), [7, 8, 6, 1, 2, 3]);
        // Only a 2-gram matches.
        assert_eq!(lookup(&[5, 6, 7, 0, 6, 7], 3), [0, 6, 7]);
        // Nothing matches, or nothing is wanted.
        assert!(lookup(&[1, 2, 3, 4], 4).is_empty());
        assert!(lookup(&history, 0).is_empty());
    }

    #[test]
    fn a_pipelined_scheduler_drafts_where_the_gain_covers_leaving_the_pipeline() {
        let gpu = ROW_KERNELS_FIXED_COST_IN_ROWS;
        let gain = |p: f32, rows: usize| draft_gain(p, rows, gpu);
        assert_eq!(gain(0.05, 1), 0.0, "no draft pays");
        assert!(gain(0.3, 1) > 0.0);
        // Where steps do not pipeline (the CPU), any row whose drafts pay drafts.
        assert!(drafting_pays(&[gain(0.3, 1)], 0.0, 1, gpu));
        assert!(!drafting_pays(&[gain(0.05, 1)], 0.0, 1, gpu));
        // A host step half as long again as a pipelined one: a row guessing 3 in 10 does
        // not make up for it, one guessing 9 in 10 does.
        assert!(!drafting_pays(&[gain(0.3, 1)], 0.5, 1, gpu));
        assert!(drafting_pays(&[gain(0.9, 1)], 0.5, 1, gpu));
        // Rows share the cost: eight rows guessing 9 in 10 pay where one of them alone
        // among eight does not.
        let eight = [gain(0.9, 8); 8];
        assert!(drafting_pays(&eight, 0.5, 8, gpu));
        assert!(!drafting_pays(&eight[..1], 0.5, 8, gpu));
        // A row whose latest tokens occur nowhere before has nothing to draft, whatever its
        // hit rate: it does not take the scheduler off the pipeline.
        let row = Speculation::default();
        assert_eq!(row.lookup_gain(&[1, 2, 3], &[4, 5], 1, gpu), 0.0);
        assert_eq!(
            row.lookup_gain(&[1, 2, 3], &[1, 2], 1, gpu),
            gain(row.hit_rate, 1)
        );
        assert!(gain(row.hit_rate, 1) > 0.0);
    }

    #[test]
    fn drafts_grow_with_the_hit_rate_and_stop_where_they_do_not_pay() {
        let cpu = CPU_FIXED_COST_IN_ROWS;
        assert_eq!(draft_len(0.5, 1, cpu), 1);
        assert_eq!(draft_len(0.9, 1, cpu), 11);
        assert_eq!(draft_len(0.99, 1, cpu), MAX_DRAFT);
        assert_eq!(draft_len(0.25, 1, cpu), 0);
        assert_eq!(
            draft_len(0.75, 8, cpu),
            0,
            "among 8 rows a draft needs a better hit rate"
        );
        assert_eq!(draft_len(0.9, 8, cpu), 2);
        // Where rows cost little beside the step (CUDA's row kernels), drafts pay sooner.
        let gpu = ROW_KERNELS_FIXED_COST_IN_ROWS;
        assert_eq!(draft_len(0.25, 1, gpu), 1);
        assert_eq!(draft_len(0.75, 8, gpu), 3);
        let history = [1, 2, 1, 2];
        let mut s = Speculation::default();
        assert_eq!(
            s.draft(&history, &[], 4, (1, cpu)),
            [1],
            "alone, a fresh row drafts"
        );
        for _ in 0..6 {
            s.learn(1, 0);
        }
        assert!(
            s.draft(&history, &[], 4, (1, cpu)).is_empty(),
            "missed too often"
        );
        // Guesses it did not run still teach it: right ones bring the drafts back, and
        // drafts kept make them longer.
        for _ in 0..20 {
            match s.draft(&history, &[], 4, (1, cpu)) {
                drafts if drafts.is_empty() => s.observe(1),
                drafts => s.learn(drafts.len(), drafts.len()),
            }
        }
        assert_eq!(s.draft(&history, &[], 4, (1, cpu)), [1, 2]);
    }

    #[test]
    fn a_draft_model_drafts_where_its_kept_rate_pays_for_its_cost() {
        // Kept 9 times in 10 and a token costing a fifth of a step: several tokens.
        assert_eq!(model_len(0.9, 0.2), MAX_MODEL_DRAFT);
        assert_eq!(model_len(0.6, 0.2), 2);
        assert_eq!(model_len(0.6, 0.5), 0, "0.6 < 1.25 x 0.5");
        assert_eq!(model_len(1.0, 0.9), 0, "too slow to pay at any rate");
        let mut s = Speculation::default();
        assert_eq!(
            s.model_draft_len(6, 0.1),
            4,
            "a fresh row trusts its draft model"
        );
        s.learn(4, 0);
        s.learn(4, 0);
        s.learn(4, 0);
        let steps = |s: &mut Speculation, cost: f32, n: usize| -> Vec<usize> {
            (0..n).map(|_| s.model_draft_len(6, cost)).collect()
        };
        // Missed: it stops, then probes one token after 32 steps, 64 after that, ...
        let first = steps(&mut s, 0.3, 32);
        assert_eq!(first.iter().filter(|&&n| n > 0).count(), 1);
        assert_eq!(first[31], 1);
        let next = steps(&mut s, 0.3, 64);
        assert_eq!(next.iter().position(|&n| n > 0), Some(63));
        // ... and never where even kept drafts would not pay.
        assert!(steps(&mut s, 0.9, 2000).iter().all(|&n| n == 0));
        // Kept probes bring it back.
        for _ in 0..10 {
            s.learn(1, 1);
        }
        assert!(s.model_draft_len(6, 0.3) > 0);
    }
}

//! What the scheduler's steps cost, learnt as they run: what a kept draft saves (a decode
//! step), what a drafted token adds to the step that verifies it, and, on a pipelined
//! scheduler, what leaving the pipeline costs. A step where a row drafts is a host step (its
//! drafts are verified against logits read back), and a host step does not overlap the
//! device's work with the host's: the device idles while the host builds it, and the host
//! while the device runs it. The drafting rules (`speculation.rs`) weigh drafts against
//! these figures.

use std::time::Instant;

/// How fast the averages follow new steps.
const STEP_TIME_WEIGHT: f32 = 0.1;

/// `average` moved towards `sample` (`sample` itself where there was none yet).
pub(crate) fn follow(average: f32, sample: f32) -> f32 {
    if average == 0.0 {
        sample
    } else {
        average + STEP_TIME_WEIGHT * (sample - average)
    }
}

/// The rows a step ran: their count and the sum of their ids. A period between two steps is
/// a step's cost only where the same rows ran both (no arrival, finish or idle wait between
/// them).
pub(crate) type StepRows = (usize, u64);

/// The last step: when it started, its rows, and `Some(pipelined)` once it is known to be a
/// step of decoding rows alone (no prefill chunk; a row's drafts may be verified in a host
/// step).
#[derive(Debug)]
struct LastStep {
    at: Instant,
    rows: StepRows,
    decoding: Option<bool>,
}

/// The averages, in seconds (each 0 until measured).
#[derive(Debug, Default)]
pub(crate) struct StepCosts {
    /// A step of decode tokens alone, from its rows being chosen to its tokens emitted.
    pub decode: f32,
    /// What a drafted token adds to a step that verifies it.
    pub verify_token: f32,
    /// From the start of a step of decoding rows to the next one's, pipelined and on the
    /// host (the host's with the drafts it verified: a little more than leaving the
    /// pipeline costs, so drafting errs towards not leaving it).
    pipelined_period: f32,
    host_period: f32,
    last: Option<LastStep>,
}

impl StepCosts {
    /// A step of `rows` starts at `at`: the period since the last one is that step's cost
    /// where both ran the same rows and the last was a step of decoding rows.
    pub(crate) fn started(&mut self, at: Instant, rows: StepRows) {
        if let Some(last) = self.last.take() {
            if last.rows == rows {
                let period = at.duration_since(last.at).as_secs_f32();
                match last.decoding {
                    Some(true) => self.pipelined_period = follow(self.pipelined_period, period),
                    Some(false) => self.host_period = follow(self.host_period, period),
                    None => {}
                }
            }
        }
        self.last = Some(LastStep {
            at,
            rows,
            decoding: None,
        });
    }

    /// What the step that started last turned out to be (known once it is chosen).
    pub(crate) fn ran(&mut self, decoding: Option<bool>) {
        if let Some(last) = &mut self.last {
            last.decoding = decoding;
        }
    }

    /// A step of decode tokens alone took `took`, or one that verified `drafted` tokens
    /// beside decode tokens alone did.
    pub(crate) fn measured(&mut self, took: f32, drafted: usize) {
        if drafted == 0 {
            self.decode = follow(self.decode, took);
        } else {
            let per_draft = (took - self.decode).max(0.0) / drafted as f32;
            self.verify_token = follow(self.verify_token, per_draft);
        }
    }

    /// What a host step costs more than a pipelined one, as a share of a pipelined step: 0
    /// until both were measured (and on a scheduler that does not pipeline).
    pub(crate) fn leaving_pipeline(&self) -> f32 {
        if self.pipelined_period == 0.0 || self.host_period == 0.0 {
            return 0.0;
        }
        ((self.host_period - self.pipelined_period) / self.pipelined_period).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rows(n: usize) -> StepRows {
        (n, n as u64)
    }

    /// Plain steps of `ms` milliseconds each, `pipelined` or not, from `at`.
    fn run(costs: &mut StepCosts, at: &mut Instant, steps: usize, ms: u64, pipelined: bool) {
        for _ in 0..steps {
            costs.started(*at, rows(1));
            costs.ran(Some(pipelined));
            *at += Duration::from_millis(ms);
        }
    }

    #[test]
    fn a_host_step_costs_what_it_takes_more_than_a_pipelined_one() {
        let mut costs = StepCosts::default();
        let mut at = Instant::now();
        run(&mut costs, &mut at, 5, 4, true);
        assert_eq!(costs.leaving_pipeline(), 0.0, "no host step measured yet");
        run(&mut costs, &mut at, 5, 6, false);
        // The first host step's period is measured at the next step's start.
        costs.started(at, rows(1));
        let share = costs.leaving_pipeline();
        assert!((share - 0.5).abs() < 1e-3, "{share}");
    }

    #[test]
    fn periods_across_other_rows_or_other_steps_are_not_measured() {
        let mut costs = StepCosts::default();
        let at = Instant::now();
        costs.started(at, rows(1));
        costs.ran(Some(true));
        // A row arrived (or an idle wait passed) before the next step: not a step's cost.
        costs.started(at + Duration::from_secs(5), rows(2));
        // A prefill step's period is not a decoding one's either.
        costs.ran(None);
        costs.started(at + Duration::from_secs(6), rows(2));
        costs.ran(Some(false));
        costs.started(at + Duration::from_secs(7), rows(2));
        assert_eq!(costs.pipelined_period, 0.0);
        assert!((costs.host_period - 1.0).abs() < 1e-6);
        assert_eq!(costs.leaving_pipeline(), 0.0, "no pipelined period yet");
    }
}

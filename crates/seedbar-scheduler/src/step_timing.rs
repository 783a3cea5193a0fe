//! Where the engine thread's time goes, by phase of a step, summed since the last
//! [`StepTimes::take`]: what `seedbar bench throughput` prints to show what bounds a step on
//! a backend (graph construction, the wait for the device, constraint masks, the draw with
//! its read of the logits, streaming the tokens out).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// A part of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Building the step's lazy graph (the plan, the forward pass's ops).
    Build,
    /// MLX's evaluation: launching the step's kernels and waiting for the device.
    Eval,
    /// The output formats' token masks for the rows drawn this step.
    Mask,
    /// After the device: the noise not yet computed, reading the logits (on CUDA, the copy
    /// of device memory to the host), penalties, filters and the seeded draw.
    Draw,
    /// Detokenization, stop strings, events.
    Emit,
    /// The whole step, admission and retirement included (the rest is this minus the
    /// parts above).
    Step,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Build,
        Phase::Eval,
        Phase::Mask,
        Phase::Draw,
        Phase::Emit,
        Phase::Step,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Build => "build",
            Phase::Eval => "eval_wait",
            Phase::Mask => "mask",
            Phase::Draw => "draw",
            Phase::Emit => "emit",
            Phase::Step => "step",
        }
    }
}

/// Nanoseconds per phase and the number of steps, summed by the engine thread.
#[derive(Debug, Default)]
pub struct StepTimes {
    nanos: [AtomicU64; Phase::ALL.len()],
    steps: AtomicU64,
}

/// What [`StepTimes::take`] returns: steps counted and the time each phase took in all.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBreakdown {
    pub steps: u64,
    pub phases: Vec<(Phase, Duration)>,
}

impl StepTimes {
    /// Count the time since `since` to `phase`; returns now, where the next phase starts.
    pub(crate) fn lap(&self, phase: Phase, since: Instant) -> Instant {
        let now = Instant::now();
        let nanos = now.duration_since(since).as_nanos() as u64;
        self.nanos[phase as usize].fetch_add(nanos, Ordering::Relaxed);
        now
    }

    pub(crate) fn count_step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// The sums since the last call, and start again from zero.
    pub fn take(&self) -> StepBreakdown {
        StepBreakdown {
            steps: self.steps.swap(0, Ordering::Relaxed),
            phases: Phase::ALL
                .iter()
                .map(|&p| {
                    let nanos = self.nanos[p as usize].swap(0, Ordering::Relaxed);
                    (p, Duration::from_nanos(nanos))
                })
                .collect(),
        }
    }
}

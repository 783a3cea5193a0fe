//! What a running scheduler reports: its counters, where its steps' time went, and the
//! traces of rows that asked for one.

use std::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize},
    Mutex,
};

use crate::step_timing::StepTimes;
#[cfg(doc)]
use crate::Request;
#[cfg(doc)]
use seedbar_engine::row_trace::RowTrace;

/// Counters the server exposes.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    pub running: AtomicUsize,
    pub queued: AtomicUsize,
    pub steps: AtomicU64,
    /// Of the steps, those drawn on the device and built before the last one's tokens
    /// were read (the others drew on the host: a row drafted, or needed the host's draw).
    pub pipelined_steps: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens rows drafted (by prompt lookup or the draft model), and of those the ones
    /// verification kept.
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Of the drafted tokens, the draft model's.
    pub model_drafted_tokens: AtomicU64,
    /// Set once the engine thread has ended (shut down, or failed).
    pub stopped: AtomicBool,
    /// Where the steps' time went.
    pub times: StepTimes,
    /// One record per step that ran a row whose request asked for a trace.
    pub traces: Mutex<Vec<TraceRecord>>,
}

/// A traced row's numbers through one step ([`Request::trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRecord {
    /// The row's first position this step (the KV it held before it).
    pub position: usize,
    /// Its tokens this step.
    pub tokens: usize,
    /// Hashes of its positions after each layer's attention and MLP, then of its logits
    /// ([`RowTrace::hashes`]).
    pub hashes: Vec<u64>,
    /// The step around it: every row's token count, the matmul groups, the row's place.
    pub step: String,
}

//! What a scheduler is started with: its limits and layout, and the seeds it draws for
//! requests that bring none.

use std::hash::{BuildHasher, RandomState};

use crate::disk_cache::DiskTier;
use seedbar_engine::{
    runtime,
    step::plan::{Layout, PREFILL_CHUNK},
};

/// Limits and layout of the engine thread.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Rows decoded together in one step.
    pub max_rows: usize,
    /// Requests waiting for a row; beyond this `submit` answers `QueueFull`.
    pub max_queue: usize,
    /// Prompt plus reply, in tokens.
    pub max_context: usize,
    /// Let `max_context` run past the model's trained context (its `max_position_embeddings`)
    /// instead of stopping there: positions past it are extrapolated, so replies there
    /// degrade (long-prompt benchmarks, experiments).
    pub past_trained_context: bool,
    /// Prefill tokens per step, bounding the pause running streams see while a long prompt
    /// is prefilled (at least one whole chunk always runs).
    pub prefill_tokens_per_step: usize,
    /// Bytes of KV of finished sequences kept for prefix reuse.
    pub prefix_cache_bytes: usize,
    /// The disk tier under that RAM, if any (`disk_cache.rs`).
    pub disk_cache: Option<DiskTier>,
    /// `true` (the product): the model's batch-invariant layout (`Model::layout`) and
    /// prefill chunks aligned to absolute positions, so seeded replies do not depend on the
    /// batch. `false` is the fastest layout without that promise (`Layout::REFERENCE`:
    /// padded batched decode attention, prefill chunks as long as the budget allows), kept
    /// to measure what invariance costs.
    pub batch_invariant: bool,
    /// Another backend's invariant layout instead of this one's (tests run a GPU's pooled
    /// layout on the CPU with it); needs `batch_invariant`.
    pub layout: Option<Layout>,
    /// Draw on the device and build each step before the previous one's tokens are read,
    /// where every row's sampling allows it (`Worker::step`): a GPU's default, so the host
    /// builds, reads and streams while the device runs. The tokens are the host draw's.
    pub pipelined: bool,
    /// Decoding rows draft tokens by prompt lookup (and a draft model, where the scheduler
    /// was started with one: `Scheduler::start_drafting`) and verify them in the step
    /// (`speculation.rs`), where the layout verifies drafts exactly (`Layout::verifies_drafts`:
    /// the CPU's packed path, CUDA's); a pipelined step gives way to a host step where a row
    /// may draft. Replies are the same with it on or off.
    pub speculative: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            // A GPU's matmuls cost the same for a few rows as for one: more rows pay. On the
            // CPU decoding is bound by reading the weights once a step up to about 16 rows
            // (the packed kernels), and a 9th to 16th chat would otherwise queue for a row.
            max_rows: if runtime::default_device_is_gpu() {
                32
            } else {
                16
            },
            max_queue: 64,
            max_context: 8192,
            past_trained_context: false,
            // Two CPU chunks. A GPU's 512-token chunk is longer and runs alone (at least one
            // chunk always runs): about 7 ms for a 1B model on an H200 (70k tokens/s).
            prefill_tokens_per_step: 2 * PREFILL_CHUNK,
            prefix_cache_bytes: 512 << 20,
            disk_cache: None,
            batch_invariant: true,
            layout: None,
            pipelined: runtime::default_device_is_gpu(),
            speculative: true,
        }
    }
}

/// A fresh seed from OS entropy, below 2^53 so it survives a round trip through JSON
/// numbers in JavaScript (the chat UI pins them).
pub fn draw_seed() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now()) >> 11
}

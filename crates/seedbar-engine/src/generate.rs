//! Single-sequence forward passes (aligned chunked prefill, one decode step) used by
//! benchmarks and probes, and the types replies are described with.

use crate::{
    error::{EngineError, Result},
    kv_cache::{KvCache, KvPool},
    model::Model,
    models::Logits,
    step_plan::{Layout, StepPlan},
};

/// Prompts are prefilled in chunks that start at multiples of this absolute position, so a
/// prompt's numerics never depend on how it arrived.
pub const PREFILL_CHUNK: usize = 128;

/// One sequence's KV for the single-sequence passes: its per-layer caches (the prefilled
/// positions) and the pool its decode steps write where the layout pools decode KV.
pub struct Sequence {
    pub caches: Vec<KvCache>,
    pool: KvPool,
}

impl Sequence {
    /// Bytes of keys and values the sequence holds, in its caches and its pool.
    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::bytes).sum::<usize>() + self.pool.bytes()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// One of the request's stop strings (this index in its list) matched.
    StopString(usize),
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopString(_) => "stop",
            FinishReason::Length => "length",
        }
    }
}

impl Model {
    /// The batch-invariant layout of this model's steps on this process's backend.
    pub fn layout(&self) -> Layout {
        Layout::invariant(self.transformer.weight_kind())
    }

    /// An empty sequence for [`prefill`](Self::prefill) and [`step`](Self::step).
    pub fn sequence(&self) -> Sequence {
        Sequence {
            caches: self.transformer.new_caches(),
            pool: KvPool::default(),
        }
    }

    /// Run `tokens` through the model in aligned chunks; returns the last position's logits.
    pub fn prefill(&self, tokens: &[u32], sequence: &mut Sequence) -> Result<Vec<f32>> {
        let mut start = sequence.caches.first().map_or(0, |c| c.len() as usize);
        let mut remaining = tokens;
        let mut logits = None;
        while !remaining.is_empty() {
            let take = (PREFILL_CHUNK - start % PREFILL_CHUNK).min(remaining.len());
            let (chunk, rest) = remaining.split_at(take);
            logits = Some(self.step(chunk, sequence)?);
            remaining = rest;
            start += take;
        }
        logits.ok_or_else(|| EngineError::InvalidRequest("the prompt is empty".into()))
    }

    /// One forward pass over `tokens` appended to the sequence; last position's logits.
    pub fn step(&self, tokens: &[u32], sequence: &mut Sequence) -> Result<Vec<f32>> {
        let plan = StepPlan::new(&self.layout(), &[tokens.len() as i32]);
        let logits = self.transformer.forward(
            tokens,
            &plan,
            &mut [&mut sequence.caches],
            &mut sequence.pool,
            Logits::Last,
        )?;
        logits.eval()?;
        Ok(logits.as_slice::<f32>().to_vec())
    }
}

//! The entry point for running a step: a [`Batch`] holds one model's layout and its decode
//! pool, lays each step's rows out ([`StepPlan`]) and runs the model's pass over them. The
//! scheduler's worker and the single-sequence passes (`sequence.rs`) both step through it;
//! a model implements [`Forward`], its math over a step already laid out.

use mlx_rs::Array;

use super::{
    groups::{Embedded, Logits, StepTokens},
    kv_cache::{KvCache, KvPool},
    plan::{Layout, StepPlan},
    positions::RowPositions,
};
use crate::{error::Result, row_trace::RowTrace};

/// A model's pass over one laid-out step (`architectures::Transformer` and `Model` implement it):
/// `tokens` holds each row's new tokens end to end (`plan.slots[i].len` of them for row
/// `i`), `caches[i]` is row `i`'s per-layer cache, and `pool` holds decoding rows' KV where
/// the layout pools it. Returns float32 logits: `[1, rows, V]` for each row's last
/// position, or `[1, N, V]` for every position. `trace` keeps one row's numbers.
pub trait Forward {
    fn forward(
        &self,
        tokens: StepTokens,
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        pool: &mut KvPool,
        logits: Logits<'_>,
        trace: Option<&mut RowTrace>,
    ) -> Result<Array>;
}

/// One step's rows: how many tokens each runs, and those tokens end to end, in row order.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    pub lens: &'a [i32],
    /// Every input token; a placeholder where `drawn` supplies it.
    pub host: &'a [u32],
    /// Tokens drawn on the device by the previous step (`[n]` uint32, lazy: a step is built
    /// before the one it follows is read) and, per input token, its index there when it is
    /// one of them.
    pub drawn: Option<(&'a Array, &'a [Option<i32>])>,
    /// Input positions that embed as given features (images' soft tokens).
    pub embedded: &'a [Embedded<'a>],
    /// Each row's rotary positions, for a model with multimodal RoPE whose rows hold
    /// images; empty: each token rotates by its sequence index.
    pub positions: &'a [RowPositions],
}

impl<'a> StepInput<'a> {
    /// One row running `tokens`, all known on the host.
    pub fn one_row(lens: &'a [i32; 1], tokens: &'a [u32]) -> Self {
        StepInput {
            lens,
            host: tokens,
            drawn: None,
            embedded: &[],
            positions: &[],
        }
    }
}

/// Runs a model's steps under one layout, keeping the decode pool between them.
pub struct Batch {
    layout: Layout,
    /// Decoding rows' KV where the layout pools it (rows leave with [`Batch::release`]).
    pool: KvPool,
}

impl Batch {
    pub fn new(layout: Layout) -> Batch {
        Batch {
            pool: KvPool::new(layout.pool_call_slots, layout.pooled),
            layout,
        }
    }

    /// How steps are laid out: where prefill chunks end, what the prefix cache may reuse.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Bytes of keys and values in the pool.
    pub fn kv_bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Give a retiring row's pooled KV back (its caches then hold what it wrote).
    pub fn release(&mut self, caches: &mut [KvCache]) {
        self.pool.release(caches);
    }

    /// Drop every pooled row's KV (after the engine failed mid-step).
    pub fn clear(&mut self) {
        self.pool = KvPool::new(self.layout.pool_call_slots, self.layout.pooled);
    }

    /// Run one step of `input`'s rows over their caches (`caches[i]` row `i`'s per-layer
    /// cache): the lazy logits ([`Forward`]). A traced row's record gets the step's make-up.
    pub fn run(
        &mut self,
        model: &impl Forward,
        input: StepInput,
        caches: &mut [&mut [KvCache]],
        logits: Logits<'_>,
        mut trace: Option<&mut RowTrace>,
    ) -> Result<Array> {
        // A row drawing at more than its last position verifies drafted tokens.
        let verify: Vec<bool> = match logits {
            Logits::Tails(n) => n.iter().map(|&n| n > 1).collect(),
            _ => Vec::new(),
        };
        let plan = StepPlan::new(&self.layout, input.lens, &verify).placed(input.positions);
        let tokens = StepTokens {
            host: input.host,
            drawn: input.drawn,
            embedded: input.embedded,
        };
        let out = model.forward(
            tokens,
            &plan,
            caches,
            &mut self.pool,
            logits,
            trace.as_deref_mut(),
        )?;
        if let Some(trace) = trace {
            let n = trace.row;
            trace.step = format!(
                "lens {:?}, widths {:?}, row {n} at {:?}, pooled {:?}",
                input.lens,
                plan.widths,
                plan.slots[n],
                caches[n].first().and_then(KvCache::pooled)
            );
        }
        Ok(out)
    }
}

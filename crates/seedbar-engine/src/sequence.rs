//! Single-sequence forward passes (aligned chunked prefill, one decode step) used by
//! benchmarks and probes, each a step of the sequence's own [`Batch`].

use std::time::{Duration, Instant};

use mlx_rs::{ops::indexing::argmax_axis, transforms::async_eval, Array};

use crate::{
    error::{EngineError, Result},
    model::Model,
    step::{
        groups::rows_in, kv_cache::KvCache, plan::Layout, Batch, Embedded, Logits, RowPositions,
        StepInput,
    },
};

/// One sequence's KV for the single-sequence passes: its per-layer caches (the prefilled
/// positions), and the batch of its steps, whose pool its decode steps write where the
/// layout pools decode KV.
pub struct Sequence {
    pub caches: Vec<KvCache>,
    /// Where its tokens sit for RoPE (a multimodal-RoPE model's images:
    /// [`Model::row_positions`]).
    pub positions: RowPositions,
    batch: Batch,
}

impl Sequence {
    /// Bytes of keys and values the sequence holds, in its caches and its pool.
    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::bytes).sum::<usize>() + self.batch.kv_bytes()
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
            caches: self.new_caches(),
            positions: RowPositions::default(),
            batch: Batch::new(self.layout()),
        }
    }

    /// Run `tokens` through the model in aligned chunks; returns the last position's logits.
    /// The chunks are one graph, evaluated once: only the last chunk's logits are read, and
    /// the earlier chunks' KV is what the next chunk's graph takes.
    pub fn prefill(&self, tokens: &[u32], sequence: &mut Sequence) -> Result<Vec<f32>> {
        self.prefill_with_images(tokens, &[], sequence)
    }

    /// [`prefill`](Self::prefill) of a prompt holding images: `images[k]` is `(at,
    /// features)`, features ([`Vision::encode`](crate::Vision::encode)) embedded at the
    /// prompt's positions `at..` (its soft tokens).
    pub fn prefill_with_images(
        &self,
        tokens: &[u32],
        images: &[(usize, Array)],
        sequence: &mut Sequence,
    ) -> Result<Vec<f32>> {
        let layout = self.layout();
        let first = sequence.caches.first().map_or(0, |c| c.len() as usize);
        let mut start = first;
        let mut remaining = tokens;
        let mut logits = None;
        while !remaining.is_empty() {
            let take = layout.aligned_chunk_end(start, start + remaining.len()) - start;
            let (chunk, rest) = remaining.split_at(take);
            let (from, to) = (start - first, start - first + take);
            let rows: Vec<(usize, Array)> = images
                .iter()
                .filter_map(|(at, features)| rows_in(*at, features, from, to))
                .collect();
            let embedded: Vec<Embedded> = rows
                .iter()
                .map(|(at, features)| Embedded { at: *at, features })
                .collect();
            logits = Some(self.forward(chunk, None, &embedded, sequence)?);
            remaining = rest;
            start += take;
        }
        let logits =
            logits.ok_or_else(|| EngineError::InvalidRequest("the prompt is empty".into()))?;
        read_logits(logits)
    }

    /// One forward pass over `tokens` appended to the sequence; last position's logits.
    pub fn step(&self, tokens: &[u32], sequence: &mut Sequence) -> Result<Vec<f32>> {
        read_logits(self.forward(tokens, None, &[], sequence)?)
    }

    /// Greedy decode of `n` tokens after `first` (the prompt's next token), as a chat
    /// streams on the pipelined scheduler: each token is picked on the device and fed to
    /// the next step before it is read, so one step is built while the last one runs.
    /// Returns the tokens and where the host's time went ([`DecodeTimes`]).
    pub fn decode_greedy(
        &self,
        first: u32,
        n: usize,
        sequence: &mut Sequence,
    ) -> Result<(Vec<u32>, DecodeTimes)> {
        let mut drawn = Array::from_slice(&[first], &[1]);
        let mut tokens = Vec::with_capacity(n);
        let mut times = DecodeTimes::default();
        for _ in 0..n {
            let started = Instant::now();
            let logits = self.forward(&[0], Some((&drawn, &[Some(0)])), &[], sequence)?;
            let next = argmax_axis(logits.reshape(&[1, -1])?, -1, false)?;
            let built = Instant::now();
            async_eval([&next])?;
            let launched = Instant::now();
            drawn.eval()?;
            times.build += built - started;
            times.launch += launched - built;
            times.wait += launched.elapsed();
            tokens.push(drawn.as_slice::<u32>()[0]);
            drawn = next;
        }
        Ok((tokens, times))
    }

    /// The lazy graph of one forward pass over `tokens` appended to the sequence (where
    /// `drawn` supplies them, tokens drawn on the device: [`StepInput::drawn`]; `embedded`
    /// features in place of some), up to the last position's logits.
    fn forward(
        &self,
        tokens: &[u32],
        drawn: Option<(&Array, &[Option<i32>])>,
        embedded: &[Embedded],
        sequence: &mut Sequence,
    ) -> Result<Array> {
        let input = StepInput {
            lens: &[tokens.len() as i32],
            host: tokens,
            drawn,
            embedded,
            positions: std::slice::from_ref(&sequence.positions),
        };
        let caches: &mut [KvCache] = &mut sequence.caches;
        sequence
            .batch
            .run(self, input, &mut [caches], Logits::Last, None)
    }
}

/// Where a pipelined decode's host time went: building each step's graph (the model's
/// code and MLX's op constructors), launching it (MLX's evaluation of every op: its
/// kernels' arguments, allocations and launches), and waiting for the device (a
/// host-bound decode waits for nothing).
#[derive(Debug, Default, Clone, Copy)]
pub struct DecodeTimes {
    pub build: Duration,
    pub launch: Duration,
    pub wait: Duration,
}

/// Evaluate one row's logits and copy them to the host.
fn read_logits(logits: Array) -> Result<Vec<f32>> {
    logits.eval()?;
    Ok(logits.as_slice::<f32>().to_vec())
}

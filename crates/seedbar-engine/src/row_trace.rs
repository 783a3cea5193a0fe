//! One row's numbers through a step, for chasing a seeded reply that parts from its run
//! alone: the row's positions after each layer's attention and after its MLP, and its
//! logits, each reduced to a hash of its bits. Comparing a row's traces alone and batched
//! names the first step and layer whose output differs (`seedbar bench determinism
//! --trace`). Keeping the arrays adds outputs to the step's graph, never changes how the
//! rest of it is computed.

use mlx_rs::{transforms::eval, Array, Dtype};

use crate::error::Result;

/// What a step keeps of row `row` (its index among the step's rows).
pub struct RowTrace {
    pub row: usize,
    /// The step around the row ([`Batch::run`](crate::step::batch::Batch::run) writes it):
    /// every row's token count, the matmul groups, the row's place.
    pub step: String,
    kept: Vec<Array>,
}

/// How many arrays a trace keeps per layer: the attention's output and the block's.
pub const PER_LAYER: usize = 2;

impl RowTrace {
    pub fn new(row: usize) -> Self {
        RowTrace {
            row,
            step: String::new(),
            kept: Vec::new(),
        }
    }

    pub(crate) fn keep(&mut self, a: Array) {
        self.kept.push(a);
    }

    /// The kept arrays' hashes, in the order kept (layer by layer, attention then block,
    /// then the logits): evaluates them.
    pub fn hashes(self) -> Result<Vec<u64>> {
        let exact: Vec<Array> = self
            .kept
            .iter()
            .map(|a| a.as_dtype(Dtype::Float32))
            .collect::<std::result::Result<_, _>>()?;
        eval(exact.iter())?;
        Ok(exact.iter().map(|a| fnv(a.as_slice::<f32>())).collect())
    }
}

/// FNV-1a over the values' bits.
fn fnv(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_tells_arrays_apart_by_their_bits() {
        let mut trace = RowTrace::new(0);
        trace.keep(Array::from_slice(&[1.0f32, 2.0], &[2]));
        trace.keep(Array::from_slice(&[1.0f32, 2.0], &[2]));
        trace.keep(Array::from_slice(&[1.0f32, 2.000_000_2], &[2]));
        let h = trace.hashes().unwrap();
        assert_eq!(h[0], h[1]);
        assert_ne!(h[1], h[2]);
    }
}

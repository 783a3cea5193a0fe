//! The sparse mixture-of-experts feed-forward block Qwen3-MoE and Mixtral share: a router
//! scores the experts for each token, the token runs through its top `k` (each a gated
//! MLP) and their outputs are summed with the router's weights.
//!
//! Seed identity: the router is a projection like any other (its matmul has the step
//! group's fixed shape), top-k and the weighted sum are per row, and the experts run
//! through MLX's gather kernels with unsorted indices, one `[1, cols]` product per
//! (token, expert) pair, so a row's result never depends on which experts its neighbours
//! chose. Grouping the rows routed to each expert into one matmul would not be (its row
//! count, and so the kernel's tiling, would follow the neighbours).

use mlx_rs::{ops, ops::indexing::IndexOp, Array};

use super::activation::{gated, Activation};
use crate::{
    error::Result,
    step::plan::Products,
    weights::{ExpertMatrices, Linear, WeightMap},
};

/// How router logits become each token's experts and their weights.
#[derive(Debug, Clone, Copy)]
pub enum Routing {
    /// Softmax over every expert, then the `k` largest; divided by their sum when
    /// `normalize` (Qwen3-MoE's `norm_topk_prob`).
    SoftmaxThenTopK { normalize: bool },
    /// The `k` largest logits, then a softmax over them (Mixtral).
    TopKThenSoftmax,
}

/// The shape and routing of one MoE layer, as an architecture's config gives them.
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: i32,
    /// Each expert's hidden width.
    pub intermediate: i32,
    pub routing: Routing,
}

/// One layer's router and expert stacks.
pub struct SparseMoe {
    router: Linear,
    gate_proj: ExpertMatrices,
    up_proj: ExpertMatrices,
    down_proj: ExpertMatrices,
    shape: MoeShape,
}

impl SparseMoe {
    /// The block under `prefix` (router `prefix.gate`, experts stacked under
    /// `prefix.switch_mlp.{gate_proj,up_proj,down_proj}` as mlx-lm saves them, or one per
    /// expert as `prefix.experts.E.{names}` with `names` the checkpoint's gate, up and down
    /// projection names).
    pub fn load(
        weights: &mut WeightMap,
        prefix: &str,
        hidden: i32,
        shape: MoeShape,
        names: [&str; 3],
    ) -> Result<Self> {
        let inner = shape.intermediate;
        let mut experts = |stacked: &str, name: &str, input: i32, output: i32| {
            weights.experts(
                &format!("{prefix}.switch_mlp.{stacked}"),
                |e| format!("{prefix}.experts.{e}.{name}"),
                shape.experts,
                input,
                output,
            )
        };
        let [gate, up, down] = names;
        let gate_proj = experts("gate_proj", gate, hidden, inner)?;
        let up_proj = experts("up_proj", up, hidden, inner)?;
        let down_proj = experts("down_proj", down, inner, hidden)?;
        Ok(SparseMoe {
            router: weights.linear(
                &format!("{prefix}.gate"),
                hidden,
                shape.experts as i32,
                false,
            )?,
            gate_proj,
            up_proj,
            down_proj,
            shape,
        })
    }

    /// `x` is one step group's `[1, W, D]` activations.
    pub fn forward(&self, x: &Array, products: Products) -> Result<Array> {
        let (w, d) = (x.shape()[1], x.shape()[2]);
        let (k, experts) = (self.shape.top_k, self.shape.experts as i32);
        let logits = self.router.forward(x, products)?;
        let (indices, weights) = match self.shape.routing {
            Routing::SoftmaxThenTopK { normalize } => {
                let probs = ops::softmax_axis(&logits, -1, true)?;
                let indices =
                    ops::argpartition_axis(&probs, experts - k, -1)?.index((.., .., experts - k..));
                let top = probs.take_along_axis(&indices, -1)?;
                let weights = if normalize {
                    top.divide(top.sum_axis(-1, true)?)?
                } else {
                    top
                };
                (indices, weights)
            }
            Routing::TopKThenSoftmax => {
                let indices =
                    ops::argpartition_axis(logits.negative()?, k - 1, -1)?.index((.., .., ..k));
                let top = logits.take_along_axis(&indices, -1)?;
                (indices, ops::softmax_axis(&top, -1, true)?)
            }
        };
        // Each token as a `[1, D]` matrix, broadcast over its k experts: `[1, W, k, 1, .]`.
        let x = x.reshape(&[1, w, 1, 1, d])?;
        let gate = self.gate_proj.gather(&x, &indices)?;
        let up = self.up_proj.gather(&x, &indices)?;
        let hidden = gated(Activation::Silu, &gate, &up)?;
        let out = self
            .down_proj
            .gather(&hidden, &indices)?
            .reshape(&[1, w, k, d])?;
        Ok(out
            .multiply(weights.reshape(&[1, w, k, 1])?)?
            .sum_axis(-2, false)?)
    }
}

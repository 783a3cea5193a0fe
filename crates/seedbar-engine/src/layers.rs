//! Layers the bidirectional encoders share (BERT for embeddings, SigLIP for images): a
//! LayerNorm with bias, and multi-head self-attention over every position with biased
//! projections; and rotation by given angles ([`rotate_halves`]), which multimodal RoPE and
//! Qwen2-VL's tower share. The decoders' own layers live in `architectures/decoder.rs`.

use mlx_rs::{fast, fast::ScaledDotProductAttentionMask, ops, ops::indexing::IndexOp, Array};

use crate::{
    error::Result,
    step::plan::Products,
    weights::{Linear, WeightMap},
};

/// `LayerNorm(x) * weight + bias`.
pub(crate) struct LayerNorm {
    weight: Array,
    bias: Array,
    eps: f32,
}

impl LayerNorm {
    /// The norm stored as `prefix.weight` and `prefix.bias`.
    pub(crate) fn load(weights: &mut WeightMap, prefix: &str, size: i32, eps: f32) -> Result<Self> {
        Ok(LayerNorm {
            weight: weights.vector(&format!("{prefix}.weight"), size)?,
            bias: weights.vector(&format!("{prefix}.bias"), size)?,
            eps,
        })
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::layer_norm(x, &self.weight, &self.bias, self.eps)?)
    }
}

/// Self-attention of every position to every position (no causal mask), `heads` heads of
/// `d / heads` features, each projection with a bias.
pub(crate) struct SelfAttention {
    query: Linear,
    key: Linear,
    value: Linear,
    out: Linear,
    heads: i32,
}

impl SelfAttention {
    /// The projections stored under `names`: query, key, value, output.
    pub(crate) fn load(
        weights: &mut WeightMap,
        names: [&str; 4],
        d: i32,
        heads: i32,
    ) -> Result<Self> {
        let [query, key, value, out] = names.map(|name| weights.linear(name, d, d, true));
        Ok(SelfAttention {
            query: query?,
            key: key?,
            value: value?,
            out: out?,
            heads,
        })
    }

    /// `x`: `[B, L, D]`; `key_mask`, where given, is added to the scores (`[B, 1, 1, L]`:
    /// 0 for a real key, -inf for padding).
    pub(crate) fn forward(&self, x: &Array, key_mask: Option<&Array>) -> Result<Array> {
        let shape = x.shape();
        let (b, l, d) = (shape[0], shape[1], shape[2]);
        let head_dim = d / self.heads;
        let split = |proj: &Linear| -> Result<Array> {
            Ok(proj
                .forward(x, Products::Matmul)?
                .reshape(&[b, l, self.heads, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        let (q, k, v) = (split(&self.query)?, split(&self.key)?, split(&self.value)?);
        let scale = (head_dim as f32).powf(-0.5);
        let attended = fast::scaled_dot_product_attention(
            q,
            k,
            v,
            scale,
            key_mask.map(ScaledDotProductAttentionMask::from),
            None,
        )?
        .transpose_axes(&[0, 2, 1, 3])?
        .reshape(&[b, l, d])?;
        self.out.forward(&attended, Products::Matmul)
    }
}

/// `x` (`[.., hd]`) with feature pairs `(j, j + dims/2)` for `j < dims/2` rotated by angles
/// whose cosines and sines are `cos` and `sin` (`[.., dims/2]`, broadcast against `x`), as
/// `x · cos + rotate_half(x) · sin` computes it; features past `dims` as they are.
pub(crate) fn rotate_halves(x: &Array, cos: &Array, sin: &Array, dims: i32) -> Result<Array> {
    let half = dims / 2;
    let x1 = x.index((.., .., .., ..half));
    let x2 = x.index((.., .., .., half..dims));
    let mut parts = vec![
        x1.multiply(cos)?.subtract(x2.multiply(sin)?)?,
        x1.multiply(sin)?.add(x2.multiply(cos)?)?,
    ];
    if dims < x.shape()[x.ndim() - 1] {
        parts.push(x.index((.., .., .., dims..)));
    }
    Ok(ops::concatenate(&parts, -1)?)
}

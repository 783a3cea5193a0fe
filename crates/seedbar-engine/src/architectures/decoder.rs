//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings, pre-norm attention + gated-MLP blocks, final norm, output head. Architectures
//! differ only in the switches of [`Variant`] and in each layer's [`LayerAttention`] (its
//! RoPE, or none, and its sliding window), set by their own files, and in the layers whose
//! MLP is a mixture of experts (`moe.rs`). How a step's rows are laid out into matmuls and
//! attention calls comes from a [`StepPlan`], and how they attend from `step::attention`,
//! to which each layer hands its projected queries, keys and values.
//!
//! The packed CPU path runs the same math on host floats: `host.rs`
//! (`Transformer::forward_on_host`).
//!
//! A sliding-window layer's cache lets go of the positions its queries no longer see
//! (`step/kv_cache.rs` owns which ones it keeps, where, and when a cut-back cache is still
//! exact); attention reads the keys a query sees, by absolute position, in position order,
//! whatever the cache dropped.

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};

use super::{
    activation::{gated, Activation},
    moe::SparseMoe,
};
use crate::{
    config::ModelConfig,
    error::Result,
    layers::rotate_halves,
    row_trace::RowTrace,
    runtime,
    step::{
        attention::{self, window_mask, AttentionMath, DecodeKv, Part, QueriesKeysValues},
        batch::Forward,
        groups::{self, Logits, StepTokens},
        kv_cache::{KvCache, KvPool},
        plan::{AttentionLayout, Products, Slot, StepPlan, WeightKind},
    },
    weights::{Embedding, Linear, Matrix, Projections, WeightMap},
};

/// What one architecture changes in the shared block.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// Biases on the q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms on each head's queries and keys before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norm weights stored as offsets from one: `x * (1 + w)` (Gemma).
    pub unit_offset_norms: bool,
    /// Norms on the attention and MLP outputs too (Gemma 2/3): `post_attention_layernorm`
    /// then normalizes the attention output and `pre_feedforward_layernorm` /
    /// `post_feedforward_layernorm` wrap the MLP.
    pub sandwich_norms: bool,
    /// The gate's activation in the MLP.
    pub activation: Activation,
    /// `qkv_proj` and `gate_up_proj` stored fused (Phi-3); split into rows at load.
    pub fused_projections: bool,
    /// Attention's query scale when it is not `1/sqrt(head_dim)` (Gemma).
    pub attention_scale: Option<f32>,
    /// `cap * tanh(scores / cap)` on attention scores before the mask (Gemma 2).
    pub attention_softcap: Option<f32>,
    /// `cap * tanh(logits / cap)` on the output logits (Gemma 2).
    pub logit_softcap: Option<f32>,
    /// Factor the token embeddings are multiplied by, in the compute dtype (Gemma: sqrt(d)).
    pub embedding_scale: Option<f32>,
}

/// How one layer's attention sees positions.
#[derive(Debug, Clone)]
pub struct LayerAttention {
    /// The layer's rotary embedding; `None` for a layer without one (SmolLM3's NoPE layers).
    pub rope: Option<Rope>,
    /// A query at position `p` sees keys in `(p - window, p]`; `None`: every earlier key.
    pub window: Option<i32>,
}

/// Rotary position embedding settings.
#[derive(Debug, Clone)]
pub struct Rope {
    pub dims: i32,
    pub traditional: bool,
    pub base: Option<f32>,
    pub scale: f32,
    /// Per-frequency periods, when the architecture rescales frequencies (Llama 3).
    pub freqs: Option<Array>,
    /// Per-feature factors (`[head_dim]`) the input is multiplied by before rotating
    /// (long-rope's attention scaling on the rotated features).
    pub input_scale: Option<Array>,
    /// Multimodal RoPE (Qwen2-VL's `mrope_section`): how many rotated pairs, in order,
    /// turn by a token's time, row and column position ([`step::positions`]); `None`: all
    /// by its one position.
    pub sections: Option<[usize; 3]>,
}

/// Which of a token's (time, row, column) positions turns rotated pair `pair` (pairs past
/// the sections turn by time, as mlx-vlm's Qwen2-VL leaves them).
pub(super) fn section_axis(sections: Option<[usize; 3]>, pair: usize) -> usize {
    match sections {
        Some([t, h, w]) if pair >= t + h + w => 0,
        Some([t, h, _]) if pair >= t + h => 2,
        Some([t, _, _]) if pair >= t => 1,
        _ => 0,
    }
}

impl Rope {
    /// `x` times the input scale, if any.
    fn scaled(&self, x: &Array) -> Result<Array> {
        Ok(match &self.input_scale {
            Some(s) => x.multiply(s)?,
            None => x.clone(),
        })
    }

    /// `x` (`[B, H, L, hd]`) rotated for positions `offset..offset + L`.
    fn apply(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(fast::rope(
            self.scaled(x)?,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offset,
            self.freqs.as_ref(),
        )?)
    }

    /// `x` (`[B, H, L, hd]`) with the token at `(b, l)` rotated for the (time, row, column)
    /// position `positions[b * L + l]`, each section of the pairs by its axis, as mlx-vlm's
    /// Qwen2-VL does it: the angles in float32, their cosines and sines in `x`'s dtype.
    fn apply_grid(&self, x: &Array, positions: &[[i32; 3]]) -> Result<Array> {
        if self.traditional {
            return Err(crate::error::EngineError::InvalidRequest(
                "multimodal RoPE on interleaved pairs is not supported".into(),
            ));
        }
        let (b, l) = (x.shape()[0], x.shape()[2]);
        let half = (self.dims / 2) as usize;
        let inv_freqs = self.host_inv_freqs()?;
        let (mut cos, mut sin) = (
            Vec::with_capacity(positions.len() * half),
            Vec::with_capacity(positions.len() * half),
        );
        for p in positions {
            for (j, inv_freq) in inv_freqs.iter().enumerate() {
                let position = p[section_axis(self.sections, j)] as f32;
                let (s, c) = (position * self.scale * inv_freq).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        let table = |v: &[f32]| Array::from_slice(v, &[b, 1, l, half as i32]).as_dtype(x.dtype());
        rotate_halves(&self.scaled(x)?, &table(&cos)?, &table(&sin)?, self.dims)
    }

    /// `x` (`[B, H, 1, hd]`) with row `b` rotated for position `positions[b]`.
    fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        Ok(fast::rope_dynamic(
            self.scaled(x)?,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            positions,
            self.freqs.as_ref(),
        )?)
    }
}

pub(super) struct RmsNorm {
    pub(super) weight: Array,
    pub(super) eps: f32,
}

impl RmsNorm {
    /// The norm stored as `name`; with `unit_offset` the stored weight is `w` of `1 + w`.
    pub(super) fn load(
        weights: &mut WeightMap,
        name: &str,
        size: i32,
        eps: f32,
        unit_offset: bool,
    ) -> Result<Self> {
        let mut weight = weights.vector(name, size)?;
        if unit_offset {
            weight = weight.add(ops::ones_dtype(&[size], weight.dtype())?)?;
            // Now, on the loading thread: the engine thread cannot run its work.
            weight.eval()?;
        }
        Ok(RmsNorm { weight, eps })
    }

    pub(super) fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

pub(super) struct Attention {
    /// Queries, keys and values.
    pub(super) qkv: Projections<3>,
    pub(super) o_proj: Linear,
    pub(super) q_norm: Option<RmsNorm>,
    pub(super) k_norm: Option<RmsNorm>,
    pub(super) heads: i32,
    pub(super) kv_heads: i32,
    pub(super) head_dim: i32,
    pub(super) scale: f32,
    pub(super) softcap: Option<f32>,
    pub(super) positions: LayerAttention,
}

impl Attention {
    fn load(
        weights: &mut WeightMap,
        prefix: &str,
        c: &ModelConfig,
        v: Variant,
        positions: LayerAttention,
    ) -> Result<Self> {
        let (d, hd) = (c.hidden_size, c.head_dim());
        let (heads, kv_heads) = (c.num_attention_heads, c.kv_heads());
        let bias = v.qkv_bias || c.attention_bias;
        let norm = |w: &mut WeightMap, n: &str| -> Result<Option<RmsNorm>> {
            v.qk_norm
                .then(|| {
                    let name = format!("{prefix}.{n}.weight");
                    RmsNorm::load(w, &name, hd, c.rms_norm_eps, v.unit_offset_norms)
                })
                .transpose()
        };
        let outputs = [heads * hd, kv_heads * hd, kv_heads * hd];
        let qkv = Projections::joined_on_cuda(if v.fused_projections {
            weights.fused_linear(&format!("{prefix}.qkv_proj"), d, outputs, bias)?
        } else {
            let [q, k, v] = outputs;
            [
                weights.linear(&format!("{prefix}.q_proj"), d, q, bias)?,
                weights.linear(&format!("{prefix}.k_proj"), d, k, bias)?,
                weights.linear(&format!("{prefix}.v_proj"), d, v, bias)?,
            ]
        })?;
        Ok(Attention {
            qkv,
            o_proj: weights.linear(&format!("{prefix}.o_proj"), heads * hd, d, c.attention_bias)?,
            q_norm: norm(weights, "q_norm")?,
            k_norm: norm(weights, "k_norm")?,
            heads,
            kv_heads,
            head_dim: hd,
            scale: v.attention_scale.unwrap_or((hd as f32).powf(-0.5)),
            softcap: v.attention_softcap,
            positions,
        })
    }

    /// Output features of the query, key and value projections.
    pub(super) fn qkv_widths(&self) -> [i32; 3] {
        let kv = self.kv_heads * self.head_dim;
        [self.heads * self.head_dim, kv, kv]
    }

    /// Attention over a step's matmul groups (`xs[g]` is group `g`'s `[1, W, D]` input):
    /// projections and the output projection run per group, attention as the step lays
    /// it out ([`attention::attend_groups`]).
    fn forward(
        &self,
        xs: &[Array],
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
        decode_kv: &mut DecodeKv,
    ) -> Result<Vec<Array>> {
        let mut projected = QueriesKeysValues::default();
        // A decode group's queries and keys are rotated together where neither is normed
        // per head (and q, k and v are one product).
        let joinable = self.q_norm.is_none() && self.k_norm.is_none();
        for (g, x) in xs.iter().enumerate() {
            if joinable && plan.is_decode_group(g) {
                if let Some(qkv) = self.qkv.forward_stacked(x, plan.products)? {
                    projected.push_joined(qkv);
                    continue;
                }
            }
            let [q, k, v] = self.qkv.forward_contiguous(x, plan.products)?;
            projected.push(q, k, v);
        }
        attention::attend_groups(self, projected, plan, caches, decode_kv)?
            .iter()
            .map(|out| self.o_proj.forward(out, plan.products))
            .collect()
    }
}

/// The layer's math, as the step's attention (`step::attention`) runs it.
impl AttentionMath for Attention {
    fn heads(&self) -> i32 {
        self.heads
    }

    fn kv_heads(&self) -> i32 {
        self.kv_heads
    }

    fn scale(&self) -> f32 {
        self.scale
    }

    fn softcap(&self) -> Option<f32> {
        self.softcap
    }

    fn head_dim(&self) -> i32 {
        self.head_dim
    }

    fn window(&self) -> Option<i32> {
        self.positions.window
    }

    /// RoPE for positions `offset..` (`x` is `[B, H, L, hd]`), or `x` in a NoPE layer.
    fn rotate(&self, x: Array, offset: i32) -> Result<Array> {
        match &self.positions.rope {
            Some(rope) => rope.apply(&x, offset),
            None => Ok(x),
        }
    }

    /// RoPE with row `b` at `positions[b]` (`x` is `[B, H, 1, hd]`), or `x` in a NoPE layer.
    fn rotate_at(&self, x: Array, positions: &Array) -> Result<Array> {
        match &self.positions.rope {
            Some(rope) => rope.apply_at(&x, positions),
            None => Ok(x),
        }
    }

    fn rotate_grid(&self, x: Array, positions: &[[i32; 3]]) -> Result<Array> {
        match &self.positions.rope {
            Some(rope) => rope.apply_grid(&x, positions),
            None => Ok(x),
        }
    }

    /// Scaled dot-product attention, through MLX's fused kernel unless scores are soft-capped.
    fn attend(
        &self,
        q: Array,
        k: Array,
        v: Array,
        mask: Option<ScaledDotProductAttentionMask>,
    ) -> Result<Array> {
        let Some(cap) = self.softcap else {
            return Ok(fast::scaled_dot_product_attention(
                q, k, v, self.scale, mask, None,
            )?);
        };
        // Queries grouped per KV head: `[B, kv_heads, repeats, L, hd]` against `[B, kv_heads,
        // 1, T, hd]`, so the scores are `[B, kv_heads, repeats, L, T]`.
        let (b, len, t) = (q.shape()[0], q.shape()[2], k.shape()[2]);
        let repeats = self.heads / self.kv_heads;
        let q = q
            .multiply(Array::from_f32(self.scale).as_dtype(q.dtype())?)?
            .reshape(&[b, self.kv_heads, repeats, len, self.head_dim])?;
        let (k, v) = (k.expand_dims(2)?, v.expand_dims(2)?);
        let scores = q.matmul(k.swap_axes(-1, -2)?)?;
        let scores = softcap(&scores, cap)?;
        let scores = match mask {
            None => scores,
            Some(ScaledDotProductAttentionMask::Array(m)) => {
                // `[rows, 1, 1, T]` decode masks gain the repeats axis; `[L, T]` broadcast.
                let m = if m.ndim() == 4 {
                    m.expand_dims(2)?
                } else {
                    m.clone()
                };
                scores.add(m)?
            }
            Some(ScaledDotProductAttentionMask::Causal) => {
                scores.add(window_mask(len, t, None, scores.dtype())?)?
            }
        };
        let weights = ops::softmax_axis(&scores, -1, true)?;
        Ok(weights
            .matmul(v)?
            .reshape(&[b, self.heads, len, self.head_dim])?)
    }

    /// One query per slot (`q`: `[S, H, 1, hd]`) against the slots' keys and values
    /// (`[S, kv_heads, T, hd]`) under `mask` (`[S, 1, 1, T]`), as two batched matmuls of
    /// each KV head's query heads (`[S, kv_heads, H / kv_heads, hd]`) around a softmax: the
    /// keys are read once, where MLX's unfused fallback broadcasts them to every query
    /// head. Soft-capped scores take [`attend`](AttentionMath::attend).
    fn split_heads(&self, x: Array, part: Part) -> Result<Array> {
        let shape = x.shape();
        let x = x.reshape(&[shape[0], shape[1], self.part_heads(part), self.head_dim])?;
        Ok(self.norm_heads(x, part)?.transpose_axes(&[0, 2, 1, 3])?)
    }

    fn row_heads(&self, x: Array, part: Part) -> Result<Array> {
        let x = x.reshape(&[-1, self.part_heads(part), 1, self.head_dim])?;
        self.norm_heads(x, part)
    }
}

impl Attention {
    /// How many heads `part` has.
    fn part_heads(&self, part: Part) -> i32 {
        match part {
            Part::Queries => self.heads,
            Part::Keys | Part::Values => self.kv_heads,
        }
    }

    /// `x` (`[..., hd]`, a head a row) normed per head where the layer norms `part`.
    fn norm_heads(&self, x: Array, part: Part) -> Result<Array> {
        let norm = match part {
            Part::Queries => &self.q_norm,
            Part::Keys => &self.k_norm,
            Part::Values => &None,
        };
        match norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

pub(super) struct Mlp {
    /// The gate's and the up projection.
    pub(super) gate_up: Projections<2>,
    pub(super) down_proj: Linear,
    pub(super) activation: Activation,
    pub(super) inner: i32,
}

impl Mlp {
    fn load(weights: &mut WeightMap, prefix: &str, c: &ModelConfig, v: Variant) -> Result<Self> {
        let (d, i) = (c.hidden_size, c.intermediate_size);
        let gate_up = Projections::joined_on_cuda(if v.fused_projections {
            weights.fused_linear(&format!("{prefix}.gate_up_proj"), d, [i, i], false)?
        } else {
            [
                weights.linear(&format!("{prefix}.gate_proj"), d, i, false)?,
                weights.linear(&format!("{prefix}.up_proj"), d, i, false)?,
            ]
        })?;
        Ok(Mlp {
            gate_up,
            down_proj: weights.linear(&format!("{prefix}.down_proj"), i, d, false)?,
            activation: v.activation,
            inner: i,
        })
    }

    fn forward(&self, x: &Array, products: Products) -> Result<Array> {
        let [gate, up] = self.gate_up.forward(x, products)?;
        self.down_proj
            .forward(&gated(self.activation, &gate, &up)?, products)
    }
}

/// A layer's feed-forward sublayer: the dense gated MLP, or a mixture of experts.
pub(super) enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoe),
}

impl FeedForward {
    fn forward(&self, x: &Array, products: Products) -> Result<Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x, products),
            FeedForward::Sparse(moe) => moe.forward(x, products),
        }
    }
}

/// Loads layer `i`'s mixture of experts, or `None` where the layer has a dense MLP.
pub type SparseLayers<'a> = dyn FnMut(&mut WeightMap, usize) -> Result<Option<SparseMoe>> + 'a;

/// One layer: `x + attn_out(attn(attn_in(x)))`, then `h + mlp_out(mlp(mlp_in(h)))`, where
/// the output norms exist only in sandwich-norm variants.
pub(super) struct Block {
    pub(super) attn_in: RmsNorm,
    pub(super) self_attn: Attention,
    pub(super) attn_out: Option<RmsNorm>,
    pub(super) mlp_in: RmsNorm,
    pub(super) mlp: FeedForward,
    pub(super) mlp_out: Option<RmsNorm>,
}

impl Block {
    fn load(
        weights: &mut WeightMap,
        prefix: &str,
        c: &ModelConfig,
        v: Variant,
        positions: LayerAttention,
        sparse: Option<SparseMoe>,
    ) -> Result<Self> {
        let mut norm = |name: &str| {
            let name = format!("{prefix}.{name}.weight");
            RmsNorm::load(
                weights,
                &name,
                c.hidden_size,
                c.rms_norm_eps,
                v.unit_offset_norms,
            )
        };
        let attn_in = norm("input_layernorm")?;
        let (attn_out, mlp_in, mlp_out) = if v.sandwich_norms {
            (
                Some(norm("post_attention_layernorm")?),
                norm("pre_feedforward_layernorm")?,
                Some(norm("post_feedforward_layernorm")?),
            )
        } else {
            (None, norm("post_attention_layernorm")?, None)
        };
        Ok(Block {
            attn_in,
            self_attn: Attention::load(weights, &format!("{prefix}.self_attn"), c, v, positions)?,
            attn_out,
            mlp_in,
            mlp: match sparse {
                Some(moe) => FeedForward::Sparse(moe),
                None => FeedForward::Dense(Mlp::load(weights, &format!("{prefix}.mlp"), c, v)?),
            },
            mlp_out,
        })
    }
}

/// `cap * tanh(x / cap)`, in `x`'s dtype.
fn softcap(x: &Array, cap: f32) -> Result<Array> {
    let cap = Array::from_f32(cap).as_dtype(x.dtype())?;
    Ok(ops::tanh(x.divide(&cap)?)?.multiply(&cap)?)
}

/// `x + norm(r)` where the variant normalizes a sublayer's output, else `x + r`. Normed
/// sums in float16 are taken in float32 and clipped to float16's range (Gemma's residual
/// stream outgrows it).
fn residual(x: &Array, r: Array, norm: &Option<RmsNorm>) -> Result<Array> {
    let Some(n) = norm else {
        return Ok(x.add(r)?);
    };
    let r = n.forward(&r)?;
    if x.dtype() != Dtype::Float16 {
        return Ok(x.add(r)?);
    }
    let wide = |a: &Array| a.as_dtype(Dtype::Float32);
    let bound = 65504.0; // the largest float16
    let sum = wide(x)?.add(wide(&r)?)?;
    Ok(ops::clip(&sum, (-bound, bound))?.as_dtype(Dtype::Float16)?)
}

/// `Packed` only when every matmul of the model runs on the CPU kernels, whose rows are
/// independent at any row count, and it computes in float32 (the host path); a model with
/// some dequantized layers is `Quantized`.
fn weight_kind(layers: &[Block], lm_head: &Linear, dtype: Dtype) -> WeightKind {
    let packed = |l: &Linear| matches!(l.weight, Matrix::Packed(_));
    let all_packed = packed(lm_head)
        && layers.iter().all(|b| {
            // Experts run through MLX's gather kernels, never packed.
            let FeedForward::Dense(m) = &b.mlp else {
                return false;
            };
            let a = &b.self_attn;
            a.qkv.is_packed() && packed(&a.o_proj) && m.gate_up.is_packed() && packed(&m.down_proj)
        });
    match layers.first().map(|b| &b.self_attn.o_proj.weight) {
        Some(Matrix::Packed(_)) if all_packed && dtype == Dtype::Float32 => WeightKind::Packed,
        Some(Matrix::Quantized(_) | Matrix::Packed(_)) => WeightKind::Quantized,
        _ => WeightKind::Dense,
    }
}

/// A loaded decoder-only transformer.
pub struct Transformer {
    pub config: ModelConfig,
    pub(super) embed_tokens: Embedding,
    pub(super) layers: Vec<Block>,
    pub(super) norm: RmsNorm,
    pub(super) lm_head: Linear,
    pub(super) embedding_scale: Option<f32>,
    pub(super) logit_softcap: Option<f32>,
    pub(super) dtype: Dtype,
    pub(super) weight_kind: WeightKind,
}

impl Transformer {
    /// Build from Hugging Face–named weights (`model.layers.N.self_attn.q_proj.weight`, ...),
    /// every layer attending every earlier position through `rope`.
    pub fn load(
        config: ModelConfig,
        variant: Variant,
        rope: Rope,
        weights: &mut WeightMap,
        dtype: Dtype,
    ) -> Result<Self> {
        let layers = vec![
            LayerAttention {
                rope: Some(rope),
                window: None,
            };
            config.num_hidden_layers as usize
        ];
        Self::load_layers(config, variant, layers, weights, dtype)
    }

    /// [`load`](Self::load) with each layer's own positions (`layers[i]` for layer `i`).
    pub fn load_layers(
        config: ModelConfig,
        variant: Variant,
        layers: Vec<LayerAttention>,
        weights: &mut WeightMap,
        dtype: Dtype,
    ) -> Result<Self> {
        Self::load_sparse(config, variant, layers, weights, dtype, &mut |_, _| {
            Ok(None)
        })
    }

    /// [`load_layers`](Self::load_layers) with the MLP of the layers `sparse` loads a
    /// mixture of experts for replaced by it.
    pub fn load_sparse(
        config: ModelConfig,
        variant: Variant,
        layers: Vec<LayerAttention>,
        weights: &mut WeightMap,
        dtype: Dtype,
        sparse: &mut SparseLayers,
    ) -> Result<Self> {
        let c = &config;
        let d = c.hidden_size;
        let embed_tokens = weights.embedding("model.embed_tokens", c.vocab_size, d)?;
        let layers = layers
            .into_iter()
            .enumerate()
            .map(|(i, positions)| {
                let moe = sparse(weights, i)?;
                let prefix = format!("model.layers.{i}");
                Block::load(weights, &prefix, c, variant, positions, moe)
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(
            weights,
            "model.norm.weight",
            d,
            c.rms_norm_eps,
            variant.unit_offset_norms,
        )?;
        let lm_head = if c.tie_word_embeddings || !weights.contains("lm_head.weight") {
            embed_tokens.as_linear()
        } else {
            weights.linear("lm_head", d, c.vocab_size, false)?
        };
        let leftover = weights.leftover_names();
        if !leftover.is_empty() {
            tracing::debug!(?leftover, "unused tensors in checkpoint");
        }
        Ok(Transformer {
            weight_kind: weight_kind(&layers, &lm_head, dtype),
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            embedding_scale: variant.embedding_scale,
            logit_softcap: variant.logit_softcap,
            dtype,
        })
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether the projections hold quantized or dense weights (the layout depends on it).
    pub fn weight_kind(&self) -> WeightKind {
        self.weight_kind
    }

    /// Each matmul group's embedded tokens (`[1, W, D]`; [`groups::group_token_ids`]), the
    /// step's given features in place of theirs ([`groups::splice_embedded`]).
    pub(super) fn embed(&self, tokens: StepTokens, plan: &StepPlan) -> Result<Vec<Array>> {
        let h = groups::group_token_ids(tokens, plan)?
            .iter()
            .map(|ids| self.embed_tokens.forward(ids, self.dtype))
            .collect::<Result<Vec<_>>>()?;
        groups::splice_embedded(h, tokens.embedded, plan)?
            .into_iter()
            .map(|h| match self.embedding_scale {
                Some(s) => Ok(h.multiply(Array::from_f32(s).as_dtype(h.dtype())?)?),
                None => Ok(h),
            })
            .collect()
    }

    /// Fresh per-layer caches for one sequence, each with its layer's sliding window.
    pub fn new_caches(&self) -> Vec<KvCache> {
        self.layers
            .iter()
            .map(|b| KvCache::new(b.self_attn.positions.window))
            .collect()
    }
}

/// One step laid out by `plan` ([`Forward`]); `trace` keeps the row's numbers on the MLX
/// path (the host path keeps none).
impl Forward for Transformer {
    fn forward(
        &self,
        tokens: StepTokens,
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        pool: &mut KvPool,
        logits: Logits<'_>,
        mut trace: Option<&mut RowTrace>,
    ) -> Result<Array> {
        if self.weight_kind == WeightKind::Packed && plan.attention == AttentionLayout::PerRow {
            runtime::set_blas_threads(1);
            let host = tokens.to_host()?;
            let tokens = StepTokens {
                host: &host,
                drawn: None,
                ..tokens
            };
            return self.forward_on_host(tokens, plan, caches, logits);
        }
        runtime::set_blas_threads(runtime::cpu_cores());
        let mut h = self.embed(tokens, plan)?;
        let mut decode_kv = DecodeKv::place(plan, caches, pool)?;
        for (layer, block) in self.layers.iter().enumerate() {
            decode_kv.layer = layer;
            let mut layer_caches: Vec<&mut KvCache> =
                caches.iter_mut().map(|c| &mut c[layer]).collect();
            let normed = h
                .iter()
                .map(|x| block.attn_in.forward(x))
                .collect::<Result<Vec<_>>>()?;
            let attended =
                block
                    .self_attn
                    .forward(&normed, plan, &mut layer_caches, &mut decode_kv)?;
            for (g, (x, r)) in h.iter_mut().zip(attended).enumerate() {
                let traced = trace
                    .as_deref_mut()
                    .map(|t| (plan.slots[t.row], t))
                    .filter(|(slot, _)| slot.group == g);
                let span = |a: &Array, s: &Slot| a.index((.., s.offset..s.offset + s.len, ..));
                let x1 = residual(x, r, &block.attn_out)?;
                let r = block
                    .mlp
                    .forward(&block.mlp_in.forward(&x1)?, plan.products)?;
                *x = residual(&x1, r, &block.mlp_out)?;
                if let Some((slot, t)) = traced {
                    t.keep(span(&x1, &slot));
                    t.keep(span(x, &slot));
                }
            }
        }
        let head = |x: &Array| -> Result<Array> {
            let logits = self
                .lm_head
                .forward(&self.norm.forward(x)?, plan.products)?;
            match self.logit_softcap {
                Some(cap) => softcap(&logits, cap),
                None => Ok(logits),
            }
        };
        let out = groups::head_rows(&h, plan, logits, head)?;
        if let Some(t) = trace {
            if logits == Logits::Last {
                let row = t.row as i32;
                t.keep(out.index((.., row..row + 1, ..)));
            }
        }
        Ok(out.as_dtype(Dtype::Float32)?)
    }
}

impl Rope {
    /// Plain RoPE over the full head dimension; `linear` scaling divides positions.
    pub fn standard(c: &ModelConfig) -> Self {
        let scale = match &c.rope_scaling {
            Some(s) if s.rope_type == "linear" => 1.0 / s.factor,
            _ => 1.0,
        };
        Rope {
            dims: c.head_dim(),
            traditional: c.rope_traditional,
            base: Some(c.rope_theta),
            scale,
            freqs: None,
            input_scale: None,
            sections: None,
        }
    }
}

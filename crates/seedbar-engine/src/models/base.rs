//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings, pre-norm attention + gated-MLP blocks, final norm, output head. Architectures
//! differ only in the switches of [`Variant`] and in each layer's [`LayerAttention`] (its
//! RoPE, or none, and its sliding window), set by their own files, and in the layers whose
//! MLP is a mixture of experts (`moe.rs`). How a step's rows are laid out into matmuls and
//! attention calls comes from a [`StepPlan`].
//!
//! A sliding-window layer's cache lets go of the positions its queries no longer see
//! (`step/kv_cache.rs` owns which ones it keeps, where, and when a cut-back cache is still
//! exact); attention here reads the keys a query sees, by absolute position, in position
//! order, whatever the cache dropped.

use std::collections::{hash_map::Entry, BTreeMap, HashMap};

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};
use rayon::prelude::*;

use super::{
    activation::{gated, Activation},
    host,
    moe::SparseMoe,
};
use crate::{
    config::ModelConfig,
    error::Result,
    row_trace::RowTrace,
    runtime,
    step::kv_cache::{HostKv, KvCache, KvPool},
    step::plan::{AttentionLayout, Products, Slot, StepPlan, Uploads, WeightKind},
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

    /// Each rotated pair's inverse frequency, as host floats (`host::Rotary`'s).
    fn host_inv_freqs(&self) -> Result<Vec<f32>> {
        let half = (self.dims / 2) as usize;
        if let Some(f) = &self.freqs {
            let f = f.as_dtype(Dtype::Float32)?;
            return Ok(f.try_as_slice::<f32>()?.iter().map(|f| 1.0 / f).collect());
        }
        let base = self.base.unwrap_or(10_000.0);
        Ok((0..half)
            .map(|j| base.powf(-2.0 * j as f32 / self.dims as f32))
            .collect())
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

struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// The norm stored as `name`; with `unit_offset` the stored weight is `w` of `1 + w`.
    fn load(
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

    fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }

    /// [`forward`](Self::forward) of host rows (a float32 model's weight, evaluated at
    /// load).
    fn forward_host(&self, x: &[f32]) -> Result<Vec<f32>> {
        Ok(host::rms_norm(
            x,
            self.weight.try_as_slice::<f32>()?,
            self.eps,
        ))
    }
}

struct Attention {
    /// Queries, keys and values.
    qkv: Projections<3>,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    softcap: Option<f32>,
    positions: LayerAttention,
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
        let qkv = Projections::new(if v.fused_projections {
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
    fn qkv_widths(&self) -> [i32; 3] {
        let kv = self.kv_heads * self.head_dim;
        [self.heads * self.head_dim, kv, kv]
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
    /// head. Soft-capped scores take [`attend`](Self::attend).
    fn attend_by_matmuls(&self, q: &Array, k: &Array, v: &Array, mask: &Array) -> Result<Array> {
        if self.softcap.is_some() {
            let mask = ScaledDotProductAttentionMask::Array(mask);
            return self.attend(q.clone(), k.clone(), v.clone(), Some(mask));
        }
        let slots = q.shape()[0];
        let repeats = self.heads / self.kv_heads;
        let scale = Array::from_f32(self.scale).as_dtype(q.dtype())?;
        let q = q
            .reshape(&[slots, self.kv_heads, repeats, self.head_dim])?
            .multiply(&scale)?;
        let scores = q.matmul(k.swap_axes(-1, -2)?)?.add(mask)?;
        let weights = ops::softmax_axis(&scores, -1, true)?;
        Ok(weights
            .matmul(v)?
            .reshape(&[slots, self.heads, 1, self.head_dim])?)
    }

    /// `[B, H, L, hd]` from `[B, L, H*hd]`, normed per head when the variant asks.
    fn split_heads(&self, x: Array, heads: i32, norm: &Option<RmsNorm>) -> Result<Array> {
        let shape = x.shape();
        let x = x.reshape(&[shape[0], shape[1], heads, self.head_dim])?;
        let x = match norm {
            Some(n) => n.forward(&x)?,
            None => x,
        };
        Ok(x.transpose_axes(&[0, 2, 1, 3])?)
    }

    /// Attention over a step's matmul groups (`xs[g]` is group `g`'s `[1, W, D]` input):
    /// projections and the output projection run per group, attention as
    /// [`attend_groups`](Self::attend_groups) lays it out.
    fn forward(
        &self,
        xs: &[Array],
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
        decode_kv: &mut DecodeKv,
    ) -> Result<Vec<Array>> {
        let mut projected = QueriesKeysValues::default();
        for x in xs {
            let [q, k, v] = self.qkv.forward(x, plan.products)?;
            projected.push(q, k, v);
        }
        self.attend_groups(projected, plan, caches, decode_kv)?
            .iter()
            .map(|out| self.o_proj.forward(out, plan.products))
            .collect()
    }

    /// Each group's projected queries, keys and values (`[1, W, .]`) attended per row or in
    /// batches as `plan` says; the rows' outputs are laid back into their groups'
    /// `[1, W, H·hd]` (zero rows where a group is padded), before the output projection.
    fn attend_groups(
        &self,
        QueriesKeysValues {
            q: q_all,
            k: k_all,
            v: v_all,
        }: QueriesKeysValues,
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
        decode_kv: &mut DecodeKv,
    ) -> Result<Vec<Array>> {
        let pooled = plan.attention == AttentionLayout::Capacity;
        // Queries, keys and values, RoPE applied. A decode group is split into heads and
        // rotated as a whole (`[W, H, 1, hd]`, each row at its own position) and kept whole
        // for pooled attention or cut into rows; a prefill chunk is a row of its own
        // (`[1, H, len, hd]`).
        let mut groups: Vec<Option<(Array, Array, Array)>> = vec![None; plan.widths.len()];
        let mut rows: Vec<Option<(Array, Array, Array)>> = vec![None; plan.slots.len()];
        for g in 0..plan.widths.len() {
            let members: Vec<usize> = plan.rows_of(g).collect();
            if plan.is_decode_group(g) {
                let width = plan.widths[g];
                let mut positions = vec![0i32; width as usize];
                for &i in &members {
                    positions[plan.slots[i].offset as usize] = caches[i].len();
                }
                let positions = decode_kv.uploads.get(&positions).clone();
                let heads = |x: &Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
                    self.split_heads(x.reshape(&[width, 1, n * self.head_dim])?, n, norm)
                };
                let q = self.rotate_at(heads(&q_all[g], self.heads, &self.q_norm)?, &positions)?;
                let k =
                    self.rotate_at(heads(&k_all[g], self.kv_heads, &self.k_norm)?, &positions)?;
                let v = heads(&v_all[g], self.kv_heads, &None)?;
                if pooled {
                    groups[g] = Some((q, k, v));
                    continue;
                }
                for &i in &members {
                    let at = plan.slots[i].offset;
                    let row = |a: &Array| a.index(at..at + 1);
                    rows[i] = Some((row(&q), row(&k), row(&v)));
                }
                continue;
            }
            for &i in &members {
                let slot = &plan.slots[i];
                let span = |a: &[Array]| a[g].index((.., slot.offset..slot.offset + slot.len, ..));
                let offset = caches[i].len();
                let q = self.rotate(
                    self.split_heads(span(&q_all), self.heads, &self.q_norm)?,
                    offset,
                )?;
                let k = self.rotate(
                    self.split_heads(span(&k_all), self.kv_heads, &self.k_norm)?,
                    offset,
                )?;
                let v = self.split_heads(span(&v_all), self.kv_heads, &None)?;
                rows[i] = Some((q, k, v));
            }
        }
        let group_outs = if pooled {
            self.pooled_decode(&groups, plan, caches, decode_kv)?
        } else {
            vec![None; plan.widths.len()]
        };
        // The rows attended one by one (or, in the reference layout, padded together).
        let decoding = plan.slots.len() > 1 && plan.slots.iter().all(|s| s.len == 1);
        let mut outs: Vec<Option<Array>> = vec![None; plan.slots.len()];
        if matches!(plan.attention, AttentionLayout::Padded) && decoding {
            let all = rows.into_iter().map(|r| r.expect("every row")).collect();
            for (i, out) in self.padded_decode(all, caches)?.into_iter().enumerate() {
                outs[i] = Some(out);
            }
        } else {
            for (i, row) in rows.into_iter().enumerate() {
                if let Some(row) = row {
                    outs[i] = Some(self.own_cache(row, &mut *caches[i])?);
                }
            }
        }
        // Back into the groups' `[1, W, H*hd]` layout, zero rows where a group is padded.
        let width = self.heads * self.head_dim;
        let mut grouped = Vec::with_capacity(plan.widths.len());
        for (g, (&w, &filled)) in plan.widths.iter().zip(&plan.filled).enumerate() {
            let decode = plan.is_decode_group(g);
            let joined = match &group_outs[g] {
                Some(out) => out.clone(),
                None => {
                    // Decode rows are `[1, H, 1, hd]`, stacked on the first axis; prefill
                    // rows are flattened to `[1, len, H*hd]` and joined on the second.
                    let mut parts = plan
                        .rows_of(g)
                        .map(|i| {
                            let out = outs[i].take().expect("every row attended");
                            if decode {
                                Ok(out)
                            } else {
                                let len = plan.slots[i].len;
                                Ok(out
                                    .transpose_axes(&[0, 2, 1, 3])?
                                    .reshape(&[1, len, width])?)
                            }
                        })
                        .collect::<Result<Vec<_>>>()?;
                    if filled < w {
                        let mut shape = parts[0].shape().to_vec();
                        shape[if decode { 0 } else { 1 }] = w - filled;
                        parts.push(ops::zeros_dtype(&shape, parts[0].dtype())?);
                    }
                    if parts.len() == 1 {
                        parts.pop().expect("one part")
                    } else {
                        ops::concatenate(&parts, if decode { 0 } else { 1 })?
                    }
                }
            };
            let out = if decode {
                joined
                    .transpose_axes(&[0, 2, 1, 3])?
                    .reshape(&[1, w, width])?
            } else {
                joined
            };
            grouped.push(out);
        }
        Ok(grouped)
    }

    /// [`attend_groups`](Self::attend_groups) on the packed CPU path, from each group's
    /// projected rows in host memory (`qkv[g]`: `[W, q | k | v]`): keys and values go to
    /// the rows' host KV, and each query position, decoding or prefilling, attends over its
    /// row's KV on the host (`host::QueryAttention`). Returns each group's `[W, H·hd]`
    /// output, zero rows where padded.
    fn attend_on_host(
        &self,
        qkv: &[Vec<f32>],
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
    ) -> Result<Vec<Vec<f32>>> {
        let [qw, kw, _] = self.qkv_widths().map(|w| w as usize);
        let (heads, kv_heads, hd) = (
            self.heads as usize,
            self.kv_heads as usize,
            self.head_dim as usize,
        );
        let attention = host::QueryAttention {
            heads,
            kv_heads,
            head_dim: hd,
            scale: self.scale,
            softcap: self.softcap,
        };
        let inv_freqs = self
            .positions
            .rope
            .as_ref()
            .map(Rope::host_inv_freqs)
            .transpose()?;
        let input_scale = match self
            .positions
            .rope
            .as_ref()
            .and_then(|r| r.input_scale.as_ref())
        {
            Some(s) => Some(s.as_dtype(Dtype::Float32)?),
            None => None,
        };
        let rotary = match (&self.positions.rope, &inv_freqs) {
            (Some(rope), Some(inv_freqs)) => Some(host::Rotary {
                dims: rope.dims as usize,
                traditional: rope.traditional,
                scale: rope.scale,
                inv_freqs,
                input_scale: input_scale
                    .as_ref()
                    .map(|s| s.try_as_slice::<f32>())
                    .transpose()?,
            }),
            _ => None,
        };
        // First the rows' queries, and their keys and values into their caches; then every
        // query position of every row attends on its own, in parallel.
        let mut queries = Vec::with_capacity(plan.slots.len());
        for (i, slot) in plan.slots.iter().enumerate() {
            let (at, len) = (slot.offset as usize, slot.len as usize);
            let rows = &qkv[slot.group][at * (qw + 2 * kw)..(at + len) * (qw + 2 * kw)];
            let [mut q, mut k, v] = host::split_columns(rows, len, [qw, kw, kw]);
            if let Some(n) = &self.q_norm {
                q = n.forward_host(&q)?;
            }
            if let Some(n) = &self.k_norm {
                k = n.forward_host(&k)?;
            }
            let first = caches[i].len() as usize;
            if let Some(rotary) = &rotary {
                rotary.apply(&mut q, heads, hd, first);
                rotary.apply(&mut k, kv_heads, hd, first);
            }
            caches[i].append_host(&k, &v, kv_heads, hd)?;
            queries.push((q, first));
        }
        let held: Vec<(&HostKv, usize)> = caches
            .iter()
            .map(|c| (c.host().expect("appended above"), c.first() as usize))
            .collect();
        let jobs: Vec<(usize, usize)> = plan
            .slots
            .iter()
            .enumerate()
            .flat_map(|(i, slot)| (0..slot.len as usize).map(move |n| (i, n)))
            .collect();
        let window = self.positions.window.map(|w| w as usize);
        let attended: Vec<Vec<f32>> = jobs
            .par_iter()
            .map(|&(i, n)| {
                let (q, first) = &queries[i];
                // The query at position `p` sees keys `(p - window, p]`; the store's `t`-th
                // position is position `kept + t`.
                let end = first + n + 1;
                let start = window.map_or(0, |w| end.saturating_sub(w));
                let (kv, kept) = held[i];
                attention.attend(&q[n * qw..(n + 1) * qw], kv, start - kept, end - kept)
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = plan
            .widths
            .iter()
            .map(|&w| vec![0.0; w as usize * qw])
            .collect();
        for (&(i, n), out) in jobs.iter().zip(attended) {
            let slot = &plan.slots[i];
            let at = (slot.offset as usize + n) * qw;
            outs[slot.group][at..at + qw].copy_from_slice(&out);
        }
        Ok(outs)
    }

    /// One row against its own unpadded cache (causal within a prefill chunk). In a
    /// sliding-window layer only the keys some query of the row sees take part, masked
    /// per query where the window moves within the chunk.
    fn own_cache(&self, (q, k, v): (Array, Array, Array), cache: &mut KvCache) -> Result<Array> {
        let len = q.shape()[2];
        let (k, v) = cache.append(k, v)?;
        let total = cache.len();
        let start = self
            .positions
            .window
            .map_or(0, |w| (total - len + 1 - w).max(0));
        // The cache holds positions from `first()` on, never past `start`.
        let skip = start - cache.first();
        let (k, v) = if skip > 0 {
            let tail = |a: &Array| a.index((.., .., skip.., ..));
            (tail(&k), tail(&v))
        } else {
            (k, v)
        };
        let window_moves = self.positions.window.is_some_and(|w| total - w > start);
        let mask = if len > 1 && window_moves {
            Some(window_mask(
                len,
                total - start,
                self.positions.window,
                q.dtype(),
            )?)
        } else {
            None
        };
        let mask = match &mask {
            Some(m) => Some(ScaledDotProductAttentionMask::Array(m)),
            None => (len > 1).then_some(ScaledDotProductAttentionMask::Causal),
        };
        self.attend(q, k, v, mask)
    }

    /// The decode groups (`groups[g]`: group `g`'s rotated `[W, ., 1, hd]` queries, keys and
    /// values) attended in the pool: each class's new keys and values are written with one
    /// scatter, then every [`KvPool::call_slots`] slots holding a row of this step are one
    /// call at the class's capacity, positions past each row's length masked (a slot of no
    /// row here attends zeros with any query, its output dropped). Rows are picked by
    /// slicing where they lie in order (the usual case), so a step adds few ops per layer.
    /// Returns each decode group's `[W, H, 1, hd]` output.
    fn pooled_decode(
        &self,
        groups: &[Option<(Array, Array, Array)>],
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
        decode_kv: &mut DecodeKv,
    ) -> Result<Vec<Option<Array>>> {
        if groups.iter().all(Option::is_none) {
            return Ok(vec![None; groups.len()]);
        }
        // The decode groups end to end; `at[i]` is row `i`'s place in them.
        let mut at: Vec<Option<i32>> = vec![None; plan.slots.len()];
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        let mut places = 0;
        for (g, group) in groups.iter().enumerate() {
            let Some((q, k, v)) = group else { continue };
            for i in plan.rows_of(g) {
                at[i] = Some(places + plan.slots[i].offset);
            }
            places += plan.widths[g];
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let (q, k, v) = (join_rows(&qs)?, join_rows(&ks)?, join_rows(&vs)?);
        let mut by_class: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, place) in at.iter().enumerate() {
            if place.is_some() {
                let capacity = caches[i].pooled().expect("placed").capacity;
                by_class.entry(capacity).or_default().push(i);
            }
        }
        let layer = decode_kv.layer;
        let mut outs = Vec::new();
        // Where each place's output lies among the calls' outputs end to end (`None`: a
        // padding place no call computed; any output serves it).
        let mut out_of: Vec<Option<i32>> = vec![None; places as usize];
        let mut computed = 0;
        for (capacity, members) in by_class {
            let rows: Vec<i32> = members
                .iter()
                .map(|&i| at[i].expect("a decode row"))
                .collect();
            let mut picked: Vec<&mut KvCache> = caches
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| members.contains(i))
                .map(|(_, c)| &mut **c)
                .collect();
            decode_kv.pool.write(
                layer,
                capacity,
                &mut picked,
                (
                    &pick_rows(&k, &rows, &mut decode_kv.uploads)?,
                    &pick_rows(&v, &rows, &mut decode_kv.uploads)?,
                ),
                &mut decode_kv.uploads,
            )?;
            // Each call: its slots' rows, as (place, length).
            let slots = decode_kv.pool.call_slots(capacity);
            let mut calls: BTreeMap<i32, Vec<Option<(i32, i32)>>> = BTreeMap::new();
            for &i in &members {
                let p = caches[i].pooled().expect("placed");
                let first = p.slot / slots * slots;
                let call = calls
                    .entry(first)
                    .or_insert_with(|| vec![None; slots as usize]);
                call[(p.slot - first) as usize] = Some((at[i].expect("a decode row"), p.len));
            }
            for (first, call) in calls {
                let queries = call_queries(&call, places);
                // A padding place that served as a filler takes that output (so a group's
                // outputs stay in order); a row's place always takes its own.
                for (j, &place) in queries.iter().enumerate() {
                    let own = call[j].is_some();
                    let entry = &mut out_of[place as usize];
                    if own || entry.is_none() {
                        *entry = Some(computed + j as i32);
                    }
                }
                let lens: Vec<i32> = call
                    .iter()
                    .map(|c| c.map_or(capacity, |(_, len)| len))
                    .collect();
                let queries = pick_rows(&q, &queries, &mut decode_kv.uploads)?;
                let (keys, values) = decode_kv.pool.call(layer, capacity, first);
                let (ring, window) = (keys.shape()[2], self.positions.window);
                let mask = decode_kv.masks.get(ring, window, lens, queries.dtype())?;
                outs.push(if plan.fused_masked_attention {
                    self.attend(
                        queries,
                        keys,
                        values,
                        Some(ScaledDotProductAttentionMask::Array(mask)),
                    )?
                } else {
                    self.attend_by_matmuls(&queries, &keys, &values, mask)?
                });
                computed += slots;
            }
        }
        let all = join_rows(&outs.iter().collect::<Vec<_>>())?;
        let mut place = 0;
        groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                if group.is_none() {
                    return Ok(None);
                }
                let w = plan.widths[g];
                let picks: Vec<i32> = out_of[place as usize..(place + w) as usize]
                    .iter()
                    .map(|o| o.unwrap_or(0))
                    .collect();
                place += w;
                Ok(Some(pick_rows(&all, &picks, &mut decode_kv.uploads)?))
            })
            .collect()
    }

    /// One decode token per row, attended in a single call over the caches padded with
    /// masked zeros to the longest (the non-invariant reference layout).
    fn padded_decode(
        &self,
        rows: Vec<(Array, Array, Array)>,
        caches: &mut [&mut KvCache],
    ) -> Result<Vec<Array>> {
        let count = rows.len() as i32;
        let mut held = Vec::with_capacity(rows.len());
        let mut qs = Vec::with_capacity(rows.len());
        for ((q, k, v), cache) in rows.into_iter().zip(caches.iter_mut()) {
            held.push(cache.append(k, v)?);
            qs.push(q);
        }
        // Each row's held positions (from its cache's `first()`), the new one last.
        let lens: Vec<i32> = caches.iter().map(|c| c.held()).collect();
        let longest = lens.iter().copied().max().unwrap_or(1);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for ((k, v), len) in held.into_iter().zip(&lens) {
            let pad = [(0, 0), (0, 0), (0, longest - len), (0, 0)];
            ks.push(ops::pad(&k, &pad, None, None)?);
            vs.push(ops::pad(&v, &pad, None, None)?);
        }
        let q = ops::concatenate(&qs, 0)?;
        let mask = decode_mask(longest, self.positions.window, &lens, q.dtype())?;
        let out = self.attend(
            q,
            ops::concatenate(&ks, 0)?,
            ops::concatenate(&vs, 0)?,
            Some(ScaledDotProductAttentionMask::Array(&mask)),
        )?;
        Ok((0..count).map(|i| out.index(i..i + 1)).collect())
    }
}

/// Each matmul group's projected queries, keys and values (`[1, W, .]`), in group order.
#[derive(Default)]
struct QueriesKeysValues {
    q: Vec<Array>,
    k: Vec<Array>,
    v: Vec<Array>,
}

impl QueriesKeysValues {
    fn push(&mut self, q: Array, k: Array, v: Array) {
        self.q.push(q);
        self.k.push(k);
        self.v.push(v);
    }
}

/// `x += norm(r)` where the variant normalizes a sublayer's output, else `x += r`: the
/// host path's [`residual`] (float32 only, so no float16 clipping).
fn host_residual(x: &mut [f32], r: Vec<f32>, norm: &Option<RmsNorm>) -> Result<()> {
    let r = match norm {
        Some(n) => n.forward_host(&r)?,
        None => r,
    };
    host::add_into(x, &r);
    Ok(())
}

/// What a step's decode rows carry from layer to layer.
struct DecodeKv<'a> {
    pool: &'a mut KvPool,
    /// The calls' masks, built once: every layer holds the same lengths.
    masks: Masks,
    /// The rows' positions and the pool's write indices, alike in every layer.
    uploads: Uploads,
    layer: usize,
}

impl<'a> DecodeKv<'a> {
    /// The step's decode KV, with every decoding row placed in `pool` where the layout
    /// pools it.
    fn place(plan: &StepPlan, caches: &mut [&mut [KvCache]], pool: &'a mut KvPool) -> Result<Self> {
        if plan.attention == AttentionLayout::Capacity {
            for g in 0..plan.widths.len() {
                if plan.is_decode_group(g) {
                    for i in plan.rows_of(g) {
                        pool.place(caches[i])?;
                    }
                }
            }
        }
        Ok(DecodeKv {
            pool,
            masks: Masks::default(),
            uploads: Uploads::default(),
            layer: 0,
        })
    }
}

/// Arrays joined on the first axis (one is returned as it is).
fn join_rows(parts: &[&Array]) -> Result<Array> {
    Ok(match parts {
        [one] => (*one).clone(),
        _ => ops::concatenate(parts, 0)?,
    })
}

/// Where one position of a matmul group takes its token id from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdSource {
    /// No row's (any id serves).
    Padding,
    Host,
    /// The drawn tokens' entry.
    Drawn(i32),
}

/// One group's token ids (`[W]` uint32) where some are drawn on the device: `ids[k]` from
/// the host or `drawn[j]`, as `from[k]` says. Padding takes whatever keeps the picks
/// consecutive, so a group of drawn tokens alone is a slice of them.
fn group_ids(drawn: &Array, ids: &[u32], from: &[IdSource]) -> Result<Array> {
    let n = drawn.shape()[0];
    if !from.contains(&IdSource::Host) {
        let start = from
            .iter()
            .enumerate()
            .find_map(|(k, f)| match f {
                IdSource::Drawn(j) => Some(j - k as i32),
                _ => None,
            })
            .unwrap_or(0);
        let picks: Vec<i32> = from
            .iter()
            .enumerate()
            .map(|(k, f)| match f {
                IdSource::Drawn(j) => *j,
                _ => (start + k as i32).clamp(0, n - 1),
            })
            .collect();
        return pick_rows(drawn, &picks, &mut Uploads::default());
    }
    // The host's ids after the drawn ones, each position picking its own.
    let picks: Vec<i32> = from
        .iter()
        .enumerate()
        .map(|(k, f)| match f {
            IdSource::Drawn(j) => *j,
            _ => n + k as i32,
        })
        .collect();
    let all = ops::concatenate(&[drawn, &Array::from_slice(ids, &[ids.len() as i32])], 0)?;
    pick_rows(&all, &picks, &mut Uploads::default())
}

/// Rows `rows` of `a` (on the first axis), in that order: a slice where they are
/// consecutive (no op, or a view), else a gather (its index from `uploads`).
fn pick_rows(a: &Array, rows: &[i32], uploads: &mut Uploads) -> Result<Array> {
    let first = rows[0];
    let consecutive = rows.iter().zip(first..).all(|(&r, want)| r == want);
    if !consecutive {
        return Ok(a.take_axis(uploads.get(rows), 0)?);
    }
    let end = first + rows.len() as i32;
    Ok(if first == 0 && end == a.shape()[0] {
        a.clone()
    } else {
        a.index(first..end)
    })
}

/// The query place of each slot of one pooled call (`call[j]`: the place and length of
/// slot `j`'s row, if it runs here) among `places` stacked queries. A slot of no row takes
/// the place that keeps the call's queries consecutive when the rows' places allow it (so
/// [`pick_rows`] slices), else the first row's.
fn call_queries(call: &[Option<(i32, i32)>], places: i32) -> Vec<i32> {
    let (j, (place, _)) = call
        .iter()
        .enumerate()
        .find_map(|(j, c)| c.map(|c| (j as i32, c)))
        .expect("a call holds a row");
    let start = place - j;
    let in_order = start >= 0
        && start + call.len() as i32 <= places
        && call
            .iter()
            .zip(start..)
            .all(|(c, want)| c.is_none_or(|(p, _)| p == want));
    call.iter()
        .zip(start..)
        .map(|(c, consecutive)| match c {
            Some((p, _)) => *p,
            None if in_order => consecutive,
            None => place,
        })
        .collect()
}

/// The masks of a step's batched decode-attention calls, by the calls' key capacity (a
/// windowed layer's ring or the class's), window and lengths.
#[derive(Default)]
struct Masks(HashMap<(i32, Option<i32>, Vec<i32>), Array>);

impl Masks {
    /// See [`decode_mask`]; built once per step for the layers that share it.
    fn get(
        &mut self,
        capacity: i32,
        window: Option<i32>,
        lens: Vec<i32>,
        dtype: Dtype,
    ) -> Result<&Array> {
        match self.0.entry((capacity, window, lens)) {
            Entry::Occupied(mask) => Ok(mask.into_mut()),
            Entry::Vacant(slot) => {
                let mask = decode_mask(capacity, window, &slot.key().2, dtype)?;
                Ok(slot.insert(mask))
            }
        }
    }
}

/// `[rows, 1, 1, capacity]` for decode rows whose caches hold `lens[i]` positions, the new
/// one last, position `t` at index `t % capacity` (a ring once `lens[i]` passes the
/// capacity; below it, every position at its own index): 0 where the row's query sees the
/// index's latest position (before its length, and within `window` of it), -inf elsewhere.
fn decode_mask(capacity: i32, window: Option<i32>, lens: &[i32], dtype: Dtype) -> Result<Array> {
    let values: Vec<f32> = lens
        .iter()
        .flat_map(|&len| {
            let first = window.map_or(0, |w| len - w);
            (0..capacity).map(move |i| {
                // The latest position below `len` that index `i` holds, if any.
                let t = i + (len - 1 - i).max(0) / capacity * capacity;
                if t < len && t >= first {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let rows = lens.len() as i32;
    Ok(Array::from_slice(&values, &[rows, 1, 1, capacity]).as_dtype(dtype)?)
}

/// `[len, keys]` for the last `len` of `keys` consecutive positions as queries: 0 where a
/// query sees the key (at or before it, and within `window` of it), -inf elsewhere.
fn window_mask(len: i32, keys: i32, window: Option<i32>, dtype: Dtype) -> Result<Array> {
    let values: Vec<f32> = (0..len)
        .flat_map(|i| {
            let at = keys - len + i;
            let first = window.map_or(0, |w| at + 1 - w);
            (0..keys).map(move |t| {
                if t <= at && t >= first {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Array::from_slice(&values, &[len, keys]).as_dtype(dtype)?)
}

struct Mlp {
    /// The gate's and the up projection.
    gate_up: Projections<2>,
    down_proj: Linear,
    activation: Activation,
    inner: i32,
}

impl Mlp {
    fn load(weights: &mut WeightMap, prefix: &str, c: &ModelConfig, v: Variant) -> Result<Self> {
        let (d, i) = (c.hidden_size, c.intermediate_size);
        let gate_up = Projections::new(if v.fused_projections {
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

    /// [`forward`](Self::forward) of `m` rows of host floats (packed weights only).
    fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let gate_up = self.gate_up.forward_host(x, m)?;
        let activated = host::gated(self.activation, &gate_up, self.inner as usize);
        self.down_proj.forward_host(&activated, m)
    }
}

/// A layer's feed-forward sublayer: the dense gated MLP, or a mixture of experts.
enum FeedForward {
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
struct Block {
    attn_in: RmsNorm,
    self_attn: Attention,
    attn_out: Option<RmsNorm>,
    mlp_in: RmsNorm,
    mlp: FeedForward,
    mlp_out: Option<RmsNorm>,
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

/// Which positions the output head runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only each row's last position (generation).
    Last,
    /// Every position (evaluation).
    All,
}

/// A step's input tokens, in the plan's row order: known on the host, or drawn by the
/// previous step and still on the device (the scheduler feeds a drawn token back before
/// reading it, so building a step does not wait for the one before).
#[derive(Debug, Clone, Copy)]
pub struct StepTokens<'a> {
    /// Every input token; a placeholder where `drawn` supplies it.
    pub host: &'a [u32],
    /// Tokens drawn on the device (`[n]` uint32, lazy) and, per input token, its index
    /// there when it is one of them.
    pub drawn: Option<(&'a Array, &'a [Option<i32>])>,
}

impl<'a> From<&'a [u32]> for StepTokens<'a> {
    fn from(host: &'a [u32]) -> Self {
        StepTokens { host, drawn: None }
    }
}

impl StepTokens<'_> {
    /// Every token on the host (reading the drawn ones: this waits for them).
    fn to_host(self) -> Result<Vec<u32>> {
        let Some((drawn, from)) = self.drawn else {
            return Ok(self.host.to_vec());
        };
        drawn.eval()?;
        let drawn = drawn.as_slice::<u32>();
        Ok(self
            .host
            .iter()
            .zip(from)
            .map(|(&t, from)| from.map_or(t, |j| drawn[j as usize]))
            .collect())
    }
}

/// A loaded decoder-only transformer.
pub struct Transformer {
    pub config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    embedding_scale: Option<f32>,
    logit_softcap: Option<f32>,
    dtype: Dtype,
    weight_kind: WeightKind,
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

    /// Run one step over several sequences laid out by `plan`: `tokens` holds each row's
    /// new tokens end to end (`plan.slots[i].len` of them for row `i`), `caches[i]` is row
    /// `i`'s per-layer cache, and `pool` holds decoding rows' KV where the layout pools it
    /// (rows leave it with [`KvPool::release`]). Returns float32 logits: `[1, rows, V]` for
    /// each row's last position, or `[1, N, V]` for every position. `trace` keeps one row's
    /// numbers (on the MLX path; the host path keeps none).
    pub fn forward(
        &self,
        tokens: StepTokens,
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        pool: &mut KvPool,
        logits: Logits,
        mut trace: Option<&mut RowTrace>,
    ) -> Result<Array> {
        if self.weight_kind == WeightKind::Packed && plan.attention == AttentionLayout::PerRow {
            runtime::set_blas_threads(1);
            return self.forward_on_host(&tokens.to_host()?, plan, caches, logits);
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
        let positions = |slot: &Slot, from: i32| {
            h[slot.group].index((.., slot.offset + from..slot.offset + slot.len, ..))
        };
        let head = |x: &Array| -> Result<Array> {
            let logits = self
                .lm_head
                .forward(&self.norm.forward(x)?, plan.products)?;
            match self.logit_softcap {
                Some(cap) => softcap(&logits, cap),
                None => Ok(logits),
            }
        };
        let out = match logits {
            Logits::All => {
                let all = plan
                    .slots
                    .iter()
                    .map(|s| positions(s, 0))
                    .collect::<Vec<_>>();
                head(&ops::concatenate(&all, 1)?)?
            }
            Logits::Last => {
                // The rows' last positions, in output-head groups of fixed width.
                let mut last = plan.slots.iter().map(|s| positions(s, s.len - 1));
                let mut outs = Vec::with_capacity(plan.head_widths.len());
                let mut remaining = plan.slots.len() as i32;
                for &w in &plan.head_widths {
                    let n = remaining.min(w);
                    let mut parts: Vec<Array> = last.by_ref().take(n as usize).collect();
                    if n < w {
                        let d = parts[0].shape()[2];
                        parts.push(ops::zeros_dtype(&[1, w - n, d], parts[0].dtype())?);
                    }
                    let group = head(&ops::concatenate(&parts, 1)?)?;
                    outs.push(if n < w {
                        group.index((.., ..n, ..))
                    } else {
                        group
                    });
                    remaining -= n;
                }
                if outs.len() == 1 {
                    outs.pop().expect("one group")
                } else {
                    ops::concatenate(&outs, 1)?
                }
            }
        };
        if let Some(t) = trace {
            if logits == Logits::Last {
                let row = t.row as i32;
                t.keep(out.index((.., row..row + 1, ..)));
            }
        }
        Ok(out.as_dtype(Dtype::Float32)?)
    }

    /// [`forward`](Self::forward) for a model whose every matmul runs on the CPU kernels
    /// (with per-row attention): the residual stream stays in host memory, where the kernels
    /// read and write it, and each layer's row-wise math, RoPE and a decoding row's attention
    /// over its host KV run there too (`host.rs`), for prefill chunks and decoding rows
    /// alike. No MLX op runs; the MLX path hands over to MLX's stream thread once per
    /// matmul input and runs many small ops per row.
    fn forward_on_host(
        &self,
        tokens: &[u32],
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        logits: Logits,
    ) -> Result<Array> {
        let d = self.config.hidden_size as usize;
        let embedded = self.embed(tokens.into(), plan)?;
        let mut h = embedded
            .iter()
            .map(|x| Ok(x.try_as_slice::<f32>()?.to_vec()))
            .collect::<Result<Vec<_>>>()?;
        for (layer, block) in self.layers.iter().enumerate() {
            let mut layer_caches: Vec<&mut KvCache> =
                caches.iter_mut().map(|c| &mut c[layer]).collect();
            let FeedForward::Dense(mlp) = &block.mlp else {
                unreachable!("a packed model has dense MLPs");
            };
            let attention = &block.self_attn;
            let qkv = h
                .iter()
                .zip(&plan.widths)
                .map(|(x, &w)| {
                    attention
                        .qkv
                        .forward_host(&block.attn_in.forward_host(x)?, w as usize)
                })
                .collect::<Result<Vec<_>>>()?;
            let attended = attention.attend_on_host(&qkv, plan, &mut layer_caches)?;
            for ((x, out), &w) in h.iter_mut().zip(&attended).zip(&plan.widths) {
                let rows = w as usize;
                let o = attention.o_proj.forward_host(out, rows)?;
                host_residual(x, o, &block.attn_out)?;
                let normed = block.mlp_in.forward_host(x)?;
                host_residual(x, mlp.forward_host(&normed, rows)?, &block.mlp_out)?;
            }
        }
        // The positions the head runs on, in row order.
        let mut picked = Vec::new();
        for slot in &plan.slots {
            let from = match logits {
                Logits::All => 0,
                Logits::Last => slot.len - 1,
            };
            let rows = (slot.offset + from..slot.offset + slot.len).map(|r| r as usize);
            picked.extend(host::gather_rows(&h[slot.group], d, rows));
        }
        let n = picked.len() / d;
        let normed = self.norm.forward_host(&picked)?;
        let mut out = self.lm_head.forward_host(&normed, n)?;
        if let Some(cap) = self.logit_softcap {
            host::softcap(&mut out, cap);
        }
        Ok(Array::from_slice(
            &out,
            &[1, n as i32, self.config.vocab_size],
        ))
    }

    /// Each matmul group's embedded tokens (`[1, W, D]`); padding rows embed any token
    /// (their outputs are unused). A group's ids are uploaded from the host, or picked from
    /// the drawn tokens on the device where it holds some.
    fn embed(&self, tokens: StepTokens, plan: &StepPlan) -> Result<Vec<Array>> {
        let mut ids: Vec<Vec<u32>> = plan.widths.iter().map(|&w| vec![0; w as usize]).collect();
        let mut from: Vec<Vec<IdSource>> = plan
            .widths
            .iter()
            .map(|&w| vec![IdSource::Padding; w as usize])
            .collect();
        let mut start = 0;
        for slot in &plan.slots {
            let at = slot.offset as usize;
            for k in 0..slot.len as usize {
                let t = start + k;
                ids[slot.group][at + k] = tokens.host[t];
                from[slot.group][at + k] = match tokens.drawn {
                    Some((_, drawn_from)) => drawn_from[t].map_or(IdSource::Host, IdSource::Drawn),
                    None => IdSource::Host,
                };
            }
            start += slot.len as usize;
        }
        ids.iter()
            .zip(&from)
            .map(|(ids, from)| {
                let width = ids.len() as i32;
                let input = match tokens.drawn {
                    Some((drawn, _)) if from.iter().any(|f| matches!(f, IdSource::Drawn(_))) => {
                        group_ids(drawn, ids, from)?
                    }
                    _ => Array::from_slice(ids, &[width]),
                }
                .reshape(&[1, width])?;
                let h = self.embed_tokens.forward(&input, self.dtype)?;
                match self.embedding_scale {
                    Some(s) => Ok(h.multiply(Array::from_f32(s).as_dtype(h.dtype())?)?),
                    None => Ok(h),
                }
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_of_rows_in_order_takes_its_queries_by_slicing() {
        // Slots 0 and 2 of a 4-slot call hold the rows at places 5 and 7 of 12 stacked
        // queries: the empty slots take places 6 and 8, so the call reads places 5..9.
        let call = [Some((5, 30)), None, Some((7, 40)), None];
        assert_eq!(call_queries(&call, 12), [5, 6, 7, 8]);
        // Too few stacked queries to continue the run, or rows out of order: the empty
        // slots take the first row's place, and the call gathers.
        assert_eq!(call_queries(&call, 8), [5, 5, 7, 5]);
        let shuffled = [Some((3, 30)), Some((1, 40)), None, None];
        assert_eq!(call_queries(&shuffled, 12), [3, 1, 3, 3]);
        let picks = |rows: &[i32]| {
            let a = ops::arange::<_, f32>(0.0, 12.0, None).unwrap();
            let picked = pick_rows(&a, rows, &mut Uploads::default()).unwrap();
            picked.as_slice::<f32>().to_vec()
        };
        assert_eq!(picks(&[5, 6, 7, 8]), [5.0, 6.0, 7.0, 8.0]);
        assert_eq!(picks(&[3, 1, 3]), [3.0, 1.0, 3.0]);
    }

    #[test]
    fn a_group_of_drawn_tokens_and_padding_is_a_slice_of_them() {
        let drawn = Array::from_slice(&[10u32, 11, 12], &[3]);
        let ids = |from: &[IdSource], host: &[u32]| {
            let ids = group_ids(&drawn, host, from).unwrap();
            ids.as_slice::<u32>().to_vec()
        };
        use IdSource::{Drawn, Host, Padding};
        assert_eq!(ids(&[Drawn(1), Drawn(2), Padding], &[0; 3]), [11, 12, 12]);
        assert_eq!(ids(&[Drawn(0), Host, Padding], &[0, 7, 0]), [10, 7, 0]);
    }
}

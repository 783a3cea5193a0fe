//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings, pre-norm attention + SwiGLU blocks, final norm, output head. Architectures
//! differ only in the switches of [`Variant`], set by their own files. How a step's rows
//! are laid out into matmuls and attention calls comes from a [`StepPlan`].

use std::collections::{hash_map::Entry, BTreeMap, HashMap};

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};

use crate::{
    config::ModelConfig,
    error::Result,
    kv_cache::{KvCache, KvPool, SLOTS_PER_CALL},
    step_plan::{AttentionLayout, Slot, StepPlan, WeightKind},
    weights::{Embedding, Linear, Matrix, WeightMap},
};

/// What one architecture changes in the shared block.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// Biases on the q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms on each head's queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
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
}

impl Rope {
    /// `x` (`[B, H, L, hd]`) rotated for positions `offset..offset + L`.
    fn apply(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(fast::rope(
            x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offset,
            self.freqs.as_ref(),
        )?)
    }

    /// `x` (`[B, H, 1, hd]`) with row `b` rotated for position `positions[b]`.
    fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        Ok(fast::rope_dynamic(
            x,
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
    fn load(weights: &mut WeightMap, name: &str, size: i32, eps: f32) -> Result<Self> {
        Ok(RmsNorm {
            weight: weights.vector(name, size)?,
            eps,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
}

impl Attention {
    fn load(weights: &mut WeightMap, prefix: &str, c: &ModelConfig, v: Variant) -> Result<Self> {
        let (d, hd) = (c.hidden_size, c.head_dim());
        let (heads, kv_heads) = (c.num_attention_heads, c.kv_heads());
        let bias = v.qkv_bias || c.attention_bias;
        let norm = |w: &mut WeightMap, n: &str| -> Result<Option<RmsNorm>> {
            v.qk_norm
                .then(|| RmsNorm::load(w, &format!("{prefix}.{n}.weight"), hd, c.rms_norm_eps))
                .transpose()
        };
        Ok(Attention {
            q_proj: weights.linear(&format!("{prefix}.q_proj"), d, heads * hd, bias)?,
            k_proj: weights.linear(&format!("{prefix}.k_proj"), d, kv_heads * hd, bias)?,
            v_proj: weights.linear(&format!("{prefix}.v_proj"), d, kv_heads * hd, bias)?,
            o_proj: weights.linear(&format!("{prefix}.o_proj"), heads * hd, d, c.attention_bias)?,
            q_norm: norm(weights, "q_norm")?,
            k_norm: norm(weights, "k_norm")?,
            heads,
            kv_heads,
            head_dim: hd,
        })
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
    /// projections run per group, attention per row or in batches as `plan` says, and the
    /// rows' outputs are laid back into their groups (zero rows where the group is padded).
    fn forward(
        &self,
        xs: &[Array],
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
        decode_kv: &mut DecodeKv,
        rope: &Rope,
    ) -> Result<Vec<Array>> {
        let project = |proj: &Linear| {
            xs.iter()
                .map(|x| proj.forward(x))
                .collect::<Result<Vec<_>>>()
        };
        let (q_all, k_all, v_all) = (
            project(&self.q_proj)?,
            project(&self.k_proj)?,
            project(&self.v_proj)?,
        );
        let scale = (self.head_dim as f32).powf(-0.5);
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
                let positions = Array::from_slice(&positions, &[width]);
                let heads = |x: &Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
                    self.split_heads(x.reshape(&[width, 1, n * self.head_dim])?, n, norm)
                };
                let q = rope.apply_at(&heads(&q_all[g], self.heads, &self.q_norm)?, &positions)?;
                let k =
                    rope.apply_at(&heads(&k_all[g], self.kv_heads, &self.k_norm)?, &positions)?;
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
                let q = rope.apply(
                    &self.split_heads(span(&q_all), self.heads, &self.q_norm)?,
                    offset,
                )?;
                let k = rope.apply(
                    &self.split_heads(span(&k_all), self.kv_heads, &self.k_norm)?,
                    offset,
                )?;
                let v = self.split_heads(span(&v_all), self.kv_heads, &None)?;
                rows[i] = Some((q, k, v));
            }
        }
        let group_outs = if pooled {
            self.pooled_decode(&groups, plan, caches, decode_kv, scale)?
        } else {
            vec![None; plan.widths.len()]
        };
        // The rows attended one by one (or, in the reference layout, padded together).
        let decoding = plan.slots.len() > 1 && plan.slots.iter().all(|s| s.len == 1);
        let mut outs: Vec<Option<Array>> = vec![None; plan.slots.len()];
        if matches!(plan.attention, AttentionLayout::Padded) && decoding {
            let all = rows.into_iter().map(|r| r.expect("every row")).collect();
            for (i, out) in self
                .padded_decode(all, caches, scale)?
                .into_iter()
                .enumerate()
            {
                outs[i] = Some(out);
            }
        } else {
            for (i, row) in rows.into_iter().enumerate() {
                if let Some(row) = row {
                    outs[i] = Some(self.own_cache(row, &mut *caches[i], scale)?);
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
            grouped.push(self.o_proj.forward(&out)?);
        }
        Ok(grouped)
    }

    /// One row against its own unpadded cache (causal within a prefill chunk).
    fn own_cache(
        &self,
        (q, k, v): (Array, Array, Array),
        cache: &mut KvCache,
        scale: f32,
    ) -> Result<Array> {
        let len = q.shape()[2];
        let (k, v) = cache.append(k, v)?;
        let mask = (len > 1).then_some(ScaledDotProductAttentionMask::Causal);
        Ok(fast::scaled_dot_product_attention(
            q, k, v, scale, mask, None,
        )?)
    }

    /// The decode groups (`groups[g]`: group `g`'s rotated `[W, ., 1, hd]` queries, keys and
    /// values) attended in the pool: each class's new keys and values are written with one
    /// scatter, then every `SLOTS_PER_CALL` slots holding a row of this step are one call at
    /// the class's capacity, positions past each row's length masked (slots of no row here
    /// attend zeros). Returns each decode group's `[W, H, 1, hd]` output.
    fn pooled_decode(
        &self,
        groups: &[Option<(Array, Array, Array)>],
        plan: &StepPlan,
        caches: &mut [&mut KvCache],
        decode_kv: &mut DecodeKv,
        scale: f32,
    ) -> Result<Vec<Option<Array>>> {
        if groups.iter().all(Option::is_none) {
            return Ok(vec![None; groups.len()]);
        }
        // The decode groups end to end; `at[i]` is row `i`'s place in them.
        let mut at: Vec<Option<i32>> = vec![None; plan.slots.len()];
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        let mut base = 0;
        for (g, group) in groups.iter().enumerate() {
            let Some((q, k, v)) = group else { continue };
            for i in plan.rows_of(g) {
                at[i] = Some(base + plan.slots[i].offset);
            }
            base += plan.widths[g];
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let (stacked_q, k, v) = (join_rows(&qs)?, join_rows(&ks)?, join_rows(&vs)?);
        // A zero query after the last row, for the slots no row of this step holds.
        let filler = base;
        let mut zero_shape = stacked_q.shape().to_vec();
        zero_shape[0] = 1;
        let q = ops::concatenate(
            &[
                &stacked_q,
                &ops::zeros_dtype(&zero_shape, stacked_q.dtype())?,
            ],
            0,
        )?;
        let mut by_class: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, place) in at.iter().enumerate() {
            if place.is_some() {
                let capacity = caches[i].pooled().expect("placed").capacity;
                by_class.entry(capacity).or_default().push(i);
            }
        }
        let layer = decode_kv.layer;
        let mut outs = Vec::new();
        let mut out_of: Vec<i32> = vec![0; base as usize];
        for (capacity, members) in by_class {
            let places: Vec<i32> = members
                .iter()
                .map(|&i| at[i].expect("a decode row"))
                .collect();
            let places = Array::from_slice(&places, &[places.len() as i32]);
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
                &k.take_axis(&places, 0)?,
                &v.take_axis(&places, 0)?,
            )?;
            // Each call: the slot's row (its query and length), or the filler.
            let mut calls: BTreeMap<i32, (Vec<i32>, Vec<i32>)> = BTreeMap::new();
            for &i in &members {
                let p = caches[i].pooled().expect("placed");
                let first = p.slot / SLOTS_PER_CALL * SLOTS_PER_CALL;
                let (queries, lens) = calls.entry(first).or_insert_with(|| {
                    let slots = SLOTS_PER_CALL as usize;
                    (vec![filler; slots], vec![capacity; slots])
                });
                let j = (p.slot - first) as usize;
                queries[j] = at[i].expect("a decode row");
                lens[j] = p.len;
            }
            for (first, (queries, lens)) in calls {
                // Row outputs come back from this call's place among all calls.
                for (j, &place) in queries.iter().enumerate() {
                    if place != filler {
                        out_of[place as usize] = outs.len() as i32 * SLOTS_PER_CALL + j as i32;
                    }
                }
                let queries = q.take_axis(Array::from_slice(&queries, &[SLOTS_PER_CALL]), 0)?;
                let (keys, values) = decode_kv.pool.call(layer, capacity, first);
                let mask = decode_kv.masks.get(capacity, lens, queries.dtype())?;
                outs.push(fast::scaled_dot_product_attention(
                    queries,
                    keys,
                    values,
                    scale,
                    ScaledDotProductAttentionMask::Array(mask),
                    None,
                )?);
            }
        }
        let all = join_rows(&outs.iter().collect::<Vec<_>>())?;
        let mut base = 0;
        groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                if group.is_none() {
                    return Ok(None);
                }
                let w = plan.widths[g];
                let picks = Array::from_slice(&out_of[base as usize..(base + w) as usize], &[w]);
                base += w;
                Ok(Some(all.take_axis(&picks, 0)?))
            })
            .collect()
    }

    /// One decode token per row, attended in a single call over the caches padded with
    /// masked zeros to the longest (the non-invariant reference layout).
    fn padded_decode(
        &self,
        rows: Vec<(Array, Array, Array)>,
        caches: &mut [&mut KvCache],
        scale: f32,
    ) -> Result<Vec<Array>> {
        let count = rows.len() as i32;
        let lens: Vec<i32> = caches.iter().map(|c| c.len() + 1).collect();
        let longest = lens.iter().copied().max().unwrap_or(1);
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for ((q, k, v), cache) in rows.into_iter().zip(caches.iter_mut()) {
            let (k, v) = cache.append(k, v)?;
            let pad = [(0, 0), (0, 0), (0, longest - cache.len()), (0, 0)];
            ks.push(ops::pad(&k, &pad, None, None)?);
            vs.push(ops::pad(&v, &pad, None, None)?);
            qs.push(q);
        }
        let mask: Vec<f32> = lens
            .iter()
            .flat_map(|&len| {
                (0..longest).map(move |t| if t < len { 0.0 } else { f32::NEG_INFINITY })
            })
            .collect();
        let q = ops::concatenate(&qs, 0)?;
        let mask = Array::from_slice(&mask, &[count, 1, 1, longest]).as_dtype(q.dtype())?;
        let out = fast::scaled_dot_product_attention(
            q,
            ops::concatenate(&ks, 0)?,
            ops::concatenate(&vs, 0)?,
            scale,
            ScaledDotProductAttentionMask::Array(&mask),
            None,
        )?;
        Ok((0..count).map(|i| out.index(i..i + 1)).collect())
    }
}

/// What a step's pooled decode attention carries from layer to layer.
struct DecodeKv<'a> {
    pool: &'a mut KvPool,
    /// The calls' masks, built once: every layer holds the same lengths.
    masks: Masks,
    layer: usize,
}

/// Arrays joined on the first axis (one is returned as it is).
fn join_rows(parts: &[&Array]) -> Result<Array> {
    Ok(match parts {
        [one] => (*one).clone(),
        _ => ops::concatenate(parts, 0)?,
    })
}

/// The masks of a step's batched decode-attention calls.
#[derive(Default)]
struct Masks(HashMap<(i32, Vec<i32>), Array>);

impl Masks {
    /// `[rows, 1, 1, capacity]`: 0 before each row's length, -inf after.
    fn get(&mut self, capacity: i32, lens: Vec<i32>, dtype: Dtype) -> Result<&Array> {
        let rows = lens.len() as i32;
        match self.0.entry((capacity, lens)) {
            Entry::Occupied(mask) => Ok(mask.into_mut()),
            Entry::Vacant(slot) => {
                let values: Vec<f32> = slot
                    .key()
                    .1
                    .iter()
                    .flat_map(|&len| {
                        (0..capacity).map(move |t| if t < len { 0.0 } else { f32::NEG_INFINITY })
                    })
                    .collect();
                let mask = Array::from_slice(&values, &[rows, 1, 1, capacity]).as_dtype(dtype)?;
                Ok(slot.insert(mask))
            }
        }
    }
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate_proj.forward(x)?;
        let activated = gate.multiply(ops::sigmoid(&gate)?)?;
        self.down_proj
            .forward(&activated.multiply(self.up_proj.forward(x)?)?)
    }
}

struct Block {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// Which positions the output head runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only each row's last position (generation).
    Last,
    /// Every position (evaluation).
    All,
}

/// A loaded decoder-only transformer.
pub struct Transformer {
    pub config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    dtype: Dtype,
}

impl Transformer {
    /// Build from Hugging Face–named weights (`model.layers.N.self_attn.q_proj.weight`, ...).
    pub fn load(
        config: ModelConfig,
        variant: Variant,
        rope: Rope,
        weights: &mut WeightMap,
        dtype: Dtype,
    ) -> Result<Self> {
        let c = &config;
        let (d, eps) = (c.hidden_size, c.rms_norm_eps);
        let embed_tokens = weights.embedding("model.embed_tokens", c.vocab_size, d)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Block {
                    input_layernorm: RmsNorm::load(
                        weights,
                        &format!("{p}.input_layernorm.weight"),
                        d,
                        eps,
                    )?,
                    self_attn: Attention::load(weights, &format!("{p}.self_attn"), c, variant)?,
                    post_attention_layernorm: RmsNorm::load(
                        weights,
                        &format!("{p}.post_attention_layernorm.weight"),
                        d,
                        eps,
                    )?,
                    mlp: Mlp {
                        gate_proj: weights.linear(
                            &format!("{p}.mlp.gate_proj"),
                            d,
                            c.intermediate_size,
                            false,
                        )?,
                        up_proj: weights.linear(
                            &format!("{p}.mlp.up_proj"),
                            d,
                            c.intermediate_size,
                            false,
                        )?,
                        down_proj: weights.linear(
                            &format!("{p}.mlp.down_proj"),
                            c.intermediate_size,
                            d,
                            false,
                        )?,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(weights, "model.norm.weight", d, eps)?;
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
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            dtype,
        })
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether the projections hold quantized or dense weights (the layout depends on it).
    pub fn weight_kind(&self) -> WeightKind {
        match self.layers.first().map(|b| &b.self_attn.q_proj.weight) {
            Some(Matrix::Quantized(_)) => WeightKind::Quantized,
            _ => WeightKind::Dense,
        }
    }

    /// Run one step over several sequences laid out by `plan`: `tokens` holds each row's
    /// new tokens end to end (`plan.slots[i].len` of them for row `i`), `caches[i]` is row
    /// `i`'s per-layer cache, and `pool` holds decoding rows' KV where the layout pools it
    /// (rows leave it with [`KvPool::release`]). Returns float32 logits: `[1, rows, V]` for
    /// each row's last position, or `[1, N, V]` for every position.
    pub fn forward(
        &self,
        tokens: &[u32],
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        pool: &mut KvPool,
        logits: Logits,
    ) -> Result<Array> {
        // Each group's token ids; padding rows embed token 0 (their outputs are unused).
        let mut ids: Vec<Vec<i32>> = plan.widths.iter().map(|&w| vec![0; w as usize]).collect();
        let mut start = 0;
        for slot in &plan.slots {
            let at = slot.offset as usize;
            for (k, &t) in tokens[start..start + slot.len as usize].iter().enumerate() {
                ids[slot.group][at + k] = t as i32;
            }
            start += slot.len as usize;
        }
        let mut h = ids
            .iter()
            .map(|ids| {
                let input = Array::from_slice(ids, &[1, ids.len() as i32]);
                self.embed_tokens.forward(&input, self.dtype)
            })
            .collect::<Result<Vec<_>>>()?;
        if plan.attention == AttentionLayout::Capacity {
            for (g, _) in plan.widths.iter().enumerate() {
                if plan.is_decode_group(g) {
                    for i in plan.rows_of(g) {
                        pool.place(caches[i])?;
                    }
                }
            }
        }
        let mut decode_kv = DecodeKv {
            pool,
            masks: Masks::default(),
            layer: 0,
        };
        for (layer, block) in self.layers.iter().enumerate() {
            decode_kv.layer = layer;
            let mut layer_caches: Vec<&mut KvCache> =
                caches.iter_mut().map(|c| &mut c[layer]).collect();
            let normed = h
                .iter()
                .map(|x| block.input_layernorm.forward(x))
                .collect::<Result<Vec<_>>>()?;
            let attended = block.self_attn.forward(
                &normed,
                plan,
                &mut layer_caches,
                &mut decode_kv,
                &self.rope,
            )?;
            for (x, r) in h.iter_mut().zip(attended) {
                let x1 = x.add(r)?;
                let r = block
                    .mlp
                    .forward(&block.post_attention_layernorm.forward(&x1)?)?;
                *x = x1.add(r)?;
            }
        }
        let positions = |slot: &Slot, from: i32| {
            h[slot.group].index((.., slot.offset + from..slot.offset + slot.len, ..))
        };
        let head = |x: &Array| self.lm_head.forward(&self.norm.forward(x)?);
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
        Ok(out.as_dtype(Dtype::Float32)?)
    }

    /// Fresh per-layer caches for one sequence.
    pub fn new_caches(&self) -> Vec<KvCache> {
        (0..self.layers.len()).map(|_| KvCache::default()).collect()
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
        }
    }
}

//! The decoder-only transformer every supported architecture is an instance of:
//! embeddings, pre-norm attention + SwiGLU blocks, final norm, output head. Architectures
//! differ only in the switches of [`Variant`], set by their own files.

use mlx_rs::{
    fast::{self, ScaledDotProductAttentionMask},
    ops::{self, indexing::IndexOp},
    Array, Dtype,
};

use crate::{
    config::ModelConfig,
    error::Result,
    kv_cache::KvCache,
    weights::{Embedding, Linear, WeightMap},
};

/// What one architecture changes in the shared block.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// Biases on the q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms on each head's queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
}

/// How attention runs over the rows of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionLayout {
    /// Each row against its own unpadded cache: a row's numbers never depend on its
    /// neighbours (batch-invariant).
    #[default]
    PerRow,
    /// Decode steps stack every row's cache, zero-padded to the longest, into one masked
    /// attention call: the usual batched layout, whose reductions depend on the batch.
    Padded,
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

    /// Attention for a step holding several sequences: `x` is `[1, N, D]` with the rows'
    /// tokens laid end to end (`lens`). Projections run on all rows at once; attention runs
    /// per row against that row's own cache, so a row never sees its neighbours' padding
    /// (unless `layout` asks for the padded decode path).
    fn forward(
        &self,
        x: &Array,
        lens: &[i32],
        caches: &mut [&mut KvCache],
        rope: &Rope,
        layout: AttentionLayout,
    ) -> Result<Array> {
        let q_all = self.q_proj.forward(x)?;
        let k_all = self.k_proj.forward(x)?;
        let v_all = self.v_proj.forward(x)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        if layout == AttentionLayout::Padded && lens.len() > 1 && lens.iter().all(|&l| l == 1) {
            let out = self.padded_decode(&q_all, &k_all, &v_all, caches, rope, scale)?;
            return self.o_proj.forward(&out);
        }
        let mut outs = Vec::with_capacity(lens.len());
        let mut start = 0;
        for (&len, cache) in lens.iter().zip(caches.iter_mut()) {
            let rows = |a: &Array| a.index((.., start..start + len, ..));
            let q = self.split_heads(rows(&q_all), self.heads, &self.q_norm)?;
            let k = self.split_heads(rows(&k_all), self.kv_heads, &self.k_norm)?;
            let v = self.split_heads(rows(&v_all), self.kv_heads, &None)?;
            let offset = cache.len();
            let q = rope.apply(&q, offset)?;
            let k = rope.apply(&k, offset)?;
            let (k, v) = cache.append(k, v)?;
            let mask = (len > 1).then_some(ScaledDotProductAttentionMask::Causal);
            let out = fast::scaled_dot_product_attention(q, k, v, scale, mask, None)?;
            outs.push(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[
                1,
                len,
                self.heads * self.head_dim,
            ])?);
            start += len;
        }
        let out = if outs.len() == 1 {
            outs.pop().expect("one row")
        } else {
            ops::concatenate(&outs, 1)?
        };
        self.o_proj.forward(&out)
    }

    /// One decode token per row, attended in a single call over `[B, H, T_max, hd]` caches
    /// padded with masked zeros. Returns `[1, B, H*hd]`.
    fn padded_decode(
        &self,
        q_all: &Array,
        k_all: &Array,
        v_all: &Array,
        caches: &mut [&mut KvCache],
        rope: &Rope,
        scale: f32,
    ) -> Result<Array> {
        let rows = caches.len() as i32;
        let lens: Vec<i32> = caches.iter().map(|c| c.len() + 1).collect();
        let longest = lens.iter().copied().max().unwrap_or(1);
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, cache) in caches.iter_mut().enumerate() {
            let row = |a: &Array| a.index((.., i as i32..i as i32 + 1, ..));
            let offset = cache.len();
            let q = rope.apply(
                &self.split_heads(row(q_all), self.heads, &self.q_norm)?,
                offset,
            )?;
            let k = rope.apply(
                &self.split_heads(row(k_all), self.kv_heads, &self.k_norm)?,
                offset,
            )?;
            let v = self.split_heads(row(v_all), self.kv_heads, &None)?;
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
        let mask = Array::from_slice(&mask, &[rows, 1, 1, longest]).as_dtype(q.dtype())?;
        let out = fast::scaled_dot_product_attention(
            q,
            ops::concatenate(&ks, 0)?,
            ops::concatenate(&vs, 0)?,
            scale,
            ScaledDotProductAttentionMask::Array(&mask),
            None,
        )?;
        Ok(out
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[1, rows, self.heads * self.head_dim])?)
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

    /// Run one step over several sequences: `tokens` holds each row's new tokens end to end
    /// (`lens[i]` of them for row `i`), `caches[i]` is row `i`'s per-layer cache. Returns
    /// float32 logits: `[1, rows, V]` for each row's last position, or `[1, N, V]` for all.
    pub fn forward(
        &self,
        tokens: &[u32],
        lens: &[i32],
        caches: &mut [&mut [KvCache]],
        logits: Logits,
        layout: AttentionLayout,
    ) -> Result<Array> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
        let mut h = self.embed_tokens.forward(&input, self.dtype)?;
        for (layer, block) in self.layers.iter().enumerate() {
            let mut layer_caches: Vec<&mut KvCache> =
                caches.iter_mut().map(|c| &mut c[layer]).collect();
            let r = block.self_attn.forward(
                &block.input_layernorm.forward(&h)?,
                lens,
                &mut layer_caches,
                &self.rope,
                layout,
            )?;
            h = h.add(r)?;
            let r = block
                .mlp
                .forward(&block.post_attention_layernorm.forward(&h)?)?;
            h = h.add(r)?;
        }
        if logits == Logits::Last {
            h = last_positions(&h, lens)?;
        }
        let out = self.lm_head.forward(&self.norm.forward(&h)?)?;
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

/// `[1, rows, D]`: the hidden state at the end of each row of a `[1, N, D]` step.
fn last_positions(hidden: &Array, lens: &[i32]) -> Result<Array> {
    let mut end = 0;
    let ends: Vec<i32> = lens
        .iter()
        .map(|len| {
            end += len;
            end - 1
        })
        .collect();
    let ends = Array::from_slice(&ends, &[ends.len() as i32]);
    Ok(hidden.take_axis(&ends, 1)?)
}

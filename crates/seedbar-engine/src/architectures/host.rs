//! A layer's row-wise math on host floats, for models whose every matmul runs on the CPU
//! kernels (`seedbar_kernels`): RMS norms, residual sums, the MLP's gated activation,
//! soft-caps, RoPE, and each row's queries attending over its own host KV (through
//! `seedbar_kernels::attention`); and the decoder's layers run on them
//! (`Transformer::forward_on_host`, the packed CPU path). Between two
//! kernel calls the activations are already in host memory, so doing this here instead of
//! in MLX saves a hand-off to MLX's stream thread per matmul input (each one two thread
//! wake-ups, which the profile found to be most of a CPU decode step).
//!
//! Every function works row by row, each row from its own values in a fixed order, so a
//! row's bits do not depend on the other rows of the step (the CPU kernels' property too).

use mlx_rs::{Array, Dtype};
use seedbar_kernels::{Kv, QueryAttention, Team};

use super::{
    activation::Activation,
    decoder::{section_axis, Attention, FeedForward, Mlp, RmsNorm, Rope, Transformer},
};
use crate::{
    error::Result,
    step::{
        kv_cache::{HostKv, KvCache},
        plan::StepPlan,
        Logits, StepTokens,
    },
};

/// A row's query positions one attention job holds: the job reads the row's KV once per
/// panel of query heads (more queries per job read less, fewer spread over more threads).
const QUERY_BLOCK: usize = 64;

/// `x / rms(x) * weight` for each row of `weight.len()` features (MLX's `rms_norm`:
/// `x * rsqrt(mean(x²) + eps) * w`, the mean accumulated in float32 in column order).
pub(super) fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(weight.len()) {
        // Plain multiply and add: `mul_add` is a libm call where the build does not
        // target FMA, and the order, not fusion, is what keeps rows independent.
        let squares = row.iter().fold(0.0f32, |acc, v| acc + v * v);
        let scale = 1.0 / (squares / weight.len() as f32 + eps).sqrt();
        out.extend(row.iter().zip(weight).map(|(v, w)| v * scale * w));
    }
    out
}

/// `x += r`, elementwise.
pub(super) fn add_into(x: &mut [f32], r: &[f32]) {
    for (x, r) in x.iter_mut().zip(r) {
        *x += r;
    }
}

/// The MLP's gated activation: `act(gate) * up` for each row of `gate_up`, which holds the
/// row's `inner` gate features followed by its `inner` up features.
pub(super) fn gated(activation: Activation, gate_up: &[f32], inner: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks_exact(2 * inner) {
        let (gate, up) = row.split_at(inner);
        out.extend(gate.iter().zip(up).map(|(&g, &u)| act(activation, g) * u));
    }
    out
}

fn act(activation: Activation, g: f32) -> f32 {
    match activation {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => {
            let inner = (2.0 / std::f32::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            0.5 * g * (1.0 + inner.tanh())
        }
    }
}

/// `cap * tanh(x / cap)` in place.
pub(super) fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// Rotary embedding of `x` (rows of `heads` heads of `head_dim` features, row `i` at the
/// (time, row, column) position `positions[i]`) in place, as MLX's `fast::rope`: the first
/// `dims` features rotate in pairs (`(j, j + dims/2)`, or `(2j, 2j + 1)` when
/// `traditional`) by `position · scale · inv_freqs[j]`, pair `j` by the position of its
/// section's axis (all the same for a text token).
pub(super) struct Rotary<'a> {
    pub dims: usize,
    pub traditional: bool,
    pub scale: f32,
    pub inv_freqs: &'a [f32],
    /// Per-feature factors applied before rotating (long-rope), if any.
    pub input_scale: Option<&'a [f32]>,
    /// Multimodal RoPE's sections ([`Rope::sections`]).
    pub sections: Option<[usize; 3]>,
}

impl Rotary<'_> {
    /// `x` holds `heads` heads of `head_dim` features per position.
    pub(super) fn apply(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        positions: &[[i32; 3]],
    ) {
        let half = self.dims / 2;
        for (n, head) in x.chunks_exact_mut(head_dim).enumerate() {
            if let Some(s) = self.input_scale {
                for (v, s) in head.iter_mut().zip(s) {
                    *v *= s;
                }
            }
            let position = positions[n / heads];
            for j in 0..half {
                let position = position[section_axis(self.sections, j)] as f32;
                let (sin, cos) = (position * self.scale * self.inv_freqs[j]).sin_cos();
                let (a, b) = if self.traditional {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, j + half)
                };
                let (x1, x2) = (head[a], head[b]);
                head[a] = x1 * cos - x2 * sin;
                head[b] = x1 * sin + x2 * cos;
            }
        }
    }
}

/// Rows `rows` (each of `width` floats) of `x`, end to end.
pub(super) fn gather_rows(
    x: &[f32],
    width: usize,
    rows: impl IntoIterator<Item = usize>,
) -> Vec<f32> {
    rows.into_iter()
        .flat_map(|r| &x[r * width..(r + 1) * width])
        .copied()
        .collect()
}

/// `x` (`m` rows of `Σ widths` floats) cut by columns into one `[m, widths[i]]` matrix per
/// part (the stacked projections' outputs, back to q, k and v).
pub(super) fn split_columns<const N: usize>(
    x: &[f32],
    m: usize,
    widths: [usize; N],
) -> [Vec<f32>; N] {
    let total: usize = widths.iter().sum();
    let mut parts = widths.map(|w| Vec::with_capacity(m * w));
    for row in x.chunks_exact(total) {
        let mut start = 0;
        for (part, w) in parts.iter_mut().zip(widths) {
            part.extend_from_slice(&row[start..start + w]);
            start += w;
        }
    }
    parts
}

// ---- the decoder's math on host floats (the packed CPU path) ---------------------------

impl Rope {
    /// Each rotated pair's inverse frequency, as host floats (`host::Rotary`'s).
    pub(super) fn host_inv_freqs(&self) -> Result<Vec<f32>> {
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
}

impl RmsNorm {
    /// `forward` of host rows (a float32 model's weight, evaluated at
    /// load).
    pub(super) fn forward_host(&self, x: &[f32]) -> Result<Vec<f32>> {
        Ok(rms_norm(x, self.weight.try_as_slice::<f32>()?, self.eps))
    }
}

impl Attention {
    /// `step::attention::attend_groups` on the packed CPU path, from each group's
    /// projected rows in host memory (`qkv[g]`: `[W, q | k | v]`): keys and values go to
    /// the rows' host KV, and each query position, decoding or prefilling, attends over its
    /// row's KV on the host (`QueryAttention`). Returns each group's `[W, H·hd]`
    /// output, zero rows where padded.
    pub(super) fn attend_on_host(
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
        let attention = QueryAttention {
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
            (Some(rope), Some(inv_freqs)) => Some(Rotary {
                dims: rope.dims as usize,
                traditional: rope.traditional,
                scale: rope.scale,
                inv_freqs,
                input_scale: input_scale
                    .as_ref()
                    .map(|s| s.try_as_slice::<f32>())
                    .transpose()?,
                sections: rope.sections,
            }),
            _ => None,
        };
        // First the rows' queries, and their keys and values into their caches; then every
        // query position of every row attends on its own, in parallel.
        let mut queries = Vec::with_capacity(plan.slots.len());
        for (i, slot) in plan.slots.iter().enumerate() {
            let (at, len) = (slot.offset as usize, slot.len as usize);
            let rows = &qkv[slot.group][at * (qw + 2 * kw)..(at + len) * (qw + 2 * kw)];
            let [mut q, mut k, v] = split_columns(rows, len, [qw, kw, kw]);
            if let Some(n) = &self.q_norm {
                q = n.forward_host(&q)?;
            }
            if let Some(n) = &self.k_norm {
                k = n.forward_host(&k)?;
            }
            let first = caches[i].len() as usize;
            if let Some(rotary) = &rotary {
                let positions: Vec<[i32; 3]> = (first..first + len)
                    .map(|s| plan.rope_position(i, s))
                    .collect();
                rotary.apply(&mut q, heads, hd, &positions);
                rotary.apply(&mut k, kv_heads, hd, &positions);
            }
            caches[i].append_host(&k, &v, kv_heads, hd)?;
            queries.push((q, first));
        }
        let held: Vec<(&HostKv, usize)> = caches
            .iter()
            .map(|c| (c.host().expect("appended above"), c.first() as usize))
            .collect();
        // Jobs: each row's query positions in blocks (a block reads the row's KV once), per
        // KV head (each writes its own query heads).
        let jobs: Vec<(usize, usize, usize, usize)> = plan
            .slots
            .iter()
            .enumerate()
            .flat_map(|(i, slot)| {
                let len = slot.len as usize;
                (0..len).step_by(QUERY_BLOCK).flat_map(move |n| {
                    (0..kv_heads).map(move |g| (i, n, (n + QUERY_BLOCK).min(len), g))
                })
            })
            .collect();
        let window = self.positions.window.map(|w| w as usize);
        let attended: Vec<Vec<f32>> = Team::shared().map(jobs.len(), |job| {
            let (i, from, to, g) = jobs[job];
            let (q, first) = &queries[i];
            let (kv, kept) = held[i];
            // The query at position `p` sees keys `(p - window, p]`; the store's `t`-th
            // position is position `kept + t`.
            let ranges: Vec<(usize, usize)> = (from..to)
                .map(|n| {
                    let end = first + n + 1;
                    let start = window.map_or(0, |w| end.saturating_sub(w));
                    (start - kept, end - kept)
                })
                .collect();
            let kv = Kv {
                keys: &kv.keys,
                values: &kv.values,
            };
            attention.attend(&q[from * qw..to * qw], kv, &ranges, g)
        });
        let mut outs: Vec<Vec<f32>> = plan
            .widths
            .iter()
            .map(|&w| vec![0.0; w as usize * qw])
            .collect();
        // Each job's outputs: per query, KV head g's query heads, `group` floats.
        let group = qw / kv_heads;
        for (&(i, from, _, g), out) in jobs.iter().zip(attended) {
            let slot = &plan.slots[i];
            for (n, heads) in out.chunks_exact(group).enumerate() {
                let at = (slot.offset as usize + from + n) * qw + g * group;
                outs[slot.group][at..at + group].copy_from_slice(heads);
            }
        }
        Ok(outs)
    }
}

/// `x += norm(r)` where the variant normalizes a sublayer's output, else `x += r`: the
/// host path's `residual` (float32 only, so no float16 clipping).
fn host_residual(x: &mut [f32], r: Vec<f32>, norm: &Option<RmsNorm>) -> Result<()> {
    let r = match norm {
        Some(n) => n.forward_host(&r)?,
        None => r,
    };
    add_into(x, &r);
    Ok(())
}

impl Mlp {
    /// `forward` of `m` rows of host floats (packed weights only).
    pub(super) fn forward_host(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let gate_up = self.gate_up.forward_host(x, m)?;
        let activated = gated(self.activation, &gate_up, self.inner as usize);
        self.down_proj.forward_host(&activated, m)
    }
}

impl Transformer {
    /// `Transformer::forward` for a model whose every matmul runs on the CPU kernels
    /// (with per-row attention): the residual stream stays in host memory, where the kernels
    /// read and write it, and each layer's row-wise math, RoPE and a decoding row's attention
    /// over its host KV run there too, for prefill chunks and decoding rows
    /// alike. No MLX op runs; the MLX path hands over to MLX's stream thread once per
    /// matmul input and runs many small ops per row.
    pub(super) fn forward_on_host(
        &self,
        tokens: StepTokens,
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        logits: Logits<'_>,
    ) -> Result<Array> {
        let d = self.config.hidden_size as usize;
        let embedded = self.embed(tokens, plan)?;
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
        for (i, slot) in plan.slots.iter().enumerate() {
            let from = logits.first(i, slot.len);
            let rows = (slot.offset + from..slot.offset + slot.len).map(|r| r as usize);
            picked.extend(gather_rows(&h[slot.group], d, rows));
        }
        let n = picked.len() / d;
        let normed = self.norm.forward_host(&picked)?;
        let mut out = self.lm_head.forward_host(&normed, n)?;
        if let Some(cap) = self.logit_softcap {
            softcap(&mut out, cap);
        }
        Ok(Array::from_slice(
            &out,
            &[1, n as i32, self.config.vocab_size],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalizes_each_row_on_its_own() {
        let x = [3.0, 4.0, 1.0, 1.0];
        let out = rms_norm(&x, &[1.0, 2.0], 0.0);
        let rms = 12.5f32.sqrt();
        assert_eq!(&out[..2], &[3.0 * (1.0 / rms), 4.0 * (1.0 / rms) * 2.0]);
        assert_eq!(&out[2..], &[1.0, 2.0]);
        assert_eq!(rms_norm(&x[2..], &[1.0, 2.0], 0.0), &out[2..]);
    }

    #[test]
    fn gated_activations_match_their_formulas() {
        let out = gated(Activation::Silu, &[0.0, 2.0, 5.0, 3.0], 2);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 / (1.0 + (-2.0f32).exp()) * 3.0).abs() < 1e-6);
        let gelu = gated(Activation::GeluTanh, &[1.0, 1.0], 1)[0];
        assert!((gelu - 0.841_192).abs() < 1e-5);
    }

    #[test]
    fn columns_split_back_into_their_parts() {
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let [a, b] = split_columns(&x, 2, [4, 2]);
        assert_eq!(a, [0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0]);
        assert_eq!(b, [4.0, 5.0, 10.0, 11.0]);
        assert_eq!(gather_rows(&x, 3, [3, 1]), [9.0, 10.0, 11.0, 3.0, 4.0, 5.0]);
    }
}

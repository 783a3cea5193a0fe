//! A layer's row-wise math on host floats, for models whose every matmul runs on the CPU
//! kernels (`seedbar_qmatmul`): RMS norms, residual sums, the MLP's gated activation,
//! soft-caps, RoPE, and a decoding row's attention over its own host KV. Between two kernel calls the activations are already in host memory, so doing
//! this here instead of in MLX saves a hand-off to MLX's stream thread per matmul input
//! (each one two thread wake-ups, which the profile found to be most of a CPU decode step).
//!
//! Every function works row by row, each row from its own values in a fixed order, so a
//! row's bits do not depend on the other rows of the step (the CPU kernels' property too).

use super::activation::Activation;
use crate::step::kv_cache::HostKv;

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

/// Rotary embedding of `x` (`positions` rows of `heads` heads of `head_dim` features, row
/// `i` at position `first + i`) in place, as MLX's `fast::rope`: the first `dims` features
/// rotate in pairs (`(j, j + dims/2)`, or `(2j, 2j + 1)` when `traditional`) by
/// `position · scale · inv_freqs[j]`.
pub(super) struct Rotary<'a> {
    pub dims: usize,
    pub traditional: bool,
    pub scale: f32,
    pub inv_freqs: &'a [f32],
    /// Per-feature factors applied before rotating (long-rope), if any.
    pub input_scale: Option<&'a [f32]>,
}

impl Rotary<'_> {
    /// `x` holds `heads` heads of `head_dim` features per position.
    pub(super) fn apply(&self, x: &mut [f32], heads: usize, head_dim: usize, first: usize) {
        let half = self.dims / 2;
        for (n, head) in x.chunks_exact_mut(head_dim).enumerate() {
            if let Some(s) = self.input_scale {
                for (v, s) in head.iter_mut().zip(s) {
                    *v *= s;
                }
            }
            let position = (first + n / heads) as f32;
            for j in 0..half {
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

/// One query position's attention (`q`: `heads` heads of `head_dim`, rotated) over the
/// keys and values of positions `start..len` of `kv` (each head reads its group's KV
/// head): `softmax(scale · q·k [soft-capped]) · v`, per head, in position order. A prefill
/// chunk's queries and a decoding row's run the same computation.
pub(super) struct QueryAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl QueryAttention {
    pub(super) fn attend(&self, q: &[f32], kv: &HostKv, start: usize, len: usize) -> Vec<f32> {
        let (hd, repeats) = (self.head_dim, self.heads / self.kv_heads);
        let mut out = vec![0.0f32; self.heads * hd];
        let mut scores = vec![0.0f32; len - start];
        for h in 0..self.heads {
            let at = (h / repeats) * hd;
            let q = &q[h * hd..(h + 1) * hd];
            for (score, t) in scores.iter_mut().zip(start..len) {
                let s = dot(q, &kv.keys[t * kv.width() + at..][..hd]) * self.scale;
                *score = match self.softcap {
                    Some(cap) => cap * (s / cap).tanh(),
                    None => s,
                };
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            let o = &mut out[h * hd..(h + 1) * hd];
            for (&p, t) in scores.iter().zip(start..len) {
                let weight = p / total;
                for (o, v) in o.iter_mut().zip(&kv.values[t * kv.width() + at..][..hd]) {
                    *o += weight * v;
                }
            }
        }
        out
    }
}

/// `a · b` in eight interleaved partial sums (a fixed order the compiler vectorizes).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    lanes.iter().sum::<f32>() + tail
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
    fn a_query_attends_over_its_window_as_softmax_says() {
        // Two query heads sharing one KV head of 2 features, 3 positions held.
        let kv = HostKv {
            keys: vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
            values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            kv_heads: 1,
            head_dim: 2,
        };
        let attention = QueryAttention {
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            scale: 0.5,
            softcap: None,
        };
        let q = [2.0, 0.0, 0.0, 4.0];
        let expect = |q: [f64; 2], from: usize| -> Vec<f64> {
            let scores: Vec<f64> = (from..3)
                .map(|t| 0.5 * (q[0] * kv.keys[2 * t] as f64 + q[1] * kv.keys[2 * t + 1] as f64))
                .collect();
            let total: f64 = scores.iter().map(|s| s.exp()).sum();
            (0..2)
                .map(|f| {
                    (from..3)
                        .zip(&scores)
                        .map(|(t, s)| s.exp() / total * kv.values[2 * t + f] as f64)
                        .sum()
                })
                .collect()
        };
        for from in [0, 1] {
            let out = attention.attend(&q, &kv, from, 3);
            let wanted: Vec<f64> = [expect([2.0, 0.0], from), expect([0.0, 4.0], from)].concat();
            for (got, want) in out.iter().zip(&wanted) {
                assert!((*got as f64 - want).abs() < 1e-6, "{out:?} vs {wanted:?}");
            }
        }
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

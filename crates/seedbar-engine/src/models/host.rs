//! A layer's row-wise math on host floats, for models whose every matmul runs on the CPU
//! kernels (`seedbar_qmatmul`): RMS norms, residual sums, the MLP's gated activation and
//! soft-caps. Between two kernel calls the activations are already in host memory, so doing
//! this here instead of in MLX saves a hand-off to MLX's stream thread per matmul input
//! (each one two thread wake-ups, which the profile found to be most of a CPU decode step).
//!
//! Every function works row by row, each row from its own values in a fixed order, so a
//! row's bits do not depend on the other rows of the step (the CPU kernels' property too).

use super::base::Activation;

/// `x / rms(x) * weight` for each row of `weight.len()` features (MLX's `rms_norm`:
/// `x * rsqrt(mean(x²) + eps) * w`, the mean accumulated in float32 in column order).
pub(super) fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(weight.len()) {
        let squares = row.iter().fold(0.0f32, |acc, v| v.mul_add(*v, acc));
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
    fn columns_split_back_into_their_parts() {
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let [a, b] = split_columns(&x, 2, [4, 2]);
        assert_eq!(a, [0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0]);
        assert_eq!(b, [4.0, 5.0, 10.0, 11.0]);
        assert_eq!(gather_rows(&x, 3, [3, 1]), [9.0, 10.0, 11.0, 3.0, 4.0, 5.0]);
    }
}

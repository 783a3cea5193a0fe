//! Drawing a step's tokens on the device that computed its logits (the pipelined
//! scheduler's steps), the same tokens the host's draw picks ([`gumbel_max`]): the biases
//! added, then each row's largest score, the first on ties.
//!
//! On CUDA the draw is one kernel of Seedbar's own (`device_draw.cu`, its noise in
//! `device_draw.cuh`) that computes each row's keyed noise itself from the row's key, as
//! [`keyed_noise`] defines it operation for operation, so the host neither computes a
//! vocabulary of noise per row nor sends it (at 32 rows of a 128k vocabulary, 4 million
//! noise values and 16 MB a step); it checks itself against the host's draw once before its
//! first use, and a GPU where it disagrees draws the other way. Elsewhere the caller
//! computes the noise ([`fill_noise`](super::fill_noise)) and MLX's multiply, add and argmax
//! draw with it: [`noise_drawn_on_device`] tells the caller which.
//!
//! [`gumbel_max`]: super::sample_with_noise

use std::sync::OnceLock;

use mlx_rs::{
    ops::indexing::{argmax_axis, scatter_single},
    Array, Dtype,
};

use super::{keyed_noise, SamplingParams};
use crate::{
    cuda_kernel::{self, KernelSource, Launch},
    error::Result,
    runtime::Backend,
};

/// One row's draw on the device ([`draw_on_device`]): its sampling (biases and
/// temperature; [`SamplingParams::draws_on_device`] holds), the position it draws at, and
/// its noise where the caller computes it ([`noise_drawn_on_device`] is false; empty when
/// greedy).
pub struct DeviceDraw<'a> {
    pub params: &'a SamplingParams,
    pub position: u64,
    pub noise: &'a [f32],
}

/// Whether [`draw_on_device`] computes the rows' noise itself (the CUDA kernel runs here),
/// so callers pass none.
pub fn noise_drawn_on_device() -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    Backend::current() == Backend::Cuda
        && *CHECKED.get_or_init(|| cuda_kernel::passes("the keyed draw kernel", check))
}

/// Each row's token from `logits` (`[rows, V]` float32, lazy), on the device that computes
/// them: the biases added, then [`gumbel_max`](super::sample_with_noise)'s score and argmax,
/// by the keyed kernel or op by op (a multiply, an add, an argmax; never fused, so never
/// contracted into one rounding). The same tokens the host picks from the same logits.
/// Returns `[rows]` uint32, lazy.
pub fn draw_on_device(logits: &Array, rows: &[DeviceDraw]) -> Result<Array> {
    let scores = biased(logits, rows)?;
    if noise_drawn_on_device() {
        return keyed_draw(&scores, rows);
    }
    draw_with_noise(scores, rows)
}

/// `logits` with each row's biases added (`l + bias`, written back: a row's entries are
/// distinct).
fn biased(logits: &Array, rows: &[DeviceDraw]) -> Result<Array> {
    let vocab = logits.shape()[1];
    let (mut at, mut bias) = (Vec::new(), Vec::new());
    for (r, row) in rows.iter().enumerate() {
        for &(token, b) in &row.params.logit_bias {
            at.push(r as i32 * vocab + token as i32);
            bias.push(b);
        }
    }
    if at.is_empty() {
        return Ok(logits.clone());
    }
    let at = Array::from_slice(&at, &[at.len() as i32]);
    let flat = logits.reshape(&[-1])?;
    let biased = flat
        .take_axis(&at, 0)?
        .add(Array::from_slice(&bias, &[bias.len() as i32]))?;
    let n = bias.len() as i32;
    Ok(scatter_single(&flat, &at, biased.reshape(&[n, 1])?, 0)?.reshape(&[-1, vocab])?)
}

/// The draw with the caller's noise: `scores · (1/T) + noise`, then each row's argmax.
fn draw_with_noise(mut scores: Array, rows: &[DeviceDraw]) -> Result<Array> {
    let vocab = scores.shape()[1];
    if rows.iter().any(|r| r.params.temperature > 0.0) {
        // A greedy row's score is its logit: times 1, plus 0, exactly.
        let inv_t: Vec<f32> = rows
            .iter()
            .map(|r| match r.params.temperature {
                0.0 => 1.0,
                _ => r.params.inverse_temperature(),
            })
            .collect();
        let mut noise = Vec::with_capacity(rows.len() * vocab as usize);
        for row in rows {
            match row.params.temperature {
                0.0 => noise.resize(noise.len() + vocab as usize, 0.0),
                _ => noise.extend_from_slice(row.noise),
            }
        }
        let inv_t = Array::from_slice(&inv_t, &[rows.len() as i32, 1]);
        let noise = Array::from_slice(&noise, &[rows.len() as i32, vocab]);
        scores = scores.multiply(&inv_t)?.add(&noise)?;
    }
    Ok(argmax_axis(&scores, -1, false)?)
}

const THREADS: i32 = 256;

static KERNEL: KernelSource = KernelSource {
    name: "seedbar_keyed_draw",
    body: include_str!("device_draw.cu"),
    header: include_str!("device_draw.cuh"),
    inputs: &["logits", "rows"],
};

/// The keyed kernel's draw over `scores` (biased logits).
fn keyed_draw(scores: &Array, rows: &[DeviceDraw]) -> Result<Array> {
    let table: Vec<u32> = rows
        .iter()
        .flat_map(|row| {
            let key = keyed_noise::position_key(row.params.seed, row.position);
            let greedy = row.params.temperature == 0.0;
            let inverse_t = if greedy {
                1.0
            } else {
                row.params.inverse_temperature()
            };
            [
                key as u32,
                (key >> 32) as u32,
                inverse_t.to_bits(),
                u32::from(greedy),
            ]
        })
        .collect();
    let count = rows.len() as i32;
    cuda_kernel::launch(
        &KERNEL,
        &[
            &scores.as_dtype(Dtype::Float32)?,
            &Array::from_slice(&table, &[4 * count]),
        ],
        Launch {
            shape: &[count],
            dtype: Dtype::Uint32,
            threads: count * THREADS,
            block: THREADS,
            template: &[],
        },
    )
}

/// The kernel on this GPU draws what the host draws: rows of near-ties, sampled at several
/// temperatures and greedy, one whose scores are all -inf, over a vocabulary the threads do
/// not divide.
fn check() -> Result<bool> {
    let vocab = 5003usize;
    let temperatures = [0.0f32, 0.3, 0.7, 1.0, 1.7, 0.7, 0.0];
    let mut state = 9u64;
    let mut logits = Vec::with_capacity(temperatures.len() * vocab);
    for r in 0..temperatures.len() {
        logits.extend((0..vocab).map(|_| {
            state = keyed_noise::mix(state);
            match r {
                5 => f32::NEG_INFINITY,
                _ => ((state >> 40) as f32 / (1u64 << 24) as f32 * 24.0).round() / 4.0,
            }
        }));
    }
    let params: Vec<SamplingParams> = temperatures
        .iter()
        .enumerate()
        .map(|(r, &temperature)| SamplingParams {
            temperature,
            seed: 1000 + r as u64,
            ..SamplingParams::default()
        })
        .collect();
    let positions: Vec<u64> = (0..params.len() as u64).map(|r| 17 * r + 3).collect();
    let on_host: Vec<u32> = logits
        .chunks(vocab)
        .zip(&params)
        .zip(&positions)
        .map(|((row, p), &position)| super::sample(row, p, position))
        .collect();
    let draws: Vec<DeviceDraw> = params
        .iter()
        .zip(&positions)
        .map(|(params, &position)| DeviceDraw {
            params,
            position,
            noise: &[],
        })
        .collect();
    let all = Array::from_slice(&logits, &[params.len() as i32, vocab as i32]);
    let on_device = keyed_draw(&all, &draws)?;
    on_device.eval()?;
    Ok(on_device.as_slice::<u32>() == on_host)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's noise is `keyed_noise`'s only while the two sources hold the same
    /// constants: the hash's multipliers, the series' coefficients, `ln 2`'s parts, `√2`.
    #[test]
    fn the_kernels_noise_has_the_hosts_constants() {
        let source = KERNEL.header;
        let mut expected: Vec<String> = keyed_noise::ODD_RECIPROCALS
            .iter()
            .chain(&[keyed_noise::LN2_HIGH, keyed_noise::LN2_LOW])
            .chain(&[std::f64::consts::SQRT_2, (1u64 << 53) as f64])
            .map(|c| format!("{c:?}"))
            .collect();
        expected.extend(
            [
                0xbf58_476d_1ce4_e5b9u64,
                0x94d0_49bb_1331_11eb,
                0x9e37_79b9_7f4a_7c15,
            ]
            .map(|m| format!("{m:#x}ull")),
        );
        for constant in expected {
            assert!(
                source.contains(&constant),
                "{constant} is not in the kernel"
            );
        }
        // The series runs from its last coefficient down, as `keyed_noise::ln` runs it.
        assert!(source.contains("double series = odd_reciprocals[10];"));
        assert!(source.contains("for (int k = 9; k >= 0; --k)"));
    }
}

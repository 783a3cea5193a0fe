//! Choosing the next token from a row of logits. Randomness for token position `t` of a
//! request comes only from `(seed, t)` through a counter-based hash (`keyed_noise`): no
//! global RNG, no dependence on other requests, call order or batch shape, and the same
//! draws on every backend.
//!
//! The draw is Gumbel-max: the token whose score `logit · (1/T) + g` is largest (the first
//! on ties), with keyed noise `g` per vocabulary entry, computed in `f64` from correctly
//! rounded operations alone and rounded to `f32`. The score is two correctly rounded `f32`
//! operations, a product and a sum, so the host ([`sample_with_noise`]) and the device
//! ([`draw_on_device`], `device_draw`: CUDA's kernel computing the noise itself, or MLX's
//! multiply, add and argmax over noise the host computed) pick the same token from the
//! same logits, bit for bit. The noise does not depend on the logits, so a caller computes
//! it ([`fill_noise`]) while the device computes the logits.

mod device_draw;
mod keyed_noise;

use serde::{Deserialize, Serialize};

pub use device_draw::{draw_on_device, noise_drawn_on_device, DeviceDraw};
use keyed_noise::gumbel;
pub use keyed_noise::{fill_noise, position_key};

/// A sampling value out of range, naming the parameter (OpenAI's names).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidParam {
    pub param: &'static str,
    pub message: String,
}

/// How one request samples. `temperature == 0` is greedy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep tokens at least `min_p` times as likely as the most likely one (0: off).
    pub min_p: f32,
    pub seed: u64,
    /// Hugging Face–style: logits of tokens already in the context are divided (positive) or
    /// multiplied (negative) by this (1: off).
    pub repetition_penalty: f32,
    /// OpenAI-style: subtracted once from every token already generated.
    pub presence_penalty: f32,
    /// OpenAI-style: subtracted per occurrence in the generated tokens.
    pub frequency_penalty: f32,
    /// Added to the logits of the listed tokens (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// `1/T` as the score multiplies by it.
    fn inverse_temperature(&self) -> f32 {
        1.0 / self.temperature
    }

    /// Whether [`draw_on_device`] draws what the host would: no filter, no penalty (they
    /// read the row's history or sort on the host), and biases on distinct tokens below
    /// `vocab` (each entry is then one addition, as [`adjust`](Self::adjust) makes it).
    pub fn draws_on_device(&self, vocab: usize) -> bool {
        let mut biased: Vec<u32> = self.logit_bias.iter().map(|&(t, _)| t).collect();
        biased.sort_unstable();
        let distinct = biased.windows(2).all(|w| w[0] != w[1]);
        self.top_k == 0
            && self.top_p >= 1.0
            && self.min_p <= 0.0
            && self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && distinct
            && biased.last().is_none_or(|&t| (t as usize) < vocab)
    }

    /// Check every value is in range; the error names the parameter at fault.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        let fail = |param: &'static str, rule: &str, value: f32| {
            Err(InvalidParam {
                param,
                message: format!("{param} must be {rule}, got {value}"),
            })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return fail("temperature", ">= 0", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return fail("top_p", "in (0, 1]", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return fail("min_p", "in [0, 1]", self.min_p);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return fail("repetition_penalty", "> 0", self.repetition_penalty);
        }
        for (param, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return fail(param, "in [-2, 2]", v);
            }
        }
        for &(token, bias) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&bias) {
                return Err(InvalidParam {
                    param: "logit_bias",
                    message: format!(
                        "logit_bias for token {token} must be in [-100, 100], got {bias}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Apply penalties and biases to one row of logits in place. `context` is the prompt,
    /// `generated` the reply so far.
    pub fn adjust(&self, logits: &mut [f32], context: &[u32], generated: &[u32]) {
        if self.repetition_penalty != 1.0 {
            let mut seen: Vec<u32> = context.iter().chain(generated).copied().collect();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / self.repetition_penalty
                    } else {
                        *l * self.repetition_penalty
                    };
                }
            }
        }
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            let mut counts = std::collections::HashMap::<u32, u32>::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= self.presence_penalty + self.frequency_penalty * n as f32;
                }
            }
        }
        for &(t, bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
    }
}

/// Log-probabilities of one row of logits (the model's own distribution).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    logits.iter().map(|&l| (l as f64 - log_z) as f32).collect()
}

/// Index of the largest value (the first one on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// Pick the token at `position` from `logits` (one row, vocabulary-sized).
pub fn sample(logits: &[f32], params: &SamplingParams, position: u64) -> u32 {
    let key = position_key(params.seed, position);
    gumbel_max(logits, params, |i| gumbel(key, i as u64))
}

/// [`sample`] with the row's noise already computed: `noise` is what [`fill_noise`] wrote
/// for the draw's seed and position over the whole vocabulary (unread, and may be empty,
/// when the draw is greedy). The same token as [`sample`] for the same logits.
pub fn sample_with_noise(logits: &[f32], params: &SamplingParams, noise: &[f32]) -> u32 {
    gumbel_max(logits, params, |i| noise[i as usize])
}

/// The draw itself: argmax of `l · (1/T) + noise(i)` over the candidates, the first on ties
/// (argmax of the logits when greedy).
fn gumbel_max(logits: &[f32], params: &SamplingParams, noise: impl Fn(u32) -> f32) -> u32 {
    if params.temperature == 0.0 {
        return argmax(logits);
    }
    let candidates = candidates(logits, params);
    // Gumbel-max: argmax(l/T + G) with G = -ln(-ln U) is a draw from softmax(l/T).
    let inv_t = params.inverse_temperature();
    let mut best = (f32::NEG_INFINITY, candidates[0]);
    for &i in &candidates {
        // Two roundings, in this order, as the device's multiply and add make them.
        let score = logits[i as usize] * inv_t + noise(i);
        if score > best.0 {
            best = (score, i);
        }
    }
    best.1
}

/// The tokens top-k, top-p and min-p leave in play, most likely first when filtered.
/// Only the head that stays is sorted (a vocabulary-wide sort per token cost more than the
/// forward pass of a small model); the order is total (ties by id), so that head is exactly
/// the fully sorted order's.
fn candidates(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let filtering = params.top_k > 0 || params.top_p < 1.0 || params.min_p > 0.0;
    if !filtering {
        return order;
    }
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if params.top_k > 0 && params.top_k < order.len() {
        order.select_nth_unstable_by(params.top_k - 1, by_logit);
        order.truncate(params.top_k);
    }
    let inv_t = 1.0 / params.temperature as f64;
    let top = order
        .iter()
        .map(|&i| logits[i as usize] as f64 * inv_t)
        .fold(f64::NEG_INFINITY, f64::max);
    // Relative to the most likely token's (which weighs 1).
    let weight = |i: u32| (logits[i as usize] as f64 * inv_t - top).exp();
    let mut keep = order.len();
    if params.min_p > 0.0 {
        let floor = params.min_p as f64;
        keep = order.iter().filter(|&&i| weight(i) >= floor).count().max(1);
    }
    if params.top_p < 1.0 {
        let total: f64 = order.iter().map(|&i| weight(i)).sum();
        // Sort ever longer heads until one reaches `top_p` of the mass.
        let mut head = order.len().min(64);
        let nucleus = loop {
            sort_head(&mut order, head, by_logit);
            let mut cumulative = 0.0;
            let reached = order[..head].iter().position(|&i| {
                cumulative += weight(i) / total;
                cumulative >= params.top_p as f64
            });
            match reached {
                Some(n) => break n + 1,
                None if head == order.len() => break head,
                None => head = order.len().min(head * 8),
            }
        };
        keep = keep.min(nucleus);
    }
    sort_head(&mut order, keep, by_logit);
    order.truncate(keep);
    order
}

/// Put the `head` first elements of `order` under `cmp` first, sorted.
fn sort_head(order: &mut [u32], head: usize, cmp: impl Fn(&u32, &u32) -> std::cmp::Ordering) {
    if head < order.len() {
        order.select_nth_unstable_by(head, &cmp);
    }
    order[..head].sort_unstable_by(&cmp);
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;

    use super::*;

    fn params(seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        }
    }

    #[test]
    fn penalties_and_bias_move_the_right_logits() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(3, -100.0)],
            ..Default::default()
        };
        let mut logits = [4.0f32, -4.0, 1.0, 9.0];
        p.adjust(&mut logits, &[0], &[1, 1]);
        assert_eq!(logits, [2.0, -8.0 - 0.5 - 0.5, 1.0, -91.0]);
    }

    #[test]
    fn log_softmax_normalizes() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let total: f32 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_argmax() {
        assert_eq!(sample(&[0.1, 3.0, 2.0], &SamplingParams::default(), 0), 1);
    }

    #[test]
    fn same_seed_and_position_same_token_different_seeds_differ() {
        let logits = vec![0.0f32; 1000];
        let a: Vec<u32> = (0..50).map(|t| sample(&logits, &params(7), t)).collect();
        let b: Vec<u32> = (0..50).map(|t| sample(&logits, &params(7), t)).collect();
        let c: Vec<u32> = (0..50).map(|t| sample(&logits, &params(8), t)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn draws_follow_the_softmax() {
        // p = softmax([ln 1, ln 3]) = [0.25, 0.75]
        let logits = [0.0f32, 3.0f32.ln()];
        let ones = (0..20_000)
            .filter(|t| sample(&logits, &params(1), *t) == 1)
            .count();
        let freq = ones as f64 / 20_000.0;
        assert!((freq - 0.75).abs() < 0.015, "frequency {freq}");
    }

    #[test]
    fn filters_restrict_the_candidates() {
        let logits = [5.0f32, 4.0, 1.0, 0.0, -1.0];
        let top_k = SamplingParams {
            top_k: 2,
            ..params(3)
        };
        let top_p = SamplingParams {
            top_p: 0.5,
            ..params(3)
        };
        let min_p = SamplingParams {
            min_p: 0.3,
            ..params(3)
        };
        for t in 0..500 {
            assert!(sample(&logits, &top_k, t) < 2);
            assert_eq!(sample(&logits, &top_p, t), 0);
            assert!(sample(&logits, &min_p, t) < 2);
        }
    }

    /// The filters over a full sort of the vocabulary, as they were first written.
    fn candidates_by_full_sort(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        order.sort_unstable_by(by_logit);
        if params.top_k > 0 {
            order.truncate(params.top_k);
        }
        let inv_t = 1.0 / params.temperature as f64;
        let top = logits[order[0] as usize] as f64 * inv_t;
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| (logits[i as usize] as f64 * inv_t - top).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = order.len();
        let mut cumulative = 0.0;
        for (n, w) in weights.iter().enumerate() {
            cumulative += w / total;
            if cumulative >= params.top_p as f64 {
                keep = n + 1;
                break;
            }
        }
        let floor = params.min_p as f64;
        keep = keep.min(weights.iter().take_while(|w| **w >= floor).count().max(1));
        order.truncate(keep);
        order
    }

    /// The draw as it was written before the noise could be computed ahead: the reference
    /// the faster paths must match token for token.
    fn sample_computing_noise_inline(
        logits: &[f32],
        params: &SamplingParams,
        position: u64,
    ) -> u32 {
        if params.temperature == 0.0 {
            return argmax(logits);
        }
        let candidates = candidates(logits, params);
        let key = position_key(params.seed, position);
        let inv_t = 1.0 / params.temperature;
        let mut best = (f32::NEG_INFINITY, candidates[0]);
        for &i in &candidates {
            let g = gumbel(key, i as u64);
            let score = logits[i as usize] * inv_t + g;
            if score > best.0 {
                best = (score, i);
            }
        }
        best.1
    }

    /// Mixed 64-bit values from `seed`, one per call: the tests' inputs.
    fn values(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state = keyed_noise::mix(state);
            state
        }
    }

    #[test]
    fn noise_computed_ahead_draws_the_same_tokens() {
        let mut next = values(11);
        let mut noise = Vec::new();
        let mut differ_from_greedy = 0;
        for case in 0..600 {
            let vocab = [2usize, 7, 100, 4096, 49152][case % 5];
            let peak = [0.1f32, 1.0, 6.0][case % 3];
            // Rows with near-ties: values on a coarse grid.
            let logits: Vec<f32> = (0..vocab)
                .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 * 16.0 * peak).round() / 4.0)
                .collect();
            let temperature = [0.0f32, 0.2, 0.7, 1.0, 1.5][(next() % 5) as usize];
            let params = SamplingParams {
                temperature,
                top_p: [1.0f32, 0.95, 0.5][(next() % 3) as usize],
                top_k: [0usize, 1, 40][(next() % 3) as usize],
                min_p: [0.0f32, 0.05][(next() % 2) as usize],
                seed: next(),
                repetition_penalty: [1.0f32, 1.3][(next() % 2) as usize],
                presence_penalty: [0.0f32, 0.5][(next() % 2) as usize],
                frequency_penalty: [0.0f32, -0.4][(next() % 2) as usize],
                logit_bias: vec![((next() % vocab as u64) as u32, 5.0)],
            };
            let position = next() % 10_000;
            let context: Vec<u32> = (0..8).map(|_| (next() % vocab as u64) as u32).collect();
            let generated: Vec<u32> = (0..5).map(|_| (next() % vocab as u64) as u32).collect();
            let mut adjusted = logits.clone();
            params.adjust(&mut adjusted, &context, &generated);
            // The noise in pieces, as the scheduler's threads write it.
            noise.resize(vocab, 0.0);
            let piece = 1 + (next() as usize % vocab);
            for (k, part) in noise.chunks_mut(piece).enumerate() {
                fill_noise(part, params.seed, position, k * piece);
            }
            let expected = sample_computing_noise_inline(&adjusted, &params, position);
            assert_eq!(
                sample(&adjusted, &params, position),
                expected,
                "case {case}"
            );
            assert_eq!(
                sample_with_noise(&adjusted, &params, &noise),
                expected,
                "case {case}"
            );
            differ_from_greedy += usize::from(expected != argmax(&adjusted));
        }
        // The cases draw, not only take the argmax.
        assert!(differ_from_greedy > 50, "{differ_from_greedy}");
    }

    #[test]
    fn the_device_draws_what_the_host_draws() {
        let mut next = values(5);
        let mut differ_from_greedy = 0;
        for case in 0..60 {
            let vocab = [7usize, 100, 4096, 49152][case % 4];
            let rows = 1 + case % 5;
            let mut logits = Vec::with_capacity(rows * vocab);
            let mut params = Vec::new();
            for _ in 0..rows {
                // Near-ties: values on a coarse grid.
                logits.extend(
                    (0..vocab).map(|_| {
                        ((next() >> 40) as f32 / (1u64 << 24) as f32 * 24.0).round() / 4.0
                    }),
                );
                let biased = (next() % vocab as u64) as u32;
                let row = SamplingParams {
                    temperature: [0.0f32, 0.3, 0.7, 1.0, 1.7][(next() % 5) as usize],
                    seed: next(),
                    logit_bias: vec![(biased, 2.5), ((biased + 1) % vocab as u32, -100.0)],
                    ..SamplingParams::default()
                };
                assert!(row.draws_on_device(vocab));
                params.push(row);
            }
            let position = next() % 10_000;
            let noise: Vec<Vec<f32>> = params
                .iter()
                .map(|p| {
                    let mut noise = vec![0.0; vocab];
                    fill_noise(&mut noise, p.seed, position, 0);
                    noise
                })
                .collect();
            let on_host: Vec<u32> = logits
                .chunks(vocab)
                .zip(&params)
                .zip(&noise)
                .map(|((row, p), noise)| {
                    let mut adjusted = row.to_vec();
                    p.adjust(&mut adjusted, &[], &[]);
                    differ_from_greedy +=
                        usize::from(sample_with_noise(&adjusted, p, noise) != argmax(&adjusted));
                    sample_with_noise(&adjusted, p, noise)
                })
                .collect();
            let draws: Vec<DeviceDraw> = params
                .iter()
                .zip(&noise)
                .map(|(params, noise)| DeviceDraw {
                    params,
                    position,
                    noise,
                })
                .collect();
            let all = Array::from_slice(&logits, &[rows as i32, vocab as i32]);
            let on_device = draw_on_device(&all, &draws).unwrap();
            on_device.eval().unwrap();
            assert_eq!(on_device.as_slice::<u32>(), on_host, "case {case}");
        }
        assert!(differ_from_greedy > 20, "{differ_from_greedy}");
    }

    #[test]
    fn filters_and_penalties_stay_on_the_host() {
        let on_device = |p: SamplingParams| p.draws_on_device(100);
        assert!(on_device(SamplingParams::default()));
        assert!(!on_device(SamplingParams {
            top_p: 0.9,
            ..SamplingParams::default()
        }));
        assert!(!on_device(SamplingParams {
            top_k: 40,
            ..SamplingParams::default()
        }));
        assert!(!on_device(SamplingParams {
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        }));
        assert!(!on_device(SamplingParams {
            logit_bias: vec![(3, 1.0), (3, 2.0)],
            ..SamplingParams::default()
        }));
        assert!(!on_device(SamplingParams {
            logit_bias: vec![(100, 1.0)],
            ..SamplingParams::default()
        }));
    }

    #[test]
    fn sorting_only_the_head_keeps_the_full_sorts_candidates() {
        let mut state = 7u64;
        for peak in [0.5f32, 4.0, 12.0] {
            // A peaked, Zipf-like row of 4096 logits with repeated values (ties).
            let logits: Vec<f32> = (0..4096)
                .map(|i| {
                    state = keyed_noise::mix(state);
                    let noise = (state >> 40) as f32 / (1u64 << 24) as f32;
                    -peak * ((i % 1000 + 1) as f32).ln() + (noise * 8.0).round() / 4.0
                })
                .collect();
            for (top_p, top_k, min_p) in [
                (0.9, 0, 0.0),
                (0.5, 40, 0.0),
                (1.0, 0, 0.05),
                (0.95, 0, 0.01),
                (0.999, 3000, 0.0),
            ] {
                let p = SamplingParams {
                    temperature: 0.7,
                    top_p,
                    top_k,
                    min_p,
                    ..Default::default()
                };
                assert_eq!(
                    candidates(&logits, &p),
                    candidates_by_full_sort(&logits, &p),
                    "peak {peak}, top_p {top_p}, top_k {top_k}, min_p {min_p}"
                );
            }
        }
    }
}

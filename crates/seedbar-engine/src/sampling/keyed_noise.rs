//! The draw's randomness: the Gumbel noise of vocabulary entry `i` at token position `t` of
//! a request seeded with `s`, a function of `(s, t, i)` alone through a counter-based hash
//! (SplitMix64's finalizer), so it does not depend on other requests, call order, batch
//! shape or backend.
//!
//! The noise is `-ln(-ln U)` in `f64`, rounded to `f32`, with `U` uniform in (0, 1) from
//! the hash. Its logarithm is [`ln`], written here with correctly rounded `f64` operations
//! alone (no library call, no fused multiply-add) in an order fixed by this code, so the
//! device computes the very same bits from the same operations in the same order
//! (`device_draw.cu` repeats it line for line): the host and the device draw the same
//! tokens without the host sending the device any noise.

/// SplitMix64's finalizer: a bijective 64-bit mixer.
pub(super) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of token position `position` of a request seeded with `seed`.
pub fn position_key(seed: u64, position: u64) -> u64 {
    mix(mix(seed ^ 0x5eed_ba12_0000_0000) ^ mix(position.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Uniform in (0, 1) for vocabulary entry `index` under `key`.
pub(super) fn uniform(key: u64, index: u64) -> f64 {
    let bits = mix(key ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 11;
    (bits as f64 + 0.5) / (1u64 << 53) as f64
}

/// `1 / (2k + 1)` for `k` in `0..11`: the series of `atanh(s) / s` in `s²`.
pub(super) const ODD_RECIPROCALS: [f64; 11] = [
    1.0,
    0.3333333333333333,
    0.2,
    0.14285714285714285,
    0.1111111111111111,
    0.09090909090909091,
    0.07692307692307693,
    0.06666666666666667,
    0.058823529411764705,
    0.05263157894736842,
    0.047619047619047616,
];
/// `ln 2` in two parts: the first times any exponent is exact.
pub(super) const LN2_HIGH: f64 = 0.6931471803691238;
pub(super) const LN2_LOW: f64 = 1.9082149292705877e-10;

/// The natural logarithm of a positive normal `x`, within a few units in the last place:
/// `x = 2^e · m` with `m` in `[√½, √2)`, `ln m = 2 atanh(s)` with `s = (m - 1) / (m + 1)`
/// (`|s| < 0.172`, so 11 terms of the series in `s²` reach `f64`'s precision), and
/// `e · ln 2` added in two parts. Every operation is one correctly rounded `+`, `-`, `·`
/// or `/`, in this order.
pub(super) fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        exponent += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let mut series = ODD_RECIPROCALS[10];
    for &c in ODD_RECIPROCALS[..10].iter().rev() {
        series = series * z + c;
    }
    let e = exponent as f64;
    e * LN2_HIGH + (e * LN2_LOW + (2.0 * s) * series)
}

/// The Gumbel noise `-ln(-ln U)` of vocabulary entry `index` under `key`, computed in `f64`
/// and rounded to the `f32` the score adds.
pub(super) fn gumbel(key: u64, index: u64) -> f32 {
    -ln(-ln(uniform(key, index))) as f32
}

/// The noise of the draw at `position` of a request seeded with `seed`, for the vocabulary
/// entries from `first` on: `noise[k]` is entry `first + k`'s. A whole row's
/// (`first == 0`, vocabulary-sized) is what [`sample_with_noise`](super::sample_with_noise)
/// and the device draw's MLX path read.
pub fn fill_noise(noise: &mut [f32], seed: u64, position: u64, first: usize) {
    let key = position_key(seed, position);
    for (k, g) in noise.iter_mut().enumerate() {
        *g = gumbel(key, (first + k) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite positive or negative `f64`.
    fn ulps(a: f64, b: f64) -> u64 {
        let order = |x: f64| {
            let bits = x.to_bits() as i64;
            if bits < 0 {
                i64::MIN - bits
            } else {
                bits
            }
        };
        order(a).abs_diff(order(b))
    }

    #[test]
    fn ln_is_within_four_ulps_of_the_librarys() {
        let mut state = 3u64;
        let mut worst = 0;
        let mut check = |x: f64| {
            let (ours, library) = (ln(x), x.ln());
            // Near 1 the logarithm is tiny: compare in absolute terms there.
            if (x - 1.0).abs() < 1e-3 {
                assert!(
                    (ours - library).abs() <= library.abs() * 4e-16 + 1e-300,
                    "{x}"
                );
            } else {
                worst = worst.max(ulps(ours, library));
            }
        };
        for _ in 0..1_000_000 {
            state = mix(state);
            // Every range the noise takes: U in (0, 1) and -ln U in (0, 38).
            check(uniform(state, 0));
            check((state >> 11) as f64 / (1u64 << 53) as f64 * 38.0 + 1e-17);
        }
        for x in [
            2f64.powi(-54),
            1.0 - 2f64.powi(-53),
            1.0,
            0.5,
            2.0,
            38.0,
            1e-16,
        ] {
            check(x);
        }
        assert!(worst <= 4, "{worst} ulps");
    }

    #[test]
    fn the_noise_is_the_library_logarithms_noise_to_f32() {
        // Rounded to f32, the two logarithms give the same noise but where an f64 value lies
        // within an ulp or two of an f32 rounding boundary (about one in 10^8).
        let key = position_key(42, 7);
        let differing = (0..2_000_000u64)
            .filter(|&i| {
                let library = -(-uniform(key, i).ln()).ln() as f32;
                gumbel(key, i) != library
            })
            .count();
        assert!(differing <= 2, "{differing}");
    }
}

//! Attention on the CPU: a block of one row's query positions over the row's own keys and
//! values (the engine's packed CPU path). Each query head is computed exactly as it would be
//! alone — `softmax(scale · q·k [soft-capped]) · v`: each score one fused multiply-add chain
//! over the head's features in order; the maximum; the exponentials (one polynomial,
//! [`exp`]) summed in position order; each output feature one chain over the positions in
//! order, divided by that sum — so a prefill chunk's query and a decoding row's get the same
//! bits, whatever block they run in.
//!
//! A block runs as panels of [`LANES`] query heads side by side, one head per lane
//! (`lanes.rs`): a key's feature is multiplied into every lane at once, and a value's
//! likewise, so each key and value is read once per panel and each lane runs the chain it
//! would run alone. Positions outside a lane's window score `-inf` there, which adds exact
//! zeros to its sums (an output's `+ 0.0` gives a zero the sign it has alone). Where the CPU
//! has AVX-512 or AVX2 the same code runs on 16 or 8 lanes a vector ([`Kernel`]); the bits
//! equal the portable build's.

mod lanes;

use std::cell::RefCell;

use lanes::Lanes;

use crate::Kernel;

/// Query heads a panel runs side by side.
const LANES: usize = 16;

/// Keys a panel scores at once (independent chains, so the multiply-adds overlap).
const KEYS: usize = 8;

// A panel's scores, one `[f32; LANES]` per position: reused by each thread.
thread_local! {
    static SCORES: RefCell<Vec<[f32; LANES]>> = const { RefCell::new(Vec::new()) };
}

/// The attention of one layer's heads.
#[derive(Debug, Clone, Copy)]
pub struct QueryAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl QueryAttention {
    /// The query heads of KV head `g` for queries `q` (each `heads · head_dim` floats,
    /// rotated, end to end), query `n` seeing positions `ranges[n]` of `kv`: per query, its
    /// `heads / kv_heads` heads' outputs, end to end. KV heads are independent: a row's
    /// heads may run on different threads.
    ///
    /// Panics where `q` holds fewer than `ranges.len()` queries or a range reaches past
    /// `kv`.
    pub fn attend(&self, q: &[f32], kv: Kv, ranges: &[(usize, usize)], g: usize) -> Vec<f32> {
        self.attend_with(Kernel::detect(), q, kv, ranges, g)
    }

    /// [`attend`](Self::attend) on a given kernel (one [`Kernel::available`] lists).
    pub fn attend_with(
        &self,
        kernel: Kernel,
        q: &[f32],
        kv: Kv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        let width = self.kv_heads * self.head_dim;
        assert!(g < self.kv_heads && self.heads.is_multiple_of(self.kv_heads));
        assert!(q.len() >= ranges.len() * self.heads * self.head_dim);
        for &(start, end) in ranges {
            assert!(start <= end && end * width <= kv.keys.len().min(kv.values.len()));
            assert!(end < 1 << 24, "positions are exact as floats below 2^24");
        }
        assert!(kernel.is_available());
        // A SIMD form loads a head's values in whole vectors: where they do not tile the
        // head, the next narrower form runs (the same bits).
        let mut kernel = kernel;
        if kernel == Kernel::Avx512 && !self.head_dim.is_multiple_of(16) {
            kernel = Kernel::Avx2;
        }
        if kernel == Kernel::Avx2 && !self.head_dim.is_multiple_of(8) {
            kernel = Kernel::Portable;
        }
        // SAFETY: the CPU runs `kernel` (an AVX-512 CPU runs AVX2), and every key and value
        // a panel reads lies below its window's end.
        match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { self.attend_avx512(q, kv, ranges, g) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { self.attend_avx2(q, kv, ranges, g) },
            _ => unsafe { self.attend_block::<f32, 1, 8>(q, kv, ranges, g) },
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn attend_avx512(
        &self,
        q: &[f32],
        kv: Kv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        // 4 heads by 64 value features: 16 of the 32 registers.
        self.attend_block::<lanes::Avx512, 4, 4>(q, kv, ranges, g)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn attend_avx2(
        &self,
        q: &[f32],
        kv: Kv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        // 2 heads by 32 value features: half of the 16 registers.
        self.attend_block::<lanes::Avx2, 2, 4>(q, kv, ranges, g)
    }

    /// Every query head of the block, a panel of [`LANES`] at a time, weighing values in
    /// tiles of `HEADS` × `SPANS` vectors (the tiling changes no chain). No closures in
    /// here: they would not be compiled with the caller's target features.
    #[inline(always)]
    unsafe fn attend_block<V: Lanes, const HEADS: usize, const SPANS: usize>(
        &self,
        q: &[f32],
        kv: Kv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        let (hd, repeats) = (self.head_dim, self.heads / self.kv_heads);
        let qw = self.heads * hd;
        let count = ranges.len() * repeats;
        let mut out = vec![0.0f32; count * hd];
        let mut scores = SCORES.with(|s| std::mem::take(&mut *s.borrow_mut()));
        for (first, out) in (0..count).step_by(LANES).zip(out.chunks_mut(LANES * hd)) {
            // Lane `l` is query `n`'s head `g · repeats + j`, where `first + l = n · repeats + j`.
            let lanes = (count - first).min(LANES);
            let mut queries = vec![[0.0f32; LANES]; hd];
            let (mut starts, mut ends) = ([0.0f32; LANES], [0.0f32; LANES]);
            let (mut lo, mut hi) = (usize::MAX, 0);
            for l in 0..lanes {
                let (n, j) = ((first + l) / repeats, (first + l) % repeats);
                let head = &q[n * qw + (g * repeats + j) * hd..][..hd];
                for (lanes, x) in queries.iter_mut().zip(head) {
                    lanes[l] = *x;
                }
                let (start, end) = ranges[n];
                (starts[l], ends[l]) = (start as f32, end as f32);
                (lo, hi) = (lo.min(start), hi.max(end));
            }
            let panel = Panel {
                attention: self,
                kv,
                at: g * hd,
                starts,
                ends,
                lo,
                hi: hi.max(lo),
                lanes,
            };
            scores.clear();
            scores.resize(panel.hi - panel.lo, [0.0; LANES]);
            panel.score::<V>(&queries, &mut scores);
            let totals = panel.softmax_numerators::<V>(&mut scores);
            panel.weigh_values::<V, HEADS, SPANS>(&scores, &totals, out);
        }
        SCORES.with(|s| *s.borrow_mut() = scores);
        out
    }
}

/// One row's keys and values, position-major: position `t`'s `kv_heads · head_dim` keys at
/// `keys[t · kv_heads · head_dim..]`, its values likewise.
#[derive(Debug, Clone, Copy)]
pub struct Kv<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
}

/// One panel: lane `l`'s query head sees positions `starts[l]..ends[l]` of `kv` (as floats,
/// exact below 2^24); `lo..hi` spans them all; lanes from `lanes` on are unused.
struct Panel<'a> {
    attention: &'a QueryAttention,
    kv: Kv<'a>,
    /// The KV head's first feature within a position.
    at: usize,
    starts: [f32; LANES],
    ends: [f32; LANES],
    lo: usize,
    hi: usize,
    lanes: usize,
}

impl Panel<'_> {
    /// The vectors of `V` that hold the used lanes: their first lanes.
    #[inline(always)]
    fn vectors<V: Lanes>(&self) -> impl Iterator<Item = usize> {
        (0..self.lanes).step_by(V::W)
    }

    /// `scores[t - lo][l]`: lane `l`'s scaled (and soft-capped) `q·k` at position `t`, one
    /// chain over the features in order; `-inf` outside the lane's window.
    #[inline(always)]
    unsafe fn score<V: Lanes>(&self, queries: &[[f32; LANES]], scores: &mut [[f32; LANES]]) {
        let hd = self.attention.head_dim;
        let width = self.attention.kv_heads * hd;
        let keys = self.kv.keys[self.at..].as_ptr();
        let (scale, none) = (V::splat(self.attention.scale), V::splat(f32::NEG_INFINITY));
        for lane in self.vectors::<V>() {
            let starts = V::load(self.starts[lane..].as_ptr());
            let ends = V::load(self.ends[lane..].as_ptr());
            for (from, scores) in (self.lo..self.hi)
                .step_by(KEYS)
                .zip(scores.chunks_mut(KEYS))
            {
                // A short last group repeats its last key; those chains are not kept.
                let last = scores.len() - 1;
                let mut rows = [keys; KEYS];
                for (j, row) in rows.iter_mut().enumerate() {
                    *row = keys.add((from + j.min(last)) * width);
                }
                let mut chains = [V::splat(0.0); KEYS];
                for (d, q) in queries[..hd].iter().enumerate() {
                    let q = V::load(q[lane..].as_ptr());
                    for (chain, row) in chains.iter_mut().zip(&rows) {
                        *chain = q.mul_add(V::splat(*row.add(d)), *chain);
                    }
                }
                for (j, (s, chain)) in scores.iter_mut().zip(&chains).enumerate() {
                    let mut x = chain.mul(scale);
                    if let Some(cap) = self.attention.softcap {
                        x = soft_cap(x, cap);
                    }
                    let t = V::splat((from + j) as f32);
                    let x = t.select_lt(starts, none, x);
                    t.select_lt(ends, x, none).store(s[lane..].as_mut_ptr());
                }
            }
        }
    }

    /// Each score becomes `exp(score - lane's maximum)`; returns each lane's total, summed
    /// in position order (positions outside a window add exact zeros).
    #[inline(always)]
    unsafe fn softmax_numerators<V: Lanes>(&self, scores: &mut [[f32; LANES]]) -> [f32; LANES] {
        let mut totals = [0.0f32; LANES];
        let zero = V::splat(0.0);
        for lane in self.vectors::<V>() {
            let mut max = V::splat(f32::NEG_INFINITY);
            for s in scores.iter() {
                max = V::load(s[lane..].as_ptr()).max(max);
            }
            // A lane with no position stays finite.
            let max = max.select_lt(V::splat(f32::MIN), zero, max);
            let mut total = zero;
            for s in scores.iter_mut() {
                let e = exp(V::load(s[lane..].as_ptr()).sub(max));
                e.store(s[lane..].as_mut_ptr());
                total = total.add(e);
            }
            total.store(totals[lane..].as_mut_ptr());
        }
        totals
    }

    /// Lane `l`'s output feature `d`: `Σ_t e[t][l] · v[t][d]`, one chain over the positions
    /// in order, divided by the lane's total; `out` holds `head_dim` floats per used lane.
    /// The chains run `HEADS` lanes by `SPANS` vectors of features at a time: a position's
    /// values are loaded once for the tile, and each lane's weight is broadcast (so a
    /// decoding row's few heads cost their own work, not a full panel's).
    #[inline(always)]
    unsafe fn weigh_values<V: Lanes, const HEADS: usize, const SPANS: usize>(
        &self,
        scores: &[[f32; LANES]],
        totals: &[f32; LANES],
        out: &mut [f32],
    ) {
        let hd = self.attention.head_dim;
        let width = self.attention.kv_heads * hd;
        let values = self.kv.values[self.at..].as_ptr();
        for l0 in (0..self.lanes).step_by(HEADS) {
            // A short last tile repeats its last lane or span; those chains are not kept.
            let heads = (self.lanes - l0).min(HEADS);
            for d0 in (0..hd).step_by(SPANS * V::W) {
                let spans = (hd - d0) / V::W;
                let spans = spans.min(SPANS);
                let mut chains = [[V::splat(0.0); SPANS]; HEADS];
                for (t, e) in (self.lo..self.hi).zip(scores) {
                    let row = values.add(t * width + d0);
                    let mut v = [V::splat(0.0); SPANS];
                    for (k, v) in v.iter_mut().enumerate() {
                        *v = V::load(row.add(k.min(spans - 1) * V::W));
                    }
                    for (h, chains) in chains.iter_mut().enumerate() {
                        let e = V::splat(e[l0 + h.min(heads - 1)]);
                        for (chain, v) in chains.iter_mut().zip(&v) {
                            *chain = e.mul_add(*v, *chain);
                        }
                    }
                }
                for (h, chains) in chains[..heads].iter().enumerate() {
                    let total = V::splat(totals[l0 + h]);
                    let out = out[(l0 + h) * hd + d0..].as_mut_ptr();
                    for (k, chain) in chains[..spans].iter().enumerate() {
                        chain.div(total).add(V::splat(0.0)).store(out.add(k * V::W));
                    }
                }
            }
        }
    }
}

/// `cap · tanh(x / cap)`, lane by lane (Gemma 2's soft cap; `tanh` has no SIMD form here).
#[inline(always)]
unsafe fn soft_cap<V: Lanes>(x: V, cap: f32) -> V {
    let mut held = [0.0f32; LANES];
    x.div(V::splat(cap)).store(held.as_mut_ptr());
    for h in held[..V::W].iter_mut() {
        *h = h.tanh();
    }
    V::load(held.as_ptr()).mul(V::splat(cap))
}

/// `e^x` for the softmax: `2^n · p(r)` with `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, `p` Cephes'
/// `expf` polynomial (within 2 ulp); exactly `0` below `-87.3` (and at `-inf`), NaN at NaN.
/// Only IEEE operations and a floor: the same bits on every [`Lanes`].
#[inline(always)]
unsafe fn exp<V: Lanes>(x: V) -> V {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // (A NaN stays NaN: it is not above 88.)
    let clamped = V::splat(88.0).select_lt(x, V::splat(88.0), x);
    let n = clamped
        .mul(V::splat(std::f32::consts::LOG2_E))
        .add(V::splat(0.5))
        .floor();
    let r = n.mul_add(V::splat(-LN2_HI), clamped);
    let r = n.mul_add(V::splat(-LN2_LO), r);
    let p = V::splat(1.987_569_1e-4)
        .mul_add(r, V::splat(1.398_199_9e-3))
        .mul_add(r, V::splat(8.333_452e-3))
        .mul_add(r, V::splat(4.166_579_6e-2))
        .mul_add(r, V::splat(0.166_666_65))
        .mul_add(r, V::splat(0.5));
    let p = p.mul(r).mul_add(r, r).add(V::splat(1.0));
    x.select_lt(V::splat(-87.3), V::splat(0.0), p.mul(n.pow2()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_and_zero_far_below() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            // SAFETY: plain floats.
            let got = unsafe { exp(x) } as f64;
            assert!(
                (got - want).abs() <= 2.5e-7 * want,
                "exp({x}) = {got}, not {want}"
            );
            x += 0.0137;
        }
        // SAFETY: plain floats.
        unsafe {
            assert_eq!(exp(0.0f32), 1.0);
            assert_eq!(exp(f32::NEG_INFINITY).to_bits(), 0);
            assert_eq!(exp(-100.0f32).to_bits(), 0);
            assert!(exp(f32::NAN).is_nan());
        }
    }
}

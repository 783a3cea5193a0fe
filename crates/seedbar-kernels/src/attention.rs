//! Attention on the CPU: a block of one row's query positions over the row's own keys and
//! values (the engine's packed CPU path). Each query head is computed exactly as it would be
//! alone, so a prefill chunk's query and a decoding row's get the same bits, whatever block
//! they run in.
//!
//! A head's computation (an online softmax over fixed tiles): the positions are cut into
//! tiles of [`TILE`] at multiples of `TILE` (absolute positions, so the cut is the same for a
//! query in any block). Per tile, in position order: each score `scale · q·k` (soft-capped)
//! is one fused multiply-add chain over the features; the running maximum `m` takes the
//! tile's; the running total and each output feature are first multiplied by
//! `exp(m_old - m)`, then the total adds each `e = exp(score - m)` ([`exp`], a polynomial)
//! and each output feature is one multiply-add chain `o = e · v + o`; at the end the output
//! is divided by the total. A tile's keys and values are read once for every head of the
//! block while they sit in the cache.
//!
//! A block runs as panels of [`LANES`] query heads side by side, one head per SIMD lane
//! (`lanes.rs`): a key's feature is multiplied into every lane at once. Positions outside a
//! lane's window score `-inf` there, and a tile with none of the lane's positions leaves its
//! sums as they were: both add exact zeros (an output's `+ 0.0` gives a zero the sign it has
//! alone). Values are weighed lane-wise for a full panel, and feature-wise (each head's
//! weight broadcast) where a panel holds a decoding row's few heads: the same chains. Where
//! the CPU has AVX-512 or AVX2 the same code runs on 16 or 8 lanes a vector ([`Kernel`]);
//! the bits equal the portable build's.

mod lanes;

use lanes::Lanes;

use crate::Kernel;

/// Query heads a panel runs side by side.
const LANES: usize = 16;

/// Positions per tile of the online softmax, cut at multiples of it: a tile's keys and
/// values of one KV head (32 KiB each for 64-feature heads) stay cached while every panel of
/// the block reads them.
pub const TILE: usize = 128;

/// Keys a panel scores at once (independent chains, so the multiply-adds overlap).
const KEYS: usize = 8;

/// Value features weighed at once where a panel is weighed lane-wise.
const FEATURES: usize = 16;

/// A panel at most this full is weighed feature-wise (a decoding row's heads).
const FEW: usize = 8;

/// The attention of one layer's heads.
#[derive(Debug, Clone, Copy)]
pub struct QueryAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// One row's keys and values, position-major: position `t`'s `kv_heads · head_dim` keys at
/// `keys[t · kv_heads · head_dim..]`, its values likewise.
#[derive(Debug, Clone, Copy)]
pub struct Kv<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
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
        // Feature-wise: 4 heads by 64 features, 16 of the 32 registers.
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
        // Feature-wise: 2 heads by 32 features, half of the 16 registers.
        self.attend_block::<lanes::Avx2, 2, 4>(q, kv, ranges, g)
    }

    /// Every query head of the block: panels of [`LANES`] heads, tile by tile. Feature-wise
    /// weighing runs `HEADS` × `SPANS` vectors at a time (the tiling changes no chain). No
    /// closures in here: they would not be compiled with the caller's target features.
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
        let mut panels = Vec::with_capacity(count.div_ceil(LANES));
        for first in (0..count).step_by(LANES) {
            // Lane `l` is query `n`'s head `g · repeats + j`, where `first + l = n · repeats + j`.
            let lanes = (count - first).min(LANES);
            let mut panel = Panel::new(lanes, hd);
            for l in 0..lanes {
                let (n, j) = ((first + l) / repeats, (first + l) % repeats);
                let head = &q[n * qw + (g * repeats + j) * hd..][..hd];
                for (lanes, x) in panel.queries.iter_mut().zip(head) {
                    lanes[l] = *x;
                }
                let (start, end) = ranges[n];
                (panel.starts[l], panel.ends[l]) = (start as f32, end as f32);
                (panel.lo, panel.hi) = (panel.lo.min(start), panel.hi.max(end));
            }
            panels.push(panel);
        }
        let lo = panels.iter().map(|p| p.lo).min().unwrap_or(0);
        let hi = panels.iter().map(|p| p.hi).max().unwrap_or(0);
        let block = Block {
            attention: self,
            kv,
            at: g * hd,
        };
        let mut scores = vec![[0.0f32; LANES]; TILE];
        let mut tile = lo / TILE * TILE;
        while tile < hi {
            let (from, to) = (tile.max(lo), (tile + TILE).min(hi));
            for panel in panels.iter_mut() {
                // A tile with none of the panel's positions changes none of its sums.
                let (from, to) = (from.max(panel.lo), to.min(panel.hi));
                if from >= to {
                    continue;
                }
                let scores = &mut scores[..to - from];
                block.score::<V>(panel, from, scores);
                let scale = panel.take_tile::<V>(scores);
                if panel.lane_wise(hd) {
                    block.weigh_lanes::<V>(panel, from, scores, &scale);
                } else {
                    block.weigh_heads::<V, HEADS, SPANS>(panel, from, scores, &scale);
                }
            }
            tile += TILE;
        }
        let mut out = vec![0.0f32; count * hd];
        for (panel, out) in panels.iter().zip(out.chunks_mut(LANES * hd)) {
            panel.finish(out, hd);
        }
        out
    }
}

/// What every panel of a block reads: KV head `g`'s keys and values, from feature `at`.
struct Block<'a> {
    attention: &'a QueryAttention,
    kv: Kv<'a>,
    at: usize,
}

/// Up to [`LANES`] query heads and their running sums: lane `l` sees positions
/// `starts[l]..ends[l]` (as floats, exact below 2^24); `lo..hi` spans them all; lanes from
/// `lanes` on are unused.
struct Panel {
    lanes: usize,
    /// Feature `d`'s value in every lane.
    queries: Vec<[f32; LANES]>,
    starts: [f32; LANES],
    ends: [f32; LANES],
    lo: usize,
    hi: usize,
    /// Each lane's running maximum (`-inf` before its first position) and total.
    max: [f32; LANES],
    total: [f32; LANES],
    /// The running outputs: `[d][lane]` where the panel is weighed lane-wise, `[lane][d]`
    /// where feature-wise.
    out: Vec<f32>,
}

impl Panel {
    fn new(lanes: usize, hd: usize) -> Panel {
        Panel {
            lanes,
            queries: vec![[0.0; LANES]; hd],
            starts: [0.0; LANES],
            ends: [0.0; LANES],
            lo: usize::MAX,
            hi: 0,
            max: [f32::NEG_INFINITY; LANES],
            total: [0.0; LANES],
            out: vec![0.0; LANES * hd],
        }
    }

    /// Whether the panel is weighed lane-wise: more than [`FEW`] heads, and whole groups of
    /// [`FEATURES`] per head.
    fn lane_wise(&self, hd: usize) -> bool {
        self.lanes > FEW && hd.is_multiple_of(FEATURES)
    }

    /// The vectors of `V` that hold the used lanes: their first lanes.
    #[inline(always)]
    fn vectors<V: Lanes>(&self) -> impl Iterator<Item = usize> {
        (0..self.lanes).step_by(V::W)
    }

    /// Takes a tile's scores into the running maximum; each score becomes
    /// `exp(score - max)` and the total is rescaled and adds them in position order.
    /// Returns each lane's rescale factor `exp(old max - max)` for its outputs (`0` while a
    /// lane has seen no position, `1` where the maximum held).
    #[inline(always)]
    unsafe fn take_tile<V: Lanes>(&mut self, scores: &mut [[f32; LANES]]) -> [f32; LANES] {
        let mut scales = [0.0f32; LANES];
        let zero = V::splat(0.0);
        for lane in self.vectors::<V>() {
            let old = V::load(self.max[lane..].as_ptr());
            let mut max = old;
            for s in scores.iter() {
                max = V::load(s[lane..].as_ptr()).max(max);
            }
            max.store(self.max[lane..].as_mut_ptr());
            // Before a lane's first position its maximum is -inf: exponents from 0 then.
            let from = max.select_lt(V::splat(f32::MIN), zero, max);
            let scale = exp(old.sub(from));
            scale.store(scales[lane..].as_mut_ptr());
            let mut total = V::load(self.total[lane..].as_ptr()).mul(scale);
            for s in scores.iter_mut() {
                let e = exp(V::load(s[lane..].as_ptr()).sub(from));
                e.store(s[lane..].as_mut_ptr());
                total = total.add(e);
            }
            total.store(self.total[lane..].as_mut_ptr());
        }
        scales
    }

    /// The used lanes' outputs divided by their totals, `hd` floats per lane.
    fn finish(&self, out: &mut [f32], hd: usize) {
        for l in 0..self.lanes {
            for d in 0..hd {
                let o = if self.lane_wise(hd) {
                    self.out[d * LANES + l]
                } else {
                    self.out[l * hd + d]
                };
                out[l * hd + d] = o / self.total[l] + 0.0;
            }
        }
    }
}

impl Block<'_> {
    /// `scores[t - from][l]`: lane `l`'s scaled (and soft-capped) `q·k` at positions
    /// `from..from + scores.len()`, one chain over the features in order; `-inf` outside
    /// the lane's window.
    #[inline(always)]
    unsafe fn score<V: Lanes>(&self, panel: &Panel, from: usize, scores: &mut [[f32; LANES]]) {
        let hd = self.attention.head_dim;
        let width = self.attention.kv_heads * hd;
        let keys = self.kv.keys[self.at..].as_ptr();
        let (scale, none) = (V::splat(self.attention.scale), V::splat(f32::NEG_INFINITY));
        for lane in panel.vectors::<V>() {
            let starts = V::load(panel.starts[lane..].as_ptr());
            let ends = V::load(panel.ends[lane..].as_ptr());
            for (first, scores) in (from..).step_by(KEYS).zip(scores.chunks_mut(KEYS)) {
                // A short last group repeats its last key; those chains are not kept.
                let last = scores.len() - 1;
                let mut rows = [keys; KEYS];
                for (j, row) in rows.iter_mut().enumerate() {
                    *row = keys.add((first + j.min(last)) * width);
                }
                let mut chains = [V::splat(0.0); KEYS];
                for (d, q) in panel.queries[..hd].iter().enumerate() {
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
                    let t = V::splat((first + j) as f32);
                    let x = t.select_lt(starts, none, x);
                    t.select_lt(ends, x, none).store(s[lane..].as_mut_ptr());
                }
            }
        }
    }

    /// Lane-wise weighing (`out[d][lane]`): each output feature is rescaled, then adds
    /// `e[t][l] · v[t][d]` over the tile's positions in order, [`FEATURES`] features at a
    /// time (a whole number of them per head: [`Panel::lane_wise`]), every lane at once.
    #[inline(always)]
    unsafe fn weigh_lanes<V: Lanes>(
        &self,
        panel: &mut Panel,
        from: usize,
        scores: &[[f32; LANES]],
        scales: &[f32; LANES],
    ) {
        let hd = self.attention.head_dim;
        let width = self.attention.kv_heads * hd;
        let values = self.kv.values[self.at..].as_ptr();
        for lane in panel.vectors::<V>() {
            let scale = V::load(scales[lane..].as_ptr());
            for d0 in (0..hd).step_by(FEATURES) {
                let out = panel.out.as_mut_ptr().add(lane);
                let mut chains = [V::splat(0.0); FEATURES];
                for (f, chain) in chains.iter_mut().enumerate() {
                    *chain = V::load(out.add((d0 + f) * LANES)).mul(scale);
                }
                for (t, e) in (from..).zip(scores) {
                    let e = V::load(e[lane..].as_ptr());
                    let v = values.add(t * width + d0);
                    for (f, chain) in chains.iter_mut().enumerate() {
                        *chain = e.mul_add(V::splat(*v.add(f)), *chain);
                    }
                }
                for (f, chain) in chains.iter().enumerate() {
                    chain.store(out.add((d0 + f) * LANES));
                }
            }
        }
    }

    /// Feature-wise weighing (`out[lane][d]`): the same chains as [`weigh_lanes`], `HEADS`
    /// lanes by `SPANS` vectors of features at a time, each lane's weight broadcast, so a
    /// decoding row's few heads cost their own work.
    ///
    /// [`weigh_lanes`]: Self::weigh_lanes
    #[inline(always)]
    unsafe fn weigh_heads<V: Lanes, const HEADS: usize, const SPANS: usize>(
        &self,
        panel: &mut Panel,
        from: usize,
        scores: &[[f32; LANES]],
        scales: &[f32; LANES],
    ) {
        let hd = self.attention.head_dim;
        let width = self.attention.kv_heads * hd;
        let values = self.kv.values[self.at..].as_ptr();
        for l0 in (0..panel.lanes).step_by(HEADS) {
            // A short last tile repeats its last lane or span; those chains are not kept.
            let heads = (panel.lanes - l0).min(HEADS);
            for d0 in (0..hd).step_by(SPANS * V::W) {
                let spans = ((hd - d0) / V::W).min(SPANS);
                let mut chains = [[V::splat(0.0); SPANS]; HEADS];
                for (h, chains) in chains.iter_mut().enumerate() {
                    let l = l0 + h.min(heads - 1);
                    let (out, scale) = (panel.out.as_ptr().add(l * hd + d0), V::splat(scales[l]));
                    for (k, chain) in chains.iter_mut().enumerate() {
                        *chain = V::load(out.add(k.min(spans - 1) * V::W)).mul(scale);
                    }
                }
                for (t, e) in (from..).zip(scores) {
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
                    let out = panel.out.as_mut_ptr().add((l0 + h) * hd + d0);
                    for (k, chain) in chains[..spans].iter().enumerate() {
                        chain.store(out.add(k * V::W));
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

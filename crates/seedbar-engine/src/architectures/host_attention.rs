//! Attention on the host, for the packed CPU path (`host.rs`): a block of one row's query
//! positions over the row's own host KV. Each query is computed exactly as it would be
//! alone — `softmax(scale · q·k [soft-capped]) · v` per head, the scores in position order,
//! then their maximum, exponentials and total in position order, then the weighted values
//! summed in position order — so a prefill chunk's query and a decoding row's get the same
//! bits, whatever block they run in. A block reads each key and value once for all its
//! queries and for every query head of a KV head (the cost that grows with the context).
//! Where the CPU has AVX2 the same code runs compiled for it: separate multiplies and adds
//! (Rust never fuses them), so the bits equal the portable build's.

use crate::step::kv_cache::HostKv;

/// Queries one block holds: their scores for one KV head stay in the cache's reach.
pub(super) const BLOCK: usize = 16;

/// The attention of one layer's heads.
pub(super) struct QueryAttention {
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
    pub(super) fn attend(
        &self,
        q: &[f32],
        kv: &HostKv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.attend_avx2(q, kv, ranges, g) };
        }
        self.attend_portable(q, kv, ranges, g)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn attend_avx2(
        &self,
        q: &[f32],
        kv: &HostKv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        self.attend_block(q, kv, ranges, g)
    }

    fn attend_portable(
        &self,
        q: &[f32],
        kv: &HostKv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        self.attend_block(q, kv, ranges, g)
    }

    #[inline(always)]
    fn attend_block(
        &self,
        q: &[f32],
        kv: &HostKv,
        ranges: &[(usize, usize)],
        g: usize,
    ) -> Vec<f32> {
        let (hd, repeats, width) = (self.head_dim, self.heads / self.kv_heads, kv.width());
        let qw = self.heads * hd;
        let mut out = vec![0.0f32; ranges.len() * repeats * hd];
        let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        let span = hi - lo;
        // Per (query, head of the group): its scores, then its softmax weights' numerators.
        let mut scores = vec![0.0f32; ranges.len() * repeats * span];
        let mut totals = vec![0.0f32; ranges.len() * repeats];
        let at = g * hd;
        for t in lo..hi {
            let k = &kv.keys[t * width + at..][..hd];
            for (n, &(start, end)) in ranges.iter().enumerate() {
                if t < start || t >= end {
                    continue;
                }
                for j in 0..repeats {
                    let h = g * repeats + j;
                    let s = dot(&q[n * qw + h * hd..][..hd], k) * self.scale;
                    scores[(n * repeats + j) * span + t - lo] = match self.softcap {
                        Some(cap) => cap * (s / cap).tanh(),
                        None => s,
                    };
                }
            }
        }
        for (n, &(start, end)) in ranges.iter().enumerate() {
            for j in 0..repeats {
                let row = &mut scores[(n * repeats + j) * span..][start - lo..end - lo];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0f32;
                for s in row.iter_mut() {
                    *s = (*s - max).exp();
                    total += *s;
                }
                totals[n * repeats + j] = total;
            }
        }
        for t in lo..hi {
            let v = &kv.values[t * width + at..][..hd];
            for (n, &(start, end)) in ranges.iter().enumerate() {
                if t < start || t >= end {
                    continue;
                }
                for j in 0..repeats {
                    let r = n * repeats + j;
                    let weight = scores[r * span + t - lo] / totals[r];
                    let o = &mut out[r * hd..][..hd];
                    for (o, v) in o.iter_mut().zip(v) {
                        *o += weight * v;
                    }
                }
            }
        }
        out
    }
}

/// `a · b` in eight interleaved partial sums (a fixed order the compiler vectorizes).
#[inline(always)]
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

#[cfg(test)]
mod tests {
    use super::*;

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
            let out = attention.attend(&q, &kv, &[(from, 3)], 0);
            let wanted: Vec<f64> = [expect([2.0, 0.0], from), expect([0.0, 4.0], from)].concat();
            for (got, want) in out.iter().zip(&wanted) {
                assert!((*got as f64 - want).abs() < 1e-6, "{out:?} vs {wanted:?}");
            }
        }
    }

    /// Queries in one block get the bits each gets alone, and the AVX2 build the portable
    /// build's: a prefill chunk's query equals the same position decoded.
    #[test]
    fn a_block_of_queries_gets_each_querys_bits_alone() {
        let (kv_heads, head_dim, len) = (2, 16, 40);
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 2_654_435_761 + seed) % 1000) as f32 / 250.0 - 2.0)
                .collect()
        };
        let kv = HostKv {
            keys: values(len * kv_heads * head_dim, 1),
            values: values(len * kv_heads * head_dim, 2),
            kv_heads,
            head_dim,
        };
        for softcap in [None, Some(5.0)] {
            let attention = QueryAttention {
                heads: 6,
                kv_heads,
                head_dim,
                scale: 0.25,
                softcap,
            };
            let qw = 6 * head_dim;
            let q = values(BLOCK * qw, 3);
            // Causal positions 24..40, and a window of 10 over the same positions.
            for window in [None, Some(10)] {
                let ranges: Vec<(usize, usize)> = (0..BLOCK)
                    .map(|n| {
                        let end = len - BLOCK + n + 1;
                        (window.map_or(0, |w: usize| end - w), end)
                    })
                    .collect();
                for g in 0..kv_heads {
                    let block = attention.attend(&q, &kv, &ranges, g);
                    assert_eq!(block, attention.attend_portable(&q, &kv, &ranges, g));
                    let group = qw / kv_heads;
                    for (n, range) in ranges.iter().enumerate() {
                        let alone = attention.attend(&q[n * qw..][..qw], &kv, &[*range], g);
                        assert_eq!(alone, block[n * group..][..group], "query {n}, {window:?}");
                    }
                }
            }
        }
    }
}

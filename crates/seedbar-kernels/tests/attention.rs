//! Per-query attention against a float64 softmax, and the property the packed CPU path
//! relies on: a query head's output is bit-identical alone, in any block of queries, and on
//! every kernel.

mod common;

use common::Stream;
use seedbar_kernels::{Kernel, Kv, QueryAttention};

/// `softmax(scale · q·k [capped]) · v` for query head `h` over `range`, in float64.
fn reference(
    a: &QueryAttention,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    range: (usize, usize),
    h: usize,
) -> Vec<f64> {
    let (hd, width) = (a.head_dim, a.kv_heads * a.head_dim);
    let g = h / (a.heads / a.kv_heads);
    let q = &q[h * hd..][..hd];
    let scores: Vec<f64> = (range.0..range.1)
        .map(|t| {
            let k = &keys[t * width + g * hd..][..hd];
            let s = a.scale as f64
                * q.iter()
                    .zip(k)
                    .map(|(x, y)| *x as f64 * *y as f64)
                    .sum::<f64>();
            a.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    (0..hd)
        .map(|d| {
            (range.0..range.1)
                .zip(&scores)
                .map(|(t, s)| (s - max).exp() / total * values[t * width + g * hd + d] as f64)
                .sum()
        })
        .collect()
}

#[test]
fn each_query_head_is_the_softmax_of_its_window() {
    let mut rng = Stream(7);
    for (heads, kv_heads, head_dim, softcap) in
        [(9, 3, 64, None), (8, 2, 128, Some(30.0)), (2, 2, 24, None)]
    {
        let a = QueryAttention {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap,
        };
        let len = 200;
        let (keys, values) = (
            rng.floats(len * kv_heads * head_dim, 2.0),
            rng.floats(len * kv_heads * head_dim, 1.0),
        );
        let q = rng.floats(heads * head_dim, 2.0);
        for range in [(0, 1), (0, len), (150, 199), (7, 8)] {
            for g in 0..kv_heads {
                let out = a.attend(
                    &q,
                    Kv {
                        keys: &keys,
                        values: &values,
                    },
                    &[range],
                    g,
                );
                let repeats = heads / kv_heads;
                for j in 0..repeats {
                    let want = reference(&a, &q, &keys, &values, range, g * repeats + j);
                    for (got, want) in out[j * head_dim..][..head_dim].iter().zip(&want) {
                        assert!(
                            (*got as f64 - want).abs() < 2e-6,
                            "{range:?}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Random blocks (causal and windowed, several panels, short key and feature groups): each
/// query's heads equal the same query alone, and every kernel equals the portable one.
#[test]
fn a_block_of_queries_gets_each_querys_bits_alone_on_every_kernel() {
    let mut rng = Stream(11);
    let kernels: Vec<Kernel> = Kernel::available();
    assert!(kernels.contains(&Kernel::Portable));
    for round in 0..40 {
        let kv_heads = 1 + rng.below(3);
        let heads = kv_heads * (1 + rng.below(7));
        let head_dim = [20, 64, 72, 80, 96, 128][rng.below(6)];
        let len = 1 + rng.below(600);
        let width = kv_heads * head_dim;
        let (keys, values) = (rng.floats(len * width, 3.0), rng.floats(len * width, 1.0));
        let kv = Kv {
            keys: &keys,
            values: &values,
        };
        let a = QueryAttention {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: (round % 4 == 3).then_some(20.0),
        };
        let window = (round % 3 == 1).then(|| 1 + rng.below(300));
        let count = 1 + rng.below(len.min(80));
        let ranges: Vec<(usize, usize)> = (len - count..len)
            .map(|p| (window.map_or(0, |w| (p + 1).saturating_sub(w)), p + 1))
            .collect();
        let qw = heads * head_dim;
        let q = rng.floats(count * qw, 3.0);
        let group = qw / kv_heads;
        for g in 0..kv_heads {
            let block = a.attend(&q, kv, &ranges, g);
            for kernel in &kernels {
                assert_eq!(
                    block,
                    a.attend_with(*kernel, &q, kv, &ranges, g),
                    "round {round}, {kernel:?}"
                );
            }
            for (n, range) in ranges.iter().enumerate() {
                let alone = a.attend(&q[n * qw..][..qw], kv, &[*range], g);
                assert_eq!(
                    alone,
                    block[n * group..][..group],
                    "round {round}, query {n}"
                );
            }
        }
    }
}

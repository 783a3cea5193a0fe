//! The kernels against a float64 reference, and the property the scheduler relies on: an
//! output row is bit-identical whatever else is in the call; both for float and for int8
//! activations.

mod common;

use common::Stream;
use seedbar_kernels::{Activations, Kernel, MlxAffine, QuantizedMatrix, Team, Unsupported};

const ACTIVATIONS: [Activations; 2] = [Activations::Float, Activations::Int8];

/// `x` as int8 products see it: each block of 32 values rounded to `d · a`, `d = amax / 127`,
/// `a` the nearest integer to `x / d` (ties to even), in float64.
fn rounded_input(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|block| {
            let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let inverse = if amax == 0.0 { 0.0 } else { 127.0 / amax };
            let d = (amax / 127.0) as f64;
            block
                .iter()
                .map(move |v| (v * inverse).round_ties_even().clamp(-127.0, 127.0) as f64 * d)
        })
        .collect()
}

/// A random matrix in MLX's packing.
struct Random {
    words: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
    rows: usize,
    cols: usize,
    group_size: usize,
    bits: u32,
}

impl Random {
    /// The matrix packed for products over `activations`.
    fn matrix(&self, activations: Activations) -> Result<QuantizedMatrix, Unsupported> {
        let mlx = MlxAffine {
            words: &self.words,
            scales: &self.scales,
            biases: &self.biases,
            rows: self.rows,
            cols: self.cols,
            group_size: self.group_size,
            bits: self.bits,
        };
        QuantizedMatrix::from_mlx_affine(mlx, activations)
    }

    fn float(&self) -> QuantizedMatrix {
        self.matrix(Activations::Float).expect("supported")
    }
}

/// A random `[rows, cols]` matrix in MLX's packing, with its dequantized values; `half`:
/// every scale and bias a float16 (multiples of 2^-11, as GGUF's are float16), which the
/// matrix then holds as float16.
fn random_matrix(
    rows: usize,
    cols: usize,
    group_size: usize,
    bits: u32,
    seed: u64,
    half: bool,
) -> (Random, Vec<Vec<f64>>) {
    let mut s = Stream(seed);
    let q: Vec<u32> = (0..rows * cols)
        .map(|_| (s.next() % (1 << bits)) as u32)
        .collect();
    // One stream of `bits`-bit values from the low bits up (values may straddle words).
    let mut words = vec![0u32; rows * cols * bits as usize / 32];
    for (i, &v) in q.iter().enumerate() {
        for b in 0..bits as usize {
            let at = i * bits as usize + b;
            words[at / 32] |= ((v >> b) & 1) << (at % 32);
        }
    }
    let groups = rows * cols / group_size;
    let mut value = |spread: f32| {
        let x = s.float() * spread;
        if half {
            (x * 2048.0).round() / 2048.0
        } else {
            x
        }
    };
    let scales: Vec<f32> = (0..groups).map(|_| value(0.05)).collect();
    let biases: Vec<f32> = (0..groups).map(|_| value(0.1)).collect();
    let dense = (0..rows)
        .map(|r| {
            (0..cols)
                .map(|c| {
                    let g = (r * cols + c) / group_size;
                    q[r * cols + c] as f64 * scales[g] as f64 + biases[g] as f64
                })
                .collect()
        })
        .collect();
    let matrix = Random {
        words,
        scales,
        biases,
        rows,
        cols,
        group_size,
        bits,
    };
    (matrix, dense)
}

fn random_input(m: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut s = Stream(seed);
    (0..m * cols).map(|_| s.float()).collect()
}

#[test]
fn every_kernel_matches_a_float64_reference() {
    for (bits, group_size, cols, half) in [
        (4, 32, 96, false),
        (4, 64, 192, false),
        (8, 32, 64, false),
        (8, 128, 256, false),
        (4, 32, 96, true),
        (8, 32, 64, true),
        (3, 32, 96, false),
        (5, 32, 64, true),
        (6, 64, 192, false),
        (6, 16, 64, false),
    ] {
        let rows = 13;
        let (w, dense) = random_matrix(rows, cols, group_size, bits, 7 + cols as u64, half);
        for activations in ACTIVATIONS {
            let w = w.matrix(activations).unwrap();
            for m in [1, 3, 6, 9] {
                let x = random_input(m, cols, 99);
                let seen: Vec<f64> = match activations {
                    Activations::Float => x.iter().map(|&v| v as f64).collect(),
                    Activations::Int8 => rounded_input(&x),
                };
                for kernel in Kernel::available() {
                    let y = w.matmul_transposed_with(kernel, Team::shared(), &x, m);
                    for i in 0..m {
                        for n in 0..rows {
                            let at = |k: usize| i * cols + k;
                            let exact: f64 = (0..cols).map(|k| dense[n][k] * seen[at(k)]).sum();
                            let got = y[i * rows + n] as f64;
                            assert!(
                                (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                                "{kernel:?} {activations:?} {bits}-bit g{group_size}: row {i} \
                                 col {n}: {got} vs {exact}"
                            );
                            // Rounding moves each input by half its block's step at most.
                            let float: f64 = (0..cols).map(|k| dense[n][k] * x[at(k)] as f64).sum();
                            let bound: f64 = (0..cols)
                                .map(|k| dense[n][k].abs() * (x[at(k)] as f64 - seen[at(k)]).abs())
                                .sum();
                            assert!((got - float).abs() <= bound + 1e-5 * (1.0 + float.abs()));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn int8_rounding_moves_a_product_by_at_most_half_a_step_per_input() {
    // The bound above, checked against the step itself: |x - d·a| ≤ d/2 for every input.
    let x = random_input(4, 256, 31);
    let seen = rounded_input(&x);
    for (block, rounded) in x.chunks(32).zip(seen.chunks(32)) {
        let d = block.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
        for (v, r) in block.iter().zip(rounded) {
            assert!((*v as f64 - r).abs() <= d / 2.0 * (1.0 + 1e-6));
        }
    }
}

#[test]
fn int8_products_of_a_non_finite_input_are_nan() {
    let (w, _) = random_matrix(5, 64, 32, 4, 3, false);
    let w = w.matrix(Activations::Int8).unwrap();
    let mut x = random_input(2, 64, 1);
    x[70] = f32::INFINITY;
    for kernel in Kernel::available() {
        let y = w.matmul_transposed_with(kernel, Team::shared(), &x, 2);
        assert!(y[..5].iter().all(|v| v.is_finite()), "{kernel:?}: row 0");
        assert!(y[5..].iter().all(|v| v.is_nan()), "{kernel:?}: row 1");
    }
}

#[test]
fn every_kernel_gives_the_same_bits() {
    for (bits, half) in [(4, false), (8, false), (4, true), (8, true)] {
        for activations in ACTIVATIONS {
            let (w, _) = random_matrix(41, 192, 64, bits, 17, half);
            let w = w.matrix(activations).unwrap();
            let x = random_input(10, 192, 4);
            let results: Vec<Vec<f32>> = Kernel::available()
                .into_iter()
                .map(|k| w.matmul_transposed_with(k, Team::shared(), &x, 10))
                .collect();
            assert!(
                results.windows(2).all(|r| r[0] == r[1]),
                "{bits}-bit, {half}, {activations:?}"
            );
        }
    }
}

#[test]
fn a_row_is_bit_identical_at_every_position_of_every_batch_size() {
    let (cols, rows) = (128, 37);
    // (bits, group size, float16 scales): GGUF's Q6_K is 6 bits in groups of 16.
    for (bits, group, half) in [
        (4, 64, false),
        (8, 64, false),
        (4, 64, true),
        (6, 16, false),
    ] {
        for activations in ACTIVATIONS {
            let (w, _) = random_matrix(rows, cols, group, bits, 3, half);
            let w = w.matrix(activations).unwrap();
            row_is_bit_identical_in_every_batch(&w);
        }
    }
}

/// `w`'s product of one row, alone and at every position of calls of 1 to 19 rows, is the
/// same bits on every kernel.
fn row_is_bit_identical_in_every_batch(w: &QuantizedMatrix) {
    let (cols, rows) = (w.cols(), w.rows());
    let target = random_input(1, cols, 5);
    for kernel in Kernel::available() {
        let alone = w.matmul_transposed_with(kernel, Team::shared(), &target, 1);
        for m in 1..=19 {
            for at in 0..m {
                let mut x = random_input(m, cols, 11 + m as u64);
                x[at * cols..(at + 1) * cols].copy_from_slice(&target);
                let y = w.matmul_transposed_with(kernel, Team::shared(), &x, m);
                assert_eq!(
                    &y[at * rows..(at + 1) * rows],
                    &alone[..],
                    "{kernel:?} {}-bit {:?}: row {at} of {m}",
                    w.bits(),
                    w.activations()
                );
            }
        }
    }
}

#[test]
fn thread_count_does_not_change_a_result() {
    let (w, _) = random_matrix(300, 256, 32, 4, 21, false);
    let x = random_input(5, 256, 8);

    for activations in ACTIVATIONS {
        let w = w.matrix(activations).unwrap();
        let on = |threads| w.matmul_transposed_with(Kernel::detect(), &Team::new(threads), &x, 5);
        assert_eq!(on(1), on(3), "{activations:?}");
    }
}

#[test]
fn slicing_rows_keeps_their_values() {
    for (bits, activations) in [4, 8].into_iter().flat_map(|b| ACTIVATIONS.map(|a| (b, a))) {
        let (w, dense) = random_matrix(10, 64, 32, bits, 2, false);
        let w = w.matrix(activations).unwrap();
        let part = w.slice_rows(4..7);
        assert_eq!((part.rows(), part.activations()), (3, activations));
        for r in 0..3 {
            let got: Vec<f64> = part.dequantize_row(r).iter().map(|&v| v as f64).collect();
            for (a, b) in got.iter().zip(&dense[4 + r]) {
                assert!((a - b).abs() < 1e-6, "{bits}-bit {activations:?}");
            }
        }
    }
}

#[test]
fn a_stack_of_matrices_gives_each_parts_bits() {
    // Parts that share panels in the stack, and parts of whole panels laid end to end.
    let cases = [[9, 5, 20], [16, 32, 7]].map(|sizes| ACTIVATIONS.map(|a| (sizes, a)));
    for (sizes, activations) in cases.into_iter().flatten() {
        let parts: Vec<_> = sizes
            .iter()
            .zip(1..)
            .map(|(&rows, seed)| random_matrix(rows, 64, 32, 4, seed, false).0)
            .map(|m| m.matrix(activations).unwrap())
            .collect();
        let stacked = QuantizedMatrix::stack_rows(&parts.iter().collect::<Vec<_>>()).unwrap();
        let total: usize = sizes.iter().sum();
        assert_eq!(stacked.rows(), total);
        let x = random_input(3, 64, 7);
        let whole = stacked.matmul_transposed(&x, 3);
        let mut column = 0;
        for part in &parts {
            let own = part.matmul_transposed(&x, 3);
            for i in 0..3 {
                let row = &whole[i * total + column..i * total + column + part.rows()];
                let expected = &own[i * part.rows()..(i + 1) * part.rows()];
                assert_eq!(row, expected, "{sizes:?} {activations:?}: input row {i}");
            }
            column += part.rows();
        }
    }
    let (narrow, wide) = (
        random_matrix(4, 32, 32, 4, 4, false).0.float(),
        random_matrix(4, 64, 32, 4, 5, false).0,
    );
    let (int8, wide) = (wide.matrix(Activations::Int8).unwrap(), wide.float());
    assert!(QuantizedMatrix::stack_rows(&[&wide, &narrow]).is_none());
    assert!(QuantizedMatrix::stack_rows(&[&wide, &int8]).is_none());
}

#[test]
fn what_cannot_be_held_is_refused_with_the_reason() {
    let words = vec![0u32; 8];
    let one = [1.0f32];
    let refuse = |bits, group_size, cols| {
        let mlx = MlxAffine {
            words: &words,
            scales: &one,
            biases: &one,
            rows: 1,
            cols,
            group_size,
            bits,
        };
        QuantizedMatrix::from_mlx_affine(mlx, Activations::Float).unwrap_err()
    };
    assert_eq!(refuse(1, 32, 32), Unsupported::Bits(1));
    assert_eq!(refuse(9, 32, 32), Unsupported::Bits(9));
    assert_eq!(refuse(4, 3, 30), Unsupported::GroupSize(3));
    assert_eq!(
        refuse(4, 64, 96),
        Unsupported::Columns {
            cols: 96,
            group_size: 64
        }
    );
    assert!(matches!(
        refuse(4, 32, 32),
        Unsupported::Length {
            what: "the weight",
            ..
        }
    ));
    // Int8 products need whole blocks of 32 columns and whole 8-column steps per group.
    for (cols, group, bits) in [(48, 16, 4), (36, 12, 8), (64, 4, 4)] {
        let (w, _) = random_matrix(3, cols, group, bits, 1, false);
        assert_eq!(
            w.matrix(Activations::Int8).unwrap_err(),
            Unsupported::Int8 {
                cols,
                group_size: group
            }
        );
    }
}

#[test]
fn float16_scales_are_held_as_float16() {
    // 13 rows (one panel of 16 lanes), 64 columns in groups of 32: 512 bytes of 4-bit codes
    // and 2 groups' 16 scales and 16 biases.
    let single = random_matrix(13, 64, 32, 4, 9, false).0.float();
    let half = random_matrix(13, 64, 32, 4, 9, true).0.float();
    assert_eq!(single.bytes(), 512 + 2 * 32 * 4);
    assert_eq!(half.bytes(), 512 + 2 * 32 * 2);
    // Stacked with a float32 matrix, the stack holds float32 (and the same products).
    let stacked = QuantizedMatrix::stack_rows(&[&half, &single]).unwrap();
    let x = random_input(2, 64, 8);
    let y = stacked.matmul_transposed(&x, 2);
    let (a, b) = (
        half.matmul_transposed(&x, 2),
        single.matmul_transposed(&x, 2),
    );
    for i in 0..2 {
        assert_eq!(&y[i * 26..i * 26 + 13], &a[i * 13..(i + 1) * 13]);
        assert_eq!(&y[i * 26 + 13..(i + 1) * 26], &b[i * 13..(i + 1) * 13]);
    }
}

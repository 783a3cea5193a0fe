//! The kernels against a float64 reference, and the property the scheduler relies on: an
//! output row is bit-identical whatever else is in the call.

mod common;

use common::Stream;
use seedbar_kernels::{Kernel, QuantizedMatrix, Team, Unsupported};

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
) -> (QuantizedMatrix, Vec<Vec<f64>>) {
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
    let matrix =
        QuantizedMatrix::from_mlx_affine(&words, &scales, &biases, rows, cols, group_size, bits)
            .expect("supported");
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
        for m in [1, 3, 6] {
            let x = random_input(m, cols, 99);
            for kernel in Kernel::available() {
                let y = w.matmul_transposed_with(kernel, Team::shared(), &x, m);
                for i in 0..m {
                    for n in 0..rows {
                        let exact: f64 = (0..cols)
                            .map(|k| dense[n][k] * x[i * cols + k] as f64)
                            .sum();
                        let got = y[i * rows + n] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                            "{kernel:?} {bits}-bit g{group_size}: row {i} col {n}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_kernel_gives_the_same_bits() {
    for (bits, half) in [(4, false), (8, false), (4, true), (8, true)] {
        let (w, _) = random_matrix(41, 192, 64, bits, 17, half);
        let x = random_input(10, 192, 4);
        let results: Vec<Vec<f32>> = Kernel::available()
            .into_iter()
            .map(|k| w.matmul_transposed_with(k, Team::shared(), &x, 10))
            .collect();
        assert!(
            results.windows(2).all(|r| r[0] == r[1]),
            "{bits}-bit, {half}"
        );
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
        let (w, _) = random_matrix(rows, cols, group, bits, 3, half);
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
                        "{kernel:?} {bits}-bit: row {at} of {m}"
                    );
                }
            }
        }
    }
}

#[test]
fn thread_count_does_not_change_a_result() {
    let (w, _) = random_matrix(300, 256, 32, 4, 21, false);
    let x = random_input(5, 256, 8);
    let on = |threads| w.matmul_transposed_with(Kernel::detect(), &Team::new(threads), &x, 5);
    assert_eq!(on(1), on(3));
}

#[test]
fn slicing_rows_keeps_their_values() {
    let (w, dense) = random_matrix(10, 64, 32, 4, 2, false);
    let part = w.slice_rows(4..7);
    assert_eq!(part.rows(), 3);
    for r in 0..3 {
        let got: Vec<f64> = part.dequantize_row(r).iter().map(|&v| v as f64).collect();
        for (a, b) in got.iter().zip(&dense[4 + r]) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}

#[test]
fn a_stack_of_matrices_gives_each_parts_bits() {
    // Parts that share panels in the stack, and parts of whole panels laid end to end.
    for sizes in [[9, 5, 20], [16, 32, 7]] {
        let parts: Vec<_> = sizes
            .iter()
            .zip(1..)
            .map(|(&rows, seed)| random_matrix(rows, 64, 32, 4, seed, false).0)
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
                assert_eq!(row, expected, "{sizes:?}: input row {i}");
            }
            column += part.rows();
        }
    }
    let (narrow, wide) = (
        random_matrix(4, 32, 32, 4, 4, false).0,
        random_matrix(4, 64, 32, 4, 5, false).0,
    );
    assert!(QuantizedMatrix::stack_rows(&[&wide, &narrow]).is_none());
}

#[test]
fn what_cannot_be_held_is_refused_with_the_reason() {
    let words = vec![0u32; 8];
    let one = [1.0f32];
    let refuse = |bits, group, cols| {
        QuantizedMatrix::from_mlx_affine(&words, &one, &one, 1, cols, group, bits).unwrap_err()
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
}

#[test]
fn float16_scales_are_held_as_float16() {
    // 13 rows (one panel of 16 lanes), 64 columns in groups of 32: 512 bytes of 4-bit codes
    // and 2 groups' 16 scales and 16 biases.
    let (single, _) = random_matrix(13, 64, 32, 4, 9, false);
    let (half, _) = random_matrix(13, 64, 32, 4, 9, true);
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

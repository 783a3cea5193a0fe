//! Guards the Linux MLX set-up (scripts/setup.sh): mlx-sys's build script is overridden by a
//! generated cargo config whose `OUT_DIR` points at our bindings. If that stops working the
//! build fails; these check the linked libmlx computes and that the f16/bf16 accessors the
//! x86_64 compatibility header adds behave.

use mlx_rs::{ops, ops::indexing::IndexOp, Array, Dtype};

#[test]
fn linked_mlx_computes_a_matmul() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let b = Array::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2]);
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.as_slice::<f32>(), &[19.0, 22.0, 43.0, 50.0]);
}

#[test]
fn half_precision_values_round_trip() {
    let x = Array::from_slice(&[1.5f32, -2.25, 1024.0], &[3]);
    for dtype in [Dtype::Float16, Dtype::Bfloat16] {
        let back = x.as_dtype(dtype).unwrap().as_dtype(Dtype::Float32).unwrap();
        assert_eq!(back.as_slice::<f32>(), &[1.5, -2.25, 1024.0]);
    }
    let h = x.as_dtype(Dtype::Float16).unwrap();
    let value: half::f16 = h.index(1).item_exact();
    assert_eq!(f32::from(value), -2.25);
}

#[test]
fn quantized_matmul_matches_the_dequantized_weights() {
    let w = ops::arange::<_, f32>(0.0, 64.0 * 8.0, None)
        .unwrap()
        .reshape(&[8, 64])
        .unwrap();
    let w = w.divide(Array::from_f32(100.0)).unwrap();
    let (q, s, b) = ops::quantize(&w, 32, 4).unwrap();
    let x = Array::from_slice(&vec![0.5f32; 64], &[1, 64]);
    let quantized = ops::quantized_matmul(&x, &q, &s, &b, true, 32, 4).unwrap();
    let dense = x
        .matmul(ops::dequantize(&q, &s, &b, 32, 4).unwrap().t())
        .unwrap();
    let diff = quantized
        .subtract(&dense)
        .unwrap()
        .abs()
        .unwrap()
        .max(None)
        .unwrap();
    assert!(diff.item_cast::<f32>() < 1e-3);
}

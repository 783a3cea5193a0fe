//! Products `x · wᵀ` of a few rows whose every row gets the same bits at any row count: the
//! decode steps' projections on CUDA, where cuBLAS and MLX's quantized kernels pick their
//! algorithm or tile by the row count (so a row would need zero rows padding it to a fixed
//! width, and every product would be a library call, whose launch costs more than the work
//! at a handful of rows).
//!
//! On CUDA these are Seedbar's own kernels, compiled by MLX at run time: `row_products.cu`
//! for dense weights and `row_products_quantized.cu` for MLX's affine 4- and 8-bit weights,
//! one warp per output column (or two), summing each row over its own elements in a fixed
//! order. Elsewhere (tests that run CUDA's layout on the CPU, a backend without the
//! kernels) each row is a product of its own, which is row-invariant too, and slow. So are
//! rows whose length the kernels' 16-byte loads do not divide (no model Seedbar loads has
//! one); there a row's 1-row product could also differ with its alignment in the batch
//! (MLX's gemv picks its loads by pointer alignment).
//!
//! ```no_run
//! use mlx_rs::Array;
//! let x = Array::from_slice(&[1.0f32; 16], &[2, 8]);
//! let w = Array::from_slice(&[0.5f32; 24], &[3, 8]);
//! let y = seedbar_engine::step::row_products::product(&x, &w)?; // [2, 3]
//! # Ok::<(), seedbar_engine::EngineError>(())
//! ```

use std::{
    cell::RefCell,
    ffi::{CStr, CString},
};

use mlx_rs::{ops, ops::indexing::IndexOp, Array, Dtype, Stream};

use crate::{
    error::{EngineError, Result},
    runtime::Backend,
};

/// The most rows one product takes (the kernels' largest row capacity).
pub const MAX_ROWS: i32 = 32;

/// Threads per block: four warps.
const THREADS: i32 = 128;

/// MLX's affine quantization of a `[N, K]` matrix: `weight` packs `bits`-bit values into
/// `u32` words along K, lowest bits first; `scales` and `biases` hold one value per
/// `group_size` elements (`[N, K / group_size]`).
#[derive(Debug, Clone, Copy)]
pub struct AffineQuantized<'a> {
    pub weight: &'a Array,
    pub scales: &'a Array,
    pub biases: &'a Array,
    pub group_size: i32,
    pub bits: i32,
}

/// `x · wᵀ` for `x` of `[..., K]` with at most [`MAX_ROWS`] rows and `w` of `[N, K]`:
/// `[..., N]`, each row's values independent of the other rows.
pub fn product(x: &Array, w: &Array) -> Result<Array> {
    let depth = *x.shape().last().expect("a matrix input");
    let on_kernel = depth % 8 == 0 && kernels_run(w.dtype());
    each_row(x, w.shape()[0], |matrix| {
        if on_kernel {
            DENSE.with_borrow_mut(|kernel| {
                let kernel = kernel.get_or_insert_with(|| Kernel::new(&DENSE_KERNEL));
                kernel.apply(&[&matrix.as_dtype(w.dtype())?, w], w.dtype(), &[])
            })
        } else {
            per_row(matrix, |row| Ok(row.matmul(w.t())?))
        }
    })
}

/// `x · dequantize(w)ᵀ` for `x` of `[..., K]` with at most [`MAX_ROWS`] rows: `[..., N]`,
/// each row's values independent of the other rows.
pub fn quantized_product(x: &Array, w: AffineQuantized) -> Result<Array> {
    let depth = *x.shape().last().expect("a matrix input");
    // Each lane reads 16 bytes of weights at a time: this many elements.
    let span = 128 / w.bits.max(1);
    let on_kernel = matches!(w.bits, 4 | 8)
        && depth % span == 0
        && w.group_size % span == 0
        && kernels_run(w.scales.dtype());
    each_row(x, w.weight.shape()[0], |matrix| {
        if on_kernel {
            QUANTIZED.with_borrow_mut(|kernel| {
                let kernel = kernel.get_or_insert_with(|| Kernel::new(&QUANTIZED_KERNEL));
                let x = matrix.as_dtype(w.scales.dtype())?;
                kernel.apply(
                    &[&x, w.weight, w.scales, w.biases],
                    w.scales.dtype(),
                    &[(c"BITS", w.bits), (c"GROUP", w.group_size)],
                )
            })
        } else {
            per_row(matrix, |row| {
                Ok(ops::quantized_matmul(
                    row,
                    w.weight,
                    w.scales,
                    w.biases,
                    true,
                    w.group_size,
                    w.bits,
                )?)
            })
        }
    })
}

/// Whether the kernels run a product computed in `dtype`: float types, on MLX's CUDA
/// backend.
fn kernels_run(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
        && Backend::current() == Backend::Cuda
}

/// `x` of `[..., K]` as a `[rows, K]` matrix through `product`, whose `[rows, outputs]`
/// result takes `x`'s leading shape.
fn each_row(
    x: &Array,
    outputs: i32,
    product: impl FnOnce(&Array) -> Result<Array>,
) -> Result<Array> {
    let shape = x.shape();
    let depth = *shape.last().expect("a matrix input");
    let rows = x.size() as i32 / depth.max(1);
    let y = product(&x.reshape(&[rows, depth])?)?;
    let mut out_shape = shape.to_vec();
    *out_shape.last_mut().expect("a matrix input") = outputs;
    Ok(y.reshape(&out_shape)?)
}

/// Each row of `matrix` through `product` on its own, joined: row-invariant on any backend.
fn per_row(matrix: &Array, product: impl Fn(&Array) -> Result<Array>) -> Result<Array> {
    let each = (0..matrix.shape()[0])
        .map(|r| product(&matrix.index((r..r + 1, ..))))
        .collect::<Result<Vec<_>>>()?;
    Ok(ops::concatenate(&each, 0)?)
}

/// One of the kernels: the name MLX caches it by, its body (MLX writes the signature from
/// the inputs and outputs) and its inputs' names (the output is `y`). The first input is
/// `x` and the second the weights, whose first dimension is the output's columns.
struct KernelSource {
    name: &'static str,
    body: &'static str,
    inputs: &'static [&'static str],
}

const DENSE_KERNEL: KernelSource = KernelSource {
    name: "seedbar_row_products",
    body: include_str!("row_products.cu"),
    inputs: &["x", "w"],
};

const QUANTIZED_KERNEL: KernelSource = KernelSource {
    name: "seedbar_row_products_quantized",
    body: include_str!("row_products_quantized.cu"),
    inputs: &["x", "w", "scales", "biases"],
};

thread_local! {
    /// The kernels' handles, made once per thread that runs models.
    static DENSE: RefCell<Option<Kernel>> = const { RefCell::new(None) };
    static QUANTIZED: RefCell<Option<Kernel>> = const { RefCell::new(None) };
}

/// MLX's handle on a custom kernel.
struct Kernel {
    raw: mlx_sys::mlx_fast_cuda_kernel,
}

impl Kernel {
    fn new(source: &KernelSource) -> Kernel {
        // MLX caches compiled kernels on disk by name: the name carries the source's hash,
        // so a changed kernel never loads an old build.
        let name =
            CString::new(format!("{}_{:016x}", source.name, fnv1a(source.body))).expect("no NUL");
        let body = CString::new(source.body).expect("no NUL");
        let inputs = strings(source.inputs);
        let outputs = strings(&["y"]);
        // SAFETY: every argument is a live handle or NUL-terminated string for the call.
        let raw = unsafe {
            let raw = mlx_sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                inputs,
                outputs,
                body.as_ptr(),
                c"".as_ptr(),
                true,
                0,
            );
            mlx_sys::mlx_vector_string_free(inputs);
            mlx_sys::mlx_vector_string_free(outputs);
            raw
        };
        Kernel { raw }
    }

    /// `y [M, N]` of `dtype` from `inputs` (`x [M, K]` first, then the weights of N rows),
    /// on the kernel variant sized for M rows (the variants differ in registers only, not
    /// in any row's arithmetic); `extra` adds integer template arguments.
    fn apply(&self, inputs: &[&Array], dtype: Dtype, extra: &[(&CStr, i32)]) -> Result<Array> {
        let rows = inputs[0].shape()[0];
        let outputs = inputs[1].shape()[0];
        let (max_rows, cols) = match rows {
            ..=2 => (2, 1),
            3..=8 => (8, 2),
            _ => (MAX_ROWS, 2),
        };
        let warps = (outputs + cols - 1) / cols;
        let stream = Stream::thread_local_or_default();
        // SAFETY: the kernels read their inputs within their shapes and write each element
        // of y once ([rows, outputs], guarded by `first + c < outputs` and `m < rows`); the
        // handles passed live through each call and are freed after it.
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let shape = [rows, outputs];
            let mut status =
                mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    dtype.into(),
                ) | mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, warps * 32, 1, 1)
                    | mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, THREADS, 1, 1)
                    | mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                        config,
                        c"T".as_ptr(),
                        dtype.into(),
                    );
            for (name, value) in [(c"MAX_ROWS", max_rows), (c"COLS", cols)]
                .iter()
                .chain(extra)
            {
                status |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                    config,
                    name.as_ptr(),
                    *value,
                );
            }
            let vector = mlx_sys::mlx_vector_array_new();
            for input in inputs {
                status |= mlx_sys::mlx_vector_array_append_value(vector, input.as_ptr());
            }
            let mut results = mlx_sys::mlx_vector_array_new();
            let applied = if status == 0 {
                mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut results,
                    self.raw,
                    vector,
                    config,
                    stream.as_ptr(),
                )
            } else {
                1
            };
            let mut y = mlx_sys::mlx_array_new();
            let got = applied == 0
                && mlx_sys::mlx_vector_array_size(results) == 1
                && mlx_sys::mlx_vector_array_get(&mut y, results, 0) == 0;
            mlx_sys::mlx_vector_array_free(vector);
            mlx_sys::mlx_vector_array_free(results);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            let y = Array::from_ptr(y);
            if got {
                Ok(y)
            } else {
                Err(EngineError::Mlx(
                    "MLX refused a row-product kernel's launch".to_string(),
                ))
            }
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `mlx_fast_cuda_kernel_new` and is freed once.
        unsafe { mlx_sys::mlx_fast_cuda_kernel_free(self.raw) };
    }
}

/// A `mlx_vector_string` of `names` (the caller frees it).
fn strings(names: &[&str]) -> mlx_sys::mlx_vector_string {
    // SAFETY: each CString lives through its append, which copies it.
    unsafe {
        let vector = mlx_sys::mlx_vector_string_new();
        for name in names {
            let name = CString::new(*name).expect("no NUL");
            mlx_sys::mlx_vector_string_append_value(vector, name.as_ptr());
        }
        vector
    }
}

/// FNV-1a of `text`: a stable hash across builds and platforms.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off CUDA, each row is its own product: the same bits alone and among others, and
    /// the ordinary product's values.
    #[test]
    fn a_row_gets_the_same_bits_alone_and_among_others() {
        // Fixed pseudo-random values in [-1, 1).
        let values = |n: usize, seed: u64| -> Vec<f32> {
            (0..n as u64)
                .map(|i| ((i * 2_654_435_761 + seed) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        let w = Array::from_slice(&values(24 * 64, 7), &[24, 64]);
        let x = Array::from_slice(&values(5 * 64, 3), &[5, 64]);
        let together = product(&x, &w).unwrap();
        for r in 0..5 {
            let alone = product(&x.index((r..r + 1, ..)), &w).unwrap();
            let row = together.index((r..r + 1, ..));
            assert_eq!(alone.as_slice::<f32>(), row.as_slice::<f32>(), "row {r}");
        }
        let reference = x.matmul(w.t()).unwrap();
        assert!(together.all_close(&reference, 1e-4, 1e-4, None).unwrap());
        assert_eq!(
            product(&x.reshape(&[1, 5, 64]).unwrap(), &w)
                .unwrap()
                .shape(),
            [1, 5, 24]
        );
    }

    /// The same for MLX's 4- and 8-bit weights: a row alone gets its bits among others,
    /// and MLX's quantized product's values.
    #[test]
    fn a_quantized_row_gets_the_same_bits_alone_and_among_others() {
        let values = |n: usize, seed: u64| -> Vec<f32> {
            (0..n as u64)
                .map(|i| ((i * 2_654_435_761 + seed) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        let dense = Array::from_slice(&values(24 * 128, 11), &[24, 128]);
        let x = Array::from_slice(&values(5 * 128, 5), &[1, 5, 128]);
        for bits in [4, 8] {
            let (weight, scales, biases) = ops::quantize(&dense, 64, bits).unwrap();
            let w = AffineQuantized {
                weight: &weight,
                scales: &scales,
                biases: &biases,
                group_size: 64,
                bits,
            };
            let together = quantized_product(&x, w).unwrap();
            assert_eq!(together.shape(), [1, 5, 24]);
            for r in 0..5 {
                let alone = quantized_product(&x.index((.., r..r + 1, ..)), w).unwrap();
                let row = together.index((.., r..r + 1, ..));
                assert_eq!(
                    alone.as_slice::<f32>(),
                    row.as_slice::<f32>(),
                    "{bits}-bit row {r}"
                );
            }
            let reference =
                ops::quantized_matmul(&x, &weight, &scales, &biases, true, 64, bits).unwrap();
            assert!(together.all_close(&reference, 1e-4, 1e-4, None).unwrap());
        }
    }
}

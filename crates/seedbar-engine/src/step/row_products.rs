//! Dense products `x · wᵀ` of a few rows whose every row gets the same bits at any row
//! count: the decode steps' projections on CUDA, where cuBLAS picks its algorithm by the
//! row count (so a row would need zero rows padding it to a fixed width, and every product
//! would be a cuBLAS call, whose launch costs more than the work at a handful of rows).
//!
//! On CUDA this is Seedbar's own kernel (`row_products.cu`, compiled by MLX at run time):
//! one warp per output column (or two), summing each row over its own elements in a fixed
//! order. Elsewhere (tests that run CUDA's layout on the CPU, a backend without the kernel)
//! each row is a product of its own, which is row-invariant too, and slow. So are rows
//! whose length is not a multiple of 8 on CUDA (no model Seedbar loads has one); there a
//! row's 1-row product could also differ with its alignment in the batch (MLX's gemv picks
//! its loads by pointer alignment).
//!
//! ```no_run
//! use mlx_rs::Array;
//! let x = Array::from_slice(&[1.0f32; 16], &[2, 8]);
//! let w = Array::from_slice(&[0.5f32; 24], &[3, 8]);
//! let y = seedbar_engine::step::row_products::product(&x, &w)?; // [2, 3]
//! # Ok::<(), seedbar_engine::EngineError>(())
//! ```

use std::{cell::RefCell, ffi::CString};

use mlx_rs::{ops, ops::indexing::IndexOp, Array, Dtype, Stream};

use crate::{
    error::{EngineError, Result},
    runtime::Backend,
};

/// The most rows one product takes (the kernel's largest row capacity).
pub const MAX_ROWS: i32 = 32;

/// The kernel's body; MLX writes its signature from the inputs and outputs.
const SOURCE: &str = include_str!("row_products.cu");

/// Threads per block: four warps.
const THREADS: i32 = 128;

/// `x · wᵀ` for `x` of `[..., K]` with at most [`MAX_ROWS`] rows and `w` of `[N, K]`:
/// `[..., N]`, each row's values independent of the other rows.
pub fn product(x: &Array, w: &Array) -> Result<Array> {
    let shape = x.shape();
    let depth = *shape.last().expect("a matrix input");
    let rows = x.size() as i32 / depth.max(1);
    let outputs = w.shape()[0];
    let matrix = x.reshape(&[rows, depth])?;
    let y = if cuda_kernel_applies(w.dtype(), depth) {
        KERNEL
            .with_borrow_mut(|kernel| kernel.get_or_insert_with(RowKernel::new).apply(&matrix, w))?
    } else {
        let each = (0..rows)
            .map(|r| Ok(matrix.index((r..r + 1, ..)).matmul(w.t())?))
            .collect::<Result<Vec<_>>>()?;
        ops::concatenate(&each, 0)?
    };
    let mut out_shape = shape.to_vec();
    *out_shape.last_mut().expect("a matrix input") = outputs;
    Ok(y.reshape(&out_shape)?)
}

/// Whether the CUDA kernel runs this product: on MLX's CUDA backend, for float weights
/// whose rows split into 16-byte loads.
fn cuda_kernel_applies(dtype: Dtype, depth: i32) -> bool {
    matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
        && depth % 8 == 0
        && Backend::current() == Backend::Cuda
}

thread_local! {
    /// The kernel handle, made once per thread that runs models.
    static KERNEL: RefCell<Option<RowKernel>> = const { RefCell::new(None) };
}

/// MLX's handle on the custom kernel.
struct RowKernel {
    raw: mlx_sys::mlx_fast_cuda_kernel,
}

impl RowKernel {
    fn new() -> RowKernel {
        // MLX caches compiled kernels on disk by name: the name carries the source's hash,
        // so a changed kernel never loads an old build.
        let name =
            CString::new(format!("seedbar_row_products_{:016x}", fnv1a(SOURCE))).expect("no NUL");
        let source = CString::new(SOURCE).expect("no NUL");
        let inputs = strings(&["x", "w"]);
        let outputs = strings(&["y"]);
        // SAFETY: every argument is a live handle or NUL-terminated string for the call.
        let raw = unsafe {
            let raw = mlx_sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                inputs,
                outputs,
                source.as_ptr(),
                c"".as_ptr(),
                true,
                0,
            );
            mlx_sys::mlx_vector_string_free(inputs);
            mlx_sys::mlx_vector_string_free(outputs);
            raw
        };
        RowKernel { raw }
    }

    /// `x [M, K] · w [N, K]ᵀ` on the kernel variant sized for M rows (the variants differ
    /// in registers only, not in any row's arithmetic).
    fn apply(&self, x: &Array, w: &Array) -> Result<Array> {
        let rows = x.shape()[0];
        let outputs = w.shape()[0];
        let (max_rows, cols) = match rows {
            ..=2 => (2, 1),
            3..=8 => (8, 2),
            _ => (MAX_ROWS, 2),
        };
        let warps = (outputs + cols - 1) / cols;
        let x = x.as_dtype(w.dtype())?;
        let stream = Stream::thread_local_or_default();
        // SAFETY: the kernel reads x and w within their shapes and writes each element of
        // y once ([rows, outputs], guarded by `first + c < outputs` and `m < rows`); the
        // handles passed live through each call and are freed after it.
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let shape = [rows, outputs];
            let status =
                mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    w.dtype().into(),
                ) | mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, warps * 32, 1, 1)
                    | mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, THREADS, 1, 1)
                    | mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                        config,
                        c"T".as_ptr(),
                        w.dtype().into(),
                    )
                    | mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                        config,
                        c"MAX_ROWS".as_ptr(),
                        max_rows,
                    )
                    | mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                        config,
                        c"COLS".as_ptr(),
                        cols,
                    );
            let inputs = mlx_sys::mlx_vector_array_new();
            let appended = mlx_sys::mlx_vector_array_append_value(inputs, x.as_ptr())
                | mlx_sys::mlx_vector_array_append_value(inputs, w.as_ptr());
            let mut results = mlx_sys::mlx_vector_array_new();
            let applied = if status | appended == 0 {
                mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut results,
                    self.raw,
                    inputs,
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
            mlx_sys::mlx_vector_array_free(inputs);
            mlx_sys::mlx_vector_array_free(results);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            let y = Array::from_ptr(y);
            if got {
                Ok(y)
            } else {
                Err(EngineError::Mlx(
                    "MLX refused the row-product kernel's launch".to_string(),
                ))
            }
        }
    }
}

impl Drop for RowKernel {
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
}

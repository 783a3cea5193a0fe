//! Products `x · wᵀ` of a few rows whose every row gets the same bits at any row count: the
//! decode steps' projections on CUDA, where cuBLAS and MLX's quantized kernels pick their
//! algorithm or tile by the row count (so a row would need zero rows padding it to a fixed
//! width, and every product would be a library call, whose launch costs more than the work
//! at a handful of rows).
//!
//! On CUDA these are Seedbar's own kernels, compiled by MLX at run time. Dense weights
//! computed in 16 bits on a GPU with tensor cores for them (sm_80 on) run
//! `row_products_mma.cu` (its header `row_products_mma.cuh`): 16-row tiles of `mma.sync`,
//! rows past the last zeros, each output's sum in an order fixed by K alone, so 32 rows cost
//! about what one does (the weights are read once); it checks itself on the GPU before its
//! first use. Other dense products run `row_products.cu`, and MLX's affine 4- and 8-bit
//! weights `row_products_quantized.cu`, on CUDA cores: one warp per output column (or two),
//! summing each row over its own elements in a fixed order. Which kernel a product takes
//! depends on its weights, dtype and device, never on its row count. Elsewhere (tests that run CUDA's layout on
//! the CPU, a backend without the kernels) each row is a product of its own, which is
//! row-invariant too, and slow. So are rows whose length the kernels' 16-byte loads do not
//! divide (no model Seedbar loads has one); there a row's 1-row product could also differ
//! with its alignment in the batch (MLX's gemv picks its loads by pointer alignment).
//!
//! ```no_run
//! use mlx_rs::Array;
//! let x = Array::from_slice(&[1.0f32; 16], &[2, 8]);
//! let w = Array::from_slice(&[0.5f32; 24], &[3, 8]);
//! let y = seedbar_engine::step::row_products::product(&x, &w)?; // [2, 3]
//! # Ok::<(), seedbar_engine::EngineError>(())
//! ```

use std::{ffi::CStr, sync::OnceLock};

use mlx_rs::{ops, ops::indexing::IndexOp, Array, Dtype};

use crate::{
    cuda_kernel::{self, KernelSource, Launch},
    error::Result,
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
    let kernel = if depth % 32 == 0 && tensor_cores_take(w.dtype()) {
        Some(&DENSE_MMA_KERNEL)
    } else {
        (depth % 8 == 0 && dense_kernel_runs(w.dtype())).then_some(&DENSE_KERNEL)
    };
    let shape = output_shape(x, w.shape()[0]);
    match kernel {
        Some(kernel) => run(
            kernel,
            &[&x.as_dtype(w.dtype())?, w],
            w.dtype(),
            &[],
            &shape,
        ),
        None => Ok(per_row(x, |row| Ok(row.matmul(w.t())?))?.reshape(&shape)?),
    }
}

/// `x · dequantize(w)ᵀ` for `x` of `[..., K]` with at most [`MAX_ROWS`] rows: `[..., N]`,
/// each row's values independent of the other rows.
pub fn quantized_product(x: &Array, w: AffineQuantized) -> Result<Array> {
    let depth = *x.shape().last().expect("a matrix input");
    // Each lane reads 16 bytes of weights at a time: this many elements, within a group.
    let span = 128 / w.bits.max(1);
    let fits = matches!(w.bits, 4 | 8) && w.group_size % span == 0;
    let dtype = w.scales.dtype();
    let runs = fits && depth % span == 0 && quantized_kernel_runs(dtype);
    let shape = output_shape(x, w.weight.shape()[0]);
    if runs {
        return run(
            &QUANTIZED_KERNEL,
            &[&x.as_dtype(dtype)?, w.weight, w.scales, w.biases],
            dtype,
            &[(c"BITS", w.bits), (c"GROUP", w.group_size)],
            &shape,
        );
    }
    Ok(per_row(x, |row| {
        Ok(ops::quantized_matmul(
            row,
            w.weight,
            w.scales,
            w.biases,
            true,
            w.group_size,
            w.bits,
        )?)
    })?
    .reshape(&shape)?)
}

/// The product's shape for `x` of `[..., K]`: `x`'s leading axes, then `outputs` (the
/// kernels read `x` with its leading axes and write this shape, so neither side is
/// reshaped).
fn output_shape(x: &Array, outputs: i32) -> Vec<i32> {
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("a matrix input") = outputs;
    shape
}

/// Whether the kernels run a product computed in `dtype`: float types, on MLX's CUDA
/// backend.
fn kernels_run(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
        && Backend::current() == Backend::Cuda
}

/// Whether the CUDA-core dense kernel runs a product in `dtype` (it passed its check).
fn dense_kernel_runs(dtype: Dtype) -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    kernels_run(dtype)
        && *CHECKED.get_or_init(|| {
            cuda_kernel::passes("the CUDA-core row products", || {
                check_dense(&DENSE_KERNEL, Dtype::Float32)
            })
        })
}

/// Whether the quantized kernel runs a product whose scales are `dtype` (it passed its
/// check).
fn quantized_kernel_runs(dtype: Dtype) -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    kernels_run(dtype)
        && *CHECKED.get_or_init(|| {
            cuda_kernel::passes("the quantized row products", || {
                let dense = cuda_kernel::check_values(&[96, 512], 7, Dtype::Bfloat16)?;
                let (weight, scales, biases) = ops::quantize(&dense, 64, 4)?;
                check_rows(
                    |x| {
                        run(
                            &QUANTIZED_KERNEL,
                            &[x, &weight, &scales, &biases],
                            Dtype::Bfloat16,
                            &[(c"BITS", 4), (c"GROUP", 64)],
                            &output_shape(x, 96),
                        )
                    },
                    |x| {
                        Ok(ops::quantized_matmul(
                            x, &weight, &scales, &biases, true, 64, 4,
                        )?)
                    },
                    Dtype::Bfloat16,
                )
            })
        })
}

/// Whether the tensor-core kernels run a product computed in `dtype`: 16-bit floats, on a
/// CUDA GPU of compute capability 8 or more where they pass their check.
fn tensor_cores_take(dtype: Dtype) -> bool {
    static TENSOR_CORES: OnceLock<bool> = OnceLock::new();
    matches!(dtype, Dtype::Float16 | Dtype::Bfloat16)
        && kernels_run(dtype)
        && *TENSOR_CORES.get_or_init(|| {
            compute_capability_major().is_some_and(|m| m >= 8)
                && cuda_kernel::passes("the tensor-core row products", || {
                    check_dense(&DENSE_MMA_KERNEL, Dtype::Bfloat16)
                })
        })
}

/// [`check_rows`] for a dense kernel computing in `dtype`, against MLX's matmul.
fn check_dense(kernel: &'static RowKernel, dtype: Dtype) -> Result<bool> {
    let w = cuda_kernel::check_values(&[96, 512], 7, dtype)?;
    check_rows(
        |x| run(kernel, &[x, &w], dtype, &[], &output_shape(x, 96)),
        |x| Ok(x.matmul(w.t())?),
        dtype,
    )
}

/// A kernel's product on this GPU (`kernel`, of 96 outputs, over `x` of `[1, rows, 512]`
/// in `dtype`): a row of 19 gets its bits alone, and every row MLX's product's values
/// (`reference`) within `dtype`'s rounding.
fn check_rows(
    kernel: impl Fn(&Array) -> Result<Array>,
    reference: impl Fn(&Array) -> Result<Array>,
    dtype: Dtype,
) -> Result<bool> {
    let x = cuda_kernel::check_values(&[1, 19, 512], 3, dtype)?;
    let together = kernel(&x)?;
    let alone = kernel(&x.index((.., 5..6, ..)))?;
    let same = together.index((.., 5..6, ..)).eq_values(&alone)?;
    Ok(same && together.all_close(reference(&x)?, 2e-2, 5e-2, None)?)
}

/// The default GPU's compute capability (major), as MLX's device information has it.
fn compute_capability_major() -> Option<usize> {
    // SAFETY: the device and its information are live handles through the calls and freed
    // after them; the key is NUL-terminated.
    unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let mut major = 0usize;
        let read = mlx_sys::mlx_device_info_get(&mut info, device) == 0
            && mlx_sys::mlx_device_info_get_size(
                &mut major,
                info,
                c"compute_capability_major".as_ptr(),
            ) == 0;
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(device);
        read.then_some(major)
    }
}

/// Each row of `x` (`[..., K]`) through `product` on its own, joined as `[rows, N]`:
/// row-invariant on any backend.
fn per_row(x: &Array, product: impl Fn(&Array) -> Result<Array>) -> Result<Array> {
    let depth = *x.shape().last().expect("a matrix input");
    let matrix = x.reshape(&[-1, depth])?;
    let each = (0..matrix.shape()[0])
        .map(|r| product(&matrix.index((r..r + 1, ..))))
        .collect::<Result<Vec<_>>>()?;
    Ok(ops::concatenate(&each, 0)?)
}

/// A row kernel: its source and how its threads cover the output.
struct RowKernel {
    source: KernelSource,
    tiles: Tiles,
}

/// How a kernel's threads cover `y [M, N]`.
#[derive(Clone, Copy)]
enum Tiles {
    /// A warp per `COLS` columns for every row, in variants for up to `MAX_ROWS` rows (2, 8
    /// or 32: they differ in registers only, not in any row's arithmetic).
    WarpColumns,
    /// A block of [`THREADS`] per `8 · NT` columns, in `MT` tiles of 16 rows (1 or 2: the
    /// tiles change who computes an output, not how).
    Mma,
}

impl Tiles {
    /// The template arguments and the threads of a launch over `rows × outputs`.
    fn launch(self, rows: i32, outputs: i32) -> ([(&'static CStr, i32); 2], i32) {
        match self {
            Tiles::WarpColumns => {
                let (max_rows, cols) = match rows {
                    ..=2 => (2, 1),
                    3..=8 => (8, 2),
                    _ => (MAX_ROWS, 2),
                };
                let warps = (outputs + cols - 1) / cols;
                ([(c"MAX_ROWS", max_rows), (c"COLS", cols)], warps * 32)
            }
            Tiles::Mma => {
                let columns = 8 * MMA_N_TILES;
                let blocks = (outputs + columns - 1) / columns;
                let m_tiles = (rows + 15) / 16;
                ([(c"MT", m_tiles), (c"NT", MMA_N_TILES)], blocks * THREADS)
            }
        }
    }
}

/// The tensor-core kernel's n-tiles of 8 columns per block: measured on an H100 against 1
/// and 2, as fast at one row and the fastest at 16 and 32 (`scripts/gpu_row_kernels.py`).
const MMA_N_TILES: i32 = 4;

const MMA_HEADER: &str = include_str!("row_products_mma.cuh");

static DENSE_KERNEL: RowKernel = RowKernel {
    source: KernelSource {
        name: "seedbar_row_products",
        body: include_str!("row_products.cu"),
        header: "",
        inputs: &["x", "w"],
    },
    tiles: Tiles::WarpColumns,
};

static QUANTIZED_KERNEL: RowKernel = RowKernel {
    source: KernelSource {
        name: "seedbar_row_products_quantized",
        body: include_str!("row_products_quantized.cu"),
        header: "",
        inputs: &["x", "w", "scales", "biases"],
    },
    tiles: Tiles::WarpColumns,
};

static DENSE_MMA_KERNEL: RowKernel = RowKernel {
    source: KernelSource {
        name: "seedbar_row_products_mma",
        body: include_str!("row_products_mma.cu"),
        header: MMA_HEADER,
        inputs: &["x", "w"],
    },
    tiles: Tiles::Mma,
};

/// `y [M, N]` of `dtype`, shaped `shape` (any shape of `M·N` elements, row by row), from
/// `inputs` (`x [..., K]` of M rows first, then the weights of N rows) through `kernel`, on
/// its variant for M rows (see [`Tiles`]); `extra` adds integer template arguments. The
/// kernels read their inputs within their shapes and write each element of `y` once.
fn run(
    kernel: &'static RowKernel,
    inputs: &[&Array],
    dtype: Dtype,
    extra: &[(&'static CStr, i32)],
    shape: &[i32],
) -> Result<Array> {
    let depth = *inputs[0].shape().last().expect("a matrix input");
    let rows = inputs[0].size() as i32 / depth.max(1);
    let outputs = inputs[1].shape()[0];
    debug_assert_eq!(shape.iter().product::<i32>(), rows * outputs);
    let (variant, threads) = kernel.tiles.launch(rows, outputs);
    let template: Vec<(&CStr, i32)> = variant.iter().chain(extra).copied().collect();
    let launch = Launch {
        shape,
        dtype,
        threads,
        block: THREADS,
        template: &template,
    };
    cuda_kernel::launch(&kernel.source, inputs, launch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off CUDA, each row is its own product: the same bits alone and among others, and
    /// the ordinary product's values.
    #[test]
    fn a_row_gets_the_same_bits_alone_and_among_others() {
        let values = |shape: &[i32], seed| cuda_kernel::check_values(shape, seed, Dtype::Float32);
        let w = values(&[24, 64], 7).unwrap();
        let x = values(&[5, 64], 3).unwrap();
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
        let values = |shape: &[i32], seed| cuda_kernel::check_values(shape, seed, Dtype::Float32);
        let dense = values(&[24, 128], 11).unwrap();
        let x = values(&[1, 5, 128], 5).unwrap();
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

//! Seedbar's own CUDA kernels as MLX runs them (`mlx.fast.cuda_kernel`): a kernel's source
//! is a body (MLX writes the signature from the inputs and the output) and a header; MLX
//! compiles it at run time on first use, caches the build on disk by a name that carries the
//! source's hash, and launches it on the thread's stream. The step's row products
//! (`step::row_products`) and pooled decode attention (`step::pooled_attention`) and the
//! keyed draw (`sampling::device_draw`) are such kernels.

use std::{
    cell::RefCell,
    collections::HashMap,
    ffi::{CStr, CString},
};

use mlx_rs::{Array, Dtype, Stream};

use crate::error::{EngineError, Result};

/// One kernel's source: the name MLX caches it by, its body and header, and its inputs'
/// names (the output is `y`; the dtype template argument `T` is the output's).
pub struct KernelSource {
    pub name: &'static str,
    pub body: &'static str,
    pub header: &'static str,
    pub inputs: &'static [&'static str],
}

/// How one launch runs: its output's shape and dtype, its threads in blocks of `block`
/// and its integer template arguments.
pub struct Launch<'a> {
    pub shape: &'a [i32],
    pub dtype: Dtype,
    pub threads: i32,
    pub block: i32,
    pub template: &'a [(&'a CStr, i32)],
}

thread_local! {
    /// The kernels' handles by name, made once per thread that runs models.
    static KERNELS: RefCell<HashMap<&'static str, Kernel>> = RefCell::new(HashMap::new());
}

/// `source`'s kernel over `inputs` as `launch` says: its output, lazy.
pub fn launch(source: &'static KernelSource, inputs: &[&Array], launch: Launch) -> Result<Array> {
    KERNELS.with_borrow_mut(|kernels| {
        kernels
            .entry(source.name)
            .or_insert_with(|| Kernel::new(source))
            .apply(inputs, &launch)
            .ok_or_else(|| EngineError::Mlx(format!("MLX refused the {} kernel", source.name)))
    })
}

/// MLX's handle on a custom kernel.
struct Kernel {
    raw: mlx_sys::mlx_fast_cuda_kernel,
}

impl Kernel {
    fn new(source: &KernelSource) -> Kernel {
        // The name carries the source's hash, so a changed kernel never loads an old build.
        let (body, header) = (compact(source.body), compact(source.header));
        let hash = fnv1a(&body) ^ fnv1a(&header).rotate_left(1);
        let name = CString::new(format!("{}_{hash:016x}", source.name)).expect("no NUL");
        let body = CString::new(body).expect("no NUL");
        let header = CString::new(header).expect("no NUL");
        let inputs = strings(source.inputs);
        let outputs = strings(&["y"]);
        // SAFETY: every argument is a live handle or NUL-terminated string for the call.
        let raw = unsafe {
            let raw = mlx_sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                inputs,
                outputs,
                body.as_ptr(),
                header.as_ptr(),
                true,
                0,
            );
            mlx_sys::mlx_vector_string_free(inputs);
            mlx_sys::mlx_vector_string_free(outputs);
            raw
        };
        Kernel { raw }
    }

    /// The kernel's output over `inputs`, or `None` where MLX refused the launch.
    fn apply(&self, inputs: &[&Array], launch: &Launch) -> Option<Array> {
        let stream = Stream::thread_local_or_default();
        // SAFETY: the handles passed live through each call and are freed after it; what the
        // kernel reads and writes within its inputs' and output's shapes is its source's
        // contract (each source says it).
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let dtype = launch.dtype.into();
            let shape = launch.shape;
            let mut status =
                mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    dtype,
                ) | mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, launch.threads, 1, 1)
                    | mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
                        config,
                        launch.block,
                        1,
                        1,
                    )
                    | mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                        config,
                        c"T".as_ptr(),
                        dtype,
                    );
            for (name, value) in launch.template {
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
            let applied = status == 0
                && mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut results,
                    self.raw,
                    vector,
                    config,
                    stream.as_ptr(),
                ) == 0;
            let mut y = mlx_sys::mlx_array_new();
            let got = applied
                && mlx_sys::mlx_vector_array_size(results) == 1
                && mlx_sys::mlx_vector_array_get(&mut y, results, 0) == 0;
            mlx_sys::mlx_vector_array_free(vector);
            mlx_sys::mlx_vector_array_free(results);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            let y = Array::from_ptr(y);
            got.then_some(y)
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

/// `source` without its comments, indentation and blank lines: the text MLX copies into the
/// kernel's full source and hashes at every launch it builds and runs (a few microseconds
/// of host time a launch that grow with the text). Lines stay lines (the preprocessor's
/// need them); string literals are kept whole.
fn compact(source: &str) -> String {
    source
        .lines()
        .map(|line| code_of(line).trim())
        .filter(|code| !code.is_empty())
        .fold(String::with_capacity(source.len()), |mut out, code| {
            out.push_str(code);
            out.push('\n');
            out
        })
}

/// `line` up to its `//` comment, if any outside a string literal.
fn code_of(line: &str) -> &str {
    let mut in_string = false;
    let mut previous = 0u8;
    for (i, &b) in line.as_bytes().iter().enumerate() {
        match b {
            b'"' if previous != b'\\' => in_string = !in_string,
            b'/' if !in_string && previous == b'/' => return &line[..i - 1],
            _ => {}
        }
        previous = b;
    }
    line
}

/// FNV-1a of `text`: a stable hash across builds and platforms.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether `check` passes: a kernel's check on this GPU, run once before its first use (a
/// row's bits alone and among others, its values within float tolerance of MLX's own op).
/// A kernel that fails it, or errs, is logged, and its caller runs without it.
pub fn passes(what: &str, check: impl FnOnce() -> Result<bool>) -> bool {
    match check() {
        Ok(true) => true,
        Ok(false) => {
            tracing::error!("{what} disagree with MLX on this GPU: running without them");
            false
        }
        Err(e) => {
            tracing::error!(error = %e, "{what} failed on this GPU: running without them");
            false
        }
    }
}

/// Fixed pseudo-random values in [-1, 1) as a `shape` array of `dtype`: the data of the
/// kernels' checks on a GPU and of the row products' tests.
pub fn check_values(shape: &[i32], seed: u64, dtype: Dtype) -> Result<Array> {
    let n = shape.iter().product::<i32>() as u64;
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 2_654_435_761 + seed) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    Ok(Array::from_slice(&values, shape).as_dtype(dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compact_source_keeps_code_and_strings_and_drops_comments() {
        let source = "// About the kernel.\n\n  const int x = 1;  // one\n  asm(\"a // b\\\" c\"); // call\n#pragma unroll\n";
        assert_eq!(
            compact(source),
            "const int x = 1;\nasm(\"a // b\\\" c\");\n#pragma unroll\n"
        );
        for kernel in [
            include_str!("step/pooled_attention.cu"),
            include_str!("step/row_products_mma.cuh"),
            include_str!("sampling/device_draw.cu"),
        ] {
            let compacted = compact(kernel);
            assert!(
                compacted.len() < kernel.len() * 3 / 4,
                "comments and indentation go"
            );
            assert!(!compacted.contains("//"), "no comment is left");
        }
    }
}

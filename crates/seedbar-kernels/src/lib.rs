//! CPU kernels whose every output row is **bit-identical whatever else is in the call**: the
//! number of rows, a row's place among them, the thread that runs it, or the x86 CPU's
//! instruction set. The scheduler relies on this to batch seeded rows on the CPU without
//! moving their numbers (a BLAS picks tail kernels and reduction splits by row count; these
//! never do).
//!
//! - [`quantized`]: matrix products `x · Wᵀ` with 2- to 8-bit affine-quantized weights
//!   ([`QuantizedMatrix`]), each output one fused multiply-add chain over the columns, over
//!   the input as it is or rounded to int8 per block ([`Activations`]).
//! - [`attention`]: a row's queries over its own keys and values ([`QueryAttention`]),
//!   each query head computed as it is alone, however many queries run together.
//! - [`team`]: the threads that share a step's loops ([`Team`]), spinning between them.
//!
//! Each has an AVX-512, an AVX2 and a portable form that agree bit for bit ([`Kernel`]).
//!
//! ```
//! use seedbar_kernels::{Activations, MlxAffine, QuantizedMatrix};
//!
//! // One row of 32 columns at 4 bits in MLX's packing (8 nibbles per u32, low first):
//! // every q is 3, so with scale 0.5 and bias -1 every weight is 0.5.
//! let words = vec![0x3333_3333u32; 4];
//! let mlx = MlxAffine {
//!     words: &words,
//!     scales: &[0.5],
//!     biases: &[-1.0],
//!     rows: 1,
//!     cols: 32,
//!     group_size: 32,
//!     bits: 4,
//! };
//! let x = vec![2.0f32; 32];
//! for activations in [Activations::Float, Activations::Int8] {
//!     let w = QuantizedMatrix::from_mlx_affine(mlx, activations).unwrap();
//!     assert_eq!(w.matmul_transposed(&x, 1), vec![32.0]);
//! }
//! ```

pub mod attention;
pub mod quantized;
pub mod team;

pub use attention::{Kv, QueryAttention};
pub use quantized::{Activations, MlxAffine, QuantizedMatrix, Unsupported, PANEL};
pub use team::Team;

/// One instruction set's kernels (every kernel of the crate has each form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Avx512,
    Avx2,
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs (decided once per process).
    pub fn detect() -> Kernel {
        static DETECTED: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| Kernel::available()[0])
    }

    /// Every kernel this CPU can run, fastest first.
    pub fn available() -> Vec<Kernel> {
        [Kernel::Avx512, Kernel::Avx2, Kernel::Portable]
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    pub fn is_available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            Kernel::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

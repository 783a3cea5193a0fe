//! Running one step over many rows, apart from the models' math. The entry point is
//! [`Batch`] (`batch`): it lays a step's rows out and runs a model's [`Forward`] pass over
//! them. Inside: how the rows' tokens form matmul groups and attention calls (`plan`,
//! chosen per backend for batch invariance), where their keys and values live
//! (`kv_cache`: each row's own cache and the GPU decode pool), CUDA's row kernels for
//! dense and quantized products (`row_products`) and its per-query decode attention
//! (`pooled_attention`), both launched through `crate::cuda_kernel`, the rows' tokens in and
//! positions out of the matmul groups (`groups`), where each token sits for RoPE
//! (`positions`: a multimodal-RoPE model's image grids), and how they attend (`attention`).
//! A model's decoder is math: each layer hands its queries, keys and values to `attention`.

pub mod attention;
pub mod batch;
pub mod groups;
pub mod kv_cache;
pub mod plan;
mod pooled_attention;
pub mod positions;
pub mod row_products;

pub use batch::{Batch, Forward, StepInput};
pub use groups::{Embedded, Logits, StepTokens};
pub use positions::{ImageGrid, RowPositions};

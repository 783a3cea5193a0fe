//! Model architectures: one file each on the shared decoder in `decoder.rs`.

mod activation;
pub mod decoder;
pub(crate) mod gemma3;
mod host;
mod llama;
mod mistral;
mod mixtral;
mod moe;
mod phi3;
mod qwen2;
pub(crate) mod qwen2_vl;
mod qwen3;
mod qwen3_moe;
pub(crate) mod siglip;
mod smollm3;

pub use decoder::Transformer;

use crate::{
    config::{Architecture, ModelConfig},
    error::Result,
    weights::{LoadOptions, WeightMap},
};

/// Build the transformer `config` describes from `weights` (Hugging Face names).
pub fn build(
    config: ModelConfig,
    weights: &mut WeightMap,
    options: LoadOptions,
) -> Result<Transformer> {
    let dtype = options.compute_dtype;
    match config.architecture()? {
        Architecture::Gemma2 => gemma3::build(gemma3::Generation::Gemma2, config, weights, dtype),
        Architecture::Gemma3Text => {
            gemma3::build(gemma3::Generation::Gemma3, config, weights, dtype)
        }
        Architecture::Llama => llama::build(config, weights, dtype),
        Architecture::Mistral => mistral::build(config, weights, dtype),
        Architecture::Mixtral => mixtral::build(config, weights, dtype),
        Architecture::Phi3 => phi3::build(config, weights, dtype),
        Architecture::Qwen2 => qwen2::build(config, weights, dtype),
        Architecture::Qwen3 => qwen3::build(config, weights, dtype),
        Architecture::Qwen3Moe => qwen3_moe::build(config, weights, dtype),
        Architecture::SmolLm3 => smollm3::build(config, weights, dtype),
    }
}

/// A 4×4 picture for the towers' patch-order tests: each value is `channel · 100 + row · 10 +
/// column`, so a patch row shows where each of its values came from.
#[cfg(test)]
fn numbered_pixels() -> seedbar_images::Pixels {
    let data = (0..3)
        .flat_map(|c| (0..4).flat_map(move |y| (0..4).map(move |x| (c * 100 + y * 10 + x) as f32)))
        .collect();
    seedbar_images::Pixels {
        height: 4,
        width: 4,
        data,
    }
}

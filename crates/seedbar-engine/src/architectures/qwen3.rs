//! Qwen3: the Llama block with per-head RMS norms on queries and keys, no q/k/v biases.

use mlx_rs::Dtype;

use super::decoder::{Rope, Transformer, Variant};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let rope = Rope::standard(&config);
    let variant = Variant {
        qk_norm: true,
        ..Variant::default()
    };
    Transformer::load(config, variant, rope, weights, dtype)
}

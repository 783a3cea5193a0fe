//! Qwen2 / Qwen2.5: the Llama block with biases on the q, k and v projections.

use mlx_rs::Dtype;

use super::decoder::{Rope, Transformer, Variant};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let rope = Rope::standard(&config);
    let variant = Variant {
        qkv_bias: true,
        ..Variant::default()
    };
    Transformer::load(config, variant, rope, weights, dtype)
}

//! Mistral: the Llama block with grouped-query attention and its own defaults.
//! Sliding-window attention is not applied: contexts stay within the window Seedbar serves.

use mlx_rs::Dtype;

use super::base::{Rope, Transformer, Variant};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let rope = Rope::standard(&config);
    Transformer::load(config, Variant::default(), rope, weights, dtype)
}

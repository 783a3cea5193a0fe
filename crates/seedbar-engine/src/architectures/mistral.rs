//! Mistral: the Llama block with grouped-query attention and its own defaults, and the
//! sliding window of `sliding_window` positions on every layer when the config sets one
//! (Mistral 7B v0.1; later versions leave it null).

use mlx_rs::Dtype;
use serde::Deserialize;

use super::decoder::{LayerAttention, Rope, Transformer, Variant};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

/// The Mistral settings of `config.json` beyond the shared ones.
#[derive(Deserialize)]
struct Params {
    sliding_window: Option<i32>,
}

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let p: Params = config.params()?;
    let layer = LayerAttention {
        rope: Some(Rope::standard(&config)),
        window: p.sliding_window,
    };
    let layers = vec![layer; config.num_hidden_layers as usize];
    Transformer::load_layers(config, Variant::default(), layers, weights, dtype)
}

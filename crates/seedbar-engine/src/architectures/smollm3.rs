//! SmolLM3: the Llama block with RoPE left out of some layers (NoPE), as `no_rope_layers`
//! says (1: rotate, 0: not), by default every fourth layer.

use mlx_rs::Dtype;
use serde::Deserialize;

use super::decoder::{LayerAttention, Transformer, Variant};
use crate::{
    config::ModelConfig,
    error::{EngineError, Result},
    weights::WeightMap,
};

/// The SmolLM3 settings of `config.json` beyond the shared ones.
#[derive(Deserialize)]
struct Params {
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
}

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let p: Params = config.params()?;
    let layers = config.num_hidden_layers as usize;
    let interval = p.no_rope_layer_interval.unwrap_or(4);
    let uses_rope: Vec<bool> = match p.no_rope_layers {
        Some(flags) if flags.len() == layers => flags.iter().map(|&f| f != 0).collect(),
        Some(_) => {
            return Err(EngineError::bad_file(
                "config.json",
                format!("no_rope_layers needs one entry per layer ({layers})"),
            ))
        }
        None => (0..layers).map(|i| (i + 1) % interval != 0).collect(),
    };
    let rope = super::llama::rope(&config);
    let positions = uses_rope
        .into_iter()
        .map(|r| LayerAttention {
            rope: r.then(|| rope.clone()),
            window: None,
        })
        .collect();
    Transformer::load_layers(config, Variant::default(), positions, weights, dtype)
}

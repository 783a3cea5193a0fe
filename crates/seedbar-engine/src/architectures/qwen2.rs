//! Qwen2 / Qwen2.5: the Llama block with biases on the q, k and v projections. Qwen2.5-VL's
//! decoder is this block with multimodal RoPE: `mrope_section` splits the rotated pairs
//! into those turned by a token's time, row and column positions (`step::positions`).

use mlx_rs::Dtype;

use super::decoder::{Rope, Transformer, Variant};
use crate::{
    config::ModelConfig,
    error::{EngineError, Result},
    weights::WeightMap,
};

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let rope = Rope {
        sections: sections(&config)?,
        ..Rope::standard(&config)
    };
    let variant = Variant {
        qkv_bias: true,
        ..Variant::default()
    };
    Transformer::load(config, variant, rope, weights, dtype)
}

/// `mrope_section` (pairs turned by time, row, column), at most the rotated pairs.
fn sections(config: &ModelConfig) -> Result<Option<[usize; 3]>> {
    let Some(value) = config.extra.get("mrope_section").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let pairs = (config.head_dim() / 2) as usize;
    match serde_json::from_value::<[usize; 3]>(value.clone()) {
        Ok(s) if s.iter().sum::<usize>() <= pairs => Ok(Some(s)),
        _ => Err(EngineError::bad_file(
            "config.json",
            format!("mrope_section {value} must be three counts of at most {pairs} rotated pairs in all"),
        )),
    }
}

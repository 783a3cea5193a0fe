//! Phi-3 / Phi-4-mini: the Llama block with fused `qkv_proj` and `gate_up_proj` weights
//! (split into rows at load), partial rotary dimensions, and long-rope scaling.
//!
//! Long-rope always uses the long factors, as mlx-lm does, rather than switching from the
//! short ones once a sequence outgrows the original context: a switch would change every
//! earlier position's keys, which neither the prefix cache nor seeded replies could follow.

use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::decoder::{Rope, Transformer, Variant};
use crate::{
    config::ModelConfig,
    error::{EngineError, Result},
    weights::WeightMap,
};

/// The Phi-3 settings of `config.json` beyond the shared ones.
#[derive(Deserialize)]
struct Params {
    partial_rotary_factor: Option<f32>,
    original_max_position_embeddings: Option<i32>,
}

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let p: Params = config.params()?;
    let head_dim = config.hidden_size / config.num_attention_heads;
    let config = ModelConfig {
        head_dim: Some(head_dim),
        ..config
    };
    let dims = (head_dim as f32 * p.partial_rotary_factor.unwrap_or(1.0)) as i32;
    let mut rope = Rope {
        dims,
        ..Rope::standard(&config)
    };
    if let Some(s) = &config.rope_scaling {
        if let Some(long_factor) = &s.long_factor {
            if long_factor.len() != (dims / 2) as usize {
                return Err(EngineError::bad_file(
                    "config.json",
                    format!("rope_scaling.long_factor needs {} values", dims / 2),
                ));
            }
            let original = p.original_max_position_embeddings.unwrap_or(4096);
            let max = config.max_position_embeddings.unwrap_or(131_072);
            let periods: Vec<f32> = (0..dims / 2)
                .map(|i| {
                    long_factor[i as usize] * config.rope_theta.powf((2 * i) as f32 / dims as f32)
                })
                .collect();
            let factor = max as f32 / original as f32;
            let mscale = if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / (original as f32).ln()).sqrt()
            };
            let scales: Vec<f32> = (0..head_dim)
                .map(|i| if i < dims { mscale } else { 1.0 })
                .collect();
            let scales = Array::from_slice(&scales, &[head_dim]).as_dtype(dtype)?;
            // Now, on the loading thread: the engine thread cannot run its work.
            scales.eval()?;
            rope = Rope {
                dims,
                traditional: false,
                base: None,
                scale: 1.0,
                freqs: Some(Array::from_slice(&periods, &[dims / 2])),
                input_scale: Some(scales),
                sections: None,
            };
        }
    }
    let variant = Variant {
        fused_projections: true,
        ..Variant::default()
    };
    Transformer::load(config, variant, rope, weights, dtype)
}

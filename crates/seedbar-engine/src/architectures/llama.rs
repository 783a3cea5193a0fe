//! Llama (SmolLM2, Llama 2/3.x): the plain block, with Llama 3's rescaled RoPE frequencies.

use mlx_rs::{Array, Dtype};

use super::decoder::{Rope, Transformer, Variant};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let rope = rope(&config);
    Transformer::load(config, Variant::default(), rope, weights, dtype)
}

/// Llama's RoPE: plain or linear-scaled, or Llama 3's rescaled frequencies.
pub(super) fn rope(config: &ModelConfig) -> Rope {
    match &config.rope_scaling {
        Some(s) if s.rope_type == "llama3" => llama3_rope(config),
        _ => Rope::standard(config),
    }
}

/// Llama 3 keeps high frequencies, divides low ones by `factor`, and blends in between.
fn llama3_rope(c: &ModelConfig) -> Rope {
    let s = c
        .rope_scaling
        .as_ref()
        .expect("llama3 rope needs rope_scaling");
    let dims = c.head_dim();
    let old_context = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_context / s.low_freq_factor;
    let high_freq_wavelen = old_context / s.high_freq_factor;
    let periods: Vec<f32> = (0..dims / 2)
        .map(|i| {
            let period = c.rope_theta.powf((2 * i) as f32 / dims as f32);
            let wavelen = 2.0 * std::f32::consts::PI * period;
            if wavelen > low_freq_wavelen {
                period * s.factor
            } else if wavelen > high_freq_wavelen {
                let smooth = (old_context / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                period / ((1.0 - smooth) / s.factor + smooth)
            } else {
                period
            }
        })
        .collect();
    Rope {
        dims,
        traditional: c.rope_traditional,
        base: None,
        scale: 1.0,
        freqs: Some(Array::from_slice(&periods, &[dims / 2])),
        input_scale: None,
        sections: None,
    }
}

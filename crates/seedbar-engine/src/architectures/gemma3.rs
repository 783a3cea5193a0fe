//! Gemma 2 and Gemma 3 (text): `1 + w` RMS norms around both sublayers, a GELU-tanh gated
//! MLP, queries scaled by `query_pre_attn_scalar`, embeddings scaled by sqrt(d), and
//! sliding-window layers among global ones. Gemma 3 adds q/k norms and a RoPE base of
//! its own for the sliding layers; Gemma 2 soft-caps attention scores and logits.

use mlx_rs::{Array, Dtype};
use serde::Deserialize;

use super::{
    activation::Activation,
    decoder::{LayerAttention, Rope, Transformer, Variant},
};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

/// The Gemma settings of `config.json` beyond the shared ones.
#[derive(Deserialize)]
struct Params {
    query_pre_attn_scalar: Option<f32>,
    sliding_window: Option<i32>,
    /// Every `sliding_window_pattern`-th layer is global (Gemma 3 without `layer_types`).
    sliding_window_pattern: Option<usize>,
    /// `sliding_attention` or `full_attention` per layer (newer configs).
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f32>,
    attn_logit_softcapping: Option<f32>,
    final_logit_softcapping: Option<f32>,
}

/// Which generation of Gemma a checkpoint is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    Gemma2,
    Gemma3,
}

pub fn build(
    generation: Generation,
    config: ModelConfig,
    weights: &mut WeightMap,
    dtype: Dtype,
) -> Result<Transformer> {
    let p: Params = config.params()?;
    let gemma3 = generation == Generation::Gemma3;
    let layers = config.num_hidden_layers as usize;
    // Gemma 2 alternates sliding and global layers, sliding first; Gemma 3 has five
    // sliding layers to each global one unless the config says otherwise.
    let pattern = p
        .sliding_window_pattern
        .unwrap_or(if gemma3 { 6 } else { 2 });
    let sliding: Vec<bool> = match &p.layer_types {
        Some(types) => types.iter().map(|t| t == "sliding_attention").collect(),
        None => (0..layers).map(|i| (i + 1) % pattern != 0).collect(),
    };
    let window = p.sliding_window.or(gemma3.then_some(512));
    let global_rope = Rope::standard(&config);
    let local_rope = Rope {
        base: Some(p.rope_local_base_freq.unwrap_or(10_000.0)),
        scale: 1.0,
        ..global_rope.clone()
    };
    let positions = sliding
        .iter()
        .map(|&s| LayerAttention {
            rope: Some(if s && gemma3 {
                local_rope.clone()
            } else {
                global_rope.clone()
            }),
            window: window.filter(|_| s),
        })
        .collect();
    let root_d = (config.hidden_size as f32).sqrt();
    let variant = Variant {
        qk_norm: gemma3,
        unit_offset_norms: true,
        sandwich_norms: true,
        activation: Activation::GeluTanh,
        attention_scale: Some(p.query_pre_attn_scalar.unwrap_or(256.0).powf(-0.5)),
        // Gemma 2 defaults to capping; Gemma 3 caps only if its config asks.
        attention_softcap: p.attn_logit_softcapping.or((!gemma3).then_some(50.0)),
        logit_softcap: p.final_logit_softcapping.or((!gemma3).then_some(30.0)),
        // Gemma 3 scales by sqrt(d) rounded to bfloat16, as its reference does.
        embedding_scale: Some(if gemma3 { bf16(root_d)? } else { root_d }),
        ..Variant::default()
    };
    Transformer::load_layers(config, variant, positions, weights, dtype)
}

/// `x` rounded to the nearest bfloat16.
fn bf16(x: f32) -> Result<f32> {
    let rounded = Array::from_f32(x).as_dtype(Dtype::Bfloat16)?;
    Ok(rounded.item_cast::<f32>())
}

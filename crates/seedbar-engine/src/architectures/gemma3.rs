//! Gemma 2 and Gemma 3 (text): `1 + w` RMS norms around both sublayers, a GELU-tanh gated
//! MLP, queries scaled by `query_pre_attn_scalar`, embeddings scaled by sqrt(d), and
//! sliding-window layers among global ones. Gemma 3 adds q/k norms and a RoPE base of
//! its own for the sliding layers; Gemma 2 soft-caps attention scores and logits.
//!
//! Gemma 3's image input: a SigLIP tower (`siglip.rs`), then [`Projector`]; an image takes
//! `mm_tokens_per_image` soft tokens between its start and end markers in the prompt.

use mlx_rs::{Array, Dtype};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    activation::Activation,
    decoder::{LayerAttention, RmsNorm, Rope, Transformer, Variant},
};
use crate::{
    config::ModelConfig,
    error::{EngineError, Result},
    weights::WeightMap,
};

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

/// What Hugging Face's `Gemma3TextConfig` assumes where a multimodal checkpoint's
/// `text_config` says nothing.
pub(crate) fn text_config_defaults() -> Value {
    json!({
        "model_type": "gemma3_text",
        "vocab_size": 262208,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": true,
    })
}

/// The prompt text around an image's soft tokens where the template wrote `start`
/// (`<start_of_image>`): the marker before them and `end` after, set apart by blank lines,
/// as the Gemma 3 processor expands it.
pub(crate) fn image_surroundings(start: &str, end: &str) -> (String, String) {
    (format!("\n\n{start}"), format!("{end}\n\n"))
}

/// Gemma 3's multimodal projector: the tower's patch grid averaged in square blocks down to
/// `tokens_per_side`² tokens, RMS-normed (`1 + w`) and projected to the decoder's width.
pub struct Projector {
    norm: RmsNorm,
    /// `[vision width, text width]`.
    projection: Array,
    patches_per_side: i32,
    tokens_per_side: i32,
}

impl Projector {
    pub fn load(
        weights: &mut WeightMap,
        vision_width: i32,
        text_width: i32,
        eps: f32,
        patches_per_side: i32,
        tokens: i32,
    ) -> Result<Self> {
        let tokens_per_side = (tokens as f64).sqrt() as i32;
        if tokens_per_side * tokens_per_side != tokens
            || tokens_per_side == 0
            || patches_per_side % tokens_per_side != 0
        {
            return Err(EngineError::bad_file(
                "config.json",
                format!(
                    "mm_tokens_per_image {tokens} does not pool a {patches_per_side}x{patches_per_side} patch grid"
                ),
            ));
        }
        Ok(Projector {
            norm: RmsNorm::load(
                weights,
                "multi_modal_projector.mm_soft_emb_norm.weight",
                vision_width,
                eps,
                true,
            )?,
            projection: weights.dense(
                "multi_modal_projector.mm_input_projection_weight",
                &[vision_width, text_width],
            )?,
            patches_per_side,
            tokens_per_side,
        })
    }

    /// `[tokens, text width]` from the tower's `[1, patches, vision width]`.
    pub fn forward(&self, patches: &Array) -> Result<Array> {
        let (t, k) = (
            self.tokens_per_side,
            self.patches_per_side / self.tokens_per_side,
        );
        let width = patches.shape()[2];
        let pooled = patches
            .reshape(&[t, k, t, k, width])?
            .mean_axes(&[1, 3], None)?
            .reshape(&[t * t, width])?;
        Ok(self.norm.forward(&pooled)?.matmul(&self.projection)?)
    }
}

//! Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): the Qwen3 block whose MLP is a mixture of experts
//! on every `decoder_sparse_step`-th layer not listed in `mlp_only_layers`, routed by a
//! softmax over all experts, then the top `num_experts_per_tok` (renormalized when
//! `norm_topk_prob`).

use mlx_rs::Dtype;
use serde::Deserialize;

use super::{
    decoder::{LayerAttention, Rope, Transformer, Variant},
    moe::{MoeShape, Routing, SparseMoe},
};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

/// The Qwen3-MoE settings of `config.json` beyond the shared ones (defaults as in
/// transformers' `Qwen3MoeConfig`).
#[derive(Deserialize)]
struct Params {
    num_experts: usize,
    num_experts_per_tok: i32,
    moe_intermediate_size: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default = "every_layer")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
}

fn every_layer() -> usize {
    1
}

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let p: Params = config.params()?;
    let shape = MoeShape {
        experts: p.num_experts,
        top_k: p.num_experts_per_tok,
        intermediate: p.moe_intermediate_size,
        routing: Routing::SoftmaxThenTopK {
            normalize: p.norm_topk_prob,
        },
    };
    let sparse = |layer: usize| {
        p.num_experts > 0
            && !p.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(p.decoder_sparse_step.max(1))
    };
    let hidden = config.hidden_size;
    let layer = LayerAttention {
        rope: Some(Rope::standard(&config)),
        window: None,
    };
    let layers = vec![layer; config.num_hidden_layers as usize];
    let variant = Variant {
        qk_norm: true,
        ..Variant::default()
    };
    Transformer::load_sparse(config, variant, layers, weights, dtype, &mut |w, i| {
        sparse(i)
            .then(|| {
                let prefix = format!("model.layers.{i}.mlp");
                SparseMoe::load(
                    w,
                    &prefix,
                    hidden,
                    shape,
                    ["gate_proj", "up_proj", "down_proj"],
                )
            })
            .transpose()
    })
}

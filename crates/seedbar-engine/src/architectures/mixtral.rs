//! Mixtral (8x7B, 8x22B): the Mistral block whose MLP is a mixture of
//! `num_local_experts` experts on every layer (`block_sparse_moe`), routed by the top
//! `num_experts_per_tok` router logits and a softmax over them. As in mlx-lm, no sliding
//! window (the published Mixtral configs set none).

use mlx_rs::Dtype;
use serde::Deserialize;

use super::{
    decoder::{LayerAttention, Rope, Transformer, Variant},
    moe::{MoeShape, Routing, SparseMoe},
};
use crate::{config::ModelConfig, error::Result, weights::WeightMap};

/// The Mixtral settings of `config.json` beyond the shared ones (defaults as in
/// transformers' `MixtralConfig`).
#[derive(Deserialize)]
struct Params {
    #[serde(default = "eight")]
    num_local_experts: usize,
    #[serde(default = "two")]
    num_experts_per_tok: i32,
}

fn eight() -> usize {
    8
}
fn two() -> i32 {
    2
}

pub fn build(config: ModelConfig, weights: &mut WeightMap, dtype: Dtype) -> Result<Transformer> {
    let p: Params = config.params()?;
    let shape = MoeShape {
        experts: p.num_local_experts,
        top_k: p.num_experts_per_tok,
        intermediate: config.intermediate_size,
        routing: Routing::TopKThenSoftmax,
    };
    let hidden = config.hidden_size;
    let rope = Rope::standard(&config);
    let layers = vec![
        LayerAttention {
            rope: Some(rope),
            window: None,
        };
        config.num_hidden_layers as usize
    ];
    Transformer::load_sparse(
        config,
        Variant::default(),
        layers,
        weights,
        dtype,
        &mut |w, i| {
            let prefix = format!("model.layers.{i}.block_sparse_moe");
            SparseMoe::load(w, &prefix, hidden, shape, ["w1", "w3", "w2"]).map(Some)
        },
    )
}

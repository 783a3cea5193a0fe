//! Images as a model's input: a multimodal checkpoint's parts (its decoder's config and
//! weight names under the text model's, the vision tower, the projector, the processor's
//! `preprocessor_config.json`), how an image stands in the prompt ([`ImagePrompt`]), and an
//! image's features ([`Vision::encode`]): what a step embeds at the image's soft tokens
//! instead of their token embeddings. Gemma 3 (SigLIP) is the family read so far.
//!
//! An image is encoded alone at the size its processor fixes, so its features, and with
//! them a seeded reply, do not depend on what else runs.

use std::{collections::HashMap, path::Path};

use mlx_rs::Array;
use seedbar_images::{Pixels, Preprocessor};
use serde_json::Value;

use crate::{
    architectures::{
        gemma3::{self, Projector},
        siglip::{Siglip, SiglipConfig},
    },
    error::{EngineError, Result},
    tokenizer::Tokenizer,
    weights::WeightMap,
};

/// How images stand in a model's prompt and what their pixels must be: what a server needs
/// to build a prompt with images (the model itself lives on the engine thread).
#[derive(Debug, Clone)]
pub struct ImagePrompt {
    /// What the chat template writes where an image goes (`<start_of_image>`).
    pub placeholder: String,
    /// What the prompt holds there instead: the image's soft tokens between its markers.
    pub expansion: String,
    /// The soft token's id.
    pub image_token: u32,
    /// Soft tokens per image.
    pub tokens_per_image: usize,
    /// Resizing and normalization of an image for the tower.
    pub preprocessor: Preprocessor,
}

impl ImagePrompt {
    /// Where each image's soft tokens start in `tokens` (runs of `tokens_per_image`), in order.
    pub fn image_starts(&self, tokens: &[u32]) -> Result<Vec<usize>> {
        let mut starts = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            if tokens[i] != self.image_token {
                i += 1;
                continue;
            }
            let run = tokens[i..]
                .iter()
                .take_while(|&&t| t == self.image_token)
                .count();
            if run % self.tokens_per_image != 0 {
                return Err(EngineError::InvalidRequest(format!(
                    "the prompt holds {run} image tokens in a row; an image takes {}",
                    self.tokens_per_image
                )));
            }
            starts.extend((0..run / self.tokens_per_image).map(|k| i + k * self.tokens_per_image));
            i += run;
        }
        Ok(starts)
    }
}

/// A model's image input.
pub struct Vision {
    tower: Siglip,
    projector: Projector,
    /// sqrt of the decoder's width: features are divided by it before the step's embedding
    /// scale multiplies them back, as mlx-vlm feeds them.
    unscale: f32,
    pub prompt: ImagePrompt,
}

/// A multimodal `config.json` split into the decoder's config (its `text_config` over the
/// family's defaults) and the rest, which [`Vision::load`] reads; a text model's is kept
/// whole, with no rest.
pub(crate) fn split_config(raw: Value) -> (Value, Option<Value>) {
    let multimodal = raw["model_type"] == "gemma3" && raw.get("vision_config").is_some();
    if !multimodal {
        return (raw, None);
    }
    let mut text = gemma3::text_config_defaults();
    let fields = text.as_object_mut().expect("an object");
    if let Some(eos) = raw.get("eos_token_id") {
        fields.insert("eos_token_id".into(), eos.clone());
    }
    if let Some(given) = raw["text_config"].as_object() {
        for (key, value) in given {
            if key != "model_type" {
                fields.insert(key.clone(), value.clone());
            }
        }
    }
    (text, Some(raw))
}

/// Weight names of a multimodal checkpoint as the text model's loader reads them: mlx-vlm's
/// `language_model.model.*` and transformers' `model.language_model.*` become `model.*`,
/// the head `lm_head.*`, and the tower and projector lose transformers' `model.` prefix.
pub(crate) fn rename_weights(tensors: HashMap<String, Array>) -> HashMap<String, Array> {
    tensors
        .into_iter()
        .map(|(name, array)| {
            let renamed = if let Some(rest) = name.strip_prefix("language_model.") {
                rest.to_string()
            } else if let Some(rest) = name.strip_prefix("model.language_model.") {
                format!("model.{rest}")
            } else if let Some(rest) = name.strip_prefix("model.").filter(|r| {
                r.starts_with("vision_tower.") || r.starts_with("multi_modal_projector.")
            }) {
                rest.to_string()
            } else {
                name
            };
            (renamed, array)
        })
        .collect()
}

impl Vision {
    /// Whether the model at `path` takes images: a folder whose `config.json` is a
    /// multimodal family Seedbar reads, with the processor's `preprocessor_config.json`
    /// (read without loading the model).
    pub fn seen_at(path: &Path) -> bool {
        let config = path.join("config.json");
        let raw = std::fs::read_to_string(config)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok());
        raw.is_some_and(|raw| split_config(raw).1.is_some())
            && path.join("preprocessor_config.json").is_file()
    }

    /// The tower, projector and prompt of the multimodal checkpoint in `dir` (`config` its
    /// whole `config.json`), whose decoder is `text_width` wide.
    pub(crate) fn load(
        config: &Value,
        dir: &Path,
        tokenizer: &Tokenizer,
        weights: &mut WeightMap,
        text_width: i32,
    ) -> Result<Self> {
        let bad = |message: String| EngineError::bad_file(dir.join("config.json"), message);
        let tower_config: SiglipConfig = serde_json::from_value(config["vision_config"].clone())
            .map_err(|e| bad(format!("invalid vision_config: {e}")))?;
        let tokens = config["mm_tokens_per_image"]
            .as_i64()
            .or_else(|| config["text_config"]["mm_tokens_per_image"].as_i64())
            .unwrap_or(256) as i32;
        let id =
            |key: &str, default: u32| config[key].as_u64().map(|v| v as u32).unwrap_or(default);
        let image_token = id("image_token_index", 262144);
        let text_of = |id: u32| {
            tokenizer.id_to_token(id).ok_or_else(|| {
                bad(format!(
                    "token {id} (an image marker) is not in the vocabulary"
                ))
            })
        };
        let start = text_of(id("boi_token_index", 255999))?;
        let end = text_of(id("eoi_token_index", 256000))?;
        let soft = text_of(image_token)?;
        let preprocessor_path = dir.join("preprocessor_config.json");
        let preprocessor = Preprocessor::read(&preprocessor_path)
            .map_err(|e| EngineError::bad_file(&preprocessor_path, e.to_string()))?;
        let projector = Projector::load(
            weights,
            tower_config.hidden_size,
            text_width,
            tower_config.layer_norm_eps,
            tower_config.patches_per_side(),
            tokens,
        )?;
        let tower = Siglip::load(tower_config, weights, "vision_tower.vision_model")?;
        Ok(Vision {
            tower,
            projector,
            unscale: (text_width as f32).sqrt(),
            prompt: ImagePrompt {
                expansion: gemma3::image_expansion(&start, &soft, &end, tokens as usize),
                placeholder: start,
                image_token,
                tokens_per_image: tokens as usize,
                preprocessor,
            },
        })
    }

    /// The features an image's soft tokens embed as (`[tokens, D]`, evaluated), before the
    /// decoder's embedding scale.
    pub fn encode(&self, pixels: &Pixels) -> Result<Array> {
        let features = self.projector.forward(&self.tower.forward(pixels)?)?;
        let unscale = Array::from_f32(self.unscale).as_dtype(features.dtype())?;
        let features = features.divide(&unscale)?;
        features.eval()?;
        Ok(features)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemma3_config_splits_into_its_decoder_over_the_defaults() {
        let raw = serde_json::json!({
            "model_type": "gemma3", "eos_token_id": [1, 106],
            "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34},
            "vision_config": {"hidden_size": 1152},
        });
        let (text, rest) = split_config(raw);
        assert!(rest.is_some());
        assert_eq!(text["model_type"], "gemma3_text");
        assert_eq!(text["hidden_size"], 2560);
        assert_eq!(text["num_key_value_heads"], 4);
        assert_eq!(text["eos_token_id"], serde_json::json!([1, 106]));
        let (plain, none) = split_config(serde_json::json!({"model_type": "llama"}));
        assert!(none.is_none());
        assert_eq!(plain["model_type"], "llama");
    }

    #[test]
    fn weight_names_of_both_namings_reach_the_text_loader() {
        let names = [
            (
                "language_model.model.layers.0.mlp.up_proj.weight",
                "model.layers.0.mlp.up_proj.weight",
            ),
            ("language_model.lm_head.weight", "lm_head.weight"),
            (
                "model.language_model.embed_tokens.weight",
                "model.embed_tokens.weight",
            ),
            (
                "model.vision_tower.vision_model.post_layernorm.bias",
                "vision_tower.vision_model.post_layernorm.bias",
            ),
            (
                "model.multi_modal_projector.mm_input_projection_weight",
                "multi_modal_projector.mm_input_projection_weight",
            ),
            (
                "vision_tower.vision_model.post_layernorm.bias",
                "vision_tower.vision_model.post_layernorm.bias",
            ),
        ];
        let tensors = names
            .iter()
            .map(|(from, _)| (from.to_string(), Array::from_f32(0.0)))
            .collect();
        let renamed = rename_weights(tensors);
        for (_, to) in names {
            assert!(renamed.contains_key(to), "{to}");
        }
    }

    #[test]
    fn image_starts_finds_each_images_run() {
        let prompt = ImagePrompt {
            placeholder: "<s>".into(),
            expansion: String::new(),
            image_token: 9,
            tokens_per_image: 2,
            preprocessor: Preprocessor::from_json(
                r#"{"size": {"height": 14, "width": 14}, "resample": 2,
                    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}"#,
            )
            .unwrap(),
        };
        assert_eq!(
            prompt.image_starts(&[1, 9, 9, 2, 9, 9, 9, 9]).unwrap(),
            [1, 4, 6]
        );
        assert!(prompt.image_starts(&[9, 9, 9]).is_err());
    }
}

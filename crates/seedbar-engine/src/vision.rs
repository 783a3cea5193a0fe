//! Images as a model's input: a multimodal checkpoint's parts (its decoder's config and
//! weight names under the text model's, the vision tower, the projector, the processor's
//! `preprocessor_config.json`), how an image stands in the prompt ([`ImagePrompt`]), and an
//! image's features ([`Vision::encode`]): what a step embeds at the image's soft tokens
//! instead of their token embeddings. Two families are read: Gemma 3 (SigLIP at a fixed
//! size, a fixed number of soft tokens an image) and Qwen2.5-VL (its own ViT at the image's
//! resolution within a pixel budget, one soft token per 28×28 pixels, placed on the image's
//! grid by the decoder's multimodal RoPE: [`ImageTokens::row_positions`]).
//!
//! An image is encoded alone at the size its processor fixes, so its features, and with
//! them a seeded reply, do not depend on what else runs.

use std::{collections::HashMap, path::Path};

use mlx_rs::Array;
use seedbar_images::{Pixels, Preprocessor, Resize};
use serde_json::Value;

use crate::{
    architectures::{
        gemma3::{self, Projector},
        qwen2_vl::{Qwen2VlTower, TowerConfig},
        siglip::{Siglip, SiglipConfig},
    },
    error::{EngineError, Result},
    step::{ImageGrid, RowPositions},
    tokenizer::Tokenizer,
    weights::WeightMap,
};

/// How many soft tokens an image takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageTokens {
    /// The same for every image (Gemma 3's `mm_tokens_per_image`).
    Fixed(usize),
    /// One per `side`×`side` pixels of the processed image (Qwen2-VL's merged patches).
    PerArea { side: usize },
}

impl ImageTokens {
    /// The soft tokens of processed `pixels`.
    pub fn of(&self, pixels: &Pixels) -> usize {
        match *self {
            ImageTokens::Fixed(n) => n,
            ImageTokens::PerArea { side } => (pixels.width / side) * (pixels.height / side),
        }
    }

    /// Where a row's tokens sit for RoPE, its images' soft tokens starting at `at` with
    /// these pixels: on each image's grid where an image's tokens are per area (Qwen2.5-VL's
    /// multimodal RoPE), at their sequence indices otherwise.
    pub fn row_positions<'a>(
        &self,
        images: impl IntoIterator<Item = (usize, &'a Pixels)>,
    ) -> RowPositions {
        let ImageTokens::PerArea { side } = *self else {
            return RowPositions::default();
        };
        RowPositions::new(
            images
                .into_iter()
                .map(|(at, pixels)| ImageGrid {
                    at,
                    rows: pixels.height / side,
                    cols: pixels.width / side,
                })
                .collect(),
        )
    }
}

/// How images stand in a model's prompt and what their pixels must be: what a server needs
/// to build a prompt with images (the model itself lives on the engine thread).
#[derive(Debug, Clone)]
pub struct ImagePrompt {
    /// What the chat template writes where an image goes (`<start_of_image>`,
    /// `<|image_pad|>`).
    pub placeholder: String,
    /// The prompt text around an image's soft tokens, which stand where the placeholder was.
    pub before: String,
    pub after: String,
    /// The soft token's text and id.
    pub soft: String,
    pub image_token: u32,
    pub tokens: ImageTokens,
    /// Resizing and normalization of an image for the tower.
    pub preprocessor: Preprocessor,
}

/// The text that stands for each of a prompt's images where the template wrote its marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageMarks {
    pub placeholder: String,
    /// One per image, in prompt order.
    pub expansions: Vec<String>,
}

impl ImagePrompt {
    /// The soft tokens of an image of `width`×`height` pixels (before processing).
    pub fn tokens_for(&self, width: u32, height: u32) -> Result<usize> {
        match self.tokens {
            ImageTokens::Fixed(n) => Ok(n),
            ImageTokens::PerArea { side } => {
                let size = self
                    .preprocessor
                    .size_of(width, height)
                    .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
                Ok((size.width as usize / side) * (size.height as usize / side))
            }
        }
    }

    /// The marks of a prompt whose images are `sizes` (width, height) in order.
    pub fn marks(&self, sizes: &[(u32, u32)]) -> Result<ImageMarks> {
        let expansions = sizes
            .iter()
            .map(|&(w, h)| {
                let n = self.tokens_for(w, h)?;
                Ok(format!(
                    "{}{}{}",
                    self.before,
                    self.soft.repeat(n),
                    self.after
                ))
            })
            .collect::<Result<_>>()?;
        Ok(ImageMarks {
            placeholder: self.placeholder.clone(),
            expansions,
        })
    }

    /// Each image's soft tokens in `tokens` as (start, count), in order: every run of soft
    /// tokens is one image (markers stand between images), or, where each image takes a
    /// fixed count, runs of that count.
    pub fn image_runs(&self, tokens: &[u32]) -> Result<Vec<(usize, usize)>> {
        let mut runs = Vec::new();
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
            match self.tokens {
                ImageTokens::Fixed(n) if run % n != 0 => {
                    return Err(EngineError::InvalidRequest(format!(
                        "the prompt holds {run} image tokens in a row; an image takes {n}"
                    )));
                }
                ImageTokens::Fixed(n) => runs.extend((0..run / n).map(|k| (i + k * n, n))),
                ImageTokens::PerArea { .. } => runs.push((i, run)),
            }
            i += run;
        }
        Ok(runs)
    }
}

/// The families' towers.
enum Tower {
    /// Gemma 3: SigLIP, then the projector; features divided by sqrt of the decoder's width
    /// (`unscale`), as mlx-vlm feeds them before the step's embedding scale.
    Gemma3 {
        siglip: Siglip,
        projector: Projector,
        unscale: f32,
    },
    Qwen2Vl(Qwen2VlTower),
}

/// A model's image input.
pub struct Vision {
    tower: Tower,
    pub prompt: ImagePrompt,
}

/// Which multimodal family a raw `config.json` is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Gemma3,
    Qwen25Vl,
}

fn family(raw: &Value) -> Option<Family> {
    raw.get("vision_config")?;
    match raw["model_type"].as_str()? {
        "gemma3" => Some(Family::Gemma3),
        "qwen2_5_vl" => Some(Family::Qwen25Vl),
        _ => None,
    }
}

/// A multimodal `config.json` split into the decoder's config and the rest, which
/// [`Vision::load`] reads; a text model's is kept whole, with no rest. Gemma 3's decoder is
/// its `text_config` over the family's defaults; Qwen2.5-VL's is the top level (or its
/// `text_config`) as a Qwen2 decoder with the `mrope_section` its RoPE turns by.
pub(crate) fn split_config(raw: Value) -> (Value, Option<Value>) {
    match family(&raw) {
        None => (raw, None),
        Some(Family::Gemma3) => {
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
        Some(Family::Qwen25Vl) => {
            let mut fields = raw.as_object().cloned().unwrap_or_default();
            fields.remove("vision_config");
            if let Some(given) = raw["text_config"].as_object() {
                fields.extend(given.clone());
            }
            fields.remove("text_config");
            fields.insert("model_type".into(), "qwen2".into());
            // The sections live in `rope_scaling` (or transformers 5's `rope_parameters`),
            // whose type is M-RoPE's own: kept beside, the scaling itself is none.
            let sections = ["rope_scaling", "rope_parameters"]
                .iter()
                .find_map(|key| fields.get(*key)?.get("mrope_section").cloned());
            if let Some(scaling) = fields.remove("rope_parameters") {
                if let Some(theta) = scaling.get("rope_theta") {
                    fields.insert("rope_theta".into(), theta.clone());
                }
            }
            fields.remove("rope_scaling");
            fields.insert("mrope_section".into(), sections.unwrap_or(Value::Null));
            (Value::Object(fields), Some(raw))
        }
    }
}

/// Weight names of a multimodal checkpoint as the text model's loader reads them: mlx-vlm's
/// `language_model.model.*` and transformers' `model.language_model.*` become `model.*`,
/// the head `lm_head.*`, and the tower and projector lose transformers' `model.` prefix
/// (Qwen2.5-VL's `visual.*` becomes `vision_tower.*`, as mlx-vlm names it).
pub(crate) fn rename_weights(tensors: HashMap<String, Array>) -> HashMap<String, Array> {
    const TOWERS: [&str; 3] = ["vision_tower.", "multi_modal_projector.", "visual."];
    tensors
        .into_iter()
        .map(|(name, array)| {
            let renamed = if let Some(rest) = name.strip_prefix("language_model.") {
                rest.to_string()
            } else if let Some(rest) = name.strip_prefix("model.language_model.") {
                format!("model.{rest}")
            } else if let Some(rest) = name
                .strip_prefix("model.")
                .filter(|r| TOWERS.iter().any(|t| r.starts_with(t)))
            {
                rest.to_string()
            } else {
                name
            };
            let renamed = match renamed.strip_prefix("visual.") {
                Some(rest) => format!("vision_tower.{rest}"),
                None => renamed,
            };
            (renamed, array)
        })
        .collect()
}

impl Vision {
    /// Whether the model at `path` takes images: a folder whose `config.json` is a
    /// multimodal family Seedbar reads, with the processor's `preprocessor_config.json`, or
    /// a GGUF file with its projector beside it (read without loading the model).
    pub fn seen_at(path: &Path) -> bool {
        if path.is_file() {
            return crate::gguf::projector_beside(path).is_some();
        }
        let config = path.join("config.json");
        let raw = std::fs::read_to_string(config)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok());
        raw.is_some_and(|raw| family(&raw).is_some())
            && path.join("preprocessor_config.json").is_file()
    }

    /// The processor of the checkpoint folder `dir` (its `preprocessor_config.json`).
    pub(crate) fn read_preprocessor(dir: &Path) -> Result<Preprocessor> {
        let path = dir.join("preprocessor_config.json");
        Preprocessor::read(&path).map_err(|e| EngineError::bad_file(&path, e.to_string()))
    }

    /// The tower, projector and prompt of a multimodal checkpoint: `config` its whole
    /// `config.json` (or what a projector file says in its place, `source` the file either
    /// way), its weights in `weights`, its decoder `text_width` wide.
    pub(crate) fn load(
        config: &Value,
        preprocessor: Preprocessor,
        source: &Path,
        tokenizer: &Tokenizer,
        weights: &mut WeightMap,
        text_width: i32,
    ) -> Result<Self> {
        let bad = |message: String| EngineError::bad_file(source, message);
        let id = |keys: &[&str], default: u32| {
            keys.iter()
                .find_map(|key| config[*key].as_u64())
                .map_or(default, |v| v as u32)
        };
        let text_of = |id: u32| {
            tokenizer.id_to_token(id).ok_or_else(|| {
                bad(format!(
                    "token {id} (an image marker) is not in the vocabulary"
                ))
            })
        };
        if family(config) == Some(Family::Qwen25Vl) {
            let tower_config: TowerConfig = serde_json::from_value(config["vision_config"].clone())
                .map_err(|e| bad(format!("invalid vision_config: {e}")))?;
            let side = tower_config.token_side();
            let budget =
                matches!(preprocessor.resize, Resize::Budget(b) if b.factor as usize == side);
            if !budget {
                return Err(bad(format!("Qwen2.5-VL's processor must size images in multiples of {side} pixels within a pixel budget")));
            }
            let image_token = id(&["image_token_id", "image_token_index"], 151655);
            let soft = text_of(image_token)?;
            let tower = Qwen2VlTower::load(tower_config, weights, "vision_tower")?;
            return Ok(Vision {
                tower: Tower::Qwen2Vl(tower),
                prompt: ImagePrompt {
                    placeholder: soft.clone(),
                    before: String::new(),
                    after: String::new(),
                    soft,
                    image_token,
                    tokens: ImageTokens::PerArea { side },
                    preprocessor,
                },
            });
        }
        let tower_config: SiglipConfig = serde_json::from_value(config["vision_config"].clone())
            .map_err(|e| bad(format!("invalid vision_config: {e}")))?;
        let tokens = config["mm_tokens_per_image"]
            .as_i64()
            .or_else(|| config["text_config"]["mm_tokens_per_image"].as_i64())
            .unwrap_or(256) as i32;
        let image_token = id(&["image_token_index"], 262144);
        let start = text_of(id(&["boi_token_index"], 255999))?;
        let end = text_of(id(&["eoi_token_index"], 256000))?;
        let soft = text_of(image_token)?;
        let projector = Projector::load(
            weights,
            tower_config.hidden_size,
            text_width,
            tower_config.layer_norm_eps,
            tower_config.patches_per_side(),
            tokens,
        )?;
        let siglip = Siglip::load(tower_config, weights, "vision_tower.vision_model")?;
        let (before, after) = gemma3::image_surroundings(&start, &end);
        Ok(Vision {
            tower: Tower::Gemma3 {
                siglip,
                projector,
                unscale: (text_width as f32).sqrt(),
            },
            prompt: ImagePrompt {
                placeholder: start,
                before,
                after,
                soft,
                image_token,
                tokens: ImageTokens::Fixed(tokens as usize),
                preprocessor,
            },
        })
    }

    /// The features an image's soft tokens embed as (`[tokens, D]`, evaluated), before the
    /// decoder's embedding scale.
    pub fn encode(&self, pixels: &Pixels) -> Result<Array> {
        let features = match &self.tower {
            Tower::Gemma3 {
                siglip,
                projector,
                unscale,
            } => {
                let features = projector.forward(&siglip.forward(pixels)?)?;
                let unscale = Array::from_f32(*unscale).as_dtype(features.dtype())?;
                features.divide(&unscale)?
            }
            Tower::Qwen2Vl(tower) => tower.forward(pixels)?,
        };
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
            (
                "visual.blocks.0.attn.qkv.weight",
                "vision_tower.blocks.0.attn.qkv.weight",
            ),
            (
                "model.visual.merger.ln_q.weight",
                "vision_tower.merger.ln_q.weight",
            ),
            (
                "model.layers.0.mlp.up_proj.weight",
                "model.layers.0.mlp.up_proj.weight",
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
    fn image_runs_find_each_images_tokens() {
        let mut prompt = ImagePrompt {
            placeholder: "<s>".into(),
            before: String::new(),
            after: String::new(),
            soft: "<i>".into(),
            image_token: 9,
            tokens: ImageTokens::Fixed(2),
            preprocessor: Preprocessor::from_json(
                r#"{"size": {"height": 14, "width": 14}, "resample": 2,
                    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}"#,
            )
            .unwrap(),
        };
        let tokens = [1, 9, 9, 2, 9, 9, 9, 9];
        assert_eq!(
            prompt.image_runs(&tokens).unwrap(),
            [(1, 2), (4, 2), (6, 2)]
        );
        assert!(prompt.image_runs(&[9, 9, 9]).is_err());
        assert_eq!(prompt.tokens_for(640, 480).unwrap(), 2);
        // Per area: each run is an image, its tokens one per 28x28 of the processed size.
        prompt.tokens = ImageTokens::PerArea { side: 28 };
        prompt.preprocessor = Preprocessor::from_json(
            r#"{"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 1003520,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}"#,
        )
        .unwrap();
        assert_eq!(prompt.image_runs(&tokens).unwrap(), [(1, 2), (4, 4)]);
        // 400x300 → 392x308: 14 x 11 tokens.
        assert_eq!(prompt.tokens_for(400, 300).unwrap(), 154);
        let marks = prompt.marks(&[(56, 56), (400, 300)]).unwrap();
        assert_eq!(marks.expansions[0], "<i>".repeat(4));
        assert_eq!(marks.expansions[1].len(), 3 * 154);
        assert!(prompt.marks(&[(4000, 10)]).is_err());
    }

    #[test]
    fn a_qwen2_5_vl_config_splits_into_a_qwen2_decoder_with_sections() {
        let raw = serde_json::json!({
            "model_type": "qwen2_5_vl", "hidden_size": 2048, "num_hidden_layers": 36,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "vision_config": {"depth": 32},
        });
        let (text, rest) = split_config(raw);
        assert!(rest.is_some());
        assert_eq!(text["model_type"], "qwen2");
        assert_eq!(text["hidden_size"], 2048);
        assert!(text.get("vision_config").is_none());
        assert!(text.get("rope_scaling").is_none());
        assert_eq!(text["mrope_section"], serde_json::json!([16, 24, 24]));
    }
}

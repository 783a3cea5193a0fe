//! llama.cpp's multimodal projector files (`mmproj-*.gguf`, `general.architecture` `clip`):
//! the image tower and projector of a GGUF model, kept in a file of their own beside it.
//! Two projector types are read, the families [`crate::vision`] runs: `gemma3` (SigLIP and
//! Gemma 3's projector) and `qwen2.5vl_merger` (Qwen2.5-VL's ViT and merger). The file's
//! `clip.vision.*` keys become the `vision_config` a checkpoint's `config.json` holds, its
//! tensors the names mlx-vlm gives them (llama.cpp's converter splits what the checkpoint
//! fuses: Qwen's q/k/v and its two-frame patch kernel are put back together; Gemma's
//! projector norm, stored as `1 + w`, back to `w`), and the processor is built from the
//! file's mean and deviation with the family's usual resizing (there is no
//! `preprocessor_config.json` to read).
//!
//! A model file pairs with a projector in its own folder, as llama.cpp's distributions ship
//! them: a `.gguf` file whose name holds `mmproj`, of the model's family and width
//! ([`for_model`]).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use mlx_rs::{ops, Array, Dtype};
use seedbar_images::{Filter, PixelBudget, Preprocessor, Resize, Size};
use serde_json::{json, Value};

use super::{file::GgufFile, Metadata};
use crate::{
    error::{EngineError, Result},
    tokenizer::Tokenizer,
};

/// The projector types Seedbar reads, with the decoder (`general.architecture`) each serves.
const PROJECTORS: [(&str, &str); 2] = [("gemma3", "gemma3"), ("qwen2.5vl_merger", "qwen2vl")];

/// What a projector file holds, as a multimodal checkpoint would hold it.
pub(crate) struct MmprojContents {
    /// The `config.json` fields [`crate::vision::Vision::load`] reads: `model_type`,
    /// `vision_config`, the image token ids.
    pub config: Value,
    pub preprocessor: Preprocessor,
    /// Under mlx-vlm's names (`vision_tower.*`, `multi_modal_projector.*`).
    pub tensors: HashMap<String, Array>,
}

/// The projector beside the model file at `model` that serves its decoder (of GGUF
/// architecture `architecture`, `hidden` wide): the first, by name, of the folder's
/// `*mmproj*.gguf` files whose type and width fit. `None` where there is none.
pub fn for_model(model: &Path, architecture: &str, hidden: i32) -> Option<PathBuf> {
    let folder = model.parent()?;
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(folder)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.as_path() != model && is_named_mmproj(p))
        .collect();
    candidates.sort();
    candidates.into_iter().find(|path| {
        GgufFile::open(path).is_ok_and(|file| {
            let meta = Metadata { file: &file, path };
            let fits = projector_type(&meta).is_some_and(|t| served_by(&t) == Some(architecture));
            fits && meta
                .number("clip.vision.projection_dim")
                .ok()
                .flatten()
                .is_some_and(|d| d as i32 == hidden)
        })
    })
}

/// Whether `path` is named as a projector file (`mmproj` in a `.gguf` file's name).
pub fn is_named_mmproj(path: &Path) -> bool {
    path.extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.to_ascii_lowercase().contains("mmproj"))
}

fn served_by(projector: &str) -> Option<&'static str> {
    PROJECTORS
        .iter()
        .find(|(name, _)| *name == projector)
        .map(|&(_, architecture)| architecture)
}

/// The vision projector's type (`clip.vision.projector_type` in files of several
/// encoders, else `clip.projector_type`).
fn projector_type(meta: &Metadata) -> Option<String> {
    ["clip.vision.projector_type", "clip.projector_type"]
        .iter()
        .find_map(|key| meta.string(key).ok().flatten())
}

/// The projector file at `path`, its tensors in `dtype` (quantized ones as the text file's
/// are, see [`super::read`]); `tokenizer` is the model's, which names the image tokens.
pub(crate) fn read(
    path: &Path,
    tokenizer: &Tokenizer,
    dtype: Dtype,
    small_groups: bool,
) -> Result<MmprojContents> {
    let file = GgufFile::open(path)?;
    let meta = Metadata { file: &file, path };
    let bad = |message: String| EngineError::bad_file(path, message);
    let kind = projector_type(&meta)
        .ok_or_else(|| bad("metadata `clip.projector_type` is missing".into()))?;
    let key = |k: &str| format!("clip.vision.{k}");
    let int = |k: &str| -> Result<i64> { Ok(meta.required(&key(k))? as i64) };
    let token = |text: &str| {
        tokenizer.token_to_id(text).ok_or_else(|| {
            bad(format!(
                "the model's vocabulary has no `{text}`, which this projector's images need"
            ))
        })
    };
    let channel_stats = |k: &str, default: f64| -> Result<[f64; 3]> {
        let values = meta.numbers(&key(k))?;
        match values.as_slice() {
            [] => Ok([default; 3]),
            [r, g, b] => Ok([*r, *g, *b]),
            _ => Err(bad(format!("metadata `{}` is not three numbers", key(k)))),
        }
    };
    let (mean, std) = (
        channel_stats("image_mean", 0.5)?,
        channel_stats("image_std", 0.5)?,
    );
    let (layers, width, patch) = (
        int("block_count")?,
        int("embedding_length")?,
        int("patch_size")?,
    );
    let eps = meta
        .number(&key("attention.layer_norm_epsilon"))?
        .unwrap_or(1e-6);
    let mut raw = file.tensors(dtype, small_groups)?;
    let (config, preprocessor, tensors) = match kind.as_str() {
        "gemma3" => {
            let image_size = int("image_size")?;
            let pool = meta
                .number(&key("projector.scale_factor"))?
                .map_or(4, |v| v as i64);
            let per_side = image_size / patch.max(1) / pool.max(1);
            let config = json!({
                "model_type": "gemma3",
                "vision_config": {
                    "hidden_size": width,
                    "intermediate_size": int("feed_forward_length")?,
                    "num_hidden_layers": layers,
                    "num_attention_heads": int("attention.head_count")?,
                    "patch_size": patch,
                    "image_size": image_size,
                    "layer_norm_eps": eps,
                },
                "mm_tokens_per_image": per_side * per_side,
                "image_token_index": token("<image_soft_token>")?,
                "boi_token_index": token("<start_of_image>")?,
                "eoi_token_index": token("<end_of_image>")?,
            });
            let side = image_size as u32;
            let resize = Resize::Fixed(Size {
                height: side,
                width: side,
            });
            // Gemma 3's processor: bilinear.
            let preprocessor = processor(resize, Filter::Bilinear, mean, std);
            if let Some(norm) = raw.remove("mm.soft_emb_norm.weight") {
                let norm = norm
                    .as_dtype(Dtype::Float32)?
                    .subtract(Array::from_f32(1.0))?;
                raw.insert("mm.soft_emb_norm.weight".into(), norm);
            }
            (config, preprocessor, gemma3_names(raw))
        }
        "qwen2.5vl_merger" => {
            let pattern = int("n_wa_pattern")?.max(1) as usize;
            let merge = meta
                .number(&key("spatial_merge_size"))?
                .map_or(2, |v| v as i64);
            let config = json!({
                "model_type": "qwen2_5_vl",
                "vision_config": {
                    "depth": layers,
                    "hidden_size": width,
                    "intermediate_size": int("feed_forward_length")?,
                    "num_heads": int("attention.head_count")?,
                    "out_hidden_size": int("projection_dim")?,
                    "patch_size": patch,
                    "spatial_merge_size": merge,
                    "temporal_patch_size": 2,
                    "window_size": meta.number(&key("window_size"))?.map_or(112, |v| v as i64),
                    "fullatt_block_indexes":
                        (0..layers as usize).filter(|i| (i + 1) % pattern == 0).collect::<Vec<_>>(),
                },
                "image_token_id": token("<|image_pad|>")?,
            });
            // transformers' Qwen2-VL processor: bicubic, within its default pixel budget
            // unless the file says otherwise.
            let pixels = |k: &str, default: u64| -> Result<u64> {
                Ok(meta.number(&key(k))?.map_or(default, |v| v as u64))
            };
            let resize = Resize::Budget(PixelBudget {
                factor: (patch * merge) as u32,
                min_pixels: pixels("image_min_pixels", 56 * 56)?,
                max_pixels: pixels("image_max_pixels", 28 * 28 * 1280)?,
            });
            let preprocessor = processor(resize, Filter::Bicubic, mean, std);
            (config, preprocessor, qwen2_vl_names(raw)?)
        }
        other => {
            return Err(bad(format!(
                "the projector type `{other}` is not one Seedbar reads (it reads {})",
                PROJECTORS.map(|(name, _)| name).join(", ")
            )))
        }
    };
    Ok(MmprojContents {
        config,
        preprocessor,
        tensors,
    })
}

fn processor(
    resize: Resize,
    resample: Filter,
    image_mean: [f64; 3],
    image_std: [f64; 3],
) -> Preprocessor {
    Preprocessor {
        resize,
        resample,
        do_resize: true,
        do_rescale: true,
        rescale_factor: 1.0 / 255.0,
        do_normalize: true,
        image_mean,
        image_std,
    }
}

/// The tensor `stem.suffix` split as (`stem` parts, `suffix`): `v.blk.3.ln1.weight` →
/// (`["v", "blk", "3", "ln1"]`, `weight`).
fn split(name: &str) -> (Vec<&str>, &str) {
    let (stem, suffix) = name.rsplit_once('.').unwrap_or((name, ""));
    (stem.split('.').collect(), suffix)
}

/// llama.cpp's SigLIP and Gemma 3 projector names as mlx-vlm's.
fn gemma3_names(raw: HashMap<String, Array>) -> HashMap<String, Array> {
    const TOWER: &str = "vision_tower.vision_model";
    raw.into_iter()
        .map(|(name, array)| {
            let (stem, suffix) = split(&name);
            let renamed = match stem.as_slice() {
                ["v", "patch_embd"] => format!("{TOWER}.embeddings.patch_embedding.{suffix}"),
                ["v", "position_embd"] => {
                    format!("{TOWER}.embeddings.position_embedding.{suffix}")
                }
                ["v", "post_ln"] => format!("{TOWER}.post_layernorm.{suffix}"),
                ["v", "blk", layer, part] => {
                    let module = match *part {
                        "attn_q" => "self_attn.q_proj",
                        "attn_k" => "self_attn.k_proj",
                        "attn_v" => "self_attn.v_proj",
                        "attn_out" => "self_attn.out_proj",
                        "ln1" => "layer_norm1",
                        "ln2" => "layer_norm2",
                        "ffn_up" => "mlp.fc1",
                        "ffn_down" => "mlp.fc2",
                        other => other,
                    };
                    format!("{TOWER}.encoder.layers.{layer}.{module}.{suffix}")
                }
                ["mm", "input_projection"] => {
                    "multi_modal_projector.mm_input_projection_weight".into()
                }
                ["mm", "soft_emb_norm"] => {
                    format!("multi_modal_projector.mm_soft_emb_norm.{suffix}")
                }
                _ => name.clone(),
            };
            (renamed, array)
        })
        .collect()
}

/// llama.cpp's Qwen2.5-VL tower names as mlx-vlm's: each block's q, k and v stacked back
/// into `attn.qkv`, the patch kernel's two frames (`v.patch_embd.weight` and `.weight.1`)
/// back into one `[D, 3, 2, p, p]` kernel.
fn qwen2_vl_names(mut raw: HashMap<String, Array>) -> Result<HashMap<String, Array>> {
    const TOWER: &str = "vision_tower";
    let mut out = HashMap::new();
    if let (Some(first), Some(second)) = (
        raw.remove("v.patch_embd.weight"),
        raw.remove("v.patch_embd.weight.1"),
    ) {
        out.insert(
            format!("{TOWER}.patch_embed.proj.weight"),
            ops::stack(&[&first, &second], 2)?,
        );
    }
    let mut qkv: HashMap<String, [Option<Array>; 3]> = HashMap::new();
    for (name, array) in raw {
        let (stem, suffix) = split(&name);
        let renamed = match stem.as_slice() {
            ["v", "post_ln"] => format!("{TOWER}.merger.ln_q.{suffix}"),
            ["mm", index @ ("0" | "2")] => format!("{TOWER}.merger.mlp.{index}.{suffix}"),
            ["v", "blk", layer, part @ ("attn_q" | "attn_k" | "attn_v")] => {
                let slot = ["attn_q", "attn_k", "attn_v"]
                    .iter()
                    .position(|p| p == part)
                    .unwrap_or(0);
                let key = format!("{TOWER}.blocks.{layer}.attn.qkv.{suffix}");
                qkv.entry(key).or_default()[slot] = Some(array);
                continue;
            }
            ["v", "blk", layer, part] => {
                let module = match *part {
                    "attn_out" => "attn.proj",
                    "ln1" => "norm1",
                    "ln2" => "norm2",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    other => other,
                };
                format!("{TOWER}.blocks.{layer}.{module}.{suffix}")
            }
            _ => name.clone(),
        };
        out.insert(renamed, array);
    }
    for (name, parts) in qkv {
        let [Some(q), Some(k), Some(v)] = parts else {
            return Err(EngineError::MissingTensor {
                name: format!("{name} (its q, k and v parts)"),
            });
        };
        out.insert(name, ops::concatenate(&[q, k, v], 0)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projector_names_reach_mlx_vlms() {
        let zero = || Array::from_f32(0.0);
        let gemma: HashMap<String, Array> = [
            "v.blk.1.ffn_up.weight",
            "v.post_ln.bias",
            "mm.input_projection.weight",
            "v.position_embd.weight",
        ]
        .iter()
        .map(|n| (n.to_string(), zero()))
        .collect();
        let renamed = gemma3_names(gemma);
        for name in [
            "vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight",
            "vision_tower.vision_model.post_layernorm.bias",
            "multi_modal_projector.mm_input_projection_weight",
            "vision_tower.vision_model.embeddings.position_embedding.weight",
        ] {
            assert!(renamed.contains_key(name), "{name}");
        }
        let row = |x: f32| Array::from_slice(&[x, x], &[1, 2]);
        let qwen: HashMap<String, Array> = [
            ("v.blk.0.attn_q.weight", row(1.0)),
            ("v.blk.0.attn_k.weight", row(2.0)),
            ("v.blk.0.attn_v.weight", row(3.0)),
            ("v.blk.0.ln2.weight", zero()),
            ("mm.2.bias", zero()),
        ]
        .into_iter()
        .map(|(n, a)| (n.to_string(), a))
        .collect();
        let renamed = qwen2_vl_names(qwen).unwrap();
        let qkv = &renamed["vision_tower.blocks.0.attn.qkv.weight"];
        assert_eq!(qkv.shape(), [3, 2]);
        assert_eq!(qkv.as_slice::<f32>(), [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        assert!(renamed.contains_key("vision_tower.blocks.0.norm2.weight"));
        assert!(renamed.contains_key("vision_tower.merger.mlp.2.bias"));
        // A block missing one of q, k, v is an error, not a silent gap.
        let lone = [("v.blk.0.attn_q.weight".to_string(), row(1.0))].into();
        assert!(qwen2_vl_names(lone).is_err());
    }
}

//! The model hyper-parameters every architecture shares, read from a Hugging Face
//! `config.json` (GGUF metadata is mapped onto the same struct by `gguf.rs`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Decoder-only transformer families Seedbar runs, one file each under `architectures/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Gemma2,
    Gemma3Text,
    Llama,
    Mistral,
    Mixtral,
    Phi3,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    SmolLm3,
}

/// Each architecture under the `model_type` its `config.json` names it by.
const MODEL_TYPES: [(&str, Architecture); 10] = [
    ("gemma2", Architecture::Gemma2),
    ("gemma3_text", Architecture::Gemma3Text),
    ("llama", Architecture::Llama),
    ("mistral", Architecture::Mistral),
    ("mixtral", Architecture::Mixtral),
    ("phi3", Architecture::Phi3),
    ("qwen2", Architecture::Qwen2),
    ("qwen3", Architecture::Qwen3),
    ("qwen3_moe", Architecture::Qwen3Moe),
    ("smollm3", Architecture::SmolLm3),
];

impl Architecture {
    pub fn parse(model_type: &str) -> Result<Self> {
        MODEL_TYPES
            .iter()
            .find(|(name, _)| *name == model_type)
            .map(|&(_, arch)| arch)
            .ok_or_else(|| EngineError::UnsupportedArchitecture {
                name: model_type.to_string(),
                supported: Self::supported(),
            })
    }

    /// The `model_type`s Seedbar loads, comma-separated (for error messages).
    pub fn supported() -> String {
        MODEL_TYPES.map(|(name, _)| name).join(", ")
    }
}

/// Refuse a `config.json` `model_type` Seedbar can run neither as a chat model (an
/// [`Architecture`]) nor as an embedding model (`bert`), listing those it can.
pub fn check_runnable(model_type: &str) -> Result<()> {
    if is_encoder(&serde_json::json!({ "model_type": model_type })) {
        return Ok(());
    }
    Architecture::parse(model_type)
        .map(|_| ())
        .map_err(|_| EngineError::UnsupportedArchitecture {
            name: model_type.to_string(),
            supported: format!("{}; bert for embeddings", Architecture::supported()),
        })
}

/// `rope_scaling` as configs write it: Llama 3.x (`rope_type: "llama3"`), linear, and
/// Phi-3's long-rope (`type: "longrope"` or `"su"`, with per-frequency factors).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: String,
    #[serde(default = "one")]
    pub factor: f32,
    #[serde(default = "one")]
    pub low_freq_factor: f32,
    #[serde(default = "four")]
    pub high_freq_factor: f32,
    #[serde(default = "default_original_max")]
    pub original_max_position_embeddings: i32,
    /// Long-rope: each frequency's factor past the original context (one per frequency).
    #[serde(default)]
    pub long_factor: Option<Vec<f32>>,
}

impl Default for RopeScaling {
    /// No scaling (the serde defaults).
    fn default() -> Self {
        RopeScaling {
            rope_type: "default".into(),
            factor: one(),
            low_freq_factor: one(),
            high_freq_factor: four(),
            original_max_position_embeddings: default_original_max(),
            long_factor: None,
        }
    }
}

fn one() -> f32 {
    1.0
}
fn four() -> f32 {
    4.0
}
fn default_original_max() -> i32 {
    8192
}
fn default_rope_theta() -> f32 {
    10000.0
}
fn default_eps() -> f32 {
    1e-5
}

/// `eos_token_id` may be one id or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The shared hyper-parameters; field names follow `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub head_dim: Option<i32>,
    pub intermediate_size: i32,
    pub vocab_size: i32,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// transformers >= 5 nests `rope_theta` and the scaling here.
    #[serde(default, skip_serializing)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<i32>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// Everything else `config.json` holds: the architecture-specific settings, which each
    /// architecture's file reads with [`ModelConfig::params`].
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ModelConfig {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => EngineError::MissingFile {
                path: path.to_path_buf(),
            },
            _ => EngineError::io(path, e),
        })?;
        let json = serde_json::from_str(&text)
            .map_err(|e| EngineError::bad_file(path, format!("invalid config: {e}")))?;
        Self::from_json(json, path)
    }

    /// The config `json` holds (read from `path`, named in errors).
    pub fn from_json(json: serde_json::Value, path: &Path) -> Result<Self> {
        let mut config: ModelConfig = serde_json::from_value(json)
            .map_err(|e| EngineError::bad_file(path, format!("invalid config: {e}")))?;
        config.lift_rope_parameters(path)?;
        config.validate(path)?;
        Ok(config)
    }

    fn lift_rope_parameters(&mut self, path: &Path) -> Result<()> {
        let Some(mut params) = self.rope_parameters.take() else {
            return Ok(());
        };
        // Per layer type (Gemma 3): the global layers' RoPE is the model's, the sliding
        // layers' base goes where older configs put it.
        if let Some(full) = params.get("full_attention").cloned() {
            let local = params["sliding_attention"]["rope_theta"].clone();
            if !local.is_null() {
                self.extra.entry("rope_local_base_freq").or_insert(local);
            }
            params = full;
        }
        if let Some(theta) = params.get("rope_theta").and_then(|v| v.as_f64()) {
            self.rope_theta = theta as f32;
        }
        let rope_type = params
            .get("rope_type")
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        if self.rope_scaling.is_none() && rope_type != "default" {
            self.rope_scaling = Some(serde_json::from_value(params).map_err(|e| {
                EngineError::bad_file(path, format!("invalid rope_parameters: {e}"))
            })?);
        }
        Ok(())
    }

    /// The architecture's own settings (a struct of the `config.json` fields it reads).
    pub fn params<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(serde_json::Value::Object(self.extra.clone())).map_err(|e| {
            EngineError::bad_file(
                "config.json",
                format!("invalid {} settings: {e}", self.model_type),
            )
        })
    }

    pub fn architecture(&self) -> Result<Architecture> {
        Architecture::parse(&self.model_type)
    }

    pub fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> i32 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    pub fn validate(&self, path: &Path) -> Result<()> {
        self.architecture()?;
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, value)) = positive.iter().find(|(_, v)| *v <= 0) {
            return Err(EngineError::bad_file(
                path,
                format!("{name} must be positive, got {value}"),
            ));
        }
        if self.num_attention_heads % self.kv_heads() != 0 {
            return Err(EngineError::bad_file(
                path,
                "num_attention_heads must be a multiple of num_key_value_heads",
            ));
        }
        if let Some(scaling) = &self.rope_scaling {
            let long = matches!(scaling.rope_type.as_str(), "longrope" | "su");
            if long && scaling.long_factor.is_none() {
                return Err(EngineError::bad_file(
                    path,
                    "rope_scaling of type longrope needs `long_factor`",
                ));
            }
            if !long && !matches!(scaling.rope_type.as_str(), "llama3" | "default" | "linear") {
                return Err(EngineError::bad_file(
                    path,
                    format!("unsupported rope_scaling type `{}`", scaling.rope_type),
                ));
            }
        }
        Ok(())
    }
}

/// Whether a parsed `config.json` describes an encoder (`encoder.rs` runs those).
pub fn is_encoder(config: &serde_json::Value) -> bool {
    config["model_type"] == "bert"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers >= 5 writes Gemma 3's RoPE per layer type.
    #[test]
    fn per_layer_type_rope_parameters_are_lifted() {
        let path = std::env::temp_dir().join(format!("seedbar-config-{}.json", std::process::id()));
        let config = serde_json::json!({
            "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
            "sliding_window": 512,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        });
        std::fs::write(&path, config.to_string()).unwrap();
        let config = ModelConfig::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(config.rope_theta, 1e6);
        assert_eq!(config.rope_scaling.unwrap().factor, 8.0);
        assert_eq!(config.extra["rope_local_base_freq"], 1e4);
        assert_eq!(config.extra["sliding_window"], 512);
    }

    #[test]
    fn an_unsupported_architecture_lists_the_supported_ones() {
        let err = Architecture::parse("gpt_neox").unwrap_err().to_string();
        assert!(err.contains("`gpt_neox`"), "{err}");
        assert!(err.contains(&format!("(supported: {})", Architecture::supported())));
        assert!(Architecture::supported().contains("gemma3_text, llama"));
    }

    #[test]
    fn chat_and_embedding_model_types_are_runnable() {
        for model_type in ["qwen3_moe", "mixtral", "llama", "bert"] {
            check_runnable(model_type).unwrap();
        }
        let err = check_runnable("mamba").unwrap_err().to_string();
        assert!(err.contains("`mamba`") && err.contains("qwen3_moe") && err.contains("bert"));
    }
}

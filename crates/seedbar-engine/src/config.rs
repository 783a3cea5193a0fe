//! The model hyper-parameters every architecture shares, read from a Hugging Face
//! `config.json` (GGUF metadata is mapped onto the same struct by `gguf.rs`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Decoder-only transformer families Seedbar runs, one file each under `models/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Architecture {
    pub fn parse(model_type: &str) -> Result<Self> {
        match model_type {
            "llama" => Ok(Self::Llama),
            "mistral" => Ok(Self::Mistral),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            other => Err(EngineError::UnsupportedArchitecture(other.to_string())),
        }
    }
}

/// `rope_scaling` as Llama 3.x configs write it (`rope_type: "llama3"`).
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
}

impl ModelConfig {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => EngineError::MissingFile {
                path: path.to_path_buf(),
            },
            _ => EngineError::io(path, e),
        })?;
        let mut config: ModelConfig = serde_json::from_str(&text)
            .map_err(|e| EngineError::bad_file(path, format!("invalid config: {e}")))?;
        config.lift_rope_parameters(path)?;
        config.validate(path)?;
        Ok(config)
    }

    fn lift_rope_parameters(&mut self, path: &Path) -> Result<()> {
        let Some(params) = self.rope_parameters.take() else {
            return Ok(());
        };
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
            if !matches!(scaling.rope_type.as_str(), "llama3" | "default" | "linear") {
                return Err(EngineError::bad_file(
                    path,
                    format!("unsupported rope_scaling type `{}`", scaling.rope_type),
                ));
            }
        }
        Ok(())
    }
}

//! GGUF files (llama.cpp's llama, qwen2, qwen2vl, qwen3, qwen3moe, gemma2, gemma3 and phi3
//! architectures; Mistral's GGUFs are llama, and so are Mixtral's, with experts; Qwen2.5-VL's
//! decoder is qwen2vl, a qwen2 with multimodal RoPE's sections): tensors
//! renamed to Hugging Face names (llama's q/k rows un-permuted
//! back from llama.cpp's interleaved-RoPE layout, Gemma's `1 + w` norms back to `w`),
//! hyper-parameters and the tokenizer read from the metadata, with llama.cpp's fixed
//! choices where a setting has no key (Gemma 3's sliding-window pattern and local RoPE
//! base, Gemma 2's soft-caps when absent). Seedbar reads the container itself ([`file`]) and decodes the tensor types
//! ([`quants`]): Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and the K-quants Q4_K/Q5_K become MLX
//! affine-quantized triplets (`weight`, `scales`, `biases`); Q6_K too, in groups of 16, for
//! the CPU kernels (dequantized for MLX); Q2_K and Q3_K are dequantized. A vision model's
//! tower and projector come in a file of their own ([`mmproj`]).

pub(crate) mod file;
pub mod mmproj;
pub(crate) mod quants;

use std::{collections::HashMap, path::Path};

use mlx_rs::{Array, Dtype};
use serde_json::json;

use self::file::{GgufFile, Value};
use crate::{
    config::{ModelConfig, RopeScaling, TokenIds},
    error::{EngineError, Result},
    tokenizer::{GgufVocab, Tokenizer},
};

/// Each `general.architecture` Seedbar loads, with the `model_type` it runs as (a llama
/// with experts runs as Mixtral).
const ARCHITECTURES: [(&str, &str); 8] = [
    ("gemma2", "gemma2"),
    ("gemma3", "gemma3_text"),
    ("llama", "llama"),
    ("phi3", "phi3"),
    ("qwen2", "qwen2"),
    ("qwen2vl", "qwen2"),
    ("qwen3", "qwen3"),
    ("qwen3moe", "qwen3_moe"),
];

/// The `general.architecture`s Seedbar loads, comma-separated (for error messages).
pub fn supported_architectures() -> String {
    ARCHITECTURES.map(|(name, _)| name).join(", ")
}

/// The `model_type` a GGUF `general.architecture` runs as, or the error naming the
/// supported ones.
pub fn model_type(architecture: &str) -> Result<&'static str> {
    ARCHITECTURES
        .iter()
        .find(|(name, _)| *name == architecture)
        .map(|&(_, model_type)| model_type)
        .ok_or_else(|| EngineError::UnsupportedArchitecture {
            name: format!("{architecture} (in GGUF)"),
            supported: supported_architectures(),
        })
}

/// The `general.architecture` a GGUF file's header names; `None` when the file cannot be
/// read.
pub fn architecture(path: &Path) -> Option<String> {
    GgufFile::text_value(path, "general.architecture")
        .ok()
        .flatten()
}

/// The projector file ([`mmproj`]) that gives the GGUF model at `path` its image input,
/// where one lies beside it.
pub fn projector_beside(path: &Path) -> Option<std::path::PathBuf> {
    let file = GgufFile::open(path).ok()?;
    let meta = Metadata { file: &file, path };
    let arch = meta.string("general.architecture").ok()??;
    let hidden = meta.number(&format!("{arch}.embedding_length")).ok()??;
    mmproj::for_model(path, &arch, hidden as i32)
}

/// What a GGUF file holds, in the form the rest of the engine uses.
pub struct GgufContents {
    /// `general.architecture`.
    pub architecture: String,
    pub config: ModelConfig,
    pub tensors: HashMap<String, Array>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
    pub bos_token: String,
    pub eos_token: String,
}

struct Metadata<'a> {
    file: &'a GgufFile,
    path: &'a Path,
}

impl Metadata<'_> {
    fn number(&self, key: &str) -> Result<Option<f32>> {
        match self.file.get(key) {
            Some(Value::Integer(n)) => Ok(Some(*n as f32)),
            Some(Value::Float(n)) => Ok(Some(*n as f32)),
            Some(Value::Bool(b)) => Ok(Some(f32::from(u8::from(*b)))),
            None => Ok(None),
            Some(_) => Err(self.wrong_kind(key, "a number")),
        }
    }

    fn required(&self, key: &str) -> Result<f32> {
        self.number(key)?
            .ok_or_else(|| EngineError::bad_file(self.path, format!("metadata `{key}` is missing")))
    }

    fn string(&self, key: &str) -> Result<Option<String>> {
        match self.file.get(key) {
            Some(Value::Text(s)) => Ok(Some(s.clone())),
            None => Ok(None),
            Some(_) => Err(self.wrong_kind(key, "a string")),
        }
    }

    /// The items of the array `key` (empty when absent), each read by `item`.
    fn array<T>(
        &self,
        key: &str,
        what: &str,
        item: impl Fn(&Value) -> Option<T>,
    ) -> Result<Vec<T>> {
        match self.file.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(items)) => items
                .iter()
                .map(&item)
                .collect::<Option<Vec<T>>>()
                .ok_or_else(|| self.wrong_kind(key, what)),
            Some(_) => Err(self.wrong_kind(key, what)),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>> {
        self.array(key, "an array of strings", |v| match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        })
    }

    fn numbers(&self, key: &str) -> Result<Vec<f64>> {
        self.array(key, "an array of numbers", |v| match v {
            Value::Integer(n) => Some(*n as f64),
            Value::Float(n) => Some(*n),
            _ => None,
        })
    }

    fn wrong_kind(&self, key: &str, what: &str) -> EngineError {
        EngineError::bad_file(self.path, format!("metadata `{key}` is not {what}"))
    }
}

/// The GGUF file at `path` as the engine runs it; tensors decoded from quantized blocks
/// (dequantized values, affine scales and biases) come in `dtype`; `small_groups`: Q6_K
/// stays quantized, in groups of 16 (for the CPU kernels; MLX's quantized ops take 32 and up).
pub fn read(path: &Path, dtype: Dtype, small_groups: bool) -> Result<GgufContents> {
    if !path.exists() {
        return Err(EngineError::MissingFile {
            path: path.to_path_buf(),
        });
    }
    let file = GgufFile::open(path)?;
    let meta = Metadata { file: &file, path };
    let arch = meta
        .string("general.architecture")?
        .ok_or_else(|| EngineError::bad_file(path, "metadata `general.architecture` is missing"))?;
    let model_type = model_type(&arch)?;
    let key = |k: &str| format!("{arch}.{k}");
    let int = |k: &str| -> Result<i32> { Ok(meta.required(&key(k))? as i32) };
    let tokens = meta.strings("tokenizer.ggml.tokens")?;
    let heads = int("attention.head_count")?;
    let kv_heads = meta
        .number(&key("attention.head_count_kv"))?
        .map_or(heads, |v| v as i32);
    let hidden = int("embedding_length")?;
    let token_id = |k: &str| -> Result<Option<u32>> { Ok(meta.number(k)?.map(|v| v as u32)) };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let eos = token_id("tokenizer.ggml.eos_token_id")?;
    let mut tensors = file.tensors(dtype, small_groups)?;
    let block_count = int("block_count")?;
    let mut config = ModelConfig {
        model_type: model_type.into(),
        hidden_size: hidden,
        num_hidden_layers: block_count,
        num_attention_heads: heads,
        num_key_value_heads: Some(kv_heads),
        head_dim: meta.number(&key("attention.key_length"))?.map(|v| v as i32),
        intermediate_size: int("feed_forward_length")?,
        vocab_size: meta
            .number(&key("vocab_size"))?
            .map_or(tokens.len() as i32, |v| v as i32),
        rms_norm_eps: meta.required(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: meta.number(&key("rope.freq_base"))?.unwrap_or(10000.0),
        rope_traditional: false,
        rope_scaling: match meta.string(&key("rope.scaling.type"))?.as_deref() {
            Some("linear") => Some(RopeScaling {
                rope_type: "linear".into(),
                factor: meta.required(&key("rope.scaling.factor"))?,
                ..RopeScaling::default()
            }),
            _ => None,
        },
        rope_parameters: None,
        tie_word_embeddings: !tensors.contains_key("output.weight"),
        attention_bias: false,
        max_position_embeddings: meta.number(&key("context_length"))?.map(|v| v as i32),
        bos_token_id: bos,
        eos_token_id: eos.map(TokenIds::One),
        extra: Default::default(),
    };
    // Mixtures of experts: how many, and how many each token runs through.
    let experts = meta
        .number(&key("expert_count"))?
        .map(|v| v as i32)
        .filter(|&n| n > 0);
    let experts_per_token = || -> Result<i32> { int("expert_used_count") };
    match arch.as_str() {
        "llama" => {
            let head_dim = config.head_dim();
            unpermute_rows(&mut tensors, "attn_q", heads, head_dim)?;
            unpermute_rows(&mut tensors, "attn_k", kv_heads, head_dim)?;
            if let Some(experts) = experts {
                config.model_type = "mixtral".into();
                let extra = json!({
                    "num_local_experts": experts,
                    "num_experts_per_tok": experts_per_token()?,
                });
                config.extra = extra.as_object().cloned().expect("an object");
            }
        }
        "qwen3moe" => {
            // llama.cpp renormalizes the chosen experts' weights (`norm_topk_prob`) and
            // routes every layer.
            let extra = json!({
                "num_experts": int("expert_count")?,
                "num_experts_per_tok": experts_per_token()?,
                "moe_intermediate_size": int("expert_feed_forward_length")?,
                "norm_topk_prob": true,
            });
            config.extra = extra.as_object().cloned().expect("an object");
        }
        "gemma2" | "gemma3" => {
            let gemma3 = arch == "gemma3";
            let head_dim = config.head_dim();
            // llama.cpp's Gemma: a query scale of 1/sqrt(head_dim), but of
            // 1/sqrt(hidden/heads) for the 27B (46 layers in Gemma 2, 62 in Gemma 3).
            // Gemma 3 has every sixth layer global, the sliding ones with a RoPE base of
            // 10000; Gemma 2 alternates (the model's default) and soft-caps as its keys say.
            let scalar = if block_count == if gemma3 { 62 } else { 46 } {
                hidden / heads
            } else {
                head_dim
            };
            let window = meta.required(&key("attention.sliding_window"))? as i32;
            let extra = if gemma3 {
                json!({
                    "query_pre_attn_scalar": scalar,
                    "sliding_window": window,
                    "sliding_window_pattern": 6,
                    "rope_local_base_freq": 10000.0,
                })
            } else {
                json!({
                    "query_pre_attn_scalar": scalar,
                    "sliding_window": window,
                    "attn_logit_softcapping": meta.number(&key("attn_logit_softcapping"))?,
                    "final_logit_softcapping": meta.number(&key("final_logit_softcapping"))?,
                })
            };
            config.extra = extra.as_object().cloned().expect("an object");
            for (name, norm) in tensors.iter_mut() {
                if name.ends_with("norm.weight") {
                    *norm = norm
                        .as_dtype(Dtype::Float32)?
                        .subtract(Array::from_f32(1.0))?;
                }
            }
        }
        "qwen2vl" => {
            // Four counts (the fourth, 0, for models with a fourth axis): pairs turned by
            // time, row and column.
            let sections = meta.numbers(&key("rope.dimension_sections"))?;
            if !sections.is_empty() {
                let sections: Vec<i64> = sections.iter().take(3).map(|&n| n as i64).collect();
                config.extra.insert("mrope_section".into(), json!(sections));
            }
        }
        "phi3" => {
            let head_dim = hidden / heads;
            let rotary = meta
                .number(&key("rope.dimension_count"))?
                .map_or(head_dim, |v| v as i32);
            let original = meta.number(&key("rope.scaling.original_context_length"))?;
            config.extra.insert(
                "partial_rotary_factor".into(),
                json!(rotary as f32 / head_dim as f32),
            );
            if let Some(original) = original {
                config.extra.insert(
                    "original_max_position_embeddings".into(),
                    json!(original as i32),
                );
            }
            tensors.remove("rope_factors_short.weight");
            if let Some(long) = tensors.remove("rope_factors_long.weight") {
                config.rope_scaling = Some(RopeScaling {
                    rope_type: "longrope".into(),
                    long_factor: Some(long.as_dtype(Dtype::Float32)?.as_slice::<f32>().to_vec()),
                    ..RopeScaling::default()
                });
            }
        }
        _ => {}
    }
    config.validate(path)?;
    let names = TensorNames::of(&arch, &tensors);
    let tensors = tensors
        .into_iter()
        .map(|(name, t)| (names.hf_name(&name), t))
        .collect();
    let token_types = match meta.numbers("tokenizer.ggml.token_type")? {
        types if types.is_empty() => vec![1; tokens.len()],
        types => types.into_iter().map(|t| t as i32).collect(),
    };
    let token_text = |id: Option<u32>| {
        id.and_then(|i| tokens.get(i as usize))
            .cloned()
            .unwrap_or_default()
    };
    let (bos_token, eos_token) = (token_text(bos), token_text(eos));
    let tokenizer = Tokenizer::from_gguf(GgufVocab {
        model: meta.string("tokenizer.ggml.model")?.unwrap_or_default(),
        pre: meta
            .string("tokenizer.ggml.pre")?
            .unwrap_or_else(|| "default".into()),
        merges: meta.strings("tokenizer.ggml.merges")?,
        token_types,
        scores: meta
            .numbers("tokenizer.ggml.scores")?
            .into_iter()
            .map(|s| s as f32)
            .collect(),
        add_space_prefix: meta
            .number("tokenizer.ggml.add_space_prefix")?
            .is_none_or(|v| v != 0.0),
        tokens,
    })?;
    Ok(GgufContents {
        architecture: arch,
        config,
        tensors,
        tokenizer,
        chat_template: meta.string("tokenizer.chat_template")?,
        bos_token,
        eos_token,
    })
}

/// llama.cpp stores q/k rows of each head as (half, 2) for interleaved RoPE; MLX and
/// Hugging Face use (2, half). Rows only move, so quantized triplets permute the same way.
fn unpermute_rows(
    tensors: &mut HashMap<String, Array>,
    kind: &str,
    heads: i32,
    head_dim: i32,
) -> Result<()> {
    let names: Vec<String> = tensors
        .keys()
        .filter(|n| n.split('.').nth(2) == Some(kind))
        .cloned()
        .collect();
    for name in names {
        let t = &tensors[&name];
        let shape = t.shape().to_vec();
        if shape.len() != 2 || shape[0] != heads * head_dim {
            return Err(EngineError::WrongShape {
                name,
                expected: vec![heads * head_dim, -1],
                actual: shape,
            });
        }
        let fixed = t
            .reshape(&[heads, head_dim / 2, 2, shape[1]])?
            .swap_axes(1, 2)?
            .reshape(&shape)?;
        tensors.insert(name, fixed);
    }
    Ok(())
}

/// How an architecture's GGUF tensor names map to Hugging Face names.
struct TensorNames {
    /// Gemma's sandwich norms: `ffn_norm` is the MLP's input norm and the attention output
    /// has a norm of its own.
    sandwich_norms: bool,
    /// Phi-3's `ffn_up` holds the gate and up projections, fused.
    fused_gate_up: bool,
    /// Where a layer's mixture of experts lives (`mlp` in Qwen3-MoE, `block_sparse_moe` in
    /// Mixtral): its router (`ffn_gate_inp`), its stacked experts (`ffn_*_exps`, as
    /// mlx-lm's `switch_mlp` stacks them) and older GGUFs' per-expert tensors
    /// (`ffn_gate.E`, as Mixtral's `experts.E.w1`).
    moe: &'static str,
}

impl TensorNames {
    fn of(arch: &str, tensors: &HashMap<String, Array>) -> Self {
        TensorNames {
            sandwich_norms: arch == "gemma2" || arch == "gemma3",
            fused_gate_up: arch == "phi3" && !tensors.contains_key("blk.0.ffn_gate.weight"),
            moe: if arch == "qwen3moe" {
                "mlp"
            } else {
                "block_sparse_moe"
            },
        }
    }

    /// `blk.3.attn_q.scales` -> `model.layers.3.self_attn.q_proj.scales`
    fn hf_name(&self, gguf: &str) -> String {
        let (stem, suffix) = gguf.rsplit_once('.').unwrap_or((gguf, ""));
        let mapped = match stem {
            "token_embd" => "model.embed_tokens".to_string(),
            "output_norm" => "model.norm".to_string(),
            "output" => "lm_head".to_string(),
            _ => match stem.split('.').collect::<Vec<_>>().as_slice() {
                ["blk", layer, part] => {
                    let module = match *part {
                        "attn_norm" => "input_layernorm",
                        "ffn_norm" if self.sandwich_norms => "pre_feedforward_layernorm",
                        "ffn_norm" => "post_attention_layernorm",
                        "post_attention_norm" => "post_attention_layernorm",
                        "post_ffw_norm" => "post_feedforward_layernorm",
                        "attn_q" => "self_attn.q_proj",
                        "attn_k" => "self_attn.k_proj",
                        "attn_v" => "self_attn.v_proj",
                        "attn_qkv" => "self_attn.qkv_proj",
                        "attn_q_norm" => "self_attn.q_norm",
                        "attn_k_norm" => "self_attn.k_norm",
                        "attn_output" => "self_attn.o_proj",
                        "ffn_gate" => "mlp.gate_proj",
                        "ffn_up" if self.fused_gate_up => "mlp.gate_up_proj",
                        "ffn_up" => "mlp.up_proj",
                        "ffn_down" => "mlp.down_proj",
                        "ffn_gate_inp" => return self.expert(layer, "gate", suffix),
                        "ffn_gate_exps" => {
                            return self.expert(layer, "switch_mlp.gate_proj", suffix)
                        }
                        "ffn_up_exps" => return self.expert(layer, "switch_mlp.up_proj", suffix),
                        "ffn_down_exps" => {
                            return self.expert(layer, "switch_mlp.down_proj", suffix)
                        }
                        other => return format!("model.layers.{layer}.{other}.{suffix}"),
                    };
                    format!("model.layers.{layer}.{module}")
                }
                ["blk", layer, part @ ("ffn_gate" | "ffn_up" | "ffn_down"), expert] => {
                    let name = match *part {
                        "ffn_gate" => "w1",
                        "ffn_up" => "w3",
                        _ => "w2",
                    };
                    return self.expert(layer, &format!("experts.{expert}.{name}"), suffix);
                }
                _ => stem.to_string(),
            },
        };
        format!("{mapped}.{suffix}")
    }

    /// `part` of layer `layer`'s mixture of experts.
    fn expert(&self, layer: &str, part: &str, suffix: &str) -> String {
        format!("model.layers.{layer}.{}.{part}.{suffix}", self.moe)
    }
}

#[cfg(test)]
mod tests {
    use super::TensorNames;

    #[test]
    fn names_map_to_hugging_face() {
        let llama = TensorNames::of("llama", &Default::default());
        let hf_name = |n: &str| llama.hf_name(n);
        assert_eq!(
            hf_name("blk.3.attn_q.scales"),
            "model.layers.3.self_attn.q_proj.scales"
        );
        assert_eq!(hf_name("token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(hf_name("output.weight"), "lm_head.weight");
        assert_eq!(
            hf_name("blk.1.ffn_up_exps.scales"),
            "model.layers.1.block_sparse_moe.switch_mlp.up_proj.scales"
        );
        assert_eq!(
            hf_name("blk.1.ffn_down.7.weight"),
            "model.layers.1.block_sparse_moe.experts.7.w2.weight"
        );
        let qwen3moe = TensorNames::of("qwen3moe", &Default::default());
        assert_eq!(
            qwen3moe.hf_name("blk.0.ffn_gate_inp.weight"),
            "model.layers.0.mlp.gate.weight"
        );
    }
}

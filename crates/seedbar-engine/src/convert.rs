//! `seedbar convert`: a GGUF model written as an MLX / Hugging Face safetensors directory
//! (config with per-layer quantization, weights, tokenizer.json, tokenizer_config.json with
//! the chat template, generation_config.json) that Seedbar and mlx-lm both load.

use std::{collections::HashMap, path::Path};

use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};

use crate::{
    chat_template::CHATML_TEMPLATE,
    error::{EngineError, Result},
    gguf,
};

/// The MLX affine groups Seedbar builds from GGUF blocks are 32 weights wide.
const GGUF_GROUP_SIZE: i32 = 32;

/// `input` written to `out_dir`; weights Seedbar decodes from quantized blocks (dequantized
/// tensors, affine scales and biases) are stored as `dtype`.
pub fn gguf_to_mlx(input: &Path, out_dir: &Path, dtype: Dtype) -> Result<()> {
    let contents = gguf::read(input, dtype, false)?;
    std::fs::create_dir_all(out_dir).map_err(|e| EngineError::io(out_dir, e))?;
    let write_json = |name: &str, value: &Value| -> Result<()> {
        let path = out_dir.join(name);
        let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
        std::fs::write(&path, text).map_err(|e| EngineError::io(path, e))
    };

    let mut config = serde_json::to_value(&contents.config).expect("config serializes");
    config["architectures"] = json!(["LlamaForCausalLM"]);
    if let Some(quantization) = quantization_config(&contents.tensors) {
        config["quantization"] = quantization;
    }
    write_json("config.json", &config)?;

    let weights = out_dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "mlx".to_string())]);
    Array::save_safetensors(
        contents.tensors.iter().map(|(k, v)| (k.as_str(), v)),
        &metadata,
        &weights,
    )
    .map_err(|e| EngineError::bad_file(&weights, format!("cannot write weights: {e}")))?;

    contents.tokenizer.save(&out_dir.join("tokenizer.json"))?;
    write_json(
        "tokenizer_config.json",
        &json!({
            "chat_template": contents.chat_template.as_deref().unwrap_or(CHATML_TEMPLATE),
            "bos_token": contents.bos_token,
            "eos_token": contents.eos_token,
            "add_bos_token": false,
            "clean_up_tokenization_spaces": false,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }),
    )?;
    write_json(
        "generation_config.json",
        &json!({
            "bos_token_id": contents.config.bos_token_id,
            "eos_token_id": contents.config.eos_token_id,
        }),
    )
}

/// mlx-lm's `quantization` block: the most common bit width as the default, and an entry
/// for every module that differs (GGUF mixes Q4 and Q8 layers).
fn quantization_config(tensors: &HashMap<String, Array>) -> Option<Value> {
    let mut bits_by_module: Vec<(String, i32)> = tensors
        .iter()
        .filter_map(|(name, scales)| {
            let module = name.strip_suffix(".scales")?;
            let weight = tensors.get(&format!("{module}.weight"))?;
            let in_features = scales.shape()[1] * GGUF_GROUP_SIZE;
            Some((module.to_string(), weight.shape()[1] * 32 / in_features))
        })
        .collect();
    if bits_by_module.is_empty() {
        return None;
    }
    bits_by_module.sort();
    let mut counts: HashMap<i32, usize> = HashMap::new();
    for (_, bits) in &bits_by_module {
        *counts.entry(*bits).or_default() += 1;
    }
    let default_bits = counts
        .into_iter()
        .max_by_key(|(bits, n)| (*n, *bits))
        .map(|(b, _)| b)?;
    let mut block = Map::new();
    block.insert("group_size".into(), json!(GGUF_GROUP_SIZE));
    block.insert("bits".into(), json!(default_bits));
    for (module, bits) in bits_by_module
        .into_iter()
        .filter(|(_, b)| *b != default_bits)
    {
        block.insert(
            module,
            json!({ "group_size": GGUF_GROUP_SIZE, "bits": bits }),
        );
    }
    Some(Value::Object(block))
}

//! What a model's files hold, read from their headers alone (no weights loaded): the
//! architecture, the base name, the parameter count (the weights' element counts), the
//! quantization (the tensor type holding most weights) and the numeric hyper-parameters. Read
//! from a GGUF file's metadata and tensor infos, or a safetensors folder's `config.json` and
//! tensor headers.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::{
    error::{EngineError, Result},
    gguf::{
        file::{GgufFile, Value as GgufValue},
        quants::type_name,
    },
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// `general.architecture` of a GGUF file, `model_type` of a folder (`llama`, `bert`...).
    pub architecture: String,
    /// `general.basename` of a GGUF file, when it has one.
    pub basename: Option<String>,
    /// Weights, counted as elements (unpacked where quantized).
    pub parameters: u64,
    /// The type holding most weights, in GGUF's names: `Q4_1`, `Q8_0`, `F16`, `BF16`, `F32`;
    /// `Q4` / `Q8` for MLX affine-quantized folders.
    pub quantization: String,
    /// Numeric hyper-parameters under GGUF's key names without the architecture prefix
    /// (`context_length`, `embedding_length`, `block_count`, `attention.head_count`...).
    pub hyperparameters: BTreeMap<String, u64>,
    /// The chat template the files carry (GGUF's `tokenizer.chat_template`, a folder's
    /// `chat_template.jinja` or `tokenizer_config.json`'s), if any.
    pub chat_template: Option<String>,
}

/// The inventory of a GGUF file or a safetensors folder.
pub fn read(path: &Path) -> Result<Inventory> {
    if path.is_dir() {
        read_folder(path)
    } else {
        read_gguf(path)
    }
}

/// Billions, millions and thousands as Ollama writes parameter counts (`135M`, `134.52M`,
/// `7.2B`).
pub fn human_count(count: u64) -> String {
    let n = count as f64;
    let scaled = |unit: f64, decimals: usize, suffix: &str| {
        let value = n / unit;
        if value == value.floor() {
            format!("{value:.0}{suffix}")
        } else {
            format!("{value:.decimals$}{suffix}")
        }
    };
    match count {
        1_000_000_000.. => scaled(1e9, 1, "B"),
        1_000_000.. => scaled(1e6, 2, "M"),
        1_000.. => format!("{:.0}K", n / 1e3),
        _ => count.to_string(),
    }
}

// ---- GGUF ------------------------------------------------------------------------------

fn read_gguf(path: &Path) -> Result<Inventory> {
    let file = GgufFile::open(path)?;
    let text = |key: &str| match file.get(key) {
        Some(GgufValue::Text(t)) => Some(t.clone()),
        _ => None,
    };
    let architecture = text("general.architecture")
        .ok_or_else(|| EngineError::bad_file(path, "metadata `general.architecture` is missing"))?;
    let prefix = format!("{architecture}.");
    let hyperparameters = file
        .metadata()
        .filter_map(|(key, value)| {
            let n = match value {
                GgufValue::Integer(n) => (*n).max(0) as u64,
                GgufValue::Bool(b) => u64::from(*b),
                _ => return None,
            };
            Some((key.strip_prefix(&prefix)?.to_string(), n))
        })
        .collect();
    let mut elements_by_type: HashMap<String, u64> = HashMap::new();
    let mut parameters = 0;
    for (shape, type_id) in file.tensor_types() {
        let elements = shape.iter().fold(1u64, |n, &d| n.saturating_mul(d));
        parameters += elements;
        if shape.len() >= 2 {
            *elements_by_type.entry(type_name(type_id)).or_default() += elements;
        }
    }
    Ok(Inventory {
        basename: text("general.basename"),
        architecture,
        parameters,
        quantization: most(elements_by_type).unwrap_or_else(|| "F32".into()),
        hyperparameters,
        chat_template: text("tokenizer.chat_template"),
    })
}

/// The key with the largest count.
fn most(counts: HashMap<String, u64>) -> Option<String> {
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map(|(key, _)| key)
}

// ---- safetensors folders ---------------------------------------------------------------

/// `config.json` names of the hyper-parameters, and GGUF's.
const CONFIG_KEYS: [(&str, &str); 7] = [
    ("max_position_embeddings", "context_length"),
    ("hidden_size", "embedding_length"),
    ("num_hidden_layers", "block_count"),
    ("num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "attention.head_count_kv"),
    ("intermediate_size", "feed_forward_length"),
    ("vocab_size", "vocab_size"),
];

#[derive(serde::Deserialize)]
struct TensorHeader {
    dtype: String,
    shape: Vec<u64>,
}

fn read_folder(dir: &Path) -> Result<Inventory> {
    let config_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| EngineError::io(&config_path, e))?;
    let config: Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::bad_file(&config_path, e.to_string()))?;
    let bits = config.pointer("/quantization/bits").and_then(Value::as_u64);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let mut tensors = HashMap::new();
    for file in files {
        tensors.extend(safetensors_header(&file)?);
    }
    let mut elements_by_type: HashMap<String, u64> = HashMap::new();
    let mut parameters = 0;
    for (name, tensor) in &tensors {
        // An MLX quantized matrix is `X.weight` (packed in u32s), `X.scales` and `X.biases`.
        let stem = name
            .rsplit_once('.')
            .map_or(name.as_str(), |(stem, _)| stem);
        let packed_bits = bits.filter(|_| tensors.contains_key(&format!("{stem}.scales")));
        if packed_bits.is_some() && !name.ends_with(".weight") {
            continue;
        }
        let mut elements: u64 = tensor.shape.iter().product();
        let kind = match packed_bits {
            Some(bits) => {
                elements = elements * 32 / bits.max(1);
                format!("Q{bits}")
            }
            None => tensor.dtype.clone(),
        };
        parameters += elements;
        if tensor.shape.len() >= 2 {
            *elements_by_type.entry(kind).or_default() += elements;
        }
    }
    let hyperparameters = CONFIG_KEYS
        .iter()
        .filter_map(|(config_key, key)| Some((key.to_string(), config[*config_key].as_u64()?)))
        .collect();
    Ok(Inventory {
        architecture: config["model_type"]
            .as_str()
            .unwrap_or("unknown")
            .to_string(),
        basename: None,
        parameters,
        quantization: most(elements_by_type).unwrap_or_else(|| "F32".into()),
        hyperparameters,
        chat_template: crate::model::chat_template_source(
            dir,
            &crate::model::read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default(),
        )?,
    })
}

/// A safetensors file's tensors: 8 bytes of header length, then the JSON header.
fn safetensors_header(path: &Path) -> Result<HashMap<String, TensorHeader>> {
    let mut file = File::open(path).map_err(|e| EngineError::io(path, e))?;
    let mut len = [0; 8];
    file.read_exact(&mut len)
        .map_err(|e| EngineError::io(path, e))?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(EngineError::bad_file(
            path,
            "the safetensors header is over 100 MiB",
        ));
    }
    let mut header = vec![0; len as usize];
    file.read_exact(&mut header)
        .map_err(|e| EngineError::io(path, e))?;
    let mut entries: HashMap<String, Value> = serde_json::from_slice(&header)
        .map_err(|e| EngineError::bad_file(path, format!("bad safetensors header: {e}")))?;
    entries.remove("__metadata__");
    entries
        .into_iter()
        .map(|(name, value)| {
            let tensor = serde_json::from_value(value)
                .map_err(|e| EngineError::bad_file(path, format!("tensor {name}: {e}")))?;
            Ok((name, tensor))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_ollama_writes_them() {
        assert_eq!(human_count(134_515_008), "134.52M");
        assert_eq!(human_count(135_000_000), "135M");
        assert_eq!(human_count(7_241_732_096), "7.2B");
        assert_eq!(human_count(8_000_000_000), "8B");
        assert_eq!(human_count(22_700), "23K");
        assert_eq!(human_count(999), "999");
    }

    #[test]
    fn a_folder_counts_packed_weights_unpacked() {
        let dir = std::env::temp_dir().join(format!("seedbar-inventory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type": "llama", "hidden_size": 64, "max_position_embeddings": 2048,
                "quantization": {"bits": 4, "group_size": 64}}"#,
        )
        .unwrap();
        let header = serde_json::json!({
            "__metadata__": {"format": "mlx"},
            "layers.0.q.weight": {"dtype": "U32", "shape": [64, 8], "data_offsets": [0, 0]},
            "layers.0.q.scales": {"dtype": "F16", "shape": [64, 1], "data_offsets": [0, 0]},
            "layers.0.q.biases": {"dtype": "F16", "shape": [64, 1], "data_offsets": [0, 0]},
            "norm.weight": {"dtype": "F16", "shape": [64], "data_offsets": [0, 0]},
        })
        .to_string();
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        let inventory = read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(inventory.architecture, "llama");
        assert_eq!(inventory.parameters, 64 * 64 + 64);
        assert_eq!(inventory.quantization, "Q4");
        assert_eq!(inventory.hyperparameters["context_length"], 2048);
        assert_eq!(inventory.hyperparameters["embedding_length"], 64);
    }
}

//! A ready-to-run model: transformer weights in MLX, tokenizer, chat template and stop ids,
//! loaded from a GGUF file or a Hugging Face / mlx-community directory.

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use mlx_rs::{Array, Dtype};
use seedbar_kernels::Activations;
use serde_json::Value;

use crate::{
    architectures::{self, Transformer},
    chat_template::{ChatMessage, ChatTemplate, TemplateKwargs, CHATML_TEMPLATE},
    config::{ModelConfig, TokenIds},
    error::{EngineError, Result},
    gguf,
    row_trace::RowTrace,
    step::{
        kv_cache::{KvCache, KvPool},
        plan::{StepPlan, WeightKind},
        Forward, Logits, StepTokens,
    },
    tokenizer::Tokenizer,
    vision::{self, Vision},
    weights::{self, LoadOptions, WeightMap},
};

/// Where a model's weights came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    Safetensors,
}

pub struct Model {
    pub(crate) transformer: Transformer,
    /// The image input of a multimodal checkpoint.
    pub vision: Option<Vision>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Token ids that end a reply.
    pub eos_ids: Vec<u32>,
    pub format: ModelFormat,
    pub path: PathBuf,
    /// The dtype its activations and dense weights are computed in.
    pub compute_dtype: Dtype,
}

impl Model {
    /// Load with the weight layout best for the default device.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, LoadOptions::for_default_device())
    }

    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Self> {
        if !path.exists() {
            return Err(EngineError::MissingFile {
                path: path.to_path_buf(),
            });
        }
        if path.is_dir() {
            Self::load_directory(path, options)
        } else {
            Self::load_gguf(path, options)
        }
    }

    fn load_gguf(path: &Path, options: LoadOptions) -> Result<Self> {
        // A GGUF's products on the CPU as llama.cpp computes them: over int8 activations.
        let options = LoadOptions {
            activations: options.activations.or(Some(Activations::Int8)),
            ..options
        };
        // On the CPU, Q6_K stays quantized for the packed kernels (groups of 16).
        let contents = gguf::read(path, options.compute_dtype, options.dequantize)?;
        let hidden = contents.config.hidden_size;
        // The image tower and projector, where a projector file lies beside the model.
        let mut tensors = contents.tensors;
        let projector = match gguf::mmproj::for_model(path, &contents.architecture, hidden) {
            Some(file) => {
                let (dtype, small_groups) = (options.compute_dtype, options.dequantize);
                let parts = gguf::mmproj::read(&file, &contents.tokenizer, dtype, small_groups)?;
                tensors.extend(parts.tensors);
                Some((file, parts.config, parts.preprocessor))
            }
            None => None,
        };
        let mut weights = WeightMap::new(tensors, options);
        let vision = projector
            .map(|(file, config, preprocessor)| {
                let tokenizer = &contents.tokenizer;
                Vision::load(
                    &config,
                    preprocessor,
                    &file,
                    tokenizer,
                    &mut weights,
                    hidden,
                )
            })
            .transpose()?;
        let transformer = architectures::build(contents.config.clone(), &mut weights, options)?;
        let template = ChatTemplate::new(
            contents.chat_template.as_deref().unwrap_or(CHATML_TEMPLATE),
            &contents.bos_token,
            &contents.eos_token,
        )?;
        let eos_ids = stop_ids(
            &contents.config,
            &[],
            &contents.tokenizer,
            &contents.eos_token,
        );
        Ok(Model {
            transformer,
            vision,
            tokenizer: contents.tokenizer,
            template,
            eos_ids,
            format: ModelFormat::Gguf,
            path: path.to_path_buf(),
            compute_dtype: options.compute_dtype,
        })
    }

    fn load_directory(dir: &Path, options: LoadOptions) -> Result<Self> {
        let config_path = dir.join("config.json");
        let Some(raw_config) = read_json(&config_path)? else {
            return Err(EngineError::MissingFile { path: config_path });
        };
        let (text_config, multimodal) = vision::split_config(raw_config);
        let config = ModelConfig::from_json(text_config, &config_path)?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let tokenizer_config =
            read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation_config =
            read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let mut tensors = read_safetensors(dir)?;
        if multimodal.is_some() {
            tensors = vision::rename_weights(tensors);
        }
        let options = options.for_stored(weights::stored_float(&tensors));
        let mut weights = WeightMap::new(tensors, options);
        let vision = multimodal
            .map(|raw| {
                let preprocessor = Vision::read_preprocessor(dir)?;
                let width = config.hidden_size;
                Vision::load(
                    &raw,
                    preprocessor,
                    &config_path,
                    &tokenizer,
                    &mut weights,
                    width,
                )
            })
            .transpose()?;
        let transformer = architectures::build(config.clone(), &mut weights, options)?;
        let special = |key: &str| -> String {
            match &tokenizer_config[key] {
                Value::String(s) => s.clone(),
                Value::Object(o) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                _ => String::new(),
            }
        };
        let (bos, eos) = (special("bos_token"), special("eos_token"));
        let template_source = chat_template_source(dir, &tokenizer_config)?;
        let template = ChatTemplate::new(
            template_source.as_deref().unwrap_or(CHATML_TEMPLATE),
            &bos,
            &eos,
        )?;
        let generation_eos =
            serde_json::from_value::<TokenIds>(generation_config["eos_token_id"].clone())
                .map(|ids| ids.to_vec())
                .unwrap_or_default();
        let eos_ids = stop_ids(&config, &generation_eos, &tokenizer, &eos);
        Ok(Model {
            transformer,
            vision,
            tokenizer,
            template,
            eos_ids,
            format: ModelFormat::Safetensors,
            path: dir.to_path_buf(),
            compute_dtype: options.compute_dtype,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.transformer.config
    }

    /// Fresh per-layer caches for one sequence, each with its layer's sliding window.
    pub fn new_caches(&self) -> Vec<KvCache> {
        self.transformer.new_caches()
    }

    pub fn num_layers(&self) -> usize {
        self.transformer.num_layers()
    }

    /// Whether the projections hold quantized or dense weights (the layout depends on it).
    pub fn weight_kind(&self) -> WeightKind {
        self.transformer.weight_kind()
    }

    /// The prompt tokens for a chat of text, ending where the assistant's reply begins;
    /// `tools` are the functions (OpenAI-style JSON schemas) the model may call. Message text is
    /// encoded as text (see [`ChatTemplate::prompt`]); the template's own defaults (a
    /// model that thinks, thinks).
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Value]>,
    ) -> Result<Vec<u32>> {
        let marks = self
            .vision
            .as_ref()
            .map(|v| v.prompt.marks(&[]))
            .transpose()?;
        let prompt = self.template.prompt(
            &self.tokenizer,
            messages,
            tools,
            &TemplateKwargs::new(),
            marks.as_ref(),
        )?;
        Ok(prompt.tokens)
    }
}

/// Stop ids from every place a checkpoint records them.
fn stop_ids(
    config: &ModelConfig,
    generation_eos: &[u32],
    tokenizer: &Tokenizer,
    eos_token: &str,
) -> Vec<u32> {
    let mut ids: BTreeSet<u32> = generation_eos.iter().copied().collect();
    ids.extend(config.eos_token_id.iter().flat_map(TokenIds::to_vec));
    ids.extend(tokenizer.token_to_id(eos_token));
    ids.into_iter().collect()
}

pub(crate) fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| EngineError::bad_file(path, format!("invalid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EngineError::io(path, e)),
    }
}

/// `chat_template.jinja`, `chat_template.json`'s (a vision model's processor keeps it
/// there), or `chat_template` in tokenizer_config.json (a string, or a list of named
/// templates of which `default` is used).
pub(crate) fn chat_template_source(dir: &Path, tokenizer_config: &Value) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| EngineError::io(jinja, e));
    }
    let processor = read_json(&dir.join("chat_template.json"))?;
    if let Some(template) = processor.as_ref().and_then(|p| p["chat_template"].as_str()) {
        return Ok(Some(template.to_string()));
    }
    Ok(match &tokenizer_config["chat_template"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    })
}

/// All weights of a directory: the shards an index names, or every `*.safetensors` file.
pub(crate) fn read_safetensors(dir: &Path) -> Result<HashMap<String, Array>> {
    let index = dir.join("model.safetensors.index.json");
    let files: BTreeSet<PathBuf> = match read_json(&index)? {
        Some(json) => weights::index_shards(dir, &index, &json)?,
        None => std::fs::read_dir(dir)
            .map_err(|e| EngineError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect(),
    };
    if files.is_empty() {
        return Err(EngineError::MissingFile {
            path: dir.join("model.safetensors"),
        });
    }
    let mut tensors = HashMap::new();
    for file in files {
        if !file.exists() {
            return Err(EngineError::MissingFile { path: file });
        }
        let shard = Array::load_safetensors(&file).map_err(|e| {
            EngineError::bad_file(&file, format!("not a readable safetensors file: {e}"))
        })?;
        tensors.extend(shard);
    }
    Ok(tensors)
}

/// The transformer's pass ([`Batch::run`](crate::step::Batch::run) takes a model).
impl Forward for Model {
    fn forward(
        &self,
        tokens: StepTokens,
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        pool: &mut KvPool,
        logits: Logits<'_>,
        trace: Option<&mut RowTrace>,
    ) -> Result<Array> {
        self.transformer
            .forward(tokens, plan, caches, pool, logits, trace)
    }
}

//! The models the server answers for: every model installed in the store, loaded on first
//! use (the served model at start), each running behind its own scheduler.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use axum::http::StatusCode;
use seedbar_engine::{
    chat_template::ChatTemplate,
    config::ModelConfig,
    store::{ModelStore, StoredModel},
    tokenizer::Tokenizer,
    ChatMessage, Model,
};
use seedbar_scheduler::{Scheduler, SchedulerConfig};

use crate::error::ApiError;

/// What clients are told about a model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelCard {
    pub name: String,
    pub format: &'static str,
    pub bytes: u64,
    /// Seconds since the epoch the model was installed.
    pub created: u64,
    pub path: PathBuf,
    pub quantization: Option<String>,
}

/// A model in memory: its scheduler and what the HTTP side needs to build prompts.
pub struct LoadedModel {
    pub card: ModelCard,
    pub scheduler: Scheduler,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub config: ModelConfig,
    /// Changes whenever the weights or the build change, as OpenAI's `system_fingerprint`.
    pub fingerprint: String,
}

impl LoadedModel {
    /// Prompt tokens for a chat, ending where the assistant's reply begins.
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Vec<u32>, ApiError> {
        let text = self
            .template
            .render(messages, tools, true)
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        self.encode(&text)
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer.encode(text).map_err(ApiError::internal)
    }

    /// A fill-in-the-middle prompt from the model's FIM tokens (StarCoder or Qwen naming):
    /// prefix, suffix, then the middle the model writes.
    pub fn fill_in_the_middle(&self, prefix: &str, suffix: &str) -> Result<Vec<u32>, ApiError> {
        const NAMINGS: [[&str; 3]; 2] = [
            ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
            ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ];
        let ids = NAMINGS.iter().find_map(|names| {
            let [p, s, m] = names.map(|n| self.tokenizer.token_to_id(n));
            Some([p?, s?, m?])
        });
        let Some([p, s, m]) = ids else {
            return Err(ApiError::bad_param(
                "suffix",
                format!(
                    "{} has no fill-in-the-middle tokens, so `suffix` cannot be used",
                    self.card.name
                ),
            ));
        };
        let mut prompt = vec![p];
        prompt.extend(self.encode(prefix)?);
        prompt.push(s);
        prompt.extend(self.encode(suffix)?);
        prompt.push(m);
        Ok(prompt)
    }

    /// Weights in the model, from its shapes.
    pub fn parameter_count(&self) -> u64 {
        let c = &self.config;
        let (d, layers) = (c.hidden_size as u64, c.num_hidden_layers as u64);
        let q = (c.num_attention_heads * c.head_dim()) as u64;
        let kv = (c.kv_heads() * c.head_dim()) as u64;
        let embed = c.vocab_size as u64 * d;
        let head = if c.tie_word_embeddings { 0 } else { embed };
        let block = d * q * 2 + d * kv * 2 + 3 * d * c.intermediate_size as u64 + 2 * d;
        embed + head + layers * block + d
    }
}

/// Installed models, and the ones loaded.
pub struct ModelHost {
    store: ModelStore,
    outside: Vec<StoredModel>,
    config: SchedulerConfig,
    loaded: Mutex<HashMap<String, Arc<LoadedModel>>>,
    /// Serialises loads so two requests for a cold model load it once.
    loading: tokio::sync::Mutex<()>,
    /// Models kept in memory at once; the least recently loaded goes first.
    max_loaded: usize,
    order: Mutex<Vec<String>>,
}

impl ModelHost {
    /// `outside`: models served from paths outside the store (`seedbar serve --model PATH`).
    pub fn new(store: ModelStore, config: SchedulerConfig, outside: Vec<StoredModel>) -> Self {
        ModelHost {
            store,
            outside,
            config,
            loaded: Mutex::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
            max_loaded: 2,
            order: Mutex::new(Vec::new()),
        }
    }

    pub fn store(&self) -> &ModelStore {
        &self.store
    }

    /// Every installed model, and those served from outside the store.
    pub fn installed(&self) -> Result<Vec<ModelCard>, ApiError> {
        let mut models = self.store.list().map_err(ApiError::internal)?;
        models.extend(self.outside.iter().cloned());
        Ok(models
            .into_iter()
            .map(|m| ModelCard {
                created: m
                    .path
                    .metadata()
                    .and_then(|md| md.modified())
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs()),
                name: m.name,
                format: m.format,
                bytes: m.bytes,
                path: m.path,
                quantization: m.quantization,
            })
            .collect())
    }

    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LoadedModel>>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The model called `name` (case-insensitive; Ollama's `:latest` tag allowed), loading
    /// it if needed.
    pub async fn get(&self, name: &str) -> Result<Arc<LoadedModel>, ApiError> {
        let key = name.strip_suffix(":latest").unwrap_or(name).to_lowercase();
        if key.is_empty() {
            return Err(ApiError::bad_param("model", "`model` is required"));
        }
        if let Some(model) = self.lock().get(&key) {
            return Ok(model.clone());
        }
        let _loading = self.loading.lock().await;
        if let Some(model) = self.lock().get(&key) {
            return Ok(model.clone());
        }
        let installed = self.installed()?;
        let card = installed
            .iter()
            .find(|m| m.name.to_lowercase() == key)
            .cloned()
            .ok_or_else(|| {
                let names: Vec<String> = installed.iter().map(|m| m.name.clone()).collect();
                ApiError::unknown_model(name, &names)
            })?;
        let config = self.config.clone();
        let loaded = tokio::task::spawn_blocking(move || load(card, config))
            .await
            .map_err(ApiError::internal)??;
        let loaded = Arc::new(loaded);
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let mut models = self.lock();
        while models.len() >= self.max_loaded && !order.is_empty() {
            let oldest = order.remove(0);
            models.remove(&oldest);
        }
        models.insert(key.clone(), loaded.clone());
        order.push(key);
        Ok(loaded)
    }

    /// Drop the model called `name` from memory, if loaded (requests it runs go on until
    /// they end).
    pub fn unload(&self, name: &str) {
        let key = name.to_lowercase();
        let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        order.retain(|k| *k != key);
        self.lock().remove(&key);
    }

    /// End every running and queued request (shutdown): their streams finish with an error.
    pub fn stop_all(&self) {
        for model in self.loaded() {
            model.scheduler.stop();
        }
    }
}

fn load(card: ModelCard, config: SchedulerConfig) -> Result<LoadedModel, ApiError> {
    let model = Model::load(&card.path).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot load {}: {e}", card.name),
        )
    })?;
    let fingerprint = fingerprint(&card);
    let tokenizer = model.tokenizer.clone();
    let template = model.template.clone();
    let model_config = model.config().clone();
    Ok(LoadedModel {
        scheduler: Scheduler::start(model, config),
        card,
        tokenizer,
        template,
        config: model_config,
        fingerprint,
    })
}

/// `fp_` + a hash of the build, the backend and the model file's identity.
fn fingerprint(card: &ModelCard) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    (
        env!("CARGO_PKG_VERSION"),
        &card.name,
        card.bytes,
        card.created,
    )
        .hash(&mut h);
    seedbar_engine::runtime::default_device_is_gpu().hash(&mut h);
    format!("fp_{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

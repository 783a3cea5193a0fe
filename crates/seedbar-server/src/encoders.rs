//! The embedding models (`seedbar_engine::encoder`'s encoders) the server has loaded: each
//! on first use, onto a thread of its own, which then runs that model's requests one after
//! another, off the async runtime.

use std::{
    collections::HashMap,
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
};

use seedbar_engine::{
    encoder::{EmbeddingInput, EmbeddingModel, Embeddings, Truncation},
    store::ModelKind,
    EngineError,
};
use tokio::sync::oneshot;

use crate::{
    error::ApiError,
    model_host::{ModelCard, ModelHost},
};

/// The most inputs one request may hold (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// The encoders loaded so far, by model name (lowercase).
#[derive(Default)]
pub struct Encoders {
    loaded: Mutex<HashMap<String, Arc<Encoder>>>,
    /// Serialises loads so two requests for a cold model load it once.
    loading: tokio::sync::Mutex<()>,
}

/// One request's inputs, for an encoder's thread.
struct Job {
    inputs: Vec<EmbeddingInput>,
    truncation: Truncation,
    reply: oneshot::Sender<Result<Embeddings, EngineError>>,
}

/// A loaded encoder: the thread that owns the model, fed through `jobs`; it ends when the
/// encoder is dropped.
pub(crate) struct Encoder {
    pub(crate) name: String,
    pub(crate) dimensions: usize,
    jobs: mpsc::Sender<Job>,
    thread: JoinHandle<()>,
}

impl Encoders {
    /// The embedding model called `name`, loaded on first use (again if its thread ended).
    pub(crate) async fn get(
        &self,
        models: &ModelHost,
        name: &str,
    ) -> Result<Arc<Encoder>, ApiError> {
        if name.is_empty() {
            return Err(ApiError::bad_param("model", "`model` is required"));
        }
        let card = models.card(name)?;
        if card.kind != ModelKind::Embedding {
            let encoders: Vec<String> = models
                .installed()?
                .into_iter()
                .filter(|m| m.kind == ModelKind::Embedding)
                .map(|m| m.name)
                .collect();
            return Err(ApiError::bad_param(
                "model",
                format!(
                    "{} is a chat model and makes no embeddings (embedding models: {})",
                    card.name,
                    if encoders.is_empty() {
                        "none installed".to_string()
                    } else {
                        encoders.join(", ")
                    }
                ),
            ));
        }
        let key = card.name.to_lowercase();
        if let Some(encoder) = self.running(&key) {
            return Ok(encoder);
        }
        let _loading = self.loading.lock().await;
        if let Some(encoder) = self.running(&key) {
            return Ok(encoder);
        }
        let encoder = Arc::new(Encoder::start(card).await?);
        self.lock().insert(key, encoder.clone());
        Ok(encoder)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Encoder>>> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loaded encoder under `key` if its thread still runs (one that ended is dropped).
    fn running(&self, key: &str) -> Option<Arc<Encoder>> {
        let mut loaded = self.lock();
        match loaded.get(key) {
            Some(encoder) if encoder.thread.is_finished() => {
                tracing::warn!(model = key, "dropping an encoder whose thread ended");
                loaded.remove(key);
                None
            }
            found => found.cloned(),
        }
    }
}

impl Encoder {
    /// Start the model's thread and wait until it has loaded the model there.
    async fn start(card: ModelCard) -> Result<Self, ApiError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, loaded) = oneshot::channel();
        let path = card.path.clone();
        let thread = std::thread::Builder::new()
            .name("seedbar-encoder".into())
            .spawn(move || {
                let model = match EmbeddingModel::load(&path) {
                    Ok(model) => model,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(model.dimensions()));
                for job in queue {
                    let _ = job.reply.send(model.embed(&job.inputs, job.truncation));
                }
            })
            .map_err(ApiError::internal)?;
        let dimensions = loaded
            .await
            .map_err(|_| ApiError::internal("the encoder thread ended while loading"))?
            .map_err(|e| ApiError::internal(format!("cannot load {}: {e}", card.name)))?;
        Ok(Encoder {
            name: card.name,
            dimensions,
            jobs,
            thread,
        })
    }

    /// Embed on the model's thread; bad inputs are a 400 naming `field`.
    pub(crate) async fn embed(
        &self,
        inputs: Vec<EmbeddingInput>,
        truncation: Truncation,
        field: &str,
    ) -> Result<Embeddings, ApiError> {
        if inputs.len() > MAX_INPUTS {
            return Err(ApiError::bad_param(
                field,
                format!(
                    "{} inputs in one request; at most {MAX_INPUTS} are taken",
                    inputs.len()
                ),
            ));
        }
        let (reply, answer) = oneshot::channel();
        let gone = || ApiError::internal(format!("the encoder of {} has stopped", self.name));
        self.jobs
            .send(Job {
                inputs,
                truncation,
                reply,
            })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?.map_err(|e| match e {
            EngineError::InvalidRequest(message) => ApiError::bad_param(field, message),
            e => ApiError::internal(e),
        })
    }
}

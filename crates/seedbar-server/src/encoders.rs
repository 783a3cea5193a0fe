//! The encoder models the server has loaded, embedding models (`seedbar_engine::encoder`)
//! and rerankers (`seedbar_engine::reranker`): each on first use, onto a thread of its own,
//! which then runs that model's requests one after another, off the async runtime.

use std::{
    collections::HashMap,
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
};

use seedbar_engine::{
    encoder::{EmbeddingInput, EmbeddingModel, Embeddings, Truncation},
    reranker::{Reranker, Scores},
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
enum Job {
    Embed {
        inputs: Vec<EmbeddingInput>,
        truncation: Truncation,
        reply: oneshot::Sender<Result<Embeddings, EngineError>>,
    },
    Rerank {
        query: String,
        documents: Vec<String>,
        reply: oneshot::Sender<Result<Scores, EngineError>>,
    },
}

/// The model an encoder's thread owns.
enum Loaded {
    Embedding(EmbeddingModel),
    Reranker(Reranker),
}

impl Loaded {
    fn load(card: &ModelCard) -> Result<Self, EngineError> {
        Ok(match card.kind {
            ModelKind::Reranker => Loaded::Reranker(Reranker::load(&card.path)?),
            _ => Loaded::Embedding(EmbeddingModel::load(&card.path)?),
        })
    }

    /// The vectors' length (0 for a reranker).
    fn dimensions(&self) -> usize {
        match self {
            Loaded::Embedding(model) => model.dimensions(),
            Loaded::Reranker(_) => 0,
        }
    }

    fn run(&self, job: Job) {
        let kind_error = || EngineError::InvalidRequest("the wrong kind of model".into());
        match (self, job) {
            (
                Loaded::Embedding(model),
                Job::Embed {
                    inputs,
                    truncation,
                    reply,
                },
            ) => {
                let _ = reply.send(model.embed(&inputs, truncation));
            }
            (
                Loaded::Reranker(model),
                Job::Rerank {
                    query,
                    documents,
                    reply,
                },
            ) => {
                let _ = reply.send(model.score(&query, &documents));
            }
            (_, Job::Embed { reply, .. }) => drop(reply.send(Err(kind_error()))),
            (_, Job::Rerank { reply, .. }) => drop(reply.send(Err(kind_error()))),
        }
    }
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
    /// The encoder model of `kind` (an embedding model or a reranker) called `name`, loaded
    /// on first use (again if its thread ended); another kind of model is a 400 that names
    /// the installed models of `kind`.
    pub(crate) async fn get(
        &self,
        models: &ModelHost,
        name: &str,
        kind: ModelKind,
    ) -> Result<Arc<Encoder>, ApiError> {
        if name.is_empty() {
            return Err(ApiError::bad_param("model", "`model` is required"));
        }
        let card = models.card(name)?;
        if card.kind != kind {
            let fitting: Vec<String> = models
                .installed()?
                .into_iter()
                .filter(|m| m.kind == kind)
                .map(|m| m.name)
                .collect();
            let (does, fitting_name) = match kind {
                ModelKind::Reranker => ("scores no documents", "rerankers"),
                _ => ("makes no embeddings", "embedding models"),
            };
            let what = match card.kind {
                ModelKind::Chat => "a chat model",
                ModelKind::Embedding => "an embedding model",
                ModelKind::Reranker => "a reranker",
            };
            return Err(ApiError::bad_param(
                "model",
                format!(
                    "{} is {what} and {does} ({fitting_name}: {})",
                    card.name,
                    if fitting.is_empty() {
                        "none installed".to_string()
                    } else {
                        fitting.join(", ")
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
        let loading = card.clone();
        let thread = std::thread::Builder::new()
            .name("seedbar-encoder".into())
            .spawn(move || {
                let model = match Loaded::load(&loading) {
                    Ok(model) => model,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(model.dimensions()));
                for job in queue {
                    model.run(job);
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
        self.send(Job::Embed {
            inputs,
            truncation,
            reply,
        })?;
        self.answer(answer, field).await
    }

    /// Score `documents` against `query` on the model's thread.
    pub(crate) async fn rerank(
        &self,
        query: String,
        documents: Vec<String>,
    ) -> Result<Scores, ApiError> {
        if documents.len() > MAX_INPUTS {
            return Err(ApiError::bad_param(
                "documents",
                format!(
                    "{} documents; at most {MAX_INPUTS} are taken",
                    documents.len()
                ),
            ));
        }
        let (reply, answer) = oneshot::channel();
        self.send(Job::Rerank {
            query,
            documents,
            reply,
        })?;
        self.answer(answer, "documents").await
    }

    fn send(&self, job: Job) -> Result<(), ApiError> {
        self.jobs.send(job).map_err(|_| self.gone())
    }

    fn gone(&self) -> ApiError {
        ApiError::internal(format!("the encoder of {} has stopped", self.name))
    }

    /// The thread's answer; a bad input is a 400 naming `field`.
    async fn answer<T>(
        &self,
        answer: oneshot::Receiver<Result<T, EngineError>>,
        field: &str,
    ) -> Result<T, ApiError> {
        answer.await.map_err(|_| self.gone())?.map_err(|e| match e {
            EngineError::InvalidRequest(message) => ApiError::bad_param(field, message),
            e => ApiError::internal(e),
        })
    }
}

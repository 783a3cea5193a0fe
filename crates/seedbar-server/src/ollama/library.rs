//! Ollama's model routes: `/api/version`, `/api/tags` (local and remote models), `/api/show`
//! (details read from a model's files, or a remote's probe), `/api/ps` (what is in memory
//! and until when) and `/api/pull` (a Hugging Face repository, or one GGUF file of one, with
//! Ollama's progress lines).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::{
    extract::State,
    response::{IntoResponse, Response},
    Json,
};
use seedbar_engine::{inventory::human_count, store::ModelKind};
use seedbar_remote::Remote;
use serde::{Deserialize, Serialize};

use super::{json_line, ndjson, timestamp_of, yes, Result};
use crate::{
    error::{ApiError, OllamaErrorBody},
    extract::{null_as_true, OllamaJson},
    generation::spawn_body,
    model_host::{ModelCard, ModelFacts},
    pulls::PullStatus,
    App,
};

/// The Ollama API version whose routes and fields these follow. Clients gate on it (VS Code
/// Copilot's Ollama provider needs at least 0.6.4); Seedbar's own version is in `/health`.
const OLLAMA_API_VERSION: &str = "0.12.0";

/// What `/api/ps` says of a model that never expires by time (it leaves memory only to make
/// room): a date no client reaches.
const NEVER_EXPIRES: &str = "9999-12-31T23:59:59Z";

/// How often a streamed `/api/pull` reports progress.
const PULL_POLL: Duration = Duration::from_millis(250);

// ---- wire structs ----------------------------------------------------------------------

#[derive(Serialize)]
pub struct VersionBody {
    version: &'static str,
}

#[derive(Serialize)]
pub struct TagList {
    models: Vec<TagEntry>,
}

#[derive(Serialize)]
struct TagEntry {
    name: String,
    model: String,
    modified_at: String,
    size: u64,
    digest: String,
    details: Details,
}

#[derive(Serialize)]
struct Details {
    parent_model: String,
    format: &'static str,
    family: String,
    families: Vec<String>,
    parameter_size: String,
    quantization_level: String,
}

impl Details {
    /// A remote model's: its engine as the family, its upstream id as the parent.
    fn remote(remote: &Remote) -> Self {
        Details {
            parent_model: remote.model.clone(),
            format: "remote",
            family: remote.engine.clone(),
            families: vec![remote.engine.clone()],
            parameter_size: String::new(),
            quantization_level: String::new(),
        }
    }

    fn new(card: &ModelCard, facts: &ModelFacts) -> Self {
        let family = facts.inventory.architecture.clone();
        Details {
            parent_model: String::new(),
            format: card.format,
            families: vec![family.clone()],
            family,
            parameter_size: human_count(facts.inventory.parameters),
            quantization_level: facts.inventory.quantization.clone(),
        }
    }
}

#[derive(Serialize)]
pub struct ShowBody {
    modelfile: String,
    parameters: String,
    template: String,
    details: Details,
    model_info: ModelInfo,
    capabilities: Vec<&'static str>,
    modified_at: String,
}

/// `/api/show`'s `model_info`: the general keys, then `<architecture>.<hyper-parameter>`.
impl ShowBody {
    /// A remote model's: what its engine supports, as the probe found.
    fn remote(remote: &Remote) -> Self {
        let supports = remote.supports;
        let capabilities = [
            (true, "completion"),
            (supports.tools, "tools"),
            (supports.images, "vision"),
            (supports.reasoning, "thinking"),
        ];
        ShowBody {
            modelfile: format!("# {} on {}", remote.model, remote.owner()),
            parameters: String::new(),
            template: String::new(),
            details: Details::remote(remote),
            model_info: ModelInfo {
                architecture: remote.engine.clone(),
                basename: remote.model.clone(),
                parameter_count: 0,
                hyperparameters: BTreeMap::new(),
            },
            capabilities: capabilities
                .into_iter()
                .filter_map(|(has, name)| has.then_some(name))
                .collect(),
            modified_at: timestamp_of(0),
        }
    }
}

#[derive(Serialize)]
struct ModelInfo {
    #[serde(rename = "general.architecture")]
    architecture: String,
    #[serde(rename = "general.basename")]
    basename: String,
    #[serde(rename = "general.parameter_count")]
    parameter_count: u64,
    #[serde(flatten)]
    hyperparameters: BTreeMap<String, u64>,
}

#[derive(Serialize)]
pub struct RunningList {
    models: Vec<RunningModel>,
}

#[derive(Serialize)]
struct RunningModel {
    name: String,
    model: String,
    size: u64,
    digest: String,
    details: Details,
    expires_at: String,
    /// Bytes in GPU memory: all of it on a GPU, none on the CPU.
    size_vram: u64,
}

/// A line of `/api/pull`.
#[derive(Serialize)]
struct PullLine {
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completed: Option<u64>,
}

// ---- routes ----------------------------------------------------------------------------

pub async fn version() -> Json<VersionBody> {
    Json(VersionBody {
        version: OLLAMA_API_VERSION,
    })
}

pub async fn tags(State(app): State<Arc<App>>) -> Result<Json<TagList>> {
    let mut models = Vec::new();
    for card in app.models.installed()? {
        let facts = match app.models.facts(&card).await {
            Ok(facts) => facts,
            Err(e) => {
                tracing::warn!(model = card.name, error = %e.message, "cannot read a model's files");
                continue;
            }
        };
        models.push(TagEntry {
            name: card.name.clone(),
            model: card.name.clone(),
            modified_at: timestamp_of(card.created),
            size: card.bytes,
            digest: facts.digest.clone(),
            details: Details::new(&card, &facts),
        });
    }
    for remote in app.models.remotes().list() {
        models.push(TagEntry {
            name: remote.name.clone(),
            model: remote.name.clone(),
            modified_at: timestamp_of(0),
            size: 0,
            digest: format!("remote:{}", remote.model),
            details: Details::remote(&remote),
        });
    }
    Ok(Json(TagList { models }))
}

#[derive(Deserialize)]
pub struct ModelRequest {
    model: Option<String>,
    /// Older clients send `name`.
    name: Option<String>,
}

impl ModelRequest {
    fn name(self) -> String {
        self.model.or(self.name).unwrap_or_default()
    }
}

pub async fn show(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<ModelRequest>,
) -> Result<Json<ShowBody>> {
    let name = req.name();
    if let Some(remote) = app.models.remotes().get(&name) {
        return Ok(Json(ShowBody::remote(&remote)));
    }
    let card = app.models.card(&name)?;
    let facts = app.models.facts(&card).await?;
    let inventory = &facts.inventory;
    let mut hyperparameters = inventory.hyperparameters.clone();
    let (template, capabilities) = if card.kind != ModelKind::Chat {
        let capability = match card.kind {
            ModelKind::Reranker => "rerank",
            _ => "embedding",
        };
        (String::new(), vec![capability])
    } else {
        let model = app.models.get(&name).await?;
        // The context this server gives the model.
        hyperparameters.insert(
            "context_length".into(),
            model.scheduler.config().max_context as u64,
        );
        let mut capabilities = vec!["completion"];
        if model.template.supports_tools() {
            capabilities.push("tools");
        }
        if model.fim_tokens().is_some() {
            capabilities.push("insert");
        }
        if model.template.thinking().thinks {
            capabilities.push("thinking");
        }
        (model.template.source.clone(), capabilities)
    };
    let architecture = &inventory.architecture;
    Ok(Json(ShowBody {
        modelfile: format!("FROM {}", card.path.display()),
        parameters: String::new(),
        template,
        details: Details::new(&card, &facts),
        model_info: ModelInfo {
            architecture: architecture.clone(),
            basename: inventory
                .basename
                .clone()
                .unwrap_or_else(|| card.name.clone()),
            parameter_count: inventory.parameters,
            hyperparameters: hyperparameters
                .into_iter()
                .map(|(key, value)| (format!("{architecture}.{key}"), value))
                .collect(),
        },
        capabilities,
        modified_at: timestamp_of(card.created),
    }))
}

pub async fn ps(State(app): State<Arc<App>>) -> Result<Json<RunningList>> {
    let on_gpu = seedbar_engine::runtime::default_device_is_gpu();
    let mut models = Vec::new();
    for loaded in app.models.loaded() {
        let card = &loaded.card;
        let facts = app.models.facts(card).await?;
        models.push(RunningModel {
            name: card.name.clone(),
            model: card.name.clone(),
            size: card.bytes,
            digest: facts.digest.clone(),
            details: Details::new(card, &facts),
            expires_at: app.models.expires(&card.name).map_or_else(
                || NEVER_EXPIRES.into(),
                |at| humantime::format_rfc3339_seconds(at).to_string(),
            ),
            size_vram: if on_gpu { card.bytes } else { 0 },
        });
    }
    Ok(Json(RunningList { models }))
}

#[derive(Deserialize)]
pub struct PullRequest {
    #[serde(flatten)]
    model: ModelRequest,
    #[serde(default = "yes", deserialize_with = "null_as_true")]
    stream: bool,
}

/// The answer to a pull of a model the store holds: Ollama's "pulling manifest" and
/// "success" lines when streamed, else the last one.
fn pulled(stream: bool) -> Response {
    let line = |status: &str| PullLine {
        status: status.into(),
        total: None,
        completed: None,
    };
    if !stream {
        return Json(line("success")).into_response();
    }
    let lines = [line("pulling manifest"), line("success")].map(|l| json_line(&l));
    ndjson(futures_util::stream::iter(lines))
}

/// Download a Hugging Face repository (`org/name`) into the store, through the app's
/// downloads: status lines while streamed, else one when it is done. A model the store
/// already holds is up to date at once.
pub async fn pull(
    State(app): State<Arc<App>>,
    OllamaJson(req): OllamaJson<PullRequest>,
) -> Result<Response> {
    let repo = req.model.name().trim().to_string();
    if app.models.card(&repo).is_ok() {
        // Already in the store (a name `/api/tags` lists): up to date, as Ollama answers.
        return Ok(pulled(req.stream));
    }
    seedbar_engine::store::check_pull_id(&repo)
        .map(drop)
        .map_err(|e| ApiError::bad_param("model", e.to_string()))?;
    let root = app.models.store().root().to_path_buf();
    app.pulls.start(root, &repo)?;
    if req.stream {
        let lines = spawn_body(move |tx| async move {
            let mut last = None;
            let first = PullLine {
                status: "pulling manifest".into(),
                total: None,
                completed: None,
            };
            if tx.send(json_line(&first)).await.is_err() {
                return;
            }
            loop {
                let Some(pull) = app.pulls.get(&repo) else {
                    return;
                };
                let line = match pull.status {
                    PullStatus::Downloading => {
                        let progress = (pull.downloaded_bytes, pull.total_bytes);
                        if last == Some(progress) {
                            tokio::time::sleep(PULL_POLL).await;
                            continue;
                        }
                        last = Some(progress);
                        json_line(&PullLine {
                            status: format!("downloading {repo}"),
                            total: Some(pull.total_bytes),
                            completed: Some(pull.downloaded_bytes),
                        })
                    }
                    PullStatus::Done => json_line(&PullLine {
                        status: "success".into(),
                        total: None,
                        completed: None,
                    }),
                    PullStatus::Error | PullStatus::Cancelled => json_line(&OllamaErrorBody {
                        error: pull
                            .error
                            .unwrap_or_else(|| "the download was cancelled".into()),
                    }),
                };
                let ended = pull.status != PullStatus::Downloading;
                if tx.send(line).await.is_err() || ended {
                    return;
                }
            }
        });
        return Ok(ndjson(lines));
    }
    let pull = app.pulls.wait(&repo).await;
    match pull {
        Some(pull) if pull.status == PullStatus::Done => Ok(Json(PullLine {
            status: "success".into(),
            total: None,
            completed: None,
        })
        .into_response()),
        other => Err(ApiError::internal(
            other
                .and_then(|p| p.error)
                .unwrap_or_else(|| "the download was cancelled".into()),
        )
        .into()),
    }
}

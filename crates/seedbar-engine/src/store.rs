//! The model store: one folder per model under the platform data directory
//! (`$SEEDBAR_HOME` overrides it), holding a GGUF file or a Hugging Face–style directory.
//! `pull` downloads `org/name` repositories from the Hugging Face hub with hf-hub.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

/// The model `seedbar run` and `seedbar serve` use when none is named.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct";

/// Files a repository needs for Seedbar to load it.
fn wanted(file: &str) -> bool {
    file.ends_with(".safetensors")
        || matches!(
            file,
            "config.json"
                | "model.safetensors.index.json"
                | "tokenizer.json"
                | "tokenizer_config.json"
                | "generation_config.json"
                | "chat_template.jinja"
        )
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StoredModel {
    pub name: String,
    /// The GGUF file or the model directory.
    pub path: PathBuf,
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    pub bytes: u64,
    /// Weight precision when known: a GGUF type from the file name (`Q4_1`) or an MLX
    /// directory's `quantization.bits` (`4-bit`), else its `torch_dtype`.
    pub quantization: Option<String>,
}

pub struct ModelStore {
    root: PathBuf,
}

impl ModelStore {
    /// `$SEEDBAR_HOME`, else the platform data directory (e.g. `~/.local/share/seedbar`,
    /// `~/Library/Application Support/dev.seedbar.Seedbar`).
    pub fn open_default() -> Result<Self> {
        if let Some(home) = std::env::var_os("SEEDBAR_HOME") {
            return Ok(Self::at(PathBuf::from(home)));
        }
        let dirs =
            directories::ProjectDirs::from("dev", "seedbar", "Seedbar").ok_or_else(|| {
                EngineError::InvalidRequest(
                    "no home directory to keep models in; set SEEDBAR_HOME".into(),
                )
            })?;
        Ok(Self::at(dirs.data_dir().to_path_buf()))
    }

    pub fn at(root: PathBuf) -> Self {
        ModelStore { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn models_dir(&self) -> PathBuf {
        self.root.join("models")
    }

    pub fn list(&self) -> Result<Vec<StoredModel>> {
        let dir = self.models_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(EngineError::io(dir, e)),
        };
        let mut models: Vec<StoredModel> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| describe(&e.path()))
            .collect();
        models.sort_by_key(|m| m.name.to_lowercase());
        Ok(models)
    }

    /// A store name (case-insensitive) or a path to a GGUF file or model directory.
    pub fn resolve(&self, name_or_path: &str) -> Result<PathBuf> {
        let as_path = Path::new(name_or_path);
        if as_path.exists() {
            return Ok(as_path.to_path_buf());
        }
        let wanted = name_or_path.replace('/', "--").to_lowercase();
        self.list()?
            .into_iter()
            .find(|m| m.name.to_lowercase() == wanted)
            .map(|m| m.path)
            .ok_or_else(|| EngineError::UnknownModel(name_or_path.to_string()))
    }

    /// Put a GGUF file into the store under `name` (a hard link when possible).
    pub fn import_gguf(&self, file: &Path, name: &str) -> Result<PathBuf> {
        let file_name = file.file_name().ok_or_else(|| {
            EngineError::InvalidRequest(format!("{} is not a file", file.display()))
        })?;
        let dir = self.models_dir().join(name);
        let target = dir.join(file_name);
        let same_size = |a: &Path, b: &Path| matches!((a.metadata(), b.metadata()), (Ok(x), Ok(y)) if x.len() == y.len());
        if target.exists() && same_size(file, &target) {
            return Ok(target);
        }
        std::fs::create_dir_all(&dir).map_err(|e| EngineError::io(&dir, e))?;
        let partial = dir.join(".importing");
        let _ = std::fs::remove_file(&partial);
        std::fs::hard_link(file, &partial)
            .or_else(|_| std::fs::copy(file, &partial).map(|_| ()))
            .map_err(|e| EngineError::io(file, e))?;
        std::fs::rename(&partial, &target).map_err(|e| EngineError::io(&target, e))?;
        Ok(target)
    }

    /// Download `org/name` from the Hugging Face hub (resuming partial files) into the store.
    pub fn pull(&self, repo_id: &str, progress: bool) -> Result<PathBuf> {
        if repo_id.split('/').count() != 2 || repo_id.split('/').any(str::is_empty) {
            return Err(EngineError::InvalidRequest(format!(
                "`{repo_id}` is not a Hugging Face repository id (expected org/name)"
            )));
        }
        let endpoint =
            std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
        let unreachable = |e: hf_hub::api::sync::ApiError| {
            EngineError::Download(format!(
                "cannot reach the Hugging Face hub at {endpoint} ({e}); check the network \
                 connection. Models already in the store still work offline."
            ))
        };
        let api = hf_hub::api::sync::ApiBuilder::new()
            .with_endpoint(endpoint.clone())
            .with_cache_dir(self.root.join("hub"))
            .with_progress(progress)
            .with_retries(2)
            .build()
            .map_err(unreachable)?;
        let repo = api.model(repo_id.to_string());
        let info = repo.info().map_err(unreachable)?;
        let files: Vec<String> = info
            .siblings
            .into_iter()
            .map(|s| s.rfilename)
            .filter(|f| wanted(f))
            .collect();
        if !files.iter().any(|f| f == "config.json") {
            return Err(EngineError::Download(format!(
                "{repo_id} has no config.json: not a model Seedbar can run"
            )));
        }
        let dir = self.models_dir().join(repo_id.replace('/', "--"));
        std::fs::create_dir_all(&dir).map_err(|e| EngineError::io(&dir, e))?;
        for file in files {
            let cached = repo.get(&file).map_err(unreachable)?;
            let target = dir.join(&file);
            if !target.exists() {
                std::fs::hard_link(&cached, &target)
                    .or_else(|_| std::fs::copy(&cached, &target).map(|_| ()))
                    .map_err(|e| EngineError::io(&target, e))?;
            }
        }
        Ok(dir)
    }
}

/// A store entry: a folder with one `.gguf` file, or with `config.json`.
fn describe(dir: &Path) -> Option<StoredModel> {
    let name = dir.file_name()?.to_str()?.to_string();
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let bytes = files
        .iter()
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum();
    if let Some(gguf) = files
        .iter()
        .find(|f| f.extension().is_some_and(|x| x == "gguf"))
    {
        return Some(StoredModel {
            name,
            quantization: gguf_type(gguf),
            path: gguf.clone(),
            format: "gguf",
            bytes,
        });
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).ok()?).ok()?;
    let quantization = match config.pointer("/quantization/bits") {
        Some(bits) => Some(format!("{bits}-bit")),
        None => config["torch_dtype"].as_str().map(str::to_string),
    };
    Some(StoredModel {
        name,
        path: dir.to_path_buf(),
        format: "safetensors",
        bytes,
        quantization,
    })
}

/// The quantization type a GGUF file name carries by convention (`name.Q4_K_M.gguf`).
fn gguf_type(file: &Path) -> Option<String> {
    let stem = file.file_stem()?.to_str()?;
    stem.rsplit(['.', '-']).map(str::to_uppercase).find(|part| {
        let digit_after = |prefix: &str| {
            part.strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        };
        digit_after("Q") || digit_after("IQ") || ["F16", "F32", "BF16"].contains(&part.as_str())
    })
}

//! The model store: one folder per model under the platform data directory
//! (`$SEEDBAR_HOME` overrides it), holding a GGUF file or a Hugging Face–style directory.
//! `pull` downloads `org/name` repositories from the Hugging Face hub (see `hub`).

use std::{
    path::{Path, PathBuf},
    sync::atomic::AtomicBool,
};

pub use crate::hub::Progress;
use crate::{
    error::{EngineError, Result},
    hub::{Hub, RemoteFile},
};

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
                | "chat_template.json"
                // vision models: how an image becomes pixels
                | "preprocessor_config.json"
                // sentence-transformers (embedding models): modules, pooling, max length
                | "modules.json"
                | "1_Pooling/config.json"
                | "sentence_bert_config.json"
        )
}

/// What a model is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// A decoder that writes replies (chat and completions).
    Chat,
    /// An encoder that turns text into vectors (see `encoder`).
    Embedding,
    /// A cross-encoder that scores documents against a query (see `reranker`).
    Reranker,
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
    /// `general.architecture` of a GGUF file, `model_type` of a folder's `config.json`.
    pub architecture: Option<String>,
    pub kind: ModelKind,
}

impl StoredModel {
    /// Whether Seedbar runs the model's architecture (an unknown one counts as runnable:
    /// loading it says what is wrong).
    pub fn runnable(&self) -> bool {
        match (&self.architecture, self.format) {
            (None, _) => true,
            (Some(arch), "gguf") => crate::gguf::model_type(arch).is_ok(),
            (Some(model_type), _) => crate::config::check_runnable(model_type).is_ok(),
        }
    }
}

pub struct ModelStore {
    root: PathBuf,
}

impl ModelStore {
    /// `$SEEDBAR_HOME`, else the platform data directory (e.g. `~/.local/share/seedbar`,
    /// `~/Library/Application Support/dev.seedbar.Seedbar`).
    pub fn open_default() -> Result<Self> {
        if let Some(home) = std::env::var_os("SEEDBAR_HOME").filter(|h| !h.is_empty()) {
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

    /// A model outside the store: a GGUF file (named after the file) or a model directory
    /// (named after the folder). `None` when the path holds no model.
    pub fn describe_path(path: &Path) -> Option<StoredModel> {
        if path.is_dir() {
            return describe(path);
        }
        if path.extension().is_none_or(|x| x != "gguf") {
            return None;
        }
        Some(StoredModel {
            name: path.file_stem()?.to_str()?.to_string(),
            path: path.to_path_buf(),
            format: "gguf",
            bytes: path.metadata().map_or(0, |m| m.len()),
            quantization: gguf_type(path),
            architecture: crate::gguf::architecture(path),
            kind: ModelKind::Chat,
        })
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

    /// Add a model on disk to the store: a `.gguf` file, or a model folder (`config.json`,
    /// `.safetensors` weights, `tokenizer.json`), under `name` (default: the file or folder
    /// name). Checked first, with a readable error for anything else. The files are hard
    /// links when the store is on the same volume (no space used, and the model stays when
    /// the original is moved or deleted), else symbolic links to them in place: a large
    /// file is never copied. The same file again under the same name changes nothing.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<StoredModel> {
        let name = match name {
            Some(name) => name.trim().to_string(),
            None => import_name(path)?,
        };
        if name.is_empty()
            || name.starts_with('.')
            || name.contains(['/', '\\'])
            || name.chars().any(char::is_control)
        {
            return Err(EngineError::InvalidRequest(format!(
                "`{name}` cannot be a model name (no slashes, not empty)"
            )));
        }
        let files = importable_files(path)?;
        let dir = self.models_dir().join(&name);
        let same = |(source, file): &(PathBuf, String)| matches!((source.metadata(), dir.join(file).metadata()), (Ok(x), Ok(y)) if x.len() == y.len());
        if dir.exists() && !files.iter().all(same) {
            return Err(EngineError::NameTaken(name));
        }
        for (source, file) in &files {
            place(source, &dir.join(file))?;
        }
        describe(&dir).ok_or_else(|| {
            EngineError::InvalidRequest(format!("{} did not import as a model", path.display()))
        })
    }

    /// Download `org/name` from the Hugging Face hub (`$HF_ENDPOINT` overrides its address)
    /// into the store, reporting progress. Files go to `downloads/<name>` first and move into
    /// the model's folder once all are there (`config.json` last, so the folder is never a
    /// half model). Setting `cancel` stops it between chunks with `EngineError::Cancelled`
    /// and removes what this download wrote; after other errors, pulling again resumes.
    pub fn pull(
        &self,
        repo_id: &str,
        progress: &mut dyn Progress,
        cancel: &AtomicBool,
    ) -> Result<PathBuf> {
        let endpoint =
            std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
        self.pull_from(&endpoint, repo_id, progress, cancel)
    }

    fn pull_from(
        &self,
        endpoint: &str,
        repo_id: &str,
        progress: &mut dyn Progress,
        cancel: &AtomicBool,
    ) -> Result<PathBuf> {
        let (repo_id, gguf) = check_pull_id(repo_id)?;
        let hub = Hub::new(endpoint)?;
        let (revision, files) = hub.files(repo_id)?;
        let projector = gguf.and_then(|_| projector_file(&files));
        let mut files: Vec<RemoteFile> = files
            .into_iter()
            .filter(|f| match gguf {
                Some(gguf) => f.name == gguf || Some(&f.name) == projector.as_ref(),
                None => wanted(&f.name),
            })
            .collect();
        match gguf {
            // One file (and its projector), renamed into place whole: listed once it is
            // all there.
            Some(gguf) if !files.iter().any(|f| f.name == gguf) => {
                return Err(EngineError::Download(format!(
                    "{repo_id} has no file {gguf}"
                )))
            }
            // The projector first: the folder lists as a model once the model file is in.
            Some(gguf) => files.sort_by_key(|f| f.name == gguf),
            None if !files.iter().any(|f| f.name == "config.json") => {
                return Err(EngineError::Download(format!(
                    "{repo_id} has no config.json: not a model Seedbar can run"
                )))
            }
            None => {
                if let Some(model_type) = hub.check_architecture(repo_id, &revision)? {
                    progress.architecture(&model_type);
                }
                // config.json last: until it is in place the folder is not listed as a model.
                files.sort_by_key(|f| f.name == "config.json");
            }
        }
        let name = library_name(repo_id, gguf);
        progress.total(files.iter().filter_map(|f| f.size).sum());
        let dir = self.models_dir().join(&name);
        let staging = self.root.join("downloads").join(&name);
        let mut fetched = Vec::new();
        for file in &files {
            let installed = dir.join(&file.name).metadata().map(|m| m.len());
            match (installed, file.size) {
                (Ok(have), Some(size)) if have == size => progress.advance(size),
                (Ok(_), None) => {}
                _ => {
                    let part = staging.join(&file.name);
                    create_parent(&part)?;
                    let result = hub.download(repo_id, &revision, file, &part, progress, cancel);
                    if let Err(EngineError::Cancelled) = result {
                        let _ = std::fs::remove_dir_all(&staging);
                    }
                    result?;
                    fetched.push(&file.name);
                }
            }
        }
        for file in fetched {
            let target = dir.join(file);
            create_parent(&target)?;
            std::fs::rename(staging.join(file), &target)
                .map_err(|e| EngineError::io(&target, e))?;
        }
        let _ = std::fs::remove_dir_all(&staging);
        Ok(dir)
    }

    /// Delete an installed model's folder (the name as `list` gives it).
    pub fn remove(&self, name: &str) -> Result<()> {
        let model = self
            .list()?
            .into_iter()
            .find(|m| m.name == name)
            .ok_or_else(|| EngineError::UnknownModel(name.to_string()))?;
        let dir = self.models_dir().join(&model.name);
        std::fs::remove_dir_all(&dir).map_err(|e| EngineError::io(dir, e))
    }
}

/// What a pull names: a repository (`org/name`: its safetensors, config and tokenizer), or
/// one GGUF file of one (`org/name:file.gguf`, at the repository's top level). The
/// repository id, and the file where one is named.
pub fn check_pull_id(id: &str) -> Result<(&str, Option<&str>)> {
    let Some((repo, file)) = id.split_once(':') else {
        check_repo_id(id)?;
        return Ok((id, None));
    };
    check_repo_id(repo)?;
    if !file.ends_with(".gguf") || file.len() <= ".gguf".len() || file.contains(['/', '\\']) {
        return Err(EngineError::InvalidRequest(format!(
            "`{file}` is not a .gguf file at the top of {repo} (expected org/name:file.gguf)"
        )));
    }
    Ok((repo, Some(file)))
}

/// The image projector a GGUF pull takes along from its repository: of the top-level
/// `*mmproj*.gguf` files, a 16-bit one before an 8-bit one before the rest, then by name.
fn projector_file(files: &[RemoteFile]) -> Option<String> {
    let rank = |name: &str| {
        let lower = name.to_ascii_lowercase();
        if lower.contains("bf16") {
            1
        } else if lower.contains("f16") {
            0
        } else if lower.contains("q8") {
            2
        } else {
            3
        }
    };
    files
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| !n.contains('/') && crate::gguf::mmproj::is_named_mmproj(Path::new(n)))
        .min_by_key(|n| (rank(n), n.to_string()))
        .map(str::to_string)
}

/// The name a pull (`org/name` or `org/name:file.gguf`) gives its model in the library.
pub fn pulled_name(id: &str) -> Result<String> {
    let (repo, gguf) = check_pull_id(id)?;
    Ok(library_name(repo, gguf))
}

/// A repository's `org--name`, or a GGUF file's stem.
fn library_name(repo: &str, gguf: Option<&str>) -> String {
    match gguf {
        Some(gguf) => gguf.trim_end_matches(".gguf").to_string(),
        None => repo.replace('/', "--"),
    }
}

/// A Hugging Face repository id: `org/name`.
pub fn check_repo_id(repo_id: &str) -> Result<()> {
    let parts: Vec<&str> = repo_id.split('/').collect();
    if parts.len() != 2
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(EngineError::InvalidRequest(format!(
            "`{repo_id}` is not a Hugging Face repository id (expected org/name)"
        )));
    }
    Ok(())
}

/// What the file picker and `seedbar models add` accept, for error messages.
const IMPORTABLE: &str =
    "a .gguf file, or a model folder with config.json, .safetensors weights and tokenizer.json";

/// The default name of an imported model: the file name without `.gguf`, or the folder's.
fn import_name(path: &Path) -> Result<String> {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "cannot name a model after {}; give it a name",
                path.display()
            ))
        })
}

/// The files of a model on disk as (source, path in the model's folder), `config.json`
/// last so that the folder is never a half model; an error saying what is wrong when
/// `path` is not a model Seedbar can run.
fn importable_files(path: &Path) -> Result<Vec<(PathBuf, String)>> {
    let shown = path.display();
    if !path.exists() {
        return Err(EngineError::InvalidRequest(format!(
            "{shown} does not exist"
        )));
    }
    if path.is_file() {
        let mut magic = [0u8; 4];
        let is_gguf = path
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
            && std::fs::File::open(path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
            && &magic == b"GGUF";
        if !is_gguf {
            return Err(EngineError::InvalidRequest(format!(
                "{shown} is not a GGUF model file (import {IMPORTABLE})"
            )));
        }
        let name = |path: &Path| {
            let file = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
                EngineError::InvalidRequest(format!("{shown}: the file name is not UTF-8"))
            })?;
            Ok::<_, EngineError>((path.to_path_buf(), file.to_string()))
        };
        // A vision model's projector beside it comes along, placed first.
        let projector = crate::gguf::projector_beside(path);
        return projector
            .iter()
            .map(|p| name(p))
            .chain([name(path)])
            .collect();
    }
    let mut files = Vec::new();
    for entry in read_dir(path)? {
        let Some(top) = entry
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if entry.is_dir() {
            for inner in read_dir(&entry)? {
                if let Some(n) = inner.file_name().and_then(|n| n.to_str()) {
                    files.push(format!("{top}/{n}"));
                }
            }
        } else {
            files.push(top);
        }
    }
    files.retain(|f| wanted(f));
    let missing: Vec<&str> = [
        ("config.json", files.iter().any(|f| f == "config.json")),
        (
            ".safetensors weights",
            files.iter().any(|f| f.ends_with(".safetensors")),
        ),
        (
            "tokenizer.json",
            files.iter().any(|f| f == "tokenizer.json"),
        ),
    ]
    .into_iter()
    .filter(|(_, present)| !present)
    .map(|(what, _)| what)
    .collect();
    if !missing.is_empty() {
        return Err(EngineError::InvalidRequest(format!(
            "{shown} is not a model folder: it has no {} (import {IMPORTABLE})",
            missing.join(", no ")
        )));
    }
    files.sort_by_key(|f| f == "config.json");
    Ok(files.into_iter().map(|f| (path.join(&f), f)).collect())
}

/// The entries of a folder.
fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect())
}

/// `source` at `target`: a hard link when possible (same volume), else a symbolic link to
/// it where it is, moved into place whole. A target of the same size is taken as already
/// there.
fn place(source: &Path, target: &Path) -> Result<()> {
    let same_size =
        matches!((source.metadata(), target.metadata()), (Ok(x), Ok(y)) if x.len() == y.len());
    if same_size {
        return Ok(());
    }
    create_parent(target)?;
    let partial = target.with_file_name(".importing");
    let _ = std::fs::remove_file(&partial);
    let absolute = source
        .canonicalize()
        .map_err(|e| EngineError::io(source, e))?;
    std::fs::hard_link(&absolute, &partial)
        .or_else(|_| link_in_place(&absolute, &partial))
        .map_err(|e| EngineError::io(source, e))?;
    std::fs::rename(&partial, target).map_err(|e| EngineError::io(target, e))
}

#[cfg(unix)]
fn link_in_place(source: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(source, link)
}

#[cfg(not(unix))]
fn link_in_place(source: &Path, link: &Path) -> std::io::Result<()> {
    std::fs::copy(source, link).map(|_| ())
}

fn create_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e)),
        None => Ok(()),
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
    // The model file, not the image projector that may lie beside it.
    if let Some(gguf) = files.iter().find(|f| {
        f.extension().is_some_and(|x| x == "gguf") && !crate::gguf::mmproj::is_named_mmproj(f)
    }) {
        return Some(StoredModel {
            name,
            quantization: gguf_type(gguf),
            architecture: crate::gguf::architecture(gguf),
            path: gguf.clone(),
            format: "gguf",
            bytes,
            kind: ModelKind::Chat,
        });
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).ok()?).ok()?;
    let quantization = match config.pointer("/quantization/bits") {
        Some(bits) => Some(format!("{bits}-bit")),
        None => config["torch_dtype"].as_str().map(str::to_string),
    };
    let kind = match crate::config::is_encoder(&config) {
        true if crate::reranker::is_reranker(&config) => ModelKind::Reranker,
        true => ModelKind::Embedding,
        false => ModelKind::Chat,
    };
    Some(StoredModel {
        name,
        path: dir.to_path_buf(),
        format: "safetensors",
        bytes,
        quantization,
        architecture: config["model_type"].as_str().map(str::to_string),
        kind,
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

#[cfg(test)]
mod tests;

//! What fixes a reply besides its prompt: its seed and sampling settings, and the model's
//! [`Provenance`] (the content hash of its weights, their quantization, the engine build and
//! the backend class). The same prompt, seed and settings on the same provenance give the
//! same reply, on any machine of that backend class. Every generating route says so in
//! `x-seedbar-*` headers, and OpenAI's `system_fingerprint` is the provenance's fingerprint.
//! A remote model's reply names the engine that made it and whether that engine promises
//! the same reply for the same seed (`x-seedbar-remote`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::UNIX_EPOCH,
};

use axum::response::{IntoResponse, Response};
use seedbar_engine::runtime::Backend;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model_host::ModelCard;

/// The engine build: the version and the commit it was built from.
pub const ENGINE: &str = if env!("SEEDBAR_COMMIT").is_empty() {
    concat!("seedbar ", env!("CARGO_PKG_VERSION"))
} else {
    concat!(
        "seedbar ",
        env!("CARGO_PKG_VERSION"),
        " (",
        env!("SEEDBAR_COMMIT"),
        ")"
    )
};

/// Response headers of a receipt, for CORS to expose.
pub const HEADERS: [&str; 7] = [
    SEED_HEADER,
    "x-seedbar-fingerprint",
    "x-seedbar-weights",
    "x-seedbar-quantization",
    "x-seedbar-engine",
    "x-seedbar-backend",
    "x-seedbar-remote",
];

/// Response header carrying the seed a reply used.
pub const SEED_HEADER: &str = "x-seedbar-seed";

/// The part of a reply's receipt its model and the build fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// `sha256:` and the digest of the model's files (a folder's in name order).
    pub weights: String,
    /// The type most weights are in (`Q4_1`, `Q4`, `BF16`...), where known.
    pub quantization: Option<String>,
    /// [`ENGINE`].
    pub engine: String,
    /// `cpu`, `cuda` or `metal`: kernels differ between classes, so replies may too.
    pub backend: String,
    /// `fp_` and the first 12 hex digits of a SHA-256 of the four above.
    pub fingerprint: String,
    /// Set when another engine made the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteOrigin>,
}

/// The engine a remote model's reply came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteOrigin {
    /// `vllm`, `sglang`, `llama-server`, `ollama`, `seedbar` or `unknown`.
    pub engine: String,
    pub url: String,
    /// The upstream's model id.
    pub model: String,
    /// Whether that engine promises the same reply for the same seed whatever else it runs.
    pub identical_seeds: bool,
}

impl Provenance {
    /// `card`'s (its files hashed, or their digest known from before).
    pub fn of(card: &ModelCard, digests: &Digests) -> std::io::Result<Provenance> {
        let weights = digests.of(&card.path)?;
        let backend = Backend::current().name();
        let quantization = card.quantization.clone();
        Ok(Provenance {
            fingerprint: fingerprint(&[
                &weights,
                quantization.as_deref().unwrap_or(""),
                ENGINE,
                backend,
            ]),
            weights,
            quantization,
            engine: ENGINE.to_string(),
            backend: backend.to_string(),
            remote: None,
        })
    }

    /// A remote model's: the upstream's model id for the weights, its engine and version for
    /// the engine, `remote` for the backend.
    pub fn remote(remote: &seedbar_remote::Remote) -> Provenance {
        let weights = format!("remote:{}", remote.model);
        let engine = match &remote.engine_version {
            Some(version) => format!("{} {version}", remote.engine),
            None => remote.engine.clone(),
        };
        Provenance {
            fingerprint: fingerprint(&[&weights, &remote.url, &engine, "remote"]),
            weights,
            quantization: None,
            engine,
            backend: "remote".into(),
            remote: Some(RemoteOrigin {
                engine: remote.engine.clone(),
                url: remote.url.clone(),
                model: remote.model.clone(),
                identical_seeds: remote.identical_seeds,
            }),
        }
    }

    /// The receipt's headers for a reply with `seed`.
    pub fn headers(&self, seed: u64) -> Vec<(&'static str, String)> {
        let values = [
            Some(seed.to_string()),
            Some(self.fingerprint.clone()),
            Some(self.weights.clone()),
            self.quantization.clone(),
            Some(self.engine.clone()),
            Some(self.backend.clone()),
            self.remote.as_ref().map(|r| {
                let seeds = match r.identical_seeds {
                    true => "identical",
                    false => "not promised",
                };
                format!("{} at {}; seeds {seeds}", r.engine, r.url)
            }),
        ];
        HEADERS
            .into_iter()
            .zip(values)
            .filter_map(|(name, value)| Some((name, value?)))
            .collect()
    }
}

/// A reply's receipt: its seed, and its model's provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub seed: u64,
    #[serde(flatten)]
    pub provenance: Provenance,
}

/// A reply with its receipt's headers.
pub fn with_receipt(receipt: &Receipt, body: impl IntoResponse) -> Response {
    let mut response = body.into_response();
    for (name, value) in receipt.provenance.headers(receipt.seed) {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The weights digests computed so far, kept in `weights-digests.json` in the data directory,
/// so a model's files are hashed once per version (their sizes and times), not at every load
/// (an 8B model's take seconds).
pub struct Digests {
    file: PathBuf,
    /// By model path: the files' version when hashed, and the digest.
    known: Mutex<HashMap<PathBuf, (String, String)>>,
}

/// The file [`Digests`] keeps in the data directory.
pub const DIGESTS_FILE: &str = "weights-digests.json";

impl Digests {
    /// The digests kept in `root` (none where the file is missing or unreadable).
    pub fn open(root: &Path) -> Digests {
        let file = root.join(DIGESTS_FILE);
        let known = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Digests {
            file,
            known: Mutex::new(known),
        }
    }

    /// `sha256:` and the digest of the model at `path`, hashed if its files changed since.
    pub fn of(&self, path: &Path) -> std::io::Result<String> {
        let files = model_files(path)?;
        let version = version(&files)?;
        let lock = || self.known.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, digest)) = lock().get(path) {
            if *seen == version {
                return Ok(digest.clone());
            }
        }
        let mut hasher = Sha256::new();
        for file in &files {
            std::io::copy(&mut std::fs::File::open(file)?, &mut hasher)?;
        }
        let digest = format!("sha256:{}", hex(&hasher.finalize()));
        let mut known = lock();
        known.insert(path.to_path_buf(), (version, digest.clone()));
        // Kept for the next start; a failure to write only costs a hash then.
        let temporary = self.file.with_extension("tmp");
        let written = serde_json::to_vec(&*known)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(&temporary, json))
            .and_then(|()| std::fs::rename(&temporary, &self.file));
        if let Err(e) = written {
            tracing::warn!(file = %self.file.display(), error = %e, "weights digests not kept");
        }
        Ok(digest)
    }
}

/// The model file, or a folder's files in name order.
fn model_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Each file's name, size and modification time: what changes when the files do.
fn version(files: &[PathBuf]) -> std::io::Result<String> {
    let mut version = String::new();
    for file in files {
        let metadata = std::fs::metadata(file)?;
        let modified = metadata.modified()?.duration_since(UNIX_EPOCH);
        let nanos = modified.map_or(0, |d| d.as_nanos());
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        version += &format!("{name}:{}:{nanos};", metadata.len());
    }
    Ok(version)
}

/// `fp_` and 12 hex digits of a SHA-256 of `parts`.
fn fingerprint(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    format!("fp_{}", &hex(&hasher.finalize())[..12])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

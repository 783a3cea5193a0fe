//! What fixes a reply besides its prompt: its seed and sampling settings, and the model's
//! [`Provenance`] (the content hash of its weights, their quantization, the engine build and
//! the backend class). The same prompt, seed and settings on the same provenance give the
//! same reply, on any machine of that backend class. Every generating route says so in
//! `x-seedbar-*` headers, and OpenAI's `system_fingerprint` is the provenance's fingerprint.

use std::path::Path;

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
pub const HEADERS: [&str; 6] = [
    SEED_HEADER,
    "x-seedbar-fingerprint",
    "x-seedbar-weights",
    "x-seedbar-quantization",
    "x-seedbar-engine",
    "x-seedbar-backend",
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
}

impl Provenance {
    /// `card`'s, hashing its files.
    pub fn of(card: &ModelCard) -> std::io::Result<Provenance> {
        let weights = weights_digest(&card.path)?;
        let backend = match Backend::current() {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        };
        let quantization = card.quantization.clone();
        let mut fingerprint = Sha256::new();
        for part in [
            &weights,
            quantization.as_deref().unwrap_or(""),
            ENGINE,
            backend,
        ] {
            fingerprint.update(part.as_bytes());
            fingerprint.update([0]);
        }
        Ok(Provenance {
            fingerprint: format!("fp_{}", &hex(&fingerprint.finalize())[..12]),
            weights,
            quantization,
            engine: ENGINE.to_string(),
            backend: backend.to_string(),
        })
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

/// `sha256:` and the digest of the model file, or of a folder's files in name order.
pub fn weights_digest(path: &Path) -> std::io::Result<String> {
    let mut files = if path.is_dir() {
        std::fs::read_dir(path)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.is_file())
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        std::io::copy(&mut std::fs::File::open(&file)?, &mut hasher)?;
    }
    Ok(format!("sha256:{}", hex(&hasher.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

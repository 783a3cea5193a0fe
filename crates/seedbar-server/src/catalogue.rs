//! The first run's model catalogue (`GET /app/catalogue`): `catalogue.json`, built into the
//! binary and so refreshed with the app, lists current instruct models per size class in MLX
//! 4-bit and GGUF Q4_K_M. Here it is fitted to this machine: the memory each takes loaded,
//! whether that fits, which is recommended (the largest size class this machine's memory
//! takes, in MLX 4-bit, the format every backend runs on its fast path), its name in the
//! library once pulled, and whether it is there already.

use std::sync::Arc;

use axum::{extract::State, Json};
use seedbar_engine::{runtime::Backend, store::ModelKind};
use serde::{Deserialize, Serialize};

use crate::{error::ApiError, memory, App};

const CATALOGUE: &str = include_str!("../catalogue.json");

#[derive(Deserialize)]
struct Catalogue {
    size_classes: Vec<SizeClass>,
    models: Vec<Model>,
}

#[derive(Deserialize)]
struct SizeClass {
    class: String,
    /// The machine memory from which this class is the recommended one.
    min_memory_gb: u64,
}

#[derive(Deserialize, Serialize, Clone)]
struct Model {
    name: String,
    family: String,
    parameters_b: f64,
    size_class: String,
    /// `model_type` (GGUF: `general.architecture`), which Seedbar must run.
    architecture: String,
    thinks: bool,
    about: String,
    formats: Vec<Format>,
}

#[derive(Deserialize, Serialize, Clone)]
struct Format {
    /// `mlx-4bit` or `gguf-q4_k_m`.
    format: String,
    /// What `POST /app/models/pull` takes: `org/name`, or `org/name:file.gguf`.
    pull: String,
    /// About what the hub lists (the pull shows the exact total).
    download_bytes: u64,
}

/// The catalogue for this machine.
#[derive(Serialize)]
pub(crate) struct Offer {
    /// This machine's memory, which the recommendation follows.
    memory_bytes: u64,
    /// `cpu`, `cuda` or `metal`.
    backend: &'static str,
    /// The size class recommended here.
    size_class: String,
    models: Vec<OfferedModel>,
}

#[derive(Serialize)]
struct OfferedModel {
    #[serde(flatten)]
    model: Model,
    formats: Vec<OfferedFormat>,
}

#[derive(Serialize)]
struct OfferedFormat {
    #[serde(flatten)]
    format: Format,
    /// Its name in the library once pulled.
    model_name: String,
    /// What loading it takes: its files and a fifth more.
    memory_bytes: u64,
    /// Whether that much is free now.
    fits: bool,
    installed: bool,
    recommended: bool,
}

/// The library name a pull gives (the store's rule).
fn library_name(pull: &str) -> String {
    seedbar_engine::store::pulled_name(pull)
        .expect("catalogue.json's pulls are checked by its tests")
}

fn parse() -> Catalogue {
    serde_json::from_str(CATALOGUE).expect("catalogue.json is checked by its tests")
}

/// The catalogue fitted to a machine of `memory_bytes` (`free`: what is free now) on
/// `backend`, with `installed` library names.
fn offer(
    memory_bytes: u64,
    free: Option<u64>,
    backend: &'static str,
    installed: &[String],
) -> Offer {
    let catalogue = parse();
    let gb = memory_bytes / 1_000_000_000;
    let size_class = catalogue
        .size_classes
        .iter()
        .filter(|c| gb >= c.min_memory_gb)
        .max_by_key(|c| c.min_memory_gb)
        .map(|c| c.class.clone())
        .unwrap_or_default();
    // The recommended model: the first of the class (the catalogue's order is its choice).
    let pick = catalogue
        .models
        .iter()
        .position(|m| m.size_class == size_class);
    let models = catalogue
        .models
        .into_iter()
        .enumerate()
        .map(|(i, model)| {
            let formats = model
                .formats
                .iter()
                .map(|format| {
                    let model_name = library_name(&format.pull);
                    let needed = memory::needed(format.download_bytes);
                    OfferedFormat {
                        installed: installed
                            .iter()
                            .any(|n| n.eq_ignore_ascii_case(&model_name)),
                        fits: free.is_none_or(|free| needed <= free),
                        recommended: Some(i) == pick && format.format == "mlx-4bit",
                        memory_bytes: needed,
                        model_name,
                        format: format.clone(),
                    }
                })
                .collect();
            OfferedModel { model, formats }
        })
        .collect();
    Offer {
        memory_bytes,
        backend,
        size_class,
        models,
    }
}

pub(crate) async fn catalogue(State(app): State<Arc<App>>) -> Result<Json<Offer>, ApiError> {
    let installed: Vec<String> = app
        .models
        .installed()?
        .into_iter()
        .filter(|m| m.kind == ModelKind::Chat)
        .map(|m| m.name)
        .collect();
    let backend = Backend::current().name();
    let total = memory::total().unwrap_or(8 << 30);
    Ok(Json(offer(total, memory::available(), backend, &installed)))
}

#[cfg(test)]
mod tests {
    use seedbar_engine::store::StoredModel;

    use super::*;

    #[test]
    fn every_entry_is_one_seedbar_runs_and_pulls() {
        let catalogue = parse();
        assert!(catalogue.models.len() >= 6);
        for model in &catalogue.models {
            assert!(
                catalogue
                    .size_classes
                    .iter()
                    .any(|c| c.class == model.size_class),
                "{}",
                model.name
            );
            for format in &model.formats {
                let stored = StoredModel {
                    name: library_name(&format.pull),
                    path: Default::default(),
                    format: if format.format.starts_with("gguf") {
                        "gguf"
                    } else {
                        "safetensors"
                    },
                    bytes: format.download_bytes,
                    quantization: None,
                    architecture: Some(model.architecture.clone()),
                    kind: ModelKind::Chat,
                };
                assert!(stored.runnable(), "{} ({})", model.name, format.format);
                assert!(
                    seedbar_engine::store::check_pull_id(&format.pull).is_ok(),
                    "{}",
                    format.pull
                );
                assert!(format.download_bytes > 100_000_000, "{}", format.pull);
            }
            assert!(
                model.formats.iter().any(|f| f.format == "mlx-4bit"),
                "{}",
                model.name
            );
        }
    }

    #[test]
    fn the_recommendation_follows_the_memory() {
        let recommended = |gb: u64| {
            let offer = offer(gb * 1_000_000_000, None, "metal", &[]);
            let picks: Vec<(String, String)> = offer
                .models
                .iter()
                .flat_map(|m| m.formats.iter().map(move |f| (m, f)))
                .filter(|(_, f)| f.recommended)
                .map(|(m, f)| (m.model.size_class.clone(), f.format.format.clone()))
                .collect();
            assert_eq!(picks.len(), 1, "one recommendation at {gb} GB");
            (offer.size_class, picks[0].clone())
        };
        assert_eq!(recommended(8).0, "1-2B");
        assert_eq!(recommended(16).0, "3-4B");
        assert_eq!(recommended(32).0, "7-9B");
        assert_eq!(recommended(64).1, ("7-9B".into(), "mlx-4bit".into()));
    }

    #[test]
    fn what_does_not_fit_or_is_installed_says_so() {
        let offer = offer(
            16_000_000_000,
            Some(3_000_000_000),
            "cpu",
            &["qwen3-4b-q4_k_m".into()],
        );
        let formats: Vec<&OfferedFormat> = offer.models.iter().flat_map(|m| &m.formats).collect();
        let find = |pull: &str| formats.iter().find(|f| f.format.pull == pull).unwrap();
        let small = find("mlx-community/Qwen3-1.7B-4bit");
        assert!(small.fits && !small.installed);
        assert_eq!(small.model_name, "mlx-community--Qwen3-1.7B-4bit");
        let big = find("mlx-community/Qwen3-8B-4bit");
        assert!(!big.fits);
        assert!(big.memory_bytes > big.format.download_bytes);
        let gguf = find("unsloth/Qwen3-4B-GGUF:Qwen3-4B-Q4_K_M.gguf");
        assert!(gguf.installed, "library names compare case-insensitively");
        assert_eq!(gguf.model_name, "Qwen3-4B-Q4_K_M");
    }
}

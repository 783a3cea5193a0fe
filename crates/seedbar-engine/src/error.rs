//! The engine's one error type: every failure names what went wrong and where.

use std::path::PathBuf;

/// Errors from loading models, tokenizing, and generating.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unsupported model architecture `{name}` (supported: {supported})")]
    UnsupportedArchitecture { name: String, supported: String },
    #[error("{path}: {message}")]
    BadModelFile { path: PathBuf, message: String },
    #[error("{path}: file not found")]
    MissingFile { path: PathBuf },
    #[error("tensor `{name}` is missing from the model weights")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<i32>,
        actual: Vec<i32>,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("model `{0}` is not in the store (see `seedbar models`) and is not a path")]
    UnknownModel(String),
    #[error("a model named `{0}` is already installed; choose another name")]
    NameTaken(String),
    #[error("download: {0}")]
    Download(String),
    #[error("cancelled")]
    Cancelled,
    #[error("MLX: {0}")]
    Mlx(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl EngineError {
    pub(crate) fn bad_file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        EngineError::BadModelFile {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EngineError::Io {
            path: path.into(),
            source,
        }
    }
}

impl From<mlx_rs::error::Exception> for EngineError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        EngineError::Mlx(e.to_string())
    }
}

impl From<mlx_rs::error::AsSliceError> for EngineError {
    fn from(e: mlx_rs::error::AsSliceError) -> Self {
        EngineError::Mlx(e.to_string())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

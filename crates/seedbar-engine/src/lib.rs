//! Seedbar's engine: loads models into MLX (through mlx-rs), runs steps over many rows
//! ([`step::Batch`]), tokenizes and renders chat templates, parses tool calls and
//! thinking out of replies, and draws tokens with per-request seeded sampling.
//!
//! The crate root is its facade: the types a caller needs are re-exported here, and only
//! the modules other crates use whole are public (`step`, `sampling`, `runtime`, `store`,
//! `tokenizer`, `encoder`, `reranker`, `inventory`, `convert`, `row_trace`). Inside, `model.rs` is a
//! loaded model, `architectures/` the math of each family, `step/` the batch layout.
//!
//! ```no_run
//! use seedbar_engine::{ChatMessage, Model};
//! let model = Model::load(std::path::Path::new("SmolLM2-135M-Instruct.Q4_1.gguf"))?;
//! let prompt = model.chat_prompt(&[ChatMessage::new("user", "Hi")], None)?;
//! let mut sequence = model.sequence();
//! let logits = model.prefill(&prompt, &mut sequence)?;
//! let first = seedbar_engine::sampling::argmax(&logits);
//! # let _ = first;
//! # Ok::<(), seedbar_engine::EngineError>(())
//! ```

mod architectures;
mod chat_template;
mod config;
pub mod convert;
mod cuda_kernel;
pub mod encoder;
mod error;
mod finish_reason;
mod gguf;
mod hub;
pub mod inventory;
mod layers;
mod model;
mod reasoning;
pub mod reranker;
pub mod row_trace;
pub mod runtime;
pub mod sampling;
mod sequence;
pub mod step;
pub mod store;
pub mod tokenizer;
mod tool_calls;
mod vision;
mod weights;

pub use chat_template::{ChatMessage, ChatPrompt, ChatTemplate, ContentPart, TemplateKwargs};
pub use config::ModelConfig;
pub use error::{EngineError, Result};
pub use finish_reason::FinishReason;
pub use model::{Model, ModelFormat};
pub use reasoning::{ReasoningOutput, ReasoningParser, Thinking};
pub use sampling::SamplingParams;
pub use seedbar_kernels::Activations;
pub use sequence::{DecodeTimes, Sequence};
pub use tool_calls::{ToolCall, ToolCallParser, ToolOutput};
pub use vision::{ImageMarks, ImagePrompt, ImageTokens, Vision};
pub use weights::LoadOptions;

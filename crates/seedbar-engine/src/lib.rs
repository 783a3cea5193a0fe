//! Seedbar's engine: loads models into MLX (through mlx-rs), tokenizes and renders chat
//! templates, parses tool calls out of replies, and generates with per-request seeded sampling.

pub mod chat_template;
pub mod config;
pub mod convert;
pub mod dev;
pub mod embedding;
pub mod error;
pub mod generate;
pub mod gguf;
mod hub;
pub mod inventory;
pub mod model;
pub mod models;
pub mod row_trace;
pub mod runtime;
pub mod sampling;
pub mod step;
pub mod store;
pub mod tokenizer;
pub mod tool_calls;
pub mod weights;

pub use chat_template::ChatMessage;
pub use error::{EngineError, Result};
pub use generate::FinishReason;
pub use model::Model;
pub use sampling::SamplingParams;
pub use tool_calls::{ToolCall, ToolCallParser, ToolOutput};

//! Seedbar's scheduler: continuous batching of many requests over one model on a dedicated
//! engine thread, with per-row seeded sampling whose results do not depend on the batch.
//!
//! `scheduler` is the handle callers hold; it starts the engine thread (`worker`), which
//! keeps each request in a `row`, runs steps through the engine and has the rows' tokens
//! drawn (`draw`), reusing prompts' KV from the `prefix_cache` (in RAM) and the
//! `disk_cache` under it; decoding rows may draft
//! tokens and verify them in a step (`speculation`); a vision model's prompts carry
//! images, whose features prefill embeds (`images`).

mod config;
mod disk_cache;
mod draft_model;
mod draw;
#[cfg(debug_assertions)]
mod fault;
mod images;
#[cfg(debug_assertions)]
mod layout_override;
mod prefix_cache;
mod request;
mod row;
mod scheduler;
mod speculation;
mod stats;
mod step_costs;
mod step_timing;
mod stop;
mod worker;

pub use config::{draw_seed, SchedulerConfig};
pub use disk_cache::{DiskCache, DiskCacheStats, DiskTier};
pub use draft_model::DraftModel;
pub use request::{Event, PromptImage, Request, RequestStream, SubmitError, TokenLogprob, Usage};
pub use scheduler::Scheduler;
pub use stats::{SchedulerStats, TraceRecord};
pub use step_timing::{Phase, StepBreakdown, StepTimes};

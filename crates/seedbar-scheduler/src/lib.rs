//! Seedbar's scheduler: continuous batching of many requests over one model on a dedicated
//! engine thread, with per-row seeded sampling whose results do not depend on the batch.

mod engine;
#[cfg(debug_assertions)]
mod fault;
mod prefix_cache;
mod request;
mod step_timing;
mod stop;

pub use engine::{draw_seed, Scheduler, SchedulerConfig, SchedulerStats, TraceRecord};
pub use request::{Event, Request, RequestStream, SubmitError, TokenLogprob, Usage};
pub use step_timing::{Phase, StepBreakdown, StepTimes};

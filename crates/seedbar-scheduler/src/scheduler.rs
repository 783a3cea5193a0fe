//! The scheduler's handle: starts the engine thread over one model, validates and queues
//! requests (refusing them past its capacity), and stops the thread when dropped.
//!
//! Batch invariance: a row's numbers never depend on its neighbours. The model's layout
//! (`seedbar_engine::step::plan`) gives every matmul and attention call a shape fixed by the
//! row alone, prefill chunks start at multiples of the layout's chunk whatever else runs, and
//! sampling keys come from (seed, position).
//!
//! Pipelining (a GPU's default): where every row's sampling lets the device draw what the
//! host would, a step's tokens are drawn on the device and fed to the next step before they
//! are read; the host reads and streams them while that step runs, and computes the next
//! draws' noise on other threads meanwhile.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread,
};

use seedbar_engine::{step::plan::Layout, Model};
use tokio::sync::mpsc::unbounded_channel;

use crate::{
    config::{draw_seed, SchedulerConfig},
    draft_model::DraftModel,
    images::{self, ImageSlots},
    request::{Request, RequestStream, SubmitError},
    stats::SchedulerStats,
    worker::{Command, Pending, Worker},
};

/// Handle to the engine thread; cheap to share behind an `Arc`.
pub struct Scheduler {
    commands: mpsc::Sender<Command>,
    worker: Option<thread::JoinHandle<()>>,
    stats: Arc<SchedulerStats>,
    next_id: AtomicU64,
    config: SchedulerConfig,
    vocab_size: usize,
    /// How the model takes images, where it does.
    image_slots: Option<ImageSlots>,
}

impl Scheduler {
    pub fn start(model: Model, config: SchedulerConfig) -> Scheduler {
        Self::start_drafting(model, None, config)
    }

    /// A scheduler whose rows may draft with `drafter` too (where `config.speculative`):
    /// replies are the same, only faster where its guesses are kept.
    pub fn start_drafting(
        model: Model,
        drafter: Option<DraftModel>,
        mut config: SchedulerConfig,
    ) -> Scheduler {
        if let Some(trained) = model.config().max_position_embeddings.map(|m| m as usize) {
            if !config.past_trained_context {
                config.max_context = config.max_context.min(trained);
            } else if config.max_context > trained {
                tracing::warn!(
                    "context of {} tokens, past the {trained} the model was trained on: \
                     replies degrade past that",
                    config.max_context
                );
            }
        }
        let vocab_size = model.config().vocab_size as usize;
        let image_slots = ImageSlots::of(&model);
        let (commands, receiver) = mpsc::channel();
        let stats = Arc::new(SchedulerStats::default());
        #[cfg(debug_assertions)]
        if config.layout.is_none() {
            config.layout = crate::layout_override::from_env(&model);
        }
        let layout = if config.batch_invariant {
            config.layout.unwrap_or_else(|| model.layout())
        } else {
            Layout::REFERENCE
        };
        let worker = Worker::new(
            model,
            drafter,
            layout,
            config.clone(),
            stats.clone(),
            receiver,
        );
        let worker = thread::Builder::new()
            .name("seedbar-engine".into())
            .spawn(move || worker.run())
            .expect("spawn the engine thread");
        Scheduler {
            commands,
            worker: Some(worker),
            stats,
            next_id: AtomicU64::new(1),
            config,
            vocab_size,
            image_slots,
        }
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// False once the engine thread has ended: after `stop`, or after a failure that
    /// ended every request (a fresh scheduler is needed to serve again).
    pub fn is_running(&self) -> bool {
        !self.stats.stopped.load(Ordering::SeqCst)
    }

    /// Rows running or waiting for one.
    pub fn busy(&self) -> bool {
        self.stats.running.load(Ordering::SeqCst) + self.stats.queued.load(Ordering::SeqCst) > 0
    }

    /// End every running and queued request with `Event::Failed` and stop taking new ones
    /// (graceful shutdown); the thread itself is joined when the scheduler is dropped.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }

    /// Queue a request; its events arrive on the returned stream.
    pub fn submit(&self, mut request: Request) -> Result<RequestStream, SubmitError> {
        request
            .sampling
            .validate()
            .map_err(|e| SubmitError::Invalid(e.message))?;
        if request.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if let Some(bad) = request
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.vocab_size)
        {
            return Err(SubmitError::Invalid(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.vocab_size
            )));
        }
        images::key_images(&mut request.prompt, &request.images, self.image_slots)
            .map_err(SubmitError::Invalid)?;
        if request.prompt.len() >= self.config.max_context {
            return Err(SubmitError::PromptTooLong {
                prompt: request.prompt.len(),
                limit: self.config.max_context,
            });
        }
        let seed = request.seed.unwrap_or_else(draw_seed);
        request.seed = Some(seed);
        request.sampling.seed = seed;
        request.max_tokens = request
            .max_tokens
            .min(self.config.max_context - request.prompt.len());
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (events, receiver) = unbounded_channel();
        if !self.is_running() {
            return Err(SubmitError::Stopped);
        }
        // Capacity is every row plus the queue: a burst fills free rows before it counts
        // as waiting. The place is taken in the same atomic step as the check, so
        // concurrent submits cannot both take the last one; `running` is read after
        // `queued`, which `admit` leaves only once a request counts as running.
        let capacity = self.config.max_queue + self.config.max_rows;
        self.stats
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |queued| {
                let running = self.stats.running.load(Ordering::SeqCst);
                (queued + running < capacity).then_some(queued + 1)
            })
            .map_err(SubmitError::QueueFull)?;
        // Sent while the engine runs, the request's stream tells how it ends: `Failed` if
        // the engine fails before or while running it.
        let submitted = self.commands.send(Command::Submit(Box::new(Pending {
            id,
            request,
            events,
        })));
        if submitted.is_err() {
            self.stats.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        let commands = self.commands.clone();
        Ok(RequestStream {
            id,
            seed,
            events: receiver,
            cancel: Box::new(move || {
                let _ = commands.send(Command::Cancel(id));
            }),
            ended: false,
        })
    }
}

/// Stops the engine thread: running and queued requests end with `Event::Failed`, and the
/// model is freed on the engine thread before this returns (MLX and BLAS state must not be
/// torn down under a running step at process exit). On an async runtime's worker the wait
/// runs in `block_in_place`, so the runtime moves its other tasks elsewhere meanwhile.
impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        let Some(worker) = self.worker.take() else {
            return;
        };
        let join = move || {
            let _ = worker.join();
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(join),
            _ => join(),
        }
    }
}

//! The engine thread: admits requests, builds each step from every running row (an aligned
//! prefill chunk or one decode token), runs it as one batched forward pass, samples each row
//! with its own seed, streams events, and frees rows that finish or are cancelled.
//!
//! Batch invariance: a row's numbers never depend on its neighbours. The model's layout
//! (`seedbar_engine::step_plan`) gives every matmul and attention call a shape fixed by the
//! row alone, prefill chunks start at multiples of the layout's chunk whatever else runs, and
//! sampling keys come from (seed, position).
//!
//! Pipelining (a GPU's default): where every row's sampling lets the device draw what the
//! host would, a step's tokens are drawn on the device and fed to the next step before they
//! are read; the host reads and streams them while that step runs, and computes the next
//! draws' noise on other threads meanwhile.

use std::{
    any::Any,
    collections::VecDeque,
    hash::{BuildHasher, RandomState},
    panic::{self, AssertUnwindSafe},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    thread,
    time::Instant,
};

use mlx_rs::{transforms::async_eval, Array};
use seedbar_engine::{
    generate::PREFILL_CHUNK,
    kv_cache::{KvCache, KvPool},
    models::{Logits, StepTokens},
    row_trace::RowTrace,
    runtime,
    sampling::{self, log_softmax, DeviceDraw, SamplingParams},
    step_plan::{Layout, StepPlan},
    tokenizer::StreamDecoder,
    FinishReason, Model,
};
use seedbar_grammar::TokenMask;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::{
    prefix_cache::PrefixCache,
    request::{Event, Request, RequestStream, SubmitError, TokenLogprob, Usage},
    step_timing::{Phase, StepTimes},
    stop::{Released, StopMatcher},
};

/// Limits and layout of the engine thread.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Rows decoded together in one step.
    pub max_rows: usize,
    /// Requests waiting for a row; beyond this `submit` answers `QueueFull`.
    pub max_queue: usize,
    /// Prompt plus reply, in tokens.
    pub max_context: usize,
    /// Prefill tokens per step, bounding the pause running streams see while a long prompt
    /// is prefilled (at least one whole chunk always runs).
    pub prefill_tokens_per_step: usize,
    /// Bytes of KV of finished sequences kept for prefix reuse.
    pub prefix_cache_bytes: usize,
    /// `true` (the product): the model's batch-invariant layout (`Model::layout`) and
    /// prefill chunks aligned to absolute positions, so seeded replies do not depend on the
    /// batch. `false` is the fastest layout without that promise (`Layout::REFERENCE`:
    /// padded batched decode attention, prefill chunks as long as the budget allows), kept
    /// to measure what invariance costs.
    pub batch_invariant: bool,
    /// Another backend's invariant layout instead of this one's (tests run a GPU's pooled
    /// layout on the CPU with it); needs `batch_invariant`.
    pub layout: Option<Layout>,
    /// Draw on the device and build each step before the previous one's tokens are read,
    /// where every row's sampling allows it (`Worker::step`): a GPU's default, so the host
    /// builds, reads and streams while the device runs. The tokens are the host draw's.
    pub pipelined: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            // A GPU's matmuls cost the same for a few rows as for one: more rows pay. On the
            // CPU decoding is bound by reading the weights once a step up to about 16 rows
            // (the packed kernels), and a 9th to 16th chat would otherwise queue for a row.
            max_rows: if runtime::default_device_is_gpu() {
                32
            } else {
                16
            },
            max_queue: 64,
            max_context: 8192,
            // Two CPU chunks. A GPU's 512-token chunk is longer and runs alone (at least one
            // chunk always runs): about 7 ms for a 1B model on an H200 (70k tokens/s).
            prefill_tokens_per_step: 2 * PREFILL_CHUNK,
            prefix_cache_bytes: 512 << 20,
            batch_invariant: true,
            layout: None,
            pipelined: runtime::default_device_is_gpu(),
        }
    }
}

/// A fresh seed from OS entropy, below 2^53 so it survives a round trip through JSON
/// numbers in JavaScript (the chat UI pins them).
pub fn draw_seed() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now()) >> 11
}

/// Counters the server exposes.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    pub running: AtomicUsize,
    pub queued: AtomicUsize,
    pub steps: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Set once the engine thread has ended (shut down, or failed).
    pub stopped: AtomicBool,
    /// Where the steps' time went.
    pub times: StepTimes,
    /// One record per step that ran a row whose request asked for a trace.
    pub traces: Mutex<Vec<TraceRecord>>,
}

/// A traced row's numbers through one step ([`Request::trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRecord {
    /// The row's first position this step (the KV it held before it).
    pub position: usize,
    /// Its tokens this step.
    pub tokens: usize,
    /// Hashes of its positions after each layer's attention and MLP, then of its logits
    /// ([`RowTrace::hashes`]).
    pub hashes: Vec<u64>,
    /// The step around it: every row's token count, the matmul groups, the row's place.
    pub step: String,
}

enum Command {
    Submit(Box<Pending>),
    Cancel(u64),
    Shutdown,
}

struct Pending {
    id: u64,
    request: Request,
    events: UnboundedSender<Event>,
}

/// Handle to the engine thread; cheap to share behind an `Arc`.
pub struct Scheduler {
    commands: mpsc::Sender<Command>,
    worker: Option<thread::JoinHandle<()>>,
    stats: Arc<SchedulerStats>,
    next_id: AtomicU64,
    config: SchedulerConfig,
    vocab_size: usize,
}

impl Scheduler {
    pub fn start(model: Model, mut config: SchedulerConfig) -> Scheduler {
        if let Some(max) = model.config().max_position_embeddings {
            config.max_context = config.max_context.min(max as usize);
        }
        let vocab_size = model.config().vocab_size as usize;
        let (commands, receiver) = mpsc::channel();
        let stats = Arc::new(SchedulerStats::default());
        let layout = if config.batch_invariant {
            config.layout.unwrap_or_else(|| model.layout())
        } else {
            Layout::REFERENCE
        };
        let worker = Worker {
            model,
            layout,
            config: config.clone(),
            stats: stats.clone(),
            commands: receiver,
            queue: VecDeque::new(),
            rows: Vec::new(),
            prefix_cache: PrefixCache::new(config.prefix_cache_bytes, &layout),
            pool: KvPool::new(layout.pool_call_slots),
            draw_threads: runtime::cpu_cores(),
            in_flight: None,
            noise_ahead: None,
        };
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

/// The text of a panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

struct Row {
    id: u64,
    request: Request,
    events: UnboundedSender<Event>,
    caches: Vec<KvCache>,
    /// Tokens whose KV is in `caches`.
    fed: Vec<u32>,
    generated: Vec<u32>,
    cached_tokens: usize,
    /// Text of `generated` handed out so far.
    decoder: StreamDecoder,
    stop: StopMatcher,
    finished: bool,
}

impl Row {
    /// Whether the row's draws may run on the device: no output format, no log
    /// probabilities, and sampling the device draws exactly as the host.
    fn draws_on_device(&self, vocab: usize) -> bool {
        self.request.constraint.is_none()
            && self.request.logprobs.is_none()
            && self.request.sampling.draws_on_device(vocab)
    }

    fn prefilling(&self) -> bool {
        self.fed.len() < self.request.prompt.len()
    }

    /// The tokens this row runs next step: its last sampled token, or a prefill chunk: up
    /// to the next multiple of `chunk` when chunks are aligned (`Some`), else up to
    /// `budget` tokens.
    fn next_input(&self, aligned: Option<usize>, budget: usize) -> Vec<u32> {
        if self.prefilling() {
            let start = self.fed.len();
            let end = if let Some(chunk) = aligned {
                (start / chunk + 1) * chunk
            } else {
                start + budget.max(1)
            }
            .min(self.request.prompt.len());
            self.request.prompt[start..end].to_vec()
        } else {
            vec![*self
                .generated
                .last()
                .expect("decode rows have sampled a token")]
        }
    }

    /// The tokens the row's output format allows next; a format that cannot go on fails
    /// the row.
    fn allowed_next(&mut self) -> Option<TokenMask> {
        match self.request.constraint.as_mut()?.mask() {
            Ok(mask) => Some(mask),
            Err(e) => {
                self.fail(e.to_string());
                None
            }
        }
    }

    /// Feed the drawn token to the row's output format; false (and the row failed) if the
    /// format rejects it.
    fn follows_constraint(&mut self, token: u32) -> bool {
        let Some(constraint) = self.request.constraint.as_mut() else {
            return true;
        };
        match constraint.accept(token) {
            Ok(()) => true,
            Err(e) => {
                self.fail(e.to_string());
                false
            }
        }
    }

    fn fail(&mut self, reason: String) {
        self.send(Event::Failed(reason));
        self.finished = true;
    }

    fn send(&mut self, event: Event) {
        if self.events.send(event).is_err() {
            self.finished = true; // the receiver is gone: cancelled
        }
    }

    /// End the reply. Unless a stop string ended it, text still held back goes out with
    /// the final event (up to a stop string it completes, which then is the reason).
    fn finish(&mut self, mut reason: FinishReason, model: &Model, flush: bool) {
        let mut text = String::new();
        if flush {
            if let Ok(rest) = self.decoder.finish(&model.tokenizer, &self.generated) {
                match self.stop.push(&rest) {
                    Released::More(t) => text = t + &self.stop.finish(),
                    Released::Stopped(t, stop) => {
                        text = t;
                        reason = FinishReason::StopString(stop);
                    }
                }
            } else {
                text = self.stop.finish();
            }
        }
        let usage = Usage {
            prompt_tokens: self.request.prompt.len(),
            completion_tokens: self.generated.len(),
            cached_tokens: self.cached_tokens,
        };
        self.send(Event::Finished {
            reason,
            usage,
            text,
        });
        self.finished = true;
    }
}

struct Worker {
    model: Model,
    /// How each step's rows become matmuls and attention calls.
    layout: Layout,
    config: SchedulerConfig,
    stats: Arc<SchedulerStats>,
    commands: mpsc::Receiver<Command>,
    queue: VecDeque<Pending>,
    rows: Vec<Row>,
    prefix_cache: PrefixCache,
    /// Decoding rows' KV where the layout pools it.
    pool: KvPool,
    /// Threads the rows' draws may use (the machine's, read once: on Linux the call reads
    /// the cgroup quota files).
    draw_threads: usize,
    /// The tokens the last step drew on the device, not read yet.
    in_flight: Option<InFlight>,
    /// The noise of the next step's draws, computed ahead on other threads.
    noise_ahead: Option<thread::JoinHandle<Vec<NoiseJob>>>,
}

/// Tokens a step drew on the device: the next step takes them as inputs before they are
/// read.
struct InFlight {
    /// `[rows]` uint32, being evaluated.
    tokens: Array,
    /// The row each token is for (by id: rows may retire before it lands).
    rows: Vec<u64>,
}

/// What a chosen row runs in a step.
enum Input {
    /// Tokens known on the host: a prefill chunk, or the last drawn token.
    Host(Vec<u32>),
    /// The token it drew last step, still on the device: its index in [`InFlight::tokens`].
    Drawn(i32),
}

impl Input {
    fn len(&self) -> usize {
        match self {
            Input::Host(tokens) => tokens.len(),
            Input::Drawn(_) => 1,
        }
    }
}

impl Worker {
    /// Serve until shut down or until the engine fails (an MLX error or a panic): then
    /// every running, queued and submitted request ends with `Failed`, and the scheduler
    /// reports it is no longer running so its owner can start a fresh one.
    fn run(mut self) {
        let failure = match panic::catch_unwind(AssertUnwindSafe(|| self.serve())) {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("generation failed: {e}")),
            Err(panic) => Some(format!("the engine failed: {}", panic_message(&*panic))),
        };
        if let Some(reason) = &failure {
            tracing::error!(error = %reason, "engine thread stopped");
        }
        let reason = failure.unwrap_or_else(|| "the engine is shutting down".to_string());
        self.stats.stopped.store(true, Ordering::SeqCst);
        self.fail_all(&reason);
    }

    fn serve(&mut self) -> seedbar_engine::Result<()> {
        loop {
            if self.rows.is_empty() && self.queue.is_empty() {
                match self.commands.recv() {
                    Ok(Command::Shutdown) | Err(_) => return Ok(()),
                    Ok(c) => self.apply(c),
                }
            }
            while let Ok(c) = self.commands.try_recv() {
                if matches!(c, Command::Shutdown) {
                    return Ok(());
                }
                self.apply(c);
            }
            let started = Instant::now();
            self.admit();
            if self.rows.is_empty() {
                continue;
            }
            #[cfg(debug_assertions)]
            crate::fault::inject(&self.model, self.rows.iter().map(|r| &r.request.prompt));
            self.step()?;
            self.retire();
            self.stats.times.lap(Phase::Step, started);
            self.stats.times.count_step();
        }
    }

    /// End every row, queued request and request still in the command channel with
    /// `Failed(reason)`.
    fn fail_all(&mut self, reason: &str) {
        for row in &mut self.rows {
            row.send(Event::Failed(reason.to_string()));
        }
        self.rows.clear();
        self.in_flight = None;
        self.pool = KvPool::default();
        let submitted = self.commands.try_iter().filter_map(|c| match c {
            Command::Submit(p) => Some(*p),
            _ => None,
        });
        let pending: Vec<Pending> = self.queue.drain(..).chain(submitted).collect();
        for p in pending {
            let _ = p.events.send(Event::Failed(reason.to_string()));
        }
        self.stats.running.store(0, Ordering::SeqCst);
        self.stats.queued.store(0, Ordering::SeqCst);
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Shutdown => {}
            Command::Submit(p) => self.queue.push_back(*p),
            Command::Cancel(id) => {
                if let Some(i) = self.queue.iter().position(|p| p.id == id) {
                    self.queue.remove(i);
                    self.stats.queued.fetch_sub(1, Ordering::SeqCst);
                }
                if let Some(row) = self.rows.iter_mut().find(|r| r.id == id) {
                    row.finished = true;
                }
            }
        }
    }

    fn admit(&mut self) {
        while self.rows.len() < self.config.max_rows {
            let Some(p) = self.queue.pop_front() else {
                break;
            };
            // Counted as running before it stops counting as queued: `submit` reads the
            // two apart (`queued` first), and must never see a request in neither.
            self.stats.running.fetch_add(1, Ordering::SeqCst);
            self.stats.queued.fetch_sub(1, Ordering::SeqCst);
            let (cached, mut caches) = self
                .prefix_cache
                .lookup(&p.request.prompt)
                .unwrap_or_else(|| (0, self.model.transformer.new_caches()));
            // Where only the prompt's KV is reused, sliding windows must not let go of what
            // a cut back to the prompt needs (`retire`).
            if !self.layout.kv_independent_of_steps {
                for cache in &mut caches {
                    cache.hold_cut_back_to(p.request.prompt.len() as i32);
                }
            }
            let stop = StopMatcher::new(p.request.stop.clone());
            self.rows.push(Row {
                id: p.id,
                fed: p.request.prompt[..cached].to_vec(),
                request: p.request,
                events: p.events,
                caches,
                generated: Vec::new(),
                cached_tokens: cached,
                decoder: StreamDecoder::default(),
                stop,
                finished: false,
            });
        }
        self.stats.running.store(self.rows.len(), Ordering::SeqCst);
    }

    /// Run one step. Where every row draws on the device (and the scheduler pipelines),
    /// the step's tokens are drawn there and not read now: the next step takes them as its
    /// inputs, and they are read and streamed while that step runs ([`land`](Self::land)),
    /// so the host's work overlaps the device's. Otherwise the tokens of an earlier step
    /// are landed first and this step's logits are read and drawn on the host.
    fn step(&mut self) -> seedbar_engine::Result<()> {
        let stats = self.stats.clone();
        let times = &stats.times;
        let started = Instant::now();
        // The output head's width (the loaders check it against the checkpoint's tensors).
        let vocab = self.model.config().vocab_size as usize;
        let on_device = self.config.pipelined && self.rows.iter().all(|r| r.draws_on_device(vocab));
        if !on_device {
            self.land()?;
        }
        let chosen = self.choose();
        if chosen.is_empty() {
            return self.land();
        }
        // Rows drawn this step: decode rows, and prefill rows whose chunk ends the prompt.
        let drawn_rows: Vec<usize> = chosen
            .iter()
            .filter(|(i, input)| match input {
                Input::Drawn(_) => true,
                Input::Host(tokens) => {
                    let row = &self.rows[*i];
                    row.fed.len() + tokens.len() >= row.request.prompt.len()
                }
            })
            .map(|(i, _)| *i)
            .collect();
        // Their noise does not depend on the logits: computed ahead during the last step
        // (`spawn_noise_ahead`), or now on other threads while the step is built.
        let noise = self.noise_jobs(&drawn_rows);
        let ahead = self.noise_ahead.take();
        let threads = self.draw_threads;
        let traced = chosen.iter().position(|(i, _)| self.rows[*i].request.trace);
        let (tokens, from_drawn) = step_tokens(&chosen);
        let lens: Vec<i32> = chosen.iter().map(|(_, t)| t.len() as i32).collect();
        let previous = self.in_flight.as_ref().map(|f| f.tokens.clone());
        let drawn = previous.as_ref().map(|t| (t, from_drawn.as_slice()));
        let (logits, masks, noise, evaluated) =
            thread::scope(|scope| -> seedbar_engine::Result<_> {
                // One core stays with this thread, which builds and launches the step meanwhile.
                let filling = scope.spawn(move || {
                    let mut noise = noise;
                    if let Some(ahead) = ahead {
                        let ready = ahead.join().expect("the noise threads do not panic");
                        take_computed(&mut noise, ready);
                    }
                    fill_noise_all(&mut noise, vocab, threads - 1);
                    noise
                });
                let noise = || filling.join().expect("the noise threads do not panic");
                let mut picked: Vec<&mut [KvCache]> = Vec::with_capacity(chosen.len());
                let mut rest: &mut [Row] = &mut self.rows;
                let mut base = 0;
                for (i, _) in &chosen {
                    let (_, tail) = rest.split_at_mut(i - base);
                    let (row, after) = tail.split_first_mut().expect("chosen rows exist");
                    picked.push(&mut row.caches);
                    rest = after;
                    base = i + 1;
                }
                let plan = StepPlan::new(&self.layout, &lens);
                let input = StepTokens {
                    host: &tokens,
                    drawn,
                };
                let mut trace = traced.map(RowTrace::new);
                let position = traced.map(|n| picked[n][0].len());
                let mut logits = self.model.transformer.forward(
                    input,
                    &plan,
                    &mut picked,
                    &mut self.pool,
                    Logits::Last,
                    trace.as_mut(),
                )?;
                if let (Some(trace), Some(position)) = (trace, position) {
                    let n = trace.row;
                    let record = TraceRecord {
                        position: position as usize,
                        tokens: lens[n] as usize,
                        hashes: trace.hashes()?,
                        step: format!(
                            "lens {lens:?}, widths {:?}, row {n} at {:?}, pooled {:?}",
                            plan.widths,
                            plan.slots[n],
                            picked[n][0].pooled()
                        ),
                    };
                    stats.traces.lock().expect("traces").push(record);
                }
                if on_device {
                    let noise = noise();
                    // A step of prefill chunks alone draws nothing; its KV is launched all the same.
                    if !drawn_rows.is_empty() {
                        logits = draw_on_device(&self.rows, &logits, &chosen, &drawn_rows, &noise)?;
                    }
                    let built = times.lap(Phase::Build, started);
                    async_eval([&logits])?;
                    let launched = times.lap(Phase::Eval, built);
                    return Ok((logits, Vec::new(), noise, launched));
                }
                let built = times.lap(Phase::Build, started);
                async_eval([&logits])?;
                let launched = times.lap(Phase::Eval, built);
                // The output formats' masks do not depend on the logits either.
                let masks: Vec<Option<TokenMask>> = drawn_rows
                    .iter()
                    .map(|&i| self.rows[i].allowed_next())
                    .collect();
                let masked = times.lap(Phase::Mask, launched);
                logits.eval()?;
                let evaluated = times.lap(Phase::Eval, masked);
                Ok((logits, masks, noise(), evaluated))
            })?;
        stats.steps.fetch_add(1, Ordering::Relaxed);
        let mut fed_drawn = Vec::new();
        for (i, input) in &chosen {
            match input {
                Input::Host(t) => self.rows[*i].fed.extend_from_slice(t),
                Input::Drawn(_) => fed_drawn.push(self.rows[*i].id),
            }
        }
        if on_device {
            self.spawn_noise_ahead(noise, vocab);
            let launched = (!drawn_rows.is_empty()).then(|| InFlight {
                tokens: logits,
                rows: drawn_rows.iter().map(|&i| self.rows[i].id).collect(),
            });
            let landing = std::mem::replace(&mut self.in_flight, launched);
            return self.land_tokens(landing, &fed_drawn, evaluated);
        }
        // The logits are read in place (where the device's memory is the host's, this read
        // is the copy), row by row on the draw's threads.
        let all = logits.as_slice::<f32>();
        debug_assert_eq!(
            all.len(),
            chosen.len() * vocab,
            "one logits row per chosen row"
        );
        let sampled: Vec<(usize, &[f32])> = chosen
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| drawn_rows.contains(i))
            .map(|(n, (i, _))| (*i, &all[n * vocab..(n + 1) * vocab]))
            .collect();
        let draws = draw_all(&self.rows, &sampled, &masks, &noise, threads);
        let drawn = times.lap(Phase::Draw, evaluated);
        self.spawn_noise_ahead(noise, vocab);
        for ((i, logits), token) in sampled.into_iter().zip(draws) {
            let row = &mut self.rows[i];
            if row.finished || !row.follows_constraint(token) {
                continue;
            }
            let logprob = row
                .request
                .logprobs
                .map(|top_n| token_logprob(logits, token, top_n));
            emit(row, token, logprob, &self.model);
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        }
        times.lap(Phase::Emit, drawn);
        Ok(())
    }

    /// The rows that run this step, with their inputs: every decode row, and prefill rows
    /// while the chunk budget lasts (a whole aligned chunk, or what is left of the budget
    /// where KV does not depend on how steps split a row). A row whose token is in flight
    /// feeds it back, unless it is the row's last.
    fn choose(&self) -> Vec<(usize, Input)> {
        let aligned = (self.config.batch_invariant && !self.layout.kv_independent_of_steps)
            .then_some(self.layout.prefill_chunk);
        let budget = self.config.prefill_tokens_per_step;
        let mut prefill_tokens = 0;
        let mut chosen = Vec::new();
        for (i, row) in self.rows.iter().enumerate() {
            if let Some(j) = self.in_flight_index(row.id) {
                if row.generated.len() + 1 < row.request.max_tokens {
                    chosen.push((i, Input::Drawn(j as i32)));
                }
                continue;
            }
            let input = row.next_input(aligned, budget.saturating_sub(prefill_tokens));
            if row.prefilling() {
                if prefill_tokens > 0 && prefill_tokens + input.len() > budget {
                    continue;
                }
                prefill_tokens += input.len();
            }
            chosen.push((i, Input::Host(input)));
        }
        chosen
    }

    /// Where the row's token is among the tokens in flight, if it is.
    fn in_flight_index(&self, id: u64) -> Option<usize> {
        self.in_flight
            .as_ref()
            .and_then(|f| f.rows.iter().position(|&r| r == id))
    }

    /// The noise each of `drawn_rows` (indices into `rows`) draws with this step, not
    /// computed yet (none for a greedy row). A row whose token is in flight draws the one
    /// after it.
    fn noise_jobs(&self, drawn_rows: &[usize]) -> Vec<NoiseJob> {
        drawn_rows
            .iter()
            .filter_map(|&i| {
                let row = &self.rows[i];
                let pending = usize::from(self.in_flight_index(row.id).is_some());
                (row.request.sampling.temperature > 0.0).then(|| NoiseJob {
                    row: i,
                    id: row.id,
                    seed: row.request.sampling.seed,
                    position: (row.request.prompt.len() + row.generated.len() + pending) as u64,
                    noise: Vec::new(),
                    filled: false,
                })
            })
            .collect()
    }

    /// Start computing the noise of the drawn rows' next draws (`drawn`: this step's, whose
    /// buffers it reuses) on other threads, while the host lands, streams and builds the
    /// next step.
    fn spawn_noise_ahead(&mut self, drawn: Vec<NoiseJob>, vocab: usize) {
        let next: Vec<NoiseJob> = drawn
            .into_iter()
            .map(|job| NoiseJob {
                position: job.position + 1,
                filled: false,
                ..job
            })
            .collect();
        let threads = self.draw_threads;
        self.noise_ahead = (!next.is_empty()).then(|| {
            thread::spawn(move || {
                let mut next = next;
                fill_noise_all(&mut next, vocab, threads - 1);
                next
            })
        });
    }

    /// Land the tokens in flight, if any, where no step takes them as inputs.
    fn land(&mut self) -> seedbar_engine::Result<()> {
        let landing = self.in_flight.take();
        self.land_tokens(landing, &[], Instant::now())
    }

    /// Read the tokens a step drew on the device (waiting for that step) and stream each to
    /// its row, unless the row finished meanwhile. `fed` names the rows whose token the step
    /// just launched took as its input: their `fed` gains it.
    fn land_tokens(
        &mut self,
        landing: Option<InFlight>,
        fed: &[u64],
        since: Instant,
    ) -> seedbar_engine::Result<()> {
        let Some(landing) = landing else {
            return Ok(());
        };
        let times = &self.stats.times;
        landing.tokens.eval()?;
        let waited = times.lap(Phase::Eval, since);
        for (id, &token) in landing.rows.iter().zip(landing.tokens.as_slice::<u32>()) {
            let Some(row) = self.rows.iter_mut().find(|r| r.id == *id) else {
                continue;
            };
            if row.finished {
                continue;
            }
            if fed.contains(id) {
                row.fed.push(token);
            }
            emit(row, token, None, &self.model);
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        }
        times.lap(Phase::Emit, waited);
        Ok(())
    }

    fn retire(&mut self) {
        let (done, running): (Vec<Row>, Vec<Row>) = std::mem::take(&mut self.rows)
            .into_iter()
            .partition(|r| r.finished);
        self.rows = running;
        for mut row in done {
            // Finished, stopped or cancelled alike: `caches` hold exactly `fed`, but for
            // what a pool slot held. Where a decode step's KV differs from a prefill's, only
            // the prompt's is reused (sliding windows kept what that needs, `admit`).
            self.pool.release(&mut row.caches);
            if !self.layout.kv_independent_of_steps {
                let prompt = row.request.prompt.len().min(row.fed.len());
                row.fed.truncate(prompt);
                let cut = row
                    .caches
                    .iter_mut()
                    .try_for_each(|c| c.truncate(prompt as i32));
                if cut.is_err() {
                    continue;
                }
            }
            self.prefix_cache.insert(row.fed, row.caches);
        }
        self.stats.running.store(self.rows.len(), Ordering::SeqCst);
    }
}

/// The drawn rows' tokens from the step's logits (`[1, chosen, V]`), on the device:
/// `[drawn rows]` uint32, lazy.
fn draw_on_device(
    rows: &[Row],
    logits: &Array,
    chosen: &[(usize, Input)],
    drawn_rows: &[usize],
    noise: &[NoiseJob],
) -> seedbar_engine::Result<Array> {
    let vocab = logits.shape()[2];
    let mut logits = logits.reshape(&[-1, vocab])?;
    if drawn_rows.len() < chosen.len() {
        let at: Vec<i32> = chosen
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| drawn_rows.contains(i))
            .map(|(n, _)| n as i32)
            .collect();
        logits = logits.take_axis(Array::from_slice(&at, &[at.len() as i32]), 0)?;
    }
    let draws: Vec<DeviceDraw> = drawn_rows
        .iter()
        .map(|&i| DeviceDraw {
            params: &rows[i].request.sampling,
            noise: noise_of(noise, i),
        })
        .collect();
    sampling::draw_on_device(&logits, &draws)
}

/// What one row's draw reads.
struct Draw<'a> {
    sampling: &'a SamplingParams,
    prompt: &'a [u32],
    generated: &'a [u32],
    logits: &'a [f32],
    /// The tokens its output format allows, when it has one.
    allowed: Option<&'a TokenMask>,
    /// The noise of this draw ([`NoiseJob`]).
    noise: &'a [f32],
}

impl Draw<'_> {
    fn token(&self) -> u32 {
        let mut adjusted = self.logits.to_vec();
        self.sampling
            .adjust(&mut adjusted, self.prompt, self.generated);
        if let Some(allowed) = self.allowed {
            allowed.apply(&mut adjusted);
        }
        sampling::sample_with_noise(&adjusted, self.sampling, self.noise)
    }
}

/// The noise of one row's draw (at `position` of the row with `id`, the `row`-th this
/// step), computed on other threads while the step is built or ahead of it.
struct NoiseJob {
    row: usize,
    id: u64,
    seed: u64,
    position: u64,
    noise: Vec<f32>,
    filled: bool,
}

/// The step's input tokens in row order, and for each whether it is the in-flight token at
/// that index (then its host entry is a placeholder).
fn step_tokens(chosen: &[(usize, Input)]) -> (Vec<u32>, Vec<Option<i32>>) {
    let mut tokens = Vec::new();
    let mut from_drawn = Vec::new();
    for (_, input) in chosen {
        match input {
            Input::Host(t) => {
                tokens.extend_from_slice(t);
                from_drawn.extend(std::iter::repeat_n(None, t.len()));
            }
            Input::Drawn(j) => {
                tokens.push(0);
                from_drawn.push(Some(*j));
            }
        }
    }
    (tokens, from_drawn)
}

/// Give `jobs` the noise computed ahead (`ready`) for the same row and position.
fn take_computed(jobs: &mut [NoiseJob], ready: Vec<NoiseJob>) {
    for computed in ready {
        if let Some(job) = jobs
            .iter_mut()
            .find(|j| (j.id, j.position) == (computed.id, computed.position))
        {
            *job = NoiseJob {
                row: job.row,
                ..computed
            };
        }
    }
}

/// Fill every job's noise not filled yet over the whole vocabulary on up to `threads`
/// threads, rows cut in pieces when there are fewer rows than threads.
fn fill_noise_all(jobs: &mut [NoiseJob], vocab: usize, threads: usize) {
    let threads = threads.max(1);
    let mut work: Vec<(&mut [f32], u64, u64, usize)> = Vec::new();
    let todo: Vec<&mut NoiseJob> = jobs.iter_mut().filter(|j| !j.filled).collect();
    let piece = vocab.div_ceil(threads.div_ceil(todo.len().max(1))).max(1);
    for job in todo {
        job.filled = true;
        job.noise.resize(vocab, 0.0);
        for (k, part) in job.noise.chunks_mut(piece).enumerate() {
            work.push((part, job.seed, job.position, k * piece));
        }
    }
    let per_thread = work.len().div_ceil(threads).max(1);
    thread::scope(|scope| {
        for part in work.chunks_mut(per_thread) {
            scope.spawn(move || {
                for (noise, seed, position, first) in part.iter_mut() {
                    sampling::fill_noise(noise, *seed, *position, *first);
                }
            });
        }
    });
}

/// The noise of the `row`-th row's draw this step (empty when it draws greedily).
fn noise_of(jobs: &[NoiseJob], row: usize) -> &[f32] {
    jobs.iter()
        .find(|job| job.row == row)
        .map_or(&[], |job| &job.noise)
}

/// Each row's next token from its logits (`rows[i]` with `logits`). Rows are independent,
/// so they are drawn on up to `threads` threads (a draw reads the whole vocabulary, and the
/// device waits for all of them).
fn draw_all(
    rows: &[Row],
    sampled: &[(usize, &[f32])],
    masks: &[Option<TokenMask>],
    noise: &[NoiseJob],
    threads: usize,
) -> Vec<u32> {
    let draws: Vec<Draw> = sampled
        .iter()
        .zip(masks)
        .map(|(&(i, logits), allowed)| Draw {
            sampling: &rows[i].request.sampling,
            prompt: &rows[i].request.prompt,
            generated: &rows[i].generated,
            logits,
            allowed: allowed.as_ref(),
            noise: noise_of(noise, i),
        })
        .collect();
    if draws.len() < 2 || threads < 2 {
        return draws.iter().map(Draw::token).collect();
    }
    let per_thread = draws.len().div_ceil(threads);
    thread::scope(|scope| {
        let parts: Vec<_> = draws
            .chunks(per_thread)
            .map(|part| scope.spawn(move || part.iter().map(Draw::token).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().expect("a draw does not panic"))
            .collect()
    })
}

/// Stream the row's new token (or finish it) and what the token completes.
fn emit(row: &mut Row, token: u32, logprob: Option<TokenLogprob>, model: &Model) {
    if model.eos_ids.contains(&token) {
        row.finish(FinishReason::Stop, model, true);
        return;
    }
    row.generated.push(token);
    let text = row
        .decoder
        .push(&model.tokenizer, &row.generated)
        .unwrap_or_default();
    match row.stop.push(&text) {
        Released::Stopped(last, stop) => {
            row.send(Event::Token {
                id: token,
                text: last,
                logprob,
            });
            row.finish(FinishReason::StopString(stop), model, false);
        }
        Released::More(text) => {
            row.send(Event::Token {
                id: token,
                text,
                logprob,
            });
            if row.generated.len() >= row.request.max_tokens {
                row.finish(FinishReason::Length, model, true);
            }
        }
    }
}

fn token_logprob(logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    let n = top_n.min(order.len());
    if n > 0 {
        order.select_nth_unstable_by(n - 1, |a, b| lp[*b as usize].total_cmp(&lp[*a as usize]));
        order.truncate(n);
        order.sort_by(|a, b| lp[*b as usize].total_cmp(&lp[*a as usize]));
    } else {
        order.clear();
    }
    TokenLogprob {
        logprob: lp[token as usize],
        top: order.into_iter().map(|t| (t, lp[t as usize])).collect(),
    }
}

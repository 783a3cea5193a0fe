//! The engine thread: admits requests into rows, chooses each step's rows and inputs (an
//! aligned prefill chunk or one decode token each), runs the step as one batched forward
//! pass, has the rows' tokens drawn (`draw.rs`), streams them, and frees rows that finish
//! or are cancelled. A request whose prompt the disk tier holds more of than the RAM tier
//! waits while its file is read on another thread (`Loading`), then starts from it.

use std::{
    any::Any,
    collections::VecDeque,
    panic::{self, AssertUnwindSafe},
    sync::{atomic::Ordering, mpsc, Arc},
    thread,
    time::{Duration, Instant},
};

use mlx_rs::{transforms::async_eval, Array};
use seedbar_engine::{
    row_trace::RowTrace,
    runtime,
    sampling::{self, DeviceDraw},
    step::{
        kv_cache::{KvCache, KvSnapshot},
        plan::Layout,
        Batch, Logits, RowPositions, StepInput,
    },
    tokenizer::StreamDecoder,
    Model,
};
use seedbar_grammar::TokenMask;
use tokio::sync::mpsc::UnboundedSender;

use crate::{
    config::SchedulerConfig,
    disk_cache::{DiskCache, Found},
    draft_model::DraftModel,
    draw::{
        draw_all, draw_on_device, fill_noise_all, noise_ahead, noise_of, take_computed, Draw,
        Noise, NoiseJob,
    },
    images::{self, fed_token, ImageFeatures, ImageSlots},
    prefix_cache::PrefixCache,
    request::{Event, Request},
    row::{emit, take_drawn, Row},
    speculation::{self, Speculation},
    stats::{SchedulerStats, TraceRecord},
    step_costs::StepCosts,
    step_timing::Phase,
    stop::StopMatcher,
};

mod drafting;

/// What the handle sends the engine thread.
pub(crate) enum Command {
    Submit(Box<Pending>),
    Cancel(u64),
    Shutdown,
}

/// A submitted request waiting for a row.
pub(crate) struct Pending {
    pub(crate) id: u64,
    pub(crate) request: Request,
    pub(crate) events: UnboundedSender<Event>,
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

pub(crate) struct Worker {
    model: Model,
    /// How each step's rows become matmuls and attention calls, and the decode pool
    /// where the layout pools decoding rows' KV.
    batch: Batch,
    config: SchedulerConfig,
    stats: Arc<SchedulerStats>,
    commands: mpsc::Receiver<Command>,
    queue: VecDeque<Pending>,
    rows: Vec<Row>,
    prefix_cache: PrefixCache,
    /// The disk tier under it and this scheduler's key there.
    disk: Option<(Arc<DiskCache>, String)>,
    /// Requests waiting for their prefix's file.
    loading: Vec<Loading>,
    /// Threads the rows' draws may use (the machine's, read once: on Linux the call reads
    /// the cgroup quota files).
    draw_threads: usize,
    /// The tokens the last step drew on the device, not read yet.
    in_flight: Option<InFlight>,
    /// The noise of the next step's draws, computed ahead on other threads.
    noise_ahead: Option<thread::JoinHandle<Vec<NoiseJob>>>,
    /// Images' features, encoded when a prefill chunk first covers them.
    images: ImageFeatures,
    /// The draft model, where one drafts for this model (`draft_model.rs`).
    drafter: Option<DraftModel>,
    /// What steps cost, as measured: what drafts are weighed against.
    costs: StepCosts,
}

/// A request whose prefix the disk tier is reading.
struct Loading {
    pending: Pending,
    /// Prompt tokens the file holds.
    usable: usize,
    layers: mpsc::Receiver<Result<Vec<KvSnapshot>, String>>,
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
    /// The last drawn token and the tokens drafted after it (`speculation.rs`): each
    /// position's logits are drawn from.
    Verify(Vec<u32>),
    /// The token it drew last step, still on the device: its index in [`InFlight::tokens`].
    Drawn(i32),
}

impl Input {
    fn len(&self) -> usize {
        match self {
            Input::Host(tokens) | Input::Verify(tokens) => tokens.len(),
            Input::Drawn(_) => 1,
        }
    }

    /// How many of its positions the step's logits hold.
    fn drawn_positions(&self) -> i32 {
        match self {
            Input::Verify(tokens) => tokens.len() as i32,
            _ => 1,
        }
    }
}

impl Worker {
    pub(crate) fn new(
        model: Model,
        drafter: Option<DraftModel>,
        layout: Layout,
        config: SchedulerConfig,
        stats: Arc<SchedulerStats>,
        commands: mpsc::Receiver<Command>,
    ) -> Worker {
        let disk = config.disk_cache.as_ref().map(|tier| {
            let key = crate::disk_cache::key(&tier.model, &layout);
            (tier.cache.clone(), key)
        });
        Worker {
            model,
            batch: Batch::new(layout),
            prefix_cache: PrefixCache::new(config.prefix_cache_bytes, &layout),
            disk,
            loading: Vec::new(),
            config,
            stats,
            commands,
            queue: VecDeque::new(),
            rows: Vec::new(),
            draw_threads: runtime::cpu_cores(),
            in_flight: None,
            noise_ahead: None,
            images: ImageFeatures::default(),
            drafter,
            costs: StepCosts::default(),
        }
    }

    /// Serve until shut down or until the engine fails (an MLX error or a panic): then
    /// every running, queued and submitted request ends with `Failed`, and the scheduler
    /// reports it is no longer running so its owner can start a fresh one.
    pub(crate) fn run(mut self) {
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
            // Nothing to step: nothing queued, or every row's slot waits for a file.
            let slots_full = self.rows.len() + self.loading.len() >= self.config.max_rows;
            if self.rows.is_empty() && (self.queue.is_empty() || slots_full) {
                // While files load, wake now and then to see whether they have.
                let waited = if self.loading.is_empty() {
                    self.commands
                        .recv()
                        .map_err(|_| mpsc::RecvTimeoutError::Disconnected)
                } else {
                    self.commands.recv_timeout(Duration::from_millis(2))
                };
                match waited {
                    Ok(Command::Shutdown) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                        return Ok(())
                    }
                    Ok(c) => self.apply(c),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
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
        self.batch.clear();
        let submitted = self.commands.try_iter().filter_map(|c| match c {
            Command::Submit(p) => Some(*p),
            _ => None,
        });
        let loading = self.loading.drain(..).map(|l| l.pending);
        let pending: Vec<Pending> = self
            .queue
            .drain(..)
            .chain(loading)
            .chain(submitted)
            .collect();
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
                self.loading.retain(|l| l.pending.id != id);
                self.stats
                    .running
                    .store(self.rows.len() + self.loading.len(), Ordering::SeqCst);
                if let Some(row) = self.rows.iter_mut().find(|r| r.id == id) {
                    row.finished = true;
                }
            }
        }
    }

    /// Give queued requests rows, with the longest prefix either tier holds (a file is read
    /// first, off this thread), and start the rows whose files have been read.
    fn admit(&mut self) {
        self.land_loads();
        while self.rows.len() + self.loading.len() < self.config.max_rows {
            let Some(p) = self.queue.pop_front() else {
                break;
            };
            // Counted as running before it stops counting as queued: `submit` reads the
            // two apart (`queued` first), and must never see a request in neither.
            self.stats.running.fetch_add(1, Ordering::SeqCst);
            self.stats.queued.fetch_sub(1, Ordering::SeqCst);
            let in_ram = self.prefix_cache.lookup(&p.request.prompt);
            let granularity = self.batch.layout().reuse_granularity();
            let on_disk = self.disk.as_ref().and_then(|(disk, key)| {
                let at_least = in_ram.as_ref().map_or(0, |(n, _)| *n);
                Some((
                    disk.clone(),
                    disk.find(key, &p.request.prompt, granularity, at_least)?,
                ))
            });
            match on_disk {
                Some((disk, found)) => self.start_loading(p, disk, found),
                None => {
                    let (cached, caches) = in_ram.unwrap_or_else(|| (0, self.model.new_caches()));
                    self.start_row(p, cached, caches);
                }
            }
        }
        self.stats
            .running
            .store(self.rows.len() + self.loading.len(), Ordering::SeqCst);
    }

    /// Read a request's prefix from its file on a thread of its own.
    fn start_loading(&mut self, pending: Pending, disk: Arc<DiskCache>, found: Found) {
        let (sender, layers) = mpsc::channel();
        let usable = found.usable;
        thread::spawn(move || {
            let _ = sender.send(disk.load(&found));
        });
        self.loading.push(Loading {
            pending,
            usable,
            layers,
        });
    }

    /// Start the rows whose files have been read: from the file's KV, or, where it could
    /// not be used, from what the RAM tier has.
    fn land_loads(&mut self) {
        let mut i = 0;
        while i < self.loading.len() {
            let read = match self.loading[i].layers.try_recv() {
                Err(mpsc::TryRecvError::Empty) => {
                    i += 1;
                    continue;
                }
                Ok(read) => read,
                Err(mpsc::TryRecvError::Disconnected) => Err("the reading thread ended".into()),
            };
            let Loading {
                pending, usable, ..
            } = self.loading.remove(i);
            let layers = self.model.new_caches().len();
            let restored = read.and_then(|snapshots| restore(snapshots, usable, layers));
            let (cached, caches) = match restored {
                Ok(caches) => (usable, caches),
                Err(e) => {
                    tracing::warn!(error = %e, "a KV cache file was not used");
                    self.prefix_cache
                        .lookup(&pending.request.prompt)
                        .unwrap_or_else(|| (0, self.model.new_caches()))
                }
            };
            self.start_row(pending, cached, caches);
        }
    }

    /// A row for a request whose first `cached` prompt tokens `caches` hold.
    fn start_row(&mut self, p: Pending, cached: usize, mut caches: Vec<KvCache>) {
        // Where only the prompt's KV is reused, sliding windows must not let go of what a
        // cut back to the prompt needs (`retire`).
        if !self.batch.layout().kv_independent_of_steps {
            for cache in &mut caches {
                cache.hold_cut_back_to(p.request.prompt.len() as i32);
            }
        }
        let stop = StopMatcher::new(p.request.stop.clone());
        let positions = images::row_positions(&p.request, ImageSlots::of(&self.model));
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
            speculation: Speculation::default(),
            draft: None,
            positions,
        });
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
        let rows = (
            self.rows.len(),
            self.rows.iter().map(|r| r.id).fold(0, u64::wrapping_add),
        );
        self.costs.started(started, rows);
        // The output head's width (the loaders check it against the checkpoint's tensors).
        let vocab = self.model.config().vocab_size as usize;
        let on_device = self.config.pipelined
            && self.rows.iter().all(|r| r.draws_on_device(vocab))
            && !self.rows_may_draft();
        if !on_device {
            self.land()?;
        }
        let chosen = self.choose(!on_device);
        debug_assert!(
            !on_device || !chosen.iter().any(|(_, i)| matches!(i, Input::Verify(_))),
            "a pipelined step verifies no drafts"
        );
        if chosen.is_empty() {
            return self.land();
        }
        let chosen_at = Instant::now();
        // Rows drawn this step: decode rows, and prefill rows whose chunk ends the prompt.
        let drawn_rows: Vec<usize> = chosen
            .iter()
            .filter(|(i, input)| match input {
                Input::Drawn(_) | Input::Verify(_) => true,
                Input::Host(tokens) => {
                    let row = &self.rows[*i];
                    row.fed.len() + tokens.len() >= row.request.prompt.len()
                }
            })
            .map(|(i, _)| *i)
            .collect();
        // Their noise does not depend on the logits: computed ahead during the last step
        // (`draw::noise_ahead`), or now on other threads while the step is built; none
        // where the device draws and computes the noise itself.
        let noise = if on_device && sampling::noise_drawn_on_device() {
            Vec::new()
        } else {
            self.noise_jobs(&drawn_rows)
        };
        let draw_at: Vec<u64> = drawn_rows.iter().map(|&i| self.draw_position(i)).collect();
        let ahead = self.noise_ahead.take();
        let threads = self.draw_threads;
        let traced = chosen.iter().position(|(i, _)| self.rows[*i].request.trace);
        let soft_token = self
            .model
            .vision
            .as_ref()
            .map_or(0, |v| v.prompt.image_token);
        let (tokens, from_drawn) = step_tokens(&chosen, soft_token);
        let embeds = self.images.for_step(
            &self.model,
            chosen
                .iter()
                .map(|(i, input)| (&self.rows[*i], input.len())),
        )?;
        let embedded = images::embedded(&embeds);
        let positions: Vec<RowPositions> = chosen
            .iter()
            .map(|(i, _)| self.rows[*i].positions.clone())
            .collect();
        let lens: Vec<i32> = chosen.iter().map(|(_, t)| t.len() as i32).collect();
        let tails: Vec<i32> = chosen.iter().map(|(_, t)| t.drawn_positions()).collect();
        let speculating = tails.iter().any(|&n| n > 1);
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
                let input = StepInput {
                    lens: &lens,
                    host: &tokens,
                    drawn,
                    embedded: &embedded,
                    positions: &positions,
                };
                let mut trace = traced.map(RowTrace::new);
                let position = traced.map(|n| picked[n][0].len());
                let mut logits = self.batch.run(
                    &self.model,
                    input,
                    &mut picked,
                    if speculating {
                        Logits::Tails(&tails)
                    } else {
                        Logits::Last
                    },
                    trace.as_mut(),
                )?;
                if let (Some(trace), Some(position)) = (trace, position) {
                    let n = trace.row;
                    let step = trace.step.clone();
                    let record = TraceRecord {
                        position: position as usize,
                        tokens: lens[n] as usize,
                        hashes: trace.hashes()?,
                        step,
                    };
                    stats.traces.lock().expect("traces").push(record);
                }
                if on_device {
                    let noise = noise();
                    // A step of prefill chunks alone draws nothing; its KV is launched all the same.
                    if !drawn_rows.is_empty() {
                        let at: Vec<i32> = chosen
                            .iter()
                            .enumerate()
                            .filter(|(_, (i, _))| drawn_rows.contains(i))
                            .map(|(n, _)| n as i32)
                            .collect();
                        let draws: Vec<DeviceDraw> = drawn_rows
                            .iter()
                            .zip(&draw_at)
                            .map(|(&i, &position)| DeviceDraw {
                                params: &self.rows[i].request.sampling,
                                position,
                                noise: noise_of(&noise, i),
                            })
                            .collect();
                        logits = draw_on_device(&logits, &at, &draws)?;
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
        // Decoding rows alone: each row's positions are the ones it draws from.
        let decoding = lens.iter().zip(&tails).all(|(l, t)| l == t);
        self.costs.ran(decoding.then_some(on_device));
        if on_device {
            stats.pipelined_steps.fetch_add(1, Ordering::Relaxed);
        }
        let mut fed_drawn = Vec::new();
        for (i, input) in &chosen {
            match input {
                Input::Host(t) | Input::Verify(t) => self.rows[*i].fed.extend_from_slice(t),
                Input::Drawn(_) => fed_drawn.push(self.rows[*i].id),
            }
        }
        if on_device {
            self.noise_ahead = noise_ahead(noise, vocab, self.draw_threads);
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
        let positions: usize = tails.iter().map(|&n| n as usize).sum();
        debug_assert_eq!(all.len(), positions * vocab, "the logits rows asked for");
        // Each drawn row's logits from its first drawn position on (a verifying row's other
        // positions follow it), and a verifying row's drafts.
        let mut first = 0;
        let sampled: Vec<_> = chosen
            .iter()
            .zip(&tails)
            .map(|((i, input), &n)| {
                let at = first * vocab;
                first += n as usize;
                let drafts = match input {
                    Input::Verify(tokens) => Some(&tokens[1..]),
                    _ => None,
                };
                (*i, &all[at..at + n as usize * vocab], drafts)
            })
            .filter(|(i, _, _)| drawn_rows.contains(i))
            .collect();
        let draws: Vec<Draw> = sampled
            .iter()
            .zip(&masks)
            .map(|(&(i, logits, _), allowed)| {
                let row = &self.rows[i];
                Draw {
                    sampling: &row.request.sampling,
                    prompt: &row.request.prompt,
                    generated: &row.generated,
                    logits: &logits[..vocab],
                    allowed: allowed.as_ref(),
                    noise: Noise::Computed(noise_of(&noise, i)),
                }
            })
            .collect();
        let draws = draw_all(&draws, threads);
        let drawn = times.lap(Phase::Draw, evaluated);
        self.noise_ahead = noise_ahead(noise, vocab, self.draw_threads);
        for ((i, logits, drafts), token) in sampled.into_iter().zip(draws) {
            let row = &mut self.rows[i];
            let before = row.generated.len();
            if !row.finished {
                take_drawn(row, token, &logits[..vocab], &self.model);
            }
            if let Some(drafts) = drafts {
                let kept = speculation::verify(row, token, drafts, logits, vocab, &self.model);
                row.speculation.learn(drafts.len(), kept);
                // The drafts after the last one kept ran on positions plain decoding does
                // not reach: their KV goes.
                let fed = row.fed.len() - (drafts.len() - kept);
                row.fed.truncate(fed);
                row.caches
                    .iter_mut()
                    .try_for_each(|c| c.truncate(fed as i32))?;
                self.stats
                    .drafted_tokens
                    .fetch_add(drafts.len() as u64, Ordering::Relaxed);
                self.stats
                    .accepted_tokens
                    .fetch_add(kept as u64, Ordering::Relaxed);
            } else {
                row.speculation.observe(token);
            }
            let emitted = row.generated.len() - before;
            self.stats
                .generated_tokens
                .fetch_add(emitted as u64, Ordering::Relaxed);
        }
        times.lap(Phase::Emit, drawn);
        let took = chosen_at.elapsed().as_secs_f32();
        let drafted: usize = tails.iter().map(|&n| n as usize - 1).sum();
        // Decode rows alone, or with verifying rows: what the drafts added.
        if decoding {
            self.costs.measured(took, drafted);
        }
        Ok(())
    }

    /// The rows that run this step, with their inputs: every decode row, and prefill rows
    /// while the chunk budget lasts (a chunk as the layout cuts it: `Layout::chunk_end`). A
    /// row whose token is in flight feeds it back, unless it is the row's last. Decoding
    /// rows draft where the step draws on the host (`drafting`): a pipelined step's draw
    /// takes one token a row and verifies nothing.
    fn choose(&mut self, drafting: bool) -> Vec<(usize, Input)> {
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
            let input = row.next_input(self.batch.layout(), budget.saturating_sub(prefill_tokens));
            if row.prefilling() {
                if prefill_tokens > 0 && prefill_tokens + input.len() > budget {
                    continue;
                }
                prefill_tokens += input.len();
            }
            chosen.push((i, Input::Host(input)));
        }
        if drafting {
            self.draft(&mut chosen, budget.saturating_sub(prefill_tokens));
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
                (row.request.sampling.temperature > 0.0).then(|| NoiseJob {
                    row: i,
                    id: row.id,
                    seed: row.request.sampling.seed,
                    position: self.draw_position(i),
                    noise: Vec::new(),
                    filled: false,
                })
            })
            .collect()
    }

    /// The position the `i`-th row draws at this step: after its tokens so far and the one
    /// in flight, if any.
    fn draw_position(&self, i: usize) -> u64 {
        let row = &self.rows[i];
        let pending = usize::from(self.in_flight_index(row.id).is_some());
        (row.request.prompt.len() + row.generated.len() + pending) as u64
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
        let stats = self.stats.clone();
        let times = &stats.times;
        landing.tokens.eval()?;
        let waited = times.lap(Phase::Eval, since);
        let tokens = landing.tokens.as_slice::<u32>();
        let landed: Vec<(usize, u32)> = (landing.rows.iter().zip(tokens))
            .filter_map(|(id, &token)| {
                let i = self.rows.iter().position(|r| r.id == *id)?;
                (!self.rows[i].finished).then_some((i, token))
            })
            .collect();
        self.score_landed(&landed);
        for &(i, token) in &landed {
            let row = &mut self.rows[i];
            if fed.contains(&row.id) {
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
            self.batch.release(&mut row.caches);
            if !self.batch.layout().kv_independent_of_steps {
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
            if let Some((disk, key)) = &self.disk {
                if row.fed.len() >= self.batch.layout().reuse_granularity() {
                    disk.save(key, &row.fed, &row.caches);
                }
            }
            self.prefix_cache.insert(row.fed, row.caches);
        }
        self.stats
            .running
            .store(self.rows.len() + self.loading.len(), Ordering::SeqCst);
    }
}

/// A sequence's caches from a file's layers, cut back to the `usable` positions reused.
fn restore(
    snapshots: Vec<KvSnapshot>,
    usable: usize,
    layers: usize,
) -> Result<Vec<KvCache>, String> {
    if snapshots.len() != layers {
        return Err(format!(
            "{} layers where the model has {layers}",
            snapshots.len()
        ));
    }
    let restore_one = |snapshot| -> seedbar_engine::Result<KvCache> {
        let mut cache = KvCache::restore(snapshot)?;
        cache.truncate(usable as i32)?;
        Ok(cache)
    };
    snapshots
        .into_iter()
        .map(restore_one)
        .collect::<seedbar_engine::Result<_>>()
        .map_err(|e| e.to_string())
}

/// The step's input tokens in row order (an image's keys fed as the model's `soft_token`),
/// and for each whether it is the in-flight token at that index (then its host entry is a
/// placeholder).
fn step_tokens(chosen: &[(usize, Input)], soft_token: u32) -> (Vec<u32>, Vec<Option<i32>>) {
    let mut tokens = Vec::new();
    let mut from_drawn = Vec::new();
    for (_, input) in chosen {
        match input {
            Input::Host(t) | Input::Verify(t) => {
                tokens.extend(t.iter().map(|&t| fed_token(t, soft_token)));
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

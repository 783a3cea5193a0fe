//! A step's draws: each row's token from its logits with its own keyed noise, on the host
//! (on the draw threads, filters, penalties and output formats applied) or on the device
//! (pipelined steps), and the noise itself, computed on other threads while a step is
//! built or ahead of it.

use std::thread;

use mlx_rs::Array;
use seedbar_engine::sampling::{self, DeviceDraw, SamplingParams};
use seedbar_grammar::TokenMask;

/// The tokens of the rows at `at` among a step's logits (`[1, rows, V]`), drawn on the
/// device: `[at.len()]` uint32, lazy.
pub(crate) fn draw_on_device(
    logits: &Array,
    at: &[i32],
    draws: &[DeviceDraw],
) -> seedbar_engine::Result<Array> {
    let vocab = logits.shape()[2];
    let mut logits = logits.reshape(&[-1, vocab])?;
    if at.len() < logits.shape()[0] as usize {
        logits = logits.take_axis(Array::from_slice(at, &[at.len() as i32]), 0)?;
    }
    sampling::draw_on_device(&logits, draws)
}

/// What one row's draw reads.
pub(crate) struct Draw<'a> {
    pub(crate) sampling: &'a SamplingParams,
    pub(crate) prompt: &'a [u32],
    pub(crate) generated: &'a [u32],
    pub(crate) logits: &'a [f32],
    /// The tokens its output format allows, when it has one.
    pub(crate) allowed: Option<&'a TokenMask>,
    pub(crate) noise: Noise<'a>,
}

/// The noise a draw adds to its logits.
#[derive(Clone, Copy)]
pub(crate) enum Noise<'a> {
    /// Computed ahead over the whole vocabulary ([`NoiseJob`]; empty when greedy).
    Computed(&'a [f32]),
    /// Computed while drawing, for the candidates alone: the noise of this position.
    At(u64),
}

impl Draw<'_> {
    pub(crate) fn token(&self) -> u32 {
        let mut adjusted = self.logits.to_vec();
        self.sampling
            .adjust(&mut adjusted, self.prompt, self.generated);
        if let Some(allowed) = self.allowed {
            allowed.apply(&mut adjusted);
        }
        match self.noise {
            Noise::Computed(noise) => sampling::sample_with_noise(&adjusted, self.sampling, noise),
            Noise::At(position) => sampling::sample(&adjusted, self.sampling, position),
        }
    }
}

/// The noise of one row's draw (at `position` of the row with `id`, the `row`-th this
/// step), computed on other threads while the step is built or ahead of it.
pub(crate) struct NoiseJob {
    pub(crate) row: usize,
    pub(crate) id: u64,
    pub(crate) seed: u64,
    pub(crate) position: u64,
    pub(crate) noise: Vec<f32>,
    pub(crate) filled: bool,
}

/// Give `jobs` the noise computed ahead (`ready`) for the same row and position.
pub(crate) fn take_computed(jobs: &mut [NoiseJob], ready: Vec<NoiseJob>) {
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
pub(crate) fn fill_noise_all(jobs: &mut [NoiseJob], vocab: usize, threads: usize) {
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
pub(crate) fn noise_of(jobs: &[NoiseJob], row: usize) -> &[f32] {
    jobs.iter()
        .find(|job| job.row == row)
        .map_or(&[], |job| &job.noise)
}

/// Start computing the noise of `drawn`'s next draws (one position on) on other threads:
/// `None` when no row draws with noise.
pub(crate) fn noise_ahead(
    drawn: Vec<NoiseJob>,
    vocab: usize,
    threads: usize,
) -> Option<thread::JoinHandle<Vec<NoiseJob>>> {
    let mut next: Vec<NoiseJob> = drawn
        .into_iter()
        .map(|job| NoiseJob {
            position: job.position + 1,
            filled: false,
            ..job
        })
        .collect();
    (!next.is_empty()).then(|| {
        thread::spawn(move || {
            fill_noise_all(&mut next, vocab, threads - 1);
            next
        })
    })
}

/// Each draw's token. Rows are independent, so they are drawn on up to `threads` threads
/// (a draw reads the whole vocabulary, and the device waits for all of them).
pub(crate) fn draw_all(draws: &[Draw], threads: usize) -> Vec<u32> {
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

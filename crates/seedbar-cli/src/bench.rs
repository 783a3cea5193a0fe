//! `seedbar bench`: measurements printed as JSON for scripts that put Seedbar next to its
//! peers in the same run (`scripts/bench.py`).
//! - `speed`: prefill of a long prompt and batch-1 decode.
//! - `throughput`: aggregate decode rate and time to first token at several concurrencies.
//! - `speculative`: one chat (an editor's request, a plain chat) and eight with and without
//!   speculative decoding, and whether the replies are the same.
//! - `determinism`: random mixes of concurrent seeded requests; how often a request's reply
//!   equals its reply alone (with `--trace`, also whether its numbers did, and where they
//!   first parted: the step and layer).

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Result;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use seedbar_engine::{row_trace, sampling, ChatMessage, Model, SamplingParams};
use seedbar_scheduler::{Event, Request, RequestStream, Scheduler, SchedulerConfig, TraceRecord};
use serde_json::json;

use crate::ModelArg;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Prefill and batch-1 decode speed.
    Speed {
        #[command(flatten)]
        model: ModelArg,
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 128)]
        decode_tokens: usize,
        /// Repetitions; the best is reported.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
    },
    /// Aggregate tokens/s and time to first token with N seeded streams at once.
    Throughput {
        #[command(flatten)]
        model: ModelArg,
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        streams: Vec<usize>,
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        /// Run the fastest layout without the invariance promise (what invariance costs).
        #[arg(long)]
        reference: bool,
        /// Decode without speculation (what drafting gains or costs these streams).
        #[arg(long)]
        no_speculative: bool,
        /// Pipelined steps or not, whatever the device (default: on a GPU).
        #[arg(long)]
        pipelined: Option<bool>,
    },
    /// Speed with and without speculative decoding (prompt lookup), same replies.
    Speculative {
        #[command(flatten)]
        model: ModelArg,
        /// The most tokens a reply takes.
        #[arg(long, default_value_t = 512)]
        tokens: usize,
        /// Runs of each side, alternating; the best is reported.
        #[arg(long, default_value_t = 2)]
        repeat: usize,
    },
    /// Identity rate of seeded replies in random concurrent mixes (a line per mix on
    /// stderr as it ends: its layout, whether it was identical, and where it parted).
    Determinism {
        #[command(flatten)]
        model: ModelArg,
        #[arg(long, default_value_t = 10)]
        mixes: usize,
        #[arg(long, default_value_t = 32)]
        tokens: usize,
        /// Run only these mixes (by index; the others are still drawn, so a mix keeps its
        /// make-up).
        #[arg(long, value_delimiter = ',')]
        only: Vec<usize>,
        /// Trace each target's numbers through every step, and print with each mix the
        /// first step and layer where its target's numbers part from its run alone.
        #[arg(long)]
        trace: bool,
        /// Skip the non-invariant reference layout's run of the same mixes.
        #[arg(long)]
        no_reference: bool,
        /// Every target's prompt this many tokens long (an agent's system prompt; the
        /// context may run past the model's trained length), and a prefix cache that holds
        /// it, so one of a mix's two runs is a hit.
        #[arg(long)]
        long_prompt: Option<usize>,
        /// Decode without speculation (no drafted tokens verified), to tell a difference
        /// that only drafting brings.
        #[arg(long)]
        no_speculative: bool,
        /// The scheduler's rows (default: its own, 32 on a GPU and 8 on the CPU): mixes
        /// draw up to this many siblings.
        #[arg(long)]
        rows: Option<usize>,
        /// Pipelined steps (tokens drawn on the device, each step built before the last
        /// one's tokens are read) or not, whatever the device (default: on a GPU), so the
        /// CPU runs a GPU's loop and a GPU the host's.
        #[arg(long)]
        pipelined: Option<bool>,
    },
}

/// Prompts of varied lengths, shared with scripts/bench.py.
fn prompts() -> Vec<String> {
    serde_json::from_str(include_str!("../../../scripts/bench-prompts.json"))
        .expect("bench prompts are a JSON list")
}

pub fn run(command: BenchCommand, load: fn(&ModelArg) -> Result<Model>) -> Result<()> {
    match command {
        BenchCommand::Speed {
            model,
            prompt_tokens,
            decode_tokens,
            repeat,
        } => speed(&load(&model)?, prompt_tokens, decode_tokens, repeat),
        BenchCommand::Throughput {
            model,
            streams,
            tokens,
            reference,
            no_speculative,
            pipelined,
        } => {
            let default = SchedulerConfig::default();
            let config = SchedulerConfig {
                batch_invariant: !reference,
                speculative: !no_speculative,
                pipelined: pipelined.unwrap_or(default.pipelined),
                ..default
            };
            throughput(load(&model)?, &streams, tokens, config)
        }
        BenchCommand::Speculative {
            model,
            tokens,
            repeat,
        } => speculative([load(&model)?, load(&model)?], tokens, repeat),
        BenchCommand::Determinism {
            model,
            mixes,
            tokens,
            only,
            trace,
            no_reference,
            long_prompt,
            no_speculative,
            rows,
            pipelined,
        } => {
            let mut layouts = vec![(load(&model)?, true)];
            if !no_reference {
                layouts.push((load(&model)?, false));
            }
            let runs = MixRuns {
                count: mixes,
                only,
                trace,
                long_prompt,
                speculative: !no_speculative,
                rows: rows.unwrap_or(SchedulerConfig::default().max_rows),
                pipelined: pipelined.unwrap_or(SchedulerConfig::default().pipelined),
            };
            determinism(layouts, &runs, tokens)
        }
    }
}

fn speed(model: &Model, prompt_tokens: usize, decode_tokens: usize, repeat: usize) -> Result<()> {
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(prompt_tokens);
    let prompt: Vec<u32> = model
        .tokenizer
        .encode(&text)?
        .into_iter()
        .take(prompt_tokens)
        .collect();
    let (mut best_prefill, mut best_decode) = (0.0f64, 0.0f64);
    let mut shares = [0.0f64; 3];
    for _ in 0..repeat.max(1) {
        let mut sequence = model.sequence();
        let started = Instant::now();
        let logits = model.prefill(&prompt, &mut sequence)?;
        best_prefill = best_prefill.max(prompt.len() as f64 / started.elapsed().as_secs_f64());
        // Decode continues from the prefilled prompt, as mlx_lm.generate measures it.
        let started = Instant::now();
        let (_, times) =
            model.decode_greedy(sampling::argmax(&logits), decode_tokens, &mut sequence)?;
        let elapsed = started.elapsed().as_secs_f64();
        if decode_tokens as f64 / elapsed > best_decode {
            best_decode = decode_tokens as f64 / elapsed;
            shares = [times.build, times.launch, times.wait].map(|t| t.as_secs_f64() / elapsed);
        }
    }
    println!(
        "{}",
        json!({"prompt_tokens": prompt.len(), "decode_tokens": decode_tokens,
               "prefill_tok_s": best_prefill, "decode_tok_s": best_decode,
               // Of the best decode's wall time, the shares the host spent building the
               // steps, launching them (MLX's work per op) and waiting for the device.
               "decode_build_share": shares[0], "decode_launch_share": shares[1],
               "decode_wait_share": shares[2],
               "blas_kernels": seedbar_engine::runtime::blas_kernels()})
    );
    Ok(())
}

/// A seeded request of exactly `tokens` tokens (end-of-sequence suppressed).
fn seeded(model: &Model, prompt: &str, seed: u64, tokens: usize) -> Result<Request> {
    let mut r = Request::new(
        model.chat_prompt(&[ChatMessage::new("user", prompt)], None)?,
        tokens,
    );
    r.seed = Some(seed);
    r.sampling = SamplingParams {
        temperature: 0.8,
        logit_bias: model.eos_ids.iter().map(|&id| (id, -100.0)).collect(),
        ..SamplingParams::default()
    };
    Ok(r)
}

struct Outcome {
    tokens: Vec<u32>,
    first_token: Duration,
    /// Prompt tokens whose KV came from the prefix cache.
    cached_tokens: usize,
}

/// Drain `stream`, noting when its first token came.
fn drain(mut stream: RequestStream, submitted: Instant) -> Outcome {
    let mut out = Outcome {
        tokens: Vec::new(),
        first_token: Duration::ZERO,
        cached_tokens: 0,
    };
    while let Some(event) = stream.blocking_next() {
        match event {
            Event::Token { id, .. } => {
                if out.tokens.is_empty() {
                    out.first_token = submitted.elapsed();
                }
                out.tokens.push(id);
            }
            Event::Finished { usage, .. } => {
                out.cached_tokens = usage.cached_tokens;
                break;
            }
            Event::Failed(_) => break,
        }
    }
    out
}

/// Run `requests` concurrently; outcomes in order, and the wall time.
fn run_together(scheduler: &Scheduler, requests: Vec<Request>) -> Result<(Vec<Outcome>, Duration)> {
    let started = Instant::now();
    let streams = requests
        .into_iter()
        .map(|r| scheduler.submit(r))
        .collect::<Result<Vec<_>, _>>()?;
    let outcomes = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .into_iter()
            .map(|st| s.spawn(move || drain(st, started)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("drain thread"))
            .collect()
    });
    Ok((outcomes, started.elapsed()))
}

fn throughput(
    model: Model,
    streams: &[usize],
    tokens: usize,
    config: SchedulerConfig,
) -> Result<()> {
    let (batch_invariant, speculative) = (config.batch_invariant, config.speculative);
    let prompts = prompts();
    let requests = |n: usize, model: &Model| -> Result<Vec<Request>> {
        (0..n)
            .map(|i| seeded(model, &prompts[i % prompts.len()], 100 + i as u64, tokens))
            .collect()
    };
    let batches: Vec<Vec<Request>> = streams
        .iter()
        .map(|&n| requests(n, &model))
        .collect::<Result<_>>()?;
    let scheduler = Scheduler::start(model, config);
    run_together(&scheduler, batches[0][..1].to_vec())?; // warm-up
    let stats = scheduler.stats();
    let counters = || {
        [
            &stats.pipelined_steps,
            &stats.drafted_tokens,
            &stats.accepted_tokens,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    };
    for (n, batch) in streams.iter().zip(batches) {
        stats.times.take();
        let before = counters();
        let (outcomes, wall) = run_together(&scheduler, batch)?;
        let times = stats.times.take();
        let after = counters();
        let [pipelined, drafted, accepted] = [0, 1, 2].map(|k| after[k] - before[k]);
        let per_step = |d: Duration| d.as_secs_f64() * 1e3 / times.steps.max(1) as f64;
        let step_ms: serde_json::Map<String, serde_json::Value> = times
            .phases
            .iter()
            .map(|&(phase, d)| (phase.name().to_string(), json!(per_step(d))))
            .collect();
        let total: usize = outcomes.iter().map(|o| o.tokens.len()).sum();
        let ttft: Vec<f64> = outcomes
            .iter()
            .map(|o| o.first_token.as_secs_f64())
            .collect();
        println!(
            "{}",
            json!({"streams": n, "batch_invariant": batch_invariant, "tokens": total, "aggregate_tok_s": total as f64 / wall.as_secs_f64(),
                   "ttft_mean_s": ttft.iter().sum::<f64>() / ttft.len() as f64,
                   "ttft_max_s": ttft.iter().cloned().fold(0.0, f64::max),
                   "steps": times.steps, "pipelined_steps": pipelined, "speculative": speculative,
                   "drafted_tokens": drafted, "accepted_tokens": accepted, "step_ms": step_ms})
        );
    }
    Ok(())
}

/// An editor's request: a file sent back with a small change (shared with
/// `scripts/cpu_peer.py`).
const EDITOR_PROMPT: &str = include_str!("../../../scripts/bench-editor.txt");

/// Each workload on a scheduler without speculation (`models[0]`) and one with it
/// (`models[1]`), alternating `repeat` times: the best aggregate rate of each, their ratio,
/// whether every reply was the same on both in every round, and the last round's steps and
/// drafted and kept tokens.
fn speculative(models: [Model; 2], tokens: usize, repeat: usize) -> Result<()> {
    let prompts = prompts();
    let request = |model: &Model, text: &str, temperature: f32, seed: u64| -> Result<Request> {
        let mut r = Request::new(
            model.chat_prompt(&[ChatMessage::new("user", text)], None)?,
            tokens,
        );
        r.seed = Some(seed);
        r.sampling.temperature = temperature;
        Ok(r)
    };
    let workloads: Vec<(&str, Vec<Request>)> = vec![
        (
            "editor, greedy",
            vec![request(&models[0], EDITOR_PROMPT, 0.0, 1)?],
        ),
        (
            "editor, t0.7",
            vec![request(&models[0], EDITOR_PROMPT, 0.7, 2)?],
        ),
        (
            "chat, t0.8",
            vec![request(&models[0], &prompts[1], 0.8, 1)?],
        ),
        (
            "8 chats, t0.8",
            (0..8)
                .map(|i| request(&models[0], &prompts[i % prompts.len()], 0.8, i as u64))
                .collect::<Result<_>>()?,
        ),
    ];
    let [without, with] = models;
    let plain = Scheduler::start(
        without,
        SchedulerConfig {
            speculative: false,
            ..SchedulerConfig::default()
        },
    );
    let drafting = Scheduler::start(with, SchedulerConfig::default());
    for (name, requests) in workloads {
        let mut best = [0.0f64; 2];
        let mut replies: [Vec<Vec<u32>>; 2] = Default::default();
        let mut steps = [0u64; 2];
        let mut kept = (0u64, 0u64);
        let mut identical = true;
        for _ in 0..repeat.max(1) {
            for (side, scheduler) in [&plain, &drafting].into_iter().enumerate() {
                let stats = scheduler.stats();
                let (steps0, drafted0, accepted0) = (
                    stats.steps.load(Ordering::SeqCst),
                    stats.drafted_tokens.load(Ordering::SeqCst),
                    stats.accepted_tokens.load(Ordering::SeqCst),
                );
                let (outcomes, wall) = run_together(scheduler, requests.clone())?;
                let total: usize = outcomes.iter().map(|o| o.tokens.len()).sum();
                best[side] = best[side].max(total as f64 / wall.as_secs_f64());
                steps[side] = stats.steps.load(Ordering::SeqCst) - steps0;
                replies[side] = outcomes.into_iter().map(|o| o.tokens).collect();
                if side == 1 {
                    kept = (
                        stats.drafted_tokens.load(Ordering::SeqCst) - drafted0,
                        stats.accepted_tokens.load(Ordering::SeqCst) - accepted0,
                    );
                }
            }
            identical &= replies[0] == replies[1];
        }
        println!(
            "{}",
            json!({"workload": name, "tokens": replies[1].iter().map(Vec::len).sum::<usize>(),
                   "plain_tok_s": best[0], "speculative_tok_s": best[1],
                   "ratio": best[1] / best[0], "identical": identical,
                   "steps_plain": steps[0], "steps_speculative": steps[1],
                   "drafted": kept.0, "accepted": kept.1})
        );
    }
    Ok(())
}

/// One determinism mix: a seeded target, the siblings running when it joins (after
/// `join_after` tokens of the first), the siblings arriving after it (prefilling while it
/// decodes), and whether its alone run comes first (so the batched run is a prefix-cache
/// hit) or last (the batched run is a miss).
struct Mix {
    target: Request,
    siblings: Vec<Request>,
    late: Vec<Request>,
    join_after: usize,
    alone_first: bool,
}

/// Which determinism mixes run, and whether their targets are traced.
struct MixRuns {
    count: usize,
    /// Only these indices (all when empty).
    only: Vec<usize>,
    trace: bool,
    /// Every target's prompt tokens, where set.
    long_prompt: Option<usize>,
    /// Whether rows may speculate (the scheduler's default) or only decode.
    speculative: bool,
    /// The scheduler's rows.
    rows: usize,
    /// Whether steps are pipelined (the device's default, or asked for).
    pipelined: bool,
}

/// Same mixes on the batch-invariant scheduler and (where `models` holds one marked
/// `false`) on the fastest non-invariant one.
fn determinism(models: Vec<(Model, bool)>, runs: &MixRuns, tokens: usize) -> Result<()> {
    let mixes = runs.count;
    let prompts = prompts();
    let mut rng = SmallRng::seed_from_u64(2026);
    // Up to the scheduler's rows, so mixes fill a step.
    let rows = runs.rows;
    let random_request = |rng: &mut SmallRng, tokens: usize| {
        let prompt = &prompts[rng.random_range(0..prompts.len())];
        seeded(&models[0].0, prompt, rng.random(), tokens)
    };
    // Half the targets are long enough (several prompts, over one prefill chunk) for the
    // prefix cache to keep their prompt: their second run is a hit.
    let long_prompt = |rng: &mut SmallRng| {
        (0..12)
            .map(|_| prompts[rng.random_range(0..prompts.len())].as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    };
    let mut plans = Vec::new();
    for _ in 0..mixes {
        let mut target = if let Some(length) = runs.long_prompt {
            let mut prompt = long_prompt(&mut rng);
            while models[0].0.tokenizer.encode(&prompt)?.len() < length {
                prompt = format!("{prompt}\n\n{}", long_prompt(&mut rng));
            }
            seeded(&models[0].0, &prompt, rng.random(), tokens)?
        } else if rng.random() {
            let prompt = long_prompt(&mut rng);
            seeded(&models[0].0, &prompt, rng.random(), tokens)?
        } else {
            random_request(&mut rng, tokens)?
        };
        target.trace = runs.trace;
        let siblings = (0..rng.random_range(1..rows))
            .map(|_| {
                let n = rng.random_range(8..2 * tokens);
                random_request(&mut rng, n)
            })
            .collect::<Result<Vec<_>>>()?;
        let late = (0..rng.random_range(0..=rows / 4))
            .map(|_| {
                let n = rng.random_range(8..2 * tokens);
                random_request(&mut rng, n)
            })
            .collect::<Result<Vec<_>>>()?;
        plans.push(Mix {
            target,
            siblings,
            late,
            join_after: rng.random_range(0..tokens / 2),
            alone_first: rng.random(),
        });
    }
    let mut results = Vec::new();
    for (model, batch_invariant) in models {
        let mut config = SchedulerConfig {
            batch_invariant,
            speculative: runs.speculative,
            max_rows: runs.rows,
            pipelined: runs.pipelined,
            ..SchedulerConfig::default()
        };
        if let Some(longest) = plans.iter().map(|p| p.target.prompt.len()).max() {
            if runs.long_prompt.is_some() {
                // Room for the reply, and the prompt's KV (f32 on the CPU) twice over.
                config.max_context = config.max_context.max(longest + 2 * tokens);
                config.past_trained_context = true;
                let c = model.config();
                let per_token = 2 * c.num_hidden_layers * c.kv_heads() * c.head_dim() * 4;
                config.prefix_cache_bytes = config
                    .prefix_cache_bytes
                    .max(2 * per_token as usize * longest);
            }
        }
        let scheduler = Scheduler::start(model, config);
        let (identical, ran, tok_s) = run_mixes(&scheduler, &plans, &runs.only)?;
        results.push(
            json!({"batch_invariant": batch_invariant, "identical": identical,
                            "identity_rate": identical as f64 / ran.max(1) as f64,
                            "batched_aggregate_tok_s": tok_s}),
        );
    }
    let rate = |r: &serde_json::Value| r["batched_aggregate_tok_s"].as_f64();
    let cost = match &results[..] {
        [invariant, reference] => rate(invariant)
            .zip(rate(reference))
            .map(|(i, r)| 1.0 - i / r),
        _ => None,
    };
    println!(
        "{}",
        json!({"mixes": mixes, "invariant": results[0], "non_invariant": results.get(1),
               "invariance_cost": cost})
    );
    Ok(())
}

/// Each mix (of `only`, or all): the target alone and batched with its siblings, in the
/// mix's order. Returns how many targets matched their alone reply, how many mixes ran, and
/// the aggregate tokens/s of the batched runs. A mix whose reply differs is described on
/// stderr (where the replies part, and what each run took from the prefix cache), so a
/// failure can be chased; with traced targets, so is a mix whose numbers differ.
fn run_mixes(scheduler: &Scheduler, plans: &[Mix], only: &[usize]) -> Result<(usize, usize, f64)> {
    let (mut identical, mut total_tokens, mut batched_time) = (0, 0usize, Duration::ZERO);
    let traces = || std::mem::take(&mut *scheduler.stats().traces.lock().expect("traces"));
    let mut ran = 0;
    for (index, mix) in plans.iter().enumerate() {
        if !only.is_empty() && !only.contains(&index) {
            continue;
        }
        ran += 1;
        let alone = || -> Result<(Outcome, Vec<TraceRecord>)> {
            traces();
            let outcome = drain(scheduler.submit(mix.target.clone())?, Instant::now());
            Ok((outcome, traces()))
        };
        let first = if mix.alone_first {
            Some(alone()?)
        } else {
            None
        };
        // Siblings start first; the target joins once they have produced `join_after`
        // tokens, and the late ones arrive right after it.
        let started = Instant::now();
        let mut streams = mix
            .siblings
            .iter()
            .map(|s| scheduler.submit(s.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        for _ in 0..mix.join_after {
            if let Some(first) = streams.first_mut() {
                first.blocking_next();
            }
        }
        traces();
        let target_stream = scheduler.submit(mix.target.clone())?;
        for late in &mix.late {
            streams.push(scheduler.submit(late.clone())?);
        }
        let (batched, others) = std::thread::scope(|s| {
            let others: Vec<_> = streams
                .into_iter()
                .map(|st| s.spawn(move || drain(st, started)))
                .collect();
            let batched = drain(target_stream, started);
            (
                batched,
                others
                    .into_iter()
                    .map(|h| h.join().expect("drain"))
                    .collect::<Vec<_>>(),
            )
        });
        batched_time += started.elapsed();
        let batched_traces = traces();
        total_tokens += batched.tokens.len() + others.iter().map(|o| o.tokens.len()).sum::<usize>();
        let (alone, alone_traces) = match first {
            Some(outcome) => outcome,
            None => alone()?,
        };
        // A line a mix as it ends, so a run cut short still tells what it found.
        let invariant = scheduler.config().batch_invariant;
        let mut line = json!({"mix": index, "batch_invariant": invariant,
                              "identical": batched.tokens == alone.tokens});
        if !alone_traces.is_empty() {
            line["numbers_differ_at"] = json!(first_difference(&alone_traces, &batched_traces));
        }
        if batched.tokens == alone.tokens {
            identical += 1;
        } else {
            let parted = batched
                .tokens
                .iter()
                .zip(&alone.tokens)
                .position(|(a, b)| a != b)
                .unwrap_or(batched.tokens.len().min(alone.tokens.len()));
            line["differs"] = json!({"prompt_tokens": mix.target.prompt.len(),
                       "first_different_token": parted,
                       "alone_cached": alone.cached_tokens, "batched_cached": batched.cached_tokens,
                       "alone_first": mix.alone_first, "siblings": mix.siblings.len(),
                       "late": mix.late.len(), "join_after": mix.join_after});
        }
        eprintln!("{line}");
    }
    Ok((
        identical,
        ran,
        total_tokens as f64 / batched_time.as_secs_f64(),
    ))
}

/// The first step at which a traced target's numbers batched differ from its numbers
/// alone (steps matched by the position they start at): which position, which layer and
/// part (attention, MLP or the logits), and both steps' make-up.
fn first_difference(alone: &[TraceRecord], batched: &[TraceRecord]) -> Option<serde_json::Value> {
    alone.iter().find_map(|a| {
        let b = batched.iter().find(|b| b.position == a.position)?;
        let k = a.hashes.iter().zip(&b.hashes).position(|(x, y)| x != y)?;
        let layers = a.hashes.len() / row_trace::PER_LAYER;
        let part = if k / row_trace::PER_LAYER >= layers {
            "logits".to_string()
        } else {
            let what = ["attention", "mlp"][k % row_trace::PER_LAYER];
            format!("layer {} {what}", k / row_trace::PER_LAYER)
        };
        Some(
            json!({"position": a.position, "tokens": [a.tokens, b.tokens], "where": part,
                    "alone_step": a.step, "batched_step": b.step}),
        )
    })
}

//! Seed isolation and batch invariance on the real SmolLM2 model (CPU), on a small
//! random-weight Gemma 3 whose sliding windows are far shorter than its prompts (its
//! caches let old positions go mid-reply), and on a small random-weight Qwen3-MoE: a seeded
//! request's whole reply is the same alone and batched with any neighbours, arriving at
//! any step, and with its prefix cached or computed.

use seedbar_engine::{
    runtime::Backend,
    step::plan::{Layout, WeightKind},
    ChatMessage, FinishReason, Model, SamplingParams,
};
use seedbar_scheduler::{
    DiskCache, DiskTier, Event, Request, RequestStream, Scheduler, SchedulerConfig, SubmitError,
};

/// The model, on the kernels the product runs (`prepare` may restart this test binary with
/// native OpenBLAS kernels before any test gets here).
fn model() -> Model {
    seedbar_engine::runtime::prepare();
    Model::load(&seedbar_dev::default_model_path()).unwrap()
}

const PROMPTS: [&str; 8] = [
    "Write a short poem about the sea.",
    "Tell me a story about a dragon who learns to bake bread.",
    "List five facts about the Moon.",
    "Why is the sky blue? Explain it to a child in a few sentences, with an example from everyday life.",
    "hi",
    "Describe your favourite city and what makes it special.",
    "What should I pack for a week of hiking in the mountains in autumn? Give reasons for each item.",
    "Give me three tips for learning to play the guitar.",
];

fn request(model: &Model, prompt: &str, seed: u64, max_tokens: usize) -> Request {
    let tokens = model
        .chat_prompt(&[ChatMessage::new("user", prompt)], None)
        .unwrap();
    seeded(tokens, seed, max_tokens)
}

/// A request sampling at temperature 0.8 with `seed`.
fn seeded(tokens: Vec<u32>, seed: u64, max_tokens: usize) -> Request {
    let mut r = Request::new(tokens, max_tokens);
    r.seed = Some(seed);
    r.sampling = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    };
    r
}

struct Reply {
    tokens: Vec<u32>,
    text: String,
    reason: FinishReason,
    cached: usize,
}

fn next_token(stream: &mut RequestStream) -> Option<u32> {
    match stream.blocking_next()? {
        Event::Token { id, .. } => Some(id),
        _ => None,
    }
}

fn collect(mut stream: RequestStream) -> Reply {
    let mut reply = Reply {
        tokens: vec![],
        text: String::new(),
        reason: FinishReason::Length,
        cached: 0,
    };
    while let Some(event) = stream.blocking_next() {
        match event {
            Event::Token { id, text, .. } => {
                reply.tokens.push(id);
                reply.text.push_str(&text);
            }
            Event::Finished {
                reason,
                usage,
                text,
            } => {
                reply.text.push_str(&text);
                reply.reason = reason;
                reply.cached = usage.cached_tokens;
                break;
            }
            Event::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    reply
}

fn alone(scheduler: &Scheduler, r: Request) -> Reply {
    collect(scheduler.submit(r).unwrap())
}

#[test]
fn seeded_reply_is_independent_of_siblings_arrival_and_prefix_cache() {
    let (model, target, siblings) = chat_case(PROMPTS[0]);
    independent_of_siblings_and_arrival(model, SchedulerConfig::default(), target, siblings);
}

/// The GPU layout's pooled decode attention (KV slots by capacity class, one scatter and a
/// call per 32 slots as CUDA runs it, by batched matmuls), pipelined, run here: the target's
/// prompt is long enough that its reply moves up a capacity class mid-stream, and siblings
/// take and free slots around it.
#[test]
fn pooled_decode_attention_is_independent_too() {
    let config = gpu_layout();
    let long = format!("{} ", PROMPTS[3]).repeat(9);
    let (model, target, siblings) = chat_case(&long);
    independent_of_siblings_and_arrival(model, config, target, siblings);
}

/// The GPU layout (decode groups of 16 rows, pooled attention) and its pipelined steps
/// (tokens drawn on the device and fed to the next step before they are read), run on the
/// CPU.
fn gpu_layout() -> SchedulerConfig {
    SchedulerConfig {
        layout: Some(Layout::for_backend(Backend::Cuda, WeightKind::Quantized)),
        max_rows: 32,
        pipelined: true,
        ..SchedulerConfig::default()
    }
}

/// Pipelined steps draw on the device what the host draws: a seeded reply (its
/// end-of-sequence biased away, so the device adds biases too) and a greedy one are the
/// same token for token with and without pipelining, alone and among pipelined siblings,
/// and a sibling that asks for log probabilities (drawn on the host) switches the steps
/// back without changing them.
#[test]
fn pipelined_steps_draw_the_host_draws_tokens() {
    let (model, mut seeded, siblings) = chat_case(PROMPTS[2]);
    seeded.sampling.logit_bias = model.eos_ids.iter().map(|&id| (id, -100.0)).collect();
    let mut greedy = request(&model, PROMPTS[5], 0, 48);
    greedy.sampling.temperature = 0.0;
    let host = Scheduler::start(
        model,
        SchedulerConfig {
            pipelined: false,
            ..gpu_layout()
        },
    );
    let expected: Vec<Reply> = [&seeded, &greedy]
        .map(|r| alone(&host, r.clone()))
        .into_iter()
        .collect();
    drop(host);
    let pipelined = Scheduler::start(self::model(), gpu_layout());
    for (target, expected) in [&seeded, &greedy].into_iter().zip(&expected) {
        assert_eq!(alone(&pipelined, target.clone()).tokens, expected.tokens);
        let mut with_logprobs = siblings[0].clone();
        with_logprobs.logprobs = Some(2);
        let others: Vec<RequestStream> = siblings[1..4]
            .iter()
            .cloned()
            .chain([with_logprobs])
            .map(|s| pipelined.submit(s).unwrap())
            .collect();
        assert_eq!(alone(&pipelined, target.clone()).tokens, expected.tokens);
        let replies: Vec<Reply> = others.into_iter().map(collect).collect();
        assert!(replies.iter().all(|r| !r.tokens.is_empty()));
    }
}

/// A traced row's numbers (`Request::trace`: each layer's output and the logits, hashed, at
/// every step) are the same alone and batched on the invariant GPU layout, and the trace
/// sees the reference layout's batched attention move them: what `seedbar bench
/// determinism --trace` compares on a GPU to name the step and layer where a row parts.
#[test]
fn a_traced_row_keeps_its_numbers_alone_and_batched() {
    // The shortest prompt: batched, its keys are padded to its neighbours' in the
    // reference layout.
    let (model, mut target, siblings) = chat_case(PROMPTS[4]);
    target.trace = true;
    target.sampling.logit_bias = model.eos_ids.iter().map(|&id| (id, -100.0)).collect();
    let layers = model.num_layers();
    drop(model);
    target.max_tokens = 12;
    let traced = |config: SchedulerConfig| {
        let scheduler = Scheduler::start(self::model(), config);
        let traces = || std::mem::take(&mut *scheduler.stats().traces.lock().unwrap());
        alone(&scheduler, target.clone());
        let alone = traces();
        let early: Vec<RequestStream> = siblings[..3]
            .iter()
            .map(|s| scheduler.submit(s.clone()).unwrap())
            .collect();
        let batched = collect(scheduler.submit(target.clone()).unwrap());
        let late: Vec<Reply> = early.into_iter().map(collect).collect();
        assert!(late.iter().all(|r| !r.tokens.is_empty()) && batched.tokens.len() == 12);
        (alone, traces())
    };
    let (alone, batched) = traced(gpu_layout());
    // The prompt's step, then one per drawn token but the last (whose logits end it).
    assert_eq!(alone.len(), 12);
    assert!(alone.iter().all(|r| r.hashes.len() == 2 * layers + 1));
    let positions = |t: &[seedbar_scheduler::TraceRecord]| {
        t.iter()
            .map(|r| (r.position, r.hashes.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(positions(&batched), positions(&alone));
    let (alone, batched) = traced(SchedulerConfig {
        batch_invariant: false,
        ..SchedulerConfig::default()
    });
    let moved = alone
        .iter()
        .filter(|a| {
            !batched
                .iter()
                .any(|b| b.position == a.position && b.hashes == a.hashes)
        })
        .count();
    assert!(
        moved > 0,
        "the reference layout's padded attention moves a row's numbers"
    );
}

/// The real model, a 64-token seeded reply to `prompt` and seven siblings' requests.
fn chat_case(prompt: &str) -> (Model, Request, Vec<Request>) {
    let model = model();
    let target = request(&model, prompt, 42, 64);
    let siblings = (1..8)
        .map(|i| request(&model, PROMPTS[i], 1000 + i as u64, 40 + 7 * i))
        .collect();
    (model, target, siblings)
}

fn independent_of_siblings_and_arrival(
    model: Model,
    config: SchedulerConfig,
    mut target: Request,
    siblings: Vec<Request>,
) {
    // Never end early, so the whole 64-token reply is compared.
    target.sampling.logit_bias = model.eos_ids.iter().map(|&id| (id, -100.0)).collect();
    let scheduler = Scheduler::start(model, config);
    let reference = alone(&scheduler, target.clone());
    assert_eq!(reference.tokens.len(), 64);

    // Sibling-seed invariance: three different sets of sibling seeds in the same batch.
    for set in 0..3u64 {
        let streams: Vec<RequestStream> = siblings[..3]
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.seed = Some(s.seed.unwrap() * 31 + set);
                scheduler.submit(s).unwrap()
            })
            .collect();
        let reply = alone(&scheduler, target.clone());
        assert_eq!(reply.tokens, reference.tokens, "sibling seed set {set}");
        drop(streams);
    }

    // Alone vs batched with 1, 3 and 7 others, which start before, with, and after it.
    for others in [1usize, 3, 7] {
        let mut early: Vec<RequestStream> = siblings[..others / 2 + 1]
            .iter()
            .map(|s| scheduler.submit(s.clone()).unwrap())
            .collect();
        for s in early.iter_mut() {
            next_token(s); // they are decoding before the target arrives
        }
        let mut target_stream = scheduler.submit(target.clone()).unwrap();
        let mut tokens = vec![
            next_token(&mut target_stream).unwrap(),
            next_token(&mut target_stream).unwrap(),
        ];
        let late: Vec<RequestStream> = siblings[others / 2 + 1..others]
            .iter()
            .map(|s| scheduler.submit(s.clone()).unwrap())
            .collect();
        let rest = collect(target_stream);
        tokens.extend(rest.tokens);
        assert_eq!(tokens, reference.tokens, "batched with {others} others");
        let sibling_replies: Vec<Reply> = early.into_iter().chain(late).map(collect).collect();
        assert!(sibling_replies.iter().all(|r| !r.tokens.is_empty()));
    }
}

#[test]
fn prefix_cache_hit_equals_miss() {
    let model = model();
    let long_question = format!("{} {} ", PROMPTS[3], PROMPTS[6]).repeat(8);
    let first_turn = model
        .chat_prompt(&[ChatMessage::new("user", &long_question)], None)
        .unwrap();
    assert!(first_turn.len() > 2 * seedbar_engine::step::plan::PREFILL_CHUNK);
    // A reply longer than a prefill chunk: the next turn's prompt holds decoded positions
    // across a chunk boundary, which reuse must not cross where decode KV is not prefill KV.
    let mut turn1 = Request::new(first_turn.clone(), 160);
    turn1.seed = Some(7);
    turn1.sampling.temperature = 0.8;
    turn1.sampling.logit_bias = model.eos_ids.iter().map(|&id| (id, -100.0)).collect();
    let reuses_decoded_kv = model.layout().kv_independent_of_steps;
    let warm = Scheduler::start(model, SchedulerConfig::default());
    let answer = alone(&warm, turn1.clone());

    let second_turn = |model: &Model| {
        let messages = [
            ChatMessage::new("user", &long_question),
            ChatMessage::new("assistant", &answer.text),
            ChatMessage::new("user", "Now say it in one sentence."),
        ];
        let mut r = Request::new(model.chat_prompt(&messages, None).unwrap(), 48);
        r.seed = Some(9);
        r.sampling.temperature = 0.8;
        r
    };
    let fresh_model = self::model();
    let turn2 = second_turn(&fresh_model);
    let cold = Scheduler::start(fresh_model, SchedulerConfig::default());
    let miss = alone(&cold, turn2.clone());
    let hit = alone(&warm, turn2);
    assert_eq!(miss.cached, 0);
    assert!(
        hit.cached >= 2 * seedbar_engine::step::plan::PREFILL_CHUNK,
        "cached {}",
        hit.cached
    );
    if reuses_decoded_kv {
        assert!(
            hit.cached > first_turn.len(),
            "did not reuse the reply's KV: cached {}",
            hit.cached
        );
    } else {
        assert!(
            hit.cached <= first_turn.len(),
            "reused decoded KV: cached {}",
            hit.cached
        );
    }
    assert_eq!(hit.tokens, miss.tokens);
}

/// Where KV does not depend on how steps split a row (the packed CPU path), a prompt seen
/// before is reused up to its last token, however short, and a longer one up to where they
/// part, mid-chunk: the replies equal a cold scheduler's. Elsewhere neither is reused.
#[test]
fn a_prefix_hit_reuses_every_common_position() {
    let model = model();
    let any_position = model.layout().kv_independent_of_steps;
    let question = request(&model, PROMPTS[1], 11, 24);
    let longer = request(&model, &format!("{} {}", PROMPTS[1], PROMPTS[2]), 12, 24);
    assert!(question.prompt.len() < seedbar_engine::step::plan::PREFILL_CHUNK);
    let common = question
        .prompt
        .iter()
        .zip(&longer.prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let cold = |r: &Request| {
        alone(
            &Scheduler::start(self::model(), SchedulerConfig::default()),
            r.clone(),
        )
    };
    let warm = Scheduler::start(model, SchedulerConfig::default());
    let first = alone(&warm, question.clone());
    assert_eq!(first.cached, 0);
    let again = alone(&warm, question.clone());
    let extended = alone(&warm, longer.clone());
    if any_position {
        assert_eq!(again.cached, question.prompt.len() - 1);
        assert_eq!(extended.cached, common);
    } else {
        assert_eq!((again.cached, extended.cached), (0, 0));
    }
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(extended.tokens, cold(&longer).tokens);
}

#[test]
fn controls_cancellation_and_limits() {
    let model = model();
    let a = request(&model, PROMPTS[0], 1, 32);
    let b = request(&model, PROMPTS[0], 2, 32);
    let mut greedy = request(&model, PROMPTS[2], 3, 32);
    greedy.sampling.temperature = 0.0;
    let scheduler = Scheduler::start(
        model,
        SchedulerConfig {
            max_queue: 2,
            max_context: 600,
            ..SchedulerConfig::default()
        },
    );
    // Positive control: another seed, another reply.
    let ra = alone(&scheduler, a.clone());
    assert_ne!(ra.tokens, alone(&scheduler, b.clone()).tokens);

    // Greedy alone equals greedy batched.
    let greedy_alone = alone(&scheduler, greedy.clone());
    let other = scheduler.submit(b.clone()).unwrap();
    assert_eq!(
        alone(&scheduler, greedy.clone()).tokens,
        greedy_alone.tokens
    );
    drop(other);

    // Cancelling one stream mid-reply frees its row; the others are unchanged.
    let mut doomed = scheduler.submit(b.clone()).unwrap();
    let kept = scheduler.submit(a.clone()).unwrap();
    next_token(&mut doomed);
    doomed.cancel();
    drop(doomed);
    assert_eq!(collect(kept).tokens, ra.tokens);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while scheduler
        .stats()
        .running
        .load(std::sync::atomic::Ordering::SeqCst)
        != 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "rows still running after cancel"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // SchedulerConfig answer at once with a clear error.
    let too_long = Request::new(vec![1; 600], 4);
    assert!(matches!(
        scheduler.submit(too_long),
        Err(SubmitError::PromptTooLong { .. })
    ));
    let mut bad = a.clone();
    bad.sampling.top_p = 0.0;
    assert!(matches!(
        scheduler.submit(bad),
        Err(SubmitError::Invalid(_))
    ));
    // One more than every row and queue place.
    let places = SchedulerConfig::default().max_rows + 2;
    let held: Vec<_> = (0..=places).map(|_| scheduler.submit(a.clone())).collect();
    assert!(held
        .iter()
        .any(|r| matches!(r, Err(SubmitError::QueueFull(_)))));
    assert_eq!(ra.reason, FinishReason::Length);
}

/// Structured outputs: the format's mask follows only the row's own tokens, so a seeded
/// constrained reply is the same alone and among free rows, and it is what the schema says.
#[test]
fn a_constrained_seeded_reply_is_independent_of_free_neighbours() {
    let model = model();
    let vocabulary = seedbar_grammar::Vocabulary::new(&model.tokenizer, &model.eos_ids).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "facts": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 2}
        },
        "required": ["city", "facts"],
        "additionalProperties": false
    });
    let mut target = request(&model, "Describe Paris as JSON.", 42, 120);
    target.constraint = Some(
        vocabulary
            .compile(&seedbar_grammar::Format::JsonSchema(schema))
            .unwrap(),
    );
    let siblings: Vec<Request> = (1..8)
        .map(|i| request(&model, PROMPTS[i], 2000 + i as u64, 30 + 5 * i))
        .collect();
    let scheduler = Scheduler::start(model, SchedulerConfig::default());
    let reference = alone(&scheduler, target.clone());
    assert_eq!(reference.reason, FinishReason::Stop, "{}", reference.text);
    let value: serde_json::Value = serde_json::from_str(&reference.text).unwrap();
    assert!(
        value["city"].is_string() && value["facts"].is_array(),
        "{value}"
    );

    for others in [3usize, 7] {
        let early: Vec<RequestStream> = siblings[..others / 2]
            .iter()
            .map(|s| scheduler.submit(s.clone()).unwrap())
            .collect();
        let mut target_stream = scheduler.submit(target.clone()).unwrap();
        let first = next_token(&mut target_stream).unwrap();
        let late: Vec<RequestStream> = siblings[others / 2..others]
            .iter()
            .map(|s| scheduler.submit(s.clone()).unwrap())
            .collect();
        let mut tokens = vec![first];
        tokens.extend(collect(target_stream).tokens);
        assert_eq!(tokens, reference.tokens, "among {others} free rows");
        drop((early, late));
    }
}

/// A random-weight Gemma 3 (gemma3_text) in a scratch folder: two layers, the first with a
/// sliding window of 16 positions, a 256-token vocabulary with a word-level tokenizer. With
/// `weights` 4-bit, the CPU runs it on its packed kernels and the host path.
fn sliding_window_model(weights: Weights) -> Model {
    const WINDOW: i32 = 16;
    let (d, heads, kv_heads, head_dim, inner) = (64, 4, 2, 32, 128);
    let config = serde_json::json!({
        "model_type": "gemma3_text", "hidden_size": d, "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": inner, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": head_dim, "sliding_window": WINDOW,
        "sliding_window_pattern": 2, "eos_token_id": VOCAB - 1,
    });
    let mut tensors = RandomTensors::new(d, weights);
    for layer in 0..2 {
        let p = format!("model.layers.{layer}");
        let norms = [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ];
        for norm in norms {
            tensors.norm(&format!("{p}.{norm}"), d);
        }
        tensors.attention(&p, heads, kv_heads, head_dim);
        tensors.projection(&format!("{p}.mlp.gate_proj"), &[inner, d]);
        tensors.projection(&format!("{p}.mlp.up_proj"), &[inner, d]);
        tensors.projection(&format!("{p}.mlp.down_proj"), &[d, inner]);
    }
    tensors.load("gemma3", config)
}

const VOCAB: i32 = 256;

/// How a random model's projections and output head are stored.
#[derive(Clone, Copy)]
enum Weights {
    Float32,
    /// MLX's affine 4-bit quantization in groups of 32 (weight, scales, biases).
    FourBit,
}

/// Random weights of a small model with a 256-token word-level vocabulary: projections of
/// variance 1 / fan-in and an output head of its own whose logits spread about 2, so the
/// samples vary.
struct RandomTensors {
    tensors: Vec<(String, mlx_rs::Array)>,
    key: u64,
    weights: Weights,
}

impl RandomTensors {
    /// The embeddings, final norm and output head of a model of width `d`.
    fn new(d: i32, weights: Weights) -> Self {
        let mut t = RandomTensors {
            tensors: vec![],
            key: 0,
            weights,
        };
        t.add("model.embed_tokens.weight", &[VOCAB, d], 0.25);
        t.norm("model.norm", d);
        t.matrix("lm_head", &[VOCAB, d], 2.0 / (d as f32).sqrt());
        t
    }

    fn add(&mut self, name: &str, shape: &[i32], std: f32) {
        self.key += 1;
        let key = mlx_rs::random::key(self.key).unwrap();
        let array = mlx_rs::random::normal::<f32>(shape, None, std, &key).unwrap();
        self.tensors.push((name.to_string(), array));
    }

    fn norm(&mut self, prefix: &str, size: i32) {
        self.add(&format!("{prefix}.weight"), &[size], 0.1);
    }

    /// `prefix.weight` of `shape` (`[.., out, in]`), of variance 1 / fan-in.
    fn projection(&mut self, prefix: &str, shape: &[i32]) {
        let fan_in = *shape.last().unwrap() as f32;
        self.matrix(prefix, shape, 1.0 / fan_in.sqrt());
    }

    /// `prefix.weight` of `shape` and `std`, stored as `weights` says.
    fn matrix(&mut self, prefix: &str, shape: &[i32], std: f32) {
        self.add(&format!("{prefix}.weight"), shape, std);
        if let Weights::FourBit = self.weights {
            let (_, dense) = self.tensors.pop().unwrap();
            let (weight, scales, biases) = mlx_rs::ops::quantize(&dense, 32, 4).unwrap();
            for (part, array) in [("weight", weight), ("scales", scales), ("biases", biases)] {
                self.tensors.push((format!("{prefix}.{part}"), array));
            }
        }
    }

    /// Layer `p`'s attention projections and q/k norms.
    fn attention(&mut self, p: &str, heads: i32, kv_heads: i32, head_dim: i32) {
        let d = self.tensors[0].1.shape()[1];
        for (name, rows, cols) in [
            ("q_proj", heads * head_dim, d),
            ("k_proj", kv_heads * head_dim, d),
            ("v_proj", kv_heads * head_dim, d),
            ("o_proj", d, heads * head_dim),
        ] {
            self.projection(&format!("{p}.self_attn.{name}"), &[rows, cols]);
        }
        self.norm(&format!("{p}.self_attn.q_norm"), head_dim);
        self.norm(&format!("{p}.self_attn.k_norm"), head_dim);
    }

    /// The model of `config` with these weights, loaded from a scratch folder.
    fn load(self, name: &str, config: serde_json::Value) -> Model {
        // Tests run in parallel: each call writes a folder of its own.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("seedbar-{name}-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let words: serde_json::Map<String, serde_json::Value> =
            (0..VOCAB).map(|i| (format!("t{i}"), i.into())).collect();
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null, "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"},
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        mlx_rs::Array::save_safetensors(
            self.tensors.iter().map(|(name, t)| (name.as_str(), t)),
            &std::collections::HashMap::new(),
            dir.join("model.safetensors"),
        )
        .unwrap();
        seedbar_engine::runtime::prepare();
        let model = Model::load(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        model
    }
}

/// A random-weight Qwen3-MoE: two layers of 8 experts, 2 per token, stacked as mlx-lm
/// saves them.
fn mixture_of_experts_model() -> Model {
    let (d, heads, kv_heads, head_dim, experts, inner) = (64, 4, 2, 32, 8, 96);
    let config = serde_json::json!({
        "model_type": "qwen3_moe", "hidden_size": d, "num_hidden_layers": 2,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": 128, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
        "num_experts": experts, "num_experts_per_tok": 2, "moe_intermediate_size": inner,
        "norm_topk_prob": true, "eos_token_id": VOCAB - 1,
    });
    let mut tensors = RandomTensors::new(d, Weights::Float32);
    for layer in 0..2 {
        let p = format!("model.layers.{layer}");
        tensors.norm(&format!("{p}.input_layernorm"), d);
        tensors.norm(&format!("{p}.post_attention_layernorm"), d);
        tensors.attention(&p, heads, kv_heads, head_dim);
        // A router whose logits spread, so tokens pick different experts.
        tensors.add(&format!("{p}.mlp.gate.weight"), &[experts, d], 1.0);
        let m = format!("{p}.mlp.switch_mlp");
        tensors.projection(&format!("{m}.gate_proj"), &[experts, inner, d]);
        tensors.projection(&format!("{m}.up_proj"), &[experts, inner, d]);
        tensors.projection(&format!("{m}.down_proj"), &[experts, d, inner]);
    }
    tensors.load("qwen3-moe", config)
}

/// The MoE model's case: a 30-token prompt and seven siblings of 17 to 47 tokens.
fn mixture_of_experts_case() -> (Model, Request, Vec<Request>) {
    let target = seeded(token_ids(2, 30), 42, 64);
    let siblings = (1..8)
        .map(|i| seeded(token_ids(20 + i, 12 + 5 * i as usize), 500 + i as u64, 40))
        .collect();
    (mixture_of_experts_model(), target, siblings)
}

/// Experts gathered per token row: a seeded reply's routed expert products are the same
/// alone and among neighbours routed elsewhere, arriving at any step.
#[test]
fn mixture_of_experts_replies_are_independent_of_siblings_and_arrival() {
    let (model, target, siblings) = mixture_of_experts_case();
    independent_of_siblings_and_arrival(model, SchedulerConfig::default(), target, siblings);
}

/// The same under the GPU layout (decode groups of 16 rows, pooled attention).
#[test]
fn mixture_of_experts_pooled_decode_is_independent_too() {
    let (model, target, siblings) = mixture_of_experts_case();
    let config = gpu_layout();
    independent_of_siblings_and_arrival(model, config, target, siblings);
}

/// Reuse stops at a multiple of the layout's prefill chunk, where a cold start's chunks end
/// too (512 tokens on GPUs, 128 on the CPU): a 700-token prompt seen before is reused up to
/// 512 tokens under the GPU layout and 640 under the CPU's, and the reply is the first's.
#[test]
fn prefix_reuse_stops_at_the_layouts_prefill_chunk() {
    let prompt = seeded(token_ids(9, 700), 5, 8);
    for (config, reused) in [(gpu_layout(), 512), (SchedulerConfig::default(), 640)] {
        let warm = Scheduler::start(mixture_of_experts_model(), config);
        let first = alone(&warm, prompt.clone());
        let again = alone(&warm, prompt.clone());
        assert_eq!((first.cached, again.cached), (0, reused));
        assert_eq!(again.tokens, first.tokens);
    }
}

/// `len` token ids from `seed` (a fixed pseudo-random walk over the vocabulary).
fn token_ids(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed * 7919 + i * 104_729) % 250)
        .collect()
}

/// A prompt after which the sliding-window model's caches let old positions go within a
/// 64-token reply (`kv_cache::kept_from` passes 0 at 399 positions for a window of 16),
/// and whose pool ring (256 positions) has wrapped.
const PAST_THE_WINDOW: usize = 360;

/// The sliding-window model's case: prompts and replies well past the window; the target's
/// caches drop old positions mid-reply, and siblings move up a pool class mid-reply.
fn sliding_window_case(weights: Weights) -> (Model, Request, Vec<Request>) {
    let target = seeded(token_ids(1, PAST_THE_WINDOW), 42, 64);
    let siblings = (1..8)
        .map(|i| {
            seeded(
                token_ids(10 + i, 200 + 9 * i as usize),
                1000 + i as u64,
                30 + 7 * i as usize,
            )
        })
        .collect();
    (sliding_window_model(weights), target, siblings)
}

#[test]
fn sliding_window_replies_are_independent_of_siblings_and_arrival() {
    let (model, target, siblings) = sliding_window_case(Weights::Float32);
    independent_of_siblings_and_arrival(model, SchedulerConfig::default(), target, siblings);
}

/// The host path (4-bit weights on the CPU kernels), whose host KV lets old positions go.
#[test]
fn sliding_window_host_path_replies_are_independent_too() {
    let (model, target, siblings) = sliding_window_case(Weights::FourBit);
    assert_eq!(model.weight_kind(), WeightKind::Packed);
    independent_of_siblings_and_arrival(model, SchedulerConfig::default(), target, siblings);
}

/// The GPU layout's pooled decode, whose masks carry the sliding layers' windows.
#[test]
fn sliding_window_pooled_decode_is_independent_too() {
    let (model, target, siblings) = sliding_window_case(Weights::Float32);
    let config = gpu_layout();
    independent_of_siblings_and_arrival(model, config, target, siblings);
}

/// CUDA's layout for dense weights, run here: decode rows in unpadded groups (and output
/// head groups) whose products run row by row (Seedbar's row kernel there, a product per
/// row here), with pooled attention and pipelined steps.
#[test]
fn row_wise_products_keep_replies_independent_too() {
    let (model, target, siblings) = sliding_window_case(Weights::Float32);
    let config = SchedulerConfig {
        layout: Some(Layout::for_backend(Backend::Cuda, WeightKind::Dense)),
        ..gpu_layout()
    };
    independent_of_siblings_and_arrival(model, config, target, siblings);
}

/// The pooled layout's windowed rings and masks select what the per-row layout's sliced
/// keys do, past the ring's wrap and the caches' dropping: greedy replies agree.
#[test]
fn sliding_window_pooled_decode_agrees_with_per_row_attention() {
    let mut greedy = seeded(token_ids(5, PAST_THE_WINDOW), 0, 64);
    greedy.sampling.temperature = 0.0;
    let pooled = SchedulerConfig {
        layout: Some(Layout::for_backend(Backend::Cuda, WeightKind::Quantized)),
        ..SchedulerConfig::default()
    };
    let replies: Vec<Vec<u32>> = [SchedulerConfig::default(), pooled]
        .into_iter()
        .map(|config| {
            let scheduler = Scheduler::start(sliding_window_model(Weights::Float32), config);
            alone(&scheduler, greedy.clone()).tokens
        })
        .collect();
    assert_eq!(replies[0], replies[1]);
}

/// A second turn whose prompt holds the first turn's prompt (four prefill chunks, long past
/// the window, so the sliding layers' caches let old positions go) and a reply that runs
/// past the window too: the prefix cache's reuse of them gives the reply a cold start
/// gives, on the CPU's layout (decode KV in the row's caches, reused up to the prompt,
/// whose window the caches kept), the host path's (decoded KV reused too) and the GPU's
/// (decode KV in the pool). A prompt that shares less with the entry than the
/// dropped positions allow is refused, not served wrong. The disk tier's files, read again
/// by a fresh scheduler (a restart), give the cold reply too.
#[test]
fn sliding_window_prefix_cache_hit_equals_miss() {
    let chunk = seedbar_engine::step::plan::PREFILL_CHUNK;
    let cases = [
        (SchedulerConfig::default(), Weights::Float32),
        (SchedulerConfig::default(), Weights::FourBit),
        (gpu_layout(), Weights::Float32),
    ];
    for (case, (config, weights)) in cases.into_iter().enumerate() {
        let model = || sliding_window_model(weights);
        let first_turn = token_ids(3, 4 * chunk + 40);
        let folder =
            std::env::temp_dir().join(format!("seedbar-window-disk-{}-{case}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        let on_disk = |folder: &std::path::Path| SchedulerConfig {
            disk_cache: Some(DiskTier {
                cache: std::sync::Arc::new(DiskCache::open(folder, 1 << 30).unwrap()),
                model: "sliding-window".into(),
            }),
            ..config.clone()
        };
        let writing = on_disk(&folder);
        let warm = Scheduler::start(model(), writing.clone());
        // Replies of 400 tokens (no end of sequence): past what the window's slack covers.
        let long_reply = |seed| {
            let mut r = seeded(first_turn.clone(), seed, 400);
            r.sampling.logit_bias = vec![(VOCAB as u32 - 1, -100.0)];
            r
        };
        let answer = alone(&warm, long_reply(7));
        assert_eq!(answer.tokens.len(), 400);
        let written = &writing.disk_cache.as_ref().unwrap().cache.stats().writes;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while written.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "no file written");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Positive control: another seed, another reply.
        let other = alone(&warm, long_reply(8));
        assert_ne!(answer.tokens, other.tokens);
        let distinct: std::collections::BTreeSet<&u32> = answer.tokens.iter().collect();
        assert!(
            distinct.len() > 8,
            "a degenerate model: {:?}",
            answer.tokens
        );
        let mut second_turn = first_turn.clone();
        second_turn.extend(&answer.tokens);
        second_turn.extend(token_ids(4, 20));
        let turn2 = seeded(second_turn, 9, 48);
        let cold = Scheduler::start(model(), config.clone());
        let miss = alone(&cold, turn2.clone());
        // A restart: a fresh scheduler, its RAM empty, reads the disk tier's folder.
        let reading = on_disk(&folder);
        let from_disk = alone(&Scheduler::start(model(), reading.clone()), turn2.clone());
        let disk_hits = &reading.disk_cache.as_ref().unwrap().cache.stats().hits;
        assert_eq!(disk_hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        let _ = std::fs::remove_dir_all(&folder);
        let hit = alone(&warm, turn2);
        assert_eq!(miss.cached, 0);
        for hit in [&hit, &from_disk] {
            assert!(hit.cached >= 4 * chunk, "cached {}", hit.cached);
            assert_eq!(hit.tokens, miss.tokens);
        }

        // Two chunks in common: the entry dropped keys a query there sees.
        let mut diverging = first_turn[..2 * chunk + 10].to_vec();
        diverging.extend(token_ids(6, 200));
        let diverging = seeded(diverging, 11, 32);
        let fresh = Scheduler::start(model(), config);
        let refused = alone(&warm, diverging.clone());
        assert_eq!(refused.cached, 0);
        assert_eq!(refused.tokens, alone(&fresh, diverging).tokens);
    }
}

#[test]
fn the_context_stops_at_the_trained_length_unless_told_to_run_past_it() {
    let trained = model().config().max_position_embeddings.unwrap() as usize;
    let asked = SchedulerConfig {
        max_context: 2 * trained,
        ..SchedulerConfig::default()
    };
    let capped = Scheduler::start(model(), asked.clone());
    assert_eq!(capped.config().max_context, trained);
    let past = Scheduler::start(
        model(),
        SchedulerConfig {
            past_trained_context: true,
            ..asked
        },
    );
    assert_eq!(past.config().max_context, 2 * trained);
}

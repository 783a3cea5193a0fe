//! Seed isolation and batch invariance on the real SmolLM2 model (CPU): a seeded request's
//! whole reply is the same alone and batched with any neighbours, arriving at any step, and
//! with its prefix cached or computed.

use seedbar_engine::{
    step_plan::{Backend, Layout, WeightKind},
    ChatMessage, FinishReason, Model, SamplingParams,
};
use seedbar_scheduler::{Event, Request, RequestStream, Scheduler, SchedulerConfig, SubmitError};

/// The model, on the kernels the product runs (`prepare` may restart this test binary with
/// native OpenBLAS kernels before any test gets here).
fn model() -> Model {
    seedbar_engine::runtime::prepare();
    Model::load(&seedbar_engine::dev::default_model_path()).unwrap()
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
    let mut r = Request::new(
        model
            .chat_prompt(&[ChatMessage::new("user", prompt)], None)
            .unwrap(),
        max_tokens,
    );
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
    independent_of_siblings_and_arrival(SchedulerConfig::default(), PROMPTS[0]);
}

/// The GPU layout's pooled decode attention (KV slots by capacity class, one scatter and a
/// call per 8 slots), run here: the target's prompt is long enough that its reply moves up
/// a capacity class mid-stream, and siblings take and free slots around it.
#[test]
fn pooled_decode_attention_is_independent_too() {
    let config = SchedulerConfig {
        layout: Some(Layout::for_backend(Backend::Cuda, WeightKind::Quantized)),
        max_rows: 32,
        ..SchedulerConfig::default()
    };
    let long = format!("{} ", PROMPTS[3]).repeat(9);
    independent_of_siblings_and_arrival(config, &long);
}

fn independent_of_siblings_and_arrival(config: SchedulerConfig, prompt: &str) {
    let model = model();
    let mut target = request(&model, prompt, 42, 64);
    // Never end early, so the whole 64-token reply is compared.
    target.sampling.logit_bias = model.eos_ids.iter().map(|&id| (id, -100.0)).collect();
    let siblings: Vec<Request> = (1..8)
        .map(|i| request(&model, PROMPTS[i], 1000 + i as u64, 40 + 7 * i))
        .collect();
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
    assert!(first_turn.len() > 2 * seedbar_engine::generate::PREFILL_CHUNK);
    // A reply longer than a prefill chunk: the next turn's prompt holds decoded positions
    // across a chunk boundary, which reuse must not cross where decode KV is not prefill KV.
    let mut turn1 = Request::new(first_turn.clone(), 160);
    turn1.seed = Some(7);
    turn1.sampling.temperature = 0.8;
    turn1.sampling.logit_bias = model.eos_ids.iter().map(|&id| (id, -100.0)).collect();
    let reuses_decoded_kv = model.layout().decode_kv_is_prefill_kv;
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
        hit.cached >= 2 * seedbar_engine::generate::PREFILL_CHUNK,
        "cached {}",
        hit.cached
    );
    if !reuses_decoded_kv {
        assert!(
            hit.cached <= first_turn.len(),
            "reused decoded KV: cached {}",
            hit.cached
        );
    }
    assert_eq!(hit.tokens, miss.tokens);
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
    let held: Vec<_> = (0..16).map(|_| scheduler.submit(a.clone())).collect();
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

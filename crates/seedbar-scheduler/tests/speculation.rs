//! Speculative decoding never changes a reply: on the real SmolLM2 model (CPU, its packed
//! path, and CUDA's layout run on the CPU: the scheduler verifies drafts on both), a seeded
//! reply with prompt lookup is the reply without it, greedy or sampled with filters and
//! penalties, under an output format, alone, among 1 to 15 others (some speculating, some
//! not) and after a prefix-cache hit; and where a reply copies its prompt, it takes fewer
//! steps than tokens.

use std::sync::atomic::Ordering;

use seedbar_engine::{
    runtime::Backend,
    step::plan::{Layout, WeightKind},
    ChatMessage, Model, SamplingParams,
};
use seedbar_scheduler::{Event, Request, RequestStream, Scheduler, SchedulerConfig};

fn model() -> Model {
    seedbar_engine::runtime::prepare();
    Model::load(&seedbar_dev::default_model_path()).unwrap()
}

/// A file an editor sends back with a small change asked for: a reply that copies it.
const FILE: &str = "def area(width, height):
    \"\"\"The area of a rectangle.\"\"\"
    return width * height


def perimeter(width, height):
    \"\"\"The perimeter of a rectangle.\"\"\"
    return 2 * (width + height)


def describe(width, height):
    print(\"width:\", width)
    print(\"height:\", height)
    print(\"area:\", area(width, height))
    print(\"perimeter:\", perimeter(width, height))
";

fn prompt(model: &Model, text: &str) -> Vec<u32> {
    model
        .chat_prompt(&[ChatMessage::new("user", text)], None)
        .unwrap()
}

fn editor_request(
    model: &Model,
    seed: u64,
    sampling: SamplingParams,
    max_tokens: usize,
) -> Request {
    let text = format!(
        "Here is a Python file:\n\n{FILE}\nReturn the whole file with `area` renamed to \
         `surface`. Reply with the code only."
    );
    let mut r = Request::new(prompt(model, &text), max_tokens);
    r.seed = Some(seed);
    r.sampling = sampling;
    r
}

fn tokens(stream: RequestStream) -> Vec<u32> {
    let mut stream = stream;
    let mut out = Vec::new();
    while let Some(event) = stream.blocking_next() {
        match event {
            Event::Token { id, .. } => out.push(id),
            Event::Finished { .. } => break,
            Event::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    out
}

/// The sampling each case draws with: greedy, then sampled with each filter and penalty.
fn samplings() -> Vec<(&'static str, SamplingParams)> {
    let base = SamplingParams::default();
    vec![
        (
            "greedy",
            SamplingParams {
                temperature: 0.0,
                ..base.clone()
            },
        ),
        (
            "t0.7 top-p top-k",
            SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                top_k: 40,
                ..base.clone()
            },
        ),
        (
            "t1.2 min-p penalties",
            SamplingParams {
                temperature: 1.2,
                min_p: 0.05,
                repetition_penalty: 1.1,
                presence_penalty: 0.3,
                frequency_penalty: 0.2,
                ..base
            },
        ),
    ]
}

#[test]
fn drafted_replies_equal_plain_ones_alone_batched_and_after_a_prefix_hit() {
    drafted_replies_equal_plain_ones(SchedulerConfig::default(), &[1, 15]);
}

/// The same on CUDA's layout and its pipelined steps, run here: a verify chunk's tokens run
/// as decode places (row-wise products, each query over its own positions in the decode
/// pool), so drafts are verified exactly there too; the drafts not kept are cut from the
/// row's pool slot, and a step where a row may draft takes the host's draw.
#[test]
fn drafted_replies_equal_plain_ones_on_the_cuda_layout() {
    let config = SchedulerConfig {
        layout: Some(Layout::for_backend(Backend::Cuda, WeightKind::Quantized)),
        max_rows: 32,
        pipelined: true,
        ..SchedulerConfig::default()
    };
    drafted_replies_equal_plain_ones(config, &[7]);
}

/// On a pipelined scheduler (CUDA's layout, run here), a speculating row whose latest tokens
/// occurred nowhere before has nothing to draft, so its steps stay pipelined (each built
/// while the last one runs): only where a draft could be verified does a step leave the
/// pipeline for the host's draw. (A row's fresh hit rate once made every step a host step.)
#[test]
fn a_row_with_nothing_to_draft_keeps_its_steps_pipelined() {
    let model = model();
    let config = SchedulerConfig {
        layout: Some(Layout::for_backend(Backend::Cuda, WeightKind::Quantized)),
        max_rows: 32,
        pipelined: true,
        ..SchedulerConfig::default()
    };
    let mut request = Request::new(prompt(&model, "Name three colours of the rainbow."), 32);
    request.seed = Some(7);
    request.sampling = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    };
    let scheduler = Scheduler::start(model, config);
    let reply = tokens(scheduler.submit(request).unwrap());
    let stats = scheduler.stats();
    let steps = stats.steps.load(Ordering::SeqCst);
    let pipelined = stats.pipelined_steps.load(Ordering::SeqCst);
    assert_eq!(reply.len(), 32);
    eprintln!("{pipelined} of {steps} steps pipelined");
    assert!(
        pipelined * 2 >= steps,
        "{pipelined} of {steps} steps pipelined"
    );
}

/// Each case's seeded reply with speculation under `config` is its reply without: alone,
/// among each of `crowds` others (half arriving before it, some speculating), and after a
/// prefix-cache hit; a greedy reply that copies its prompt takes fewer steps than tokens.
fn drafted_replies_equal_plain_ones(config: SchedulerConfig, crowds: &[usize]) {
    let model = model();
    let reuse_granularity = config
        .layout
        .unwrap_or_else(|| model.layout())
        .reuse_granularity();
    let vocabulary = seedbar_grammar::Vocabulary::new(&model.tokenizer, &model.eos_ids).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"code": {"type": "string", "maxLength": 200}},
        "required": ["code"],
        "additionalProperties": false
    });
    let mut cases: Vec<(&str, Request)> = samplings()
        .into_iter()
        .enumerate()
        .map(|(k, (name, sampling))| (name, editor_request(&model, 40 + k as u64, sampling, 64)))
        .collect();
    let mut constrained = editor_request(&model, 77, samplings()[1].1.clone(), 64);
    constrained.constraint = Some(
        vocabulary
            .compile(&seedbar_grammar::Format::JsonSchema(schema))
            .unwrap(),
    );
    cases.push(("json schema", constrained));
    // Siblings: other editor requests (speculating) and chats, some not speculating.
    let siblings: Vec<Request> = (0..15)
        .map(|i| {
            let mut r = if i % 2 == 0 {
                editor_request(&model, 500 + i, samplings()[1].1.clone(), 24)
            } else {
                let mut r = Request::new(prompt(&model, "Tell me about the sea."), 24);
                r.seed = Some(600 + i);
                r.sampling.temperature = 0.8;
                r
            };
            r.speculative = i % 3 != 0;
            r
        })
        .collect();

    let plain = Scheduler::start(
        self::model(),
        SchedulerConfig {
            speculative: false,
            ..config.clone()
        },
    );
    let expected: Vec<Vec<u32>> = cases
        .iter()
        .map(|(_, r)| tokens(plain.submit(r.clone()).unwrap()))
        .collect();
    drop(plain);

    let scheduler = Scheduler::start(model, config);
    let stats = scheduler.stats();
    for ((name, request), expected) in cases.iter().zip(&expected) {
        assert!(expected.len() >= 16, "{name}: a reply to compare");
        let steps = stats.steps.load(std::sync::atomic::Ordering::SeqCst);
        let alone = tokens(scheduler.submit(request.clone()).unwrap());
        assert_eq!(&alone, expected, "{name}: alone");
        if *name == "greedy" {
            let took = stats.steps.load(std::sync::atomic::Ordering::SeqCst) - steps;
            assert!(
                (took as usize) < expected.len(),
                "{name}: {took} steps for {} tokens: the drafts were not kept",
                expected.len()
            );
        }
        for &others in crowds {
            let early: Vec<RequestStream> = siblings[..others / 2 + 1]
                .iter()
                .map(|s| scheduler.submit(s.clone()).unwrap())
                .collect();
            let target = scheduler.submit(request.clone()).unwrap();
            let late: Vec<RequestStream> = siblings[others / 2 + 1..others]
                .iter()
                .map(|s| scheduler.submit(s.clone()).unwrap())
                .collect();
            assert_eq!(&tokens(target), expected, "{name}: among {others} others");
            for s in early.into_iter().chain(late) {
                assert!(!tokens(s).is_empty());
            }
        }
    }
    // The prompts are in the prefix cache now: a hit gives the same reply (where the
    // layout reuses a prompt this short: a GPU's reuses whole 512-token chunks).
    let (name, request) = &cases[1];
    let mut stream = scheduler.submit(request.clone()).unwrap();
    let mut hit = Vec::new();
    while let Some(event) = stream.blocking_next() {
        match event {
            Event::Token { id, .. } => hit.push(id),
            Event::Finished { usage, .. } => {
                let reusable = request.prompt.len() > reuse_granularity;
                assert_eq!(usage.cached_tokens > 0, reusable, "{name}: a prefix hit");
                break;
            }
            Event::Failed(e) => panic!("{e}"),
        }
    }
    assert_eq!(hit, expected[1], "{name}: after a prefix hit");
    let drafted = stats
        .drafted_tokens
        .load(std::sync::atomic::Ordering::SeqCst);
    let accepted = stats
        .accepted_tokens
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        accepted > 0 && accepted <= drafted,
        "{accepted} of {drafted}"
    );
}

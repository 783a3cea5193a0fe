//! The layouts on the real SmolLM2 model: on this machine's backend, a decode row's logits
//! are the same bits alone and among other rows at any position of its group; and every
//! backend's layout, run here, computes the same model as one row alone in a one-row
//! matmul with unpadded attention (within float noise, with float activations); and where a
//! layout verifies drafted tokens, a chunk's positions get a decode step's logits.

use seedbar_engine::{
    runtime::Backend,
    step::kv_cache::KvCache,
    step::plan::{AttentionLayout, Layout, PooledAttention, WeightKind},
    step::{Batch, Logits, StepInput},
    Activations, ChatMessage, LoadOptions, Model,
};

/// The model, on the kernels the product runs (`prepare` may restart this test binary with
/// native OpenBLAS kernels before any test gets here).
fn model() -> Model {
    load(None)
}

/// The model with float activations, for comparisons of two layouts' paths: rounding inputs
/// to int8 (the GGUF's default on the CPU) turns a last-bit difference between two ways of
/// computing a layer into a whole rounding step.
fn float_model() -> Model {
    load(Some(Activations::Float))
}

fn load(activations: Option<Activations>) -> Model {
    seedbar_engine::runtime::prepare();
    let options = LoadOptions {
        activations,
        ..LoadOptions::for_default_device()
    };
    Model::load_with(&seedbar_dev::default_model_path(), options).unwrap()
}

/// Caches holding `prompt`, prefilled in aligned chunks, and the token to decode next.
fn prefilled(model: &Model, prompt: &str) -> (Vec<KvCache>, u32) {
    let tokens = model
        .chat_prompt(&[ChatMessage::new("user", prompt)], None)
        .unwrap();
    let mut sequence = model.sequence();
    let logits = model.prefill(&tokens, &mut sequence).unwrap();
    (sequence.caches, seedbar_engine::sampling::argmax(&logits))
}

/// One decode step of `rows` (caches and next tokens) under `layout`: each row's logits.
fn decode(model: &Model, layout: &Layout, rows: &[(Vec<KvCache>, u32)]) -> Vec<Vec<f32>> {
    let mut caches: Vec<Vec<KvCache>> = rows.iter().map(|(c, _)| c.clone()).collect();
    let tokens: Vec<u32> = rows.iter().map(|(_, t)| *t).collect();
    let lens = vec![1; rows.len()];
    let input = StepInput {
        lens: &lens,
        host: &tokens,
        drawn: None,
        embedded: &[],
        positions: &[],
    };
    let mut picked: Vec<&mut [KvCache]> = caches.iter_mut().map(|c| c.as_mut_slice()).collect();
    let logits = Batch::new(*layout)
        .run(model, input, &mut picked, Logits::Last, None)
        .unwrap();
    logits.eval().unwrap();
    let all = logits.as_slice::<f32>();
    let vocab = all.len() / rows.len();
    all.chunks(vocab).map(<[f32]>::to_vec).collect()
}

const PROMPTS: [&str; 3] = [
    "Write a short poem about the sea.",
    "hi",
    "List five facts about the Moon, with a sentence on each one of them.",
];

/// One row alone in a one-row matmul with unpadded attention.
const PLAIN: Layout = Layout {
    decode_width: None,
    attention: AttentionLayout::PerRow,
    kv_independent_of_steps: true,
    ..Layout::REFERENCE
};

#[test]
fn every_layout_computes_the_same_model() {
    let model = float_model();
    let rows: Vec<(Vec<KvCache>, u32)> = PROMPTS.iter().map(|p| prefilled(&model, p)).collect();
    let reference = decode(&model, &PLAIN, &rows[..1]).remove(0);
    let layouts = [Backend::Cpu, Backend::Cuda, Backend::Metal]
        .into_iter()
        .flat_map(|b| {
            [WeightKind::Dense, WeightKind::Quantized, WeightKind::Packed]
                .map(|w| Layout::for_backend(b, w))
        });
    for layout in layouts.chain([model.layout()]) {
        let alone = decode(&model, &layout, &rows[..1]).remove(0);
        let drift = alone
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(drift < 1e-3, "{layout:?}: logits differ by {drift}");
    }
}

#[test]
fn every_layout_is_invariant() {
    let model = model();
    let rows: Vec<(Vec<KvCache>, u32)> = PROMPTS.iter().map(|p| prefilled(&model, p)).collect();
    let here = model.layout();
    // The target (row 0) first, last, and in the middle of a crowd; on this backend's
    // layout and on two pooled GPU layouts: CUDA's unpadded row-wise groups (dense and
    // quantized alike), and Metal's 4-bit one, where the 20-row crowd spans four decode
    // groups of 5 rows and three attention calls of 8 slots.
    let crowds = [
        vec![0, 1, 2],
        vec![2, 1, 0],
        vec![1, 2, 1, 0, 2, 1, 2],
        vec![1, 2, 1, 2, 1, 0, 2],
        vec![2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 0, 1, 2],
        [[1, 2].repeat(9), vec![0, 1]].concat(),
    ];
    let pooled = [
        Layout::for_backend(Backend::Cuda, WeightKind::Quantized),
        Layout::for_backend(Backend::Metal, WeightKind::Quantized),
    ];
    for layout in [here, pooled[0], pooled[1]] {
        let alone = decode(&model, &layout, &rows[..1]).remove(0);
        for crowd in &crowds {
            let at = crowd.iter().position(|&i| i == 0).unwrap();
            let members: Vec<_> = crowd.iter().map(|&i| rows[i].clone()).collect();
            let batched = decode(&model, &layout, &members);
            assert!(
                batched[at] == alone,
                "{layout:?}: the row changed with its neighbours {crowd:?}"
            );
        }
    }
    // The plain layout (all rows in one matmul) is invariant on the CPU kernels (the
    // product's layout for SmolLM2's Q4_1 there), not inside OpenBLAS: the test can tell.
    if !seedbar_engine::runtime::default_device_is_gpu() {
        let members: Vec<_> = [1, 2, 1, 0, 2, 1, 2]
            .iter()
            .map(|&i| rows[i].clone())
            .collect();
        let batched = decode(&model, &PLAIN, &members).remove(3);
        let reference = decode(&model, &PLAIN, &rows[..1]).remove(0);
        let packed = model.weight_kind() == WeightKind::Packed;
        assert_eq!(batched == reference, packed);
    }
}

/// Decode `forced` tokens one step at a time after `prompt` under `layout`, keeping the
/// caches and the layout's pool between steps: each step's logits.
fn decode_steps(model: &Model, layout: &Layout, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let mut sequence = model.sequence();
    model.prefill(prompt, &mut sequence).unwrap();
    let mut batch = Batch::new(*layout);
    forced
        .iter()
        .map(|&token| {
            let tokens = [token];
            let input = StepInput::one_row(&[1], &tokens);
            let caches: &mut [KvCache] = &mut sequence.caches;
            let logits = batch
                .run(model, input, &mut [caches], Logits::Last, None)
                .unwrap();
            logits.eval().unwrap();
            logits.as_slice::<f32>().to_vec()
        })
        .collect()
}

/// The logits of `forced` run as one chunk after `prompt` under `layout`, one per position:
/// the chunk a row verifying drafted tokens runs (its last token, then the drafts).
fn verify_chunk(model: &Model, layout: &Layout, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let mut sequence = model.sequence();
    model.prefill(prompt, &mut sequence).unwrap();
    let lens = [forced.len() as i32];
    let input = StepInput::one_row(&lens, forced);
    let caches: &mut [KvCache] = &mut sequence.caches;
    let logits = Batch::new(*layout)
        .run(model, input, &mut [caches], Logits::Tails(&lens), None)
        .unwrap();
    logits.eval().unwrap();
    let all = logits.as_slice::<f32>();
    all.chunks(all.len() / forced.len())
        .map(<[f32]>::to_vec)
        .collect()
}

/// Speculative decoding keeps a drafted token only where the chunk that verifies it gives
/// each position the bits one decode step there gives (`Layout::verifies_drafts`): true of
/// the CPU's packed path, SmolLM2's here, and of CUDA's layout, run here, where the chunk's
/// tokens run as decode places (row-wise products, attention per query). Metal's layout,
/// run here, runs the chunk as a prefill chunk, which attends another way than a decoding
/// row in the pool, and the comparison sees the bits differ.
#[test]
fn a_verify_chunk_gets_each_positions_decode_logits_where_the_layout_says_so() {
    let model = model();
    let prompt = model
        .chat_prompt(&[ChatMessage::new("user", "Count from one to ten.")], None)
        .unwrap();
    let forced = model.tokenizer.encode("One, two, three, four").unwrap();
    let layout = model.layout();
    if !seedbar_engine::runtime::default_device_is_gpu() {
        assert!(layout.verifies_drafts());
        assert_eq!(
            verify_chunk(&model, &layout, &prompt, &forced),
            decode_steps(&model, &layout, &prompt, &forced)
        );
    }
    let cuda = Layout::for_backend(Backend::Cuda, WeightKind::Quantized);
    assert!(cuda.verifies_drafts());
    assert_eq!(
        verify_chunk(&model, &cuda, &prompt, &forced),
        decode_steps(&model, &cuda, &prompt, &forced)
    );
    let metal = Layout::for_backend(Backend::Metal, WeightKind::Quantized);
    assert!(!metal.verifies_drafts());
    assert_ne!(
        verify_chunk(&model, &metal, &prompt, &forced),
        decode_steps(&model, &metal, &prompt, &forced)
    );
}

#[test]
fn pooled_decode_keeps_computing_the_model_across_a_kv_block() {
    let model = float_model();
    let text = "The tide comes in and goes out again, every day of the year. ".repeat(30);
    let tokens = model.tokenizer.encode(&text).unwrap();
    let block = seedbar_engine::step::kv_cache::KV_BLOCK as usize;
    // Decoding from 6 positions before a block boundary to 6 after it.
    let (prompt, forced) = tokens[..block + 6].split_at(block - 6);
    let reference = decode_steps(&model, &PLAIN, prompt, forced);
    // CUDA's: each query over its own positions.
    let pooled = Layout::for_backend(Backend::Cuda, WeightKind::Dense);
    assert_eq!(pooled.attention, AttentionLayout::Capacity);
    assert_eq!(pooled.pooled, PooledAttention::PerQuery);
    for (step, (a, b)) in decode_steps(&model, &pooled, prompt, forced)
        .iter()
        .zip(&reference)
        .enumerate()
    {
        let drift = a
            .iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(drift < 1e-3, "step {step}: logits differ by {drift}");
    }
}

/// `prepare` turns MLX's CUDA graphs off unless the environment set them: their concurrent
/// branches let a row's numbers depend on its neighbours (`runtime::prepare`).
#[test]
fn cuda_graphs_are_off_unless_asked_for() {
    let asked = std::env::var_os("MLX_USE_CUDA_GRAPHS");
    seedbar_engine::runtime::prepare();
    let expected = asked.unwrap_or_else(|| "0".into());
    assert_eq!(std::env::var_os("MLX_USE_CUDA_GRAPHS"), Some(expected));
}

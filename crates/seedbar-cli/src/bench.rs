//! `seedbar bench`: prefill and batch-1 decode speed on a model, as JSON for scripts that
//! compare Seedbar with its peers in the same run (`scripts/bench.sh`).

use anyhow::Result;
use seedbar_engine::{sampling, Model};

use crate::ModelArg;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated for the decode measurement.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

pub fn run(args: BenchArgs, load: fn(&ModelArg) -> Result<Model>) -> Result<()> {
    let model = load(&args.model)?;
    // A deterministic, ordinary-text prompt of exactly the asked length.
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(args.prompt_tokens);
    let prompt: Vec<u32> = model
        .tokenizer
        .encode(&text)?
        .into_iter()
        .take(args.prompt_tokens)
        .collect();
    let (mut best_prefill, mut best_decode) = (0.0f64, 0.0f64);
    for _ in 0..args.repeat.max(1) {
        let mut caches = model.transformer.new_caches();
        let started = std::time::Instant::now();
        let mut logits = model.prefill(&prompt, &mut caches)?;
        best_prefill = best_prefill.max(prompt.len() as f64 / started.elapsed().as_secs_f64());
        // Decode continues from the prefilled prompt, as mlx_lm.generate measures it.
        let started = std::time::Instant::now();
        for _ in 0..args.decode_tokens {
            let token = sampling::argmax(&logits);
            logits = model.step(&[token], &mut caches)?;
        }
        best_decode = best_decode.max(args.decode_tokens as f64 / started.elapsed().as_secs_f64());
    }
    println!(
        "{}",
        serde_json::json!({
            "prompt_tokens": prompt.len(),
            "decode_tokens": args.decode_tokens,
            "prefill_tok_s": best_prefill,
            "decode_tok_s": best_decode,
        })
    );
    Ok(())
}

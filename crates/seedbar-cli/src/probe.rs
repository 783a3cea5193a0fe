//! `seedbar probe`: a model's raw outputs as JSON, for parity tests against reference
//! implementations (mlx-lm, Python tokenizers, Jinja2).

use std::path::PathBuf;

use anyhow::{Context, Result};
use mlx_rs::{Array, Dtype};
use seedbar_engine::{
    sampling,
    step::{Batch, Embedded, Logits, RowPositions, StepInput},
    tokenizer::StreamDecoder,
    ChatMessage, Model, TemplateKwargs,
};
use serde_json::{json, Value};

use crate::ModelArg;

#[derive(clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Comma-separated prompt token ids.
    #[arg(long, value_delimiter = ',')]
    ids: Vec<u32>,
    /// Greedy tokens to generate after `--ids`.
    #[arg(long, default_value_t = 0)]
    generate: usize,
    /// Write the logits of every prompt position (`[1, L, V]`) to this safetensors file.
    #[arg(long)]
    logits_out: Option<PathBuf>,
    /// Comma-separated image files for a vision model: the k-th at the k-th run of image
    /// tokens in `--ids`.
    #[arg(long, value_delimiter = ',')]
    images: Vec<PathBuf>,
    /// Write each image's pixels and features (`pixels{k}`, `features{k}`) to this
    /// safetensors file.
    #[arg(long)]
    features_out: Option<PathBuf>,
    /// A JSON file with a list of strings to encode, decode and stream-decode.
    #[arg(long)]
    texts: Option<PathBuf>,
    /// A JSON file with a list of chats to render: lists of messages, or
    /// `{"messages": [...], "tools": [...]}` objects.
    #[arg(long)]
    chats: Option<PathBuf>,
}

/// A chat for `--chats`: its messages, alone or with the tools offered and the template's
/// keyword arguments (`{"enable_thinking": false}`).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Chat {
    Messages(Vec<ChatMessage>),
    WithTools {
        messages: Vec<ChatMessage>,
        tools: Option<Vec<Value>>,
        #[serde(default)]
        kwargs: TemplateKwargs,
    },
}

fn read_json<T: serde::de::DeserializeOwned>(path: &PathBuf) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

pub fn run(args: ProbeArgs, load: fn(&ModelArg) -> Result<Model>) -> Result<()> {
    let model = load(&args.model)?;
    let mut out = serde_json::Map::new();
    if !args.ids.is_empty() {
        let (images, positions) = image_features(&model, &args)?;
        let embedded: Vec<Embedded> = images
            .iter()
            .map(|(at, features)| Embedded { at: *at, features })
            .collect();
        if let Some(path) = &args.logits_out {
            let mut caches = model.new_caches();
            let lens = [args.ids.len() as i32];
            let input = StepInput {
                embedded: &embedded,
                positions: std::slice::from_ref(&positions),
                ..StepInput::one_row(&lens, &args.ids)
            };
            let logits = Batch::new(model.layout()).run(
                &model,
                input,
                &mut [&mut caches],
                Logits::All,
                None,
            )?;
            Array::save_safetensors([("logits", &logits)], None, path)?;
        }
        let mut sequence = model.sequence();
        sequence.positions = positions;
        let mut logits = model.prefill_with_images(&args.ids, &images, &mut sequence)?;
        let mut generated = Vec::new();
        for i in 0..args.generate {
            let token = sampling::argmax(&logits);
            generated.push(token);
            if i + 1 < args.generate {
                logits = model.step(&[token], &mut sequence)?;
            }
        }
        out.insert("generated".into(), json!(generated));
        // What the sequence's KV holds at its end: positions per layer (a sliding-window
        // layer's stay bounded by its window) and bytes in all.
        let held: Vec<i32> = sequence.caches.iter().map(|c| c.held()).collect();
        out.insert(
            "kv".into(),
            json!({"held": held, "bytes": sequence.kv_bytes()}),
        );
    }
    if let Some(path) = &args.texts {
        let texts: Vec<String> = read_json(path)?;
        let mut encoded = Vec::new();
        let mut decoded = Vec::new();
        let mut streamed = Vec::new();
        for text in &texts {
            let ids = model.tokenizer.encode(text)?;
            decoded.push(model.tokenizer.decode(&ids)?);
            let mut stream = StreamDecoder::default();
            let mut pieces = Vec::new();
            for end in 1..=ids.len() {
                pieces.push(stream.push(&model.tokenizer, &ids[..end])?);
            }
            pieces.push(stream.finish(&model.tokenizer, &ids)?);
            streamed.push(pieces);
            encoded.push(ids);
        }
        out.insert("encoded".into(), json!(encoded));
        out.insert("decoded".into(), json!(decoded));
        out.insert("streamed".into(), json!(streamed));
    }
    if let Some(path) = &args.chats {
        let chats: Vec<Chat> = read_json(path)?;
        let rendered = chats
            .iter()
            .map(|chat| match chat {
                Chat::Messages(messages) => {
                    model
                        .template
                        .render(messages, None, &TemplateKwargs::new(), true)
                }
                Chat::WithTools {
                    messages,
                    tools,
                    kwargs,
                } => model
                    .template
                    .render(messages, tools.as_deref(), kwargs, true),
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("rendered".into(), json!(rendered));
    }
    out.insert("eos_ids".into(), json!(model.eos_ids));
    out.insert("backend".into(), backend(model.compute_dtype));
    println!("{}", Value::Object(out));
    Ok(())
}

/// `--images`' features, each with where its soft tokens start in `--ids`, and where the
/// tokens sit for RoPE; with `--features-out`, the pixels and features written there.
fn image_features(model: &Model, args: &ProbeArgs) -> Result<(Vec<(usize, Array)>, RowPositions)> {
    if args.images.is_empty() {
        return Ok((Vec::new(), RowPositions::default()));
    }
    let vision = model
        .vision
        .as_ref()
        .context("--images needs a model that takes images")?;
    let runs = vision.prompt.image_runs(&args.ids)?;
    anyhow::ensure!(
        runs.len() == args.images.len(),
        "--ids hold {} images' tokens for {} --images",
        runs.len(),
        args.images.len()
    );
    let mut saved = Vec::new();
    let mut images = Vec::new();
    let mut grids = Vec::new();
    for (k, (path, (at, count))) in args.images.iter().zip(runs).enumerate() {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let image = seedbar_images::decode(&bytes, &seedbar_images::Limits::default())
            .with_context(|| path.display().to_string())?;
        let pixels = vision.prompt.preprocessor.pixels(&image)?;
        anyhow::ensure!(
            vision.prompt.tokens.of(&pixels) == count,
            "{} takes {} image tokens; --ids hold {count} for it",
            path.display(),
            vision.prompt.tokens.of(&pixels)
        );
        let features = vision.encode(&pixels)?;
        let shape = [3, pixels.height as i32, pixels.width as i32];
        saved.push((
            format!("pixels{k}"),
            Array::from_slice(&pixels.data, &shape),
        ));
        saved.push((format!("features{k}"), features.clone()));
        images.push((at, features));
        grids.push((at, pixels));
    }
    if let Some(path) = &args.features_out {
        Array::save_safetensors(saved.iter().map(|(k, v)| (k.as_str(), v)), None, path)?;
    }
    let positions = vision
        .prompt
        .tokens
        .row_positions(grids.iter().map(|(at, p)| (*at, p)));
    Ok((images, positions))
}

/// The device MLX computes on and the dtype the model computes in there, which decide how
/// close its logits come to a reference's (the parity tests' tolerances).
fn backend(dtype: Dtype) -> Value {
    let on_gpu = seedbar_engine::runtime::default_device_is_gpu();
    json!({
        "device": if on_gpu { "gpu" } else { "cpu" },
        "compute_dtype": format!("{dtype:?}").to_lowercase(),
    })
}

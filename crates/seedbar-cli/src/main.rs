//! `seedbar`: the command-line face of the engine (run, models, pull, convert, bench, probe)
//! and of a running server (serve, ps, stop).

mod bench;
mod probe;
mod remotes;
mod serve;
mod server_client;

use std::{io::Write, path::PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use seedbar_engine::{
    store::{ModelStore, DEFAULT_MODEL},
    Activations, ChatMessage, LoadOptions, Model, SamplingParams,
};
use seedbar_scheduler::{Event, Request, Scheduler, SchedulerConfig};

#[derive(Parser)]
#[command(name = "seedbar", version, about = "Local LLMs with seeds you can pin")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct ModelArg {
    /// A model name from `seedbar models`, or a path to a GGUF file or model directory.
    #[arg(long, short, default_value = DEFAULT_MODEL)]
    model: String,
    /// How the CPU's quantized products read their input: rounded to int8 per block of 32
    /// (as llama.cpp; the default for GGUF files) or as floats (as mlx-lm; the default for
    /// MLX folders).
    #[arg(long, value_enum)]
    activations: Option<CpuActivations>,
}

/// The values of `--activations`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum CpuActivations {
    Int8,
    Float,
}

#[derive(Subcommand)]
enum Command {
    /// Answer one prompt, streaming the reply as the model writes it.
    Run {
        #[command(flatten)]
        model: ModelArg,
        /// The seed for sampling; without it one is drawn and printed so the reply can be repeated.
        #[arg(long)]
        seed: Option<u64>,
        /// Sampling temperature; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        #[arg(long, default_value_t = 0.0)]
        min_p: f32,
        #[arg(long, default_value_t = 512)]
        max_tokens: usize,
        /// A system message to put before the prompt.
        #[arg(long)]
        system: Option<String>,
        prompt: String,
    },
    /// List the models in the store and the remote ones, or add or remove one.
    Models {
        #[command(subcommand)]
        action: Option<ModelsAction>,
    },
    /// Download a Hugging Face repository (org/name) into the store.
    Pull { repo: String },
    /// Write a GGUF model as an MLX safetensors directory.
    Convert {
        input: PathBuf,
        output: PathBuf,
        /// The dtype of weights decoded from quantized blocks (dequantized tensors, and the
        /// scales and biases of those kept quantized); float32 keeps them exact.
        #[arg(long, value_enum, default_value_t = ConvertDtype::Float16)]
        dtype: ConvertDtype,
    },
    /// Serve the OpenAI- and Ollama-compatible API on localhost.
    Serve(serve::ServeArgs),
    /// Measure speed, concurrent throughput, or seeded determinism under batching.
    Bench {
        #[command(subcommand)]
        kind: bench::BenchCommand,
    },
    /// Print a model's raw outputs (tokens, logits, tokenizer, chat template) as JSON.
    Probe(probe::ProbeArgs),
    /// List the models a running server holds in memory, and until when.
    Ps(server_client::ServerArgs),
    /// Unload a model from a running server now (the next request loads it again).
    Stop {
        model: String,
        #[command(flatten)]
        server: server_client::ServerArgs,
    },
}

#[derive(Subcommand)]
enum ModelsAction {
    /// Add a GGUF file or a model directory (config.json, safetensors, tokenizer.json) to
    /// the store: linked where it is, not copied (a running app picks it up from its
    /// Models view or on its next start).
    Add {
        file: PathBuf,
        /// The store name (defaults to the file or folder name without extension).
        #[arg(long)]
        name: Option<String>,
    },
    /// Remove a model from the store (a linked file or folder stays where it is).
    Rm { name: String },
    /// Add a model another engine serves (vLLM, SGLang, llama-server, Ollama, Seedbar): it
    /// is probed, then served on every route under NAME.
    AddRemote(remotes::AddRemoteArgs),
    /// Remove a remote model and its key.
    RmRemote { name: String },
}

/// The dtypes `seedbar convert --dtype` writes.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ConvertDtype {
    Float16,
    Bfloat16,
    Float32,
}

impl From<ConvertDtype> for mlx_rs::Dtype {
    fn from(dtype: ConvertDtype) -> Self {
        match dtype {
            ConvertDtype::Float16 => mlx_rs::Dtype::Float16,
            ConvertDtype::Bfloat16 => mlx_rs::Dtype::Bfloat16,
            ConvertDtype::Float32 => mlx_rs::Dtype::Float32,
        }
    }
}

fn main() {
    seedbar_engine::runtime::prepare();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("SEEDBAR_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("seedbar: {e:#}");
            1
        }
    };
    seedbar_engine::runtime::exit(code)
}

/// Resolve `--model` through the store and load it.
fn load_model(arg: &ModelArg) -> Result<Model> {
    let store = ModelStore::open_default()?;
    let path = store.resolve(&arg.model)?;
    let options = LoadOptions {
        activations: arg.activations.map(|a| match a {
            CpuActivations::Int8 => Activations::Int8,
            CpuActivations::Float => Activations::Float,
        }),
        ..LoadOptions::for_default_device()
    };
    Model::load_with(&path, options).with_context(|| format!("loading {}", path.display()))
}

fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Run {
            model,
            seed,
            temp,
            top_p,
            top_k,
            min_p,
            max_tokens,
            system,
            prompt,
        } => {
            let model = load_model(&model)?;
            let mut messages = Vec::new();
            if let Some(system) = system {
                messages.push(ChatMessage::new("system", &system));
            }
            messages.push(ChatMessage::new("user", &prompt));
            let mut request = Request::new(model.chat_prompt(&messages, None)?, max_tokens);
            request.seed = seed;
            request.sampling = SamplingParams {
                temperature: temp,
                top_p,
                top_k,
                min_p,
                ..SamplingParams::default()
            };
            let scheduler = Scheduler::start(model, SchedulerConfig::default());
            let started = std::time::Instant::now();
            let mut stream = scheduler.submit(request)?;
            let mut stdout = std::io::stdout();
            let mut tokens = 0;
            while let Some(event) = stream.blocking_next() {
                match event {
                    Event::Token { text, .. } => {
                        tokens += 1;
                        let _ = stdout.write_all(text.as_bytes());
                        let _ = stdout.flush();
                    }
                    Event::Finished { reason, text, .. } => {
                        println!("{text}");
                        eprintln!(
                            "[seed {} · {tokens} tokens · {:.1} tok/s · finish: {}]",
                            stream.seed,
                            tokens as f64 / started.elapsed().as_secs_f64(),
                            reason.as_str()
                        );
                        break;
                    }
                    Event::Failed(message) => anyhow::bail!(message),
                }
            }
        }
        Command::Models { action: None } => {
            let store = ModelStore::open_default()?;
            let models = store.list()?;
            if models.is_empty()
                && seedbar_remote::Remotes::open(store.root())
                    .list()
                    .is_empty()
            {
                println!(
                    "no models in {} (try `seedbar pull org/name`)",
                    store.root().display()
                );
            }
            for m in models {
                println!(
                    "{:<40} {:<12} {:>9.1} MB  {}",
                    m.name,
                    m.format,
                    m.bytes as f64 / 1e6,
                    m.path.display()
                );
            }
            remotes::list(&store);
        }
        Command::Models {
            action: Some(ModelsAction::AddRemote(args)),
        } => remotes::add(args)?,
        Command::Models {
            action: Some(ModelsAction::RmRemote { name }),
        } => remotes::remove(&name)?,
        Command::Models {
            action: Some(ModelsAction::Add { file, name }),
        } => {
            let model = ModelStore::open_default()?.import(&file, name.as_deref())?;
            println!("{}: {}", model.name, model.path.display());
        }
        Command::Models {
            action: Some(ModelsAction::Rm { name }),
        } => {
            ModelStore::open_default()?.remove(&name)?;
            println!("removed {name}");
        }
        Command::Pull { repo } => {
            let bar = indicatif::ProgressBar::new(0).with_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            let cancel = std::sync::atomic::AtomicBool::new(false);
            let dir =
                ModelStore::open_default()?.pull(&repo, &mut PullBar(bar.clone()), &cancel)?;
            bar.finish_and_clear();
            println!("{repo}: {}", dir.display());
        }
        Command::Convert {
            input,
            output,
            dtype,
        } => {
            seedbar_engine::convert::gguf_to_mlx(&input, &output, dtype.into())?;
            println!("wrote {}", output.display());
        }
        Command::Bench { kind } => bench::run(kind, load_model)?,
        Command::Probe(args) => probe::run(args, load_model)?,
        Command::Serve(args) => return Ok(serve::run(args)),
        Command::Ps(server) => server_client::ps(&server)?,
        Command::Stop { model, server } => server_client::stop(&server, &model)?,
    }
    Ok(0)
}

/// `seedbar pull`'s progress on the terminal.
struct PullBar(indicatif::ProgressBar);

impl seedbar_engine::store::Progress for PullBar {
    fn total(&mut self, bytes: u64) {
        self.0.set_length(bytes);
    }

    fn advance(&mut self, bytes: u64) {
        self.0.inc(bytes);
    }
}

//! `seedbar models add-remote` and `rm-remote`: a model another engine serves, added to the
//! library of the default data directory (a running server serves it at its next request).

use std::io::BufRead;

use anyhow::{Context, Result};
use seedbar_engine::store::ModelStore;
use seedbar_remote::{Api, NewRemote, Remotes};

#[derive(clap::Args)]
pub struct AddRemoteArgs {
    /// The name clients will ask for.
    name: String,
    /// The upstream's base URL (e.g. http://gpu-box:8000 or http://gpu-box:8000/v1).
    #[arg(long)]
    url: String,
    /// The model id the upstream knows (defaults to the one it serves, where it serves one).
    #[arg(long, default_value = "")]
    model: String,
    /// The upstream's protocol.
    #[arg(long, value_enum, default_value_t = ApiArg::Openai)]
    api: ApiArg,
    /// Read the upstream's API key from this environment variable.
    #[arg(long, conflicts_with = "key_stdin")]
    key_env: Option<String>,
    /// Read the upstream's API key from the first line of standard input.
    #[arg(long)]
    key_stdin: bool,
    /// Seconds without a byte from the upstream before a request is given up.
    #[arg(long)]
    timeout: Option<u64>,
    /// Say that the upstream keeps a seeded reply the same under load (e.g. vLLM started with
    /// batch invariance on); otherwise the probe decides.
    #[arg(long)]
    identical_seeds: Option<bool>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ApiArg {
    Openai,
    Ollama,
}

/// Probe the upstream and add it.
pub fn add(args: AddRemoteArgs) -> Result<()> {
    let store = ModelStore::open_default()?;
    let key = match (&args.key_env, args.key_stdin) {
        (Some(var), _) => Some(std::env::var(var).with_context(|| format!("${var} is not set"))?),
        (None, true) => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            Some(line.trim().to_string())
        }
        (None, false) => None,
    };
    let new = NewRemote {
        name: args.name,
        url: args.url,
        api: match args.api {
            ApiArg::Openai => Api::OpenAi,
            ApiArg::Ollama => Api::Ollama,
        },
        model: args.model,
        key,
        timeout_s: args.timeout,
        identical_seeds: args.identical_seeds,
    };
    let local: Vec<String> = store.list()?.into_iter().map(|m| m.name).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let remote = runtime.block_on(Remotes::open(store.root()).add_probed(new, &local))?;
    let seeds = match remote.identical_seeds {
        true => "a seeded reply is the same whatever else it runs",
        false => "seeds are sent, but the engine does not promise the same reply under load",
    };
    println!(
        "{}: {} on {} ({seeds})",
        remote.name,
        remote.model,
        remote.owner()
    );
    Ok(())
}

/// Forget a remote and its key.
pub fn remove(name: &str) -> Result<()> {
    let store = ModelStore::open_default()?;
    Remotes::open(store.root()).remove(name)?;
    println!("removed {name}");
    Ok(())
}

/// The remotes, after the local models in `seedbar models`.
pub fn list(store: &ModelStore) {
    for remote in Remotes::open(store.root()).list() {
        println!(
            "{:<40} {:<12} {:>12}  {}",
            remote.name,
            "remote",
            "",
            remote.owner()
        );
    }
}

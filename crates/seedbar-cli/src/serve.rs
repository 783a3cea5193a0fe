//! `seedbar serve`: the local API server in the foreground until Ctrl-C or SIGTERM.

use std::{io::Write, net::IpAddr, path::PathBuf};

use seedbar_engine::store::{ModelStore, DEFAULT_MODEL};
use seedbar_scheduler::SchedulerConfig;
use seedbar_server::{App, BringUp, KeepAlive, ServerConfig, DEFAULT_PORT};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The model loaded at start: a store name, or a path to a GGUF file or model directory
    /// (others in the store are loaded on first use).
    #[arg(long, short, default_value = DEFAULT_MODEL)]
    model: String,
    /// Address to listen on; anything but loopback needs an API key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on; 0 picks a free one (printed at start).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Require `Authorization: Bearer <key>` on every route but /health.
    #[arg(long, env = "SEEDBAR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Another Host header name to accept (besides localhost, 127.0.0.1 and [::1]).
    #[arg(long = "allow-host")]
    allowed_hosts: Vec<String>,
    /// A web origin allowed to call the API from a browser (CORS).
    #[arg(long = "allow-origin")]
    allowed_origins: Vec<String>,
    /// Tokens of prompt plus reply per request (the model's own limit, if smaller, wins); a
    /// request without `max_tokens` generates until the model stops or this is reached.
    #[arg(long, default_value_t = SchedulerConfig::default().max_context)]
    max_context: usize,
    /// Let `--max-context` run past the model's trained context (positions there are
    /// extrapolated and replies degrade: long-prompt benchmarks, experiments).
    #[arg(long)]
    past_trained_context: bool,
    /// Turn speculative decoding (prompt lookup and the draft model, on the CPU's packed
    /// path) off for every request; replies are the same either way, a request may also turn
    /// it off with `"speculative": false`.
    #[arg(long, env = "SEEDBAR_NO_SPECULATIVE")]
    no_speculative: bool,
    /// A smaller model of the same vocabulary (a store name or a path) that drafts tokens
    /// for --model where prompt lookup finds none; its guesses are verified, so replies are
    /// the same with it or without it.
    #[arg(long, env = "SEEDBAR_DRAFT_MODEL")]
    draft_model: Option<String>,
    /// Largest request body accepted (images arrive in it: 32 MiB holds a 20 MiB image
    /// as base64).
    #[arg(long, default_value_t = 32 << 20)]
    max_body_bytes: usize,
    /// Fetch image parts given by http(s) URLs (20 MiB and 30 s at most each); without it
    /// they are refused, and images come as data URLs, base64 or local paths.
    #[arg(long, env = "SEEDBAR_FETCH_IMAGE_URLS")]
    fetch_image_urls: bool,
    /// The built chat UI to serve at / (default: ui/dist in the current directory, else ui/
    /// next to the executable, when there).
    #[arg(long, env = "SEEDBAR_UI_DIR")]
    ui_dir: Option<PathBuf>,
    /// How long a model other than the served one stays loaded once idle: seconds or a
    /// duration ("5m", "1h"); "-1" (the default) keeps it until its room is needed. A
    /// request's `keep_alive` (Ollama's) overrides it for its model.
    #[arg(long, env = "SEEDBAR_KEEP_ALIVE", default_value = "-1")]
    keep_alive: KeepAlive,
    /// Megabytes of finished requests' KV kept in memory for requests that start the same
    /// way (the next turn of a conversation, an agent's system prompt and tools).
    #[arg(long, env = "SEEDBAR_PROMPT_CACHE_RAM_MB", default_value_t = SchedulerConfig::default().prefix_cache_bytes >> 20)]
    prompt_cache_ram_mb: usize,
    /// Gigabytes of that KV kept on disk too (in the data directory's kv-cache folder), found
    /// again after a restart; 0 turns it off. Default: the app's setting (8 unless changed).
    #[arg(long, env = "SEEDBAR_PROMPT_CACHE_DISK_GB")]
    prompt_cache_disk_gb: Option<f64>,
}

/// Serves until a shutdown signal; the process's exit status.
pub fn run(args: ServeArgs) -> u8 {
    let ui_dir = match ui_dir(args.ui_dir) {
        Ok(dir) => dir,
        Err(message) => {
            eprintln!("seedbar: {message}");
            return 2;
        }
    };
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        allowed_hosts: args.allowed_hosts,
        allowed_origins: args.allowed_origins,
        max_body_bytes: args.max_body_bytes,
        fetch_image_urls: args.fetch_image_urls,
        model: args.model,
        draft_model: args.draft_model,
        ui_dir,
        keep_alive: args.keep_alive,
        prompt_cache_disk_bytes: args
            .prompt_cache_disk_gb
            .map(|gb| (gb.max(0.0) * (1u64 << 30) as f64) as u64),
        scheduler: SchedulerConfig {
            max_context: args.max_context,
            past_trained_context: args.past_trained_context,
            speculative: !args.no_speculative,
            prefix_cache_bytes: args.prompt_cache_ram_mb << 20,
            ..SchedulerConfig::default()
        },
    };
    if let Err(message) = config.check() {
        eprintln!("seedbar: {message}");
        return 2;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("seedbar: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(async {
        let store = ModelStore::open_default()?;
        // Without the model (not installed, or it cannot load) the server still answers:
        // the chat UI and `/app/status` say what is wrong, and an import fixes it.
        let app = App::open(config, store).await?;
        let wanted = Some(app.config.model.clone());
        app.bring_up(BringUp {
            wanted,
            download: None,
        })
        .await;
        let listener = seedbar_server::listen(&app).await?;
        let address = listener.local_addr()?;
        app.set_endpoint(address);
        match app.default_model() {
            Some(model) => println!("Seedbar serving {model} at http://{address}/v1"),
            None => {
                let readiness = app.readiness();
                eprintln!(
                    "seedbar: {} {}",
                    readiness.problem.unwrap_or_default(),
                    readiness.fix.unwrap_or_default()
                );
                println!("Seedbar listening at http://{address}/v1 without a model");
            }
        }
        if app.config.ui_dir.is_some() {
            println!("Chat UI at http://{address}/");
        }
        let _ = std::io::stdout().flush();
        seedbar_server::serve(app, listener, shutdown_signal()).await?;
        anyhow::Ok(())
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("seedbar: {e:#}");
            1
        }
    }
}

/// The chat UI's folder: the one given (which must hold a built UI), else `ui/dist` in the
/// current directory, else `ui` next to the executable; `None` when none is built.
fn ui_dir(given: Option<PathBuf>) -> Result<Option<PathBuf>, String> {
    let built = |dir: &PathBuf| dir.join("index.html").is_file();
    if let Some(dir) = given {
        if !built(&dir) {
            return Err(format!(
                "the chat UI folder {} has no index.html; build the UI with `make ui`",
                dir.display()
            ));
        }
        return Ok(Some(dir));
    }
    let here = std::env::current_dir()
        .ok()
        .map(|d| d.join("ui").join("dist"));
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("ui")));
    Ok([here, beside].into_iter().flatten().find(built))
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

//! The engine and the local API server, in this process: bind the port, open the `App`
//! (the `/app` API, the chat store and the model library work from then on, model or
//! not), serve until Quit, and bring the model up in the background (found in the store,
//! else the default one downloaded); the tray follows the model's readiness and samples
//! what generates and downloads and which models are in memory.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use seedbar_engine::store::ModelStore;
use seedbar_server::{App, BringUp, ModelState, PullStatus, Readiness, ServerConfig, DEFAULT_PORT};
use tauri::{AppHandle, Manager, Runtime};
use tokio::{net::TcpListener, sync::oneshot};

use crate::{
    quick_chat, settings,
    shell::{Connection, Shell},
    tray_model::{Activity, Download, LoadedModel, Phase, Recent, RECENT_COUNT},
    window,
};

/// The Hugging Face repository of the default model, fetched on a first start with an
/// empty store.
pub const DEFAULT_REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// How often the tray's live status (running chats, tokens/s, downloads) is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Every how many samples the installed chat models and recent conversations are read.
const LIBRARY_EVERY: u32 = 3;

/// What the launch asks for, from the environment (all optional; for development, tests
/// and several stores side by side): `SEEDBAR_MODEL`, `SEEDBAR_PORT`, `SEEDBAR_API_KEY`,
/// `SEEDBAR_NO_DOWNLOAD=1` (an empty store stays empty). Anything not given comes from the
/// saved app settings, then the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub model: Option<String>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    /// Fetch the default model when no model is installed.
    pub download: bool,
}

impl Default for Launch {
    fn default() -> Self {
        Launch {
            model: None,
            port: None,
            api_key: None,
            download: true,
        }
    }
}

impl Launch {
    pub fn from_env() -> Result<Launch, String> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let port = match var("SEEDBAR_PORT") {
            Some(p) => Some(
                p.parse()
                    .map_err(|_| format!("SEEDBAR_PORT={p} is not a port number"))?,
            ),
            None => None,
        };
        Ok(Launch {
            model: var("SEEDBAR_MODEL"),
            port,
            api_key: var("SEEDBAR_API_KEY"),
            download: var("SEEDBAR_NO_DOWNLOAD").is_none_or(|v| v == "0"),
        })
    }

    /// How the server finds its model.
    pub fn bring_up(&self) -> BringUp {
        BringUp {
            wanted: self.model.clone(),
            download: self.download.then(|| DEFAULT_REPO.to_string()),
        }
    }
}

/// The server's configuration from the launch and the saved settings.
pub fn config(launch: &Launch, saved: &settings::Saved) -> ServerConfig {
    ServerConfig {
        host: IpAddr::from([127, 0, 0, 1]),
        port: launch.port.or(saved.port).unwrap_or(DEFAULT_PORT),
        api_key: launch
            .api_key
            .clone()
            .or_else(|| saved.api_key.clone())
            .filter(|k| !k.is_empty()),
        allowed_origins: saved.allowed_origins.clone(),
        model: launch.model.clone().unwrap_or_default(),
        ..ServerConfig::default()
    }
}

/// The tray's phase for the model's readiness.
pub fn phase_of(readiness: &Readiness) -> Phase {
    let model = readiness.model.clone();
    let problem = || readiness.problem.clone().unwrap_or_default();
    match readiness.state {
        ModelState::Ready => Phase::Serving {
            model: model.unwrap_or_default(),
        },
        ModelState::Loading => Phase::Loading { model },
        ModelState::Downloading => Phase::Downloading {
            model: model.unwrap_or_default(),
            percent: readiness.percent,
        },
        ModelState::NoModel => Phase::NoModel { model },
        ModelState::Error => Phase::Error { message: problem() },
    }
}

/// Start the server and serve until the shell's stop switch; the tray follows along.
pub async fn run<R: Runtime>(handle: AppHandle<R>, launch: Launch) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    if let Err(message) = start(&handle, &shell, &launch).await {
        tracing::error!("{message}");
        shell.set_phase(Phase::Error { message });
        window::open_pending(&handle);
    }
}

async fn start<R: Runtime>(
    handle: &AppHandle<R>,
    shell: &Arc<Shell>,
    launch: &Launch,
) -> Result<(), String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let store = ModelStore::open_default().map_err(|e| text(&e))?;
    let saved = settings::Saved::load(store.root());
    settings::apply(handle, saved.desktop);
    quick_chat::bind(handle, &saved.quick_chat_shortcut);
    // Bind first: the window learns the real port at once (and a port in use shows now);
    // connections wait in the backlog until `serve`.
    // The default model chosen in the tray or the settings, while it is installed.
    let mut launch = launch.clone();
    if launch.model.is_none() {
        launch.model = saved
            .default_model
            .clone()
            .filter(|m| store.resolve(m).is_ok());
    }
    let launch = &launch;
    let config = config(launch, &saved);
    config.check()?;
    let listener = bind(SocketAddr::new(config.host, config.port)).await?;
    let address = listener.local_addr().map_err(|e| text(&e))?;
    let connection = Connection {
        api: format!("http://{address}"),
        api_key: config.api_key.clone(),
    };
    shell.set_connection(connection.clone());
    let app = App::open(config, store)
        .await
        .map_err(|e| format!("{e:#}"))?;
    app.set_endpoint(address);
    let endpoint = connection.endpoint();
    tracing::info!("listening at {endpoint}");

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    shell.serving_with(stop_tx);
    shell.attach(Arc::new(app.clone()), connection);
    window::open_pending(handle);
    settings::follow(handle, &app);
    follow(shell, &app);
    let bringing = app.clone();
    let plan = launch.bring_up();
    tauri::async_runtime::spawn(async move {
        bringing.bring_up(plan).await;
        if let Some(model) = bringing.default_model() {
            println!("Seedbar serving {model} at {endpoint}");
        }
    });

    let served = seedbar_server::serve(app, listener, async move {
        let _ = stop_rx.await;
    })
    .await;
    shell.served();
    served.map_err(|e| format!("the server stopped: {e}"))
}

/// Show the model's readiness in the tray as it changes, and sample what generates and
/// downloads every second, for as long as the server runs.
fn follow(shell: &Arc<Shell>, app: &Arc<App>) {
    let mut changes = app.subscribe_readiness();
    let watching = shell.clone();
    tauri::async_runtime::spawn(async move {
        loop {
            let phase = phase_of(&changes.borrow_and_update());
            if watching.model().phase != Phase::Stopping {
                watching.set_phase(phase);
            }
            if changes.changed().await.is_err() {
                break;
            }
        }
    });
    let (shell, app) = (shell.clone(), Arc::downgrade(app));
    tauri::async_runtime::spawn(async move {
        let mut last: Option<(Instant, u64, [u64; 2])> = None;
        let mut ticks = 0u32;
        loop {
            tokio::time::sleep(SAMPLE_EVERY).await;
            let Some(app) = app.upgrade() else { break };
            let now = app.activity();
            let at = Instant::now();
            let drafts = [now.drafted_tokens, now.accepted_tokens];
            let tokens_per_second = last.and_then(|(then, tokens, _)| {
                let seconds = at.duration_since(then).as_secs_f32();
                let made = now.generated_tokens.saturating_sub(tokens);
                (now.running > 0 && made > 0).then(|| made as f32 / seconds)
            });
            let drafts_kept = last.and_then(|(_, _, [drafted, kept])| {
                let drafted = drafts[0].saturating_sub(drafted);
                let kept = drafts[1].saturating_sub(kept);
                (now.running > 0 && drafted > 0).then(|| kept as f32 / drafted as f32)
            });
            last = Some((at, now.generated_tokens, drafts));
            let downloads = app
                .downloads()
                .into_iter()
                .filter(|p| p.status == PullStatus::Downloading)
                .map(|p| Download {
                    percent: (p.total_bytes > 0).then(|| {
                        (p.downloaded_bytes.min(p.total_bytes) * 100 / p.total_bytes) as u8
                    }),
                    repo: p.repo,
                })
                .collect();
            let activity = Activity {
                running: now.running,
                tokens_per_second,
                drafts_kept,
            };
            shell.set_activity(activity, downloads, in_memory(&app));
            if ticks % LIBRARY_EVERY == 0 {
                let recent = app.recent_conversations(RECENT_COUNT);
                let recent = recent.into_iter().map(|(id, title)| Recent { id, title });
                shell.set_library(app.chat_models().unwrap_or_default(), recent.collect());
            }
            ticks += 1;
        }
    });
}

/// The models in memory, the default one first.
fn in_memory(app: &App) -> Vec<LoadedModel> {
    let default = app.default_model().map(|m| m.to_lowercase());
    let mut loaded: Vec<LoadedModel> = app
        .models
        .loaded()
        .iter()
        .map(|m| LoadedModel {
            default: default.as_deref() == Some(&m.card.name.to_lowercase()),
            name: m.card.name.clone(),
            bytes: m.card.bytes,
        })
        .collect();
    loaded.sort_by(|a, b| b.default.cmp(&a.default).then_with(|| a.name.cmp(&b.name)));
    loaded
}

/// Listen on `address`; when another program holds its port, on a free one instead (the
/// tray's endpoint, Copy Endpoint URL and `/app/status` give the port actually bound), so a
/// busy port never leaves the app without its window's backend.
async fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    match TcpListener::bind(address).await {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = TcpListener::bind(SocketAddr::new(address.ip(), 0))
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", address.ip()))?;
            if let Ok(fallback) = listener.local_addr() {
                tracing::warn!(
                    "port {} is in use by another program; serving on port {} instead",
                    address.port(),
                    fallback.port()
                );
            }
            Ok(listener)
        }
        Err(e) => Err(format!("cannot listen on {address}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_becomes_the_tray_phase() {
        assert_eq!(
            phase_of(&Readiness::ready("m")),
            Phase::Serving { model: "m".into() }
        );
        assert_eq!(
            phase_of(&Readiness::downloading("m", Some(5))),
            Phase::Downloading {
                model: "m".into(),
                percent: Some(5)
            }
        );
        assert_eq!(
            phase_of(&Readiness::no_model(None, true)),
            Phase::NoModel { model: None }
        );
        let failed = phase_of(&Readiness::download_failed("m", "offline"));
        assert_eq!(
            failed,
            Phase::Error {
                message: "Cannot download m: offline".into()
            }
        );
    }

    #[test]
    fn the_launch_says_how_to_find_the_model() {
        assert_eq!(
            Launch::default().bring_up(),
            BringUp {
                wanted: None,
                download: Some(DEFAULT_REPO.into())
            }
        );
        let offline = Launch {
            model: Some("Mine".into()),
            download: false,
            ..Launch::default()
        };
        assert_eq!(offline.bring_up().wanted.as_deref(), Some("Mine"));
        assert_eq!(offline.bring_up().download, None);
    }

    #[test]
    fn launch_overrides_saved_settings() {
        let saved = settings::Saved {
            port: Some(9000),
            api_key: Some("saved".into()),
            allowed_origins: vec!["https://example.org".into()],
            ..Default::default()
        };
        let c = config(&Launch::default(), &saved);
        assert_eq!((c.port, c.api_key.as_deref()), (9000, Some("saved")));
        assert_eq!(c.allowed_origins, ["https://example.org"]);
        assert!(c.host.is_loopback());
        let launch = Launch {
            port: Some(0),
            api_key: Some("env".into()),
            ..Launch::default()
        };
        let c = config(&launch, &saved);
        assert_eq!((c.port, c.api_key.as_deref()), (0, Some("env")));
        let c = config(&Launch::default(), &settings::Saved::default());
        assert_eq!((c.port, c.api_key), (DEFAULT_PORT, None));
    }
}

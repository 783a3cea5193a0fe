//! The engine and the local API server, in this process: pick the model, bind the port,
//! `App::start` (loads the model), `serve` until Quit; every step is shown in the tray.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use seedbar_engine::store::{ModelStore, Progress, DEFAULT_MODEL};
use seedbar_server::{App, ServerConfig, DEFAULT_PORT};
use tauri::{AppHandle, Manager, Runtime};
use tokio::{net::TcpListener, sync::oneshot};

use crate::{
    settings,
    shell::{Connection, Shell},
    tray_model::Phase,
    window,
};

/// The Hugging Face repository of the default model, fetched on a first start with an
/// empty store.
pub const DEFAULT_REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

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
}

/// The model to serve: the one asked for, else the default, else the first installed.
pub fn choose_model(store: &ModelStore, wanted: Option<&str>) -> Result<String, Phase> {
    if let Some(name) = wanted {
        return match store.resolve(name) {
            Ok(_) => Ok(name.to_string()),
            Err(_) => Err(Phase::NoModel {
                model: Some(name.to_string()),
            }),
        };
    }
    if store.resolve(DEFAULT_MODEL).is_ok() {
        return Ok(DEFAULT_MODEL.to_string());
    }
    match store.list() {
        Ok(models) if !models.is_empty() => Ok(models[0].name.clone()),
        Ok(_) => Err(Phase::NoModel { model: None }),
        Err(e) => Err(Phase::Error {
            message: e.to_string(),
        }),
    }
}

/// The server's configuration from the launch and the saved settings.
pub fn config(launch: &Launch, saved: &settings::Saved, model: String) -> ServerConfig {
    ServerConfig {
        host: IpAddr::from([127, 0, 0, 1]),
        port: launch.port.or(saved.port).unwrap_or(DEFAULT_PORT),
        api_key: launch
            .api_key
            .clone()
            .or_else(|| saved.api_key.clone())
            .filter(|k| !k.is_empty()),
        allowed_origins: saved.allowed_origins.clone(),
        model,
        ..ServerConfig::default()
    }
}

/// Start the server and serve until the shell's stop switch; the tray follows along.
pub async fn run<R: Runtime>(handle: AppHandle<R>, launch: Launch) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    if let Err(phase) = start(&handle, &shell, &launch).await {
        if let Phase::Error { message } = &phase {
            tracing::error!("{message}");
        } else {
            tracing::error!(
                "{}",
                crate::tray_model::TrayModel::new(phase.clone(), false).status_line()
            );
        }
        shell.set_phase(phase);
        window::open_pending(&handle);
    }
}

async fn start<R: Runtime>(
    handle: &AppHandle<R>,
    shell: &Arc<Shell>,
    launch: &Launch,
) -> Result<(), Phase> {
    let error = |e: &dyn std::fmt::Display| Phase::Error {
        message: e.to_string(),
    };
    let store = ModelStore::open_default().map_err(|e| error(&e))?;
    let saved = settings::Saved::load(store.root());
    settings::apply(handle, saved.desktop);
    // Bind first: the window learns the real port at once (and a port in use shows now,
    // not after a download or a long load); connections wait in the backlog until `serve`.
    let mut config = config(launch, &saved, String::new());
    config.check().map_err(|e| error(&e))?;
    let listener = bind(SocketAddr::new(config.host, config.port))
        .await
        .map_err(|e| error(&e))?;
    let address = listener.local_addr().map_err(|e| error(&e))?;
    shell.set_connection(Connection {
        api: format!("http://{address}"),
        api_key: config.api_key.clone(),
    });
    window::open_pending(handle);

    let model = match choose_model(&store, launch.model.as_deref()) {
        Ok(model) => model,
        // A first start with an empty store: fetch the default model.
        Err(Phase::NoModel { model: None }) if launch.download => {
            download_default(shell, store.root().to_path_buf()).await?
        }
        Err(phase) => return Err(phase),
    };
    config.model = model.clone();
    shell.set_phase(Phase::Loading {
        model: model.clone(),
    });
    tracing::info!("loading {model}");
    let app = App::start(config, store)
        .await
        .map_err(|e| error(&format!("{e:#}")))?;
    app.set_endpoint(address);
    let connection = shell.connection().expect("set above");
    tracing::info!("serving {model} at {}", connection.endpoint());
    println!("Seedbar serving {model} at {}", connection.endpoint());

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    shell.serving_with(stop_tx);
    shell.attach(app.clone(), connection, &model);
    settings::follow(handle, &app);

    let served = seedbar_server::serve(app, listener, async move {
        let _ = stop_rx.await;
    })
    .await;
    shell.served();
    if let Err(e) = served {
        tracing::error!("the server stopped: {e}");
        return Err(error(&format!("the server stopped: {e}")));
    }
    Ok(())
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

/// Download progress shown in the tray, in whole percents.
struct TrayProgress {
    shell: Arc<Shell>,
    model: String,
    total: u64,
    done: u64,
}

impl Progress for TrayProgress {
    fn total(&mut self, bytes: u64) {
        self.total = bytes;
        self.show();
    }

    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        self.show();
    }
}

impl TrayProgress {
    fn show(&self) {
        let percent =
            (self.total > 0).then(|| (self.done.min(self.total) * 100 / self.total) as u8);
        self.shell.set_phase(Phase::Downloading {
            model: self.model.clone(),
            percent,
        });
    }
}

/// Pull the default model from the Hugging Face hub (`HF_ENDPOINT` moves it) into the
/// store; Quit cancels. Returns its store name.
async fn download_default(shell: &Arc<Shell>, root: std::path::PathBuf) -> Result<String, Phase> {
    tracing::info!("no model installed: downloading {DEFAULT_REPO}");
    let mut progress = TrayProgress {
        shell: shell.clone(),
        model: DEFAULT_MODEL.to_string(),
        total: 0,
        done: 0,
    };
    progress.show();
    let cancel = shell.download_cancel();
    let pulled = tokio::task::spawn_blocking(move || {
        ModelStore::at(root).pull(DEFAULT_REPO, &mut progress, &cancel)
    })
    .await
    .map_err(|e| Phase::Error {
        message: e.to_string(),
    })?;
    match pulled {
        Ok(dir) => Ok(dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| DEFAULT_REPO.replace('/', "--"))),
        Err(e) => Err(Phase::DownloadFailed {
            model: DEFAULT_MODEL.to_string(),
            message: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn store_with(models: &[&str]) -> (ModelStore, PathBuf) {
        let root = std::env::temp_dir().join(format!(
            "seedbar-app-test-{}-{}",
            std::process::id(),
            models.join("-")
        ));
        let _ = std::fs::remove_dir_all(&root);
        for name in models {
            let dir = root.join("models").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("model.Q4_1.gguf"), b"").unwrap();
        }
        (ModelStore::at(root.clone()), root)
    }

    #[test]
    fn default_model_first_then_any() {
        let (store, root) = store_with(&["Alpha", DEFAULT_MODEL]);
        assert_eq!(choose_model(&store, None).unwrap(), DEFAULT_MODEL);
        std::fs::remove_dir_all(&root).unwrap();

        let (store, root) = store_with(&["Zeta", "Alpha"]);
        assert_eq!(choose_model(&store, None).unwrap(), "Alpha");
        assert_eq!(choose_model(&store, Some("Zeta")).unwrap(), "Zeta");
        assert_eq!(
            choose_model(&store, Some("Missing")),
            Err(Phase::NoModel {
                model: Some("Missing".into())
            })
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn empty_store_has_no_model() {
        let (store, root) = store_with(&[]);
        assert_eq!(
            choose_model(&store, None),
            Err(Phase::NoModel { model: None })
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn launch_overrides_saved_settings() {
        let saved = settings::Saved {
            port: Some(9000),
            api_key: Some("saved".into()),
            allowed_origins: vec!["https://example.org".into()],
            ..Default::default()
        };
        let c = config(&Launch::default(), &saved, "m".into());
        assert_eq!((c.port, c.api_key.as_deref()), (9000, Some("saved")));
        assert_eq!(c.allowed_origins, ["https://example.org"]);
        assert!(c.host.is_loopback());
        let launch = Launch {
            port: Some(0),
            api_key: Some("env".into()),
            ..Launch::default()
        };
        let c = config(&launch, &saved, "m".into());
        assert_eq!((c.port, c.api_key.as_deref()), (0, Some("env")));
        let c = config(&Launch::default(), &settings::Saved::default(), "m".into());
        assert_eq!((c.port, c.api_key), (DEFAULT_PORT, None));
    }
}

//! The app's shared state: what the server is doing (as a `TrayModel` that the tray
//! watches), the running server, how the window reaches it, and the shutdown switch.
//! Nothing here touches a display, so the IPC commands and the menu actions are tested on
//! Tauri's mock runtime.

use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;
use tokio::sync::{oneshot, watch};

use crate::tray_model::{Activity, Choice, Download, Entry, LoadedModel, Phase, Recent, TrayModel};

/// Where the window's UI finds the API: written into the page as `window.__SEEDBAR__`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// The server's base URL (`http://127.0.0.1:7337`, no `/v1`).
    pub api: String,
    /// The bearer key when the server wants one.
    #[serde(rename = "apiKey")]
    pub api_key: Option<String>,
}

impl Connection {
    /// The OpenAI base URL that editors and SDKs are given.
    pub fn endpoint(&self) -> String {
        format!("{}/v1", self.api)
    }
}

/// Quick chat's global shortcut: the one saved, and why it is not in use if it is not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QuickChatKey {
    /// The saved accelerator (`CommandOrControl+Shift+Space`; `""` for none).
    pub shortcut: String,
    /// Why it could not be registered (taken by another app, not a shortcut).
    pub problem: Option<String>,
}

/// What the server side needs from the shell, so the mock-runtime tests can stand in for
/// a real `seedbar_server::App` (which needs a model to exist).
pub trait Server: Send + Sync {
    fn set_paused(&self, paused: bool);
    /// Take the model called `name` out of memory (its running requests finish first).
    fn unload(&self, name: &str);
    /// Serve `name` as the default model from now on (and at the next start); it loads in
    /// the background.
    fn set_default_model(&self, name: &str);
}

impl Server for Arc<seedbar_server::App> {
    fn set_paused(&self, paused: bool) {
        seedbar_server::App::set_paused(self, paused)
    }

    fn unload(&self, name: &str) {
        // The model is dropped on a blocking task of the async runtime, which the menu's
        // thread is not in.
        let _runtime = tauri::async_runtime::handle().inner().enter();
        self.models.unload(name)
    }

    fn set_default_model(&self, name: &str) {
        let (app, name) = (self.clone(), name.to_string());
        tauri::async_runtime::spawn(async move {
            if let Err(e) = app.set_default_model(&name).await {
                tracing::error!("cannot make {name} the default model: {}", e.message);
            }
        });
    }
}

/// The state behind the tray, the window and the IPC commands.
pub struct Shell {
    model: watch::Sender<TrayModel>,
    server: OnceLock<Arc<dyn Server>>,
    connection: Mutex<Option<Connection>>,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    /// True once `serve` has returned (or never ran).
    stopped: watch::Sender<bool>,
    /// A window route asked for before the server answered; opened once it does.
    pending_route: Mutex<Option<String>>,
    /// Kept alive: on X11 a clipboard's text goes away with its owner.
    clipboard: Mutex<Option<arboard::Clipboard>>,
    quick_chat: Mutex<QuickChatKey>,
}

impl Default for Shell {
    fn default() -> Self {
        Shell {
            model: watch::Sender::new(TrayModel::default()),
            server: OnceLock::new(),
            connection: Mutex::new(None),
            shutdown: Mutex::new(None),
            stopped: watch::Sender::new(true),
            pending_route: Mutex::new(None),
            clipboard: Mutex::new(None),
            quick_chat: Mutex::new(QuickChatKey::default()),
        }
    }
}

/// The shell's state as the window's IPC sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    /// `starting`, `loading`, `downloading`, `serving`, `paused`, `no-model`, `error`, `stopping`.
    pub state: &'static str,
    /// The tray's status line.
    pub status: String,
    /// The tray's hint line, if any.
    pub hint: Option<String>,
    /// The OpenAI base URL while the server answers (with or without a model).
    pub endpoint: Option<String>,
    pub paused: bool,
    pub version: &'static str,
    /// The tray's tooltip and its menu's text lines, as drawn now (live status).
    pub tooltip: String,
    pub lines: Vec<String>,
    /// The menu's items that can be chosen, top to bottom (what the arrow keys walk
    /// through), a submenu's with its items.
    pub items: Vec<Choice>,
    /// Quick chat's shortcut, for the Settings view.
    pub quick_chat: QuickChatKey,
}

impl Shell {
    pub fn new() -> Arc<Shell> {
        Arc::new(Shell::default())
    }

    pub fn model(&self) -> TrayModel {
        self.model.borrow().clone()
    }

    /// Changes of the tray model (the tray redraws on each).
    pub fn subscribe(&self) -> watch::Receiver<TrayModel> {
        self.model.subscribe()
    }

    pub fn set_phase(&self, phase: Phase) {
        self.model.send_if_modified(|m| {
            let changed = m.phase != phase;
            m.phase = phase;
            changed
        });
    }

    /// What generates, downloads and is in memory now (sampled by `server.rs`).
    pub fn set_activity(
        &self,
        activity: Activity,
        downloads: Vec<Download>,
        loaded: Vec<LoadedModel>,
    ) {
        self.model.send_if_modified(|m| {
            let changed = m.activity != activity || m.downloads != downloads || m.loaded != loaded;
            (m.activity, m.downloads, m.loaded) = (activity, downloads, loaded);
            changed
        });
    }

    /// Take a model other than the default out of memory (the tray's Unload item).
    pub fn unload(&self, name: &str) -> Result<(), String> {
        let server = self.server.get().ok_or("the server is not running")?;
        server.unload(name);
        self.model.send_if_modified(|m| {
            let before = m.loaded.len();
            m.loaded.retain(|model| model.name != name);
            m.loaded.len() != before
        });
        Ok(())
    }

    /// Make `name` the default model (the tray's Default Model menu).
    pub fn set_default_model(&self, name: &str) -> Result<(), String> {
        let server = self.server.get().ok_or("the server is not running")?;
        server.set_default_model(name);
        Ok(())
    }

    /// The chat models and recent conversations the menu offers (sampled by `server.rs`).
    pub fn set_library(&self, chat_models: Vec<String>, recent: Vec<Recent>) {
        self.model.send_if_modified(|m| {
            let changed = m.chat_models != chat_models || m.recent != recent;
            (m.chat_models, m.recent) = (chat_models, recent);
            changed
        });
    }

    pub fn status(&self) -> Status {
        let model = self.model();
        Status {
            state: model.state_name(),
            status: model.status_line(),
            hint: model.hint_line(),
            endpoint: model.endpoint().map(str::to_string),
            paused: model.paused,
            version: env!("CARGO_PKG_VERSION"),
            tooltip: model.tooltip(),
            lines: model
                .entries()
                .into_iter()
                .filter_map(|e| match e {
                    Entry::Info { text, .. } => Some(text),
                    _ => None,
                })
                .collect(),
            items: model.entries().iter().filter_map(Entry::choice).collect(),
            quick_chat: self.quick_chat(),
        }
    }

    pub fn quick_chat(&self) -> QuickChatKey {
        self.quick_chat.lock().unwrap().clone()
    }

    /// Record quick chat's shortcut; the menu shows `label` while it is registered.
    pub fn set_quick_chat(&self, key: QuickChatKey, label: Option<String>) {
        *self.quick_chat.lock().unwrap() = key;
        self.model.send_if_modified(|m| {
            let changed = m.quick_chat_shortcut != label;
            m.quick_chat_shortcut = label;
            changed
        });
    }

    /// The server answers (model or not): remember how to reach it and show its endpoint.
    pub fn attach(&self, server: Arc<dyn Server>, connection: Connection) {
        server.set_paused(self.model.borrow().paused);
        let _ = self.server.set(server);
        let endpoint = connection.endpoint();
        *self.connection.lock().unwrap() = Some(connection);
        self.model.send_modify(|m| m.listening = Some(endpoint));
    }

    /// How the window reaches the server (None until it answers).
    pub fn connection(&self) -> Option<Connection> {
        self.connection.lock().unwrap().clone()
    }

    /// Set before the window exists: the URL the window should use even before the server
    /// answers (the configured address).
    pub fn set_connection(&self, connection: Connection) {
        *self.connection.lock().unwrap() = Some(connection);
    }

    /// Pause or resume the API for outside clients; only while the server answers.
    pub fn set_paused(&self, paused: bool) -> Result<Status, String> {
        if self.model.borrow().endpoint().is_none() {
            return Err(format!(
                "the server is not running ({})",
                self.model().status_line()
            ));
        }
        if let Some(server) = self.server.get() {
            server.set_paused(paused);
        }
        self.model.send_if_modified(|m| {
            let changed = m.paused != paused;
            m.paused = paused;
            changed
        });
        Ok(self.status())
    }

    pub fn toggle_paused(&self) -> Result<Status, String> {
        let paused = self.model.borrow().paused;
        self.set_paused(!paused)
    }

    /// The script that gives the window's UI the API address and key, run before the page's
    /// own scripts on every load.
    pub fn init_script(&self) -> String {
        let value = match self.connection() {
            Some(c) => serde_json::to_value(c).unwrap_or_default(),
            None => serde_json::json!({}),
        };
        format!("window.__SEEDBAR__ = Object.freeze({value});")
    }

    /// Whether the window can be made now: the server's address is known (its requests
    /// wait in the listen backlog while the model loads), or the server will not come.
    pub fn window_ready(&self) -> bool {
        self.connection().is_some() || !matches!(self.model.borrow().phase, Phase::Starting)
    }

    /// Remember a route to open once the server answers (the last one asked wins).
    pub fn defer_route(&self, route: &str) {
        *self.pending_route.lock().unwrap() = Some(route.to_string());
    }

    pub fn take_pending_route(&self) -> Option<String> {
        self.pending_route.lock().unwrap().take()
    }

    /// Hand in the switch that stops `serve`; `serve` is running from now on.
    pub fn serving_with(&self, shutdown: oneshot::Sender<()>) {
        *self.shutdown.lock().unwrap() = Some(shutdown);
        self.stopped.send_replace(false);
    }

    /// `serve` returned.
    pub fn served(&self) {
        self.stopped.send_replace(true);
    }

    /// Ask the server to stop (new connections refused, streams get a short grace) and show
    /// it. Returns a receiver that turns true once `serve` has returned.
    pub fn stop(&self) -> watch::Receiver<bool> {
        self.set_phase(Phase::Stopping);
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
        self.stopped.subscribe()
    }

    /// Put the endpoint URL on the clipboard.
    pub fn copy_endpoint(&self) -> Result<String, String> {
        let endpoint = self
            .model()
            .endpoint()
            .map(str::to_string)
            .ok_or("the server is not running")?;
        let mut guard = self.clipboard.lock().unwrap();
        if guard.is_none() {
            *guard = Some(arboard::Clipboard::new().map_err(|e| e.to_string())?);
        }
        let clipboard = guard.as_mut().expect("set above");
        clipboard
            .set_text(endpoint.clone())
            .map_err(|e| e.to_string())?;
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Paused or not, and the models it was asked to unload.
    #[derive(Default)]
    pub struct FakeServer(pub AtomicBool, pub Mutex<Vec<String>>);

    impl Server for FakeServer {
        fn set_paused(&self, paused: bool) {
            self.0.store(paused, Ordering::SeqCst);
        }

        fn unload(&self, name: &str) {
            self.1.lock().unwrap().push(name.to_string());
        }

        fn set_default_model(&self, name: &str) {
            self.1.lock().unwrap().push(format!("default {name}"));
        }
    }

    fn connection() -> Connection {
        Connection {
            api: "http://127.0.0.1:7337".into(),
            api_key: None,
        }
    }

    #[test]
    fn pause_needs_a_running_server() {
        let shell = Shell::new();
        assert!(shell.set_paused(true).is_err());
        let server = Arc::new(FakeServer::default());
        shell.attach(server.clone(), connection());
        shell.set_phase(Phase::Serving { model: "m".into() });
        let status = shell.set_paused(true).unwrap();
        assert!(status.paused);
        assert_eq!(status.state, "paused");
        assert!(server.0.load(Ordering::SeqCst));
        let status = shell.toggle_paused().unwrap();
        assert!(!status.paused);
        assert!(!server.0.load(Ordering::SeqCst));
    }

    #[test]
    fn unload_asks_the_server_and_the_menu_drops_the_model_at_once() {
        let shell = Shell::new();
        assert!(shell.unload("spare").is_err(), "no server yet");
        let server = Arc::new(FakeServer::default());
        shell.attach(server.clone(), connection());
        shell.set_phase(Phase::Serving { model: "m".into() });
        let loaded = |name: &str, default| LoadedModel {
            name: name.into(),
            bytes: 1,
            default,
        };
        shell.set_activity(
            Activity::default(),
            Vec::new(),
            vec![loaded("m", true), loaded("spare", false)],
        );
        assert!(shell.status().lines.iter().any(|l| l.contains("spare")));
        shell.unload("spare").unwrap();
        assert_eq!(*server.1.lock().unwrap(), ["spare"]);
        assert_eq!(shell.model().loaded, [loaded("m", true)]);
        assert!(!shell.status().lines.iter().any(|l| l.contains("spare")));
    }

    #[test]
    fn attach_shows_the_endpoint_before_the_model() {
        let shell = Shell::new();
        let changes = shell.subscribe();
        shell.attach(Arc::new(FakeServer::default()), connection());
        assert!(changes.has_changed().unwrap());
        shell.set_phase(Phase::NoModel { model: None });
        let status = shell.status();
        assert_eq!(status.state, "no-model");
        assert_eq!(status.endpoint.as_deref(), Some("http://127.0.0.1:7337/v1"));
        shell.set_phase(Phase::Serving {
            model: "SmolLM2".into(),
        });
        let status = shell.status();
        assert_eq!(status.state, "serving");
        assert_eq!(status.status, "Serving SmolLM2 at http://127.0.0.1:7337/v1");
    }

    #[test]
    fn activity_changes_redraw_only_when_they_change() {
        let shell = Shell::new();
        let mut changes = shell.subscribe();
        let busy = Activity {
            running: 1,
            tokens_per_second: Some(50.0),
            drafts_kept: None,
        };
        shell.set_activity(busy, Vec::new(), Vec::new());
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        shell.set_activity(busy, Vec::new(), Vec::new());
        assert!(!changes.has_changed().unwrap());
        assert_eq!(shell.model().activity, busy);
    }

    #[test]
    fn init_script_carries_address_and_key() {
        let shell = Shell::new();
        assert_eq!(
            shell.init_script(),
            "window.__SEEDBAR__ = Object.freeze({});"
        );
        shell.set_connection(Connection {
            api: "http://127.0.0.1:40000".into(),
            api_key: Some("k\"</script>".into()),
        });
        let script = shell.init_script();
        assert_eq!(
            script,
            r#"window.__SEEDBAR__ = Object.freeze({"api":"http://127.0.0.1:40000","apiKey":"k\"</script>"});"#
        );
    }

    #[test]
    fn routes_wait_for_the_address() {
        let shell = Shell::new();
        assert!(!shell.window_ready());
        shell.defer_route("#/new");
        shell.defer_route("#/settings");
        shell.set_connection(connection());
        assert!(shell.window_ready());
        assert_eq!(shell.take_pending_route().as_deref(), Some("#/settings"));
        assert_eq!(shell.take_pending_route(), None);
        // A server that will not come opens the window too (the UI says it cannot connect).
        let failed = Shell::new();
        failed.set_phase(Phase::Error {
            message: "x".into(),
        });
        assert!(failed.window_ready());
    }

    #[test]
    fn stop_signals_serve() {
        let shell = Shell::new();
        let (tx, mut rx) = oneshot::channel();
        shell.serving_with(tx);
        let stopped = shell.stop();
        assert!(!*stopped.borrow());
        assert!(rx.try_recv().is_ok());
        assert_eq!(shell.model().phase, Phase::Stopping);
        shell.served();
        assert!(*stopped.borrow());
    }
}

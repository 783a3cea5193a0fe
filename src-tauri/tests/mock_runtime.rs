//! The app's IPC commands and menu actions on Tauri's mock runtime (no display): the same
//! `seedbar_app::setup` the real app uses, a stand-in for the server.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use seedbar_app::{
    quick_chat,
    shell::{Connection, Server, Shell},
    tray::perform,
    tray_model::{Action, Phase},
    window,
};
use serde_json::{json, Value};
use tauri::{
    ipc::{CallbackFn, InvokeBody},
    test::{get_ipc_response, mock_builder, mock_context, noop_assets, MockRuntime, INVOKE_KEY},
    webview::InvokeRequest,
    App, Manager, WebviewUrl, WebviewWindow, WebviewWindowBuilder,
};

#[derive(Default)]
struct FakeServer {
    paused: AtomicBool,
}

impl Server for FakeServer {
    fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    fn unload(&self, _name: &str) {}

    fn set_default_model(&self, _name: &str) {}
}

fn app() -> (App<MockRuntime>, Arc<Shell>) {
    let shell = Shell::new();
    let app = seedbar_app::setup(mock_builder(), shell.clone())
        .build(mock_context(noop_assets()))
        .expect("the app builds on the mock runtime");
    (app, shell)
}

fn webview(app: &App<MockRuntime>) -> WebviewWindow<MockRuntime> {
    WebviewWindowBuilder::new(app, "probe", WebviewUrl::default())
        .build()
        .unwrap()
}

fn invoke(webview: &WebviewWindow<MockRuntime>, cmd: &str, body: Value) -> Result<Value, Value> {
    get_ipc_response(
        webview,
        InvokeRequest {
            cmd: cmd.into(),
            callback: CallbackFn(0),
            error: CallbackFn(1),
            // The app's own origin (tauri://localhost outside Windows).
            url: if cfg!(windows) {
                "http://tauri.localhost"
            } else {
                "tauri://localhost"
            }
            .parse()
            .unwrap(),
            body: InvokeBody::Json(body),
            headers: Default::default(),
            invoke_key: INVOKE_KEY.to_string(),
        },
    )
    .map(|b| b.deserialize::<Value>().unwrap())
}

fn serve(shell: &Shell, port: u16) -> Arc<FakeServer> {
    let server = Arc::new(FakeServer::default());
    shell.attach(
        server.clone(),
        Connection {
            api: format!("http://127.0.0.1:{port}"),
            api_key: None,
        },
    );
    shell.set_phase(Phase::Serving {
        model: "SmolLM2-135M-Instruct".into(),
    });
    server
}

#[test]
fn status_follows_the_server() {
    let (app, shell) = app();
    let w = webview(&app);
    let status = invoke(&w, "shell_status", json!({})).unwrap();
    assert_eq!(status["state"], "starting");
    assert_eq!(status["status"], "Starting…");
    assert_eq!(status["endpoint"], Value::Null);

    shell.set_phase(Phase::Loading {
        model: Some("SmolLM2-135M-Instruct".into()),
    });
    let status = invoke(&w, "shell_status", json!({})).unwrap();
    assert_eq!(status["state"], "loading");
    assert_eq!(status["status"], "Loading SmolLM2-135M-Instruct…");

    serve(&shell, 7337);
    let status = invoke(&w, "shell_status", json!({})).unwrap();
    assert_eq!(
        status,
        json!({
            "state": "serving",
            "status": "Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1",
            "hint": null,
            "endpoint": "http://127.0.0.1:7337/v1",
            "paused": false,
            "version": env!("CARGO_PKG_VERSION"),
            "tooltip": "Seedbar: Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1",
            "lines": ["Serving SmolLM2-135M-Instruct at http://127.0.0.1:7337/v1"],
            "items": [
                {"label": "Open Chat"},
                {"label": "New Chat"},
                {"label": "Quick Chat"},
                {"label": "Copy Endpoint URL"},
                {"label": "Pause Server"},
                {"label": "Settings…"},
                {"label": "Quit Seedbar"},
            ],
            "quick_chat": {"shortcut": "", "problem": null},
        })
    );
}

#[test]
fn pause_and_resume_through_ipc() {
    let (app, shell) = app();
    let w = webview(&app);
    let refused = invoke(&w, "set_server_paused", json!({"paused": true})).unwrap_err();
    assert!(
        refused.as_str().unwrap().contains("not running"),
        "{refused}"
    );

    let server = serve(&shell, 7337);
    let status = invoke(&w, "set_server_paused", json!({"paused": true})).unwrap();
    assert_eq!(status["state"], "paused");
    assert_eq!(status["paused"], true);
    assert!(server.paused.load(Ordering::SeqCst));
    assert!(shell.model().paused);

    let status = invoke(&w, "set_server_paused", json!({"paused": false})).unwrap();
    assert_eq!(status["state"], "serving");
    assert!(!server.paused.load(Ordering::SeqCst));

    // A missing argument is the IPC layer's error, not a panic.
    assert!(invoke(&w, "set_server_paused", json!({})).is_err());
}

#[test]
fn menu_pause_item_toggles() {
    let (app, shell) = app();
    let server = serve(&shell, 7337);
    perform(app.handle(), Action::TogglePause);
    assert!(server.paused.load(Ordering::SeqCst));
    assert_eq!(shell.model().pause_label(), "Resume Server");
    perform(app.handle(), Action::TogglePause);
    assert!(!server.paused.load(Ordering::SeqCst));
    assert_eq!(shell.model().pause_label(), "Pause Server");
}

#[test]
fn window_opens_at_the_route_once_the_address_is_known() {
    let (app, shell) = app();
    // Before the port is bound the window waits (its page needs the address).
    perform(app.handle(), Action::Settings);
    assert!(app.get_webview_window(window::MAIN).is_none());

    shell.set_connection(Connection {
        api: "http://127.0.0.1:40001".into(),
        api_key: Some("key".into()),
    });
    window::open_pending(app.handle());
    let main = app
        .get_webview_window(window::MAIN)
        .expect("the window opened");
    let url = main.url().unwrap();
    assert_eq!(url.fragment(), Some("/settings"), "{url}");
    assert!(url.path().ends_with("index.html"), "{url}");

    // Further actions reuse the same window.
    perform(app.handle(), Action::NewChat);
    perform(app.handle(), Action::OpenChat);
    assert_eq!(app.webview_windows().len(), 1);
}

#[test]
fn quick_chat_panel_opens_from_the_menu_and_hands_over_to_the_chat_window() {
    let (app, shell) = app();
    serve(&shell, 7337);
    perform(app.handle(), Action::QuickChat);
    let panel = app
        .get_webview_window(quick_chat::PANEL)
        .expect("the panel opened");
    let url = panel.url().unwrap();
    assert!(url.path().ends_with("quick.html"), "{url}");
    assert!(app.get_webview_window(window::MAIN).is_none());

    let w = webview(&app);
    let refused = invoke(&w, "open_chat_window", json!({"route": "https://x"})).unwrap_err();
    assert!(
        refused.as_str().unwrap().contains("not a route"),
        "{refused}"
    );
    invoke(&w, "open_chat_window", json!({"route": "#/c/12"})).unwrap();
    let main = app
        .get_webview_window(window::MAIN)
        .expect("the chat window");
    assert_eq!(main.url().unwrap().fragment(), Some("/c/12"));
    // (The mock runtime keeps no visibility: hiding and showing are checked under Xvfb.)
    invoke(&w, "hide_quick_chat", json!({})).unwrap();
    quick_chat::toggle(app.handle()).unwrap();
    assert_eq!(app.webview_windows().len(), 3, "the same panel again");
}

#[test]
fn the_page_gets_address_and_key() {
    let shell = Shell::new();
    shell.set_connection(Connection {
        api: "http://127.0.0.1:40002".into(),
        api_key: Some("secret".into()),
    });
    assert_eq!(
        shell.init_script(),
        r#"window.__SEEDBAR__ = Object.freeze({"api":"http://127.0.0.1:40002","apiKey":"secret"});"#
    );
}

#[test]
fn navigation_script_repeats_the_same_route() {
    let script = window::navigate_script("#/new");
    assert!(script.contains(r##"("#/new")"##), "{script}");
    assert!(script.contains("HashChangeEvent"), "{script}");
    assert_eq!(window::page_of(""), "index.html");
    assert_eq!(window::page_of("#/settings"), "index.html#/settings");
}

#[test]
fn copy_needs_a_running_server() {
    let (_app, shell) = app();
    assert!(shell.copy_endpoint().is_err());
}

#[test]
fn instance_lock_is_per_data_directory() {
    let id = "dev.seedbar.Seedbar";
    assert_eq!(seedbar_app::instance_id(id, None), id);
    let a = seedbar_app::instance_id(id, Some("/tmp/a".as_ref()));
    let b = seedbar_app::instance_id(id, Some("/tmp/b".as_ref()));
    assert_ne!(a, b);
    assert!(a.starts_with("dev.seedbar.Seedbar.home"));
    assert_eq!(a, seedbar_app::instance_id(id, Some("/tmp/a".as_ref())));
    // Linux, a D-Bus name: elements of letters, digits, '_' and '-', not starting with a digit.
    assert!(a
        .split('.')
        .all(|part| !part.is_empty() && !part.starts_with(|c: char| c.is_ascii_digit())));
    // macOS, the identifier names a Unix socket, /tmp/<identifier, '.' and '-' as '_'>_si.sock,
    // whose path must stay under the 104 bytes of sun_path.
    assert!(format!("/tmp/{}_si.sock", a.replace(['.', '-'], "_")).len() < 100);
}

/// `RunEvent::Exit` (how macOS's Cmd+Q arrives) stops the server and returns only once it
/// has stopped; with no server running it returns at once.
#[test]
fn exit_stops_the_server_and_waits_for_it() {
    let (app, shell) = app();
    let started = std::time::Instant::now();
    seedbar_app::on_run_event(app.handle(), tauri::RunEvent::Exit);
    assert!(started.elapsed() < std::time::Duration::from_secs(1));

    let (stop, stopping) = tokio::sync::oneshot::channel();
    shell.serving_with(stop);
    let server_shell = shell.clone();
    let server = std::thread::spawn(move || {
        stopping.blocking_recv().expect("the stop switch was sent");
        // Streams finishing their grace period.
        std::thread::sleep(std::time::Duration::from_millis(300));
        server_shell.served();
    });
    let started = std::time::Instant::now();
    seedbar_app::on_run_event(app.handle(), tauri::RunEvent::Exit);
    let waited = started.elapsed();
    server.join().unwrap();
    assert!(
        waited >= std::time::Duration::from_millis(300),
        "returned before the server stopped ({waited:?})"
    );
    assert!(waited < std::time::Duration::from_secs(5), "{waited:?}");
    assert_eq!(shell.model().phase, Phase::Stopping);
}

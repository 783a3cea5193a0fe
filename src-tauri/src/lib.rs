//! Seedbar's menu-bar app: the engine and the local API server run in this process
//! (`server.rs`), a tray item shows what they do and drives them (`tray.rs`, its pure
//! model in `tray_model.rs`), and a window shows the chat UI (`window.rs`) that talks to
//! the same API as editors do; a global shortcut opens a quick-chat panel
//! (`quick_chat.rs`).
//!
//! `setup` is generic over Tauri's runtime so the IPC commands and menu actions are tested
//! on the mock runtime; `run` adds what needs the real one (plugins, tray, server).

pub mod commands;
pub mod quick_chat;
pub mod server;
pub mod settings;
pub mod shell;
pub mod tray;
pub mod tray_model;
pub mod window;

use std::{process::ExitCode, sync::Arc};

use tauri::{Builder, RunEvent, Runtime, WindowEvent};

use crate::shell::Shell;

/// Passed by the login item: start in the menu bar without opening the window.
pub const HIDDEN_ARG: &str = "--hidden";

/// What the app adds to a builder on any runtime: the shared state, the IPC commands,
/// "closing a window hides it" (the app lives on in the tray), and the quick-chat panel
/// hiding when focus moves to another window, as menu-bar panels do.
pub fn setup<R: Runtime>(builder: Builder<R>, shell: Arc<Shell>) -> Builder<R> {
    builder
        .manage(shell)
        .manage(quick_chat::LastBlur::default())
        .invoke_handler(tauri::generate_handler![
            commands::shell_status,
            commands::set_server_paused,
            commands::pick_model_path,
            commands::open_chat_window,
            commands::hide_quick_chat
        ])
        .on_window_event(|window, event| match event {
            WindowEvent::CloseRequested { api, .. }
                if [window::MAIN, quick_chat::PANEL].contains(&window.label()) =>
            {
                api.prevent_close();
                let _ = window.hide();
            }
            WindowEvent::Focused(false) if window.label() == quick_chat::PANEL => {
                quick_chat::blurred(window);
            }
            _ => {}
        })
}

/// The single-instance lock's identity: one app per data directory, so a development or
/// test copy with its own `SEEDBAR_HOME` runs beside the installed one.
/// tauri-plugin-single-instance (2.5) keys the lock on Linux by a D-Bus name (its
/// `dbus_id`) and on macOS by a socket named after the config's `identifier` alone
/// (`/tmp/<identifier>_si.sock`), so `run` gives it this as both.
pub fn instance_id(identifier: &str, seedbar_home: Option<&std::ffi::OsStr>) -> String {
    match seedbar_home {
        None => identifier.to_string(),
        Some(home) => {
            // FNV-1a: stable across runs and builds.
            let hash = home
                .as_encoded_bytes()
                .iter()
                .fold(0xcbf29ce484222325u64, |h, b| {
                    (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
                });
            format!("{identifier}.home{hash:016x}")
        }
    }
}

/// The app.
pub fn run() -> ExitCode {
    seedbar_engine::runtime::prepare();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let launch = match server::Launch::from_env() {
        Ok(launch) => launch,
        Err(message) => {
            eprintln!("seedbar-app: {message}");
            return ExitCode::from(2);
        }
    };
    // What the saved settings ask of the start: the window closed, the menu-bar icon off.
    let saved = seedbar_engine::store::ModelStore::open_default()
        .map(|store| settings::Saved::load(store.root()))
        .unwrap_or_default();
    let hidden = std::env::args().any(|a| a == HIDDEN_ARG) || saved.start_minimized;
    let context = tauri::generate_context!("../tauri.conf.json");
    let lock_id = instance_id(
        &context.config().identifier,
        std::env::var_os("SEEDBAR_HOME").as_deref(),
    );
    // The macOS lock has no key but the identifier, which nothing else of the app reads at
    // run time (the bundle's Info.plist keeps the real one).
    #[cfg(target_os = "macos")]
    let context = {
        let mut context = context;
        context.config_mut().identifier = lock_id.clone();
        context
    };
    let single_instance = tauri_plugin_single_instance::Builder::new()
        .callback(|handle, _args, _cwd| {
            // A second launch shows the running app's window.
            if let Err(e) = window::show(handle, "") {
                tracing::error!("cannot open the window: {e}");
            }
        })
        .dbus_id(lock_id)
        .build();
    let autostart = tauri_plugin_autostart::Builder::new()
        .args([HIDDEN_ARG])
        .build();

    let builder = Builder::default()
        .plugin(single_instance)
        .plugin(autostart)
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_global_shortcut::Builder::new().build());
    let app = setup(builder, Shell::new()).setup(move |app| {
        // A menu-bar app: no Dock icon unless the settings ask for one.
        #[cfg(target_os = "macos")]
        app.set_activation_policy(tauri::ActivationPolicy::Accessory);
        let handle = app.handle().clone();
        tray::show(&handle, saved.desktop.show_menu_bar_icon);
        if !hidden {
            window::show(&handle, "")?;
        }
        tauri::async_runtime::spawn(server::run(handle.clone(), launch));
        tauri::async_runtime::spawn(quit_on_signal(handle));
        Ok(())
    });
    let app = match app.build(context) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("seedbar-app: {e}");
            return ExitCode::FAILURE;
        }
    };
    app.run(on_run_event);
    ExitCode::SUCCESS
}

/// The event loop's app-wide events.
pub fn on_run_event<R: Runtime>(handle: &tauri::AppHandle<R>, event: RunEvent) {
    match event {
        // The window only hides, but keep running should every window be gone (an exit
        // with a code is Quit's own).
        RunEvent::ExitRequested {
            code: None, api, ..
        } => api.prevent_exit(),
        // The loop has ended and the process ends when this returns. macOS's Cmd+Q (the app
        // menu's Quit) and the Dock's Quit come only this way: tao 0.37's app delegate does
        // not answer `applicationShouldTerminate:`, so AppKit goes on to
        // `applicationWillTerminate:`, which tao turns into `LoopDestroyed`, Tauri into
        // `RunEvent::Exit`; no `ExitRequested` comes first. The server stops here as it
        // does for Quit and SIGTERM (after those it has already stopped).
        RunEvent::Exit => tray::stop_and_wait(handle),
        // Opening the running app again (Finder, Spotlight, `open -a`) shows the chat window.
        #[cfg(target_os = "macos")]
        RunEvent::Reopen { .. } => {
            if let Err(e) = window::show(handle, "") {
                tracing::error!("cannot open the window: {e}");
            }
        }
        _ => {}
    }
}

/// Ctrl-C or SIGTERM quit like the menu's Quit: the server ends its streams first.
async fn quit_on_signal<R: Runtime>(handle: tauri::AppHandle<R>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
    }
    tracing::info!("quitting");
    tray::quit(&handle);
}

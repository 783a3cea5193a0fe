//! The chat window: the bundled UI (`ui/dist`), told where the API is through
//! `window.__SEEDBAR__` (an initialization script). Made on first use, hidden on close.

use std::sync::Arc;

use tauri::{AppHandle, Manager, Runtime, WebviewUrl, WebviewWindow, WebviewWindowBuilder};

use crate::shell::Shell;

/// The window's label.
pub const MAIN: &str = "main";

/// The page a route (a URL hash such as `#/new`, or `""`) opens at.
pub fn page_of(route: &str) -> String {
    format!("index.html{route}")
}

/// A script that moves the UI to `route` (a hash change; the same hash again is announced
/// as a hash change too, so "New Chat" twice still starts a new chat).
pub fn navigate_script(route: &str) -> String {
    let hash = serde_json::to_string(route).expect("a string serializes");
    format!(
        "(function (h) {{ if (location.hash === h) window.dispatchEvent(new HashChangeEvent('hashchange')); else location.hash = h; }})({hash});"
    )
}

/// Show the window at `route` ("" keeps its place). Before the server answers the request
/// is remembered and done once it does (or fails).
pub fn show<R: Runtime>(handle: &AppHandle<R>, route: &str) -> tauri::Result<()> {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    if !shell.window_ready() {
        shell.defer_route(route);
        return Ok(());
    }
    let window = match handle.get_webview_window(MAIN) {
        Some(window) => {
            if !route.is_empty() {
                window.eval(navigate_script(route))?;
            }
            window
        }
        None => create(handle, &shell, route)?,
    };
    window.show()?;
    if window.is_minimized().unwrap_or(false) {
        window.unminimize()?;
    }
    window.set_focus()?;
    Ok(())
}

/// Open the route asked for while the server was starting, if any.
pub fn open_pending<R: Runtime>(handle: &AppHandle<R>) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    if let Some(route) = shell.take_pending_route() {
        if let Err(e) = show(handle, &route) {
            tracing::error!("cannot open the window: {e}");
        }
    }
}

fn create<R: Runtime>(
    handle: &AppHandle<R>,
    shell: &Shell,
    route: &str,
) -> tauri::Result<WebviewWindow<R>> {
    WebviewWindowBuilder::new(handle, MAIN, WebviewUrl::App(page_of(route).into()))
        .title("Seedbar")
        .inner_size(980.0, 720.0)
        .min_inner_size(520.0, 420.0)
        .center()
        .visible(false)
        .initialization_script(shell.init_script())
        .build()
}

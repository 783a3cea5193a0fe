//! What the window's page may ask the shell through Tauri's IPC
//! (`window.__TAURI_INTERNALS__.invoke(name, args)`): the server's state, pausing it, a
//! native file picker for a model to import, and quick chat's two moves (hide the panel,
//! open what it saved in the chat window).

use std::sync::Arc;

use tauri::{AppHandle, Runtime, State};
use tauri_plugin_dialog::DialogExt;

use crate::{
    quick_chat,
    shell::{Shell, Status},
    window,
};

/// The server's state as the tray shows it.
#[tauri::command]
pub fn shell_status(shell: State<'_, Arc<Shell>>) -> Status {
    shell.status()
}

/// Pause (`true`) or resume the API for outside clients; an error unless it is serving.
#[tauri::command]
pub fn set_server_paused(shell: State<'_, Arc<Shell>>, paused: bool) -> Result<Status, String> {
    shell.set_paused(paused)
}

/// A native picker for a model on disk: a `.gguf` file, or (`folder`) a model folder.
/// The chosen path, or `None` when cancelled; the page then imports it through the API.
#[tauri::command]
pub async fn pick_model_path<R: Runtime>(
    app: AppHandle<R>,
    folder: bool,
) -> Result<Option<String>, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let dialog = app.dialog().file().set_title("Import a model");
    let send = move |picked: Option<tauri_plugin_dialog::FilePath>| {
        let _ = tx.send(picked);
    };
    if folder {
        dialog.pick_folder(send);
    } else {
        dialog.add_filter("GGUF model", &["gguf"]).pick_file(send);
    }
    let picked = rx.await.map_err(|e| e.to_string())?;
    picked
        .map(|path| path.into_path().map(|p| p.display().to_string()))
        .transpose()
        .map_err(|e| e.to_string())
}

/// Show the chat window at `route` (`#/c/12`: a conversation quick chat saved, `#/models`:
/// where to import a model) and hide the quick-chat panel.
#[tauri::command]
pub fn open_chat_window<R: Runtime>(app: AppHandle<R>, route: String) -> Result<(), String> {
    if !route.starts_with("#/") {
        return Err(format!("“{route}” is not a route of the chat window (#/…)"));
    }
    window::show(&app, &route).map_err(|e| e.to_string())?;
    quick_chat::hide(&app).map_err(|e| e.to_string())
}

/// Hide the quick-chat panel (its Esc key).
#[tauri::command]
pub fn hide_quick_chat<R: Runtime>(app: AppHandle<R>) -> Result<(), String> {
    quick_chat::hide(&app).map_err(|e| e.to_string())
}

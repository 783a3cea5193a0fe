//! What the window's page may ask the shell through Tauri's IPC
//! (`window.__TAURI_INTERNALS__.invoke(name, args)`): the server's state, and pausing it.

use std::sync::Arc;

use tauri::State;

use crate::shell::{Shell, Status};

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

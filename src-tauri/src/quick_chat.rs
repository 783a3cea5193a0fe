//! Quick chat: a small frameless, always-on-top panel (`ui/quick.html`) that asks the
//! default model, toggled by a global shortcut (the saved `quick_chat_shortcut`, through
//! tauri-plugin-global-shortcut) and by the tray's "Quick Chat", and hidden when the focus
//! moves to another window (`blurred`). It answers while the server is paused for outside
//! clients (through `/app/chat/completions`), saves an answer as a conversation through the
//! API and asks the shell (`open_conversation`) to show it in the chat window.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tauri::{AppHandle, Manager, Runtime, WebviewUrl, WebviewWindow, WebviewWindowBuilder, Window};
use tauri_plugin_global_shortcut::{Shortcut, ShortcutState};

use crate::shell::{QuickChatKey, Shell};

/// The panel's window label.
pub const PANEL: &str = "quick";

/// The panel's page in the bundled UI.
const PAGE: &str = "quick.html";

/// What the page listens for each time the panel is shown (it focuses its input).
const SHOWN_SCRIPT: &str = "window.dispatchEvent(new Event('seedbar:quick-shown'));";

/// How soon after a blur hid the panel the shortcut still counts as hiding it: on X11 the
/// shortcut's key grab takes the keyboard focus from the panel (a blur) just before the key
/// event toggles it.
const SHORTCUT_AFTER_BLUR: Duration = Duration::from_millis(250);

/// When focus last left the panel and hid it (managed state, read by `toggle`).
#[derive(Default)]
pub struct LastBlur(Mutex<Option<Instant>>);

/// Show the panel, or hide it when it is showing (the shortcut).
pub fn toggle<R: Runtime>(handle: &AppHandle<R>) -> tauri::Result<()> {
    match handle.get_webview_window(PANEL) {
        Some(panel) if panel.is_visible()? => panel.hide(),
        // The press that hid it through its key grab: it stays hidden.
        Some(_) if blurred_within(handle, SHORTCUT_AFTER_BLUR) => Ok(()),
        _ => show(handle),
    }
}

fn blurred_within<R: Runtime>(handle: &AppHandle<R>, span: Duration) -> bool {
    let last = handle.state::<LastBlur>();
    let last = *last.0.lock().unwrap_or_else(|e| e.into_inner());
    last.is_some_and(|at| at.elapsed() < span)
}

/// Show the panel with its input focused (made on first use).
pub fn show<R: Runtime>(handle: &AppHandle<R>) -> tauri::Result<()> {
    match handle.get_webview_window(PANEL) {
        Some(panel) => present(&panel),
        None => {
            let shell = handle.state::<Arc<Shell>>().inner().clone();
            if !shell.window_ready() {
                tracing::info!("quick chat: the server is still starting");
                return Ok(());
            }
            present(&create(handle, &shell)?)
        }
    }
}

/// Hide the panel (Esc, or an answer opened in the chat window).
pub fn hide<R: Runtime>(handle: &AppHandle<R>) -> tauri::Result<()> {
    match handle.get_webview_window(PANEL) {
        Some(panel) => panel.hide(),
        None => Ok(()),
    }
}

/// Focus moved to another window: the panel goes, as menu-bar panels do.
pub fn blurred<R: Runtime>(panel: &Window<R>) {
    if !panel.is_visible().unwrap_or(false) {
        return;
    }
    *panel
        .state::<LastBlur>()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    if let Err(e) = panel.hide() {
        tracing::warn!("cannot hide quick chat: {e}");
    }
}

fn present<R: Runtime>(panel: &WebviewWindow<R>) -> tauri::Result<()> {
    panel.show()?;
    panel.set_always_on_top(true)?;
    panel.set_focus()?;
    panel.eval(SHOWN_SCRIPT)
}

fn create<R: Runtime>(handle: &AppHandle<R>, shell: &Shell) -> tauri::Result<WebviewWindow<R>> {
    WebviewWindowBuilder::new(handle, PANEL, WebviewUrl::App(PAGE.into()))
        .title("Seedbar Quick Chat")
        .inner_size(640.0, 400.0)
        .resizable(false)
        .decorations(false)
        .always_on_top(true)
        .skip_taskbar(true)
        .center()
        .visible(false)
        .initialization_script(shell.init_script())
        .build()
}

/// The shortcut as menus write it on this platform: `Ctrl+Shift+Space`, or on macOS
/// `Cmd+Shift+Space` (`CommandOrControl` and its short forms resolved).
pub fn display(accelerator: &str) -> String {
    let command_or_control = if cfg!(target_os = "macos") {
        "Cmd"
    } else {
        "Ctrl"
    };
    accelerator
        .split('+')
        .map(|key| match key.trim().to_ascii_lowercase().as_str() {
            "commandorcontrol" | "commandorctrl" | "cmdorctrl" | "cmdorcontrol" => {
                command_or_control.to_string()
            }
            "control" | "ctrl" => "Ctrl".to_string(),
            "command" | "cmd" | "super" => "Cmd".to_string(),
            "option" | "alt" => if cfg!(target_os = "macos") {
                "Option"
            } else {
                "Alt"
            }
            .to_string(),
            "shift" => "Shift".to_string(),
            _ => key.trim().to_string(),
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// `accelerator` as a shortcut, or what is wrong with it.
pub fn parse(accelerator: &str) -> Result<Shortcut, String> {
    accelerator.parse::<Shortcut>().map_err(|e| {
        format!(
            "“{accelerator}” is not a shortcut ({e}); write modifiers and one key, like \
             CommandOrControl+Shift+Space"
        )
    })
}

/// Make `accelerator` (`""` for none) quick chat's global shortcut in place of the one in
/// use, and record the outcome in the shell (the tray's label, the Settings view's
/// message). Does nothing where the shortcut plugin is not registered (the mock runtime).
///
/// Never call it on the main thread: the plugin registers there and waits for it. It
/// releases the old shortcut by itself (its `unregister_all` holds the plugin's lock while
/// it waits on the main thread, which can deadlock with a key event that needs the lock).
pub fn bind<R: Runtime>(handle: &AppHandle<R>, accelerator: &str) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    let Some(shortcuts) = handle.try_state::<tauri_plugin_global_shortcut::GlobalShortcut<R>>()
    else {
        return;
    };
    let bound = shell.quick_chat();
    if bound.shortcut == accelerator {
        return;
    }
    if let (None, Ok(old)) = (&bound.problem, parse(bound.shortcut.trim())) {
        if let Err(e) = shortcuts.unregister(old) {
            tracing::warn!("cannot release quick chat's shortcut: {e}");
        }
    }
    let registered = match accelerator.trim() {
        "" => Ok(None),
        text => parse(text).and_then(|shortcut| {
            shortcuts
                .on_shortcut(shortcut, |handle, _, event| {
                    if event.state == ShortcutState::Pressed {
                        // On the main thread: the key's thread must not wait for it.
                        let on_main = handle.clone();
                        let _ = handle.run_on_main_thread(move || {
                            if let Err(e) = toggle(&on_main) {
                                tracing::error!("cannot open quick chat: {e}");
                            }
                        });
                    }
                })
                .map(|()| Some(display(text)))
                .map_err(|e| refused(&display(text), &e.to_string()))
        }),
    };
    let (label, problem) = match registered {
        Ok(label) => (label, None),
        Err(problem) => {
            tracing::warn!("quick chat: {problem}");
            (None, Some(problem))
        }
    };
    let key = QuickChatKey {
        shortcut: accelerator.to_string(),
        problem,
    };
    shell.set_quick_chat(key, label);
}

/// Why the system refused a shortcut, in words: most often another app holds it.
fn refused(shortcut: &str, error: &str) -> String {
    if error.to_ascii_lowercase().contains("already registered") {
        format!("{shortcut} is in use by another app; choose another shortcut in Settings")
    } else {
        format!("cannot register {shortcut} ({error}); choose another shortcut in Settings")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortcuts_read_as_menus_write_them() {
        let ctrl = if cfg!(target_os = "macos") {
            "Cmd"
        } else {
            "Ctrl"
        };
        assert_eq!(
            display("CommandOrControl+Shift+Space"),
            format!("{ctrl}+Shift+Space")
        );
        assert_eq!(display("ctrl+alt+K").replace("Option", "Alt"), "Ctrl+Alt+K");
    }

    #[test]
    fn bad_shortcuts_say_what_is_wrong() {
        assert!(parse("CommandOrControl+Shift+Space").is_ok());
        assert!(parse("Alt+Space").is_ok());
        let problem = parse("Ctrl+Shift").unwrap_err();
        assert!(
            problem.contains("“Ctrl+Shift” is not a shortcut"),
            "{problem}"
        );
        assert!(parse("Ctrl+Banana").unwrap_err().contains("Banana"));
        assert_eq!(
            refused("Ctrl+Space", "HotKey already registered: HotKey { .. }"),
            "Ctrl+Space is in use by another app; choose another shortcut in Settings"
        );
    }
}

//! The app settings (`/app/settings`, saved in the store's SQLite database by the server):
//! port, key, origins, the default model and "Start minimized" are read once before the
//! server starts; "Show in Dock", "Show the menu-bar icon", "Launch at login" and quick
//! chat's shortcut are applied at start and again whenever they change.

use std::{path::Path, sync::Arc};

use tauri::{AppHandle, Manager, Runtime};

use crate::{quick_chat, tray};

/// The saved settings that matter before the server starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub port: Option<u16>,
    pub api_key: Option<String>,
    pub allowed_origins: Vec<String>,
    pub desktop: Desktop,
    /// Quick chat's global shortcut (`""` for none).
    pub quick_chat_shortcut: String,
    /// The model chosen as the default (in the tray or the settings), if any.
    pub default_model: Option<String>,
    /// Start with the window closed.
    pub start_minimized: bool,
}

impl Default for Saved {
    fn default() -> Self {
        Saved {
            port: None,
            api_key: None,
            allowed_origins: Vec::new(),
            desktop: Desktop::default(),
            quick_chat_shortcut: seedbar_chats::DEFAULT_QUICK_CHAT_SHORTCUT.to_string(),
            default_model: None,
            start_minimized: false,
        }
    }
}

/// The settings the shell itself applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desktop {
    /// macOS: a Dock icon (regular app) besides the menu-bar item.
    pub show_in_dock: bool,
    pub launch_at_login: bool,
    /// The tray / menu-bar icon; without it the app has a Dock icon on macOS, and opens
    /// from the launcher (a second launch shows the window) and the global shortcut.
    pub show_menu_bar_icon: bool,
}

impl Default for Desktop {
    fn default() -> Self {
        Desktop {
            show_in_dock: false,
            launch_at_login: false,
            show_menu_bar_icon: true,
        }
    }
}

impl Desktop {
    fn of(settings: &seedbar_chats::AppSettings) -> Desktop {
        Desktop {
            show_in_dock: settings.show_in_dock,
            launch_at_login: settings.launch_at_login,
            show_menu_bar_icon: settings.show_menu_bar_icon,
        }
    }
}

impl Saved {
    /// The settings saved in the data directory `root`; defaults when there are none or
    /// they cannot be read (the server reports a broken database itself).
    pub fn load(root: &Path) -> Saved {
        let path = root.join(seedbar_chats::DATABASE_FILE);
        if !path.exists() {
            return Saved::default();
        }
        match seedbar_chats::ChatStore::open(&path).and_then(|store| store.app_settings()) {
            Ok(Some(s)) => Saved {
                port: Some(s.port),
                desktop: Desktop::of(&s),
                api_key: Some(s.api_key).filter(|k| !k.is_empty()),
                allowed_origins: s.allowed_origins,
                quick_chat_shortcut: s.quick_chat_shortcut,
                default_model: Some(s.default_model).filter(|m| !m.is_empty()),
                start_minimized: s.start_minimized,
            },
            Ok(None) => Saved::default(),
            Err(e) => {
                tracing::warn!("cannot read the saved settings in {}: {e}", path.display());
                Saved::default()
            }
        }
    }
}

/// Apply the desktop settings: the Dock icon (macOS), the menu-bar icon and the login item.
pub fn apply<R: Runtime>(handle: &AppHandle<R>, desktop: Desktop) {
    tray::show(handle, desktop.show_menu_bar_icon);
    #[cfg(target_os = "macos")]
    {
        // Without a menu-bar icon the Dock's is the way back to the app.
        let policy = if desktop.show_in_dock || !desktop.show_menu_bar_icon {
            tauri::ActivationPolicy::Regular
        } else {
            tauri::ActivationPolicy::Accessory
        };
        if let Err(e) = handle.set_activation_policy(policy) {
            tracing::warn!("cannot change the Dock icon: {e}");
        }
    }
    // The login item, through the autostart plugin (registered by the real app only).
    if let Some(autostart) = handle.try_state::<tauri_plugin_autostart::AutoLaunchManager>() {
        let result = match (desktop.launch_at_login, autostart.is_enabled()) {
            (true, Ok(false)) => autostart.enable(),
            (false, Ok(true)) => autostart.disable(),
            (_, Err(e)) => Err(e),
            _ => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!("cannot change the login item: {e}");
        }
    }
}

/// Apply the server's settings now and on every change, for as long as it runs.
pub fn follow<R: Runtime>(handle: &AppHandle<R>, app: &Arc<seedbar_server::App>) {
    let mut changes = app.subscribe_settings();
    let handle = handle.clone();
    tauri::async_runtime::spawn(async move {
        let mut applied = None;
        loop {
            let (desktop, shortcut) = {
                let s = changes.borrow_and_update();
                (Desktop::of(&s), s.quick_chat_shortcut.clone())
            };
            if applied != Some(desktop) {
                apply(&handle, desktop);
                applied = Some(desktop);
            }
            quick_chat::bind(&handle, &shortcut);
            if changes.changed().await.is_err() {
                break;
            }
        }
    });
}

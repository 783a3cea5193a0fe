//! The tray / menu-bar item: the native menu drawn from the `TrayModel`, redrawn on every
//! change, and what its items do.

use std::{sync::Arc, time::Duration};

use tauri::{
    image::Image,
    menu::{CheckMenuItem, IsMenuItem, Menu, MenuItem, MenuItemKind, PredefinedMenuItem, Submenu},
    tray::TrayIconBuilder,
    AppHandle, Manager, Runtime,
};

use crate::{
    quick_chat,
    shell::Shell,
    tray_model::{conversation_route, pick_of, route_of, Action, Entry, Pick, TrayModel},
    window,
};

pub const TRAY_ID: &str = "seedbar";

/// How long Quit waits for the server's streams to end before leaving anyway.
const QUIT_WAIT: Duration = Duration::from_secs(6);

/// macOS draws template icons in the menu bar's colour; elsewhere panels are dark or
/// light, so the icon carries its own colour.
#[cfg(target_os = "macos")]
const ICON: &[u8] = include_bytes!("../../icons/tray-template-32@2x.png");
#[cfg(not(target_os = "macos"))]
const ICON: &[u8] = include_bytes!("../../icons/tray-color-32@2x.png");

/// Menu text: `&` would mark a mnemonic.
fn menu_text(text: &str) -> String {
    text.replace('&', "&&")
}

/// The native menu for a model.
pub fn build_menu<R: Runtime>(handle: &AppHandle<R>, model: &TrayModel) -> tauri::Result<Menu<R>> {
    let menu = Menu::new(handle)?;
    for entry in model.entries() {
        menu.append(&native_item(handle, &entry)? as &dyn IsMenuItem<R>)?;
    }
    Ok(menu)
}

/// The native item for an entry (a submenu with its items).
fn native_item<R: Runtime>(handle: &AppHandle<R>, entry: &Entry) -> tauri::Result<MenuItemKind<R>> {
    let plain = |text: &str, enabled| {
        MenuItem::with_id(handle, entry.id(), menu_text(text), enabled, None::<&str>)
            .map(MenuItemKind::MenuItem)
    };
    match entry {
        Entry::Info { text, .. } => plain(text, false),
        Entry::Item { label, enabled, .. } => plain(label, *enabled),
        Entry::Unload { model } => plain(&format!("Unload {model}"), true),
        Entry::Recent(recent) => plain(&recent.title, true),
        Entry::DefaultModel { model, current } => CheckMenuItem::with_id(
            handle,
            entry.id(),
            menu_text(model),
            true,
            *current,
            None::<&str>,
        )
        .map(MenuItemKind::Check),
        Entry::Submenu { label, entries, .. } => {
            let submenu = Submenu::with_id(handle, entry.id(), menu_text(label), true)?;
            for inner in entries {
                submenu.append(&native_item(handle, inner)? as &dyn IsMenuItem<R>)?;
            }
            Ok(MenuItemKind::Submenu(submenu))
        }
        Entry::Separator => PredefinedMenuItem::separator(handle).map(MenuItemKind::Predefined),
    }
}

/// Show or hide the tray item (the "Show the menu-bar icon" setting), putting it up the
/// first time it shows.
pub fn show<R: Runtime>(handle: &AppHandle<R>, visible: bool) {
    let result = match handle.tray_by_id(TRAY_ID) {
        Some(tray) => tray.set_visible(visible),
        None if visible => create(handle),
        None => Ok(()),
    };
    if let Err(e) = result {
        // Without a tray host the window and a second launch still work.
        tracing::warn!("no tray item: {e}");
    }
}

/// Put the tray item up, and redraw it whenever the shell's state changes.
pub fn create<R: Runtime>(handle: &AppHandle<R>) -> tauri::Result<()> {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    let model = shell.model();
    TrayIconBuilder::with_id(TRAY_ID)
        .icon(Image::from_bytes(ICON)?)
        .icon_as_template(cfg!(target_os = "macos"))
        .tooltip(model.tooltip())
        .menu(&build_menu(handle, &model)?)
        .show_menu_on_left_click(true)
        .on_menu_event(|handle, event| {
            let id = event.id().as_ref();
            if let Some(action) = Action::from_id(id) {
                perform(handle, action);
            } else if let Some(pick) = pick_of(id) {
                picked(handle, pick);
            }
        })
        .build(handle)?;

    let mut changes = shell.subscribe();
    let handle = handle.clone();
    tauri::async_runtime::spawn(async move {
        let mut drawn = None;
        while changes.changed().await.is_ok() {
            let model = changes.borrow_and_update().clone();
            if let Err(e) = redraw(&handle, &model, &mut drawn) {
                tracing::warn!("cannot update the tray menu: {e}");
            }
        }
    });
    Ok(())
}

/// An entry's id and whether it is enabled.
type Shape = (String, bool);

/// The menu on the tray and the entries it was built for.
type Drawn<R> = Option<(Menu<R>, Vec<Shape>)>;

/// An entry without its live text. The menu is rebuilt only when these change: a rebuilt
/// menu closes if it is open, so the live lines (chats, tokens/s, download %) are
/// relabelled in place, and a click on the open menu still lands. A submenu's shape holds
/// its items' (a conversation's with its title, a model choice's with its check).
fn shape(entry: &Entry) -> Shape {
    match entry {
        Entry::Item { enabled, .. } => (entry.id(), *enabled),
        Entry::DefaultModel { current, .. } => (entry.id(), *current),
        Entry::Recent(recent) => (format!("{}:{}", entry.id(), recent.title), true),
        Entry::Unload { .. } => (entry.id(), true),
        Entry::Submenu { entries, .. } => {
            let inner: Vec<String> = entries.iter().map(|e| format!("{:?}", shape(e))).collect();
            (format!("{}[{}]", entry.id(), inner.join(",")), true)
        }
        Entry::Info { .. } | Entry::Separator => (entry.id(), false),
    }
}

/// Bring the tray up to `model`: relabel the menu `drawn` holds when its entries are the
/// same, else build a new one.
fn redraw<R: Runtime>(
    handle: &AppHandle<R>,
    model: &TrayModel,
    drawn: &mut Drawn<R>,
) -> tauri::Result<()> {
    let Some(tray) = handle.tray_by_id(TRAY_ID) else {
        return Ok(());
    };
    let entries = model.entries();
    let shapes: Vec<_> = entries.iter().map(shape).collect();
    match drawn {
        Some((menu, drawn_shapes)) if *drawn_shapes == shapes => {
            for entry in &entries {
                let text = match entry {
                    Entry::Info { text, .. } => text,
                    Entry::Item { label, .. } => label,
                    _ => continue,
                };
                let id = entry.id();
                if let Some(item) = menu.get(&id).as_ref().and_then(|k| k.as_menuitem()) {
                    if item.text()? != menu_text(text) {
                        item.set_text(menu_text(text))?;
                    }
                }
            }
        }
        _ => {
            let menu = build_menu(handle, model)?;
            tray.set_menu(Some(menu.clone()))?;
            *drawn = Some((menu, shapes));
        }
    }
    tray.set_tooltip(Some(model.tooltip()))?;
    // The menu bar shows text beside the icon on macOS only (elsewhere: the tooltip).
    #[cfg(target_os = "macos")]
    tray.set_title(model.title())?;
    Ok(())
}

/// Do what a menu item says.
pub fn perform<R: Runtime>(handle: &AppHandle<R>, action: Action) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    let result = match action {
        Action::OpenChat | Action::NewChat | Action::Settings => {
            window::show(handle, route_of(action).unwrap_or_default()).map_err(|e| e.to_string())
        }
        Action::QuickChat => quick_chat::show(handle).map_err(|e| e.to_string()),
        Action::CopyEndpoint => shell.copy_endpoint().map(|url| {
            tracing::info!("copied {url}");
        }),
        Action::TogglePause => shell.toggle_paused().map(|status| {
            tracing::info!(
                "server {}",
                if status.paused { "paused" } else { "resumed" }
            );
        }),
        Action::Quit => {
            quit(handle);
            Ok(())
        }
    };
    if let Err(e) = result {
        tracing::error!("{}: {e}", action.id());
    }
}

/// Do what a model's or a conversation's item says: unload the model, make it the default,
/// or open the conversation.
fn picked<R: Runtime>(handle: &AppHandle<R>, pick: Pick) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    let result = match pick {
        Pick::Unload(model) => shell.unload(model),
        Pick::Default(model) => shell.set_default_model(model),
        Pick::Recent(id) => {
            window::show(handle, &conversation_route(id)).map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(()) => tracing::info!("tray: {pick:?}"),
        Err(e) => tracing::error!("tray: {pick:?}: {e}"),
    }
}

/// Stop the server (streams get a short grace) and leave.
pub fn quit<R: Runtime>(handle: &AppHandle<R>) {
    let shell = handle.state::<Arc<Shell>>().inner().clone();
    let mut stopped = shell.stop();
    let handle = handle.clone();
    tauri::async_runtime::spawn(async move {
        let _ = tokio::time::timeout(QUIT_WAIT, stopped.wait_for(|done| *done)).await;
        handle.exit(0);
    });
}

/// Stop the server and wait for it on this thread (at most as long as Quit does), for an
/// exit that nothing can delay or run async work after: macOS's Cmd+Q and the Dock's Quit.
/// Polls a flag rather than blocking on the async runtime, whose workers may be busy.
/// Returns at once when the server is not running (after Quit or a signal).
pub fn stop_and_wait<R: Runtime>(handle: &AppHandle<R>) {
    let stopped = handle.state::<Arc<Shell>>().stop();
    let deadline = std::time::Instant::now() + QUIT_WAIT;
    while !*stopped.borrow() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

import { useEffect, useState } from 'preact/hooks';
import { client, errorText, loadModels, loadStatus, saveAppSettings } from '../actions';
import { useAppState } from '../store';
import type { AppSettings } from '../types';
import { defaultModelChoices } from '../welcome';

export function checkPort(text: string): string | null {
  const port = Number(text);
  if (!/^\d+$/.test(text.trim()) || !Number.isInteger(port) || port < 0 || port > 65535) return 'The port is a whole number from 0 to 65535 (0 picks a free one at each start).';
  return null;
}

/** A whole number from 0 to `max`, or the message `what` needs. */
function checkWhole(text: string, max: number, what: string): string | null {
  const n = Number(text);
  return /^\d+$/.test(text.trim()) && Number.isInteger(n) && n <= max ? null : what;
}

export const checkDiskCache = (text: string) => checkWhole(text, 4096, 'The prompt cache on disk is a whole number of gigabytes, up to 4096 (0 keeps none).');
export const checkIdleMinutes = (text: string) => checkWhole(text, 10080, 'Idle minutes are a whole number, up to 10080 (a week; 0 keeps models until their room is needed).');

export function parseOrigins(text: string): { origins: string[]; error: string | null } {
  const origins = text.split(/[\n,]/).map((o) => o.trim()).filter(Boolean);
  for (const origin of origins) {
    if (!/^[a-z][a-z0-9+.-]*:\/\/[^/\s?#]+\/?$/i.test(origin)) {
      return { origins, error: `“${origin}” is not an origin (scheme://host[:port], like http://localhost:3000).` };
    }
  }
  return { origins, error: null };
}

const isMac = /Mac/i.test(navigator.platform || navigator.userAgent);

type ShortcutState = { shortcut: string; problem: string | null };

/**
 * Quick chat's shortcut as the shell registered it (the app window only; null in a
 * browser): polls briefly until the shell has taken up `wanted`.
 */
async function shellShortcut(wanted?: string): Promise<ShortcutState | null> {
  const ipc = window.__TAURI_INTERNALS__;
  if (!ipc) return null;
  for (let tries = 0; ; tries++) {
    const status = (await ipc.invoke('shell_status')) as { quick_chat: ShortcutState };
    if (wanted === undefined || status.quick_chat.shortcut === wanted || tries >= 20) return status.quick_chat;
    await new Promise((r) => setTimeout(r, 100));
  }
}

const STATE_NAMES = { ready: 'Serving', loading: 'Loading model…', downloading: 'Downloading model…', no_model: 'No model', error: 'Error' } as const;

export function SettingsView() {
  const { status, models } = useAppState();
  const [saved, setSaved] = useState<AppSettings | null>(null);
  const [form, setForm] = useState<ReturnType<typeof toForm> | null>(null);
  const [shortcut, setShortcut] = useState<ShortcutState | null>(null);
  const [loadError, setLoadError] = useState<string | null>(null);
  const [saveError, setSaveError] = useState<string | null>(null);
  const [message, setMessage] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [showKey, setShowKey] = useState(false);

  const load = async () => {
    setLoadError(null);
    try {
      const settings = await client.getSettings();
      setSaved(settings);
      setForm(toForm(settings));
      setShortcut(await shellShortcut().catch(() => null));
    } catch (error) {
      setLoadError(errorText(error));
    }
  };
  useEffect(() => {
    void load();
    void loadStatus();
    void loadModels();
  }, []);

  if (loadError) {
    return (
      <section class="page" data-testid="app-settings">
        <header class="page-head"><h1>Settings</h1></header>
        <p class="error-box" role="alert" data-testid="settings-error">{loadError}</p>
        <button type="button" class="button" onClick={() => void load()}>Try again</button>
      </section>
    );
  }
  if (!form || !saved) {
    return <section class="page" data-testid="app-settings"><header class="page-head"><h1>Settings</h1></header><p class="muted">Loading…</p></section>;
  }

  const portError = checkPort(form.port);
  const diskError = checkDiskCache(form.prompt_cache_disk_gb);
  const idleError = checkIdleMinutes(form.unload_idle_minutes);
  const { origins, error: originError } = parseOrigins(form.origins);
  const dirty = JSON.stringify(fromForm(form, origins)) !== JSON.stringify(saved);
  const restartNeeded = form.port !== String(saved.port) || form.api_key !== saved.api_key || form.origins !== saved.allowed_origins.join('\n');

  const save = async () => {
    if (portError || originError || diskError || idleError) return;
    setBusy(true);
    setSaveError(null);
    setMessage(null);
    try {
      const next = await saveAppSettings(fromForm(form, origins));
      setSaved(next);
      setForm(toForm(next));
      if (next.default_model !== saved.default_model) void loadStatus();
      setShortcut(await shellShortcut(next.quick_chat_shortcut).catch(() => null));
      setMessage(restartNeeded ? 'Saved. The port, API key and allowed origins apply the next time Seedbar starts.' : 'Saved.');
    } catch (error) {
      setSaveError(errorText(error));
    } finally {
      setBusy(false);
    }
  };

  const set = (patch: Partial<typeof form>) => {
    setForm({ ...form, ...patch });
    setMessage(null);
  };

  return (
    <section class="page" data-testid="app-settings" aria-labelledby="settings-title">
      <header class="page-head"><h1 id="settings-title">Settings</h1></header>
      {status && (
        <div class={`status-card ${status.state}`} data-testid="server-status">
          <strong>{STATE_NAMES[status.state]}</strong>
          <span>{status.model ?? status.problem}</span>
          {status.endpoint && <code>{status.endpoint}</code>}
          {status.message && <span class="muted">{status.message}</span>}
        </div>
      )}
      <form class="settings-form" onSubmit={(e) => { e.preventDefault(); void save(); }}>
        <fieldset>
          <legend>Local API server</legend>
          <p class="muted small">These apply the next time Seedbar starts.</p>
          <label class="field">
            <span>Port</span>
            <input type="number" min={0} max={65535} data-testid="settings-port" value={form.port} aria-invalid={portError ? 'true' : undefined}
              onInput={(e) => set({ port: e.currentTarget.value })} />
            {portError && <small class="field-error" role="alert">{portError}</small>}
          </label>
          <label class="field">
            <span>API key</span>
            <div class="inline">
              <input type={(showKey ? 'text' : 'password') as 'text'} data-testid="settings-api-key" value={form.api_key} autocomplete="off" spellcheck={false}
                placeholder="None: any program on this computer can call the API" onInput={(e) => set({ api_key: e.currentTarget.value })} />
              <button type="button" class="button" onClick={() => setShowKey(!showKey)} aria-pressed={showKey}>{showKey ? 'Hide' : 'Show'}</button>
              <button type="button" class="button" data-testid="settings-generate-key" onClick={() => set({ api_key: generateKey() })}>Generate</button>
            </div>
          </label>
          <label class="field">
            <span>Allowed web origins (CORS), one per line</span>
            <textarea rows={3} data-testid="settings-origins" value={form.origins} placeholder="http://localhost:3000" spellcheck={false}
              aria-invalid={originError ? 'true' : undefined} onInput={(e) => set({ origins: e.currentTarget.value })} />
            {originError && <small class="field-error" role="alert">{originError}</small>}
          </label>
        </fieldset>
        <fieldset>
          <legend>App</legend>
          <label class="check">
            <input type="checkbox" data-testid="settings-dock" checked={form.show_in_dock} onChange={(e) => set({ show_in_dock: e.currentTarget.checked })} />
            <span>Show in the Dock{!isMac && <small class="muted"> (macOS)</small>}</span>
          </label>
          <label class="check">
            <input type="checkbox" data-testid="settings-login" checked={form.launch_at_login} onChange={(e) => set({ launch_at_login: e.currentTarget.checked })} />
            <span>Open at login</span>
          </label>
          <label class="check">
            <input type="checkbox" data-testid="settings-start-minimized" checked={form.start_minimized} onChange={(e) => set({ start_minimized: e.currentTarget.checked })} />
            <span>Start minimized</span>
          </label>
          <div class="field">
            <label class="check">
              <input type="checkbox" data-testid="settings-menu-bar-icon" checked={form.show_menu_bar_icon} onChange={(e) => set({ show_menu_bar_icon: e.currentTarget.checked })} />
              <span>Show the menu-bar icon</span>
            </label>
            <small class="muted">Without it, open Seedbar from the Dock or launcher, or with the quick-chat shortcut.</small>
          </div>
          <label class="field">
            <span>Quick chat shortcut</span>
            <input data-testid="settings-quick-shortcut" value={form.quick_chat_shortcut} spellcheck={false} autocomplete="off"
              placeholder="None (the menu's Quick Chat still opens it)" onInput={(e) => set({ quick_chat_shortcut: e.currentTarget.value })} />
            <small class="muted">Opens a small panel over any app that asks the default model, like {isMac ? 'Cmd' : 'Ctrl'}+Shift+Space (written CommandOrControl+Shift+Space; Alt, Shift, Super and a key).</small>
            {shortcut?.problem && shortcut.shortcut === saved.quick_chat_shortcut && (
              <small class="field-error" role="alert" data-testid="settings-quick-shortcut-problem">{shortcut.problem}</small>
            )}
          </label>
        </fieldset>
        <fieldset>
          <legend>Engine</legend>
          <label class="field">
            <span>Default model</span>
            <select data-testid="settings-default-model" value={form.default_model} onChange={(e) => set({ default_model: e.currentTarget.value })}>
              {defaultModelChoices(models, form.default_model).map((c) => <option key={c.value} value={c.value}>{c.label}</option>)}
            </select>
            <small class="muted">Quick chat, new chats and programs that name no model use it. It loads once saved, and at every start. Automatic: the model that came with Seedbar, else one installed.</small>
          </label>
          <label class="field">
            <span>Prompt cache on disk (GB)</span>
            <input type="number" min={0} max={4096} data-testid="settings-prompt-cache-disk" value={form.prompt_cache_disk_gb}
              aria-invalid={diskError ? 'true' : undefined} onInput={(e) => set({ prompt_cache_disk_gb: e.currentTarget.value })} />
            <small class="muted">Long prompts (a conversation so far, an agent's instructions and tools) are kept in the data folder and found again after a restart, so their next reply starts at once. Replies are the same with it or without it; 0 keeps none.</small>
            {diskError && <small class="field-error" role="alert">{diskError}</small>}
          </label>
          <label class="field">
            <span>Unload idle models after (minutes)</span>
            <input type="number" min={0} max={10080} data-testid="settings-unload-idle" value={form.unload_idle_minutes}
              aria-invalid={idleError ? 'true' : undefined} onInput={(e) => set({ unload_idle_minutes: e.currentTarget.value })} />
            <small class="muted">Models other than the default one leave memory after this long without a request; 0 keeps them until their room is needed.</small>
            {idleError && <small class="field-error" role="alert">{idleError}</small>}
          </label>
          <div class="field">
            <label class="check">
              <input type="checkbox" data-testid="settings-fetch-image-urls" checked={form.fetch_image_urls} onChange={(e) => set({ fetch_image_urls: e.currentTarget.checked })} />
              <span>Fetch images from web addresses</span>
            </label>
            <small class="muted">Lets programs that call the API send an image as an http(s) address, which Seedbar then downloads. Off: images come as data or local files only, and Seedbar never reaches the network for one.</small>
          </div>
        </fieldset>
        {saveError && <p class="error-box" role="alert" data-testid="settings-save-error">{saveError}</p>}
        {message && <p class="ok-box" role="status" data-testid="settings-saved">{message}</p>}
        <div class="form-buttons">
          <button type="button" class="button" disabled={!dirty || busy} onClick={() => { setForm(toForm(saved)); setSaveError(null); }}>Revert</button>
          <button type="submit" class="button primary" data-testid="settings-save" disabled={!dirty || busy || !!portError || !!originError || !!diskError || !!idleError}>Save</button>
        </div>
      </form>
    </section>
  );
}

function toForm(s: AppSettings) {
  return {
    port: String(s.port), api_key: s.api_key, origins: s.allowed_origins.join('\n'), show_in_dock: s.show_in_dock, launch_at_login: s.launch_at_login,
    quick_chat_shortcut: s.quick_chat_shortcut, prompt_cache_disk_gb: String(s.prompt_cache_disk_gb),
    unload_idle_minutes: String(s.unload_idle_minutes), default_model: s.default_model, show_menu_bar_icon: s.show_menu_bar_icon,
    start_minimized: s.start_minimized, welcomed: s.welcomed, fetch_image_urls: s.fetch_image_urls, draft_models: s.draft_models,
  };
}

function fromForm(f: ReturnType<typeof toForm>, origins: string[]): AppSettings {
  return {
    port: Number(f.port), api_key: f.api_key, allowed_origins: origins, show_in_dock: f.show_in_dock, launch_at_login: f.launch_at_login,
    quick_chat_shortcut: f.quick_chat_shortcut.trim(), prompt_cache_disk_gb: Number(f.prompt_cache_disk_gb),
    unload_idle_minutes: Number(f.unload_idle_minutes), default_model: f.default_model, show_menu_bar_icon: f.show_menu_bar_icon,
    start_minimized: f.start_minimized, welcomed: f.welcomed, fetch_image_urls: f.fetch_image_urls, draft_models: f.draft_models,
  };
}

function generateKey(): string {
  const bytes = new Uint8Array(24);
  crypto.getRandomValues(bytes);
  return `sb-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

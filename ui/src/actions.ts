// What the UI does: every request goes through here, and every failure ends as a message
// on screen (a toast, or inline where the caller shows it).

import { ApiError, Client, apiBase, isAbort, saveApiKey, storedApiKey, type ExportFormat } from './api';
import {
  applyReplyEvent, beginReply, endReply, removeConversation, titleFrom, touchConversation, upsertConversation,
  type ReplyKind,
} from './convList';
import { drafts, imageDrafts } from './drafts';
import { getState, setState, toast, updateMessages, type Route, type WelcomeChoice } from './store';
import type { AppSettings, Conversation, ModelInfo, NewRemote, Pull, Replay, ReplyRequest, Settings } from './types';
import { runningChoice, welcomeFailure, type Choice } from './welcome';

let sessionKey: string | null = null;

export const client = new Client({
  base: apiBase(),
  apiKey: () => sessionKey ?? storedApiKey(),
  onUnauthorized: (error) => setState({ needKey: { message: error.message } }),
});

export function errorText(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message || String(error);
  return String(error);
}

/** Shows a failure (401s show the key prompt instead). */
export function report(error: unknown) {
  if (isAbort(error)) return;
  if (error instanceof ApiError && error.unauthorized) return;
  console.error(error);
  toast(errorText(error));
}

// Routes: #/c/12, #/models, #/settings.

export function parseRoute(hash: string): Route {
  const path = hash.replace(/^#\/?/, '');
  if (path === 'models') return { view: 'models' };
  if (path === 'settings') return { view: 'settings' };
  const match = /^c\/(\d+)$/.exec(path);
  return { view: 'chat', id: match ? Number(match[1]) : null };
}

export function routeHash(route: Route): string {
  if (route.view === 'chat') return route.id === null ? '#/' : `#/c/${route.id}`;
  return `#/${route.view}`;
}

/** Goes to a route; `replace` keeps it out of the back history. */
export function navigate(route: Route, replace = false) {
  const hash = routeHash(route);
  if (location.hash === hash) applyRoute(route);
  else if (replace) location.replace(hash); // hashchange calls applyRoute
  else location.hash = hash;
}

/** The app shell opens `#/new` for "New Chat" (from the menu bar). */
function onHash() {
  if (/^#\/?new$/.test(location.hash)) void newConversation(true);
  else applyRoute(parseRoute(location.hash));
}

export function applyRoute(route: Route) {
  setState({ route });
  if (route.view === 'chat' && route.id !== null) void loadConversation(route.id);
  if (route.view === 'models') {
    void loadModels();
    void loadRemotes();
  }
}

export async function init() {
  window.addEventListener('hashchange', onHash);
  onHash();
  await Promise.all([loadConversations(), loadStatus(), loadModels(), loadRemotes(), loadAppSettings()]);
}

// Conversations

let listRequest = 0;
export async function loadConversations(query = getState().query) {
  const mine = ++listRequest;
  try {
    const list = await client.listConversations(query);
    if (mine !== listRequest) return; // a later search answered first
    setState({ conversations: list, conversationsLoaded: true, conversationsError: null });
  } catch (error) {
    if (mine === listRequest) setState({ conversationsLoaded: true, conversationsError: errorText(error) });
    report(error);
  }
}

export function setQuery(query: string) {
  setState({ query });
}

function storeConversation(conversation: Conversation, addToList = true) {
  setState((s) => {
    const inList = s.conversations.some((c) => c.id === conversation.id);
    const detail = s.details[conversation.id];
    return {
      conversations: inList || addToList ? upsertConversation(s.conversations, conversation) : s.conversations,
      details: detail ? { ...s.details, [conversation.id]: { ...detail, conversation } } : s.details,
    };
  });
}

export async function loadConversation(id: number) {
  if (getState().streams[id]) return; // the stream is the fresher source
  setState((s) => ({ loadingDetail: { ...s.loadingDetail, [id]: true } }));
  try {
    const { messages, ...conversation } = await client.getConversation(id);
    setState((s) => {
      if (s.streams[id]) return {};
      return {
        details: { ...s.details, [id]: { conversation, messages } },
        // Opened from elsewhere (quick chat saved it): it joins the list too.
        conversations: upsertConversation(s.conversations, conversation),
      };
    });
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      const { route } = getState();
      const open = route.view === 'chat' && route.id === id;
      setState((s) => ({ conversations: removeConversation(s.conversations, id) }));
      if (open) {
        toast('That conversation no longer exists.');
        navigate({ view: 'chat', id: null }, true);
      }
    } else report(error);
  } finally {
    setState((s) => ({ loadingDetail: { ...s.loadingDetail, [id]: false } }));
  }
}

/** Settings for a new chat: the current chat's model and sampling (not its seed or prompt). */
function newChatSettings(): Partial<Settings> | undefined {
  const s = getState();
  const current = s.route.view === 'chat' && s.route.id !== null ? s.details[s.route.id]?.conversation : undefined;
  if (current) {
    const { model, temperature, top_p, max_tokens } = current.settings;
    return { model, temperature, top_p, max_tokens };
  }
  return undefined;
}

export async function newConversation(replaceRoute = false): Promise<Conversation | null> {
  try {
    const settings = newChatSettings();
    const conversation = await client.createConversation(settings ? { settings } : {});
    setState((s) => ({
      conversations: upsertConversation(s.conversations, conversation),
      details: { ...s.details, [conversation.id]: { conversation, messages: [] } },
      query: '',
    }));
    if (getState().query) void loadConversations('');
    navigate({ view: 'chat', id: conversation.id }, replaceRoute);
    return conversation;
  } catch (error) {
    report(error);
    if (replaceRoute) navigate({ view: 'chat', id: null }, true);
    return null;
  }
}

/** Import a JSON export chosen on disk and open it. */
export async function importConversationFile(file: File): Promise<Conversation | null> {
  let exported: unknown;
  try {
    exported = JSON.parse(await file.text());
  } catch {
    toast(`${file.name} is not a JSON export of a conversation`, 'error');
    return null;
  }
  try {
    const conversation = await client.importConversation(exported);
    setState((s) => ({ conversations: upsertConversation(s.conversations, conversation), query: '' }));
    navigate({ view: 'chat', id: conversation.id });
    return conversation;
  } catch (error) {
    report(error);
    return null;
  }
}

/** Regenerate a conversation's seeded replies; what came out, or null when it failed. */
export async function replayConversation(id: number): Promise<Replay | null> {
  try {
    return await client.replayConversation(id);
  } catch (error) {
    report(error);
    return null;
  }
}

export async function renameConversation(id: number, title: string): Promise<boolean> {
  const clean = title.trim();
  if (!clean) {
    toast('A title cannot be empty.');
    return false;
  }
  try {
    storeConversation(await client.updateConversation(id, { title: clean }, 'Renaming failed'));
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

export async function deleteConversation(id: number): Promise<boolean> {
  getState().streams[id]?.abort();
  try {
    await client.deleteConversation(id);
  } catch (error) {
    report(error);
    return false;
  }
  const { route, conversations } = getState();
  const index = conversations.findIndex((c) => c.id === id);
  setState((s) => {
    const details = { ...s.details };
    delete details[id];
    return { conversations: removeConversation(s.conversations, id), details };
  });
  if (route.view === 'chat' && route.id === id) {
    const rest = getState().conversations;
    const next = rest[Math.min(Math.max(index, 0), rest.length - 1)];
    navigate({ view: 'chat', id: next ? next.id : null });
  }
  return true;
}

/** Saves some of a conversation's settings; returns whether it worked. */
export async function updateSettings(id: number, settings: Partial<Settings>, what = 'Saving the settings failed'): Promise<boolean> {
  try {
    storeConversation(await client.updateConversation(id, { settings }, what), false);
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

// Replies

function requestBody(request: ReplyKind): ReplyRequest {
  switch (request.kind) {
    case 'send':
      return request.images?.length ? { content: request.content, images: request.images } : { content: request.content };
    case 'regenerate':
      return { regenerate: true };
    case 'edit':
      return { edit: { message_id: request.messageId, content: request.content } };
  }
}

/** Sends, regenerates or edits-and-resends; the reply streams into the conversation. */
export async function reply(id: number, request: ReplyKind): Promise<void> {
  const s = getState();
  if (s.streams[id] || !s.details[id]) return;
  const controller = new AbortController();
  const untitled = s.details[id].conversation.title === 'New chat' && request.kind === 'send';
  setState((st) => ({
    streams: { ...st.streams, [id]: controller },
    conversations: touchConversation(st.conversations, id),
  }));
  const before = getState().details[id].messages;
  updateMessages(id, (messages) => beginReply(messages, id, request));
  let events = 0;
  let refused: unknown = null;
  let stopped = false;
  try {
    await client.reply(id, requestBody(request), (event) => {
      events++;
      updateMessages(id, (messages) => applyReplyEvent(messages, id, event));
      if (event.type === 'user' && untitled && request.kind === 'send') {
        void renameConversation(id, titleFrom(request.content));
      }
    }, controller.signal);
  } catch (error) {
    if (isAbort(error)) {
      stopped = true;
      updateMessages(id, (messages) => endReply(messages, id, { stopped: true }));
    } else if (events === 0 && error instanceof ApiError && error.status >= 400) {
      // Refused before anything was stored: show why, and put things back as they were.
      refused = error;
      updateMessages(id, () => before);
    } else {
      updateMessages(id, (messages) => endReply(messages, id, { error: errorText(error) }));
    }
  } finally {
    setState((st) => {
      const streams = { ...st.streams };
      delete streams[id];
      return { streams, finished: { ...st.finished, [id]: (st.finished[id] ?? 0) + 1 } };
    });
  }
  if (refused) {
    report(refused);
    if (request.kind === 'send' && !drafts.get(id) && !imageDrafts.get(id)) {
      drafts.set(id, request.content);
      if (request.images?.length) imageDrafts.set(id, request.images);
      setState({ restoredDraft: { id, at: Date.now() } });
    }
  } else if (stopped && events === 0) {
    // Stopped before the server said anything: ask it what it kept.
    setTimeout(() => {
      if (getState().details[id]) void loadConversation(id);
    }, 400);
  }
  void loadConversations();
}

export function stop(id: number) {
  getState().streams[id]?.abort();
}

// Models

export async function loadModels() {
  try {
    setState({ models: await client.listModels() });
  } catch (error) {
    report(error);
    if (getState().models === null) setState({ models: [] });
  }
}

export async function deleteModel(name: string): Promise<boolean> {
  try {
    await client.deleteModel(name);
    setState((s) => ({ models: (s.models ?? []).filter((m) => m.name !== name) }));
    toast(`Deleted ${name}.`, 'info');
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

export async function loadPulls() {
  const before = getState().pulls;
  const pulls = await client.listPulls();
  setState({ pulls });
  const finished = pulls.some((p) => p.status === 'done' && before.find((b) => b.repo === p.repo)?.status !== 'done');
  if (finished) void loadModels();
  followWelcome(pulls);
  return pulls;
}

let pullTimer: ReturnType<typeof setTimeout> | undefined;
let pullWatch = 0;
let pullFailures = 0;
/** Reads the downloads, and again every 500 ms while one runs (the library and the welcome
 *  show them; a finished one joins the library wherever the window is). */
export async function watchPulls() {
  const mine = ++pullWatch;
  clearTimeout(pullTimer);
  try {
    const list = await loadPulls();
    if (mine !== pullWatch) return; // a later call follows them
    pullFailures = 0;
    if (list.some((p) => p.status === 'done')) void loadStatus();
    if (list.some((p) => p.status === 'downloading')) pullTimer = setTimeout(watchPulls, 500);
  } catch (error) {
    if (mine !== pullWatch) return;
    if (pullFailures++ === 0) report(error);
    if (pullFailures < 20) pullTimer = setTimeout(watchPulls, 1000);
  }
}

/** Starts a download (or finds the one of `repo` running) and follows it. */
async function startPull(repo: string): Promise<Pull> {
  const pull = await client.pullModel(repo);
  setState((s) => ({ pulls: [pull, ...s.pulls.filter((p) => p.repo !== pull.repo)] }));
  void watchPulls();
  return pull;
}

export async function pullModel(repo: string): Promise<boolean> {
  try {
    await startPull(repo);
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

export async function cancelPull(repo: string) {
  try {
    const pull = await client.cancelPull(repo);
    setState((s) => ({ pulls: s.pulls.map((p) => (p.repo === pull.repo ? pull : p)) }));
  } catch (error) {
    report(error);
  }
}

// Remote engines

export async function loadRemotes() {
  try {
    setState({ remotes: await client.listRemotes() });
  } catch (error) {
    report(error);
    if (getState().remotes === null) setState({ remotes: [] });
  }
}

/** Adds a remote engine (the server checks it answers first); the error to show when refused. */
export async function addRemote(remote: NewRemote): Promise<{ ok: true } | { ok: false; error: string }> {
  try {
    const added = await client.addRemote(remote);
    await loadRemotes();
    toast(`Added ${added.name} (${added.owner}).`, 'info');
    return { ok: true };
  } catch (error) {
    return { ok: false, error: errorText(error) };
  }
}

export async function removeRemote(name: string): Promise<boolean> {
  try {
    await client.removeRemote(name);
    setState((s) => ({ remotes: (s.remotes ?? []).filter((r) => r.name !== name) }));
    toast(`Removed ${name}.`, 'info');
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

// Status and key

let statusTimer: ReturnType<typeof setTimeout> | undefined;
/** Reads the server's status; polled until a model is ready. */
export async function loadStatus() {
  clearTimeout(statusTimer);
  try {
    const before = getState().status;
    const status = await client.status();
    setState({ status });
    // Quickly while the model is on its way; slowly while there is none (a fix made in
    // another window or tab shows here too).
    if (status.state !== 'ready') statusTimer = setTimeout(loadStatus, status.state === 'loading' || status.state === 'downloading' ? 1000 : 3000);
    if (status.state === 'ready' && before && before.state !== 'ready') void loadModels();
  } catch (error) {
    report(error);
    statusTimer = setTimeout(loadStatus, 3000);
  }
}

/** Looks for a model again: downloads the default one when none is installed. */
export async function retryModel() {
  try {
    setState({ status: await client.retryStatus() });
  } catch (error) {
    report(error);
  }
  void loadStatus();
}

/** Adds a model file or folder on this computer to the library; the model, or null when refused. */
export async function importModel(path: string): Promise<ModelInfo | null> {
  try {
    const model = await client.importModel(path.trim());
    toast(`Imported ${model.name}.`, 'info');
    await loadModels();
    void loadStatus();
    return model;
  } catch (error) {
    report(error);
    return null;
  }
}

// App settings and the first-run welcome

export async function loadAppSettings() {
  try {
    const settings = await client.getSettings();
    setState({ settings });
    if (!settings.welcomed) void loadCatalogue();
  } catch (error) {
    report(error);
  }
}

/** Saves the app's settings (the whole object; the server checks the default model). */
export async function saveAppSettings(settings: AppSettings): Promise<AppSettings> {
  const saved = await client.putSettings(settings);
  setState({ settings: saved });
  return saved;
}

/** Makes `draft` (an installed chat model; '' for none) draft for `model`: it loads with it
 * from its next request on. */
export async function setDraftModel(model: string, draft: string): Promise<boolean> {
  try {
    // The settings as the server has them now (another window may have saved others).
    const settings = await client.getSettings();
    const pairs = { ...settings.draft_models };
    if (draft) pairs[model] = draft;
    else delete pairs[model];
    await saveAppSettings({ ...settings, draft_models: pairs });
    toast(draft ? `${draft} drafts for ${model} from its next reply on.` : `${model} drafts with prompt lookup alone now.`, 'info');
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

/** Changes some settings as the server has them now (another window may have saved others). */
async function patchAppSettings(patch: Partial<AppSettings>): Promise<AppSettings> {
  return saveAppSettings({ ...(await client.getSettings()), ...patch });
}

export async function loadCatalogue() {
  try {
    setState({ catalogue: await client.getCatalogue(), catalogueError: null });
    void watchPulls();
  } catch (error) {
    setState({ catalogueError: errorText(error) });
  }
}

/** The welcome's download, as the downloads show it: once done it becomes the default model. A
 *  catalogue model still downloading after a reload is taken up again. */
function followWelcome(pulls: Pull[]) {
  const { welcome, settings, catalogue } = getState();
  if (!welcome) {
    const running = catalogue && settings && !settings.welcomed ? runningChoice(catalogue, pulls) : null;
    if (running) setState({ welcome: welcomeChoice(running, 'downloading') });
    return;
  }
  if (welcome.state !== 'downloading') return;
  const pull = pulls.find((p) => p.repo === welcome.pull);
  if (pull?.status === 'done') void makeDefault(welcome);
  else if (pull?.status === 'cancelled') setState({ welcome: null });
  else if (pull?.status === 'error') setState({ welcome: { ...welcome, state: 'failed', error: welcomeFailure(pull.error) } });
}

function welcomeChoice({ model, format }: Choice, state: 'downloading' | 'saving') {
  return { name: model.name, pull: format.pull, model_name: format.model_name, state, error: null };
}

/** The welcome's "Download": pulls the model, which then becomes the default one; a model
 *  already installed becomes the default at once. */
export async function chooseWelcomeModel(choice: Choice) {
  if (choice.format.installed) {
    await makeDefault(welcomeChoice(choice, 'saving'));
    return;
  }
  const welcome = welcomeChoice(choice, 'downloading');
  setState({ welcome });
  try {
    await startPull(choice.format.pull);
  } catch (error) {
    setState({ welcome: { ...welcome, state: 'failed', error: errorText(error) } });
  }
}

/** A model imported from the welcome becomes the default one. */
export async function welcomeImported(model: ModelInfo) {
  await makeDefault({ name: model.name, pull: '', model_name: model.name, state: 'saving', error: null });
}

/** Makes the welcome's model the default one (it loads in the background) and ends the welcome. */
async function makeDefault(choice: WelcomeChoice) {
  setState({ welcome: { ...choice, state: 'saving' } });
  try {
    await patchAppSettings({ default_model: choice.model_name, welcomed: true });
    setState({ welcome: { ...choice, state: 'done', error: null } });
    const { route } = getState();
    if (route.view !== 'chat' || route.id !== null) toast(`${choice.name} is your default model now.`, 'info');
  } catch (error) {
    setState({ welcome: { ...choice, state: 'failed', error: errorText(error) } });
  }
  void loadStatus();
}

/** Ends the welcome, keeping the models as they are. */
export async function skipWelcome() {
  try {
    await patchAppSettings({ welcomed: true });
    setState({ welcome: null });
  } catch (error) {
    report(error);
  }
}

/** Closes the welcome's "is your default model now". */
export function closeWelcome() {
  setState({ welcome: null });
}

export async function submitApiKey(key: string) {
  sessionKey = key.trim() || null;
  saveApiKey(key.trim());
  setState({ needKey: null });
  const { route } = getState();
  await Promise.all([loadConversations(), loadStatus(), loadModels(), loadRemotes(), loadAppSettings()]);
  if (route.view === 'chat' && route.id !== null) await loadConversation(route.id);
}

/** Copies text to the clipboard, with a fallback for webviews without the async API. */
/** Saves the conversation as a file (the browser's download). */
export async function exportConversation(id: number, format: ExportFormat): Promise<boolean> {
  try {
    const { name, blob } = await client.exportConversation(id, format);
    const url = URL.createObjectURL(blob);
    const link = document.createElement('a');
    link.href = url;
    link.download = name;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
    return true;
  } catch (error) {
    report(error);
    return false;
  }
}

export async function copyText(text: string, label = 'Copied'): Promise<boolean> {
  try {
    if (navigator.clipboard?.writeText) {
      await navigator.clipboard.writeText(text);
    } else {
      const area = document.createElement('textarea');
      area.value = text;
      area.setAttribute('readonly', '');
      area.style.position = 'fixed';
      area.style.opacity = '0';
      document.body.appendChild(area);
      area.select();
      const ok = document.execCommand('copy');
      area.remove();
      if (!ok) throw new Error('the clipboard is not available');
    }
    toast(label, 'info', 1500);
    return true;
  } catch (error) {
    toast(`Copying failed: ${errorText(error)}`);
    return false;
  }
}

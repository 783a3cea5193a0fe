// The app's state: one object, replaced on every change, that components read through
// useAppState(). Streams write into it per conversation, so several can run at once.

import { useEffect, useState } from 'preact/hooks';
import type { UiMessage } from './convList';
import type { AppSettings, AppStatus, Catalogue, Conversation, ModelInfo, Pull, Remote } from './types';

export type Route = { view: 'chat'; id: number | null } | { view: 'models' } | { view: 'settings' };

export type Detail = {
  conversation: Conversation;
  messages: UiMessage[];
};

export type Toast = { id: number; message: string; kind: 'error' | 'info' };

/** The welcome's chosen model: downloading, being made the default, the default, or failed. */
export type WelcomeChoice = {
  /** The catalogue's name for it ("Qwen3 4B"). */
  name: string;
  /** The pull id; "" for a model already in the library. */
  pull: string;
  /** Its name in the library. */
  model_name: string;
  state: 'downloading' | 'saving' | 'done' | 'failed';
  /** What failed, to show. */
  error: string | null;
};

export type AppState = {
  route: Route;
  conversations: Conversation[];
  conversationsLoaded: boolean;
  /** Why the list could not be loaded, if it could not. */
  conversationsError: string | null;
  query: string;
  details: Record<number, Detail>;
  /** Which conversations are loading their messages. */
  loadingDetail: Record<number, boolean>;
  /** Conversations whose reply is streaming, with the controller that stops it. */
  streams: Record<number, AbortController>;
  /** How many replies each conversation finished in this page (done, stopped or failed). */
  finished: Record<number, number>;
  /** A refused send put its text back in this conversation's composer. */
  restoredDraft: { id: number; at: number } | null;
  models: ModelInfo[] | null;
  /** Models other engines run, served here by name. */
  remotes: Remote[] | null;
  pulls: Pull[];
  toasts: Toast[];
  /** A request was refused for want of an API key. */
  needKey: { message: string } | null;
  status: AppStatus | null;
  /** The app's settings (`/app/settings`), once loaded. */
  settings: AppSettings | null;
  /** The first run's catalogue, loaded while the welcome shows; or why it could not be. */
  catalogue: Catalogue | null;
  catalogueError: string | null;
  welcome: WelcomeChoice | null;
};

export const initialState = (): AppState => ({
  route: { view: 'chat', id: null },
  conversations: [],
  conversationsLoaded: false,
  conversationsError: null,
  query: '',
  details: {},
  loadingDetail: {},
  streams: {},
  finished: {},
  restoredDraft: null,
  models: null,
  remotes: null,
  pulls: [],
  toasts: [],
  needKey: null,
  status: null,
  settings: null,
  catalogue: null,
  catalogueError: null,
  welcome: null,
});

let state = initialState();
const listeners = new Set<() => void>();

export function getState(): AppState {
  return state;
}

export function setState(update: Partial<AppState> | ((s: AppState) => Partial<AppState>)) {
  const patch = typeof update === 'function' ? update(state) : update;
  state = { ...state, ...patch };
  for (const listener of listeners) listener();
}

export function resetState() {
  state = initialState();
}

export function subscribe(listener: () => void): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/** The whole state; the component re-renders on every change (Preact batches them). */
export function useAppState(): AppState {
  const [, setTick] = useState(0);
  useEffect(() => subscribe(() => setTick((t) => t + 1)), []);
  return state;
}

/** Changes one conversation's shown messages. */
export function updateMessages(id: number, update: (messages: UiMessage[]) => UiMessage[]) {
  setState((s) => {
    const detail = s.details[id];
    if (!detail) return {};
    return { details: { ...s.details, [id]: { ...detail, messages: update(detail.messages) } } };
  });
}

let toastId = 0;
export function toast(message: string, kind: Toast['kind'] = 'error', ms = kind === 'error' ? 8000 : 3000) {
  const id = ++toastId;
  setState((s) => ({ toasts: [...s.toasts.filter((t) => t.message !== message), { id, message, kind }] }));
  if (ms > 0) setTimeout(() => dismissToast(id), ms);
}

export function dismissToast(id: number) {
  setState((s) => ({ toasts: s.toasts.filter((t) => t.id !== id) }));
}

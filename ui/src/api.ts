// The /app API client: base URL and key from the Tauri shell (window.__SEEDBAR__) or the
// page's own origin, errors turned into readable messages, and the reply stream.

import { DONE, SseParser, decodeData } from './sse';
import type {
  AppSettings, AppStatus, Catalogue, Conversation, ConversationDetail, ModelInfo, NewRemote, Pull, Remote, Replay, ReplyEvent, ReplyRequest,
  Settings, StartingMessage,
} from './types';

declare global {
  interface Window {
    __SEEDBAR__?: { api?: string; apiKey?: string };
  }
}

export const KEY_STORAGE = 'seedbar.apiKey';

/** A failed request, with the message to show. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string | null;
  constructor(message: string, status: number, code: string | null = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
  /** Refused for want of a (valid) key to this server; a remote engine refusing its own key
   *  (`upstream_unauthorized`) is not. */
  get unauthorized() {
    return this.status === 401 && this.code !== 'upstream_unauthorized';
  }
}

export type ExportFormat = 'markdown' | 'json';

export type ClientOptions = {
  base: string;
  /** The key sent as `Authorization: Bearer`, read on every request. */
  apiKey: () => string | null | undefined;
  /** Told when a request is refused for want of a (valid) key. */
  onUnauthorized?: (error: ApiError) => void;
  fetch?: typeof fetch;
};

/** Reads `{"error": {"message"}}` (or `{"error": "..."}`, or text) from a failed response. */
export async function errorFromResponse(response: Response, what: string): Promise<ApiError> {
  let message = '';
  let code: string | null = null;
  let text = '';
  try {
    text = await response.text();
  } catch {
    /* body unreadable */
  }
  if (text) {
    try {
      const body = JSON.parse(text);
      const error = body?.error;
      if (typeof error === 'string') message = error;
      else if (error && typeof error.message === 'string') {
        message = error.message;
        if (typeof error.code === 'string') code = error.code;
      } else if (typeof body?.message === 'string') message = body.message;
    } catch {
      message = text.length > 300 ? `${text.slice(0, 300)}…` : text;
    }
  }
  if (!message) message = `${response.status} ${response.statusText || 'error'}`.trim();
  return new ApiError(`${what}: ${message}`, response.status, code);
}

/** A fetch that failed before any answer (server down, network refused). */
export function networkError(error: unknown, what: string, base: string): ApiError {
  const detail = error instanceof Error && error.message ? ` (${error.message})` : '';
  return new ApiError(`${what}: cannot reach the Seedbar server at ${base}${detail}. Is it running?`, 0);
}

export function isAbort(error: unknown): boolean {
  return error instanceof DOMException ? error.name === 'AbortError' : (error as { name?: string })?.name === 'AbortError';
}

export class Client {
  readonly base: string;
  private options: ClientOptions;

  constructor(options: ClientOptions) {
    this.options = options;
    this.base = options.base.replace(/\/+$/, '');
  }

  private headers(json: boolean): Record<string, string> {
    const headers: Record<string, string> = { Accept: 'application/json' };
    if (json) headers['Content-Type'] = 'application/json';
    const key = this.options.apiKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  /** Sends a request; resolves with the parsed JSON (undefined for 204), or throws ApiError. */
  async request<T>(method: string, path: string, what: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const response = await this.send(method, path, what, body, signal);
    if (response.status === 204) return undefined as T;
    const text = await response.text();
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ApiError(`${what}: the server answered something that is not JSON`, response.status);
    }
  }

  private async send(method: string, path: string, what: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
    const doFetch = this.options.fetch ?? globalThis.fetch.bind(globalThis);
    let response: Response;
    try {
      response = await doFetch(this.base + path, {
        method,
        headers: this.headers(body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
    } catch (error) {
      if (isAbort(error)) throw error;
      throw networkError(error, what, this.base);
    }
    if (!response.ok) {
      const error = await errorFromResponse(response, what);
      if (error.unauthorized) this.options.onUnauthorized?.(error);
      throw error;
    }
    return response;
  }

  // Conversations

  listConversations(q = '') {
    const query = q.trim() ? `?q=${encodeURIComponent(q.trim())}` : '';
    return this.request<Conversation[]>('GET', `/app/conversations${query}`, 'Loading conversations failed');
  }
  createConversation(body: { title?: string; settings?: Partial<Settings>; messages?: StartingMessage[] } = {}) {
    return this.request<Conversation>('POST', '/app/conversations', 'Creating a conversation failed', body);
  }
  /** An image a user sent, as a blob URL (fetched with the API key, which an <img> cannot send). */
  async imageUrl(id: number): Promise<string> {
    const response = await this.send('GET', `/app/images/${id}`, 'Loading an image failed');
    return URL.createObjectURL(await response.blob());
  }
  getConversation(id: number) {
    return this.request<ConversationDetail>('GET', `/app/conversations/${id}`, 'Loading the conversation failed');
  }
  updateConversation(id: number, body: { title?: string; settings?: Partial<Settings> }, what = 'Saving the conversation failed') {
    return this.request<Conversation>('PATCH', `/app/conversations/${id}`, what, body);
  }
  deleteConversation(id: number) {
    return this.request<void>('DELETE', `/app/conversations/${id}`, 'Deleting the conversation failed');
  }

  /**
   * Streams a reply: calls onEvent for each event until the stream ends. Throws ApiError
   * when refused or cut off, and the AbortError when `signal` aborts (the server then
   * stores what was written as "stopped").
   */
  async reply(id: number, body: ReplyRequest, onEvent: (event: ReplyEvent) => void, signal?: AbortSignal): Promise<void> {
    const what = 'The reply failed';
    const response = await this.send('POST', `/app/conversations/${id}/reply`, what, body, signal);
    if (!response.body) throw new ApiError(`${what}: the server sent no stream`, response.status);
    await readReplyStream(response.body, onEvent, what);
  }

  /**
   * Streams a one-off answer (quick chat) from the app's copy of the OpenAI route, which
   * answers while the server is paused for outside clients: calls onPiece with each piece of
   * the answer or of the thinking before it; resolves with the seed it was sampled with.
   * Throws like `reply`.
   */
  async complete(body: CompletionRequest, onPiece: (piece: AnswerPiece) => void, signal?: AbortSignal): Promise<number | null> {
    const what = 'The answer failed';
    const response = await this.send('POST', '/app/chat/completions', what, { ...body, stream: true }, signal);
    if (!response.body) throw new ApiError(`${what}: the server sent no stream`, response.status);
    let seed: number | null = Number(response.headers.get('x-seedbar-seed') ?? NaN);
    if (!Number.isSafeInteger(seed)) seed = null;
    await readSse(response.body, what, (data) => {
      const chunk = parseEvent<CompletionChunk>(data, what);
      if (chunk === DONE) return true;
      if (chunk.error) throw new ApiError(`${what}: ${chunk.error.message}`, 200);
      const delta = chunk.choices?.[0]?.delta;
      if (delta?.reasoning_content) onPiece({ kind: 'reasoning', text: delta.reasoning_content });
      if (delta?.content) onPiece({ kind: 'content', text: delta.content });
      return false;
    });
    return seed;
  }

  /** The conversation as a file to save: Markdown, or JSON with each reply's seed and sampling. */
  async exportConversation(id: number, format: ExportFormat): Promise<{ name: string; blob: Blob }> {
    const response = await this.send('GET', `/app/conversations/${id}/export?format=${format}`, 'Exporting the conversation failed');
    const disposition = response.headers.get('Content-Disposition') ?? '';
    const name = /filename="([^"]+)"/.exec(disposition)?.[1] ?? `conversation.${format === 'json' ? 'json' : 'md'}`;
    return { name, blob: await response.blob() };
  }

  /** A JSON export (`seedbar.conversation` v1) as a new conversation. */
  importConversation(exported: unknown) {
    return this.request<Conversation>('POST', '/app/conversations/import', 'Importing the conversation failed', exported);
  }

  /** Regenerate each seeded reply and say which came out the same. */
  replayConversation(id: number) {
    return this.request<Replay>('POST', `/app/conversations/${id}/replay`, 'Replaying the conversation failed', {});
  }

  // Models

  listModels() {
    return this.request<ModelInfo[]>('GET', '/app/models', 'Loading models failed');
  }
  deleteModel(name: string) {
    return this.request<void>('DELETE', `/app/models/${encodeURIComponent(name)}`, `Deleting ${name} failed`);
  }
  pullModel(repo: string) {
    return this.request<Pull>('POST', '/app/models/pull', `Downloading ${repo} failed`, { repo });
  }
  importModel(path: string) {
    return this.request<ModelInfo>('POST', '/app/models/import', 'Importing the model failed', { path });
  }
  listPulls() {
    return this.request<Pull[]>('GET', '/app/models/pulls', 'Loading downloads failed');
  }
  cancelPull(repo: string) {
    const path = repo.split('/').map(encodeURIComponent).join('/');
    return this.request<Pull>('DELETE', `/app/models/pulls/${path}`, `Cancelling ${repo} failed`);
  }

  // Remote engines

  listRemotes() {
    return this.request<Remote[]>('GET', '/app/remotes', 'Loading remote engines failed');
  }
  /** Probes the engine, then keeps it; refused with the engine's answer (401, 502, 504...). */
  addRemote(remote: NewRemote) {
    return this.request<Remote>('POST', '/app/remotes', `Adding ${remote.name} failed`, remote);
  }
  removeRemote(name: string) {
    return this.request<void>('DELETE', `/app/remotes/${encodeURIComponent(name)}`, `Removing ${name} failed`);
  }

  // App

  getSettings() {
    return this.request<AppSettings>('GET', '/app/settings', 'Loading settings failed');
  }
  putSettings(settings: AppSettings) {
    return this.request<AppSettings>('PUT', '/app/settings', 'Saving settings failed', settings);
  }
  /** The first run's models, fitted to this machine: what fits, which is recommended. */
  getCatalogue() {
    return this.request<Catalogue>('GET', '/app/catalogue', 'Loading the model catalogue failed');
  }
  status() {
    return this.request<AppStatus>('GET', '/app/status', 'Loading the server status failed');
  }
  retryStatus() {
    return this.request<AppStatus>('POST', '/app/status/retry', 'Retrying failed');
  }
}

/** Reads a reply stream to its end, calling onEvent per event. */
export async function readReplyStream(
  body: ReadableStream<Uint8Array>,
  onEvent: (event: ReplyEvent) => void,
  what = 'The reply failed',
): Promise<void> {
  await readSse(body, what, (data) => {
    const event = parseEvent<ReplyEvent>(data, what);
    if (event === DONE) return true;
    onEvent(event);
    return event.type === 'done' || event.type === 'error';
  });
}

/** One event's data as JSON (or DONE), else an ApiError saying it is not JSON. */
function parseEvent<T>(data: string, what: string): T | typeof DONE {
  try {
    return decodeData<T>(data);
  } catch {
    throw new ApiError(`${what}: the server sent an event that is not JSON: ${data.slice(0, 120)}`, 200);
  }
}

/**
 * Reads an event stream, giving each event's data to `handle` until it returns true (the
 * stream's end); throws ApiError when the stream ends or breaks before that.
 */
async function readSse(body: ReadableStream<Uint8Array>, what: string, handle: (data: string) => boolean): Promise<void> {
  const parser = new SseParser();
  const reader = body.getReader();
  let finished = false;
  const feed = (data: string) => {
    if (!finished) finished = handle(data);
  };
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      for (const e of parser.push(value)) feed(e.data);
      if (finished) break;
    }
    if (!finished) for (const e of parser.end()) feed(e.data);
  } catch (error) {
    if (isAbort(error) || error instanceof ApiError) throw error;
    throw new ApiError(`${what}: the connection to the server was lost (${(error as Error)?.message ?? error})`, 0);
  } finally {
    if (finished) reader.cancel().catch(() => {});
    else reader.releaseLock?.();
  }
  if (!finished) throw new ApiError(`${what}: the stream ended before the reply was finished`, 0);
}

/** A part of a message with images, in OpenAI's shape. */
export type ContentPart = { type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } };

/** What quick chat asks the OpenAI route (`stream` is added). */
export type CompletionRequest = {
  model: string;
  messages: { role: 'user' | 'assistant' | 'system'; content: string | ContentPart[] }[];
  temperature: number;
  top_p: number;
  max_tokens: number;
};

/** A piece of a streamed answer: its text, or (models that think) of the thinking before it. */
export type AnswerPiece = { kind: 'content' | 'reasoning'; text: string };

type CompletionChunk = {
  choices?: { delta?: { content?: string | null; reasoning_content?: string | null } }[];
  error?: { message: string };
};

/** The API base: the shell's, else this page's origin. */
export function apiBase(): string {
  return window.__SEEDBAR__?.api ?? location.origin;
}

/**
 * The key: the app shell's (it knows the server's current key), else one the person typed
 * into the 401 prompt in this browser before.
 */
export function storedApiKey(): string | null {
  const injected = window.__SEEDBAR__?.apiKey;
  if (injected) return injected;
  try {
    return localStorage.getItem(KEY_STORAGE);
  } catch {
    return null; // storage blocked
  }
}

export function saveApiKey(key: string) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage blocked: the key lasts for this page */
  }
}

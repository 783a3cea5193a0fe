// The /app API's types, as docs/app-api.md defines them.

export type Settings = {
  model: string;
  system_prompt: string;
  temperature: number;
  top_p: number;
  max_tokens: number;
  /** The pinned seed; null when not pinned. */
  seed: number | null;
};

export type Conversation = {
  id: number;
  title: string;
  created_at: string;
  updated_at: string;
  settings: Settings;
};

export type Sampling = {
  model: string;
  temperature: number;
  top_p: number;
  max_tokens: number;
  system_prompt: string;
};

/** `streaming`: the server is still writing this reply (possibly for another window). */
export type MessageStatus = 'complete' | 'streaming' | 'stopped' | 'error';

export type Message = {
  id: number;
  conversation_id: number;
  role: 'user' | 'assistant';
  content: string;
  seed: number | null;
  sampling: Sampling | null;
  status: MessageStatus;
  created_at: string;
  /** Assistant replies of models that think: the thinking before the content (null when none). */
  reasoning: string | null;
  /** How long the model thought, in milliseconds: null when it did not, or was cut off thinking. */
  reasoning_ms: number | null;
  /** Replies: the rest of the reply's receipt (its model's weights, the engine, the backend). */
  provenance?: Provenance | null;
  /** User messages: the ids of the images sent with the text (GET /app/images/{id}). */
  images?: number[];
};

/** What replaying a conversation found (`POST /app/conversations/{id}/replay`). */
export type Replay = {
  /** Seeded, complete replies replayed, and those that came out the same. */
  total: number;
  identical: number;
  replies: {
    message_id: number;
    identical: boolean;
    content: string | null;
    reasoning: string | null;
    error: string | null;
    /** Where the reply's receipt differs from this machine's ("backend: cuda there, cpu here"). */
    differences: string[];
  }[];
};

/** What fixed a reply besides its seed and sampling (the server's `x-seedbar-*` headers). */
export type Provenance = {
  /** `sha256:` and the digest of the model's files. */
  weights: string;
  quantization: string | null;
  /** `seedbar 0.1.0 (commit)`. */
  engine: string;
  /** `cpu`, `cuda` or `metal`. */
  backend: string;
  /** OpenAI's `system_fingerprint`: changes when any of the above does. */
  fingerprint: string;
  /** Set when a remote engine made the reply (`backend` is then `remote`). */
  remote?: RemoteOrigin | null;
};

/** The engine a remote model's reply came from. */
export type RemoteOrigin = {
  engine: RemoteEngine;
  /** The engine's base URL. */
  url: string;
  /** The model id the engine knows it by. */
  model: string;
  /** Whether the engine promises the same reply for the same seed, whatever else it runs. */
  identical_seeds: boolean;
};

export type ConversationDetail = Conversation & { messages: Message[] };

export type ModelInfo = {
  name: string;
  format: 'gguf' | 'safetensors';
  bytes: number;
  quantization: string | null;
  /** GGUF's `general.architecture` or config.json's `model_type`. */
  architecture: string | null;
  /** Whether Seedbar runs that architecture. */
  supported: boolean;
  loaded: boolean;
  /** Memory it takes to load: its files and a fifth more. */
  memory_needed: number;
  /** Whether that much is free now (idle models unloaded); a load is refused if not. */
  fits: boolean;
  /** What it does, in Ollama's names: completion, tools, thinking, vision, embedding, rerank. */
  capabilities: string[];
};

export type RemoteEngine = 'seedbar' | 'vllm' | 'sglang' | 'llama-server' | 'ollama' | 'unknown';

/** A model another serving engine runs, served here under its `name` (`GET /app/remotes`). */
export type Remote = {
  name: string;
  /** The engine's base URL. */
  url: string;
  api: 'openai' | 'ollama';
  /** The model id the engine knows it by. */
  model: string;
  /** Which engine answered the probe. */
  engine: RemoteEngine;
  engine_version: string | null;
  /** Whether the engine promises the same reply for the same seed, whatever else it runs. */
  identical_seeds: boolean;
  /** What the engine is known to take. */
  supports: { seeds: boolean; tools: boolean; images: boolean; structured: boolean; reasoning: boolean };
  /** Seconds without a byte from the engine before a request is given up. */
  timeout_s: number;
  /** Whether an API key is kept for it (keys are never sent back). */
  has_key: boolean;
  /** The engine and its host, for people: `vllm at gpu-box:8000`. */
  owner: string;
};

/** What `POST /app/remotes` takes; the server probes the engine before it keeps it. */
export type NewRemote = {
  name: string;
  url: string;
  api?: Remote['api'];
  /** Empty: the one model the engine serves. */
  model?: string;
  key?: string;
  timeout_s?: number;
  identical_seeds?: boolean;
};

export type PullStatus = 'downloading' | 'done' | 'error' | 'cancelled';

export type Pull = {
  repo: string;
  status: PullStatus;
  downloaded_bytes: number;
  total_bytes: number;
  error: string | null;
};

export type AppSettings = {
  port: number;
  api_key: string;
  allowed_origins: string[];
  show_in_dock: boolean;
  launch_at_login: boolean;
  /** Quick chat's global shortcut ("" for none), like `CommandOrControl+Shift+Space`. */
  quick_chat_shortcut: string;
  /** Gigabytes of prompt KV kept on disk for later requests (0: none). */
  prompt_cache_disk_gb: number;
  /** Minutes a model other than the default stays loaded once idle (0: until its room is needed). */
  unload_idle_minutes: number;
  /** The installed chat model served by default, kept for the next start ("" picks one). */
  default_model: string;
  /** The tray (menu-bar) icon; without it the app opens from the Dock, launcher or shortcut. */
  show_menu_bar_icon: boolean;
  /** Start with the window closed. */
  start_minimized: boolean;
  /** Whether the first-run welcome was completed or skipped. */
  welcomed: boolean;
  /** Whether image parts given by http(s) addresses are fetched (off: refused). */
  fetch_image_urls: boolean;
  /** Each chat model's draft model for speculative decoding, by the model's name. */
  draft_models: Record<string, string>;
};

export type Backend = 'cpu' | 'cuda' | 'metal';

export type SizeClass = '1-2B' | '3-4B' | '7-9B';

/** One way to download a catalogue model. */
export type CatalogueFormat = {
  format: 'mlx-4bit' | 'gguf-q4_k_m';
  /** What `POST /app/models/pull` takes: `org/name` or `org/name:file.gguf`. */
  pull: string;
  /** About what the download is (the pull shows the exact total). */
  download_bytes: number;
  /** Its name in the library once pulled. */
  model_name: string;
  /** Memory it takes to load. */
  memory_bytes: number;
  /** Whether that much is free now. */
  fits: boolean;
  installed: boolean;
  /** The one format the catalogue recommends on this machine. */
  recommended: boolean;
};

export type CatalogueModel = {
  name: string;
  family: string;
  parameters_b: number;
  size_class: SizeClass;
  architecture: string;
  thinks: boolean;
  /** What it is good at, in a line. */
  about: string;
  formats: CatalogueFormat[];
};

/** The first run's models, fitted to this machine (`GET /app/catalogue`). */
export type Catalogue = {
  memory_bytes: number;
  backend: Backend;
  /** The size class recommended here. */
  size_class: string;
  models: CatalogueModel[];
};

/** A message a new conversation starts with (quick chat's question and answer). */
export type StartingMessage = { role: 'user' | 'assistant'; content: string; seed?: number; images?: string[] };

export type ModelState = 'no_model' | 'downloading' | 'loading' | 'ready' | 'error';

export type FixAction = 'import' | 'retry_download';

export type AppStatus = {
  /** What the default model is doing; the API answers in every state. */
  state: ModelState;
  /** The default model (downloading, loading or ready), when there is one. */
  model: string | null;
  /** A download's progress. */
  percent: number | null;
  /** What is wrong (no_model, error), and what to do about it. */
  problem: string | null;
  fix: string | null;
  actions: FixAction[];
  endpoint: string | null;
  paused: boolean;
  /** Why it is paused, when it is. */
  message: string | null;
};

/** One event of the reply stream (POST /app/conversations/{id}/reply). */
export type ReplyEvent =
  | { type: 'user'; message: Message }
  | { type: 'start'; message_id: number; seed: number }
  /** A piece of the thinking (models that think), before any delta of the answer. */
  | { type: 'reasoning'; text: string }
  | { type: 'delta'; text: string }
  | { type: 'done'; message: Message }
  | { type: 'error'; message: string };

export type ReplyRequest =
  | { content: string; images?: string[] }
  | { regenerate: true }
  | { edit: { message_id: number; content: string } };

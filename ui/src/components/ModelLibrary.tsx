import { useEffect, useState } from 'preact/hooks';
import {
  addRemote, cancelPull, deleteModel, importModel, loadAppSettings, loadModels, loadRemotes, pullModel, removeRemote, report,
  setDraftModel, watchPulls,
} from '../actions';
import { hasNativePicker, pickModelPath } from '../picker';
import { checkRepoId, formatBytes } from '../format';
import { checkRemoteForm, newRemoteOf, seedBadge, seedPromise, type RemoteForm } from '../remote';
import { useAppState } from '../store';
import type { ModelInfo, Pull, Remote } from '../types';
import { confirmAction } from './Dialogs';
import { IconClose, IconDownload, IconTrash } from './icons';

/** The capability badges: the label, and what it means. */
const CAPABILITIES: Record<string, [string, string]> = {
  thinking: ['thinks', 'Reasons before it answers; the chat shows its thinking apart'],
  tools: ['tools', 'Its chat template calls tools'],
  vision: ['sees', 'Reads images'],
  embedding: ['embeds', 'An embedding model: /v1/embeddings and /api/embed'],
  rerank: ['reranks', 'A reranker: /v1/rerank'],
};

export function ModelLibrary() {
  const { models, pulls, status, settings } = useAppState();
  const [repo, setRepo] = useState('');
  const [repoError, setRepoError] = useState<string | null>(null);
  const [pulling, setPulling] = useState(false);

  useEffect(() => {
    void watchPulls();
    if (!settings) void loadAppSettings();
  }, []);
  const drafts = settings?.draft_models ?? {};
  // Models that may draft for another: installed chat models Seedbar runs.
  const chatModels = (models ?? []).filter((m) => m.supported && !m.capabilities.some((c) => c === 'embedding' || c === 'rerank'));

  const submit = async () => {
    const error = checkRepoId(repo);
    setRepoError(error);
    if (error) return;
    setPulling(true);
    const ok = await pullModel(repo.trim());
    setPulling(false);
    if (ok) setRepo('');
  };

  const remove = async (name: string) => {
    if (await confirmAction(`Delete ${name}?`, `The model's files will be removed from this computer. You can download it again later.`)) {
      await deleteModel(name);
    }
  };

  return (
    <section class="page" data-testid="model-library" aria-labelledby="models-title">
      <header class="page-head">
        <h1 id="models-title">Models</h1>
        <button type="button" class="button" onClick={() => { void loadModels(); void loadRemotes(); }}>Refresh</button>
      </header>

      <form class="pull-form" onSubmit={(e) => { e.preventDefault(); void submit(); }}>
        <label class="field grow">
          <span>Download from Hugging Face</span>
          <input data-testid="pull-input" placeholder="org/name, e.g. mlx-community/Qwen2.5-0.5B-Instruct-4bit" value={repo}
            spellcheck={false} autocomplete="off" aria-invalid={repoError ? 'true' : undefined}
            onInput={(e) => { setRepo(e.currentTarget.value); setRepoError(null); }} />
          {repoError && <small class="field-error" role="alert" data-testid="pull-input-error">{repoError}</small>}
        </label>
        <button type="submit" class="button primary" data-testid="pull-submit" disabled={pulling}>
          <IconDownload size={14} /> Download
        </button>
      </form>

      <ImportForm />

      {pulls.length > 0 && (
        <ul class="pulls" role="list" aria-label="Downloads">
          {pulls.map((p) => <PullRow key={p.repo} pull={p} />)}
        </ul>
      )}

      {models === null ? (
        <p class="muted">Loading models…</p>
      ) : models.length === 0 ? (
        <p class="muted" data-testid="models-empty">No models installed. Download one or import one from disk above.</p>
      ) : (
        <table class="models" data-testid="models-table">
          <thead>
            <tr><th scope="col">Name</th><th scope="col">Architecture</th><th scope="col">Format</th><th scope="col">Quantization</th><th scope="col" class="num">Size</th>
              <th scope="col" title="A smaller model of the same family that drafts tokens for it: replies are the same, faster where its guesses are kept">Draft model</th>
              <th scope="col"><span class="visually-hidden">Actions</span></th></tr>
          </thead>
          <tbody>
            {models.map((m) => (
              <tr key={m.name} data-testid="model-row" data-name={m.name}>
                <td class="model-name">
                  {m.name}
                  {m.loaded && <span class="badge" title="Loaded in memory">loaded</span>}
                  {status?.model === m.name && <span class="badge accent" title="The server's default model">default</span>}
                  {m.capabilities.filter((c) => c in CAPABILITIES).map((c) => (
                    <span key={c} class="badge" data-testid="model-capability" title={CAPABILITIES[c][1]}>{CAPABILITIES[c][0]}</span>
                  ))}
                </td>
                <td data-testid="model-architecture">
                  {m.architecture ?? 'unknown'}
                  {!m.supported && <span class="badge warning" title="Seedbar cannot run this architecture">unsupported</span>}
                </td>
                <td>{m.format === 'gguf' ? 'GGUF' : 'safetensors'}</td>
                <td>{m.quantization ?? 'none'}</td>
                <td class="num">
                  {formatBytes(m.bytes)}
                  {!m.fits && <span class="badge warning" data-testid="model-too-large"
                    title={`Loading it takes about ${formatBytes(m.memory_needed)}, more than is free now`}>too large</span>}
                </td>
                <td>
                  {chatModels.some((c) => c.name === m.name) && (
                    <select data-testid="model-draft" aria-label={`Draft model for ${m.name}`} value={drafts[m.name] ?? ''}
                      onChange={(e) => void setDraftModel(m.name, e.currentTarget.value)}>
                      <option value="">none</option>
                      {chatModels.filter((c) => c.name !== m.name).map((c) => <option key={c.name} value={c.name}>{c.name}</option>)}
                    </select>
                  )}
                </td>
                <td class="actions">
                  <button type="button" class="icon-button small" data-testid="model-delete" aria-label={`Delete ${m.name}`} title="Delete"
                    onClick={() => void remove(m.name)}><IconTrash size={14} /></button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}

      <RemoteEngines />
    </section>
  );
}

/** Models other engines run (vLLM, SGLang, llama-server, Ollama, another Seedbar): listed with
 *  where they run and whether a seed repeats a reply there, removed, and added by URL. */
function RemoteEngines() {
  const { remotes } = useAppState();
  const remove = async (name: string) => {
    if (await confirmAction(`Remove ${name}?`, `Chats can no longer pick ${name}, and its API key is forgotten. The engine itself is not touched.`, 'Remove')) {
      await removeRemote(name);
    }
  };
  return (
    <section class="remotes" data-testid="remote-engines" aria-labelledby="remotes-title">
      <h2 id="remotes-title">Remote engines</h2>
      <p class="muted small">Models another serving engine runs, chosen in chats by name like the ones on this computer.</p>
      {remotes === null ? (
        <p class="muted">Loading remote engines…</p>
      ) : remotes.length === 0 ? (
        <p class="muted" data-testid="remotes-empty">No remote engines yet.</p>
      ) : (
        <table class="models" data-testid="remotes-table">
          <thead>
            <tr><th scope="col">Name</th><th scope="col">Runs on</th><th scope="col">Model there</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr>
          </thead>
          <tbody>
            {remotes.map((r) => <RemoteRow key={r.name} remote={r} onRemove={() => void remove(r.name)} />)}
          </tbody>
        </table>
      )}
      <AddRemoteForm />
    </section>
  );
}

function RemoteRow({ remote, onRemove }: { remote: Remote; onRemove: () => void }) {
  return (
    <tr data-testid="remote-row" data-name={remote.name}>
      <td class="model-name">
        {remote.name}
        <span class="badge accent" title={`Runs on ${remote.url}`}>remote</span>
        <span class={`badge${remote.identical_seeds ? '' : ' warning'}`} data-testid="remote-seeds" title={seedPromise(remote.identical_seeds)}>
          {seedBadge(remote.identical_seeds)}
        </span>
      </td>
      <td data-testid="remote-owner" title={`${remote.url}${remote.engine_version ? ` · ${remote.engine} ${remote.engine_version}` : ''}`}>
        {remote.owner}
      </td>
      <td data-testid="remote-model">{remote.model}</td>
      <td class="actions">
        <button type="button" class="icon-button small" data-testid="remote-remove" aria-label={`Remove ${remote.name}`} title="Remove"
          onClick={onRemove}><IconTrash size={14} /></button>
      </td>
    </tr>
  );
}

const EMPTY_REMOTE: RemoteForm = { name: '', url: '', api: 'openai', model: '', key: '' };

/** Add a remote engine by URL: the server asks it for its models first, with the key given. */
function AddRemoteForm() {
  const [form, setForm] = useState<RemoteForm>(EMPTY_REMOTE);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const set = <K extends keyof RemoteForm>(field: K, value: RemoteForm[K]) => {
    setForm((f) => ({ ...f, [field]: value }));
    setError(null);
  };

  const submit = async () => {
    const problem = checkRemoteForm(form);
    setError(problem);
    if (problem) return;
    setBusy(true);
    const result = await addRemote(newRemoteOf(form));
    setBusy(false);
    if (result.ok) setForm(EMPTY_REMOTE);
    else setError(result.error);
  };

  return (
    <form class="remote-form" data-testid="remote-form" aria-labelledby="remote-form-title" aria-busy={busy ? 'true' : undefined}
      noValidate onSubmit={(e) => { e.preventDefault(); void submit(); }}>
      <h3 id="remote-form-title">Add a remote engine</h3>
      <div class="remote-fields">
        <label class="field">
          <span>Name</span>
          <input data-testid="remote-name" placeholder="e.g. gpu-qwen" value={form.name} spellcheck={false} autocomplete="off"
            onInput={(e) => set('name', e.currentTarget.value)} />
        </label>
        <label class="field wide">
          <span>URL</span>
          <input data-testid="remote-url" type="url" placeholder="http://gpu-box:8000/v1" value={form.url} spellcheck={false} autocomplete="off"
            onInput={(e) => set('url', e.currentTarget.value)} />
        </label>
        <label class="field">
          <span>Protocol</span>
          <select data-testid="remote-api" value={form.api} onChange={(e) => set('api', e.currentTarget.value as RemoteForm['api'])}>
            <option value="openai">OpenAI-compatible</option>
            <option value="ollama">Ollama</option>
          </select>
        </label>
        <label class="field">
          <span>Model id (optional)</span>
          <input data-testid="remote-model-id" placeholder="the one it serves" value={form.model} spellcheck={false} autocomplete="off"
            onInput={(e) => set('model', e.currentTarget.value)} />
        </label>
        <label class="field">
          <span>API key (optional)</span>
          <input data-testid="remote-key" type="password" value={form.key} spellcheck={false} autocomplete="off"
            onInput={(e) => set('key', e.currentTarget.value)} />
        </label>
      </div>
      <div class="remote-submit">
        <button type="submit" class="button primary" data-testid="remote-add" disabled={busy}>Add</button>
        {busy && <span class="muted small" role="status" data-testid="remote-checking">Checking the engine…</span>}
        {error && <p class="field-error" role="alert" data-testid="remote-error">{error}</p>}
      </div>
    </form>
  );
}

export function PullRow({ pull }: { pull: Pull }) {
  const known = pull.total_bytes > 0;
  const fraction = known ? Math.min(1, pull.downloaded_bytes / pull.total_bytes) : 0;
  return (
    <li class={`pull ${pull.status}`} data-testid="pull-row" data-repo={pull.repo} data-status={pull.status}>
      <div class="pull-line">
        <span class="pull-repo">{pull.repo}</span>
        <span class="pull-state">
          {pull.status === 'downloading' && (known ? `${formatBytes(pull.downloaded_bytes)} of ${formatBytes(pull.total_bytes)} · ${Math.floor(fraction * 100)}%` : `${formatBytes(pull.downloaded_bytes)}…`)}
          {pull.status === 'done' && 'Installed'}
          {pull.status === 'cancelled' && 'Cancelled'}
          {pull.status === 'error' && 'Failed'}
        </span>
        {pull.status === 'downloading' && (
          <button type="button" class="icon-button small" data-testid="pull-cancel" aria-label={`Cancel downloading ${pull.repo}`} title="Cancel"
            onClick={() => void cancelPull(pull.repo)}><IconClose size={14} /></button>
        )}
      </div>
      {pull.status === 'downloading' && (
        <progress data-testid="pull-progress" max={1} value={known ? fraction : undefined} aria-label={`Downloading ${pull.repo}`} />
      )}
      {pull.status === 'error' && (
        <p class="pull-error" role="alert" data-testid="pull-error">{pullErrorText(pull.error)}</p>
      )}
    </li>
  );
}

/** The pull's error, with a plain hint when it looks like there is no network. */
export function pullErrorText(error: string | null): string {
  const message = error?.trim() || 'The download failed.';
  const saysWhy = /internet|network connection|offline/i.test(message);
  if (!saysWhy && /network|resolve|dns|connect|unreachable|timed? ?out|no route/i.test(message)) {
    return `Can't reach Hugging Face — check your internet connection. (${message})`;
  }
  return message;
}

/**
 * Import a model already on this computer: a `.gguf` file or a model folder. The native
 * picker in the app's window; a path in a browser (and in the window, for a pasted path).
 * The library links the files where they are (no copy). `onImported`: told of the model.
 */
export function ImportForm({ onImported }: { onImported?: (model: ModelInfo) => void }) {
  const [path, setPath] = useState('');
  const [busy, setBusy] = useState(false);
  const native = hasNativePicker();

  const run = async (chosen: string) => {
    setBusy(true);
    const model = await importModel(chosen);
    setBusy(false);
    if (model) {
      setPath('');
      onImported?.(model);
    }
  };
  const pick = async (folder: boolean) => {
    try {
      const chosen = await pickModelPath(folder);
      if (chosen) await run(chosen);
    } catch (error) {
      report(error);
    }
  };

  return (
    <form class="import-form" data-testid="import-form" onSubmit={(e) => { e.preventDefault(); if (path.trim()) void run(path); }}>
      <label class="field grow">
        <span>Import from this computer</span>
        <input data-testid="import-path" placeholder="/path/to/model.gguf or a model folder (config.json, .safetensors, tokenizer.json)"
          value={path} spellcheck={false} autocomplete="off" onInput={(e) => setPath(e.currentTarget.value)} />
      </label>
      <button type="submit" class="button" data-testid="import-submit" disabled={busy || !path.trim()}>Import</button>
      {native && (
        <>
          <button type="button" class="button primary" data-testid="import-file" disabled={busy} onClick={() => void pick(false)}>Choose a file…</button>
          <button type="button" class="button" data-testid="import-folder" disabled={busy} onClick={() => void pick(true)}>Choose a folder…</button>
        </>
      )}
    </form>
  );
}

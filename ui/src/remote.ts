// Remote engines as the UI words them: the seed's promise, where a reply ran, the model
// picker's entries, and the add form's checks.

import type { Message, ModelInfo, Remote, RemoteOrigin } from './types';

/** The badge for a remote's seeds. */
export function seedBadge(identical: boolean): string {
  return identical ? 'seeds identical' : 'seeds not promised';
}

/** What a remote engine promises about seeds, said in full. */
export function seedPromise(identical: boolean): string {
  return identical ? 'This engine keeps a seeded reply the same' : 'This engine does not promise the same reply for the same seed';
}

/** Where a remote reply ran (after "Ran on"): `vllm at http://gpu-box:8000 (Qwen/Qwen3-8B)`. */
export function ranOn(remote: RemoteOrigin): string {
  return `${remote.engine} at ${remote.url} (${remote.model})`;
}

/** Whether a remote engine made the reply without promising that its seed repeats it. */
export function seedNotPromised(message: Pick<Message, 'provenance'>): boolean {
  const remote = message.provenance?.remote;
  return !!remote && !remote.identical_seeds;
}

/** What "Copy receipt" copies: the seed, the sampling and the receipt, where it ran included. */
export function receiptText(message: Pick<Message, 'seed' | 'sampling' | 'provenance'>): string {
  const { remote, ...provenance } = message.provenance ?? {};
  const receipt: Record<string, unknown> = { seed: message.seed, ...(message.sampling ?? {}), ...provenance };
  if (remote) receipt.remote = { ...remote, ran_on: ranOn(remote), seed_promise: seedPromise(remote.identical_seeds) };
  return JSON.stringify(receipt, null, 2);
}

export type ModelChoice = { value: string; label: string };

/**
 * The model picker's entries: local models by name, then remote ones marked with where
 * they run; the current model first, as not installed, when it is neither.
 */
export function modelChoices(models: ModelInfo[] | null, remotes: Remote[] | null, current: string): ModelChoice[] {
  const choices: ModelChoice[] = [
    ...(models ?? []).map((m) => ({ value: m.name, label: m.name })),
    ...(remotes ?? []).map((r) => ({ value: r.name, label: `${r.name} — remote: ${r.owner}` })),
  ];
  if (current && !choices.some((c) => c.value === current)) choices.unshift({ value: current, label: `${current} (not installed)` });
  return choices;
}

export type RemoteForm = { name: string; url: string; api: Remote['api']; model: string; key: string };

/** The add form's problem before asking the server (which checks the rest): null when none. */
export function checkRemoteForm(form: Pick<RemoteForm, 'name' | 'url'>): string | null {
  if (!form.name.trim()) return 'Give the remote model a name: chats pick it by that name.';
  const url = form.url.trim();
  if (!url) return "Enter the engine's URL, like http://gpu-box:8000/v1.";
  if (!/^https?:\/\/[^\s/]+/i.test(url)) return 'The URL starts with http:// or https://, like http://gpu-box:8000/v1.';
  return null;
}

/** What `POST /app/remotes` gets from the form: blank optional fields left out. */
export function newRemoteOf(form: RemoteForm) {
  const model = form.model.trim();
  const key = form.key.trim();
  return { name: form.name.trim(), url: form.url.trim(), api: form.api, ...(model ? { model } : {}), ...(key ? { key } : {}) };
}

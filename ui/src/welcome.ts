// The first-run welcome in words: this machine, the catalogue's recommendation, the rest of
// its models by size class, and what a failed download means.

import type { Catalogue, CatalogueFormat, CatalogueModel, ModelInfo, Pull } from './types';

const BACKENDS: Record<string, string> = { metal: 'Apple GPU (Metal)', cuda: 'NVIDIA GPU (CUDA)', cpu: 'CPU' };

/** "16 GB · Apple GPU (Metal)": the memory as the machine is sold (binary gigabytes), and
 *  what runs the models. */
export function describeMachine(memoryBytes: number, backend: string): string {
  const gb = memoryBytes / 2 ** 30;
  const memory = gb >= 10 ? Math.round(gb) : Number(gb.toFixed(1));
  return `${memory} GB · ${BACKENDS[backend] ?? backend}`;
}

const FORMATS: Record<string, string> = { 'mlx-4bit': 'MLX 4-bit', 'gguf-q4_k_m': 'GGUF Q4_K_M' };

export function formatLabel(format: string): string {
  return FORMATS[format] ?? format;
}

/** A catalogue model in one of its formats. */
export type Choice = { model: CatalogueModel; format: CatalogueFormat };

/** The catalogue's one recommended format; null when it has none. */
export function recommendation(catalogue: Catalogue): Choice | null {
  for (const model of catalogue.models) {
    const format = model.formats.find((f) => f.recommended);
    if (format) return { model, format };
  }
  return null;
}

export type SizeGroup = { size_class: string; models: CatalogueModel[] };

/**
 * The catalogue's models but the recommended format, by size class from the smallest (each
 * class in the catalogue's order); a model left with no format is left out.
 */
export function otherModels(models: CatalogueModel[]): SizeGroup[] {
  const groups: SizeGroup[] = [];
  for (const model of models) {
    const formats = model.formats.filter((f) => !f.recommended);
    if (formats.length === 0) continue;
    let group = groups.find((g) => g.size_class === model.size_class);
    if (!group) {
      group = { size_class: model.size_class, models: [] };
      groups.push(group);
    }
    group.models.push({ ...model, formats });
  }
  return groups.sort((a, b) => parseFloat(a.size_class) - parseFloat(b.size_class));
}

/** The catalogue format a running download pulls (the page was reloaded while it ran). */
export function runningChoice(catalogue: Catalogue, pulls: Pull[]): Choice | null {
  for (const pull of pulls.filter((p) => p.status === 'downloading')) {
    for (const model of catalogue.models) {
      const format = model.formats.find((f) => f.pull === pull.repo);
      if (format) return { model, format };
    }
  }
  return null;
}

/** Whether a download's error says the hub could not be reached (no network, or blocked). */
export function hubUnreachable(error: string | null): boolean {
  return /cannot reach|can't reach|unreachable|network|dns|resolve|connect|timed? ?out|no route|offline/i.test(error ?? '');
}

/** A failed welcome download, said plainly. */
export function welcomeFailure(error: string | null): string {
  if (hubUnreachable(error)) return "Can't reach the model hub — you're offline or it's blocked.";
  return `The download failed${error ? `: ${error}` : '.'}`;
}

/** What the default model can be: "Automatic", then the installed chat models Seedbar runs
 *  (and the current choice, should it be gone). */
export function defaultModelChoices(models: ModelInfo[] | null, current: string): { value: string; label: string }[] {
  const chat = (models ?? []).filter((m) => m.supported && m.capabilities.includes('completion')).map((m) => m.name);
  const choices = [{ value: '', label: 'Automatic' }, ...chat.map((name) => ({ value: name, label: name }))];
  if (current && !chat.includes(current)) {
    choices.push({ value: current, label: `${current} (not installed)` });
  }
  return choices;
}

import { describe, expect, it } from 'vitest';
import type { Catalogue, CatalogueFormat, CatalogueModel, ModelInfo, Pull } from '../src/types';
import {
  defaultModelChoices, describeMachine, formatLabel, hubUnreachable, otherModels, recommendation, runningChoice, welcomeFailure,
} from '../src/welcome';

const format = (pull: string, patch: Partial<CatalogueFormat> = {}): CatalogueFormat => ({
  format: pull.includes(':') ? 'gguf-q4_k_m' : 'mlx-4bit', pull, download_bytes: 1e9, model_name: pull.replace('/', '--'),
  memory_bytes: 1.2e9, fits: true, installed: false, recommended: false, ...patch,
});

const model = (name: string, size_class: CatalogueModel['size_class'], formats: CatalogueFormat[]): CatalogueModel => ({
  name, family: 'qwen3', parameters_b: parseFloat(size_class), size_class, architecture: 'qwen3', thinks: true, about: `${name} answers.`, formats,
});

const catalogue: Catalogue = {
  memory_bytes: 16 * 2 ** 30,
  backend: 'metal',
  size_class: '3-4B',
  models: [
    model('Big', '7-9B', [format('org/big', { fits: false })]),
    model('Small', '1-2B', [format('org/small'), format('org/small-gguf:small.gguf', { installed: true })]),
    model('Four', '3-4B', [format('org/four', { recommended: true }), format('org/four-gguf:four.gguf')]),
    model('Three', '3-4B', [format('org/three')]),
  ],
};

describe('the welcome', () => {
  it('describes the machine', () => {
    expect(describeMachine(16 * 2 ** 30, 'metal')).toBe('16 GB · Apple GPU (Metal)');
    expect(describeMachine(25_276_194_816, 'cpu')).toBe('24 GB · CPU');
    expect(describeMachine(8 * 2 ** 30, 'cuda')).toBe('8 GB · NVIDIA GPU (CUDA)');
    expect(describeMachine(7.5 * 2 ** 30, 'cpu')).toBe('7.5 GB · CPU');
    expect(describeMachine(64 * 2 ** 30, 'vulkan')).toBe('64 GB · vulkan');
  });

  it('names the formats', () => {
    expect(formatLabel('mlx-4bit')).toBe('MLX 4-bit');
    expect(formatLabel('gguf-q4_k_m')).toBe('GGUF Q4_K_M');
  });

  it('finds the recommended format', () => {
    const pick = recommendation(catalogue);
    expect(pick?.model.name).toBe('Four');
    expect(pick?.format.pull).toBe('org/four');
    expect(recommendation({ ...catalogue, models: [] })).toBeNull();
  });

  it('lists the other models by size class, smallest first, without the recommended format', () => {
    const groups = otherModels(catalogue.models);
    expect(groups.map((g) => g.size_class)).toEqual(['1-2B', '3-4B', '7-9B']);
    expect(groups[1].models.map((m) => m.name)).toEqual(['Four', 'Three']);
    expect(groups[1].models[0].formats.map((f) => f.pull)).toEqual(['org/four-gguf:four.gguf']);
    expect(groups[0].models[0].formats).toHaveLength(2);
    const onlyRecommended = [model('One', '3-4B', [format('org/one', { recommended: true })])];
    expect(otherModels(onlyRecommended)).toEqual([]);
  });

  it('takes up a catalogue download still running', () => {
    const pull = (repo: string, status: Pull['status']): Pull => ({ repo, status, downloaded_bytes: 0, total_bytes: 0, error: null });
    expect(runningChoice(catalogue, [pull('org/four-gguf:four.gguf', 'downloading')])?.model.name).toBe('Four');
    expect(runningChoice(catalogue, [pull('org/four', 'done'), pull('other/repo', 'downloading')])).toBeNull();
    expect(runningChoice(catalogue, [])).toBeNull();
  });

  it('says plainly when the hub cannot be reached', () => {
    const server = 'download: cannot reach the Hugging Face hub at http://127.0.0.1:1 (Connection refused); check the network connection.';
    expect(hubUnreachable(server)).toBe(true);
    expect(hubUnreachable('dns error: failed to lookup address information')).toBe(true);
    expect(hubUnreachable('org/x was not found on the Hugging Face hub')).toBe(false);
    expect(hubUnreachable(null)).toBe(false);
    expect(welcomeFailure(server)).toBe("Can't reach the model hub — you're offline or it's blocked.");
    expect(welcomeFailure('org/x has no file x.gguf')).toBe('The download failed: org/x has no file x.gguf');
    expect(welcomeFailure(null)).toBe('The download failed.');
  });
});

describe('the default model setting', () => {
  const info = (name: string, patch: Partial<ModelInfo> = {}): ModelInfo => ({
    name, format: 'gguf', bytes: 1, quantization: null, architecture: 'llama', supported: true, loaded: false,
    memory_needed: 1, fits: true, capabilities: ['completion'], ...patch,
  });
  const models = [info('chat'), info('embedder', { capabilities: ['embedding'] }), info('odd', { supported: false }), info('thinker', { capabilities: ['completion', 'thinking'] })];

  it('offers Automatic and the installed chat models Seedbar runs', () => {
    expect(defaultModelChoices(models, '')).toEqual([
      { value: '', label: 'Automatic' }, { value: 'chat', label: 'chat' }, { value: 'thinker', label: 'thinker' },
    ]);
    expect(defaultModelChoices(null, '')).toEqual([{ value: '', label: 'Automatic' }]);
  });

  it('keeps a chosen model that is gone', () => {
    expect(defaultModelChoices(models, 'gone').at(-1)).toEqual({ value: 'gone', label: 'gone (not installed)' });
    expect(defaultModelChoices(models, 'chat')).toHaveLength(3);
  });
});

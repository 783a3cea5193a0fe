import { describe, expect, it } from 'vitest';
import { checkRemoteForm, modelChoices, newRemoteOf, ranOn, receiptText, seedBadge, seedNotPromised, seedPromise } from '../src/remote';
import type { ModelInfo, Provenance, Remote } from '../src/types';

const local = { name: 'SmolLM2-135M-Instruct' } as ModelInfo;
const far: Remote = {
  name: 'far-qwen', url: 'http://gpu-box:8000', api: 'openai', model: 'Qwen/Qwen3-8B', engine: 'vllm', engine_version: '0.11.0',
  identical_seeds: false, supports: { seeds: true, tools: true, images: false, structured: true, reasoning: true },
  timeout_s: 300, has_key: true, owner: 'vllm at gpu-box:8000',
};
const provenance = (remote?: Provenance['remote']): Provenance => ({
  weights: remote ? `remote:${remote.model}` : 'sha256:ab', quantization: null, engine: remote ? 'vllm 0.11.0' : 'seedbar 0.1.0',
  backend: remote ? 'remote' : 'cpu', fingerprint: 'fp_0123456789ab', ...(remote ? { remote } : {}),
});
const origin = { engine: 'vllm' as const, url: 'http://gpu-box:8000', model: 'Qwen/Qwen3-8B', identical_seeds: false };

describe('the seed promise', () => {
  it('is worded for the badge and in full', () => {
    expect(seedBadge(true)).toBe('seeds identical');
    expect(seedBadge(false)).toBe('seeds not promised');
    expect(seedPromise(true)).toBe('This engine keeps a seeded reply the same');
    expect(seedPromise(false)).toBe('This engine does not promise the same reply for the same seed');
  });

  it('is doubted only for remote replies whose engine does not promise it', () => {
    expect(seedNotPromised({ provenance: provenance(origin) })).toBe(true);
    expect(seedNotPromised({ provenance: provenance({ ...origin, identical_seeds: true }) })).toBe(false);
    expect(seedNotPromised({ provenance: provenance() })).toBe(false);
    expect(seedNotPromised({ provenance: null })).toBe(false);
    expect(seedNotPromised({})).toBe(false);
  });

  it('names where a remote reply ran', () => {
    expect(ranOn(origin)).toBe('vllm at http://gpu-box:8000 (Qwen/Qwen3-8B)');
  });
});

describe('receiptText', () => {
  const sampling = { model: 'far-qwen', temperature: 0.7, top_p: 1, max_tokens: 64, system_prompt: '' };

  it('is the seed, the sampling and the receipt for a local reply', () => {
    expect(JSON.parse(receiptText({ seed: 7, sampling, provenance: provenance() }))).toEqual({ seed: 7, ...sampling, ...provenance() });
  });

  it('says where a remote reply ran and what its engine promises', () => {
    const receipt = JSON.parse(receiptText({ seed: 7, sampling, provenance: provenance(origin) }));
    expect(receipt.backend).toBe('remote');
    expect(receipt.remote).toEqual({
      ...origin, ran_on: 'vllm at http://gpu-box:8000 (Qwen/Qwen3-8B)', seed_promise: 'This engine does not promise the same reply for the same seed',
    });
  });
});

describe('modelChoices', () => {
  it('lists local models, then remote ones marked with where they run', () => {
    expect(modelChoices([local], [far], 'SmolLM2-135M-Instruct')).toEqual([
      { value: 'SmolLM2-135M-Instruct', label: 'SmolLM2-135M-Instruct' },
      { value: 'far-qwen', label: 'far-qwen — remote: vllm at gpu-box:8000' },
    ]);
  });

  it('keeps a remote model chosen as itself, and puts a missing one first', () => {
    expect(modelChoices([local], [far], 'far-qwen').map((c) => c.value)).toEqual(['SmolLM2-135M-Instruct', 'far-qwen']);
    expect(modelChoices([local], [], 'gone')[0]).toEqual({ value: 'gone', label: 'gone (not installed)' });
    expect(modelChoices(null, null, '')).toEqual([]);
  });
});

describe('the add-remote form', () => {
  it('asks for a name and an http(s) URL', () => {
    expect(checkRemoteForm({ name: ' ', url: 'http://x' })).toMatch(/name/);
    expect(checkRemoteForm({ name: 'far', url: '' })).toMatch(/URL/);
    expect(checkRemoteForm({ name: 'far', url: 'gpu-box:8000/v1' })).toMatch(/http:\/\/ or https:\/\//);
    expect(checkRemoteForm({ name: 'far', url: 'http://gpu-box:8000/v1' })).toBeNull();
    expect(checkRemoteForm({ name: 'far', url: 'HTTPS://example.com' })).toBeNull();
  });

  it('sends trimmed fields, leaving out a blank model id and key', () => {
    expect(newRemoteOf({ name: ' far ', url: ' http://h:1/v1 ', api: 'ollama', model: ' ', key: '' })).toEqual({ name: 'far', url: 'http://h:1/v1', api: 'ollama' });
    expect(newRemoteOf({ name: 'far', url: 'http://h:1/v1', api: 'openai', model: 'm', key: 'sk-1' }))
      .toEqual({ name: 'far', url: 'http://h:1/v1', api: 'openai', model: 'm', key: 'sk-1' });
  });
});

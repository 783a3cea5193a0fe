// @vitest-environment jsdom
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { MessageItem } from '../src/components/MessageItem';
import type { UiMessage } from '../src/convList';
import type { Provenance } from '../src/types';

const provenance = (remote?: Provenance['remote']): Provenance => ({
  weights: remote ? `remote:${remote.model}` : 'sha256:ab', quantization: null, engine: remote ? `${remote.engine} 0.1.0` : 'seedbar 0.1.0',
  backend: remote ? 'remote' : 'cpu', fingerprint: 'fp_0123456789ab', ...(remote ? { remote } : {}),
});

const reply = (p: Provenance): UiMessage => ({
  id: 5, conversation_id: 1, role: 'assistant', content: 'Paris.', seed: 42, status: 'complete', created_at: '2025-01-01T00:00:00Z',
  sampling: { model: 'far', temperature: 0.7, top_p: 1, max_tokens: 24, system_prompt: '' }, reasoning: null, reasoning_ms: null, provenance: p,
});

function mount(message: UiMessage): HTMLElement {
  const root = document.createElement('div');
  document.body.append(root);
  act(() => render(<MessageItem message={message} pinnedSeed={42} isLastReply busy={false} />, root));
  return root;
}

const text = (root: HTMLElement, id: string) => root.querySelector(`[data-testid="${id}"]`)?.textContent?.trim() ?? null;

afterEach(() => {
  document.body.innerHTML = '';
});

describe('a remote reply', () => {
  it('names its engine in the receipt and warns where the seed is not promised', () => {
    const root = mount(reply(provenance({ engine: 'vllm', url: 'http://gpu-box:8000', model: 'Qwen/Qwen3-8B', identical_seeds: false })));
    expect(text(root, 'seed-not-promised')).toBe('seed sent; not guaranteed');
    expect(text(root, 'receipt-seed')).toBe('42');
    expect(text(root, 'receipt-ran-on')).toBe('vllm at http://gpu-box:8000 (Qwen/Qwen3-8B)');
    expect(text(root, 'receipt-seed-promise')).toBe('This engine does not promise the same reply for the same seed');
    expect(text(root, 'receipt-backend')).toBe('remote engine');
  });

  it('says the seed is kept where the engine promises it, without a warning', () => {
    const root = mount(reply(provenance({ engine: 'seedbar', url: 'http://127.0.0.1:7337', model: 'SmolLM2', identical_seeds: true })));
    expect(text(root, 'seed-not-promised')).toBeNull();
    expect(text(root, 'receipt-seed-promise')).toBe('This engine keeps a seeded reply the same');
  });

  it('leaves a local reply as it was', () => {
    const root = mount(reply(provenance()));
    expect(text(root, 'seed-not-promised')).toBeNull();
    expect(text(root, 'receipt-ran-on')).toBeNull();
    expect(text(root, 'receipt-seed-promise')).toBeNull();
    expect(text(root, 'receipt-backend')).toBe('CPU');
  });
});

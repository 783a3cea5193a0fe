import { describe, expect, it } from 'vitest';
import { QUICK_SAMPLING, conversationOf, notReady, questionContent, titleOf } from '../src/quick';
import type { AppStatus } from '../src/types';

const status = (patch: Partial<AppStatus>): AppStatus => ({
  state: 'ready', model: 'SmolLM2', percent: null, problem: null, fix: null, actions: [], endpoint: null, paused: false, message: null, ...patch,
});

describe('quick chat', () => {
  it('says why it cannot ask, and the fix', () => {
    expect(notReady(status({}))).toBeNull();
    expect(notReady(status({ state: 'loading' }))?.text).toBe('Loading SmolLM2…');
    expect(notReady(status({ state: 'downloading', percent: 40 }))?.text).toBe('Downloading SmolLM2 · 40%');
    const missing = notReady(status({ state: 'no_model', model: null, problem: 'No model is installed.', fix: 'Import a GGUF file.', actions: ['import'] }));
    expect(missing).toEqual({ text: 'No model is installed.', fix: 'Import a GGUF file.', canImport: true });
  });

  it('saves the question and the answer (not when it thought) with its seed and sampling', () => {
    const body = conversationOf({ question: '  What is the capital of France?\nBe brief.', images: [], answer: 'Paris.', model: 'SmolLM2', seed: 7, thinkingSince: 5, state: 'complete', error: null });
    expect(body.title).toBe('What is the capital of France?');
    expect(body.settings).toEqual({ model: 'SmolLM2', ...QUICK_SAMPLING });
    expect(body.messages).toEqual([
      { role: 'user', content: '  What is the capital of France?\nBe brief.' },
      { role: 'assistant', content: 'Paris.', seed: 7 },
    ]);
    expect(titleOf('x'.repeat(100))).toHaveLength(60);
  });

  it('asks about pictures before the question, and saves them with it', () => {
    const url = 'data:image/png;base64,AAAA';
    expect(questionContent('What is it?', [])).toBe('What is it?');
    expect(questionContent('What is it?', [url])).toEqual([
      { type: 'image_url', image_url: { url } },
      { type: 'text', text: 'What is it?' },
    ]);
    const body = conversationOf({ question: 'What is it?', images: [url], answer: 'A cat.', model: 'm', seed: 3, thinkingSince: null, state: 'complete', error: null });
    expect(body.messages[0]).toEqual({ role: 'user', content: 'What is it?', images: [url] });
  });
});

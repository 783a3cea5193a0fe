// @vitest-environment jsdom
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { MessageItem } from '../src/components/MessageItem';
import { ThinkingBlock } from '../src/components/ThinkingBlock';
import type { UiMessage } from '../src/convList';
import { formatDuration, isThinking, thinkingSummary } from '../src/thinking';

const reply = (patch: Partial<UiMessage>): UiMessage => ({
  id: 5, conversation_id: 1, role: 'assistant', content: '', seed: 7, sampling: null, status: 'complete',
  created_at: '2025-01-01T00:00:00Z', reasoning: null, reasoning_ms: null, ...patch,
});

const UNSAFE = '<b>x</b> <img src=x onerror="window.__pwned = 1"> **not bold**\n  second line';

function mount(node: preact.ComponentChild): HTMLElement {
  const root = document.createElement('div');
  document.body.append(root);
  act(() => render(node, root));
  return root;
}

const q = (root: HTMLElement, id: string) => root.querySelector<HTMLElement>(`[data-testid="${id}"]`);

afterEach(() => {
  document.body.innerHTML = '';
  vi.useRealTimers();
});

describe('thinking summary', () => {
  it('is absent without thinking', () => {
    expect(thinkingSummary(reply({ content: 'Hi' }), 0)).toBeNull();
    expect(thinkingSummary(reply({ content: 'Hi', reasoning: '' }), 0)).toBeNull();
    expect(thinkingSummary(reply({ streaming: true }), 0)).toBeNull();
  });

  it('counts the seconds while the model thinks', () => {
    const thinking = reply({ streaming: true, reasoning: 'Hmm', thinkingSince: 1_000 });
    expect(isThinking(thinking)).toBe(true);
    expect(thinkingSummary(thinking, 1_400)).toBe('Thinking… 0s');
    expect(thinkingSummary(thinking, 4_999)).toBe('Thinking… 3s');
    // Streaming for another window (loaded, not streamed here): no start to count from.
    expect(thinkingSummary(reply({ status: 'streaming', reasoning: 'Hmm' }), 9_000)).toBe('Thinking…');
  });

  it('says how long the model thought once it is over', () => {
    expect(thinkingSummary(reply({ reasoning: 'Hmm', reasoning_ms: 4_200 }), 0)).toBe('Thought for 4.2s');
    // The answer has begun: the thinking is over though the reply still streams.
    const answering = reply({ streaming: true, reasoning: 'Hmm', content: 'Hi', reasoning_ms: 870, thinkingSince: 1 });
    expect(isThinking(answering)).toBe(false);
    expect(thinkingSummary(answering, 99_000)).toBe('Thought for 0.9s');
    // Cut off while thinking: no duration.
    expect(thinkingSummary(reply({ status: 'stopped', reasoning: 'Hmm' }), 0)).toBe('Thought');
  });

  it('formats durations', () => {
    expect(formatDuration(0)).toBe('0.0s');
    expect(formatDuration(4_200)).toBe('4.2s');
    expect(formatDuration(12_400)).toBe('12s');
    expect(formatDuration(125_000)).toBe('2m 5s');
  });
});

describe('ThinkingBlock', () => {
  it('is collapsed, and shows the thinking as text, never as HTML', () => {
    const root = mount(<ThinkingBlock message={reply({ reasoning: UNSAFE, reasoning_ms: 4_200, content: 'Hi' })} />);
    const block = q(root, 'thinking') as HTMLDetailsElement;
    expect(block.tagName).toBe('DETAILS');
    expect(block.open).toBe(false);
    expect(q(root, 'thinking-summary')?.textContent).toBe('Thought for 4.2s');
    const text = q(root, 'thinking-text');
    expect(text?.textContent).toBe(UNSAFE);
    expect(text?.children).toHaveLength(0);
    expect(root.querySelector('b, img, strong')).toBeNull();
  });

  it('renders nothing for a reply without thinking', () => {
    expect(mount(<ThinkingBlock message={reply({ content: 'Hi' })} />).innerHTML).toBe('');
  });

  it('keeps its clock running while the model thinks', () => {
    vi.useFakeTimers({ now: 10_000 });
    const root = mount(<ThinkingBlock message={reply({ streaming: true, reasoning: 'Hmm', thinkingSince: 10_000 })} />);
    expect(q(root, 'thinking')?.getAttribute('data-live')).toBe('true');
    expect(q(root, 'thinking-summary')?.textContent).toBe('Thinking… 0s');
    act(() => { vi.advanceTimersByTime(3_000); });
    expect(q(root, 'thinking-summary')?.textContent).toBe('Thinking… 3s');
  });
});

describe('MessageItem with thinking', () => {
  const props = { pinnedSeed: null, isLastReply: true, busy: false };

  it('shows the thinking above the answer, apart from it', () => {
    const root = mount(<MessageItem message={reply({ reasoning: UNSAFE, reasoning_ms: 1_500, content: '**Paris.**' })} {...props} />);
    const block = q(root, 'thinking');
    const content = q(root, 'message-content');
    expect(block && content && block.compareDocumentPosition(content) & Node.DOCUMENT_POSITION_FOLLOWING).toBeTruthy();
    expect(content?.querySelector('strong')?.textContent).toBe('Paris.');
    expect(content?.textContent).not.toContain('not bold');
    expect(q(root, 'thinking-summary')?.textContent).toBe('Thought for 1.5s');
    expect((window as { __pwned?: number }).__pwned).toBeUndefined();
  });

  it('while thinking, shows the live summary instead of the typing dots', () => {
    const root = mount(<MessageItem message={reply({ streaming: true, reasoning: 'Hmm', thinkingSince: Date.now() })} {...props} />);
    expect(q(root, 'thinking-summary')?.textContent).toBe('Thinking… 0s');
    expect(root.querySelector('.typing')).toBeNull();
    expect(q(root, 'message-content')?.textContent).toBe('');
  });

  it('shows the typing dots before anything came, and no thinking block', () => {
    const root = mount(<MessageItem message={reply({ streaming: true })} {...props} />);
    expect(root.querySelector('.typing')).not.toBeNull();
    expect(q(root, 'thinking')).toBeNull();
  });
});

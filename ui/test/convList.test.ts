import { describe, expect, it } from 'vitest';
import {
  applyReplyEvent, beginReply, endReply, removeConversation, sortConversations, titleFrom, touchConversation,
  upsertConversation, type UiMessage,
} from '../src/convList';
import type { Conversation, Message, ReplyEvent } from '../src/types';

const settings = { model: 'm', system_prompt: '', temperature: 0.7, top_p: 1, max_tokens: 24, seed: null };
const conv = (id: number, updated: string, title = `c${id}`): Conversation => ({ id, title, created_at: updated, updated_at: updated, settings });
const msg = (id: number, role: 'user' | 'assistant', content: string, extra: Partial<Message> = {}): Message => ({
  id, conversation_id: 1, role, content, seed: role === 'assistant' ? 11 : null, sampling: null, status: 'complete', created_at: '2025-01-01T00:00:00Z',
  reasoning: null, reasoning_ms: null, ...extra,
});

describe('conversation list', () => {
  const list = [conv(1, '2025-01-01T10:00:00Z'), conv(2, '2025-01-02T10:00:00Z'), conv(3, '2025-01-03T10:00:00Z')];

  it('sorts most recently updated first, ties by newest id', () => {
    expect(sortConversations(list).map((c) => c.id)).toEqual([3, 2, 1]);
    expect(sortConversations([conv(1, '2025-01-01T00:00:00Z'), conv(2, '2025-01-01T00:00:00Z')]).map((c) => c.id)).toEqual([2, 1]);
  });

  it('upserts: adds new ones in order and replaces existing ones', () => {
    const sorted = sortConversations(list);
    const added = upsertConversation(sorted, conv(4, '2025-01-04T00:00:00Z'));
    expect(added.map((c) => c.id)).toEqual([4, 3, 2, 1]);
    const renamed = upsertConversation(added, { ...conv(2, '2025-01-02T10:00:00Z'), title: 'Renamed' });
    expect(renamed.map((c) => c.id)).toEqual([4, 3, 2, 1]);
    expect(renamed.find((c) => c.id === 2)?.title).toBe('Renamed');
    expect(renamed).toHaveLength(4);
    expect(sorted).toHaveLength(3); // not mutated
  });

  it('removes, and moves a touched conversation to the top', () => {
    expect(removeConversation(list, 2).map((c) => c.id)).toEqual([1, 3]);
    expect(touchConversation(sortConversations(list), 1, '2025-02-01T00:00:00Z').map((c) => c.id)).toEqual([1, 3, 2]);
    expect(touchConversation(list, 99)).toBe(list);
  });

  it('titles from the first message', () => {
    expect(titleFrom('  What is the capital\nof France?  ')).toBe('What is the capital of France?');
    expect(titleFrom('')).toBe('New chat');
    const long = titleFrom('word '.repeat(40));
    expect(long.length).toBeLessThanOrEqual(49);
    expect(long.endsWith('…')).toBe(true);
  });
});

function run(messages: UiMessage[], events: ReplyEvent[], now?: number) {
  return events.reduce((m, e) => applyReplyEvent(m, 1, e, now), messages);
}

describe('reply stream into messages', () => {
  const history = [msg(1, 'user', 'Hi'), msg(2, 'assistant', 'Hello!')];

  it('send: pending user message, then stored, then streamed reply, then final', () => {
    let m = beginReply(history, 1, { kind: 'send', content: 'Capital of France?' });
    expect(m).toHaveLength(3);
    expect(m[2]).toMatchObject({ role: 'user', content: 'Capital of France?', pending: true });
    expect(m[2].id).toBeLessThan(0);
    m = run(m, [{ type: 'user', message: msg(3, 'user', 'Capital of France?') }]);
    expect(m[2]).toEqual(msg(3, 'user', 'Capital of France?'));
    m = run(m, [{ type: 'start', message_id: 4, seed: 42 }, { type: 'delta', text: 'Par' }, { type: 'delta', text: 'is' }]);
    expect(m[3]).toMatchObject({ id: 4, role: 'assistant', content: 'Paris', seed: 42, streaming: true });
    const final = msg(4, 'assistant', 'Paris.', { seed: 42 });
    m = run(m, [{ type: 'done', message: final }]);
    expect(m).toEqual([...history, msg(3, 'user', 'Capital of France?'), final]);
  });

  it('send with images: the pending message shows them until the stored one names them', () => {
    const url = 'data:image/png;base64,AAAA';
    let m = beginReply(history, 1, { kind: 'send', content: 'What is this?', images: [url] });
    expect(m[2]).toMatchObject({ role: 'user', pending: true, localImages: [url] });
    m = run(m, [{ type: 'user', message: msg(3, 'user', 'What is this?', { images: [7] }) }]);
    expect(m[2]).toEqual(msg(3, 'user', 'What is this?', { images: [7] }));
    expect(m[2]).not.toHaveProperty('localImages');
    expect(beginReply(history, 1, { kind: 'send', content: 'Hi' })[2].localImages).toBeUndefined();
  });

  it('regenerate: drops the last reply and streams a new one', () => {
    let m = beginReply(history, 1, { kind: 'regenerate' });
    expect(m).toEqual([history[0]]);
    m = run(m, [{ type: 'start', message_id: 5, seed: 7 }, { type: 'delta', text: 'Hey' }, { type: 'done', message: msg(5, 'assistant', 'Hey', { seed: 7 }) }]);
    expect(m.map((x) => x.id)).toEqual([1, 5]);
  });

  it('edit: changes the message, drops what follows, replaces it with the stored one', () => {
    const longer = [...history, msg(3, 'user', 'More'), msg(4, 'assistant', 'Sure')];
    let m = beginReply(longer, 1, { kind: 'edit', messageId: 1, content: 'Hi there' });
    expect(m).toHaveLength(1);
    expect(m[0]).toMatchObject({ id: 1, content: 'Hi there', pending: true });
    m = run(m, [{ type: 'user', message: msg(1, 'user', 'Hi there') }, { type: 'start', message_id: 9, seed: 1 }]);
    expect(m.map((x) => [x.id, x.role])).toEqual([[1, 'user'], [9, 'assistant']]);
    expect(m[0].pending).toBeUndefined();
  });

  it('error event: marks the streaming reply, or adds an error reply', () => {
    let m = run(history, [{ type: 'start', message_id: 5, seed: 7 }, { type: 'delta', text: 'par' }, { type: 'error', message: 'engine failed' }]);
    expect(m[2]).toMatchObject({ id: 5, content: 'par', status: 'error', error: 'engine failed', streaming: false });
    m = run(beginReply(history, 1, { kind: 'send', content: 'x' }), [{ type: 'error', message: 'no model' }]);
    expect(m[2].pending).toBe(false);
    expect(m[3]).toMatchObject({ role: 'assistant', status: 'error', error: 'no model' });
  });

  it('stop and lost connections end the streaming reply', () => {
    const streaming = run(history, [{ type: 'start', message_id: 5, seed: 7 }, { type: 'delta', text: 'Par' }]);
    expect(endReply(streaming, 1, { stopped: true })[2]).toMatchObject({ content: 'Par', status: 'stopped', streaming: false });
    expect(endReply(streaming, 1, { error: 'lost' })[2]).toMatchObject({ status: 'error', error: 'lost' });
    const refused = endReply(beginReply(history, 1, { kind: 'send', content: 'x' }), 1, { error: 'The reply failed: 404' });
    expect(refused[3]).toMatchObject({ status: 'error', error: 'The reply failed: 404' });
  });

  it('thinking: reasoning pieces gather apart from the answer, and the stored reply replaces both', () => {
    let m = run(history, [{ type: 'start', message_id: 5, seed: 7 }], 1_000);
    expect(m[2]).toMatchObject({ reasoning: null, reasoning_ms: null });
    expect(m[2].thinkingSince).toBeUndefined();
    m = run(m, [{ type: 'reasoning', text: 'The user greets' }, { type: 'reasoning', text: ' me.' }], 2_000);
    expect(m[2]).toMatchObject({ content: '', reasoning: 'The user greets me.', reasoning_ms: null, thinkingSince: 2_000, streaming: true });
    // The answer's first piece ends the thinking (as this page timed it)...
    m = run(m, [{ type: 'delta', text: 'Hel' }], 6_200);
    m = run(m, [{ type: 'delta', text: 'lo!' }], 9_000);
    expect(m[2]).toMatchObject({ content: 'Hello!', reasoning: 'The user greets me.', reasoning_ms: 4_200 });
    // ...until the stored reply brings the server's figures.
    const final = msg(5, 'assistant', 'Hello!', { seed: 7, reasoning: 'The user greets me.', reasoning_ms: 4_150 });
    m = run(m, [{ type: 'done', message: final }]);
    expect(m[2]).toEqual(final);
  });

  it('a reply without thinking keeps reasoning null, and one stopped while thinking keeps it', () => {
    const plain = run(history, [{ type: 'start', message_id: 5, seed: 7 }, { type: 'delta', text: 'Hi' }]);
    expect(plain[2]).toMatchObject({ content: 'Hi', reasoning: null, reasoning_ms: null });
    const thinking = run(history, [{ type: 'start', message_id: 5, seed: 7 }, { type: 'reasoning', text: 'Hmm' }]);
    expect(endReply(thinking, 1, { stopped: true })[2]).toMatchObject({ content: '', reasoning: 'Hmm', reasoning_ms: null, status: 'stopped' });
  });

  it('delta without a streaming reply changes nothing', () => {
    expect(run(history, [{ type: 'delta', text: 'x' }])).toBe(history);
    expect(run(history, [{ type: 'reasoning', text: 'x' }])).toBe(history);
  });
});

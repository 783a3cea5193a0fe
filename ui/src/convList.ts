// Pure updates of the conversation list and of a conversation's messages (the sidebar and
// the chat pane apply server answers and stream events through these).

import type { Conversation, Message, ReplyEvent } from './types';

/** Most recently updated first; ties by id, newest first. */
export function sortConversations(list: Conversation[]): Conversation[] {
  return [...list].sort((a, b) => {
    const byTime = Date.parse(b.updated_at) - Date.parse(a.updated_at);
    if (byTime && !Number.isNaN(byTime)) return byTime;
    return b.id - a.id;
  });
}

/** Adds or replaces a conversation, keeping the order. */
export function upsertConversation(list: Conversation[], conversation: Conversation): Conversation[] {
  const rest = list.filter((c) => c.id !== conversation.id);
  return sortConversations([conversation, ...rest]);
}

export function removeConversation(list: Conversation[], id: number): Conversation[] {
  return list.filter((c) => c.id !== id);
}

/** Marks a conversation as just used (a message was sent), moving it to the top. */
export function touchConversation(list: Conversation[], id: number, now = new Date().toISOString()): Conversation[] {
  const found = list.find((c) => c.id === id);
  if (!found) return list;
  return upsertConversation(list, { ...found, updated_at: now });
}

/** What the chat pane shows: stored messages plus, while streaming, the live ones. */
export type UiMessage = Message & {
  /** The reply is streaming into this message. */
  streaming?: boolean;
  /** A message sent but not yet confirmed by the server (negative id). */
  pending?: boolean;
  /** Why the reply failed, when it did. */
  error?: string;
  /** When this page saw the reply begin to think (ms since the epoch), for a live timer. */
  thinkingSince?: number;
  /** A pending message's images, as the data URLs being sent. */
  localImages?: string[];
};

let nextTempId = -1;
export function tempId(): number {
  return nextTempId--;
}

export type ReplyKind =
  | { kind: 'send'; content: string; images?: string[] }
  | { kind: 'regenerate' }
  | { kind: 'edit'; messageId: number; content: string };

/** The messages to show as a reply request starts (before any event). */
export function beginReply(messages: UiMessage[], conversationId: number, request: ReplyKind): UiMessage[] {
  const now = new Date().toISOString();
  const pendingUser = (content: string, images?: string[]): UiMessage => ({
    id: tempId(), conversation_id: conversationId, role: 'user', content, seed: null, sampling: null,
    status: 'complete', created_at: now, reasoning: null, reasoning_ms: null, pending: true,
    localImages: images?.length ? images : undefined,
  });
  switch (request.kind) {
    case 'send':
      return [...messages, pendingUser(request.content, request.images)];
    case 'regenerate': {
      // The last reply is redone: drop it (and anything after the last user message).
      let end = messages.length;
      while (end > 0 && messages[end - 1].role === 'assistant') end--;
      return messages.slice(0, end);
    }
    case 'edit': {
      const at = messages.findIndex((m) => m.id === request.messageId);
      if (at === -1) return messages;
      return [...messages.slice(0, at), { ...messages[at], content: request.content, pending: true }];
    }
  }
}

/** Applies one stream event to the shown messages (`now`: when it came, ms since the epoch). */
export function applyReplyEvent(messages: UiMessage[], conversationId: number, event: ReplyEvent, now = Date.now()): UiMessage[] {
  switch (event.type) {
    case 'user': {
      // The stored user message replaces the pending one (or the edited one).
      const at = messages.findIndex((m) => m.pending || m.id === event.message.id);
      if (at === -1) return [...messages, event.message];
      return [...messages.slice(0, at), event.message];
    }
    case 'start': {
      const reply: UiMessage = {
        id: event.message_id, conversation_id: conversationId, role: 'assistant', content: '', seed: event.seed,
        sampling: null, status: 'complete', created_at: new Date(now).toISOString(), reasoning: null, reasoning_ms: null,
        streaming: true,
      };
      return [...messages.filter((m) => m.id !== event.message_id), reply];
    }
    case 'reasoning':
      return updateStreaming(messages, (m) => ({
        ...m, reasoning: (m.reasoning ?? '') + event.text, thinkingSince: m.thinkingSince ?? now,
      }));
    case 'delta':
      return updateStreaming(messages, (m) => ({ ...endThinking(m, now), content: m.content + event.text }));
    case 'done': {
      const at = messages.findIndex((m) => m.id === event.message.id || m.streaming);
      if (at === -1) return [...messages, event.message];
      const next = [...messages];
      next[at] = event.message;
      return next;
    }
    case 'error': {
      const hasReply = messages.some((m) => m.streaming);
      if (!hasReply) {
        return [...messages.map((m) => (m.pending ? { ...m, pending: false } : m)), errorMessage(conversationId, event.message)];
      }
      return updateStreaming(messages, (m) => ({ ...m, streaming: false, status: 'error', error: event.message }));
    }
  }
}

/** The answer's first piece ends the thinking: how long it took as this page saw it, until
 * the stored reply (the done event) brings the server's figure. */
function endThinking(m: UiMessage, now: number): UiMessage {
  if (m.thinkingSince === undefined || m.reasoning_ms !== null) return m;
  return { ...m, reasoning_ms: now - m.thinkingSince };
}

function errorMessage(conversationId: number, error: string): UiMessage {
  return {
    id: tempId(), conversation_id: conversationId, role: 'assistant', content: '', seed: null, sampling: null,
    status: 'error', created_at: new Date().toISOString(), reasoning: null, reasoning_ms: null, error,
  };
}

function updateStreaming(messages: UiMessage[], update: (m: UiMessage) => UiMessage): UiMessage[] {
  let at = -1;
  for (let i = messages.length - 1; i >= 0; i--) if (messages[i].streaming) { at = i; break; }
  if (at === -1) return messages;
  const next = [...messages];
  next[at] = update(messages[at]);
  return next;
}

/** The stream ended without done/error: stopped by the person, or cut off. */
export function endReply(messages: UiMessage[], conversationId: number, reason: { stopped: true } | { error: string }): UiMessage[] {
  const streaming = messages.some((m) => m.streaming);
  if (!streaming) {
    if ('error' in reason) return [...messages.map((m) => (m.pending ? { ...m, pending: false } : m)), errorMessage(conversationId, reason.error)];
    return messages.map((m) => (m.pending ? { ...m, pending: false } : m));
  }
  return updateStreaming(messages, (m) =>
    'error' in reason
      ? { ...m, streaming: false, status: 'error', error: reason.error }
      : { ...m, streaming: false, status: 'stopped' },
  );
}

/** A title from the first thing said, for conversations still called "New chat". */
export function titleFrom(content: string, max = 48): string {
  const line = content.replace(/\s+/g, ' ').trim();
  if (line.length <= max) return line || 'New chat';
  const cut = line.slice(0, max);
  const space = cut.lastIndexOf(' ');
  return `${(space > max / 2 ? cut.slice(0, space) : cut).trimEnd()}…`;
}

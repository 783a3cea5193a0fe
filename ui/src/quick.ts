// Quick chat's pieces without the page: what the panel asks the default model with, what
// it says when no model is ready, and the conversation "Open as conversation" saves.

import type { ContentPart } from './api';
import type { AppStatus, Settings, StartingMessage } from './types';

/** The sampling a quick answer uses: a new conversation's defaults, so the saved answer's
 * seed reproduces it there. */
export const QUICK_SAMPLING = { temperature: 0.7, top_p: 1, max_tokens: 512 } as const;

export type Exchange = {
  question: string;
  /** The pictures asked about, as data URLs (before the question, as the chat window sends them). */
  images: string[];
  answer: string;
  model: string;
  seed: number | null;
  /** When the model began to think (models that think; ms since the epoch), else null. */
  thinkingSince: number | null;
  state: 'streaming' | 'complete' | 'stopped' | 'error';
  error: string | null;
};

/** Why the panel cannot ask now, and what to do: null when the default model is ready. */
export function notReady(status: AppStatus): { text: string; fix: string | null; canImport: boolean } | null {
  switch (status.state) {
    case 'ready':
      return null;
    case 'loading':
      return { text: `Loading ${status.model ?? 'the model'}…`, fix: 'Quick chat answers as soon as it is ready.', canImport: false };
    case 'downloading':
      return {
        text: `Downloading ${status.model ?? 'the model'}${status.percent === null ? '…' : ` · ${status.percent}%`}`,
        fix: 'Quick chat answers once the download is done.',
        canImport: false,
      };
    default:
      return { text: status.problem ?? 'No model is ready.', fix: status.fix, canImport: status.actions.includes('import') };
  }
}

/** The question as the chat route takes it: its pictures first, then its text, as the chat
 * window sends a message (so an answer saved as a conversation replays there). */
export function questionContent(question: string, images: string[]): string | ContentPart[] {
  if (images.length === 0) return question;
  return [...images.map((url): ContentPart => ({ type: 'image_url', image_url: { url } })), { type: 'text', text: question }];
}

/** A conversation title from the question: its first line, cut to 60 characters. */
export function titleOf(question: string): string {
  const line = question.trim().split('\n')[0].trim();
  return line.length > 60 ? `${line.slice(0, 59).trimEnd()}…` : line;
}

/** The conversation an answered exchange becomes: its question and answer (not the
 * thinking before it), with the sampling and seed the answer came from. */
export function conversationOf(exchange: Exchange): { title: string; settings: Partial<Settings>; messages: StartingMessage[] } {
  const answer: StartingMessage = { role: 'assistant', content: exchange.answer };
  if (exchange.seed !== null) answer.seed = exchange.seed;
  return {
    title: titleOf(exchange.question),
    settings: { model: exchange.model, ...QUICK_SAMPLING },
    messages: [{ role: 'user', content: exchange.question, ...(exchange.images.length ? { images: exchange.images } : {}) }, answer],
  };
}

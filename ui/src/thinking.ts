// How a reply's thinking (models that think, such as Qwen3 or DeepSeek-R1 distills) is summed
// up above its answer: "Thinking… 3s" while the model thinks, "Thought for 4.2s" once it is
// done. The chat window and quick chat share these words and their clock.

import { useEffect, useState } from 'preact/hooks';
import type { UiMessage } from './convList';

/** Whether the model is thinking now: the reply streams, with thinking and no answer yet. */
export function isThinking(message: UiMessage): boolean {
  return (!!message.streaming || message.status === 'streaming') && !!message.reasoning && !message.content;
}

/** A duration for people: "0.8s", "4.2s", "12s", "2m 5s". */
export function formatDuration(ms: number): string {
  const seconds = Math.max(0, ms) / 1000;
  if (seconds < 10) return `${seconds.toFixed(1)}s`;
  if (seconds < 60) return `${Math.round(seconds)}s`;
  const whole = Math.round(seconds);
  return `${Math.floor(whole / 60)}m ${whole % 60}s`;
}

/** While the model thinks: the whole seconds since `since` (ms since the epoch), when known. */
export function thinkingLabel(since: number | undefined, now: number): string {
  return since === undefined ? 'Thinking…' : `Thinking… ${Math.max(0, Math.floor((now - since) / 1000))}s`;
}

/** The summary of a reply's thinking at `now`; null when the reply has none. */
export function thinkingSummary(message: UiMessage, now: number): string | null {
  if (!message.reasoning) return null;
  if (isThinking(message)) return thinkingLabel(message.thinkingSince, now);
  return message.reasoning_ms === null ? 'Thought' : `Thought for ${formatDuration(message.reasoning_ms)}`;
}

/** The time now; the component renders again every half second while `live`. */
export function useNow(live: boolean): number {
  const [, tick] = useState(0);
  useEffect(() => {
    if (!live) return;
    const timer = setInterval(() => tick((n) => n + 1), 500);
    return () => clearInterval(timer);
  }, [live]);
  return Date.now();
}

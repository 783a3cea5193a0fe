// A reply's thinking, kept apart from its answer: a collapsed block whose summary says how long
// the model thought (a live clock while it thinks); opened, the thinking as plain text. It is
// the model's own words, never rendered as Markdown or HTML.

import type { UiMessage } from '../convList';
import { isThinking, thinkingSummary, useNow } from '../thinking';

export function ThinkingBlock({ message }: { message: UiMessage }) {
  const live = isThinking(message);
  const summary = thinkingSummary(message, useNow(live));
  if (summary === null) return null;
  return (
    <details class="thinking" data-testid="thinking" data-live={live ? 'true' : 'false'}>
      <summary data-testid="thinking-summary">{summary}</summary>
      <div class="thinking-text" data-testid="thinking-text">{message.reasoning}</div>
    </details>
  );
}

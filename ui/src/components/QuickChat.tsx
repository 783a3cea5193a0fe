import { useEffect, useRef, useState } from 'preact/hooks';
import { ApiError, Client, apiBase, isAbort, storedApiKey } from '../api';
import { renderMarkdown } from '../markdown';
import { MAX_IMAGES, readImages } from '../images';
import { QUICK_SAMPLING, conversationOf, notReady, questionContent, type Exchange } from '../quick';
import { thinkingLabel, useNow } from '../thinking';
import type { AppStatus } from '../types';
import { AttachedImages } from './Images';

const client = new Client({ base: apiBase(), apiKey: storedApiKey });

const isMac = /Mac/i.test(navigator.platform || navigator.userAgent);

const invoke = (command: string, args?: Record<string, unknown>) => window.__TAURI_INTERNALS__?.invoke(command, args);

/** Shows a route of the chat window: through the shell in the app, else this tab. */
async function openInChatWindow(route: string) {
  if (window.__TAURI_INTERNALS__) await invoke('open_chat_window', { route });
  else location.href = `index.html${route}`;
}

function text(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The quick-chat panel (quick.html): one question to the default model, its answer
 * streamed, and "Open as conversation" to keep going in the chat window. */
export function QuickChat() {
  const [status, setStatus] = useState<AppStatus | null>(null);
  const [statusError, setStatusError] = useState<string | null>(null);
  const [question, setQuestion] = useState('');
  const [images, setImages] = useState<string[]>([]);
  const [exchange, setExchange] = useState<Exchange | null>(null);
  const [saving, setSaving] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  const answerBox = useRef<HTMLDivElement>(null);
  const stream = useRef<AbortController | null>(null);

  const refresh = async () => {
    try {
      setStatus(await client.status());
      setStatusError(null);
    } catch (error) {
      setStatusError(text(error));
    }
  };

  useEffect(() => {
    const shown = () => {
      void refresh();
      input.current?.focus();
      input.current?.select();
    };
    shown();
    window.addEventListener('seedbar:quick-shown', shown);
    return () => window.removeEventListener('seedbar:quick-shown', shown);
  }, []);

  const blocked = status ? notReady(status) : null;
  // While the model loads or downloads, look again until it is ready.
  useEffect(() => {
    if (!blocked || blocked.canImport) return;
    const timer = setInterval(() => void refresh(), 1000);
    return () => clearInterval(timer);
  }, [blocked?.text]);

  const attach = async (files: File[]) => {
    const { urls, refused } = await readImages(files);
    if (refused.length) setStatusError(`Left out: ${refused.join('; ')}`);
    if (urls.length) setImages((now) => [...now, ...urls].slice(0, MAX_IMAGES));
  };

  const ask = async () => {
    const q = question.trim();
    if ((!q && images.length === 0) || !status?.model || blocked || exchange?.state === 'streaming') return;
    const controller = new AbortController();
    stream.current = controller;
    const update = (patch: Partial<Exchange>) => setExchange((e) => (e ? { ...e, ...patch } : e));
    let answer = '';
    let thinkingSince: number | null = null;
    setExchange({ question: q, images, answer, model: status.model, seed: null, thinkingSince, state: 'streaming', error: null });
    try {
      const seed = await client.complete(
        { model: status.model, messages: [{ role: 'user', content: questionContent(q, images) }], ...QUICK_SAMPLING },
        (piece) => {
          // The thinking stays out of the answer: only when it began is kept, for the clock.
          if (piece.kind === 'content') update({ answer: (answer += piece.text) });
          else if (thinkingSince === null) update({ thinkingSince: (thinkingSince = Date.now()) });
        },
        controller.signal,
      );
      update({ seed, state: 'complete' });
    } catch (error) {
      if (isAbort(error)) update({ state: 'stopped' });
      else {
        update({ state: 'error', error: text(error) });
        if (error instanceof ApiError && error.status === 503) void refresh();
      }
    } finally {
      stream.current = null;
    }
  };

  const save = async () => {
    if (!exchange || exchange.state !== 'complete' || saving) return;
    setSaving(true);
    try {
      const conversation = await client.createConversation(conversationOf(exchange));
      await openInChatWindow(`#/c/${conversation.id}`);
      setExchange(null);
      setQuestion('');
      setImages([]);
    } catch (error) {
      setExchange({ ...exchange, error: text(error) });
    } finally {
      setSaving(false);
    }
  };

  const onKey = (e: KeyboardEvent) => {
    if (e.key === 'Escape') {
      e.preventDefault();
      void invoke('hide_quick_chat');
    } else if (e.key === 'Enter' && (e.metaKey || e.ctrlKey)) {
      e.preventDefault();
      void save();
    }
  };
  useEffect(() => {
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  });

  const streaming = exchange?.state === 'streaming';
  // Follow the streaming answer unless the reader has scrolled up.
  useEffect(() => {
    const box = answerBox.current;
    if (streaming && box && box.scrollHeight - box.scrollTop - box.clientHeight < 80) box.scrollTop = box.scrollHeight;
  }, [exchange?.answer]);
  return (
    <div class="quick" data-testid="quick-chat">
      <form class="quick-ask" onSubmit={(e) => { e.preventDefault(); void ask(); }}
        onDragOver={(e) => { if (e.dataTransfer?.types.includes('Files')) e.preventDefault(); }}
        onDrop={(e) => {
          const files = Array.from(e.dataTransfer?.files ?? []);
          if (files.length === 0) return;
          e.preventDefault();
          void attach(files);
        }}>
        <input ref={input} data-testid="quick-input" value={question} autofocus spellcheck={false} autocomplete="off"
          aria-label="Ask the model" placeholder={status?.model ? `Ask ${status.model}…` : 'Ask Seedbar…'}
          onInput={(e) => setQuestion(e.currentTarget.value)}
          onPaste={(e) => {
            const files = Array.from(e.clipboardData?.files ?? []).filter((f) => f.type.startsWith('image/'));
            if (files.length === 0) return;
            e.preventDefault();
            void attach(files);
          }} />
        {streaming
          ? <button type="button" class="button" data-testid="quick-stop" onClick={() => stream.current?.abort()}>Stop</button>
          : <button type="submit" class="button primary" data-testid="quick-send" disabled={(!question.trim() && images.length === 0) || !!blocked || !status}>Ask</button>}
      </form>
      <AttachedImages urls={images} onRemove={(k) => setImages(images.filter((_, i) => i !== k))} />
      {statusError && <p class="quick-problem" role="alert" data-testid="quick-problem">{statusError}</p>}
      {blocked && (
        <div class="quick-problem" role="status" data-testid="quick-not-ready" data-state={status?.state}>
          <strong>{blocked.text}</strong>
          {blocked.fix && <span>{blocked.fix}</span>}
          {blocked.canImport && (
            <button type="button" class="button" data-testid="quick-import" onClick={() => void openInChatWindow('#/models')}>Import a model…</button>
          )}
        </div>
      )}
      {status?.paused && !blocked && (
        <p class="quick-paused muted small" data-testid="quick-paused">
          Seedbar is paused for other apps; quick chat still answers.
        </p>
      )}
      {exchange && (
        <div class="quick-answer" ref={answerBox} data-testid="quick-answer" data-state={exchange.state} aria-live="polite">
          {exchange.answer
            ? <div class="markdown" data-testid="quick-answer-text" dangerouslySetInnerHTML={{ __html: renderMarkdown(exchange.answer) }} />
            : streaming && (exchange.thinkingSince === null
              ? <span class="typing" aria-label="Waiting for the answer"><i /><i /><i /></span>
              : <Thinking since={exchange.thinkingSince} />)}
          {exchange.error && <p class="field-error" role="alert" data-testid="quick-error">{exchange.error}</p>}
        </div>
      )}
      <footer class="quick-foot">
        <span class="muted small">
          {exchange?.seed != null ? `${exchange.model} · seed ${exchange.seed}` : 'Enter asks · Esc closes'}
        </span>
        {exchange?.state === 'complete' && (
          <span class="quick-actions">
            <button type="button" class="button" data-testid="quick-copy" onClick={() => void navigator.clipboard?.writeText(exchange.answer)}>Copy</button>
            <button type="button" class="button primary" data-testid="quick-open" disabled={saving} title={isMac ? '⌘Enter' : 'Ctrl+Enter'} onClick={() => void save()}>
              Open as conversation
            </button>
          </span>
        )}
      </footer>
    </div>
  );
}

/** While the model thinks, before its answer: for how long so far. */
function Thinking({ since }: { since: number }) {
  return <p class="muted small" data-testid="quick-thinking">{thinkingLabel(since, useNow(true))}</p>;
}

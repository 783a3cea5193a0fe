import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import { exportConversation, importConversationFile, newConversation, replayConversation, reply, stop } from '../actions';
import { drafts, imageDrafts } from '../drafts';
import { IMAGE_TYPES, MAX_IMAGES, readImages } from '../images';
import { toast, useAppState } from '../store';
import type { Replay } from '../types';
import { MessageItem } from './MessageItem';
import { SeedPin } from './SeedPin';
import { SettingsPanel } from './SettingsPanel';
import { Welcome } from './Welcome';
import { AttachedImages } from './Images';
import { IconDownload, IconImage, IconSend, IconSliders, IconStop } from './icons';


export function ChatView({ id }: { id: number | null }) {
  const s = useAppState();
  const [showSettings, setShowSettings] = useState(() => localStorage.getItem('seedbar.settingsOpen') === '1');
  const [replay, setReplay] = useState<{ id: number; result: Replay | 'running' } | null>(null);
  const toggleSettings = () => {
    setShowSettings((v) => {
      try { localStorage.setItem('seedbar.settingsOpen', v ? '0' : '1'); } catch { /* ignore */ }
      return !v;
    });
  };

  if (id === null) {
    // The first run's welcome until it is done or skipped (and its "is your default model now").
    const welcoming = (s.settings && !s.settings.welcomed) || s.welcome?.state === 'done';
    return (
      <section class="chat" data-testid="chat-view">
        <div class="chat-main">
          {welcoming ? (
            <div class="welcome-scroll"><Welcome /></div>
          ) : (
            <div class="welcome">
              <div class="empty-card" data-testid="no-conversation">
                <h1>Seedbar</h1>
                <p>Chat with models on this computer. Pin a seed, and the same question gets the same answer.</p>
                <button type="button" class="button" data-testid="start-chat" onClick={() => void newConversation()}>New chat</button>
              </div>
            </div>
          )}
          <Composer id={null} streaming={false} />
        </div>
      </section>
    );
  }

  const detail = s.details[id];
  const loading = s.loadingDetail[id];
  if (!detail) {
    return (
      <section class="chat empty-state" data-testid="chat-view" aria-busy={loading ? 'true' : undefined}>
        <p class="muted">{loading ? 'Loading…' : 'This conversation could not be loaded.'}</p>
      </section>
    );
  }

  const { conversation, messages } = detail;
  const streaming = !!s.streams[id];
  const remote = s.remotes?.find((r) => r.name === conversation.settings.model);
  let lastReplyIndex = -1;
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role === 'assistant') { lastReplyIndex = i; break; }
    if (messages[i].role === 'user') break;
  }
  let lastSeed: number | null = null;
  for (let i = messages.length - 1; i >= 0; i--) if (messages[i].seed !== null) { lastSeed = messages[i].seed; break; }

  return (
    <section class="chat" data-testid="chat-view" data-conversation={id} data-streaming={streaming ? 'true' : 'false'}
      data-replies={s.finished[id] ?? 0}>
      <div class="chat-main">
        <header class="chat-head">
          <div class="chat-title-block">
            <h1 class="chat-title" data-testid="chat-title">{conversation.title}</h1>
            <span class="chat-model" data-testid="chat-model">
              {conversation.settings.model}
              {remote && <span class="badge" data-testid="chat-model-remote" title={`Runs on ${remote.url}`}>remote: {remote.owner}</span>}
            </span>
          </div>
          <SeedPin conversation={conversation} lastSeed={lastSeed} />
          <ExportMenu id={id} busy={streaming || replay?.result === 'running'} onReplay={async () => {
            setReplay({ id, result: 'running' });
            const result = await replayConversation(id);
            setReplay(result ? { id, result } : null);
          }} />
          <button type="button" class={`icon-button${showSettings ? ' active' : ''}`} data-testid="toggle-settings"
            aria-label="Chat settings" aria-expanded={showSettings} title="Chat settings" onClick={toggleSettings}>
            <IconSliders size={18} />
          </button>
        </header>
        {replay?.id === id && <ReplayResult replay={replay.result} onClose={() => setReplay(null)} />}
        <MessageList id={id} streaming={streaming}>
          {messages.length === 0 ? (
            <div class="chat-empty" data-testid="empty-chat">
              <p>Ask anything.</p>
              <p class="muted small">{conversation.settings.seed === null
                ? 'Each reply draws a random seed, shown under it; pin it to repeat the reply.'
                : `Seed ${conversation.settings.seed} is pinned: the same question gives the same reply.`}</p>
            </div>
          ) : (
            messages.map((m, i) => (
              <MessageItem key={m.id} message={m} pinnedSeed={conversation.settings.seed} isLastReply={i === lastReplyIndex} busy={streaming} />
            ))
          )}
        </MessageList>
        <Composer id={id} streaming={streaming} />
      </div>
      {showSettings && <SettingsPanel conversation={conversation} onClose={toggleSettings} />}
    </section>
  );
}

function MessageList({ id, streaming, children }: { id: number; streaming: boolean; children: preact.ComponentChildren }) {
  const ref = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  // Open a conversation at its end.
  useLayoutEffect(() => {
    stick.current = true;
    const el = ref.current;
    if (el) el.scrollTop = el.scrollHeight;
  }, [id]);
  // Follow the stream while the reader is at the bottom.
  useLayoutEffect(() => {
    const el = ref.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });
  return (
    <div class="messages" ref={ref} data-testid="messages" aria-live={streaming ? 'off' : 'polite'}
      onScroll={(e) => {
        const el = e.currentTarget;
        stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
      }}>
      <div class="messages-inner">{children}</div>
    </div>
  );
}

function Composer({ id: convId, streaming }: { id: number | null; streaming: boolean }) {
  const id = convId ?? -1; // the welcome screen's composer starts a conversation
  const [text, setText] = useState(drafts.get(id) ?? '');
  const [images, setImages] = useState<string[]>(imageDrafts.get(id) ?? []);
  const [dragging, setDragging] = useState(false);
  const ref = useRef<HTMLTextAreaElement>(null);
  const picker = useRef<HTMLInputElement>(null);

  useEffect(() => {
    setText(drafts.get(id) ?? '');
    setImages(imageDrafts.get(id) ?? []);
    ref.current?.focus();
  }, [id]);
  // A send the server refused gives its text and images back.
  const restored = useAppState().restoredDraft;
  useEffect(() => {
    if (restored && restored.id === id) {
      setText(drafts.get(id) ?? '');
      setImages(imageDrafts.get(id) ?? []);
    }
  }, [restored]);

  const setAttached = (next: string[]) => {
    setImages(next);
    if (next.length) imageDrafts.set(id, next);
    else imageDrafts.delete(id);
  };
  const attach = async (files: Iterable<File>) => {
    const { urls, refused } = await readImages(files);
    const room = MAX_IMAGES - images.length;
    if (refused.length) toast(`Left out: ${refused.join('; ')}`);
    if (urls.length > room) toast(`A message holds at most ${MAX_IMAGES} images`);
    if (urls.length) setAttached([...(imageDrafts.get(id) ?? []), ...urls.slice(0, Math.max(room, 0))]);
  };

  useLayoutEffect(() => {
    const el = ref.current;
    if (!el) return;
    el.style.height = 'auto';
    el.style.height = `${Math.min(el.scrollHeight, 220)}px`;
  }, [text]);

  const update = (value: string) => {
    setText(value);
    if (value) drafts.set(id, value);
    else drafts.delete(id);
  };

  const send = () => {
    const content = text.trim();
    const sent = images;
    if ((!content && sent.length === 0) || streaming) return;
    update('');
    setAttached([]);
    const request = { kind: 'send' as const, content, images: sent };
    if (convId !== null) {
      void reply(convId, request);
    } else {
      void newConversation().then((c) => {
        if (c) void reply(c.id, request);
        else {
          update(content);
          setAttached(sent);
        }
      });
    }
  };

  return (
    <form class={`composer${dragging ? ' dragging' : ''}`} data-testid="composer" onSubmit={(e) => { e.preventDefault(); send(); }}
      onDragOver={(e) => {
        if (!e.dataTransfer?.types.includes('Files')) return;
        e.preventDefault();
        setDragging(true);
      }}
      onDragLeave={() => setDragging(false)}
      onDrop={(e) => {
        setDragging(false);
        const files = e.dataTransfer?.files;
        if (!files?.length) return;
        e.preventDefault();
        void attach(Array.from(files));
      }}>
      <AttachedImages urls={images} onRemove={(k) => setAttached(images.filter((_, i) => i !== k))} />
      <button type="button" class="icon-button attach-button" data-testid="attach" aria-label="Attach images"
        title="Attach images (or paste or drop them)" onClick={() => picker.current?.click()}>
        <IconImage size={18} />
      </button>
      <input ref={picker} type="file" accept={IMAGE_TYPES.join(',')} multiple hidden data-testid="attach-file"
        onChange={(e) => {
          const files = Array.from(e.currentTarget.files ?? []);
          e.currentTarget.value = '';
          void attach(files);
        }} />
      <textarea ref={ref} data-testid="composer-input" rows={1} value={text} aria-label="Message"
        placeholder={streaming ? 'Replying…' : 'Message'} title="Enter sends, Shift+Enter starts a new line"
        aria-description="Enter sends, Shift+Enter starts a new line"
        onPaste={(e) => {
          const files = Array.from(e.clipboardData?.files ?? []).filter((f) => f.type.startsWith('image/'));
          if (files.length === 0) return;
          e.preventDefault();
          void attach(files);
        }}
        onInput={(e) => update(e.currentTarget.value)}
        onKeyDown={(e) => {
          if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
            e.preventDefault();
            send();
          }
          if (e.key === 'Escape' && streaming && convId !== null) { e.preventDefault(); stop(convId); }
        }} />
      {streaming ? (
        <button type="button" class="send-button stop" data-testid="stop" aria-label="Stop replying" title="Stop (Esc)" onClick={() => convId !== null && stop(convId)}>
          <IconStop size={16} />
        </button>
      ) : (
        <button type="submit" class="send-button" data-testid="send" aria-label="Send" title="Send (Enter)" disabled={!text.trim() && images.length === 0}>
          <IconSend size={16} />
        </button>
      )}
    </form>
  );
}

/** What a replay found: how many seeded replies came out the same, and for the others why
 *  they may not (where their receipts differ from this machine's). */
function ReplayResult({ replay, onClose }: { replay: Replay | 'running'; onClose: () => void }) {
  if (replay === 'running') {
    return <div class="replay-result" role="status" data-testid="replay-result" data-state="running">Replaying the seeded replies…</div>;
  }
  const all = replay.total > 0 && replay.identical === replay.total;
  return (
    <div class={`replay-result ${all ? 'ok' : 'warn'}`} role="status" data-testid="replay-result" data-state="done">
      <strong data-testid="replay-summary">
        {replay.total === 0 ? 'No seeded replies to replay.' : `${replay.identical} of ${replay.total} seeded replies came out identical.`}
      </strong>
      {replay.replies.filter((r) => !r.identical).map((r) => (
        <p key={r.message_id} class="small" data-testid="replay-difference">
          A reply came out different{r.error ? `: ${r.error}` : ''}.
          {r.differences.length > 0 ? ` Its receipt differs here: ${r.differences.join('; ')}.` : ' Its receipt matches this machine.'}
        </p>
      ))}
      <button type="button" class="link-button" onClick={onClose}>Dismiss</button>
    </div>
  );
}

/** Export the conversation (Markdown to read, JSON with the seeds that reproduce each reply),
 *  import a JSON export, and replay this conversation's seeded replies. */
function ExportMenu({ id, busy, onReplay }: { id: number; busy: boolean; onReplay: () => void }) {
  const [open, setOpen] = useState(false);
  const file = useRef<HTMLInputElement>(null);
  const save = (format: 'markdown' | 'json') => {
    setOpen(false);
    void exportConversation(id, format);
  };
  return (
    <div class="export-menu">
      <button type="button" class={`icon-button${open ? ' active' : ''}`} data-testid="export-toggle"
        aria-label="Export conversation" aria-expanded={open} title="Export conversation" onClick={() => setOpen((v) => !v)}>
        <IconDownload size={18} />
      </button>
      {open && (
        <div class="export-options" role="menu">
          <button type="button" role="menuitem" data-testid="export-markdown" onClick={() => save('markdown')}>Markdown</button>
          <button type="button" role="menuitem" data-testid="export-json" onClick={() => save('json')}>JSON (with seeds)</button>
          <button type="button" role="menuitem" data-testid="replay" disabled={busy}
            title="Regenerate each seeded reply and compare" onClick={() => { setOpen(false); onReplay(); }}>Replay seeded replies</button>
          <button type="button" role="menuitem" data-testid="import-conversation" onClick={() => file.current?.click()}>Import a JSON export…</button>
        </div>
      )}
      <input ref={file} type="file" accept=".json,application/json" hidden data-testid="import-file"
        onChange={(e) => {
          const chosen = e.currentTarget.files?.[0];
          e.currentTarget.value = '';
          setOpen(false);
          if (chosen) void importConversationFile(chosen);
        }} />
    </div>
  );
}

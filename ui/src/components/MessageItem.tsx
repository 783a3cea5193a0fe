import { Component } from 'preact';
import { useMemo, useRef, useState } from 'preact/hooks';
import { client, copyText, reply, updateSettings } from '../actions';
import type { UiMessage } from '../convList';
import { renderMarkdown } from '../markdown';
import { seedNotPromised, seedPromise } from '../remote';
import { formatSeed } from '../seed';
import { IconCheck, IconCopy, IconPencil, IconPin, IconRefresh } from './icons';
import { MessageImages } from './Images';
import { Receipt } from './Receipt';
import { ThinkingBlock } from './ThinkingBlock';

type Props = {
  message: UiMessage;
  pinnedSeed: number | null;
  isLastReply: boolean;
  busy: boolean;
};

function onContentClick(e: MouseEvent) {
  const target = e.target as HTMLElement;
  const button = target.closest?.('[data-action="copy-code"]');
  if (!button) return;
  const code = button.closest('.code-block')?.querySelector('code');
  if (code) void copyText(code.textContent ?? '', 'Code copied');
}

function MessageItemInner({ message, pinnedSeed, isLastReply, busy }: Props) {
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState(message.content);
  const html = useMemo(() => (message.role === 'assistant' ? renderMarkdown(message.content) : ''), [message.content, message.role]);
  const time = message.created_at ? new Date(message.created_at) : null;
  const editRef = useRef<HTMLTextAreaElement>(null);

  const submitEdit = () => {
    const content = draft.trim();
    if (!content) return;
    setEditing(false);
    void reply(message.conversation_id, { kind: 'edit', messageId: message.id, content });
  };

  const status = message.streaming ? 'streaming' : message.status;
  const writing = message.streaming || message.status === 'streaming';
  return (
    <article class={`message ${message.role}${message.pending ? ' pending' : ''}`} data-testid="message" data-role={message.role}
      data-status={status} data-id={message.id} aria-busy={message.streaming ? 'true' : undefined}
      aria-label={message.role === 'user' ? 'You' : 'Assistant'}>
      {message.role === 'user' ? (
        editing ? (
          <div class="edit-box">
            <textarea ref={editRef} data-testid="edit-input" aria-label="Edit message" value={draft} rows={Math.min(10, draft.split('\n').length + 1)}
              autofocus onInput={(e) => setDraft(e.currentTarget.value)}
              onKeyDown={(e) => {
                if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submitEdit(); }
                if (e.key === 'Escape') { e.preventDefault(); setEditing(false); }
              }} />
            <div class="edit-buttons">
              <button type="button" class="button" onClick={() => setEditing(false)}>Cancel</button>
              <button type="button" class="button primary" data-testid="edit-submit" disabled={!draft.trim() || busy} onClick={submitEdit}>Save &amp; send</button>
            </div>
          </div>
        ) : (
          <>
            <MessageImages ids={message.images} local={message.localImages} load={(id) => client.imageUrl(id)} />
            {message.content && <div class="bubble" data-testid="message-content">{message.content}</div>}
          </>
        )
      ) : (
        <div class="reply">
          <ThinkingBlock message={message} />
          {message.content ? (
            <div class="markdown" data-testid="message-content" onClick={onContentClick} dangerouslySetInnerHTML={{ __html: html }} />
          ) : writing ? (
            <div class="markdown" data-testid="message-content">
              {!message.reasoning && <span class="typing" aria-label="Waiting for the reply"><i /><i /><i /></span>}
            </div>
          ) : (
            <div class="markdown empty" data-testid="message-content" />
          )}
          {message.streaming && message.content && <span class="caret" aria-hidden="true" />}
          {message.status === 'stopped' && !message.streaming && <div class="note" data-testid="message-stopped">Stopped</div>}
          {message.status === 'error' && (
            <div class="note error" role="alert" data-testid="message-error">{message.error ?? 'This reply failed.'}</div>
          )}
        </div>
      )}
      {!editing && !message.pending && (
        <footer class="message-actions">
          {message.role === 'assistant' && message.seed !== null && (
            <span class="seed-info">
              <span class="seed-label" data-testid="message-seed" title="The seed this reply used">seed {formatSeed(message.seed)}</span>
              {seedNotPromised(message) && (
                <span class="seed-unsure" data-testid="seed-not-promised" title={`${seedPromise(false)}: a replay may differ.`}>
                  seed sent; not guaranteed
                </span>
              )}
              {pinnedSeed === message.seed ? (
                <span class="pinned-note"><IconCheck size={12} /> pinned</span>
              ) : (
                <button type="button" class="link-button" data-testid="pin-seed" disabled={message.streaming}
                  onClick={() => void updateSettings(message.conversation_id, { seed: message.seed }, 'Pinning the seed failed')}>
                  <IconPin size={12} /> pin this seed
                </button>
              )}
              {!message.streaming && <Receipt message={message} />}
            </span>
          )}
          {message.content && (
            <button type="button" class="icon-button small" data-testid="copy-message" title="Copy" aria-label="Copy message"
              onClick={() => void copyText(message.content, 'Message copied')}><IconCopy size={13} /></button>
          )}
          {message.role === 'user' && message.id > 0 && (
            <button type="button" class="icon-button small" data-testid="edit-message" title="Edit and resend" aria-label="Edit and resend"
              disabled={busy} onClick={() => { setDraft(message.content); setEditing(true); }}><IconPencil size={13} /></button>
          )}
          {isLastReply && !message.streaming && (
            <button type="button" class="icon-button small" data-testid="regenerate" title="Regenerate" aria-label="Regenerate reply"
              disabled={busy} onClick={() => void reply(message.conversation_id, { kind: 'regenerate' })}><IconRefresh size={13} /></button>
          )}
          {time && !Number.isNaN(time.getTime()) && (
            <time class="time" dateTime={message.created_at} title={time.toLocaleString()}>
              {time.toLocaleTimeString([], { hour: 'numeric', minute: '2-digit' })}
            </time>
          )}
        </footer>
      )}
    </article>
  );
}

/** Re-renders only when its props change (the streaming message changes; the rest don't). */
export class MessageItem extends Component<Props> {
  shouldComponentUpdate(next: Props) {
    const p = this.props;
    return p.message !== next.message || p.pinnedSeed !== next.pinnedSeed || p.isLastReply !== next.isLastReply || p.busy !== next.busy;
  }
  render(props: Props) {
    return <MessageItemInner {...props} />;
  }
}

import { useEffect, useRef, useState } from 'preact/hooks';
import {
  deleteConversation, loadConversations, navigate, newConversation, renameConversation, setQuery,
} from '../actions';
import { useAppState } from '../store';
import type { Conversation } from '../types';
import { confirmAction } from './Dialogs';
import { IconBox, IconChat, IconGear, IconPencil, IconPlus, IconSearch, IconTrash } from './icons';

export function Sidebar() {
  const s = useAppState();
  const { conversations, conversationsLoaded, query, route, streams } = s;
  const searchTimer = useRef<ReturnType<typeof setTimeout>>(undefined);

  const onSearch = (value: string) => {
    setQuery(value);
    clearTimeout(searchTimer.current);
    searchTimer.current = setTimeout(() => void loadConversations(value), 200);
  };

  const currentId = route.view === 'chat' ? route.id : null;
  return (
    <nav class="sidebar" aria-label="Conversations">
      <div class="sidebar-top">
        <div class="brand"><StatusDot />Seedbar</div>
        <button type="button" class="icon-button" data-testid="new-chat" title="New chat (⌘N)" aria-label="New chat"
          onClick={() => void newConversation()}>
          <IconPlus size={18} />
        </button>
      </div>
      <div class="search">
        <IconSearch size={14} class="search-icon" />
        <input type="search" placeholder="Search" aria-label="Search conversations" data-testid="search" value={query}
          onInput={(e) => onSearch(e.currentTarget.value)}
          onKeyDown={(e) => { if (e.key === 'Escape' && query) { e.preventDefault(); onSearch(''); } }} />
      </div>
      <ul class="conversation-list" data-testid="conversation-list" role="list">
        {!conversationsLoaded && <li class="list-note">Loading…</li>}
        {conversationsLoaded && s.conversationsError && conversations.length === 0 && (
          <li class="list-note error" role="alert" data-testid="conversations-error">
            Couldn't load conversations.{' '}
            <button type="button" class="link-button" onClick={() => void loadConversations()}>Try again</button>
          </li>
        )}
        {conversationsLoaded && !s.conversationsError && conversations.length === 0 && (
          <li class="list-note" data-testid="conversations-empty">{query ? 'No conversation matches.' : 'No conversations yet.'}</li>
        )}
        {conversations.map((c) => (
          <ConversationItem key={c.id} conversation={c} selected={c.id === currentId} streaming={!!streams[c.id]} />
        ))}
      </ul>
      <div class="sidebar-nav">
        <NavButton label="Chats" testid="nav-chats" active={route.view === 'chat'} onClick={() => navigate({ view: 'chat', id: currentId ?? conversations[0]?.id ?? null })}><IconChat /></NavButton>
        <NavButton label="Models" testid="nav-models" active={route.view === 'models'} onClick={() => navigate({ view: 'models' })}><IconBox /></NavButton>
        <NavButton label="Settings" testid="nav-settings" active={route.view === 'settings'} onClick={() => navigate({ view: 'settings' })}><IconGear /></NavButton>
      </div>
    </nav>
  );
}

const DOT_TITLES: Record<string, string> = {
  ready: 'Ready', loading: 'Loading the model…', downloading: 'Downloading the model…', no_model: 'No model installed', error: 'The model is not available',
};

/** The server's state at a glance: green when a model answers. */
function StatusDot() {
  const { status, conversationsError } = useAppState();
  const state = status ? (status.paused ? 'paused' : status.state) : conversationsError ? 'unreachable' : 'starting';
  const title = status?.paused ? 'Paused for outside clients' : status ? DOT_TITLES[status.state] : conversationsError ? 'Cannot reach the server' : 'Starting…';
  return <span class={`brand-dot ${state}`} data-testid="status-dot" data-state={state} title={title} role="img" aria-label={title} />;
}

function NavButton(props: { label: string; testid: string; active: boolean; onClick: () => void; children: preact.ComponentChildren }) {
  return (
    <button type="button" class={`nav-button${props.active ? ' active' : ''}`} data-testid={props.testid}
      aria-label={props.label} title={props.label} aria-current={props.active ? 'page' : undefined} onClick={props.onClick}>
      {props.children}<span>{props.label}</span>
    </button>
  );
}

function ConversationItem({ conversation, selected, streaming }: { conversation: Conversation; selected: boolean; streaming: boolean }) {
  const [editing, setEditing] = useState(false);
  const [title, setTitle] = useState(conversation.title);
  const input = useRef<HTMLInputElement>(null);

  useEffect(() => {
    if (editing) {
      input.current?.focus();
      input.current?.select();
    }
  }, [editing]);

  const startRename = () => {
    setTitle(conversation.title);
    setEditing(true);
  };
  const commit = async () => {
    if (title.trim() === conversation.title) return setEditing(false);
    if (await renameConversation(conversation.id, title)) setEditing(false);
  };
  const remove = async () => {
    const ok = await confirmAction('Delete this conversation?', `“${conversation.title}” and all its messages will be deleted. This cannot be undone.`);
    if (ok) await deleteConversation(conversation.id);
  };

  return (
    <li class={`conversation${selected ? ' selected' : ''}`} data-testid="conversation-item" data-id={conversation.id}>
      {editing ? (
        <input ref={input} class="rename-input" data-testid="rename-input" value={title} aria-label="Conversation title"
          onInput={(e) => setTitle(e.currentTarget.value)}
          onBlur={() => void commit()}
          onKeyDown={(e) => {
            if (e.key === 'Enter') { e.preventDefault(); void commit(); }
            if (e.key === 'Escape') { e.preventDefault(); setEditing(false); }
          }} />
      ) : (
        <a class="conversation-link" href={`#/c/${conversation.id}`} aria-current={selected ? 'page' : undefined}
          onDblClick={startRename} onKeyDown={(e) => { if (e.key === 'F2') { e.preventDefault(); startRename(); } }}>
          {streaming && <span class="streaming-dot" data-testid="streaming-indicator" title="Replying…" aria-label="Replying" />}
          <span class="conversation-title" data-testid="conversation-title">{conversation.title}</span>
          {conversation.settings.seed !== null && <span class="seed-badge" title={`Seed ${conversation.settings.seed} pinned`} aria-label="Seed pinned">#</span>}
        </a>
      )}
      {!editing && (
        <span class="row-actions">
          <button type="button" class="icon-button small" data-testid="rename-conversation" aria-label={`Rename ${conversation.title}`} title="Rename" onClick={startRename}>
            <IconPencil size={14} />
          </button>
          <button type="button" class="icon-button small" data-testid="delete-conversation" aria-label={`Delete ${conversation.title}`} title="Delete" onClick={() => void remove()}>
            <IconTrash size={14} />
          </button>
        </span>
      )}
    </li>
  );
}

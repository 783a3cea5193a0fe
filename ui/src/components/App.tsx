import { useEffect } from 'preact/hooks';
import { newConversation } from '../actions';
import { dismissToast, useAppState } from '../store';
import { ChatView } from './ChatView';
import { ApiKeyDialog, ConfirmHost } from './Dialogs';
import { ModelLibrary } from './ModelLibrary';
import { SettingsView } from './SettingsView';
import { Sidebar } from './Sidebar';
import { StatusBanner } from './StatusBanner';
import { IconClose } from './icons';

export function App() {
  const s = useAppState();

  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      const mod = e.metaKey || e.ctrlKey;
      if (mod && !e.shiftKey && !e.altKey && e.key.toLowerCase() === 'n') {
        e.preventDefault();
        void newConversation();
      }
      if (mod && e.key.toLowerCase() === 'k') {
        e.preventDefault();
        document.querySelector<HTMLInputElement>('[data-testid="search"]')?.focus();
      }
    };
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, []);

  const { route, status } = s;
  const title = route.view === 'chat' && route.id !== null ? s.details[route.id]?.conversation.title : route.view === 'models' ? 'Models' : route.view === 'settings' ? 'Settings' : undefined;
  useEffect(() => {
    document.title = title ? `${title} — Seedbar` : 'Seedbar';
  }, [title]);
  return (
    <div class="app">
      <Sidebar />
      <main class="main">
        {status && status.state !== 'ready' && <StatusBanner status={status} />}
        {route.view === 'chat' && <ChatView id={route.id} />}
        {route.view === 'models' && <ModelLibrary />}
        {route.view === 'settings' && <SettingsView />}
      </main>
      <div class="toasts" aria-live="assertive">
        {s.toasts.map((t) => (
          <div key={t.id} class={`toast ${t.kind}`} role={t.kind === 'error' ? 'alert' : 'status'} data-testid={t.kind === 'error' ? 'error-toast' : 'info-toast'}>
            <span>{t.message}</span>
            <button type="button" class="icon-button small" aria-label="Dismiss" onClick={() => dismissToast(t.id)}><IconClose size={12} /></button>
          </div>
        ))}
      </div>
      <ConfirmHost />
      <ApiKeyDialog />
    </div>
  );
}

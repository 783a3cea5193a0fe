// Confirmation dialog (native <dialog>: focus trap and Escape for free) and the API key prompt.
import { useEffect, useRef, useState } from 'preact/hooks';
import { submitApiKey } from '../actions';
import { getState, setState, useAppState } from '../store';

type Confirm = { title: string; message: string; action: string; resolve: (ok: boolean) => void };

let current: Confirm | null = null;
let render: (() => void) | null = null;

/** Asks before something that cannot be undone. */
export function confirmAction(title: string, message: string, action = 'Delete'): Promise<boolean> {
  current?.resolve(false);
  return new Promise((resolve) => {
    current = { title, message, action, resolve };
    render?.();
  });
}

export function ConfirmHost() {
  const [, setTick] = useState(0);
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    render = () => setTick((t) => t + 1);
    return () => {
      render = null;
    };
  }, []);
  const pending = current;
  useEffect(() => {
    const dialog = ref.current;
    if (!dialog) return;
    if (pending && !dialog.open) dialog.showModal();
    if (!pending && dialog.open) dialog.close();
  }, [pending]);
  const finish = (ok: boolean) => {
    const c = current;
    current = null;
    c?.resolve(ok);
    render?.();
  };
  return (
    <dialog ref={ref} class="dialog" data-testid="confirm-dialog" aria-labelledby="confirm-title"
      onCancel={(e) => { e.preventDefault(); finish(false); }}>
      {pending && (
        <form method="dialog" onSubmit={(e) => { e.preventDefault(); finish(true); }}>
          <h2 id="confirm-title">{pending.title}</h2>
          <p>{pending.message}</p>
          <div class="dialog-buttons">
            <button type="button" class="button" data-testid="confirm-cancel" onClick={() => finish(false)}>Cancel</button>
            <button type="submit" class="button danger" data-testid="confirm-ok" autofocus>{pending.action}</button>
          </div>
        </form>
      )}
    </dialog>
  );
}

export function ApiKeyDialog() {
  const { needKey } = useAppState();
  const ref = useRef<HTMLDialogElement>(null);
  const [key, setKey] = useState('');
  useEffect(() => {
    const dialog = ref.current;
    if (!dialog) return;
    if (needKey && !dialog.open) dialog.showModal();
    if (!needKey && dialog.open) dialog.close();
  }, [needKey]);
  return (
    <dialog ref={ref} class="dialog" data-testid="api-key-dialog" aria-labelledby="key-title"
      onCancel={(e) => { e.preventDefault(); if (getState().needKey) setState({ needKey: null }); }}>
      {needKey && (
        <form onSubmit={(e) => { e.preventDefault(); if (key.trim()) void submitApiKey(key); }}>
          <h2 id="key-title">API key needed</h2>
          <p>This Seedbar server asks for an API key. It is kept in this browser for next time.</p>
          <p class="muted small">{needKey.message}</p>
          <label class="field">
            <span>API key</span>
            <input type="password" autocomplete="off" spellcheck={false} value={key} data-testid="api-key-input" autofocus
              onInput={(e) => setKey(e.currentTarget.value)} />
          </label>
          <div class="dialog-buttons">
            <button type="button" class="button" onClick={() => setState({ needKey: null })}>Not now</button>
            <button type="submit" class="button primary" data-testid="api-key-submit" disabled={!key.trim()}>Use key</button>
          </div>
        </form>
      )}
    </dialog>
  );
}

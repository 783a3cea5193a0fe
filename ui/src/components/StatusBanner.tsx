import { importModel, navigate, report, retryModel } from '../actions';
import { hasNativePicker, pickModelPath } from '../picker';
import type { AppStatus } from '../types';

/** Says what the default model is doing when it is not ready, and offers the fixes. */
export function StatusBanner({ status }: { status: AppStatus }) {
  const { state, model, percent, problem, fix, actions } = status;
  const text =
    state === 'loading' ? `Loading ${model ?? 'the model'}…`
      : state === 'downloading' ? `Downloading ${model}${percent === null ? '…' : ` · ${percent}%`}`
        : problem ?? 'No model is ready.';
  return (
    <div class={`banner ${state}`} role="status" data-testid="status-banner" data-state={state}>
      <div class="banner-text">
        <span data-testid="status-problem">{text}</span>
        {fix && <span class="banner-fix" data-testid="status-fix">{fix}</span>}
      </div>
      {state === 'downloading' && <progress max={100} value={percent ?? undefined} aria-label={text} />}
      <div class="banner-actions">
        {actions.includes('retry_download') && (
          <button type="button" class="button" data-testid="status-retry" onClick={() => void retryModel()}>Retry download</button>
        )}
        {actions.includes('import') && (
          <button type="button" class="button primary" data-testid="status-import" onClick={() => void importFromBanner()}>Import a model…</button>
        )}
      </div>
    </div>
  );
}

/** The native picker where there is one, else the library's path field. */
async function importFromBanner() {
  if (!hasNativePicker()) {
    navigate({ view: 'models' });
    setTimeout(() => document.querySelector<HTMLInputElement>('[data-testid="import-path"]')?.focus(), 50);
    return;
  }
  try {
    const path = await pickModelPath(false);
    if (path) await importModel(path);
  } catch (error) {
    report(error);
  }
}

// The first run's welcome, above the empty chat (never in its way): what this machine has, the
// model the catalogue recommends for it, the others by size class, one click to download one
// and make it the default model; offline, importing a file instead; or skipping it all.
import { chooseWelcomeModel, closeWelcome, loadCatalogue, skipWelcome, welcomeImported } from '../actions';
import { formatBytes } from '../format';
import { useAppState } from '../store';
import type { CatalogueFormat, CatalogueModel } from '../types';
import { describeMachine, formatLabel, otherModels, recommendation, type Choice } from '../welcome';
import { ImportForm, PullRow } from './ModelLibrary';
import { IconDownload } from './icons';

export function Welcome() {
  const { catalogue, catalogueError, welcome, pulls, status } = useAppState();
  const busy = welcome?.state === 'downloading' || welcome?.state === 'saving';
  const pull = welcome?.pull ? pulls.find((p) => p.repo === welcome.pull) : undefined;
  const pick = catalogue && recommendation(catalogue);

  return (
    <section class="welcome-card" data-testid="welcome" data-state={welcome?.state ?? 'choosing'} aria-labelledby="welcome-title">
      <h1 id="welcome-title">Welcome to Seedbar</h1>
      {catalogue && (
        <p class="welcome-machine">This computer: <strong data-testid="welcome-machine">{describeMachine(catalogue.memory_bytes, catalogue.backend)}</strong></p>
      )}

      {welcome?.state === 'done' ? (
        <div class="welcome-done">
          <p class="ok-box" role="status" data-testid="welcome-done">{welcome.name} is your default model now.</p>
          {status?.model === welcome.model_name && status.state === 'ready'
            ? <p class="muted small" data-testid="welcome-ready">It is ready: ask it anything below.</p>
            : <p class="muted small">It loads in the background; chats use it once it has loaded.</p>}
          <button type="button" class="button" data-testid="welcome-close" onClick={closeWelcome}>Close</button>
        </div>
      ) : (
        <>
          <p class="muted">The small model that came with Seedbar answers already. A larger one answers better: this one suits this computer.</p>
          {catalogueError && (
            <div class="error-box" role="alert">
              {catalogueError} <button type="button" class="link-button" onClick={() => void loadCatalogue()}>Try again</button>
            </div>
          )}
          {!catalogue && !catalogueError && <p class="muted">Loading the models…</p>}
          {pick && (
            <div class="welcome-pick" data-testid="welcome-recommended" data-pull={pick.format.pull}>
              <div class="welcome-pick-head">
                <strong class="welcome-pick-name">{pick.model.name}</strong>
                <span class="badge accent">recommended</span>
                {pick.model.thinks && <ThinksBadge />}
              </div>
              <p class="welcome-about">{pick.model.about}</p>
              <p class="muted small"><FormatFacts format={pick.format} /></p>
              <DownloadButton choice={pick} busy={busy} primary />
            </div>
          )}

          {welcome?.state === 'failed' && <p class="error-box welcome-error" role="alert" data-testid="welcome-error">{welcome.error}</p>}
          {pull && welcome?.state !== 'saving' && (
            <ul class="pulls" role="list" aria-label="Download">
              <PullRow pull={pull} />
            </ul>
          )}
          {welcome?.state === 'saving' && <p class="muted" role="status">Making {welcome.name} your default model…</p>}
          {welcome?.state === 'failed' && (
            <div class="welcome-import">
              <p class="small">Have a model as a file already? Import it and it becomes the default model.</p>
              <ImportForm onImported={(model) => void welcomeImported(model)} />
            </div>
          )}

          {catalogue && <OtherModels models={catalogue.models} busy={busy} />}

          <div class="welcome-buttons">
            <button type="button" class="button" data-testid="welcome-skip" disabled={busy} onClick={() => void skipWelcome()}>
              Skip — keep the small model
            </button>
          </div>
        </>
      )}
    </section>
  );
}

function OtherModels({ models, busy }: { models: CatalogueModel[]; busy: boolean }) {
  const groups = otherModels(models);
  if (groups.length === 0) return null;
  return (
    <div class="welcome-others" data-testid="welcome-others">
      <h2>Other models</h2>
      {groups.map((group) => (
        <div key={group.size_class} class="welcome-group">
          <h3>{group.size_class} parameters</h3>
          <ul role="list">
            {group.models.flatMap((model) => model.formats.map((format) => (
              <li key={format.pull} class="welcome-row" data-testid="welcome-model" data-pull={format.pull}>
                <span class="welcome-row-name" title={model.about}>
                  {model.name}
                  {model.thinks && <ThinksBadge />}
                </span>
                <span class="muted small"><FormatFacts format={format} /></span>
                <DownloadButton choice={{ model, format }} busy={busy} />
              </li>
            )))}
          </ul>
        </div>
      ))}
    </div>
  );
}

function ThinksBadge() {
  return <span class="badge" title="Reasons before it answers; the chat shows its thinking apart">thinks</span>;
}

/** "MLX 4-bit · 2.3 GB download · needs 2.8 GB of memory", and whether it is there or too large. */
function FormatFacts({ format }: { format: CatalogueFormat }) {
  return (
    <>
      {formatLabel(format.format)} · {formatBytes(format.download_bytes)} download · needs {formatBytes(format.memory_bytes)} of memory
      {format.installed && <span class="badge" data-testid="welcome-installed">installed</span>}
      {!format.fits && <span class="badge warning" data-testid="welcome-too-large">too large for this machine</span>}
    </>
  );
}

/** Downloads the model and makes it the default; one already installed becomes the default at once. */
function DownloadButton({ choice, busy, primary }: { choice: Choice; busy: boolean; primary?: boolean }) {
  const { format, model } = choice;
  const label = format.installed ? 'Use it' : 'Download';
  return (
    <button type="button" class={`button${primary ? ' primary' : ''}`} data-testid="welcome-download" data-pull={format.pull}
      disabled={busy || !format.fits} title={format.fits ? undefined : 'It needs more memory than is free on this machine'}
      aria-label={`${label} ${model.name} (${formatLabel(format.format)})`} onClick={() => void chooseWelcomeModel(choice)}>
      {!format.installed && <IconDownload size={14} />} {label}
    </button>
  );
}

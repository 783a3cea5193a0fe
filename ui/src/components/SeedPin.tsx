// The conversation's pinned seed: shown, editable, copyable, unpinned with one click.
import { useEffect, useRef, useState } from 'preact/hooks';
import { copyText, updateSettings } from '../actions';
import { formatSeed, parseSeed, randomSeed } from '../seed';
import type { Conversation } from '../types';
import { IconClose, IconCopy, IconDice, IconPin } from './icons';

export function SeedPin({ conversation, lastSeed }: { conversation: Conversation; lastSeed: number | null }) {
  const pinned = conversation.settings.seed;
  const [text, setText] = useState(pinned === null ? '' : formatSeed(pinned));
  const [error, setError] = useState<string | null>(null);
  const [editing, setEditing] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  const cancelling = useRef(false);

  useEffect(() => {
    setText(pinned === null ? '' : formatSeed(pinned));
    setError(null);
  }, [pinned, conversation.id]);

  useEffect(() => {
    if (editing) input.current?.select();
  }, [editing]);

  const save = async () => {
    const parsed = parseSeed(text);
    if (!parsed.ok) {
      setError(parsed.error);
      return;
    }
    setError(null);
    if (parsed.seed !== pinned) {
      if (!(await updateSettings(conversation.id, { seed: parsed.seed }, 'Pinning the seed failed'))) return;
    }
    setText(formatSeed(parsed.seed));
    setEditing(false);
  };

  const unpin = async () => {
    if (await updateSettings(conversation.id, { seed: null }, 'Unpinning the seed failed')) setEditing(false);
  };

  const startPin = () => {
    setText(formatSeed(lastSeed ?? randomSeed()));
    setError(null);
    setEditing(true);
  };

  if (pinned === null && !editing) {
    return (
      <div class="seed-pin unpinned" data-testid="seed-pin" data-pinned="false">
        <button type="button" class="seed-random" data-testid="seed-random" onClick={startPin}
          title="Replies use a fresh random seed. Click to pin one so the same question gives the same reply.">
          <IconDice size={14} /><span>random seed</span>
        </button>
      </div>
    );
  }

  return (
    <div class={`seed-pin${error ? ' invalid' : ''}`} data-testid="seed-pin" data-pinned={pinned !== null ? 'true' : 'false'}>
      <IconPin size={14} class="seed-pin-icon" />
      <label class="seed-prefix" for={`seed-${conversation.id}`}>seed<span class="visually-hidden"> (pinned)</span></label>
      <input id={`seed-${conversation.id}`} ref={input} class="seed-input" data-testid="seed-input" inputMode="numeric"
        spellcheck={false} autocomplete="off"
        // Outside an edit the pinned seed shows as soon as it changes (not a render later).
        value={editing || error ? text : pinned === null ? '' : formatSeed(pinned)} aria-invalid={error ? 'true' : undefined}
        aria-describedby={error ? `seed-error-${conversation.id}` : undefined}
        onInput={(e) => { setText(e.currentTarget.value); setError(null); }}
        onFocus={() => setEditing(true)}
        onBlur={() => {
          if (cancelling.current) cancelling.current = false;
          else if (text !== (pinned === null ? '' : formatSeed(pinned))) void save();
          else setEditing(false);
        }}
        onKeyDown={(e) => {
          if (e.key === 'Enter') { e.preventDefault(); void save(); }
          if (e.key === 'Escape') {
            e.preventDefault();
            setText(pinned === null ? '' : formatSeed(pinned));
            setError(null);
            setEditing(false);
            cancelling.current = true;
            e.currentTarget.blur();
          }
        }} size={Math.max(4, Math.min(16, text.length + 1))} />
      {pinned !== null && (
        <>
          <button type="button" class="icon-button small" data-testid="seed-copy" title="Copy seed" aria-label="Copy seed"
            onClick={() => void copyText(formatSeed(pinned), 'Seed copied')}>
            <IconCopy size={13} />
          </button>
          <button type="button" class="icon-button small" data-testid="seed-unpin" title="Unpin: use a random seed per reply" aria-label="Unpin seed"
            onMouseDown={(e) => e.preventDefault()} onClick={() => void unpin()}>
            <IconClose size={13} />
          </button>
        </>
      )}
      {error && <div class="seed-error" id={`seed-error-${conversation.id}`} role="alert" data-testid="seed-error">{error}</div>}
    </div>
  );
}

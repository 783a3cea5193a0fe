// Per-conversation settings: model, system prompt, temperature, top_p, max tokens.
import { useEffect, useState } from 'preact/hooks';
import { updateSettings } from '../actions';
import { modelChoices } from '../remote';
import { useAppState } from '../store';
import type { Conversation, Settings } from '../types';
import { IconClose } from './icons';

type NumberField = 'temperature' | 'top_p' | 'max_tokens';

const limits: Record<NumberField, { min: number; max: number; step: number; integer?: boolean; label: string }> = {
  temperature: { min: 0, max: 2, step: 0.05, label: 'Temperature' },
  top_p: { min: 0, max: 1, step: 0.05, label: 'Top P' },
  max_tokens: { min: 1, max: 32768, step: 1, integer: true, label: 'Max tokens' },
};

export function checkNumber(field: NumberField, text: string): { ok: true; value: number } | { ok: false; error: string } {
  const { min, max, integer, label } = limits[field];
  const value = Number(text.trim());
  if (text.trim() === '' || !Number.isFinite(value)) return { ok: false, error: `${label} must be a number.` };
  if (integer && !Number.isInteger(value)) return { ok: false, error: `${label} must be a whole number.` };
  if (value < min || value > max) return { ok: false, error: `${label} must be between ${min} and ${max}.` };
  return { ok: true, value };
}

export function SettingsPanel({ conversation, onClose }: { conversation: Conversation; onClose: () => void }) {
  const { models, remotes } = useAppState();
  const settings = conversation.settings;
  const [prompt, setPrompt] = useState(settings.system_prompt);
  const [numbers, setNumbers] = useState<Record<NumberField, string>>(() => texts(settings));
  const [errors, setErrors] = useState<Partial<Record<NumberField, string>>>({});
  const [saved, setSaved] = useState(false);

  useEffect(() => {
    setPrompt(settings.system_prompt);
    setNumbers(texts(settings));
    setErrors({});
  }, [conversation.id, settings.system_prompt, settings.temperature, settings.top_p, settings.max_tokens]);

  const save = async (patch: Partial<Settings>) => {
    if (await updateSettings(conversation.id, patch)) {
      setSaved(true);
      setTimeout(() => setSaved(false), 1200);
    }
  };

  const commitNumber = (field: NumberField, text: string) => {
    const checked = checkNumber(field, text);
    if (!checked.ok) {
      setErrors((e) => ({ ...e, [field]: checked.error }));
      return;
    }
    setErrors((e) => ({ ...e, [field]: undefined }));
    if (checked.value !== settings[field]) void save({ [field]: checked.value });
  };

  const choices = modelChoices(models, remotes, settings.model);

  return (
    <aside class="settings-panel" data-testid="settings-panel" aria-label="Conversation settings">
      <header class="panel-head">
        <h2>Chat settings</h2>
        <span class={`saved${saved ? ' show' : ''}`} aria-live="polite">{saved ? 'Saved' : ''}</span>
        <button type="button" class="icon-button small" aria-label="Close settings" onClick={onClose}><IconClose size={14} /></button>
      </header>
      <label class="field">
        <span>Model</span>
        <select data-testid="setting-model" value={settings.model} onChange={(e) => void save({ model: e.currentTarget.value })}>
          {choices.map((c) => <option key={c.value} value={c.value}>{c.label}</option>)}
        </select>
        {models !== null && models.length === 0 && !remotes?.length && <small class="muted">No models installed: add one in Models.</small>}
      </label>
      <label class="field">
        <span>System prompt</span>
        <textarea data-testid="setting-system-prompt" rows={5} value={prompt} placeholder="You are a helpful assistant."
          onInput={(e) => setPrompt(e.currentTarget.value)}
          onBlur={() => { if (prompt !== settings.system_prompt) void save({ system_prompt: prompt }); }} />
      </label>
      {(['temperature', 'top_p', 'max_tokens'] as const).map((field) => {
        const l = limits[field];
        return (
          <label class="field" key={field}>
            <span>{l.label}</span>
            <div class="number-row">
              {field !== 'max_tokens' && (
                <input type="range" min={l.min} max={l.max} step={l.step} value={Number(numbers[field]) || 0} aria-label={`${l.label} slider`}
                  onInput={(e) => setNumbers((n) => ({ ...n, [field]: e.currentTarget.value }))}
                  onChange={(e) => commitNumber(field, e.currentTarget.value)} tabIndex={-1} />
              )}
              <input type="number" data-testid={`setting-${field.replace('_', '-')}`} min={l.min} max={l.max} step={l.step}
                value={numbers[field]} aria-invalid={errors[field] ? 'true' : undefined}
                onInput={(e) => setNumbers((n) => ({ ...n, [field]: e.currentTarget.value }))}
                onChange={(e) => commitNumber(field, e.currentTarget.value)} />
            </div>
            {errors[field] && <small class="field-error" role="alert">{errors[field]}</small>}
          </label>
        );
      })}
      <p class="muted small">Changes apply to the next reply.</p>
    </aside>
  );
}

function texts(s: Settings): Record<NumberField, string> {
  return { temperature: String(s.temperature), top_p: String(s.top_p), max_tokens: String(s.max_tokens) };
}

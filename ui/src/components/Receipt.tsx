import { copyText } from '../actions';
import { ranOn, receiptText, seedPromise } from '../remote';
import type { Message } from '../types';

const BACKENDS: Record<string, string> = { cpu: 'CPU', cuda: 'CUDA GPU', metal: 'Apple GPU (Metal)', remote: 'remote engine' };

/** What fixes a reply besides its question: the seed and sampling it used and its receipt from
 *  the server (the weights' hash, quantization, engine build, backend class, fingerprint, and
 *  for a remote model the engine it ran on and whether that engine promises the seed),
 *  collapsed under "receipt", with a button that copies it all as JSON. */
export function Receipt({ message }: { message: Message }) {
  const p = message.provenance;
  if (!p || message.seed === null) return null;
  const remote = p.remote ?? null;
  const backend = BACKENDS[p.backend] ?? p.backend;
  const rows: [string, string][] = [
    ['Seed', String(message.seed)],
    ...(message.sampling ? [
      ['Model', message.sampling.model],
      ['Sampling', `temperature ${message.sampling.temperature} · top-p ${message.sampling.top_p} · max ${message.sampling.max_tokens} tokens`],
    ] as [string, string][] : []),
    ...(remote ? [['Ran on', ranOn(remote)]] as [string, string][] : []),
    ['Weights', p.weights],
    ['Quantization', p.quantization ?? 'none'],
    ['Engine', p.engine],
    ['Backend', backend],
    ['Fingerprint', p.fingerprint],
  ];
  return (
    <details class="receipt" data-testid="receipt">
      <summary title="Why this reply is what it is">receipt</summary>
      <div class="receipt-card">
        <dl>
          {rows.map(([name, value]) => (
            <div key={name}>
              <dt>{name}</dt>
              <dd data-testid={`receipt-${name.toLowerCase().replace(' ', '-')}`}>{value}</dd>
              {name === 'Seed' && remote && (
                <dd class={`seed-promise${remote.identical_seeds ? '' : ' warning'}`} data-testid="receipt-seed-promise">
                  {seedPromise(remote.identical_seeds)}
                </dd>
              )}
            </div>
          ))}
        </dl>
        <p class="muted small">
          {!remote
            ? `The same conversation with this seed and these settings gives this reply again on any ${backend} machine with the same weights and engine. Another backend class, other weights or another engine build may give another.`
            : remote.identical_seeds
              ? 'The same conversation with this seed and these settings gives this reply again from this engine with the same model and engine build.'
              : 'The seed was sent to this engine, but it may give another reply for the same seed and settings (what else it runs at the time can change it).'}
        </p>
        <button type="button" class="link-button" data-testid="copy-receipt"
          onClick={() => void copyText(receiptText(message), 'Receipt copied')}>Copy receipt</button>
      </div>
    </details>
  );
}

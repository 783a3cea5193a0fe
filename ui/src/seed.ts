// Seeds are integers in 0..2^53-1 (exact in a JSON number / a JS number).

export const MAX_SEED = Number.MAX_SAFE_INTEGER; // 2^53 - 1

export type SeedParse = { ok: true; seed: number } | { ok: false; error: string };

/** Parses what a person typed as a seed. */
export function parseSeed(input: string): SeedParse {
  const text = input.trim().replace(/[\s_,]/g, '');
  if (text === '') return { ok: false, error: 'Enter a seed: a whole number from 0 to 9007199254740991.' };
  if (text.startsWith('-')) return { ok: false, error: 'A seed cannot be negative.' };
  const digits = text.replace(/^\+/, '');
  if (!/^\d+$/.test(digits)) {
    return { ok: false, error: 'A seed is a whole number (digits only), from 0 to 9007199254740991.' };
  }
  const value = BigInt(digits);
  if (value > BigInt(MAX_SEED)) return { ok: false, error: 'That seed is too large: the largest is 9007199254740991 (2^53 - 1).' };
  return { ok: true, seed: Number(value) };
}

/** Whether a value from the API is a valid seed. */
export function isSeed(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= MAX_SEED;
}

/** A seed as shown and copied: plain digits, no grouping, so it pastes back unchanged. */
export function formatSeed(seed: number | null | undefined): string {
  if (seed === null || seed === undefined) return 'random seed';
  if (!isSeed(seed)) return String(seed);
  return seed.toFixed(0);
}

/** A fresh random seed (for "pin a seed" when nothing was generated yet). */
export function randomSeed(): number {
  const words = new Uint32Array(2);
  crypto.getRandomValues(words);
  // 21 high bits + 32 low bits = 53 bits.
  return (words[0] & 0x1fffff) * 0x100000000 + words[1];
}

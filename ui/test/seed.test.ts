import { describe, expect, it } from 'vitest';
import { MAX_SEED, formatSeed, isSeed, parseSeed, randomSeed } from '../src/seed';

describe('parseSeed', () => {
  it('accepts integers from 0 to 2^53-1', () => {
    expect(parseSeed('0')).toEqual({ ok: true, seed: 0 });
    expect(parseSeed(' 42 ')).toEqual({ ok: true, seed: 42 });
    expect(parseSeed('9007199254740991')).toEqual({ ok: true, seed: MAX_SEED });
    expect(parseSeed('1_000')).toEqual({ ok: true, seed: 1000 });
    expect(parseSeed('1,000,000')).toEqual({ ok: true, seed: 1000000 });
    expect(parseSeed('+7')).toEqual({ ok: true, seed: 7 });
    expect(parseSeed('007')).toEqual({ ok: true, seed: 7 });
  });

  it('rejects everything else with a message', () => {
    for (const bad of ['', '  ', '-1', '1.5', '1e3', 'abc', '0x10', '12a', 'NaN', 'Infinity', '9007199254740992', '18446744073709551615']) {
      const parsed = parseSeed(bad);
      expect(parsed.ok, bad).toBe(false);
      if (!parsed.ok) expect(parsed.error.length).toBeGreaterThan(10);
    }
    const big = parseSeed('9007199254740992');
    expect(!big.ok && big.error).toMatch(/too large/);
    const negative = parseSeed('-5');
    expect(!negative.ok && negative.error).toMatch(/negative/);
  });
});

describe('formatSeed and isSeed', () => {
  it('formats as plain digits that parse back', () => {
    expect(formatSeed(null)).toBe('random seed');
    expect(formatSeed(undefined)).toBe('random seed');
    expect(formatSeed(0)).toBe('0');
    expect(formatSeed(MAX_SEED)).toBe('9007199254740991');
    expect(formatSeed(123456789012345)).toBe('123456789012345');
    for (const seed of [0, 1, 42, 4294967296, MAX_SEED]) {
      expect(parseSeed(formatSeed(seed))).toEqual({ ok: true, seed });
    }
  });

  it('knows valid seeds', () => {
    expect(isSeed(0)).toBe(true);
    expect(isSeed(MAX_SEED)).toBe(true);
    expect(isSeed(MAX_SEED + 1)).toBe(false);
    expect(isSeed(-1)).toBe(false);
    expect(isSeed(1.5)).toBe(false);
    expect(isSeed('1')).toBe(false);
    expect(isSeed(null)).toBe(false);
  });

  it('draws random seeds in range', () => {
    for (let i = 0; i < 200; i++) expect(isSeed(randomSeed())).toBe(true);
  });
});

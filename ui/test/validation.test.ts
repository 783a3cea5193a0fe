// @vitest-environment jsdom
import { describe, expect, it } from 'vitest';
import { pullErrorText } from '../src/components/ModelLibrary';
import { checkNumber } from '../src/components/SettingsPanel';
import { checkDiskCache, checkIdleMinutes, checkPort, parseOrigins } from '../src/components/SettingsView';
import { parseRoute, routeHash } from '../src/actions';
import { checkRepoId, formatBytes } from '../src/format';

describe('form checks', () => {
  it('checks sampling numbers', () => {
    expect(checkNumber('temperature', '0.7')).toEqual({ ok: true, value: 0.7 });
    expect(checkNumber('temperature', '3').ok).toBe(false);
    expect(checkNumber('top_p', '-0.1').ok).toBe(false);
    expect(checkNumber('max_tokens', '24')).toEqual({ ok: true, value: 24 });
    expect(checkNumber('max_tokens', '2.5')).toMatchObject({ ok: false, error: 'Max tokens must be a whole number.' });
    expect(checkNumber('max_tokens', '')).toMatchObject({ ok: false });
  });

  it('checks ports and origins', () => {
    expect(checkPort('7337')).toBeNull();
    expect(checkPort('0')).toBeNull();
    expect(checkPort('70000')).not.toBeNull();
    expect(checkPort('12ab')).not.toBeNull();
    expect(checkDiskCache('8')).toBeNull();
    expect(checkDiskCache('0')).toBeNull();
    expect(checkDiskCache('-1')).toMatch(/gigabytes/);
    expect(checkDiskCache('1.5')).toMatch(/gigabytes/);
    expect(checkIdleMinutes('15')).toBeNull();
    expect(checkIdleMinutes('20000')).toMatch(/a week/);
    expect(parseOrigins('http://localhost:3000\n\n https://app.example.com/ ')).toEqual({ origins: ['http://localhost:3000', 'https://app.example.com/'], error: null });
    expect(parseOrigins('localhost:3000').error).toMatch(/not an origin/);
    expect(parseOrigins('http://x.com/path').error).toMatch(/not an origin/);
  });

  it('checks repo ids', () => {
    expect(checkRepoId('mlx-community/Qwen2.5-0.5B-Instruct-4bit')).toBeNull();
    expect(checkRepoId('')).toMatch(/Enter/);
    expect(checkRepoId('just-a-name')).toMatch(/org\/name/);
    expect(checkRepoId('a/b/c')).toMatch(/org\/name/);
  });

  it('formats sizes', () => {
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(105_000_000)).toBe('105 MB');
    expect(formatBytes(1_540_000_000)).toBe('1.5 GB');
  });

  it('explains offline pulls', () => {
    expect(pullErrorText('error sending request: dns error: failed to lookup address')).toMatch(/check your internet connection/);
    expect(pullErrorText('repository not found')).toBe('repository not found');
    expect(pullErrorText(null)).toBe('The download failed.');
    const clear = 'download: cannot reach the Hugging Face hub (dns error); check the network connection.';
    expect(pullErrorText(clear)).toBe(clear);
  });

  it('routes', () => {
    expect(parseRoute('#/c/12')).toEqual({ view: 'chat', id: 12 });
    expect(parseRoute('')).toEqual({ view: 'chat', id: null });
    expect(parseRoute('#/models')).toEqual({ view: 'models' });
    expect(routeHash({ view: 'chat', id: 3 })).toBe('#/c/3');
    expect(routeHash({ view: 'settings' })).toBe('#/settings');
  });
});

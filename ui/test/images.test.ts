// @vitest-environment jsdom
import { describe, expect, it } from 'vitest';
import { MAX_IMAGE_BYTES, readImages, refusal } from '../src/images';

describe('images the composer takes', () => {
  it('takes the formats the server decodes, up to its size limit', () => {
    for (const type of ['image/png', 'image/jpeg', 'image/webp', 'image/gif']) {
      expect(refusal({ type, size: 1000 })).toBeNull();
    }
    expect(refusal({ type: 'image/bmp', size: 10, name: 'a.bmp' })).toBe('a.bmp: send a PNG, JPEG, WebP or GIF image');
    expect(refusal({ type: 'application/pdf', size: 10 })).toContain('PNG, JPEG, WebP or GIF');
    expect(refusal({ type: 'image/png', size: MAX_IMAGE_BYTES + 1, name: 'big.png' })).toBe('big.png: the image is over 20 MB');
  });

  it('reads files into data URLs and says why it left others out', async () => {
    const png = new File([new Uint8Array([137, 80, 78, 71])], 'p.png', { type: 'image/png' });
    const text = new File(['hello'], 'notes.txt', { type: 'text/plain' });
    const { urls, refused } = await readImages([png, text]);
    expect(urls).toEqual(['data:image/png;base64,iVBORw==']);
    expect(refused).toEqual(['notes.txt: send a PNG, JPEG, WebP or GIF image']);
  });
});

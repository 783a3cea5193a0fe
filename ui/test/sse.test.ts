import { describe, expect, it } from 'vitest';
import { DONE, SseParser, decodeData } from '../src/sse';

const stream = 'data: {"type":"start","message_id":7,"seed":42}\n\ndata: {"type":"delta","text":"Par"}\n\n' +
  'data: {"type":"delta","text":"is é"}\n\ndata: {"type":"done"}\n\n';

function feedAll(parser: SseParser, chunks: (string | Uint8Array)[]) {
  const out = chunks.flatMap((c) => parser.push(c));
  return [...out, ...parser.end()];
}

describe('SseParser', () => {
  it('parses whole events', () => {
    const events = feedAll(new SseParser(), [stream]);
    expect(events.map((e) => JSON.parse(e.data).type)).toEqual(['start', 'delta', 'delta', 'done']);
    expect(events[0].event).toBe('message');
  });

  it('gives the same events however the text is split', () => {
    const whole = feedAll(new SseParser(), [stream]);
    for (let size = 1; size <= 9; size++) {
      const chunks: string[] = [];
      for (let i = 0; i < stream.length; i += size) chunks.push(stream.slice(i, i + size));
      expect(feedAll(new SseParser(), chunks)).toEqual(whole);
    }
    // Every single split point.
    for (let i = 0; i <= stream.length; i++) {
      expect(feedAll(new SseParser(), [stream.slice(0, i), stream.slice(i)])).toEqual(whole);
    }
  });

  it('decodes bytes split inside a UTF-8 sequence', () => {
    const bytes = new TextEncoder().encode(stream);
    const at = bytes.indexOf(0xc3) + 1; // between the two bytes of "é"
    const events = feedAll(new SseParser(), [bytes.slice(0, at), bytes.slice(at)]);
    expect(JSON.parse(events[2].data).text).toBe('is é');
  });

  it('joins multi-line data with newlines and ignores comments and other fields', () => {
    const parser = new SseParser();
    const events = feedAll(parser, [': keep-alive\n', 'event: note\nid: 3\nretry: 10\ndata: line one\ndata:line two\ndata\n\n']);
    expect(events).toEqual([{ event: 'note', data: 'line one\nline two\n', id: '3' }]);
  });

  it('handles CRLF and CR line ends, also split between chunks', () => {
    const crlf = 'data: a\r\n\r\ndata: b\r\rdata: c\r\n\r\n';
    const whole = feedAll(new SseParser(), [crlf]).map((e) => e.data);
    expect(whole).toEqual(['a', 'b', 'c']);
    for (let i = 0; i <= crlf.length; i++) {
      expect(feedAll(new SseParser(), [crlf.slice(0, i), crlf.slice(i)]).map((e) => e.data)).toEqual(['a', 'b', 'c']);
    }
  });

  it('keeps a last event that has no blank line after it', () => {
    const parser = new SseParser();
    expect(parser.push('data: {"x":1}')).toEqual([]);
    expect(parser.end()).toEqual([{ event: 'message', data: '{"x":1}' }]);
  });

  it('does not emit events without data', () => {
    expect(feedAll(new SseParser(), ['event: ping\n\n\n\n'])).toEqual([]);
  });

  it('keeps a single leading space only', () => {
    expect(feedAll(new SseParser(), ['data:   x\n\n'])[0].data).toBe('  x');
  });
});

describe('decodeData', () => {
  it('decodes JSON and the [DONE] sentinel', () => {
    expect(decodeData('{"type":"delta","text":"hi"}')).toEqual({ type: 'delta', text: 'hi' });
    expect(decodeData('[DONE]')).toBe(DONE);
    expect(decodeData(' [DONE] ')).toBe(DONE);
    expect(() => decodeData('{oops')).toThrow();
  });
});

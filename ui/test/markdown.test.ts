// @vitest-environment jsdom
import { describe, expect, it } from 'vitest';
import { highlight, renderMarkdown } from '../src/markdown';

describe('renderMarkdown', () => {
  it('removes scripts and event handlers', () => {
    const html = renderMarkdown('Hi <img src=x onerror="alert(1)"> <script>alert(2)</script> <a href="javascript:alert(3)">x</a>');
    expect(html).not.toMatch(/onerror/i);
    expect(html).not.toMatch(/<script/i);
    expect(html).not.toMatch(/alert\(2\)/);
    expect(html).not.toMatch(/javascript:/i);
    expect(html).toContain('<img src="x">');
  });

  it('drops iframes, styles and forms', () => {
    const html = renderMarkdown('<iframe src="https://example.com"></iframe><style>body{}</style><form><input></form><p style="color:red">t</p>');
    expect(html).not.toMatch(/<iframe|<style|<form|<input|style=/i);
    expect(html).toContain('t');
  });

  it('renders markdown', () => {
    const html = renderMarkdown('# Title\n\n**bold** and `code` and [link](https://example.com)\n\n- a\n- b');
    expect(html).toContain('<h1>Title</h1>');
    expect(html).toContain('<strong>bold</strong>');
    expect(html).toContain('<code>code</code>');
    expect(html).toMatch(/<a href="https:\/\/example.com"[^>]*target="_blank"/);
    expect(html).toContain('rel="noopener noreferrer"');
    expect(html).toContain('<li>a</li>');
  });

  it('highlights fenced code with a known language', () => {
    const html = renderMarkdown('```python\ndef f(x):\n    return "hi"  # note\n```');
    expect(html).toContain('class="hljs language-python"');
    expect(html).toContain('<span class="hljs-keyword">def</span>');
    expect(html).toContain('hljs-string');
    expect(html).toContain('hljs-comment');
    expect(html).toContain('data-action="copy-code"');
  });

  it('escapes code in unknown languages, and code never becomes markup', () => {
    const html = renderMarkdown('```klingon\n<script>alert(1)</script>\n```');
    expect(html).not.toMatch(/<script/i);
    expect(html).toContain('&lt;script&gt;');
    const js = renderMarkdown('```js\nconst a = "<img src=x onerror=alert(1)>";\n```');
    expect(js).not.toMatch(/<img/i);
    expect(js).toContain('hljs-keyword');
  });

  it('copes with half-streamed markdown', () => {
    expect(() => renderMarkdown('```rust\nfn main() {')).not.toThrow();
    expect(renderMarkdown('```rust\nfn main() {')).toContain('hljs-keyword');
    expect(renderMarkdown('**unfinished')).toContain('**unfinished');
  });
});

describe('highlight', () => {
  it('knows aliases and falls back to text', () => {
    expect(highlight('echo "hi"', 'sh').html).toContain('hljs-string');
    expect(highlight('<b>x</b>', 'html').html).toContain('hljs-tag');
    expect(highlight('x', 'nope')).toEqual({ html: 'x', language: 'nope' });
    expect(highlight('a<b', undefined)).toEqual({ html: 'a&#60;b', language: null });
  });
});

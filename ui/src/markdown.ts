// Markdown to sanitized HTML: marked for the syntax, highlight.js (core + a few languages)
// for code blocks, DOMPurify for everything that comes out.

import { Marked, type Tokens } from 'marked';
import DOMPurify from 'dompurify';
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import c from 'highlight.js/lib/languages/c';
import diff from 'highlight.js/lib/languages/diff';
import go from 'highlight.js/lib/languages/go';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';

// A handful of languages keeps the bundle small; others show as plain text.
const languages = { bash, c, diff, go, javascript, json, python, rust, typescript, xml, yaml };
for (const [name, language] of Object.entries(languages)) hljs.registerLanguage(name, language);
hljs.registerAliases(['sh', 'shell', 'zsh', 'console'], { languageName: 'bash' });
hljs.registerAliases(['html', 'svg'], { languageName: 'xml' });
hljs.registerAliases(['cpp', 'c++', 'h', 'hpp', 'cc'], { languageName: 'c' });

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
}

/** Highlighted HTML for a code block; plain escaped text for unknown languages. */
export function highlight(code: string, lang: string | undefined): { html: string; language: string | null } {
  const name = (lang ?? '').trim().split(/\s+/)[0]?.toLowerCase() ?? '';
  if (name && hljs.getLanguage(name)) {
    return { html: hljs.highlight(code, { language: name, ignoreIllegals: true }).value, language: name };
  }
  return { html: escapeHtml(code), language: name || null };
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  renderer: {
    code(token: Tokens.Code) {
      const { html, language } = highlight(token.text, token.lang);
      const label = language ? escapeHtml(language) : 'text';
      return (
        `<div class="code-block"><div class="code-head"><span class="code-lang">${label}</span>` +
        `<button type="button" class="code-copy" data-action="copy-code" aria-label="Copy code">Copy</button></div>` +
        `<pre><code class="hljs${language ? ` language-${escapeHtml(language)}` : ''}">${html}</code></pre></div>`
      );
    },
  },
});

let hooked = false;
function purifier() {
  if (!hooked) {
    hooked = true;
    // Links open outside the app window.
    DOMPurify.addHook('afterSanitizeAttributes', (node) => {
      if (node.tagName === 'A' && node.getAttribute('href')) {
        node.setAttribute('target', '_blank');
        node.setAttribute('rel', 'noopener noreferrer');
      }
    });
  }
  return DOMPurify;
}

/** Renders markdown (a model's reply, possibly half-streamed) to safe HTML. */
export function renderMarkdown(source: string): string {
  const purify = purifier();
  // Without a working DOM sanitizer, show the text only: never unsanitized markup.
  if (!purify.isSupported) return `<p>${escapeHtml(source).replace(/\n/g, '<br>')}</p>`;
  const raw = marked.parse(source) as string;
  return purify.sanitize(raw, {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ['style', 'form', 'input', 'textarea', 'select', 'iframe', 'object', 'embed'],
    FORBID_ATTR: ['style'],
    ADD_ATTR: ['target'],
  }) as string;
}

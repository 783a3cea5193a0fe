// The Origin policy and the Content-Security-Policy in a real browser: the chat UI works
// under its CSP (and the CSP blocks remote images), a page of an allowed origin calls the
// API through CORS, and a page of any other origin cannot store anything with a no-cors
// fetch or a text/plain form.
import assert from 'node:assert/strict';
import { createServer, request as httpRequest } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { MOCK, MODEL, launchBrowser, missing, newChat, send, startServer, tid } from './harness.mjs';

/** A page server of its own origin; `page()` gives the HTML at request time. Counts the
 *  requests for /pixel.png. */
async function servePage(page) {
  const hits = { pixel: 0 };
  const server = createServer((req, res) => {
    const path = new URL(req.url, 'http://x').pathname;
    if (path === '/') {
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
      res.end(page());
    } else if (path === '/pixel.png') {
      hits.pixel += 1;
      res.writeHead(200, { 'Content-Type': 'image/png' }).end();
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${server.address().port}`;
  return { url, hits, stop: () => new Promise((r) => server.close(r)) };
}

/** GET as curl would (no Origin, no Sec-Fetch-*): the test's own view of the server. */
function getJson(url) {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'GET' }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c) => { body += c; }).on('end', () => {
        if (res.statusCode !== 200) reject(new Error(`GET ${url}: ${res.statusCode} ${body}`));
        else resolve(JSON.parse(body));
      });
    });
    req.on('error', reject);
    req.end();
  });
}

describe('origins and CSP in the browser', { skip: missing() || (MOCK && 'the mock has no origin policy'), timeout: 300_000 }, () => {
  let server;
  let browser;
  let allowed;
  let stranger;

  before(async () => {
    // The allowed page: fetch() with a JSON body and an SDK header (a preflighted request).
    allowed = await servePage(() => `<!doctype html><title>allowed</title><script>
      window.__result = (async () => {
        const res = await fetch(${JSON.stringify(server.url)} + '/v1/chat/completions', {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-stainless-os': 'Linux' },
          body: JSON.stringify({ model: ${JSON.stringify(MODEL)}, messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 8 }),
        });
        const body = await res.json();
        return { status: res.status, seed: res.headers.get('x-seedbar-seed'), content: body.choices?.[0]?.message?.content ?? null, error: body.error ?? null };
      })().catch((e) => ({ failed: String(e) }));
    </script>`);
    // A page of an origin that is not allowed: the requests no preflight guards.
    stranger = await servePage(() => `<!doctype html><title>stranger</title>
      <form id="csrf" method="POST" enctype="text/plain" action="${server.url}/app/conversations">
        <input name='{"title":"pwned-form' value='"}'>
      </form><script>
      window.__result = fetch(${JSON.stringify(server.url)} + '/app/conversations', {
        mode: 'no-cors', method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{"title":"pwned"}',
      }).then((r) => ({ type: r.type }), (e) => ({ failed: String(e) }));
    </script>`);
    server = await startServer({ allowOrigin: allowed.url });
    browser = await launchBrowser();
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
    await allowed?.stop();
    await stranger?.stop();
  });

  it('the chat UI works under its CSP, which blocks remote images', async () => {
    const page = await browser.newPage();
    const cspConsole = [];
    page.on('console', (m) => { if (/Content.Security.Policy/i.test(m.text())) cspConsole.push(m.text()); });
    await page.addInitScript(() => {
      window.__violations = [];
      document.addEventListener('securitypolicyviolation', (e) => {
        window.__violations.push({ directive: e.effectiveDirective || e.violatedDirective, blocked: e.blockedURI });
      });
    });
    const response = await page.goto(server.url + '/');
    const csp = response.headers()['content-security-policy'];
    assert.ok(csp, `the page has a CSP (headers: ${JSON.stringify(response.headers())})`);
    assert.match(csp, /default-src 'self'/);
    assert.equal(response.headers()['x-content-type-options'], 'nosniff');
    await page.waitForSelector(tid('conversation-list'));
    await newChat(page, { maxTokens: 8 });
    const reply = await send(page, 'Hello!');
    assert.equal(reply.status, 'complete');
    assert.ok(reply.text.trim().length > 0, 'the reply has text');
    assert.deepEqual(await page.evaluate(() => window.__violations), [], 'no CSP violations while chatting');
    assert.deepEqual(cspConsole, [], 'no CSP messages in the console');

    // What a reply's markdown image would do: the browser refuses to load it.
    await page.evaluate((src) => {
      const img = document.createElement('img');
      img.src = src;
      document.body.append(img);
    }, `${allowed.url}/pixel.png?q=secret`);
    await page.waitForFunction(() => window.__violations.length > 0);
    const [violation] = await page.evaluate(() => window.__violations);
    assert.equal(violation.directive, 'img-src');
    assert.equal(allowed.hits.pixel, 0, 'the remote image was not requested');
    await page.close();
  });

  it('a page of an allowed origin calls the API through CORS', async () => {
    const page = await browser.newPage();
    await page.goto(allowed.url + '/');
    const result = await page.evaluate(() => window.__result);
    assert.equal(result.failed, undefined, `fetch failed: ${result.failed}`);
    assert.equal(result.status, 200, JSON.stringify(result));
    assert.equal(typeof result.content, 'string');
    assert.ok(result.content.length > 0, 'the reply has text');
    assert.match(result.seed ?? '', /^\d+$/, 'the seed header is exposed');
    await page.close();
  });

  it('a page of another origin stores nothing with a no-cors fetch or a form', async () => {
    const before = await getJson(server.url + '/app/conversations');
    const page = await browser.newPage();
    await page.goto(stranger.url + '/');
    const result = await page.evaluate(() => window.__result);
    // The request reached the server (an opaque answer), or the browser refused it: either
    // way nothing may be stored.
    assert.ok(result.type === 'opaque' || result.failed, JSON.stringify(result));
    // The form posts `{"title":"pwned-form="}` as text/plain, navigating to the server.
    const navigated = page.waitForURL(/\/app\/conversations$/, { waitUntil: 'commit' });
    await page.evaluate(() => document.getElementById('csrf').submit());
    await navigated;
    await page.waitForTimeout(300);
    const afterward = await getJson(server.url + '/app/conversations');
    assert.deepEqual(afterward.map((c) => c.title), before.map((c) => c.title));
    assert.ok(!afterward.some((c) => /pwned/.test(c.title)), JSON.stringify(afterward.map((c) => c.title)));
    await page.close();
  });
});

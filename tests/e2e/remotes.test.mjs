// Remote engines in the chat window against two real `seedbar serve`s: an upstream Seedbar
// with an API key, added in the Models view as a remote engine of the app's server (a wrong
// key first: refused readably); a conversation then picks it, pins a seed, and its streamed
// reply is the upstream's own reply for that seed, with a receipt naming the engine.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MOCK, MODEL, launchBrowser, missing, newChat, openSettings, pinSeed, send, startServer, tid } from './harness.mjs';

const REMOTE = 'far-smol';
const KEY = 'sk-up';
const QUESTION = 'What is the capital of France?';
const SEED = 4321;
const MAX_TOKENS = 24;

// No keychain on a test machine: the app's server keeps remote keys in a file. Each test file
// runs in its own process, so this reaches only this file's servers.
process.env.SEEDBAR_KEY_STORE = 'file';

describe('remote engines', { skip: missing() || (MOCK && 'needs two real servers'), timeout: 300_000 }, () => {
  let upstream;
  let server;
  let browser;
  let page;

  before(async () => {
    [upstream, server] = await Promise.all([startServer({ apiKey: KEY }), startServer()]);
    browser = await launchBrowser();
    page = await browser.newPage();
    await page.goto(server.url + '/#/models');
    await page.waitForSelector(tid('remote-form'));
  });

  after(async () => {
    await browser?.close();
    await Promise.all([server?.stop(), upstream?.stop()]);
    if (browser?.errors.length) console.log('browser errors:\n' + browser.errors.join('\n'));
  });

  const add = async (key) => {
    await page.fill(tid('remote-name'), REMOTE);
    await page.fill(tid('remote-url'), `${upstream.url}/v1`);
    await page.fill(tid('remote-key'), key);
    const answered = page.waitForResponse((r) => r.request().method() === 'POST' && r.url().endsWith('/app/remotes'));
    await page.click(tid('remote-add'));
    return (await answered).status();
  };

  it('refuses a wrong key readably, then adds the engine with the right one', async () => {
    await page.waitForSelector(tid('remotes-empty'));
    assert.equal(await add('sk-wrong'), 401);
    const error = (await page.textContent(tid('remote-error'))).trim();
    assert.match(error, /^Adding far-smol failed: .*far-smol.*401/, error);
    assert.equal(await page.$(`${tid('api-key-dialog')}[open]`), null, "the engine's refusal is not this server asking for a key");
    assert.equal(await page.$(tid('remote-row')), null);
    assert.equal(await page.inputValue(tid('remote-name')), REMOTE, 'a refused form keeps what was typed');

    assert.equal(await add(KEY), 201);
    const row = `${tid('remote-row')}[data-name="${REMOTE}"]`;
    await page.waitForSelector(row);
    assert.equal((await page.textContent(`${row} ${tid('remote-seeds')}`)).trim(), 'seeds identical');
    const port = new URL(upstream.url).port;
    assert.equal((await page.textContent(`${row} ${tid('remote-owner')}`)).trim(), `seedbar at 127.0.0.1:${port}`);
    assert.equal((await page.textContent(`${row} ${tid('remote-model')}`)).trim(), MODEL);
    assert.match(await page.textContent(row), /remote/);
    assert.equal(await page.$(tid('remote-error')), null);
    assert.equal(await page.inputValue(tid('remote-name')), '', 'the form clears');
    assert.equal(await page.inputValue(tid('remote-key')), '');
  });

  it('chats with the remote model: its seeded reply is the upstream\'s own, and the receipt names the engine', async () => {
    const id = await newChat(page, { maxTokens: MAX_TOKENS });
    await openSettings(page);
    const port = new URL(upstream.url).port;
    const label = await page.textContent(`${tid('setting-model')} option[value="${REMOTE}"]`);
    assert.equal(label.trim(), `${REMOTE} — remote: seedbar at 127.0.0.1:${port}`);
    const saved = page.waitForResponse((r) => r.request().method() === 'PATCH' && r.url().endsWith(`/app/conversations/${id}`));
    await page.selectOption(tid('setting-model'), REMOTE);
    assert.ok((await saved).ok());
    await page.waitForSelector(`${tid('chat-model')}:has-text("${REMOTE}") ${tid('chat-model-remote')}`);
    await pinSeed(page, SEED);

    const reply = await send(page, QUESTION);
    assert.equal(reply.status, 'complete');
    assert.equal(reply.seed, String(SEED));
    assert.ok(reply.text.trim().length > 0, 'the reply has text');
    assert.equal(await page.$(tid('seed-not-promised')), null, 'Seedbar promises its seeds');

    const receipt = `${tid('message')}[data-role="assistant"] ${tid('receipt')}`;
    await page.click(`${receipt} summary`);
    const field = async (name) => (await page.textContent(`${receipt} ${tid(`receipt-${name}`)}`)).trim();
    assert.equal(await field('seed'), String(SEED));
    assert.equal(await field('ran-on'), `seedbar at ${upstream.url} (${MODEL})`);
    assert.equal(await field('seed-promise'), 'This engine keeps a seeded reply the same');
    assert.equal(await field('weights'), `remote:${MODEL}`);
    assert.equal(await field('backend'), 'remote engine');

    // The stored reply is the upstream's own answer for that seed and sampling.
    const stored = await (await fetch(`${server.url}/app/conversations/${id}`)).json();
    const last = stored.messages.at(-1);
    assert.deepEqual(last.provenance.remote, { engine: 'seedbar', url: upstream.url, model: MODEL, identical_seeds: true });
    const direct = await fetch(`${upstream.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({
        model: MODEL, messages: [{ role: 'user', content: QUESTION }], seed: SEED,
        temperature: last.sampling.temperature, top_p: last.sampling.top_p, max_tokens: MAX_TOKENS,
      }),
    });
    assert.equal(direct.status, 200);
    assert.equal(last.content, (await direct.json()).choices[0].message.content);
  });

  it('removes the engine after asking', async () => {
    await page.goto(server.url + '/#/models');
    const row = `${tid('remote-row')}[data-name="${REMOTE}"]`;
    await page.click(`${row} ${tid('remote-remove')}`);
    await page.waitForSelector(`${tid('confirm-dialog')}[open]`);
    await page.click(tid('confirm-ok'));
    await page.waitForSelector(tid('remotes-empty'));
    assert.deepEqual(await (await fetch(`${server.url}/app/remotes`)).json(), []);
  });
});

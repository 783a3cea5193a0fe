// A server with an API key: the window asks for it once and keeps it.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MOCK, launchBrowser, missing, newChat, pinSeed, send, serveStatic, startServer, tid } from './harness.mjs';

describe('API key prompt', { skip: missing(), timeout: 300_000 }, () => {
  let server;
  let browser;
  let other;

  before(async () => {
    other = await serveStatic();
    server = await startServer({ apiKey: 'e2e-secret', allowOrigin: other.url });
    browser = await launchBrowser();
  });
  after(async () => {
    await browser?.close();
    await server?.stop();
    await other?.stop();
  });

  it('asks for the key on 401, rejects a wrong one, keeps the right one', async () => {
    const page = await browser.newPage();
    await page.goto(server.url + '/');
    await page.waitForSelector(`${tid('api-key-dialog')}[open]`);
    await page.fill(tid('api-key-input'), 'wrong');
    await page.click(tid('api-key-submit'));
    await page.waitForSelector(`${tid('api-key-dialog')}[open]`);
    assert.match(await page.textContent(tid('api-key-dialog')), /not valid/);
    await page.fill(tid('api-key-input'), 'e2e-secret');
    await page.click(tid('api-key-submit'));
    await page.waitForSelector(`${tid('api-key-dialog')}:not([open])`, { state: 'attached' });
    await page.click(tid('new-chat'));
    await page.waitForSelector(tid('conversation-item'));
    await page.reload();
    await page.waitForSelector(tid('conversation-item'));
    assert.equal(await page.$(`${tid('api-key-dialog')}[open]`), null, 'the key was kept');
    assert.equal(await page.evaluate(() => localStorage.getItem('seedbar.apiKey')), 'e2e-secret');
  });

  it('works from another origin with the API and key injected, as in the app window', { skip: MOCK && 'the mock has no CORS' }, async () => {
    const page = await browser.newPage();
    await page.addInitScript(({ api, apiKey }) => {
      window.__SEEDBAR__ = Object.freeze({ api, apiKey });
    }, { api: server.url, apiKey: 'e2e-secret' });
    await page.goto(other.url + '/');
    await page.waitForSelector(tid('conversation-item'));
    assert.equal(await page.$(`${tid('api-key-dialog')}[open]`), null, 'no key prompt');
    await newChat(page); // PATCH goes through CORS too
    await pinSeed(page, 77);
    const reply = await send(page, 'Hello!');
    assert.equal(reply.status, 'complete');
    assert.equal(reply.seed, '77');
    await page.click(tid('nav-settings'));
    await page.waitForSelector(tid('settings-port'));
  });
});

// The quick-chat panel (ui/quick.html) in Chromium against a real `seedbar serve` and the
// real SmolLM2-135M model: the answer streams, "Open as conversation" saves the question and
// the answer with its seed, and the chat window shows it; the saved seed reproduces it.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MODEL, launchBrowser, messages, missing, startServer, tid } from './harness.mjs';

const skip = missing();
const QUESTION = 'What is the capital of France?';

describe('quick chat panel', { skip, timeout: 600_000 }, () => {
  let server;
  let browser;
  let page;

  before(async () => {
    server = await startServer();
    browser = await launchBrowser();
    page = await browser.newPage();
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
    if (browser?.errors.length) console.log('browser errors:\n' + browser.errors.join('\n'));
  });

  it('streams an answer and opens it as a conversation', async () => {
    await page.goto(server.url + '/quick.html');
    await page.waitForSelector(`${tid('quick-input')}[placeholder="Ask ${MODEL}…"]`);
    assert.equal(await page.evaluate(() => document.activeElement?.getAttribute('data-testid')), 'quick-input', 'focus lands in the input');
    await page.evaluate(() => {
      const seen = (window.__seen = []);
      new MutationObserver(() => {
        const text = document.querySelector('[data-testid="quick-answer-text"]')?.textContent;
        if (text && seen.at(-1) !== text) seen.push(text);
      }).observe(document.body, { subtree: true, childList: true, characterData: true });
    });
    await page.fill(tid('quick-input'), QUESTION);
    await page.press(tid('quick-input'), 'Enter');
    await page.waitForSelector(`${tid('quick-answer')}[data-state="complete"]`, { timeout: 120_000 });
    const seen = await page.evaluate(() => window.__seen);
    assert.ok(seen.length >= 2, `the answer grew while streaming (${seen.length} steps)`);
    const answer = seen.at(-1);
    const foot = await page.textContent('.quick-foot');
    const seed = Number(/seed (\d+)/.exec(foot)?.[1]);
    assert.ok(Number.isSafeInteger(seed), `the footer shows the seed: ${foot}`);

    const before = await (await fetch(`${server.url}/app/conversations`)).json();
    assert.deepEqual(before, [], 'nothing is saved until asked');
    await page.click(tid('quick-open'));
    await page.waitForFunction(() => /index\.html#\/c\/\d+$/.test(location.href));
    const id = Number(page.url().split('/').pop());
    const saved = await (await fetch(`${server.url}/app/conversations/${id}`)).json();
    assert.equal(saved.title, QUESTION);
    assert.deepEqual(saved.messages.map((m) => [m.role, m.status]), [['user', 'complete'], ['assistant', 'complete']]);
    assert.equal(saved.messages[0].content, QUESTION);
    assert.equal(saved.messages[1].seed, seed);
    assert.equal(saved.messages[1].sampling.model, MODEL);
    // Rendered markdown drops symbols, and an ordered list's numbers (the seed is drawn
    // afresh, so some replies hold one).
    const squash = (s) => s.replace(/[^0-9A-Za-z]+/g, '');
    const unlist = (s) => s.replace(/^\s*\d+[.)]\s+/gm, '');
    assert.equal(squash(unlist(saved.messages[1].content)), squash(answer));
    // The chat window shows it, in the list too.
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${id}"]`);
    await page.waitForSelector(`${tid('conversation-item')}.selected`);
    assert.deepEqual((await messages(page)).map((m) => m.role), ['user', 'assistant']);

    // The saved seed and sampling reproduce the answer in the conversation.
    await fetch(`${server.url}/app/conversations/${id}`, {
      method: 'PATCH', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ settings: { seed } }),
    });
    const again = await fetch(`${server.url}/app/conversations/${id}/reply`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ regenerate: true }),
    });
    await again.text();
    const redone = await (await fetch(`${server.url}/app/conversations/${id}`)).json();
    assert.equal(redone.messages[1].content, saved.messages[1].content);
  });
});

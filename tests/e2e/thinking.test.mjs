// A thinking model's reasoning, kept apart from its answer in the chat window: against a real
// `seedbar serve` with a random-weight Qwen3-shaped checkpoint whose template opens a `<think>`
// block (so every reply starts thinking), or the mock's `thinker`. The thinking ends up in a
// collapsed block saying "Thought…", opens to the stored reasoning as plain text, stays out of
// the answer, and reads the same after a reload.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  MOCK, VENV_PYTHON, launchBrowser, messages, missing, send, startServer, tid, writeThinkingCheckpoint,
} from './harness.mjs';

const THINKER = 'thinker';
const skip = missing() ?? (MOCK || existsSync(VENV_PYTHON) ? undefined : `${VENV_PYTHON} is missing (scripts/setup.sh)`);

describe('thinking in the chat window', { skip, timeout: 600_000 }, () => {
  let checkpoint;
  let server;
  let browser;
  let page;
  let id;
  let stored;

  const api = async (method, path, body) => {
    const response = await fetch(server.url + path, {
      method, headers: body ? { 'Content-Type': 'application/json' } : {}, body: body && JSON.stringify(body),
    });
    assert.ok(response.ok, `${method} ${path} answered ${response.status}: ${await response.clone().text()}`);
    return response.json();
  };
  const reply = () => `${tid('message')}[data-id="${stored.id}"]`;
  const block = () => `${reply()} ${tid('thinking')}`;
  const isOpen = () => page.$eval(block(), (el) => el.open);
  const summary = async () => (await page.textContent(`${block()} ${tid('thinking-summary')}`)).trim();

  before(async () => {
    const models = [];
    if (!MOCK) {
      checkpoint = mkdtempSync(join(tmpdir(), 'seedbar-e2e-thinker-'));
      writeThinkingCheckpoint(checkpoint);
      models.push({ path: checkpoint, name: THINKER });
    }
    server = await startServer({ models });
    browser = await launchBrowser();
    page = await browser.newPage();
    await page.goto(server.url + '/');
    await page.waitForSelector(tid('conversation-list'));
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
    if (checkpoint) rmSync(checkpoint, { recursive: true, force: true });
    if (browser?.errors.length) console.log('browser errors:\n' + browser.errors.join('\n'));
  });

  it('streams the thinking apart from the answer, collapsed once it is over', async () => {
    ({ id } = await api('POST', '/app/conversations', { settings: { model: THINKER, seed: 4242, max_tokens: 24 } }));
    await page.evaluate((conversation) => { location.hash = `#/c/${conversation}`; }, id);
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${id}"] ${tid('chat-model')}:text-is("${THINKER}")`);
    // Record the summaries shown while the reply streams.
    await page.evaluate(() => {
      const seen = (window.__summaries = []);
      new MutationObserver(() => {
        const text = document.querySelector('[data-testid="thinking-summary"]')?.textContent;
        if (text && seen.at(-1) !== text) seen.push(text);
      }).observe(document.body, { subtree: true, childList: true, characterData: true });
    });
    const shown = await send(page, 'Why is the sky blue?');
    assert.equal(shown.status, 'complete');

    stored = (await api('GET', `/app/conversations/${id}`)).messages.at(-1);
    assert.equal(stored.role, 'assistant');
    assert.equal(stored.id, shown.id);
    assert.ok(typeof stored.reasoning === 'string' && stored.reasoning.length > 0, `the reply thought: ${JSON.stringify(stored)}`);
    if (MOCK) {
      // The mock thinks slowly enough to watch, and answers within max_tokens.
      const seen = await page.evaluate(() => window.__summaries);
      assert.ok(seen.some((s) => /^Thinking… \d+s$/.test(s)), `"Thinking… Ns" showed while it thought: ${JSON.stringify(seen)}`);
      assert.notEqual(stored.reasoning_ms, null);
      assert.ok(stored.content.length > 0);
    }

    assert.equal(await isOpen(), false, 'the thinking starts collapsed');
    // reasoning_ms is null when max_tokens cut the reply off while it still thought.
    if (stored.reasoning_ms === null) assert.equal(await summary(), 'Thought');
    else assert.match(await summary(), /^Thought for (\d+(\.\d)?s|\d+m \d+s)$/);

    await page.click(`${block()} ${tid('thinking-summary')}`);
    assert.equal(await isOpen(), true);
    const text = `${block()} ${tid('thinking-text')}`;
    assert.equal(await page.$eval(text, (el) => el.textContent), stored.reasoning, 'the thinking shows as stored');
    assert.equal(await page.$eval(text, (el) => el.childElementCount), 0, 'as plain text, not HTML');
    assert.ok(!shown.text.includes(stored.reasoning.trim()), `the answer holds no thinking: ${JSON.stringify(shown.text)}`);
    assert.equal(await page.$(`${reply()} ${tid('message-content')} ${tid('thinking')}`), null);
  });

  it('shows the stored thinking the same way after a reload', async () => {
    const before = await summary();
    const content = (await messages(page)).at(-1).text;
    await page.reload();
    await page.waitForSelector(block());
    assert.equal(await isOpen(), false);
    assert.equal(await summary(), before);
    assert.equal(await page.$eval(`${block()} ${tid('thinking-text')}`, (el) => el.textContent), stored.reasoning);
    assert.equal((await messages(page)).at(-1).text, content);
  });

  it('marks the thinking model in the library', async () => {
    await page.click(tid('nav-models'));
    const badges = async (name) => {
      const row = `${tid('model-row')}[data-name="${name}"]`;
      await page.waitForSelector(row);
      return page.$$eval(`${row} ${tid('model-capability')}`, (els) => els.map((el) => el.textContent.trim()));
    };
    assert.ok((await badges(THINKER)).includes('thinks'), 'the thinker thinks');
    assert.ok(!(await badges('SmolLM2-135M-Instruct')).includes('thinks'), 'SmolLM2 does not');
  });

  it('showed no errors', () => {
    assert.deepEqual(browser.errors.filter((e) => !/Failed to load resource/.test(e)), []);
  });
});

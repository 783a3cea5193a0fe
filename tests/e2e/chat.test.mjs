// The chat window against a real `seedbar serve` and the real SmolLM2-135M model.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import {
  MODEL, launchBrowser, messages, missing, newChat, pinSeed, regenerate, replyTo, screenshotPath, send, startServer, tid,
} from './harness.mjs';

const skip = missing();
const QUESTION = 'What is the capital of France?';

describe('chat window', { skip, timeout: 900_000 }, () => {
  let server;
  let browser;
  let page;

  before(async () => {
    server = await startServer();
    browser = await launchBrowser();
    page = await browser.newPage();
    await page.goto(server.url + '/');
    await page.waitForSelector(tid('conversation-list'));
  });

  after(async () => {
    await browser?.close();
    await server?.stop();
    if (browser?.errors.length) console.log('browser errors:\n' + browser.errors.join('\n'));
  });

  it('streams a reply into a new conversation', async () => {
    await newChat(page);
    // Record the reply's text each time it changes while it streams.
    await page.evaluate(() => {
      const seen = (window.__seen = []);
      new MutationObserver(() => {
        const el = document.querySelector('[data-testid="message"][data-role="assistant"][data-status="streaming"] [data-testid="message-content"]');
        if (el && el.textContent && seen.at(-1) !== el.textContent) seen.push(el.textContent);
      }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
    });
    const reply = await send(page, QUESTION);
    const seen = await page.evaluate(() => window.__seen);
    assert.equal(reply.status, 'complete');
    assert.ok(reply.text.trim().length > 0, 'the reply has text');
    assert.ok(seen.length >= 2, `the reply grew while streaming (${JSON.stringify(seen)})`);
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i].length >= seen[i - 1].length, 'the text only grows');
    assert.match(reply.seed ?? '', /^\d+$/, 'the reply shows its seed');
    const all = await messages(page);
    assert.deepEqual(all.map((m) => m.role), ['user', 'assistant']);
    assert.equal(all[0].text, QUESTION);
    // The conversation got a title from the question, in the sidebar too.
    await page.waitForSelector(`${tid('conversation-item')}.selected ${tid('conversation-title')}:has-text("capital of France")`);
  });

  it('with a pinned seed, regenerate gives the same reply', async () => {
    await pinSeed(page, 1234);
    assert.equal(await page.inputValue(tid('seed-input')), '1234');
    const first = await regenerate(page);
    assert.equal(first.seed, '1234');
    const second = await regenerate(page);
    assert.equal(second.seed, '1234');
    assert.equal(second.text, first.text);
    assert.ok(first.text.length > 0);
    const all = await messages(page);
    assert.equal(all.length, 2, 'regenerate replaces the last reply');
    // Its receipt: the seed, and what else fixes the reply.
    const receipt = `${tid('message')}[data-role="assistant"] ${tid('receipt')}`;
    await page.click(`${receipt} summary`);
    const field = async (name) => (await page.textContent(`${receipt} ${tid(`receipt-${name}`)}`)).trim();
    assert.equal(await field('seed'), '1234');
    assert.match(await field('weights'), /^sha256:[0-9a-f]{64}$/);
    assert.match(await field('fingerprint'), /^fp_[0-9a-f]{12}$/);
    assert.equal(await field('backend'), 'CPU');
    assert.match(await field('engine'), /^seedbar /);
    await page.click(`${receipt} summary`);
    // The picture for the docs: a real reply under a pinned seed.
    await page.click(tid('toggle-settings'));
    await page.waitForSelector(tid('settings-panel'), { state: 'detached' });
    await page.mouse.move(0, 0);
    await page.screenshot({ path: screenshotPath('chat-browser.png') });
  });

  it('exports the conversation as Markdown and as JSON with its seeds', async () => {
    const saved = async (testid) => {
      await page.click(tid('export-toggle'));
      const [download] = await Promise.all([page.waitForEvent('download'), page.click(tid(testid))]);
      return { name: download.suggestedFilename(), text: readFileSync(await download.path(), 'utf8') };
    };
    const [, reply] = await messages(page);
    const md = await saved('export-markdown');
    assert.match(md.name, /\.md$/);
    assert.match(md.text, /seed pinned 1234/);
    assert.ok(md.text.includes(reply.text.trim()), 'the reply is in the Markdown');
    const json = await saved('export-json');
    assert.match(json.name, /\.json$/);
    const exported = JSON.parse(json.text);
    assert.equal(exported.format, 'seedbar.conversation');
    assert.equal(exported.conversation.settings.seed, 1234);
    assert.deepEqual(exported.messages.map((m) => m.seed), [null, 1234]);
  });

  it('replays the seeded reply identically, and imports the JSON export as a new conversation', async () => {
    await page.click(tid('export-toggle'));
    await page.click(tid('replay'));
    await page.waitForSelector(`${tid('replay-result')}[data-state="done"]`, { timeout: 120_000 });
    assert.equal((await page.textContent(tid('replay-summary'))).trim(), '1 of 1 seeded replies came out identical.');
    await page.click(tid('export-toggle'));
    const [download] = await Promise.all([page.waitForEvent('download'), page.click(tid('export-json'))]);
    const before = await messages(page);
    const title = (await page.textContent(tid('chat-title'))).trim();
    const id = await page.getAttribute(tid('chat-view'), 'data-conversation');
    await page.setInputFiles(tid('import-file'), await download.path());
    await page.waitForSelector(`${tid('chat-view')}:not([data-conversation="${id}"])`);
    await page.waitForSelector(`${tid('message')}[data-role="assistant"]`);
    assert.equal((await page.textContent(tid('chat-title'))).trim(), title);
    assert.deepEqual((await messages(page)).map((m) => [m.role, m.text, m.seed]), before.map((m) => [m.role, m.text, m.seed]));
  });

  it('pins the seed of a reply, and unpins with one click', async () => {
    await page.click(tid('seed-unpin'));
    await page.waitForSelector(`${tid('seed-pin')}[data-pinned="false"]`);
    assert.equal((await page.textContent(tid('seed-random'))).trim(), 'random seed');
    const reply = await regenerate(page);
    assert.notEqual(reply.seed, '1234', 'an unpinned reply draws a fresh seed');
    await page.click(tid('pin-seed'));
    await page.waitForSelector(`${tid('seed-pin')}[data-pinned="true"]`);
    assert.equal(await page.inputValue(tid('seed-input')), reply.seed);
    const again = await regenerate(page);
    assert.equal(again.text, reply.text, 'pinning a reply\'s seed repeats that reply');
  });

  it('rejects seeds out of range with a message', async () => {
    const input = page.locator(tid('seed-input'));
    await input.fill('9007199254740992');
    await input.press('Enter');
    await page.waitForSelector(tid('seed-error'));
    assert.match(await page.textContent(tid('seed-error')), /too large/);
    await input.press('Escape');
    await page.waitForSelector(tid('seed-error'), { state: 'detached' });
  });

  it('two conversations with pinned seeds stream at once and each gets its lone reply', async () => {
    // Alone first (a few more tokens than elsewhere, so that the two replies overlap surely).
    const a = await newChat(page, { maxTokens: 40 });
    await pinSeed(page, 11);
    const aloneA = await send(page, 'Tell me about cats.');
    const b = await newChat(page, { maxTokens: 40 });
    await pinSeed(page, 22);
    const aloneB = await send(page, 'Tell me about cats.');
    assert.notEqual(aloneA.text, aloneB.text, 'different seeds give different replies (else the test proves little)');

    // Together: regenerate in A, switch to B while A streams, regenerate there too.
    await page.evaluate(() => {
      window.__maxStreaming = 0;
      new MutationObserver(() => {
        const n = document.querySelectorAll('[data-testid="streaming-indicator"]').length;
        window.__maxStreaming = Math.max(window.__maxStreaming, n);
      }).observe(document.body, { subtree: true, childList: true });
    });
    await page.click(`${tid('conversation-item')}[data-id="${a}"] a`);
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${a}"] ${tid('regenerate')}`);
    const doneA = await page.getAttribute(tid('chat-view'), 'data-replies');
    await page.click(tid('regenerate'));
    await page.click(`${tid('conversation-item')}[data-id="${b}"] a`);
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${b}"] ${tid('regenerate')}`);
    const togetherB = await regenerate(page);
    await page.click(`${tid('conversation-item')}[data-id="${a}"] a`);
    await page.waitForSelector(`${tid('chat-view')}[data-conversation="${a}"][data-replies="${Number(doneA) + 1}"]`, { timeout: 120_000 });
    const togetherA = (await messages(page)).filter((m) => m.role === 'assistant').at(-1);
    const maxStreaming = await page.evaluate(() => window.__maxStreaming);
    assert.equal(maxStreaming, 2, 'both conversations were streaming at the same time');
    assert.equal(togetherA.status, 'complete');
    assert.equal(togetherB.status, 'complete');
    assert.equal(togetherA.text, aloneA.text);
    assert.equal(togetherB.text, aloneB.text);
  });

  it('keeps the history across a reload', async () => {
    const before = await messages(page);
    assert.ok(before.length >= 2);
    const title = await page.textContent(tid('chat-title'));
    await page.reload();
    await page.waitForSelector(`${tid('message')}[data-role="assistant"]`);
    const afterReload = await messages(page);
    assert.deepEqual(afterReload.map((m) => [m.role, m.text, m.seed, m.status]), before.map((m) => [m.role, m.text, m.seed, m.status]));
    assert.equal(await page.textContent(tid('chat-title')), title);
  });

  it('stops a reply and keeps what was written as stopped', async () => {
    await newChat(page, { maxTokens: 400 });
    await page.fill(tid('composer-input'), 'Write a long story about a lighthouse keeper.');
    await page.press(tid('composer-input'), 'Enter');
    await page.waitForFunction(() => {
      const el = document.querySelector('[data-testid="message"][data-status="streaming"] [data-testid="message-content"]');
      return el && el.textContent.length > 20;
    }, null, { timeout: 120_000 });
    await page.click(tid('stop'));
    await page.waitForSelector(`${tid('message')}[data-role="assistant"][data-status="stopped"]`);
    const shown = (await messages(page)).at(-1);
    await page.waitForTimeout(500);
    await page.reload();
    await page.waitForSelector(`${tid('message')}[data-role="assistant"]`);
    const stored = (await messages(page)).at(-1);
    assert.equal(stored.status, 'stopped');
    assert.ok(stored.text.length > 0 && shown.text.startsWith(stored.text.slice(0, 10)), `stored: ${stored.text} / shown: ${shown.text}`);
  });

  it('edits a message and resends it', async () => {
    await newChat(page);
    await send(page, 'What is 2 + 2?');
    await page.hover(`${tid('message')}[data-role="user"]`);
    await page.click(tid('edit-message'));
    await page.fill(tid('edit-input'), QUESTION);
    await replyTo(page, () => page.click(tid('edit-submit')));
    const all = await messages(page);
    assert.deepEqual(all.map((m) => m.role), ['user', 'assistant']);
    assert.equal(all[0].text, QUESTION);
    assert.equal(all[1].status, 'complete');
  });

  it('renames, searches and deletes conversations', async () => {
    const id = await page.getAttribute(tid('chat-view'), 'data-conversation');
    const item = `${tid('conversation-item')}[data-id="${id}"]`;
    await page.hover(item);
    await page.click(`${item} ${tid('rename-conversation')}`);
    await page.fill(tid('rename-input'), 'Arithmetic and capitals');
    await page.press(tid('rename-input'), 'Enter');
    await page.waitForSelector(`${item} ${tid('conversation-title')}:text-is("Arithmetic and capitals")`);

    await page.fill(tid('search'), 'lighthouse');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="conversation-item"]').length === 1);
    await page.fill(tid('search'), 'zzz-nothing-matches');
    await page.waitForSelector(tid('conversations-empty'));
    await page.fill(tid('search'), '');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="conversation-item"]').length > 1);

    const count = await page.locator(tid('conversation-item')).count();
    await page.hover(item);
    await page.click(`${item} ${tid('delete-conversation')}`);
    await page.waitForSelector(`${tid('confirm-dialog')}[open]`);
    await page.click(tid('confirm-cancel'));
    assert.equal(await page.locator(tid('conversation-item')).count(), count);
    await page.hover(item);
    await page.click(`${item} ${tid('delete-conversation')}`);
    await page.click(tid('confirm-ok'));
    await page.waitForSelector(item, { state: 'detached' });
    assert.equal(await page.locator(tid('conversation-item')).count(), count - 1);
  });

  it('lists the installed model in the library', async () => {
    await page.click(tid('nav-models'));
    const row = `${tid('model-row')}[data-name="${MODEL}"]`;
    await page.waitForSelector(row);
    const text = await page.textContent(row);
    assert.match(text, /GGUF/);
    assert.match(text, /MB/);
    assert.equal((await page.textContent(`${row} ${tid('model-architecture')}`)).trim(), 'llama');
  });

  it('shows a readable message when a download fails (no network here)', async () => {
    await page.fill(tid('pull-input'), 'HuggingFaceTB/SmolLM2-135M-Instruct');
    await page.click(tid('pull-submit'));
    const row = `${tid('pull-row')}[data-repo="HuggingFaceTB/SmolLM2-135M-Instruct"]`;
    await page.waitForSelector(`${row}[data-status="error"], ${row}[data-status="done"]`, { timeout: 90_000 });
    if ((await page.getAttribute(row, 'data-status')) === 'error') {
      const message = await page.textContent(`${row} ${tid('pull-error')}`);
      assert.ok(message.trim().length > 10, `a message: ${message}`);
    }
  });

  it('loads and saves app settings', async () => {
    await page.click(tid('nav-settings'));
    await page.waitForSelector(tid('settings-port'));
    const port = await page.inputValue(tid('settings-port'));
    assert.match(port, /^\d+$/);
    await page.fill(tid('settings-origins'), 'http://localhost:5173');
    assert.equal(await page.inputValue(tid('settings-prompt-cache-disk')), '8');
    await page.fill(tid('settings-prompt-cache-disk'), '-1');
    assert.ok(await page.isDisabled(tid('settings-save')), 'a budget that is not a number is not saved');
    await page.fill(tid('settings-prompt-cache-disk'), '3');
    await page.click(tid('settings-save'));
    await page.waitForSelector(tid('settings-saved'));
    assert.match(await page.textContent(tid('settings-saved')), /next time/);
    await page.reload();
    await page.waitForSelector(tid('settings-origins'));
    assert.equal(await page.inputValue(tid('settings-origins')), 'http://localhost:5173');
    assert.equal(await page.inputValue(tid('settings-prompt-cache-disk')), '3');
  });

  it('showed no errors', () => {
    assert.deepEqual(browser.errors.filter((e) => !/Failed to load resource/.test(e)), []);
  });
});
